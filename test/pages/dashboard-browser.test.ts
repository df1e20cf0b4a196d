import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import type { Browser, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromiumPresent, launchChromium } from '../helpers/browser.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';
import { startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * The dashboard in a real headless Chromium (Debian's `chromium`): a new developer signs up, connects a
 * provider (a mock OpenAI-compatible provider on loopback), copies the API key with the Copy button,
 * uses it with the `openai` client, sets a price, funds a user, and sees the charge in the user's
 * activity and in the revenue chart. Screenshots go to test-artifacts/ (the README's are copies).
 */
const hasChromium = chromiumPresent('dashboard-browser');
const ARTIFACTS = join(import.meta.dirname, '..', '..', 'test-artifacts');

let server: TestServer;
let mock: MockUpstream;
let browser: Browser;

beforeAll(async () => {
  if (!hasChromium) return;
  mkdirSync(ARTIFACTS, { recursive: true });
  mock = await startMockUpstream();
  server = await startTestServer();
  browser = await launchChromium();
}, 60_000);

afterAll(async () => {
  await browser?.close();
  await server?.close();
  await mock?.close();
});

const shot = (page: Page, name: string) =>
  page.screenshot({ path: join(ARTIFACTS, `dashboard-${name}.png`), fullPage: true });

describe('dashboard in Chromium', () => {
  it.skipIf(!hasChromium)(
    'signs up, connects a provider, copies the key, prices a model, funds a user and sees the charge',
    async () => {
      const context = await browser.newContext({ viewport: { width: 1200, height: 900 } });
      await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: server.url });
      const page = await context.newPage();
      try {
        // Sign up, from the keyboard.
        await page.goto(`${server.url}/dashboard`);
        expect(new URL(page.url()).pathname).toBe('/dashboard/signin');
        await page.getByRole('link', { name: 'Create an account' }).click();
        await page.getByLabel('E-mail').fill('new-dev@example.com');
        await page.getByLabel(/^Password/).fill('a long enough password');
        await shot(page, 'signup');
        // Sign-up answers alike for new and taken addresses; then sign in.
        await Promise.all([
          page.waitForURL('**/dashboard/signin?done=signed_up'),
          page.keyboard.press('Enter'),
        ]);
        await page.getByText('If this address had no account').waitFor();
        await page.getByLabel('E-mail').fill('new-dev@example.com');
        await page.getByLabel(/^Password/).fill('a long enough password');
        await Promise.all([page.waitForURL('**/dashboard/start'), page.keyboard.press('Enter')]);

        // First run: paste the provider's key.
        expect(await page.getByRole('heading', { level: 1 }).textContent()).toBe(
          'Connect your model provider',
        );
        // (the page's second form starts on the echo provider: it has a project name too)
        await page.locator('form[action="/dashboard/start"]').getByLabel('Project name').fill('Browser app');
        await page.getByLabel(/Provider base URL/).fill(mock.baseUrl);
        await page.getByLabel('Provider API key').fill('sk-mock-provider-key');
        await shot(page, 'connect');
        await page.getByRole('button', { name: 'Connect and create the API key' }).click();
        await page.getByRole('heading', { name: 'Browser app is connected' }).waitFor();

        // The key appears once, with a copy button and ready snippets.
        const shown = (await page.locator('#api-key').textContent())!;
        expect(shown).toMatch(/^tg_/);
        expect(await page.locator('#snippet-curl').textContent()).toContain(shown);
        expect(await page.locator('#snippet-js').textContent()).toContain("import OpenAI from 'openai'");
        expect(await page.locator('#snippet-py').textContent()).toContain('from openai import OpenAI');
        await shot(page, 'api-key');
        await page.getByRole('button', { name: 'Copy' }).click();
        await page.getByRole('button', { name: 'Copied' }).waitFor();
        const copied = await page.evaluate(() => (globalThis as any).navigator.clipboard.readText());
        expect(copied).toBe(shown);

        // The copied key works with the openai client.
        const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: copied, maxRetries: 0 });
        expect((await client.models.list()).data).toEqual([]);

        // Set a price.
        await page.getByRole('link', { name: 'Set a price' }).click();
        await page.getByLabel('Model (what clients send)').fill('chat');
        await page.getByLabel('Provider model (optional)').fill('mock-model');
        await page.getByLabel('Pricing', { exact: true }).selectOption('per_request');
        await page.getByLabel('Per request').fill('0.25');
        await page.getByRole('button', { name: 'Save the price' }).click();
        await page.getByText('Price saved.').waitFor();
        expect(await page.getByRole('cell', { name: '0.25 per request' }).isVisible()).toBe(true);
        await shot(page, 'pricing');

        // An unconnected user gets the connect link from chat.
        const refused = await client.chat.completions.create({
          model: 'chat',
          user: 'browser-user',
          messages: [{ role: 'user', content: 'hi' }],
        });
        expect(refused.choices[0]!.message.content).toMatch(/\/connect\//);

        // Fund the user and connect them.
        await page.getByRole('navigation', { name: 'Project' }).getByRole('link', { name: 'Users' }).click();
        await page.getByLabel('User id').fill('browser-user');
        await page.getByLabel(/^Amount/).fill('5.00');
        await page.getByRole('button', { name: 'Deposit' }).click();
        await page.getByText('Deposited.', { exact: true }).waitFor();
        expect(await page.locator('#balance').textContent()).toBe('5.00');
        await page.getByRole('button', { name: 'Connect this user' }).click();
        await page.getByText('Connected.', { exact: true }).waitFor();

        // A paid chat.
        const reply = await client.chat.completions.create({
          model: 'chat',
          user: 'browser-user',
          messages: [{ role: 'user', content: 'hello there' }],
        });
        expect(reply.choices[0]!.message.content).toContain('hello');

        // The charge in the user's activity (settlement follows the response closely).
        let balance = '';
        for (let i = 0; i < 30 && balance !== '4.75'; i++) {
          await page.reload();
          balance = (await page.locator('#balance').textContent()) ?? '';
          if (balance !== '4.75') await new Promise((r) => setTimeout(r, 150));
        }
        expect(balance).toBe('4.75');
        const charge = page.locator('#activity tbody tr', { hasText: 'charge' });
        expect(await charge.count()).toBe(1);
        expect(await charge.locator('td').nth(2).textContent()).toBe('-0.25');
        expect(await charge.textContent()).toContain('chat');
        await shot(page, 'user');

        // And in the charts.
        await page
          .getByRole('navigation', { name: 'Project' })
          .getByRole('link', { name: 'Overview' })
          .click();
        const revenueBar = page.locator('#chart-revenue-model g[data-label="chat"]');
        expect(await revenueBar.getAttribute('data-value')).toBe('0.25');
        expect(
          await page.locator('#chart-requests-model g[data-label="chat"]').getAttribute('data-value'),
        ).toBe('1');
        expect(await page.locator('#chart-revenue-model svg').getAttribute('aria-label')).toContain(
          'chat: 0.25',
        );
        await shot(page, 'overview');

        // Sign out.
        await page.getByRole('button', { name: 'Sign out' }).click();
        await page.waitForURL('**/dashboard/signin?**');
        await page.goto(`${server.url}/dashboard`);
        expect(new URL(page.url()).pathname).toBe('/dashboard/signin');
      } finally {
        await context.close();
      }
    },
    120_000,
  );
});
