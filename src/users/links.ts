import { randomBytes } from 'node:crypto';
import type { Sealer } from '../core/crypto.ts';

/**
 * Connect and top-up links. A link carries a signed, expiring token:
 * `base64url(JSON payload) "." HMAC-SHA256 signature`, signed with a key derived from
 * TOLLGATE_ENCRYPTION_KEY. The payload names the project, the end user, the kind of link and, for top-up
 * links, the amount needed; `n` is a nonce so that a used token can be refused (single use).
 */
export type LinkKind = 'connect' | 'topup' | 'portal';

export interface LinkPayload {
  k: LinkKind;
  /** project id */
  p: string;
  /** end user's external id */
  u: string;
  /** amount needed (top-up links) */
  a?: string;
  /**
   * what the refused request needs (top-up links of a refusal): the page asks for the gap, this less the
   * available balance when it is opened
   */
  r?: string;
  /** expiry, seconds since the epoch */
  exp: number;
  /** nonce */
  n: string;
}

export type LinkCheck =
  | { ok: true; payload: LinkPayload }
  | { ok: false; reason: 'malformed' | 'forged' | 'expired' };

export function createLinkToken(
  sealer: Sealer,
  input: {
    kind: LinkKind;
    projectId: string;
    externalId: string;
    amount?: string;
    need?: string;
    ttlSeconds: number;
  },
  now = Date.now(),
): string {
  const payload: LinkPayload = {
    k: input.kind,
    p: input.projectId,
    u: input.externalId,
    ...(input.amount ? { a: input.amount } : {}),
    ...(input.need ? { r: input.need } : {}),
    exp: Math.floor(now / 1000) + input.ttlSeconds,
    n: randomBytes(12).toString('base64url'),
  };
  const body = Buffer.from(JSON.stringify(payload)).toString('base64url');
  return `${body}.${sealer.sign(body)}`;
}

export function verifyLinkToken(sealer: Sealer, token: string, now = Date.now()): LinkCheck {
  const [body, signature, extra] = token.split('.');
  if (!body || !signature || extra !== undefined) return { ok: false, reason: 'malformed' };
  if (!sealer.verify(body, signature)) return { ok: false, reason: 'forged' };
  let payload: LinkPayload;
  try {
    payload = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as LinkPayload;
  } catch {
    return { ok: false, reason: 'malformed' };
  }
  if (typeof payload.exp !== 'number' || payload.exp * 1000 <= now) return { ok: false, reason: 'expired' };
  return { ok: true, payload };
}

/** The absolute URL of a link: `{PUBLIC_BASE_URL}/connect/{token}`, `/topup/{token}` or `/portal/{token}`. */
export function linkUrl(publicBaseUrl: string, kind: LinkKind, token: string): string {
  return `${publicBaseUrl}/${kind}/${token}`;
}

/** What making a link takes: the signing key, the public address and how long a link lives. */
export interface LinkSettings {
  sealer: Sealer;
  publicBaseUrl: string;
  ttlSeconds: number;
}

/** The link settings of the process (its signing key, public address and LINK_TOKEN_TTL_SECONDS). */
export function linkSettingsOf(ctx: {
  sealer: Sealer;
  publicBaseUrl: string;
  config: { LINK_TOKEN_TTL_SECONDS: number };
}): LinkSettings {
  return {
    sealer: ctx.sealer,
    publicBaseUrl: ctx.publicBaseUrl,
    ttlSeconds: ctx.config.LINK_TOKEN_TTL_SECONDS,
  };
}

export const DEFAULT_CONNECT_MESSAGE =
  'To continue, connect your account to {project}. Open this link to connect: {link}';
export const DEFAULT_TOPUP_MESSAGE =
  'Your balance is too low for this request ({amount} {currency} needed, {available} {currency} available). Top up here: {link}';

/** Fills a message template: `{link}`, `{project}`, `{amount}`, `{available}`, `{currency}`. */
export function renderMessage(template: string, values: Record<string, string>): string {
  return template.replace(
    /\{(link|project|amount|available|currency)\}/g,
    (whole, name: string) => values[name] ?? whole,
  );
}

export interface PaywallLinkInput extends LinkSettings {
  project: {
    id: string;
    name: string;
    currency: string;
    settings: { connectMessage?: string; topupMessage?: string };
  };
  externalId: string;
}

/** The URL of a new signed link of a user (a top-up link may name the amount needed). */
export function newLinkUrl(
  links: LinkSettings,
  input: {
    kind: LinkKind;
    projectId: string;
    externalId: string;
    amount?: string | undefined;
    need?: string | undefined;
  },
): string {
  const token = createLinkToken(links.sealer, {
    kind: input.kind,
    projectId: input.projectId,
    externalId: input.externalId,
    ...(input.amount ? { amount: input.amount } : {}),
    ...(input.need ? { need: input.need } : {}),
    ttlSeconds: links.ttlSeconds,
  });
  return linkUrl(links.publicBaseUrl, input.kind, token);
}

const paywallLink = (input: PaywallLinkInput, kind: LinkKind, amount?: string, need?: string) =>
  newLinkUrl(input, { kind, projectId: input.project.id, externalId: input.externalId, amount, need });

/** The connect link and the assistant message carrying it. */
export function connectReply(input: PaywallLinkInput): { url: string; message: string } {
  const url = paywallLink(input, 'connect');
  const message = renderMessage(input.project.settings.connectMessage ?? DEFAULT_CONNECT_MESSAGE, {
    link: url,
    project: input.project.name,
    currency: input.project.currency,
  });
  return { url, message };
}

/**
 * The top-up link for `required` (what the request needs) and the assistant message carrying it. The link
 * names `need` too (what the refused request itself needs): its page asks for the gap, `need` less the
 * available balance when the page is opened.
 */
export function topupReply(
  input: PaywallLinkInput & { required: string; available: string; need?: string | undefined },
): {
  url: string;
  message: string;
} {
  const url = paywallLink(input, 'topup', input.required, input.need);
  const message = renderMessage(input.project.settings.topupMessage ?? DEFAULT_TOPUP_MESSAGE, {
    link: url,
    project: input.project.name,
    amount: input.required,
    available: input.available,
    currency: input.project.currency,
  });
  return { url, message };
}
