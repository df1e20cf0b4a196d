import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { type ChatFixture, perTokenModel, startChatFixture } from '../helpers/chat-fixture.ts';

/**
 * Read-your-writes: once a client has the end of a response (the last byte of a JSON body, `[DONE]` of
 * a stream), a balance read and the next request see that response's charge. Each read below follows
 * its response at once, with nothing waiting for the settle in between.
 */
let f: ChatFixture;
const price = { inputPerMillion: new Money('0.15'), outputPerMillion: new Money('0.6') };
const messages = [{ role: 'user' as const, content: 'Say hello' }];
const PER_REQUEST = tokenCost(price, 12, 5); // the mock provider reports 12 prompt and 5 completion tokens

beforeAll(async () => {
  f = await startChatFixture({
    models: [perTokenModel('m', '0.15', '0.6')],
    settings: { maxCompletionTokens: 100 },
  });
});
afterAll(() => f.close());

async function balance(user: string) {
  const res = await fetch(`${f.server.url}/v1/user/balance?user=${user}`, {
    headers: { authorization: `Bearer ${f.apiKey}` },
  });
  expect(res.status).toBe(200);
  return (await res.json()) as { balance: string; held: string; available: string };
}

async function activityCount(user: string) {
  const res = await fetch(`${f.server.url}/v1/user/activity?user=${user}&limit=100`, {
    headers: { authorization: `Bearer ${f.apiKey}` },
  });
  const body = (await res.json()) as { data: Array<{ type: string }> };
  return body.data.filter((e) => e.type === 'charge').length;
}

describe('a balance read right after a response', () => {
  it('sees the charge of a non-streamed response, every time', async () => {
    await f.fund('rw', '10');
    let expected = new Money('10');
    for (let i = 1; i <= 15; i++) {
      const reply = await f.client.chat.completions.create({ model: 'm', user: 'rw', messages });
      expect(reply.usage?.completion_tokens).toBe(5);
      expected = expected.minus(PER_REQUEST);
      const read = await balance('rw');
      expect({ i, balance: new Money(read.balance).toFixed(), held: new Money(read.held).toFixed() }).toEqual(
        {
          i,
          balance: expected.toFixed(),
          held: '0',
        },
      );
      expect(await activityCount('rw')).toBe(i);
    }
  });

  it('sees the charge of a streamed response once [DONE] arrived, every time', async () => {
    await f.fund('rs', '10');
    let expected = new Money('10');
    for (let i = 1; i <= 15; i++) {
      const stream = await f.client.chat.completions.create({
        model: 'm',
        user: 'rs',
        messages,
        stream: true,
        stream_options: { include_usage: true },
      });
      let text = '';
      for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
      expect(text).toBe(' hello'.repeat(5));
      expected = expected.minus(PER_REQUEST);
      const read = await balance('rs');
      expect({ i, balance: new Money(read.balance).toFixed(), held: new Money(read.held).toFixed() }).toEqual(
        {
          i,
          balance: expected.toFixed(),
          held: '0',
        },
      );
    }
  });

  it('lets a user spend to the last cent with back-to-back requests: no spurious top-up link', async () => {
    // Learn what one request holds, then fund a user with exactly that plus four charges: each of five
    // back-to-back requests is admitted only if the previous one's hold is already settled.
    await f.fund('probe', '1');
    await f.client.chat.completions.create({ model: 'm', user: 'probe', messages });
    const hold = (await f.holds('probe'))[0]!.amount;
    await f.fund('edge', new Money(hold).plus(new Money(PER_REQUEST).times(4)).toFixed());
    for (let i = 0; i < 5; i++) {
      const reply = await f.client.chat.completions.create({ model: 'm', user: 'edge', messages });
      expect({ i, content: reply.choices[0]!.message.content }).toEqual({ i, content: ' hello'.repeat(5) });
    }
    expect(new Money((await balance('edge')).available).toFixed()).toBe(
      new Money(hold).minus(PER_REQUEST).toFixed(),
    );
  });
});
