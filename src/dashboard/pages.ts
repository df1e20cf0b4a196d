import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { SIGN_UP_ANSWER } from '../admin/accounts.ts';
import { randomToken } from '../core/ids.ts';
import { textInput } from '../core/validation.ts';
import { type Column, html, layout, type Raw, raw, sendHtml } from '../html/index.ts';

/**
 * What the dashboard's pages share: the page frame, the messages shown after a form, form schemas, and
 * small pieces of markup. The routes are in ./routes/, one module per page or resource.
 */

export const SESSION_COOKIE = 'tollgate_session';
export const CSRF_COOKIE = 'tollgate_csrf';

/**
 * Messages shown after a form, chosen by the code in `?done=` or `?error=`: the query names a message,
 * it never supplies its text. Unknown codes show nothing.
 */
export const MESSAGES = {
  done: {
    signed_up: SIGN_UP_ANSWER,
    signed_out: 'Signed out.',
    admin_token_revoked: 'Admin token revoked.',
    provider_saved: 'Provider checked and saved.',
    settings_saved: 'Settings saved.',
    key_revoked: 'Key revoked: it stops working at once.',
    price_saved: 'Price saved.',
    model_deleted: 'Model deleted.',
    pricing_applied: 'Pricing file applied.',
    payments_connected: 'Stripe connected: the key was checked and sealed.',
    auto_recharge_saved: 'Automatic recharge settings saved.',
    payments_disconnected: 'Stripe disconnected.',
    refund_requested: 'Refund asked of Stripe; the balance is debited when Stripe confirms it.',
    deposited: 'Deposited.',
    credit_granted: 'Credit granted.',
    charged: 'Charged.',
    connected: 'Connected.',
    disconnected: 'Disconnected.',
    subscription_deactivated: 'Subscription deactivated.',
    delivery_queued: 'Delivery queued to be sent again.',
  },
  error: {
    invalid_credentials: 'Incorrect e-mail or password.',
    sign_in_rate_limited: 'Too many sign-in attempts. Try again later.',
    sign_up_rate_limited: 'Too many sign-ups from your address. Try again later.',
    invite_required: 'Sign-up needs an invite code on this server; ask its administrator.',
    invalid_invite: 'This invite code is not valid for this e-mail address, or it has expired.',
    signup_closed: 'Sign-up is closed on this server; an administrator creates accounts.',
  },
} as const;
export type DoneCode = keyof (typeof MESSAGES)['done'];
export type ErrorCode = keyof (typeof MESSAGES)['error'];

/** The query of a page that shows form messages. */
export const flashQuery = z.object({
  done: z.string().max(64).optional(),
  error: z.string().max(64).optional(),
});

function flash(request: FastifyRequest): Raw {
  const q = flashQuery.safeParse(request.query);
  if (!q.success) return html``;
  const { done, error } = q.data;
  const doneText = done && Object.hasOwn(MESSAGES.done, done) ? MESSAGES.done[done as DoneCode] : undefined;
  const errorText =
    error && Object.hasOwn(MESSAGES.error, error) ? MESSAGES.error[error as ErrorCode] : undefined;
  return html`${doneText ? html`<p class="notice" role="status">${doneText}</p>` : ''}${
    errorText ? html`<p class="error" role="alert">${errorText}</p>` : ''
  }`;
}

/** Where a form goes after it worked: `path?done=<code>`. */
export function done(path: string, code: DoneCode): string {
  return `${path}${path.includes('?') ? '&' : '?'}done=${code}`;
}

/**
 * A form body: the fields, plus the `csrf` token that @fastify/csrf-protection checks before validation.
 * Unknown fields are refused, as in the API.
 */
export function formBody<T extends z.ZodRawShape>(shape: T) {
  return z.strictObject({ csrf: z.string().max(512).optional(), ...shape });
}

/** An optional text field: empty means absent. */
export const optionalField = <S extends z.ZodType>(schema: S) =>
  z.preprocess((v) => (typeof v === 'string' && v.trim() === '' ? undefined : v), schema.optional());

export const projectParams = z.object({ id: textInput(255, 'a project id') });
export const projectPath = (id: string) => `/dashboard/projects/${encodeURIComponent(id)}`;

/**
 * Renders a page in the layout; forms on it carry a CSRF token made for this response. A page that
 * shows its flash messages passes `flash: true`.
 */
export function page(
  request: FastifyRequest,
  reply: FastifyReply,
  title: string,
  body: (parts: { csrf: string; flash: Raw }) => Raw,
  options: { status?: number; script?: boolean } = {},
): FastifyReply {
  const s = request.dashboard;
  const csrf = typeof reply.generateCsrf === 'function' ? reply.generateCsrf() : '';
  const nonce = options.script ? randomToken(16) : undefined;
  return sendHtml(
    reply,
    options.status ?? 200,
    layout(
      { title, email: s?.email, csrf: s ? csrf : undefined, ...(nonce ? { nonce } : {}) },
      body({ csrf, flash: flash(request) }),
    ),
    nonce,
  );
}

/** The schema of a project page's GET: the project in the path, the form messages in the query. */
export const projectPageSchema = { params: projectParams, querystring: flashQuery };

/**
 * The schema of a button on one item of a project (`/projects/:id/…/:<item>/…`, e.g. revoke a key):
 * the item's id in the path, and a form with nothing but its CSRF token.
 */
export function projectItemAction<K extends string>(item: K, description: string) {
  const itemParam = { [item]: textInput(255, description) } as Record<K, ReturnType<typeof textInput>>;
  return { params: projectParams.extend(itemParam), body: formBody({}) };
}

/**
 * Renders a page of one project: its heading, the project's navigation (`tab` current) and the form
 * messages, then `body`.
 */
export function projectPage(
  reply: FastifyReply,
  head: { project: { id: string; name: string }; title: string; heading: string; tab: string },
  body: (csrf: string) => Raw,
  options: { status?: number; script?: boolean } = {},
): FastifyReply {
  return page(
    reply.request,
    reply,
    head.title,
    ({ csrf, flash }) =>
      html`<h1>${head.heading}</h1>${projectNav(head.project, head.tab)}${flash}${body(csrf)}`,
    options,
  );
}

/** A preValidation hook: POSTs must carry a valid CSRF token (before their body is validated). */
export function csrfOnPost(app: FastifyInstance) {
  return (request: FastifyRequest, reply: FastifyReply, next: () => void) => {
    if (request.method !== 'POST') return next();
    app.csrfProtection(request, reply, next);
  };
}

/** The `csrf` field of a form body. */
export function csrfToken(request: FastifyRequest): string | undefined {
  const token = (request.body as { csrf?: unknown } | undefined)?.csrf;
  return typeof token === 'string' ? token : undefined;
}

export const csrfField = (csrf: string) => html`<input type="hidden" name="csrf" value="${csrf}">`;

/** The columns of `revocableRows` (the secret's column named `secret`: Key, Token). */
export const revocableColumns = (secret: string): Column[] => [
  { label: 'Name' },
  { label: secret },
  { label: 'Created' },
  { label: 'Status' },
  { label: 'Action', action: true },
];

/**
 * The rows of a table of secrets shown by their prefix (API keys, admin tokens): name, prefix, created,
 * status, and a Revoke button that posts to `action(row)`, labelled `Revoke <label(row)>`.
 */
export function revocableRows<R extends Revocable>(
  rows: R[],
  csrf: string,
  action: (row: R) => string,
  label: (row: R) => string,
): unknown[][] {
  return rows.map((r) => [
    r.name,
    html`<code>${r.prefix}…</code>`,
    r.createdAt.slice(0, 10),
    r.revokedAt ? 'revoked' : 'active',
    r.revokedAt
      ? ''
      : html`<form method="post" action="${action(r)}">${csrfField(csrf)}<button type="submit" class="secondary" aria-label="Revoke ${label(r)}">Revoke</button></form>`,
  ]);
}
interface Revocable {
  name: string;
  prefix: string;
  createdAt: string;
  revokedAt: string | null;
}

export function projectNav(project: { id: string; name: string }, current: string): Raw {
  const base = projectPath(project.id);
  const items: Array<[string, string]> = [
    ['Overview', base],
    ['Pricing', `${base}/pricing`],
    ['Users', `${base}/users`],
    ['Webhooks', `${base}/webhooks`],
    ['Payments', `${base}/payments`],
    ['Audit log', `${base}/audit`],
  ];
  return html`<p class="muted"><a href="/dashboard">Projects</a> / ${project.name} <code>${project.id}</code></p>
<nav aria-label="Project" class="row" style="gap:1rem;margin-bottom:1rem">${items.map(
    ([label, href]) =>
      html`<a href="${href}"${raw(label === current ? ' aria-current="page" style="font-weight:700"' : '')}>${label}</a>`,
  )}</nav>`;
}

export function secretBox(id: string, label: string, value: string): Raw {
  return html`<p><strong>${label}</strong> — shown once: copy it now, it cannot be shown again.</p>
<div class="secret"><code id="${id}">${value}</code><button type="button" data-copy="#${id}" hidden>Copy</button></div>`;
}
