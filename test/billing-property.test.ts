import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../src/app/context.ts';
import { findWallet } from '../src/billing/ledger.ts';
import type { Hold } from '../src/billing/service.ts';
import { Money } from '../src/core/money.ts';
import type { Project } from '../src/db/schema.ts';
import { getProject } from '../src/projects/service.ts';
import { connectUser } from '../src/users/service.ts';
import { createTestContext, realPostgres } from './helpers/context.ts';
import { seedProject } from './helpers/server.ts';

/**
 * The billing service against a simple model of the wallets. fast-check generates rounds of
 * operations — deposits, charges, holds, settles (below, at and above the hold: the provider reported
 * more than the estimate, charged whole, into debt when the balance cannot cover it) and releases — over
 * a few wallets; each round's operations run concurrently, so they meet in the same group-commit batches
 * and contend for the same wallets. After each round the model applies what the service reported and
 * the database must equal it exactly: every balance, held amount, open hold and ledger entry. A
 * refusal must be justified: it is wrong when the wallet could cover the amount even after every other
 * debit of the round succeeded.
 */
const WALLETS = ['w0', 'w1', 'w2'];
const trigger = { source: 'test', actorType: 'test', actorId: 'property' };

type Op =
  | { kind: 'deposit'; wallet: number; amount: string }
  | { kind: 'charge'; wallet: number; amount: string }
  | { kind: 'hold'; wallet: number; amount: string }
  | { kind: 'settle'; pick: number; cost: string; over?: number }
  | { kind: 'release'; pick: number };

const amount = fc
  .integer({ min: 1, max: 400 })
  .chain((n) => fc.constantFrom(`${n / 100}`, `${n / 1000}`, `0.${String(n).padStart(6, '0')}`));
const wallet = fc.integer({ min: 0, max: WALLETS.length - 1 });
const op: fc.Arbitrary<Op> = fc.oneof(
  fc.record({ kind: fc.constant('deposit' as const), wallet, amount }),
  fc.record({ kind: fc.constant('charge' as const), wallet, amount }),
  fc.record({ kind: fc.constant('hold' as const), wallet, amount }),
  fc.record({ kind: fc.constant('hold' as const), wallet, amount }),
  fc.record({
    kind: fc.constant('settle' as const),
    pick: fc.nat(),
    cost: fc.oneof(amount, fc.constant('0')),
  }),
  // the provider reported 1.1× to 4× what the hold assumed
  fc.record({
    kind: fc.constant('settle' as const),
    pick: fc.nat(),
    cost: fc.constant(''),
    over: fc.integer({ min: 11, max: 40 }),
  }),
  fc.record({ kind: fc.constant('release' as const), pick: fc.nat() }),
);
const rounds = fc.array(fc.array(op, { minLength: 1, maxLength: 12 }), { minLength: 1, maxLength: 8 });

interface ModelWallet {
  balance: Money;
  open: Map<string, Money>;
  entries: Money[];
}

function held(w: ModelWallet): Money {
  let sum = new Money(0);
  for (const a of w.open.values()) sum = sum.plus(a);
  return sum;
}

async function runProperty(ctx: AppContext, project: Project, runs: number) {
  let run = 0;
  await fc.assert(
    fc.asyncProperty(rounds, async (plan) => {
      run++;
      const ids = WALLETS.map((w) => `${w}-${run}`);
      for (const id of ids) await connectUser(ctx.db, ctx.events, project, id, trigger);
      const model: ModelWallet[] = ids.map(() => ({ balance: new Money(0), open: new Map(), entries: [] }));
      const open: Array<{ hold: Hold; wallet: number }> = [];
      for (const round of plan) {
        const available = model.map((w) => w.balance.minus(held(w)));
        // Each settle or release picks a distinct hold open at the start of the round.
        const picked = new Set<number>();
        const tasks = round.map(async (o) => {
          switch (o.kind) {
            case 'deposit': {
              await ctx.billing.deposit({
                project,
                externalId: ids[o.wallet]!,
                amount: o.amount,
                source: 't',
                trigger,
              });
              return { o, ok: true as const };
            }
            case 'charge': {
              const r = await ctx.billing.charge({
                project,
                externalId: ids[o.wallet]!,
                amount: o.amount,
                source: 't',
                trigger,
              });
              return { o, ok: r.ok };
            }
            case 'hold': {
              const r = await ctx.billing.hold({
                project,
                externalId: ids[o.wallet]!,
                amount: o.amount,
                purpose: 'chat',
              });
              return { o, ok: r.ok, hold: r.ok ? r.hold : undefined };
            }
            case 'settle':
            case 'release': {
              if (!open.length) return { o, ok: false as const, skipped: true };
              let i = o.pick % open.length;
              while (picked.has(i) && picked.size < open.length) i = (i + 1) % open.length;
              if (picked.has(i)) return { o, ok: false as const, skipped: true };
              picked.add(i);
              const target = open[i]!;
              if (o.kind === 'release') {
                await ctx.billing.release(target.hold);
                return { o, ok: true as const, target, charged: '0' };
              }
              const cost =
                o.over === undefined ? o.cost : new Money(target.hold.amount).times(o.over).div(10).toFixed();
              const r = await ctx.billing.settle({
                project,
                hold: target.hold,
                cost,
                source: 'chat',
                model: 'm',
                trigger,
                externalId: ids[target.wallet]!,
                metadata: {},
                description: 'property',
              });
              return { o, ok: true as const, target, charged: r.charged, cost };
            }
          }
        });
        const results = await Promise.all(tasks);

        // What the other operations of the round could at most take from each wallet.
        const debits = model.map(() => new Money(0));
        for (const r of results) {
          if ((r.o.kind === 'charge' || r.o.kind === 'hold') && r.ok) {
            debits[r.o.wallet] = debits[r.o.wallet]!.plus(r.o.amount);
          }
          // a settle above its hold takes the excess from the available balance too
          if (r.o.kind === 'settle' && 'target' in r && r.target) {
            const excess = new Money(r.charged).minus(r.target.hold.amount);
            if (excess.gt(0)) debits[r.target.wallet] = debits[r.target.wallet]!.plus(excess);
          }
        }
        for (const r of results) {
          const o = r.o;
          if (o.kind === 'deposit') {
            const w = model[o.wallet]!;
            w.balance = w.balance.plus(o.amount);
            w.entries.push(new Money(o.amount));
          } else if (o.kind === 'charge' || o.kind === 'hold') {
            const w = model[o.wallet]!;
            if (!r.ok) {
              // refused: only right when the wallet could not cover it after the round's other debits
              const floor = available[o.wallet]!.minus(debits[o.wallet]!);
              expect({ refused: o, floor: floor.toFixed() }).toSatisfy(() => floor.lt(o.amount));
              continue;
            }
            if (o.kind === 'charge') {
              w.balance = w.balance.minus(o.amount);
              w.entries.push(new Money(o.amount).neg());
            } else {
              const hold = (r as { hold: Hold }).hold;
              w.open.set(hold.id, new Money(o.amount));
              open.push({ hold, wallet: o.wallet });
            }
          } else if ('target' in r && r.target) {
            const w = model[r.target.wallet]!;
            w.open.delete(r.target.hold.id);
            // the real cost, whole: never capped at the hold (the wallet may go below zero)
            const expected = o.kind === 'settle' ? new Money((r as { cost: string }).cost) : new Money(0);
            expect(new Money(r.charged).toFixed()).toBe(expected.toFixed());
            if (expected.gt(0)) {
              w.balance = w.balance.minus(expected);
              w.entries.push(expected.neg());
            }
          }
        }
        for (let i = open.length - 1; i >= 0; i--) {
          if (!model[open[i]!.wallet]!.open.has(open[i]!.hold.id)) open.splice(i, 1);
        }
        await compare(ctx, project, ids, model);
      }
    }),
    { numRuns: runs, seed: Number(process.env.PROPERTY_SEED ?? Date.now() % 2 ** 31) },
  );
}

async function compare(ctx: AppContext, project: Project, ids: string[], model: ModelWallet[]) {
  for (const [i, id] of ids.entries()) {
    const w = model[i]!;
    const wallet = (await findWallet(ctx.db, project.id, id))!;
    const entries = await ctx.db
      .selectFrom('ledger_entries')
      .select('amount')
      .where('user_id', '=', wallet.userId)
      .orderBy('id')
      .execute();
    const openHolds = await ctx.db
      .selectFrom('holds')
      .select(['id', 'amount'])
      .where('user_id', '=', wallet.userId)
      .where('status', '=', 'open')
      .execute();
    const sorted = (xs: Money[]) => xs.map((x) => x.toFixed()).sort();
    expect({
      wallet: id,
      balance: new Money(wallet.balance).toFixed(),
      held: new Money(wallet.held).toFixed(),
      open: Object.fromEntries(openHolds.map((h) => [h.id, new Money(h.amount).toFixed()])),
      entries: sorted(entries.map((e) => new Money(e.amount))),
    }).toEqual({
      wallet: id,
      balance: w.balance.toFixed(),
      held: held(w).toFixed(),
      open: Object.fromEntries([...w.open].map(([k, v]) => [k, v.toFixed()])),
      entries: sorted(w.entries),
    });
  }
}

describe.each([
  ['Postgres', {}, realPostgres ? 40 : 0],
  ['the embedded database', { DATABASE_URL: '' }, 15],
])('the billing service on %s', (_name, env, runs) => {
  let ctx: AppContext;
  let project: Project;
  beforeAll(async () => {
    if (!runs) return;
    ctx = await createTestContext(env as Record<string, string>);
    project = await getProject(ctx.db, (await seedProject(ctx)).projectId);
  });
  afterAll(() => ctx?.close());

  it.skipIf(!runs)(
    'matches the model of the wallets under concurrent rounds of every money movement',
    async () => {
      await runProperty(ctx, project, runs);
    },
    120_000,
  );
});
