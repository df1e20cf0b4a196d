import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CLI_ACTOR } from '../../src/audit/index.ts';
import { applyPricing } from '../../src/models/service.ts';
import { connectPayments } from '../../src/payments/service.ts';
import { chromiumPresent, launchChromium } from '../helpers/browser.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';
import {
  api,
  connectTo,
  depositFor,
  seedProject,
  signUpAndIn,
  startTestServer,
  type TestServer,
} from '../helpers/server.ts';
import { type StripeStandIn, startStripeStandIn } from '../helpers/stripe-stand-in.ts';

/**
 * Every dashboard page and every hosted end-user page in a real headless Chromium, at a phone's width
 * (390 px) and a laptop's (1280 px), filled with awkward data (long model names, long user ids, long
 * webhook URLs, amounts with 6 decimals, JSON in the audit log): the page never scrolls sideways
 * (`scrollWidth <= clientWidth`), nothing sticks out of the right edge of its card (a table that scrolls
 * inside its card may), and no chart label is cut off at the edge of its chart.
 *
 * The measured widths go to tollgate-page-widths.json in the temporary directory. With SCREENSHOTS=1 the main pages at
 * 390 px are written to docs/phone-*.png (the dashboard docs show them).
 */
const hasChromium = chromiumPresent('pages-fit-a-phone-browser');
const ROOT = join(import.meta.dirname, '..', '..');
const SCREENSHOTS = process.env.SCREENSHOTS === '1';
const KEY = 'sk_test_standin_4242424242';
const LONG_USER = 'user-0123456789-abcdefghijklmnopqrstuvwxyz@example.com';
const LONG_MODEL = 'demo-per-token-with-a-rather-long-model-name';
const WIDTHS = [1280, 390] as const;

interface Measure {
  page: string;
  width: number;
  scrollWidth: number;
  clientWidth: number;
  /** Elements whose right edge is past their card's (outside any scrolling box inside the card). */
  outside: string[];
  /** Chart labels cut off by the edge of their chart. */
  clipped: string[];
}

let stand: StripeStandIn;
let mock: MockUpstream;
let server: TestServer;
let browser: Browser;
let session: string;
let projectId: string;
let apiKey: string;
const measures: Measure[] = [];

/** Runs in the page: the document's widths, what sticks out of a card, the chart labels cut off. */
function measureInPage(): Omit<Measure, 'page' | 'width'> {
  const g = globalThis as any;
  const doc = g.document;
  const name = (el: any) =>
    `${el.tagName.toLowerCase()}${el.id ? `#${el.id}` : ''}${el.className && typeof el.className === 'string' ? `.${el.className.split(' ').join('.')}` : ''} “${(el.textContent ?? '').trim().slice(0, 40)}”`;
  const scrolls = (el: any) =>
    ['auto', 'scroll', 'hidden', 'clip'].includes(g.getComputedStyle(el).overflowX);
  const outside: string[] = [];
  for (const card of doc.querySelectorAll('section.card, body > main')) {
    const right = card.getBoundingClientRect().right;
    for (const el of card.querySelectorAll('*')) {
      const r = el.getBoundingClientRect();
      if (r.width === 0 || r.right <= right + 1) continue;
      let inner = el.parentElement;
      let boxed = false;
      while (inner && inner !== card) {
        if (scrolls(inner)) boxed = true;
        inner = inner.parentElement;
      }
      if (!boxed) outside.push(name(el));
    }
  }
  const clipped: string[] = [];
  for (const svg of doc.querySelectorAll('svg')) {
    const box = svg.getBoundingClientRect();
    for (const text of svg.querySelectorAll('text')) {
      const r = text.getBoundingClientRect();
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1)
        clipped.push(`${svg.closest('figure')?.id}: “${text.textContent}”`);
    }
  }
  return {
    scrollWidth: doc.documentElement.scrollWidth,
    clientWidth: doc.documentElement.clientWidth,
    outside: outside.slice(0, 10),
    clipped,
  };
}

/** A screenshot of the docs: the name, and the part of the page to show (scrolled to the top). */
type Shot = { name: string; at?: string };

/**
 * Measures the page at each width (ending at 390 px); with SCREENSHOTS=1, one phone screen of it
 * (390 × 844, from `at` when given) to docs/phone-<name>.png.
 */
async function measure(page: Page, name: string, shot?: Shot): Promise<void> {
  for (const width of WIDTHS) {
    await page.setViewportSize({ width, height: 844 });
    const m = { page: name, width, ...(await page.evaluate(measureInPage)) };
    measures.push(m);
    expect.soft(m.scrollWidth, `${name} at ${width} px scrolls sideways`).toBeLessThanOrEqual(m.clientWidth);
    expect.soft(m.outside, `${name} at ${width} px: outside their card`).toEqual([]);
    expect.soft(m.clipped, `${name} at ${width} px: chart labels cut off`).toEqual([]);
  }
  if (!SCREENSHOTS || !shot) return;
  if (shot.at)
    await page
      .locator(shot.at)
      .first()
      .evaluate((el) => el.scrollIntoView());
  await page.screenshot({ path: join(ROOT, 'docs', `phone-${shot.name}.png`) });
}

async function visit(page: Page, path: string, name: string, shot?: Shot): Promise<void> {
  const response = await page.goto(`${server.url}${path}`);
  expect(response?.status(), path).toBeLessThan(500);
  await measure(page, name, shot);
}

async function developerContext(): Promise<BrowserContext> {
  const context = await browser.newContext({ viewport: { width: 390, height: 900 } });
  await context.addCookies([{ name: 'tollgate_session', value: session, url: server.url }]);
  return context;
}

/** A project with prices, users, metered charges, a credit grant, a webhook, Stripe and an admin token. */
async function seed(): Promise<void> {
  session = await signUpAndIn(server, { email: 'phone-dev@example.com', password: 'a long enough password' });
  const created = await api(server, session, 'POST', '/admin/v1/projects', { name: 'Acme Chat for Phones' });
  projectId = created.body.project.id;
  apiKey = created.body.apiKey.key;
  const admin = (method: string, path: string, body?: unknown) =>
    api(server, session, method, `/admin/v1/projects/${projectId}${path}`, body);
  expect((await admin('PUT', '/provider', { baseUrl: mock.baseUrl, apiKey: 'sk-mock' })).status).toBe(200);
  await applyPricing(server.ctx.db, projectId, {
    currency: 'usd',
    models: [
      {
        id: 'demo-per-request',
        upstreamModel: 'mock-model',
        pricing: { mode: 'per_request', perRequest: '0.01' },
      },
      {
        id: LONG_MODEL,
        upstreamModel: 'mock-model',
        pricing: { mode: 'per_token', inputPerMillion: '0.15', outputPerMillion: '0.6', holdMargin: '1.1' },
      },
    ],
  });
  await server.ctx.projects.changed(projectId);
  const project = { id: projectId, owner_user_id: '' };
  for (const user of ['alice', LONG_USER]) {
    await connectTo(server, { projectId }, user);
    await depositFor(server.ctx, project as never, user, '10.00');
  }
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey, maxRetries: 0 });
  for (const [model, user] of [
    [LONG_MODEL, 'alice'],
    ['demo-per-request', LONG_USER],
    [LONG_MODEL, LONG_USER],
  ] as const)
    await client.chat.completions.create({
      model,
      user,
      messages: [{ role: 'user', content: 'hello there' }],
    });
  await admin('POST', `/users/${encodeURIComponent(LONG_USER)}/credits`, {
    amount: '1.50',
    reason: 'welcome-trial',
  });
  await admin('POST', '/webhooks/subscriptions', {
    url: 'https://hooks.example.com/a/rather/long/path/to/the/tollgate/receiver?token=0123456789abcdef',
    events: ['balance.*', 'user.*', 'payment.*'],
  });
  await api(server, session, 'POST', '/admin/v1/admin-tokens', { name: 'continuous-integration' });
  await connectPayments(
    server.ctx,
    projectId,
    { stripeKey: KEY, settings: { presets: ['5', '10', '20'], minimum: '2', maximum: '200' } },
    CLI_ACTOR,
  );
  await admin('PATCH', '/payments', { autoRecharge: { offered: true } });
}

beforeAll(async () => {
  if (!hasChromium) return;
  stand = await startStripeStandIn({ keys: [KEY] });
  mock = await startMockUpstream();
  server = await startTestServer({ STRIPE_API_URL: stand.url, TOLLGATE_TEST_PAYMENTS: 'true' });
  browser = await launchChromium();
  await seed();
}, 120_000);

afterAll(async () => {
  if (measures.length)
    writeFileSync(join(tmpdir(), 'tollgate-page-widths.json'), JSON.stringify(measures, null, 1));
  await browser?.close();
  await server?.close();
  await mock?.close();
  await stand?.close();
});

describe('every page fits a 390 px phone and a 1280 px screen', () => {
  it.skipIf(!hasChromium)('the sign-up and sign-in pages, and the home page', async () => {
    const context = await browser.newContext({ viewport: { width: 390, height: 900 } });
    const page = await context.newPage();
    try {
      await visit(page, '/', 'home');
      await visit(page, '/dashboard/signup', 'sign-up');
      // A common password: the form comes back with the address kept and the problem beside the field.
      const email = 'someone-with-a-rather-long-address@example.com';
      await page.getByLabel('E-mail').fill(email);
      await page.getByLabel(/^Password/).fill('password123');
      await page.getByRole('button', { name: 'Sign up' }).click();
      await page.locator('#password-error').waitFor();
      expect(new URL(page.url()).pathname).toBe('/dashboard/signup');
      expect(await page.getByLabel('E-mail').inputValue()).toBe(email);
      const password = page.getByLabel(/^Password/);
      expect(await password.getAttribute('aria-invalid')).toBe('true');
      expect(await password.getAttribute('aria-describedby')).toBe('password-error');
      expect(await password.evaluate((el) => el === (globalThis as any).document.activeElement)).toBe(true);
      expect(await page.locator('#password-error').textContent()).toBe(
        'Password is one of the most common passwords; choose another.',
      );
      await measure(page, 'sign-up (common password)', { name: 'signup-error' });
      // Then signed up: the sign-in form has the address already, the password has the focus.
      await password.fill('a long enough password');
      await Promise.all([
        page.waitForURL('**/dashboard/signin?done=signed_up'),
        page.getByRole('button', { name: 'Sign up' }).click(),
      ]);
      expect(await page.getByLabel('E-mail').inputValue()).toBe(email);
      expect(
        await page
          .getByLabel(/^Password/)
          .evaluate((el) => el === (globalThis as any).document.activeElement),
      ).toBe(true);
      await measure(page, 'sign-in (after sign-up)');
    } finally {
      await context.close();
    }
  });

  it.skipIf(!hasChromium)('every page of the dashboard', async () => {
    const context = await developerContext();
    const page = await context.newPage();
    const base = `/dashboard/projects/${projectId}`;
    try {
      await visit(page, '/dashboard', 'projects');
      await visit(page, '/dashboard/start', 'new project');
      await visit(page, base, 'overview', { name: 'overview' });
      // Amounts at the currency's precision, the exact value on hover and in the CSV.
      const rounded = await page.locator('#reconciliation span[title]').all();
      expect(rounded.length).toBeGreaterThan(0);
      const csv = await (await page.request.get(`${server.url}${base}/reconciliation.csv`)).text();
      for (const span of rounded) {
        expect(await span.textContent()).toMatch(/^-?<?\d+\.\d{2}$/);
        const exact = (await span.getAttribute('title'))!;
        expect(exact).toMatch(/^-?\d+\.\d{3,}$/);
        expect(csv).toContain(exact);
      }
      // Today's bar has its date; model names are written in full.
      const today = new Date().toISOString().slice(5, 10);
      expect(await page.locator('#chart-revenue-day g').last().locator('text').allTextContents()).toContain(
        today,
      );
      expect(await page.locator('#chart-requests-model text').allTextContents()).toContain(LONG_MODEL);

      await visit(page, `${base}/pricing`, 'pricing', { name: 'pricing' });
      // The price form shows the chosen pricing's fields only.
      const visible = (label: string) => page.getByLabel(label, { exact: true }).isVisible();
      expect([await visible('Price per request'), await visible('Input per 1M tokens')]).toEqual([
        true,
        false,
      ]);
      await page.getByLabel('Pricing', { exact: true }).selectOption('per_token');
      expect([await visible('Price per request'), await visible('Input per 1M tokens')]).toEqual([
        false,
        true,
      ]);
      expect(await visible('Subscription fee')).toBe(false);
      await visit(page, `${base}/users`, 'users');
      await visit(page, `${base}/users/${encodeURIComponent(LONG_USER)}`, 'user', {
        name: 'user',
        at: '#activity',
      });
      await visit(page, `${base}/webhooks`, 'webhooks');
      await visit(page, `${base}/payments`, 'payments');
      // The auto-recharge checkbox sits on its label's line.
      const box = (await page.getByLabel('Offer automatic recharge').boundingBox())!;
      const label = (await page.locator('label.check').boundingBox())!;
      expect(Math.abs(box.y + box.height / 2 - (label.y + label.height / 2))).toBeLessThan(3);
      await visit(page, `${base}/audit`, 'audit log', { name: 'audit', at: '#audit' });
      // Nothing before a creation: said in words, no empty box.
      expect(
        await page.locator('#audit td[data-label="Before"]', { hasText: '(none)' }).count(),
      ).toBeGreaterThan(0);
      expect(await page.locator('#audit pre:empty').count()).toBe(0);
      await visit(page, '/dashboard/no-such-page', 'not found');
      // A refused deposit comes back in place: the values kept, the problem beside the field, the focus on it.
      await page.setViewportSize({ width: 390, height: 844 });
      await page.goto(`${server.url}${base}/users`);
      await page.getByLabel('User id').fill(LONG_USER);
      await page.getByLabel(/^Amount/).fill('lots');
      await page.getByRole('button', { name: 'Deposit' }).click();
      await page.locator('#depositAmount-error').waitFor();
      expect(new URL(page.url()).pathname).toBe(`${base}/users/deposit`);
      expect(await page.getByRole('heading', { name: 'This did not work' }).count()).toBe(0);
      expect(await page.getByLabel('User id').inputValue()).toBe(LONG_USER);
      const amount = page.getByLabel(/^Amount/);
      expect(await amount.inputValue()).toBe('lots');
      expect(await amount.getAttribute('aria-invalid')).toBe('true');
      expect(await amount.getAttribute('aria-describedby')).toBe('depositAmount-error');
      expect(await amount.evaluate((el) => el === (globalThis as any).document.activeElement)).toBe(true);
      expect(await page.locator('#depositAmount-error').textContent()).toMatch(/^Amount must be /);
      const sideways = await page.evaluate(() => {
        const root = (globalThis as any).document.documentElement;
        return root.scrollWidth - root.clientWidth;
      });
      expect(sideways).toBeLessThanOrEqual(0);
      await measure(page, 'a refused deposit', { name: 'deposit-error', at: '#depositAmount' });
      // Corrected, it goes through with the token of the page shown again.
      await amount.fill('2.50');
      await Promise.all([
        page.waitForURL(`**/users/${encodeURIComponent(LONG_USER)}?done=deposited`),
        page.getByRole('button', { name: 'Deposit' }).click(),
      ]);
      await page.goto(`${server.url}${base}`);
      await page.getByRole('button', { name: 'Create an API key' }).click();
      await page.getByRole('heading', { name: 'New API key' }).waitFor();
      await measure(page, 'new API key');
      await page.goto(`${server.url}/dashboard`);
      await page.getByRole('button', { name: 'Create an admin token' }).click();
      await page.getByRole('heading', { name: 'Admin token created' }).waitFor();
      await measure(page, 'new admin token');
      await page.goto(`${server.url}${base}/webhooks`);
      await page
        .getByLabel('Endpoint URL')
        .fill('https://example.com/hooks/tollgate-receiver-with-a-long-name');
      await page.getByRole('button', { name: 'Add the subscription' }).click();
      await page.getByRole('heading', { name: 'Subscription added' }).waitFor();
      await measure(page, 'webhook secret');
    } finally {
      await context.close();
    }
  });

  it.skipIf(!hasChromium)(
    'every hosted page: connect, top-up, checkout done, portal, a bad link',
    async () => {
      const context = await browser.newContext({
        javaScriptEnabled: false,
        viewport: { width: 390, height: 900 },
      });
      const page = await context.newPage();
      const link = async (path: string, body: unknown) => {
        const url = new URL((await api(server, apiKey, 'POST', path, body)).body.url);
        return url.pathname + url.search;
      };
      try {
        await visit(page, await link('/v1/user/connect', { user: 'bob', keyName: 'laptop' }), 'connect');
        await page.getByRole('button', { name: 'Connect' }).click();
        await page.getByRole('heading', { name: 'You are connected' }).waitFor();
        await measure(page, 'connected, with a key');
        await visit(page, await link('/v1/user/topup', { user: LONG_USER, amount: '7.50' }), 'top-up', {
          name: 'topup',
        });
        await Promise.all([
          page.waitForURL(`${stand.url}/c/pay/**`),
          page.getByRole('button', { name: 'Pay' }).click(),
        ]);
        await Promise.all([
          page.waitForURL(`${server.url}/payments/done/**`),
          page.getByRole('button', { name: 'Pay' }).click(),
        ]);
        await measure(page, 'payment received');
        await visit(page, await link('/v1/user/portal', { user: LONG_USER }), 'portal', { name: 'portal' });
        await visit(page, '/topup/bm90LWEtdG9rZW4.AAAAAAAAAAAAAAAAAAAAAA', 'a link not valid');
        const unpaid = await seedProject(server.ctx, { name: 'A project without online top-ups yet' });
        const topup = await api(server, unpaid.apiKey, 'POST', '/v1/user/topup', {
          user: LONG_USER,
          amount: '5.00',
        });
        await visit(page, new URL(topup.body.url).pathname, 'top-up, no payments connected');
      } finally {
        await context.close();
      }
    },
  );

  it.skipIf(!hasChromium)(
    'the test payments pages: top-up, the test checkout, its authentication step, a declined card',
    async () => {
      const context = await browser.newContext({
        javaScriptEnabled: false,
        viewport: { width: 390, height: 900 },
      });
      const page = await context.newPage();
      const testing = await seedProject(server.ctx, { name: 'A project paid with test payments' });
      await connectPayments(server.ctx, testing.projectId, { provider: 'test' }, CLI_ACTOR);
      await connectTo(server, testing, LONG_USER);
      try {
        const topup = await api(server, testing.apiKey, 'POST', '/v1/user/topup', {
          user: LONG_USER,
          amount: '7.50',
        });
        await visit(page, new URL(topup.body.url).pathname, 'top-up, test payments');
        await Promise.all([
          page.waitForURL(`${server.url}/payments/test/checkout/**`),
          page.getByRole('button', { name: 'Pay' }).click(),
        ]);
        await measure(page, 'test checkout');
        await page.getByLabel(/0002/).check();
        await page.getByRole('button', { name: /^Pay/ }).click();
        await page.getByRole('alert').waitFor();
        await measure(page, 'test checkout, declined');
        await page.getByLabel(/3184/).check();
        await page.getByRole('button', { name: /^Pay/ }).click();
        await page.getByRole('heading', { name: 'Authenticate this payment' }).waitFor();
        await measure(page, 'test checkout, authentication');
        await Promise.all([
          page.waitForURL(`${server.url}/payments/done/**`),
          page.getByRole('button', { name: 'Complete authentication' }).click(),
        ]);
        expect(await page.getByRole('heading').first().textContent()).toContain('payment received');
      } finally {
        await context.close();
      }
    },
  );
});
