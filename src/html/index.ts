import helmet from '@fastify/helmet';
import type { FastifyInstance, FastifyReply } from 'fastify';
import fp from 'fastify-plugin';
import { displayAmount, Money } from '../core/money.ts';

/**
 * The HTML toolkit of the server-rendered pages: a tagged template that escapes every interpolated value
 * (values wrapped by `raw()` are inserted as they are; `undefined`, `null` and `false` render nothing),
 * the document every page is; and the dashboard's and home page's layout, style sheet and security
 * headers. The hosted end-user pages have their own layout beside it (./hosted-page.ts).
 */
export class Raw {
  readonly html: string;
  constructor(html: string) {
    this.html = html;
  }
}

export const raw = (html: string) => new Raw(html);

export function escapeHtml(value: string): string {
  return value.replace(
    /[&<>"']/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!,
  );
}

function piece(value: unknown): string {
  if (value instanceof Raw) return value.html;
  if (Array.isArray(value)) return value.map(piece).join('');
  if (value === undefined || value === null || value === false) return '';
  return escapeHtml(String(value));
}

export function html(strings: TemplateStringsArray, ...values: unknown[]): Raw {
  let out = strings[0]!;
  values.forEach((value, i) => {
    out += piece(value) + strings[i + 1]!;
  });
  return raw(out);
}

export const STYLE = `
:root{color-scheme:light dark;--fg:#1b1f24;--bg:#f6f7f9;--card:#fff;--muted:#55606e;--line:#d9dde3;--accent:#1f5fd1;--accent-fg:#fff;--ring:#f0a500;--bad:#b3261e;--good:#1e7a3c}
@media (prefers-color-scheme:dark){:root{--fg:#e8eaed;--bg:#121417;--card:#1c1f24;--muted:#a9b1bc;--line:#343a42;--accent:#6ea0ff;--accent-fg:#0b1220;--bad:#ff8a80;--good:#7bd88f}}
*{box-sizing:border-box}
body{margin:0;font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header.top{display:flex;flex-wrap:wrap;gap:.5rem 1rem;align-items:center;padding:.75rem 1.5rem;background:var(--card);border-bottom:1px solid var(--line)}
header.top .brand{font-weight:700;text-decoration:none;color:var(--fg)}
header.top nav{display:flex;gap:1rem;flex:1}
header.top form{overflow-wrap:anywhere}
main{max-width:68rem;margin:1.5rem auto;padding:0 1.5rem}
section.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:1.25rem 1.5rem;margin:0 0 1.25rem}
main.narrow{max-width:28rem}
h1{font-size:1.5rem;margin:0 0 1rem;overflow-wrap:anywhere}
h2{font-size:1.15rem;margin:0 0 .75rem}
p{margin:0 0 .75rem;overflow-wrap:break-word}
.muted{color:var(--muted);font-size:.9rem}
label{display:block;font-weight:600;margin:.5rem 0 .25rem}
input,select,textarea{font:inherit;width:100%;padding:.5rem .6rem;border:1px solid var(--line);border-radius:6px;background:var(--bg);color:var(--fg)}
input[type=checkbox],input[type=radio]{width:auto;margin:0;accent-color:var(--accent)}
label.check{display:flex;gap:.5rem;align-items:center;font-weight:400}
[aria-invalid=true]{border-color:var(--bad)}
.field-error{color:var(--bad);font-size:.9rem;margin:.25rem 0 0}
textarea{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.85rem;min-height:12rem}
fieldset{border:1px solid var(--line);border-radius:8px;margin:.75rem 0 0;padding:.25rem 1rem 1rem;min-width:0}
legend{font-weight:600;padding:0 .25rem}
/* a form with a mode select (#mode) shows only the chosen mode's fieldset; without :has(), all of them, each labelled */
form:has(#mode option[value=per_request]:checked) fieldset[data-mode]:not([data-mode=per_request]),form:has(#mode option[value=per_token]:checked) fieldset[data-mode]:not([data-mode=per_token]),form:has(#mode option[value=subscription]:checked) fieldset[data-mode]:not([data-mode=subscription]){display:none}
.row{display:flex;gap:.75rem;flex-wrap:wrap;align-items:flex-end}
.row>div{flex:1;min-width:10rem}
/* a problem below a field: the fields of its row stay level, their buttons below */
.row:has(.field-error){align-items:flex-start}.row:has(.field-error)>div:has(>button){align-self:flex-end}
button,.button{display:inline-block;font:inherit;font-weight:600;padding:.5rem 1.1rem;margin-top:.75rem;border:0;border-radius:6px;background:var(--accent);color:var(--accent-fg);cursor:pointer;text-decoration:none}
button.secondary{background:transparent;color:var(--accent);border:1px solid var(--accent)}
button.link{background:none;color:var(--accent);padding:0;margin:0;font-weight:400;text-decoration:underline}
button:focus-visible,a:focus-visible,input:focus-visible,select:focus-visible,textarea:focus-visible{outline:3px solid var(--ring);outline-offset:2px}
a{color:var(--accent)}
.table{overflow-x:auto;margin:0 0 .75rem}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th,td{text-align:left;padding:.4rem .5rem;border-bottom:1px solid var(--line);vertical-align:top;overflow-wrap:break-word}
td button{margin-top:0}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.wide pre{min-width:12rem;margin:0}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.85rem}
code{overflow-wrap:anywhere}
pre{background:var(--bg);border:1px solid var(--line);border-radius:6px;padding:.75rem;overflow:auto;white-space:pre-wrap;overflow-wrap:anywhere}
.secret{display:flex;gap:.5rem;align-items:center;flex-wrap:wrap}
.secret code{flex:1 1 12rem;padding:.5rem;background:var(--bg);border:1px solid var(--line);border-radius:6px;word-break:break-all}
.notice{border-left:4px solid var(--good);padding:.5rem .75rem;background:var(--bg);margin:0 0 1rem}
.error{border-left:4px solid var(--bad);padding:.5rem .75rem;background:var(--bg);margin:0 0 1rem;color:var(--bad)}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(20rem,100%),1fr));gap:1rem}
figure{margin:0;min-width:0}
figcaption{font-weight:600;margin-bottom:.25rem}
svg text{fill:var(--muted);font-size:11px}
svg .bar{fill:var(--accent)}
svg .axis{stroke:var(--line)}
.skip{position:absolute;left:-999px}.skip:focus{left:1rem;top:1rem;background:var(--card);padding:.5rem}
@media (max-width:40rem){
header.top{padding:.5rem .75rem}
main{margin:1rem auto;padding:0 .75rem}
section.card{padding:1rem .9rem}
svg text{font-size:14px}
table.stack thead{position:absolute;width:1px;height:1px;overflow:hidden;clip-path:inset(50%);white-space:nowrap}
table.stack,table.stack tbody,table.stack tr{display:block;width:100%}
table.stack caption{display:block}
table.stack tr{border-bottom:1px solid var(--line);padding:.35rem 0}
table.stack td{display:grid;grid-template-columns:minmax(0,38%) minmax(0,1fr);gap:.75rem;border:0;padding:.15rem 0;text-align:left;white-space:normal}
table.stack td::before{content:attr(data-label);color:var(--muted);font-size:.85rem}
table.stack td:not([data-label]),table.stack td.wide{display:block}
table.stack td:not([data-label])::before{content:none}
table.stack td.wide::before{display:block;margin-bottom:.2rem}
table.stack td:empty{display:none}
td.wide pre{min-width:0}
}
`;

/** A column of `dataTable`: its header, and how its cells read. */
export interface Column {
  label: string;
  /** Right-aligned figures (desktop). */
  num?: boolean;
  /** Long content (JSON): on a phone, the label above it rather than beside it. */
  wide?: boolean;
  /** A column of buttons: its header is for screen readers only, its cells carry no label. */
  action?: boolean;
}

/**
 * A table that fits any screen: wider than its card, it scrolls inside the card; on a phone (under
 * 40rem) each row becomes a block of "label value" lines, the headers kept for screen readers.
 * `rows` are the cells of each row, in the columns' order; `empty` is shown when there are none.
 */
export function dataTable(
  columns: Column[],
  rows: unknown[][],
  options: { id?: string; caption?: string; empty?: string } = {},
): Raw {
  const cls = (c: Column) => [c.num ? 'num' : '', c.wide ? 'wide' : ''].filter(Boolean).join(' ');
  const attrs = (c: Column) =>
    raw(`${cls(c) ? ` class="${cls(c)}"` : ''}${c.action ? '' : ` data-label="${escapeHtml(c.label)}"`}`);
  const body = rows.length
    ? rows.map(
        // one box per cell: on a phone, a cell is a grid of its label and this box
        (cells) =>
          html`<tr>${cells.map((cell, i) => html`<td${attrs(columns[i]!)}>${cell === '' ? '' : html`<div>${cell}</div>`}</td>`)}</tr>`,
      )
    : options.empty
      ? html`<tr><td colspan="${columns.length}">${options.empty}</td></tr>`
      : '';
  const head = columns.map(
    (c) =>
      html`<th scope="col"${raw(c.num ? ' class="num"' : '')}>${c.action ? html`<span class="muted">${c.label}</span>` : c.label}</th>`,
  );
  return html`<div class="table"><table class="stack"${raw(options.id ? ` id="${escapeHtml(options.id)}"` : '')}>${
    options.caption ? html`<caption class="muted" style="text-align:left">${options.caption}</caption>` : ''
  }<thead><tr>${head}</tr></thead><tbody>
${body}
</tbody></table></div>`;
}

/**
 * An amount at its currency's precision ("10.00" for 9.999982 usd), the exact value on hover (title)
 * when they differ. Exports and the API keep the exact value.
 */
export function money(value: string, currency: string): Raw {
  const shown = displayAmount(value, currency);
  const exact = shown.includes('<') || !new Money(shown).eq(value);
  return exact ? html`<span title="${value}">${shown}</span>` : html`${shown}`;
}

export interface LayoutOptions {
  title: string;
  /** The signed-in developer's e-mail; shows the navigation and the sign-out button. */
  email?: string | undefined;
  csrf?: string | undefined;
  narrow?: boolean;
  /** Nonce of the one inline script (the copy buttons). */
  nonce?: string;
}

export function layout(options: LayoutOptions, body: Raw): string {
  const nav = options.email
    ? html`<nav aria-label="Main"><a href="/dashboard">Projects</a></nav>
<form method="post" action="/dashboard/signout"><input type="hidden" name="csrf" value="${options.csrf}">
<span class="muted">${options.email}</span> <button type="submit" class="link">Sign out</button></form>`
    : html`<nav aria-label="Main"><a href="/dashboard/signin">Sign in</a><a href="/dashboard/signup">Sign up</a></nav>`;
  return htmlDocument(
    // "Projects · Tollgate"; a page titled Tollgate (the home page) is just "Tollgate"
    options.title === 'Tollgate' ? 'Tollgate' : `${options.title} · Tollgate`,
    STYLE,
    html`<a class="skip" href="#content">Skip to content</a>
<header class="top"><a class="brand" href="/dashboard">Tollgate</a>${nav}</header>
<main id="content"${raw(options.narrow ? ' class="narrow"' : '')}>
${body}
</main>
${options.nonce ? html`<script nonce="${options.nonce}">${raw(COPY_SCRIPT)}</script>` : ''}`,
  );
}

/** A whole page: the head every page shares (UTF-8, the viewport, no indexing), its title and style sheet. */
export function htmlDocument(title: string, style: string, body: Raw): string {
  return html`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex">
<title>${title}</title>
<style>${raw(style)}</style>
</head>
<body>
${body}
</body>
</html>
`.html;
}

/** Copy buttons: `<button data-copy="#id">` copies the text of the element `#id`. */
const COPY_SCRIPT = `
document.querySelectorAll('button[data-copy]').forEach(function (b) {
  b.hidden = false;
  b.addEventListener('click', function () {
    var text = document.querySelector(b.getAttribute('data-copy')).textContent;
    navigator.clipboard.writeText(text).then(function () { b.textContent = 'Copied'; }, function () { b.textContent = 'Copy failed: select the text'; });
  });
});
`;

/**
 * The Content-Security-Policy of every HTML page: nothing but inline styles, own images, forms posting
 * to this site, no framing; the one inline script (copy buttons) runs by nonce (`sendHtml`).
 */
export const CSP_DIRECTIVES = {
  defaultSrc: ["'none'"],
  styleSrc: ["'unsafe-inline'"],
  imgSrc: ["'self'", 'data:'],
  formAction: ["'self'"],
  frameAncestors: ["'none'"],
  baseUri: ["'none'"],
};

/**
 * The security headers of HTML pages (the dashboard, the home page), set by @fastify/helmet: the CSP
 * above, `X-Frame-Options: DENY`, `Referrer-Policy: same-origin`, `nosniff` and helmet's other defaults.
 */
export const htmlHeaders = fp(
  async (app: FastifyInstance) => {
    await app.register(helmet, {
      contentSecurityPolicy: { useDefaults: false, directives: CSP_DIRECTIVES },
      referrerPolicy: { policy: 'same-origin' },
      xFrameOptions: { action: 'deny' },
    });
  },
  { name: 'tollgate-html-headers' },
);

/** Sends a page (never cached); `nonce` lets the page's one inline script run. */
export function sendHtml(reply: FastifyReply, status: number, page: string, nonce?: string): FastifyReply {
  if (nonce) {
    reply.helmet({
      contentSecurityPolicy: {
        useDefaults: false,
        directives: { ...CSP_DIRECTIVES, scriptSrc: [`'nonce-${nonce}'`] },
      },
    });
  }
  return reply
    .status(status)
    .headers({ 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' })
    .send(page);
}
