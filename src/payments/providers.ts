import type { Config } from '../config/index.ts';
import type { PaymentProvider, PaymentProviderKind, ProviderEnv } from './provider.ts';
import { stripe } from './stripe/index.ts';
import { testProvider } from './test-provider/index.ts';

/**
 * The payment providers Tollgate can connect, keyed by name: the name in the webhook URL
 * (`/payments/{provider}/{project}/webhook`), in a connection's and a payment's `provider` column and in
 * the ledger's `source`. Adding a provider: implement `PaymentProvider` in its own folder (as ./stripe)
 * and list its kind here.
 */
const providers: ReadonlyMap<string, PaymentProviderKind> = new Map([
  [stripe.name, stripe],
  [testProvider.name, testProvider],
]);

/**
 * The provider of that name, when the configuration allows it; undefined for a name no provider has and
 * for one the configuration rules out (`test` unless test payments are on, and never in production).
 */
export function providerKind(name: string, config: Config): PaymentProviderKind | undefined {
  const kind = providers.get(name);
  return kind && (kind.available?.(config) ?? true) ? kind : undefined;
}

/** The client of an account of a provider the configuration allows. */
export function providerClient(name: string, secretKey: string, env: ProviderEnv): PaymentProvider {
  const kind = providerKind(name, env.config);
  if (!kind) throw new Error(`payment provider ${name} is not available in this configuration`);
  return kind.create(secretKey, env);
}
