import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CLI_ACTOR } from '../../src/audit/index.ts';
import { connectPayments } from '../../src/payments/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { chromiumPresent, launchChromium } from '../helpers/browser.ts';
import { api, type SeededProject, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';
import { type StripeStandIn, startStripeStandIn } from '../helpers/stripe-stand-in.ts';

/**
 * A user pays a top-up in a real headless Chromium with JavaScript disabled: the top-up link's hosted
 * checkout page → the Stripe stand-in's checkout page → back to the "payment received" page → the
 * portal with the receipt. Screenshots go to the temporary directory, or to SCREENSHOT_DIR when set
 * (`SCREENSHOT_DIR=docs npx vitest run test/payments/payments-browser.test.ts` made the ones in docs/).
 */
const hasChromium = chromiumPresent('payments-browser');
const KEY = 'sk_test_standin_4242424242';
const shots = process.env.SCREENSHOT_DIR ?? tmpdir();

let stand: StripeStandIn;
let server: TestServer;
let project: SeededProject;
let browser: Browser;

beforeAll(async () => {
  if (!hasChromium) return;
  stand = await startStripeStandIn({ keys: [KEY] });
  server = await startTestServer({ STRIPE_API_URL: stand.url });
  project = await seedProject(server.ctx, { name: 'Acme Chat' });
  await connectPayments(
    server.ctx,
    project.projectId,
    {
      stripeKey: KEY,
      settings: { presets: ['5', '10', '20'], minimum: '2', maximum: '200' },
    },
    CLI_ACTOR,
  );
  browser = await launchChromium();
}, 60_000);

afterAll(async () => {
  await browser?.close();
  await server?.close();
  await stand?.close();
});

describe('paying a top-up in Chromium', () => {
  it.skipIf(!hasChromium)('top-up page → Stripe checkout → payment received → portal', async () => {
    const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
    const ref = { id: project.projectId, owner_user_id: '' };
    await connectUser(server.ctx.db, server.ctx.events, ref, 'browser-payer', trigger);
    const link = await api(server, project.apiKey, 'POST', '/v1/user/topup', {
      user: 'browser-payer',
      amount: '7.50',
    });
    const context = await browser.newContext({
      javaScriptEnabled: false,
      viewport: { width: 800, height: 900 },
    });
    const page = await context.newPage();
    try {
      expect((await page.goto(link.body.url))?.status()).toBe(200);
      expect(await page.getByRole('heading', { level: 1 }).textContent()).toBe(
        'Top up your Acme Chat balance',
      );
      expect(await page.getByLabel('10.00 USD').isChecked()).toBe(true);
      await page.screenshot({ path: join(shots, 'payments-topup-page.png'), fullPage: true });

      await page.getByLabel('20.00 USD').check();
      await Promise.all([
        page.waitForURL(`${stand.url}/c/pay/**`),
        page.getByRole('button', { name: 'Pay' }).click(),
      ]);
      expect(await page.getByRole('heading', { level: 1 }).textContent()).toBe('Pay 20.00 USD');

      await Promise.all([
        page.waitForURL(`${server.url}/payments/done/**`),
        page.getByRole('button', { name: 'Pay' }).click(),
      ]);
      expect(await page.getByRole('heading', { level: 1 }).textContent()).toBe(
        'Thank you — payment received',
      );
      expect(await page.getByText('20.00 USD was added').isVisible()).toBe(true);
      await page.screenshot({ path: join(shots, 'payments-done-page.png'), fullPage: true });

      await page.getByRole('link', { name: 'Your balance and receipts' }).click();
      expect(await page.getByRole('heading', { level: 1 }).textContent()).toBe('Your Acme Chat balance');
      expect(await page.getByRole('link', { name: 'Receipt' }).count()).toBe(1);
      await page.screenshot({ path: join(shots, 'payments-portal.png'), fullPage: true });

      const balance = await api(server, project.apiKey, 'GET', '/v1/user/balance?user=browser-payer');
      expect(balance.body).toMatchObject({ balance: '20.00', available: '20.00' });
    } finally {
      await context.close();
    }
  });
});
