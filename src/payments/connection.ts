import type { Logger } from 'pino';
import type { BillingService } from '../billing/service.ts';
import type { Config } from '../config/index.ts';
import type { Sealer } from '../core/crypto.ts';
import { ApiError } from '../core/errors.ts';
import type { Database } from '../db/index.ts';
import type { EventRecorder } from '../events/outbox.ts';
import type { ProjectDirectory } from '../projects/directory.ts';
import type { PaymentProvider, ProviderEnv } from './provider.ts';
import { providerClient, providerKind } from './providers.ts';

/**
 * What payments use of the process (the application context passes itself), and a project's
 * connection: its row, its provider's client (opened on first use) and its webhook signing secret.
 */
export interface PaymentsContext {
  db: Database;
  sealer: Sealer;
  billing: BillingService;
  events: EventRecorder;
  config: Config;
  log: Logger;
  projects: ProjectDirectory;
  /** Public address for links and the webhook URL (read when needed: a server sets it once bound). */
  publicBaseUrl: string;
}

export type ConnectionRow = NonNullable<Awaited<ReturnType<typeof connectionOf>>>;

export async function connectionOf(ctx: Pick<PaymentsContext, 'db'>, projectId: string) {
  return ctx.db
    .selectFrom('payment_connections')
    .selectAll()
    .where('project_id', '=', projectId)
    .executeTakeFirst();
}

/** What a connection's client is opened with: the process (as a provider's environment) and the sealer. */
export type ClientContext = ProviderEnv & Pick<PaymentsContext, 'sealer'>;

/** The client of a connection's provider, with its key unsealed. */
export function connectionClient(
  ctx: ClientContext,
  connection: Pick<ConnectionRow, 'provider' | 'key_sealed'>,
): PaymentProvider {
  return providerClient(connection.provider, ctx.sealer.open(connection.key_sealed), ctx);
}

export interface OpenConnection {
  connection: ConnectionRow;
  /** Opened on first use: a page that only asks whether payments are connected unseals nothing. */
  readonly provider: PaymentProvider;
  webhookSecret(): string;
}

/**
 * The connection of a project with payments connected; undefined otherwise, and for a connection of a
 * provider the configuration rules out (a `test` connection under a production configuration).
 */
export async function openConnection(
  ctx: ClientContext,
  projectId: string,
): Promise<OpenConnection | undefined> {
  const connection = await connectionOf(ctx, projectId);
  if (!connection || !providerKind(connection.provider, ctx.config)) return undefined;
  let provider: PaymentProvider | undefined;
  return {
    connection,
    get provider(): PaymentProvider {
      provider ??= connectionClient(ctx, connection);
      return provider;
    },
    webhookSecret: () => ctx.sealer.open(connection.webhook_secret_sealed),
  };
}

/** Where a provider sends a project's webhooks: `{PUBLIC_BASE_URL}/payments/{provider}/{project}/webhook`. */
export function webhookUrl(
  ctx: Pick<PaymentsContext, 'publicBaseUrl'>,
  provider: string,
  projectId: string,
): string {
  return `${ctx.publicBaseUrl}/payments/${provider}/${encodeURIComponent(projectId)}/webhook`;
}

export const notConnected = (projectId: string) =>
  new ApiError(409, 'invalid_request_error', `Project ${projectId} has no payment provider connected.`, {
    code: 'payments_not_connected',
  });
