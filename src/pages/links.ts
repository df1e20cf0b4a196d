import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { sendPage } from '../html/hosted-page.ts';
import { html } from '../html/index.ts';
import type { LinkKind } from '../users/links.ts';
import { type LinkProblem, type OpenedLink, openLink } from '../users/sessions.ts';

/**
 * What every hosted page shares: a link token's shape and the pages of a link that cannot be used,
 * opening a link, the check that a post is the rendered page's own form, and the style of the
 * checkout and portal pages.
 */

export type Ctx = FastifyInstance['ctx'];

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

/** The token at the end of a page's path (wildcards, not `:token`: tokens are longer than the router's parameter limit). */
export const tokenParam = (request: FastifyRequest) => (request.params as { '*': string })['*'];

/** Opens a link of that kind, or answers with the page of its problem (undefined). */
export async function openToken(
  reply: FastifyReply,
  ctx: Ctx,
  kind: LinkKind,
  token: string,
): Promise<Extract<OpenedLink, { ok: true }> | undefined> {
  if (!TOKEN_SHAPE.test(token)) {
    await problemPage(reply, 'malformed');
    return undefined;
  }
  const opened = await openLink(ctx, kind, token);
  if (!opened.ok) {
    await problemPage(reply, opened.problem);
    return undefined;
  }
  return opened;
}

/** The pages with a form whose post must be the rendered page's own. */
export type HostedForm = 'topup' | 'connect' | 'portal';

/**
 * The hidden field only the rendered page of `token` carries: signed with the active key, verified under
 * every key of the ring (a page rendered before a key rotation still posts).
 */
export function formProof(ctx: Ctx, form: HostedForm, token: string): string {
  return ctx.sealer.sign(`${form}-form:${token}`);
}

/**
 * Why a post is not the page's own form, or undefined when it is: a form content type with the hidden
 * field only the rendered page carries (`formProof`: a link scanner that POSTs blindly cannot produce
 * it), and no cross-site post (`Sec-Fetch-Site`).
 */
export function foreignPost(
  request: FastifyRequest,
  ctx: Ctx,
  form: HostedForm,
  token: string,
): 'cross_site' | 'not_the_form' | undefined {
  if (request.headers['sec-fetch-site'] === 'cross-site') return 'cross_site';
  const type = String(request.headers['content-type'] ?? '')
    .split(';')[0]!
    .trim()
    .toLowerCase();
  if (type !== 'application/x-www-form-urlencoded') return 'not_the_form';
  const body = request.body as Record<string, unknown> | undefined;
  const proof = body?.confirm;
  if (typeof proof !== 'string' || !ctx.sealer.verify(`${form}-form:${token}`, proof)) return 'not_the_form';
  return undefined;
}

/** Page CSS beside the layout's (the checkout, done and portal pages). */
export const CHECKOUT_STYLE = `<style>
fieldset{border:0;padding:0;margin:0 0 1rem}
.amounts{display:flex;flex-wrap:wrap;gap:.5rem;margin:.5rem 0 1rem}
.amounts label{border:1px solid var(--muted);border-radius:8px;padding:.5rem .9rem;cursor:pointer}
.amounts input{margin-right:.4rem}
input[type=text]{font:inherit;padding:.45rem .6rem;border-radius:6px;border:1px solid var(--muted);width:9rem;max-width:100%}
dl{display:grid;grid-template-columns:auto minmax(0,1fr);gap:.25rem 1rem;margin:0 0 1rem}
dt{color:var(--muted)}dd{margin:0;overflow-wrap:anywhere}
.error{color:#c62828;font-weight:600}
table{border-collapse:collapse;width:100%;margin:0 0 1rem;font-size:.925rem}
th,td{text-align:left;padding:.3rem .4rem;border-bottom:1px solid rgba(127,127,127,.25);vertical-align:top}
/* an id in a description breaks anywhere; amounts never break */
td{overflow-wrap:anywhere}
td.num,th.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
</style>`;
