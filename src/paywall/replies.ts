import type { PaywallRefusal } from '../billing/ledger.ts';
import type { Sealer } from '../core/crypto.ts';
import { currencyDecimals, formatForCurrency, Money } from '../core/money.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { connectReply, topupReply } from '../users/links.ts';

/**
 * The paywall's two refusals, as ordinary assistant messages: a user who is not connected gets a
 * connect link, a connected user whose balance cannot cover the request gets a top-up link. Links are
 * signed and expire (../users/links.ts); the message text is the project's template. Each API shows the
 * reply in its own shape (a chat completion, a Responses response, an Anthropic message, a 402).
 */
/** `spend_cap_reached`: the user is at a spend cap (src/limits); the message says when it resets. */
export type PaywallDecision = 'connect_required' | 'topup_required' | 'spend_cap_reached';

export interface LinkReply {
  decision: PaywallDecision;
  url: string;
  message: string;
  /** Top-up links: what the request needs and what the wallet has available. */
  required?: string;
  available?: string;
}

/** What signing a link needs (the app context passes itself). */
export interface LinkSigning {
  sealer: Sealer;
  publicBaseUrl: string;
  config: { LINK_TOKEN_TTL_SECONDS: number };
}

export function linkReply(
  ctx: LinkSigning,
  project: ProjectContext,
  externalId: string,
  refusal: PaywallRefusal,
): LinkReply {
  const input = {
    sealer: ctx.sealer,
    publicBaseUrl: ctx.publicBaseUrl,
    ttlSeconds: ctx.config.LINK_TOKEN_TTL_SECONDS,
    project,
    externalId,
  };
  if (refusal.reason === 'not_connected') return { decision: 'connect_required', ...connectReply(input) };
  // What a top-up must bring, in the currency's minor unit (a deposit cannot carry finer amounts): the
  // request, plus the debt when a charge above its hold left the wallet below zero.
  const debt = Money.max(new Money(refusal.wallet.available).neg(), 0);
  const upToMinor = (v: Money) =>
    formatForCurrency(
      v.toDecimalPlaces(currencyDecimals(project.currency), Money.ROUND_UP),
      project.currency,
    );
  const required = upToMinor(new Money(refusal.required).plus(debt));
  // The available balance is the balance less what the user's requests in flight reserved (escrow slices
  // are not counted); the top-up page asks for the gap between the request's need and it.
  const available = formatForCurrency(refusal.wallet.available, project.currency);
  return {
    decision: 'topup_required',
    ...topupReply({ ...input, required, available, need: upToMinor(new Money(refusal.required)) }),
    required,
    available,
  };
}

/** The `paywall` field of a reply that carries the link, for programs: the decision, the link, the amounts. */
export function paywallField(link: LinkReply) {
  return {
    decision: link.decision,
    url: link.url,
    ...(link.required ? { required: link.required, available: link.available } : {}),
  };
}
