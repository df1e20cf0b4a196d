import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { safeEqual } from '../core/crypto.ts';
import { hostedCheckout, paymentPageRoutes, topupCheckoutPage } from '../payments/pages.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { type LinkProblem, openLink, useConnectLink } from './service.ts';

/**
 * The hosted pages behind connect and top-up links (no API key; the signed token is the credential):
 * - `GET /connect/{token}` — names the project and what connecting allows, with a Connect button
 * - `POST /connect/{token}` — the button (a plain form post): connects the user once, then returns to
 *   the project's `returnUrl` (303) or shows a done page. Only the rendered page's own form counts: a
 *   form content type with a hidden field derived from the token with the signing key (a link scanner
 *   that POSTs blindly cannot produce it), and no cross-site post (`Sec-Fetch-Site`)
 * - `GET /topup/{token}` — with a payment provider connected, the hosted checkout page
 *   (../payments/pages.ts, which also serves paying, the return page and the portal); otherwise
 *   redirects (303) to the project's `checkoutUrl` with `user`, `amount`, `currency` and `project`, or
 *   shows how to top up when none is configured
 * A token is checked for shape (base64url, a dot, base64url, bounded length) before anything else, so
 * nothing malformed — NUL and control bytes included — reaches a lookup.
 * Small semantic HTML with inline CSS; no JavaScript. Every answer, redirects included, carries
 * `Referrer-Policy: no-referrer` and `Cache-Control: no-store`.
 */

const STYLE = `
:root{color-scheme:light dark;--fg:#1b1f24;--bg:#f6f7f9;--card:#fff;--muted:#55606e;--accent:#1f5fd1;--accent-fg:#fff;--ring:#f0a500}
@media (prefers-color-scheme:dark){:root{--fg:#e8eaed;--bg:#121417;--card:#1c1f24;--muted:#a9b1bc;--accent:#6ea0ff;--accent-fg:#0b1220}}
*{box-sizing:border-box}
body{margin:0;font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
main{max-width:32rem;margin:3rem auto;padding:2rem;background:var(--card);border-radius:12px;box-shadow:0 1px 4px rgba(0,0,0,.12)}
h1{font-size:1.5rem;line-height:1.25;margin:0 0 1rem}
p,ul{margin:0 0 1rem}
li{margin:.25rem 0}
.muted{color:var(--muted);font-size:.925rem}
button,.button{display:inline-block;font:inherit;font-weight:600;padding:.7rem 1.6rem;border:0;border-radius:8px;background:var(--accent);color:var(--accent-fg);cursor:pointer;text-decoration:none}
button:hover,.button:hover{filter:brightness(1.08)}
button:focus-visible,a:focus-visible{outline:3px solid var(--ring);outline-offset:3px}
a{color:var(--accent)}
`;

export function escapeHtml(value: string): string {
  return value.replace(
    /[&<>"']/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!,
  );
}

/** Escapes every interpolated value; values wrapped by raw() are inserted as they are. */
export class Raw {
  readonly html: string;
  constructor(html: string) {
    this.html = html;
  }
}
export const raw = (html: string) => new Raw(html);
export function html(strings: TemplateStringsArray, ...values: unknown[]): Raw {
  let out = strings[0]!;
  values.forEach((value, i) => {
    const text = Array.isArray(value)
      ? value.map((v) => (v instanceof Raw ? v.html : escapeHtml(String(v)))).join('')
      : value instanceof Raw
        ? value.html
        : escapeHtml(String(value ?? ''));
    out += text + strings[i + 1]!;
  });
  return raw(out);
}

function page(title: string, body: Raw): string {
  return html`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex">
<title>${title}</title>
<style>${raw(STYLE)}</style>
</head>
<body>
<main>
${body}
</main>
</body>
</html>
`.html;
}

/** Headers of every hosted-page answer. The token in the URL must not leak to the pages the user goes to next. */
export const PRIVATE_HEADERS = { 'cache-control': 'no-store', 'referrer-policy': 'no-referrer' } as const;

export function sendPage(reply: FastifyReply, status: number, title: string, body: Raw) {
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

const PROBLEMS: Record<LinkProblem, { status: number; title: string; text: string }> = {
  malformed: {
    status: 400,
    title: 'This link is incomplete',
    text: 'The link is damaged or was not copied completely. Open it again from the original message, or ask for a new link.',
  },
  forged: {
    status: 400,
    title: 'This link is not valid',
    text: 'The link was not issued by this service or was changed. Ask for a new link.',
  },
  wrong_kind: {
    status: 400,
    title: 'This link is not valid here',
    text: 'The link is meant for a different page. Open it exactly as you received it, or ask for a new link.',
  },
  expired: {
    status: 410,
    title: 'This link has expired',
    text: 'Links work for a limited time. Go back to the app and ask for a new link.',
  },
  used: {
    status: 410,
    title: 'This link was already used',
    text: 'A connect link works once. If you connected with it, you are all set and can close this page; otherwise go back to the app and ask for a new link.',
  },
  unknown_project: {
    status: 404,
    title: 'This app is no longer available',
    text: 'The app this link belongs to no longer exists.',
  },
};

export function problemPage(reply: FastifyReply, problem: LinkProblem) {
  const p = PROBLEMS[problem];
  return sendPage(
    reply,
    p.status,
    p.title,
    html`<h1>${p.title}</h1>
<p>${p.text}</p>
<p class="muted">Nothing was changed.</p>`,
  );
}

/** A link token's shape: base64url payload "." base64url signature; anything else is malformed. */
export const TOKEN_SHAPE = /^[A-Za-z0-9_-]{1,4096}\.[A-Za-z0-9_-]{16,128}$/;

/** The hidden field value only the rendered connect page carries for this token. */
function formProof(ctx: FastifyInstance['ctx'], token: string): string {
  return ctx.sealer.sign(`connect-form:${token}`);
}

/** Why a connect post is not the page's own form, or undefined when it is. */
function foreignPost(request: FastifyRequest, expected: string): 'cross_site' | 'not_the_form' | undefined {
  if (request.headers['sec-fetch-site'] === 'cross-site') return 'cross_site';
  const type = String(request.headers['content-type'] ?? '')
    .split(';')[0]!
    .trim()
    .toLowerCase();
  if (type !== 'application/x-www-form-urlencoded') return 'not_the_form';
  const body = request.body as Record<string, unknown> | undefined;
  const proof = body?.confirm;
  if (typeof proof !== 'string' || !safeEqual(proof, expected)) return 'not_the_form';
  return undefined;
}

function foreignPostPage(reply: FastifyReply, why: 'cross_site' | 'not_the_form') {
  return sendPage(
    reply,
    why === 'cross_site' ? 403 : 400,
    'Connect from the connect page',
    html`<h1>Connect from the connect page</h1>
<p>To connect, open the link you received and press its Connect button.</p>
<p class="muted">Nothing was changed.</p>`,
  );
}

function connectPage(reply: FastifyReply, project: ProjectContext, proof: string) {
  const name = project.name;
  return sendPage(
    reply,
    200,
    `Connect to ${name}`,
    html`<h1>Connect to ${name}</h1>
<p>${name} asks you to connect your account to its pay-as-you-go balance.</p>
<p>Connecting allows ${name} to:</p>
<ul>
<li>charge your prepaid ${name} balance (in ${project.currency.toUpperCase()}) for the requests you make and the actions you choose;</li>
<li>show you a link to top up your balance when it runs low.</li>
</ul>
<p>It never charges more than your balance holds. ${name} can disconnect you at any time; your balance stays yours.</p>
<form method="post">
<input type="hidden" name="confirm" value="${proof}">
<button type="submit">Connect</button>
</form>`,
  );
}

function connectedPage(reply: FastifyReply, project: ProjectContext) {
  return sendPage(
    reply,
    200,
    `Connected to ${project.name}`,
    html`<h1>You are connected</h1>
<p>Your account is now connected to ${project.name}.</p>
<p>You can close this page and go back to ${project.name}.</p>`,
  );
}

function topupInstructionsPage(
  reply: FastifyReply,
  project: ProjectContext,
  user: string,
  amount: string | undefined,
) {
  const currency = project.currency.toUpperCase();
  return sendPage(
    reply,
    200,
    `Top up your ${project.name} balance`,
    html`<h1>Top up your ${project.name} balance</h1>
${amount ? html`<p>You need <strong>${amount} ${currency}</strong> more to continue.</p>` : raw('')}
<p>${project.name} has not set up online top-ups yet. To add funds, contact ${project.name} and ask them to credit your balance.</p>
<p>Mention your account id: <strong>${user}</strong></p>
<p class="muted">Once the funds are added, go back to ${project.name} and try again.</p>`,
  );
}

/** The checkout URL with the top-up details as query parameters (existing parameters are kept). */
export function checkoutRedirect(
  checkoutUrl: string,
  input: { user: string; amount: string | undefined; currency: string; project: string },
): string {
  const url = new URL(checkoutUrl);
  url.searchParams.set('user', input.user);
  if (input.amount) url.searchParams.set('amount', input.amount);
  url.searchParams.set('currency', input.currency);
  url.searchParams.set('project', input.project);
  return url.toString();
}

export async function pageRoutes(app: FastifyInstance): Promise<void> {
  const ctx = app.ctx;

  // The Connect button posts a plain HTML form; only this plugin accepts form bodies.
  app.addContentTypeParser(
    'application/x-www-form-urlencoded',
    { parseAs: 'string', bodyLimit: 4096 },
    (_request, body, done) => {
      done(null, Object.fromEntries(new URLSearchParams(body as string)));
    },
  );

  app.setErrorHandler((error: FastifyError, request, reply) => {
    const status =
      error.statusCode && error.statusCode >= 400 && error.statusCode < 500 ? error.statusCode : 500;
    if (status >= 500) request.log.error({ err: error, url: request.url }, 'page failed');
    return sendPage(
      reply,
      status,
      status >= 500 ? 'Something went wrong' : 'This request cannot be handled',
      status >= 500
        ? html`<h1>Something went wrong</h1><p>Please try again in a moment.</p>`
        : html`<h1>This request cannot be handled</h1><p>Open the link exactly as you received it.</p>`,
    );
  });

  // Wildcards, not `:token`: tokens are longer than the router's parameter length limit.
  app.get<{ Params: { '*': string } }>('/connect/*', async (request, reply) => {
    const token = request.params['*'];
    if (!TOKEN_SHAPE.test(token)) return problemPage(reply, 'malformed');
    const opened = await openLink(ctx, 'connect', token);
    if (!opened.ok) return problemPage(reply, opened.problem);
    return connectPage(reply, opened.project, formProof(ctx, token));
  });

  app.post<{ Params: { '*': string } }>('/connect/*', async (request, reply) => {
    const token = request.params['*'];
    if (!TOKEN_SHAPE.test(token)) return problemPage(reply, 'malformed');
    const opened = await openLink(ctx, 'connect', token);
    if (!opened.ok) return problemPage(reply, opened.problem);
    const foreign = foreignPost(request, formProof(ctx, token));
    if (foreign) return foreignPostPage(reply, foreign);
    const used = await useConnectLink(ctx.db, ctx.events, opened.project, opened.payload);
    if (!used.ok) return problemPage(reply, used.problem);
    const returnUrl = opened.project.settings.returnUrl;
    if (returnUrl) return reply.headers(PRIVATE_HEADERS).redirect(returnUrl, 303);
    return connectedPage(reply, opened.project);
  });

  app.get<{ Params: { '*': string } }>('/topup/*', async (request, reply) => {
    const token = request.params['*'];
    if (!TOKEN_SHAPE.test(token)) return problemPage(reply, 'malformed');
    const opened = await openLink(ctx, 'topup', token);
    if (!opened.ok) return problemPage(reply, opened.problem);
    const { project, payload } = opened;
    const amount = typeof payload.a === 'string' ? payload.a : undefined;
    // With a payment provider connected, the hosted checkout page (../payments/pages.ts).
    const payments = await hostedCheckout(ctx, project.id);
    if (payments) {
      const settings = payments.connection.settings;
      return topupCheckoutPage(reply, ctx, request, {
        token,
        project,
        user: payload.u,
        needed: amount,
        settings,
      });
    }
    const checkoutUrl = project.settings.checkoutUrl;
    if (checkoutUrl) {
      const target = checkoutRedirect(checkoutUrl, {
        user: payload.u,
        amount,
        currency: project.currency,
        project: project.id,
      });
      return reply.headers(PRIVATE_HEADERS).redirect(target, 303);
    }
    return topupInstructionsPage(reply, project, payload.u, amount);
  });

  // Paying (POST /topup/*), the provider's return page and the user's portal.
  await app.register(paymentPageRoutes);
}
