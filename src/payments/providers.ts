import type { Config } from '../config/index.ts';
import type { PaymentProvider, PaymentProviderKind } from './provider.ts';
import { stripe } from './stripe/index.ts';

/**
 * The payment providers Tollgate can connect, keyed by name: the name in the webhook URL
 * (`/payments/{provider}/{project}/webhook`), in a connection's and a payment's `provider` column and in
 * the ledger's `source`. Adding a provider: implement `PaymentProvider` in its own folder (as ./stripe)
 * and list its kind here.
 */
const providers: ReadonlyMap<string, PaymentProviderKind> = new Map([[stripe.name, stripe]]);

/** The provider of that name; undefined for a name no provider has. */
export function providerKind(name: string): PaymentProviderKind | undefined {
  return providers.get(name);
}

/** The client of an account of a known provider (a connection's provider is one of the registry's). */
export function providerClient(name: string, secretKey: string, config: Config): PaymentProvider {
  const kind = providerKind(name);
  if (!kind) throw new Error(`unknown payment provider ${name}`);
  return kind.create(secretKey, config);
}
