import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ChatFixture, perRequestModel, startChatFixture } from '../helpers/chat-fixture.ts';
import { api } from '../helpers/server.ts';

/**
 * The whole paywall as an end user meets it, with the official client: a connect link, the hosted
 * connect page, a top-up link to the developer's checkout, a deposit through the API, then answers.
 */
let f: ChatFixture;
const messages = [{ role: 'user' as const, content: 'Hello!' }];

beforeAll(async () => {
  f = await startChatFixture({
    models: [perRequestModel('chat', '0.05')],
    settings: { checkoutUrl: 'https://shop.example.com/checkout' },
  });
});
afterAll(() => f.close());

const linkIn = (text: string, kind: 'connect' | 'topup') =>
  new RegExp(`(http://\\S+/${kind}/[A-Za-z0-9_.-]+)`).exec(text)?.[1];

describe('the paywall, end to end', () => {
  it('connect link → connect page → top-up link → checkout → deposit → answer', async () => {
    const ask = async () =>
      (await f.client.chat.completions.create({ model: 'chat', user: 'newcomer', messages })).choices[0]!
        .message.content!;

    // 1. not connected: a connect link
    const connectLink = linkIn(await ask(), 'connect');
    expect(connectLink).toBeDefined();
    const page = await fetch(connectLink!);
    expect(page.status).toBe(200);
    const html = await page.text();
    expect(html).toContain('<form');
    // Press Connect: the browser posts the page's form with its hidden field.
    const [, name, value] = /<input type="hidden" name="([^"]+)" value="([^"]*)">/.exec(html)!;
    const connected = await fetch(connectLink!, {
      method: 'POST',
      redirect: 'manual',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ [name!]: value! }).toString(),
    });
    expect(connected.status).toBeLessThan(400);
    expect((await f.wallet('newcomer'))!.connected).toBe(true);

    // 2. connected, nothing to pay with: a top-up link that leads to the developer's checkout
    const topupLink = linkIn(await ask(), 'topup');
    expect(topupLink).toBeDefined();
    const checkout = await fetch(topupLink!, { redirect: 'manual' });
    expect(checkout.status).toBe(303);
    const target = new URL(checkout.headers.get('location')!);
    expect(target.origin + target.pathname).toBe('https://shop.example.com/checkout');
    expect(Object.fromEntries(target.searchParams)).toMatchObject({
      user: 'newcomer',
      amount: '0.05',
      currency: 'usd',
    });

    // 3. the developer's checkout succeeded: it deposits through the API
    const deposited = await api(f.server, f.apiKey, 'POST', '/v1/user/balance/deposit', {
      user: 'newcomer',
      amount: '0.10',
    });
    expect(deposited.status).toBeLessThan(300);

    // 4. served, twice, then the balance is spent
    expect(await ask()).toBe(' hello'.repeat(5));
    expect(await ask()).toBe(' hello'.repeat(5));
    expect(linkIn(await ask(), 'topup')).toBeDefined();
    await f.settled();
    expect(await f.wallet('newcomer')).toMatchObject({ balance: '0', held: '0' });
    await f.ledger('newcomer');
  });
});
