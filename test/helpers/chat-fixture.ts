import OpenAI from 'openai';
import type { AppContext } from '../../src/app/context.ts';
import { findWallet, type WalletState } from '../../src/billing/ledger.ts';
import { Money } from '../../src/core/money.ts';
import type { LedgerEntry, Project } from '../../src/db/schema.ts';
import type { ModelSpec } from '../../src/models/pricing.ts';
import { getProject } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { createSubscription } from '../../src/webhooks/subscriptions.ts';
import { type MockBehavior, type MockUpstream, startMockUpstream } from './mock-upstream.ts';
import { eventsOfType, seedProject, startTestServer, type TestServer } from './server.ts';

const trigger = { source: 'test', actorType: 'test', actorId: 'test' };

/** A model priced per token (`outputPerMillion` left out for an embeddings price), served by the mock's `upstreamModel`. */
export function perTokenModel(
  id: string,
  inputPerMillion: string,
  outputPerMillion?: string,
  upstreamModel = 'mock-model',
): ModelSpec {
  const pricing = { mode: 'per_token' as const, inputPerMillion };
  return { id, upstreamModel, pricing: outputPerMillion ? { ...pricing, outputPerMillion } : pricing };
}

/**
 * One per-token price (input, output and cached input per million tokens) twice: as `Money` for computing
 * expected costs, and as the `per_token` pricing a model spec carries.
 */
export function tokenPrices(
  inputPerMillion: string,
  outputPerMillion: string,
  cachedInputPerMillion: string,
) {
  return {
    price: {
      inputPerMillion: new Money(inputPerMillion),
      outputPerMillion: new Money(outputPerMillion),
      cachedInputPerMillion: new Money(cachedInputPerMillion),
    },
    perToken: { mode: 'per_token' as const, inputPerMillion, outputPerMillion, cachedInputPerMillion },
  };
}

/** A model priced per request, served by the mock's `upstreamModel`. */
export function perRequestModel(id: string, perRequest: string, upstreamModel = 'mock-model'): ModelSpec {
  return { id, upstreamModel, pricing: { mode: 'per_request', perRequest } };
}

/** An embeddings-only model at `inputPerMillion` (0.02 unless given) served by the mock's `upstreamModel`. */
export function embeddingModel(id: string, upstreamModel: string, inputPerMillion = '0.02'): ModelSpec {
  return { id, upstreamModel, pricing: { mode: 'per_token', inputPerMillion }, endpoints: ['embeddings'] };
}

/**
 * A Tollgate server with a project whose provider is the mock upstream (or the echo provider), an
 * official `openai` client pointed at it, and helpers to fund users and read the ledger.
 */
export interface ChatFixture {
  server: TestServer;
  ctx: AppContext;
  mock: MockUpstream;
  project: Project;
  apiKey: string;
  client: OpenAI;
  /** Connects the user and deposits `amount` (when given). */
  fund(user: string, amount?: string): Promise<void>;
  wallet(user: string): Promise<WalletState | undefined>;
  /** Waits until every settle and event write after a response has finished. */
  settled(): Promise<void>;
  /** Subscribes the project to `events` (at a URL nothing listens on unless given), so they are written. */
  subscribe(events: string[], url?: string): Promise<void>;
  /** Once settled, the envelopes of the project's events of one type, oldest first. */
  events(type: string): Promise<any[]>;
  /** The pod gives its slice of the user's wallet back (escrow), as when idle: `held` is then 0. */
  giveBack(user: string): Promise<void>;
  /** Checks the ledger invariants (balance = Σ amounts, slices = Σ open holds); returns the entries. */
  ledger(user: string): Promise<Array<{ kind: string; amount: string; source: string; held_delta: string }>>;
  /** The user's holds, oldest first. */
  holds(user: string): Promise<Array<{ amount: string; status: string; purpose: string }>>;
  close(): Promise<void>;
}

export async function startChatFixture(options: {
  models: ModelSpec[];
  env?: Record<string, string>;
  upstream?: 'mock' | 'echo';
  settings?: Record<string, unknown>;
  mockDefaults?: MockBehavior;
  /** Leave models without `holdMargin` at their tokenizer family's default (see seedProject). */
  familyMargins?: boolean;
}): Promise<ChatFixture> {
  const mock = await startMockUpstream(options.mockDefaults ? { defaults: options.mockDefaults } : {});
  const server = await startTestServer(options.env ?? {});
  const ctx = server.ctx;
  const seeded = await seedProject(ctx, {
    upstreamUrl: options.upstream === 'echo' ? 'echo://local' : mock.baseUrl,
    upstreamKey: 'sk-mock-provider-key',
    models: options.models,
    ...(options.familyMargins ? { familyMargins: true } : {}),
    ...(options.settings ? { settings: options.settings } : {}),
  });
  const project = await getProject(ctx.db, seeded.projectId);
  const client = new OpenAI({
    baseURL: `${server.url}/v1`,
    apiKey: seeded.apiKey,
    maxRetries: 0,
    timeout: 20_000,
  });
  const fixture: ChatFixture = {
    server,
    ctx,
    mock,
    project,
    apiKey: seeded.apiKey,
    client,
    async fund(user, amount) {
      await connectUser(ctx.db, ctx.events, project, user, trigger);
      if (amount) await ctx.billing.deposit({ project, externalId: user, amount, source: 'test', trigger });
    },
    wallet: (user) => findWallet(ctx.db, project.id, user),
    async settled() {
      await server.app.metering.idle();
      await ctx.billing.idle();
    },
    async subscribe(events, url = 'http://127.0.0.1:9/hook') {
      await createSubscription(ctx, project.id, { url, events }, { createdBy: 'test' });
    },
    async events(type) {
      await fixture.settled();
      return eventsOfType(ctx, project.id, type);
    },
    async giveBack(user) {
      const wallet = (await findWallet(ctx.db, project.id, user))!;
      await ctx.billing.escrow.reclaim(project.id, [wallet.userId]);
    },
    async ledger(user) {
      const wallet = (await findWallet(ctx.db, project.id, user))!;
      const entries = await ledgerEntriesOf(ctx, wallet.userId, ['kind', 'amount', 'source', 'held_delta']);
      const balance = entries.reduce((sum, e) => sum.plus(e.amount), new Money(0));
      const held = await heldByOpenHolds(ctx, wallet.userId);
      // the pods' slices: end_users.held (the wallet shows what requests in flight reserved)
      const slices = await ctx.db
        .selectFrom('end_users')
        .select('held')
        .where('id', '=', wallet.userId)
        .executeTakeFirstOrThrow();
      if (!balance.eq(wallet.balance) || !held.eq(slices.held)) {
        throw new Error(
          `ledger out of balance: ${balance} vs ${wallet.balance}, held ${held} vs ${slices.held}`,
        );
      }
      return entries;
    },
    async holds(user) {
      const wallet = (await findWallet(ctx.db, project.id, user))!;
      return ctx.db
        .selectFrom('holds')
        .select(['amount', 'status', 'purpose'])
        .where('user_id', '=', wallet.userId)
        .orderBy('created_at')
        .orderBy('id')
        .execute();
    },
    async close() {
      await server.close();
      await mock.close();
    },
  };
  return fixture;
}

/** `columns` of a wallet's ledger entries, oldest first. */
export function ledgerEntriesOf<C extends keyof LedgerEntry & string>(
  ctx: AppContext,
  userId: string,
  columns: C[],
): Promise<Array<Pick<LedgerEntry, C>>> {
  return ctx.db
    .selectFrom('ledger_entries')
    .select(columns)
    .where('user_id', '=', userId)
    .orderBy('seq')
    .execute() as unknown as Promise<Array<Pick<LedgerEntry, C>>>;
}

/** What a wallet's `held` must be: the sum of its open holds. */
export async function heldByOpenHolds(ctx: AppContext, userId: string): Promise<Money> {
  const open = await ctx.db
    .selectFrom('holds')
    .select('amount')
    .where('user_id', '=', userId)
    .where('status', '=', 'open')
    .execute();
  return open.reduce((sum, h) => sum.plus(h.amount), new Money(0));
}

/** Sum of the chat charges of a user's ledger (a positive decimal string). */
export function chargedTotal(
  entries: Array<{ kind: string; amount: string; source: string }>,
  source = 'chat',
): string {
  return entries
    .filter((e) => e.kind === 'charge' && e.source === source)
    .reduce((sum, e) => sum.minus(e.amount), new Money(0))
    .toFixed();
}
