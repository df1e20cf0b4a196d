import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { countPromptTokens } from '../../src/tokens/inputs.ts';
import { type ChatFixture, startChatFixture } from '../helpers/chat-fixture.ts';
import { api } from '../helpers/server.ts';

/**
 * The project's `debtLimit` (issue 35): a request whose worst case exceeds the available balance plus
 * the debt limit is refused with the top-up link; within it, the request is served — and since nothing
 * is charged above the worst case (usage above the bounds is an anomaly, charged at the bounds), no
 * request, however concurrent, takes the wallet below −debtLimit. The official `openai` client against a
 * loopback provider that reports the whole bound as used (every charge is its worst case).
 */
let f: ChatFixture;
const ROOT = 'root-admin-token-0123456789abcdef';
const PRICE = { inputPerMillion: new Money('1000'), outputPerMillion: new Money('1000') };
const messages = [{ role: 'user' as const, content: 'Say hello' }];
const PROMPT = countPromptTokens({ model: 'x', messages });

beforeAll(async () => {
  f = await startChatFixture({
    models: [
      {
        id: 'm',
        upstreamModel: 'm',
        pricing: { mode: 'per_token', inputPerMillion: '1000', outputPerMillion: '1000', holdMargin: '1' },
      },
    ],
    env: { TOLLGATE_ADMIN_TOKEN: ROOT },
  });
});
afterAll(() => f.close());

const settings = (body: unknown) => api(f.server, ROOT, 'PATCH', `/admin/v1/projects/${f.project.id}`, body);

describe('the debt limit', () => {
  it('is a project setting: a non-negative decimal, anything else a 400 naming it', async () => {
    for (const bad of ['-1', 'abc', '1.1234567']) {
      const res = await settings({ settings: { debtLimit: bad } });
      expect(res.status).toBe(400);
      expect(JSON.stringify(res.body)).toContain('debtLimit');
    }
    const ok = await settings({ settings: { debtLimit: '1.00' } });
    expect(ok.status).toBe(200);
    expect(new Money(ok.body.settings.debtLimit).eq(1)).toBe(true);
  });

  it('lets in a request whose worst case exceeds the balance by less than the limit', async () => {
    await f.fund('in-debt', '0.50');
    // worst case = (prompt + 1000) × 0.001 ≈ 1.01: above 0.50, within 0.50 + 1.00
    f.mock.behaviors.set('m', { promptTokens: PROMPT, completionTokens: 1000 });
    await f.client.chat.completions.create({ model: 'm', user: 'in-debt', messages, max_tokens: 1000 });
    await f.settled();
    const balance = (await f.wallet('in-debt'))!.balance;
    expect(balance).toBe(new Money('0.50').minus(tokenCost(PRICE, PROMPT, 1000)).toFixed());
    expect(new Money(balance).gte(-1)).toBe(true);
  });

  it('refuses with the top-up link beyond it', async () => {
    await f.fund('too-deep', '0.50');
    const sent = f.mock.requests.length;
    const answer = (await f.client.chat.completions.create({
      model: 'm',
      user: 'too-deep',
      messages,
      max_tokens: 2000, // worst case ≈ 2.01 > 0.50 + 1.00
    })) as unknown as { paywall: { decision: string } };
    expect(answer.paywall.decision).toBe('topup_required');
    expect(f.mock.requests.length).toBe(sent);
    expect((await f.wallet('too-deep'))!.balance).toBe('0.5');
  });

  it('concurrent requests never take the wallet below −debtLimit', async () => {
    await f.fund('crowd', '0.50');
    f.mock.behaviors.set('m', { promptTokens: PROMPT, completionTokens: 400 });
    const worst = tokenCost(PRICE, PROMPT, 400); // ≈ 0.41 each, all charged
    const answers = await Promise.all(
      Array.from({ length: 12 }, () =>
        f.client.chat.completions.create({ model: 'm', user: 'crowd', messages, max_tokens: 400 }),
      ),
    );
    await f.settled();
    const served = answers.filter((a) => !(a as unknown as { paywall?: unknown }).paywall).length;
    // 0.50 + 1.00 covers 3 worst cases of ≈ 0.41
    expect(served).toBe(Math.floor(1.5 / Number(worst)));
    const balance = new Money((await f.wallet('crowd'))!.balance);
    expect(balance.toFixed()).toBe(new Money('0.50').minus(new Money(worst).times(served)).toFixed());
    expect(balance.gte(-1)).toBe(true);
    await f.ledger('crowd');
  });
});
