import type { FastifyReply } from 'fastify';
import { html, htmlDocument, type Raw } from './index.ts';

/**
 * The layout of the hosted end-user pages (src/pages: connect, top-up, checkout, done, portal): one
 * narrow card with its own style sheet, no JavaScript, and the headers every hosted answer carries —
 * `Referrer-Policy: no-referrer` and `Cache-Control: no-store` (the token in the URL must not leak), a
 * CSP of inline styles only, no framing.
 */

const STYLE = `
:root{color-scheme:light dark;--fg:#1b1f24;--bg:#f6f7f9;--card:#fff;--muted:#55606e;--accent:#1f5fd1;--accent-fg:#fff;--ring:#f0a500}
@media (prefers-color-scheme:dark){:root{--fg:#e8eaed;--bg:#121417;--card:#1c1f24;--muted:#a9b1bc;--accent:#6ea0ff;--accent-fg:#0b1220}}
*{box-sizing:border-box}
body{margin:0;font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
main{max-width:32rem;margin:3rem auto;padding:2rem;background:var(--card);border-radius:12px;box-shadow:0 1px 4px rgba(0,0,0,.12)}
@media (max-width:34rem){main{margin:0;padding:1.25rem 1rem;border-radius:0;box-shadow:none}}
h1{font-size:1.5rem;line-height:1.25;margin:0 0 1rem;overflow-wrap:anywhere}
p,li,dd,label{overflow-wrap:break-word}
p,ul{margin:0 0 1rem}
li{margin:.25rem 0}
.muted{color:var(--muted);font-size:.925rem}
button,.button{display:inline-block;font:inherit;font-weight:600;padding:.7rem 1.6rem;border:0;border-radius:8px;background:var(--accent);color:var(--accent-fg);cursor:pointer;text-decoration:none}
button:hover,.button:hover{filter:brightness(1.08)}
button:focus-visible,a:focus-visible{outline:3px solid var(--ring);outline-offset:3px}
a{color:var(--accent)}
/* keys and ids never push a narrow screen sideways (a 390 px phone): they break anywhere */
code{overflow-wrap:anywhere;word-break:break-all}
`;

function page(title: string, body: Raw): string {
  return htmlDocument(
    title,
    STYLE,
    html`<main>
${body}
</main>`,
  );
}

/** Headers of every hosted-page answer. The token in the URL must not leak to the pages the user goes to next. */
export const PRIVATE_HEADERS = { 'cache-control': 'no-store', 'referrer-policy': 'no-referrer' } as const;

/** HSTS, as the dashboard sends it (helmet's default), on a page served over https. */
const HSTS = { 'strict-transport-security': 'max-age=31536000; includeSubDomains' } as const;

export function sendPage(reply: FastifyReply, status: number, title: string, body: Raw) {
  // (https as the client reached it: behind TOLLGATE_TRUSTED_PROXIES, X-Forwarded-Proto)
  if (reply.request.protocol === 'https') reply.headers(HSTS);
  return reply
    .status(status)
    .headers({
      'content-type': 'text/html; charset=utf-8',
      ...PRIVATE_HEADERS,
      'content-security-policy':
        "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'",
      'x-content-type-options': 'nosniff',
      'x-frame-options': 'DENY',
    })
    .send(page(title, body));
}
