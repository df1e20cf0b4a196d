import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromiumPresent, launchChromium } from '../helpers/browser.ts';
import { api, type SeededProject, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * Clicks through the hosted connect flow in a real headless Chromium (Debian's `chromium` package,
 * installed in CI by scripts/ci-system-packages.sh), with JavaScript disabled: the pages must work
 * without it.
 */
const hasChromium = chromiumPresent('hosted-pages-browser', ' (apt-get install -y chromium)');

let server: TestServer;
let project: SeededProject;
let browser: Browser;
let app: Server;
let appUrl: string;

beforeAll(async () => {
  if (!hasChromium) return;
  // The developer's app the connect page returns to.
  app = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
    res.end('<!doctype html><html lang="en"><title>Back in the app</title><h1>Back in the app</h1></html>');
  });
  await new Promise<void>((resolve) => app.listen(0, '127.0.0.1', resolve));
  appUrl = `http://127.0.0.1:${(app.address() as { port: number }).port}/welcome`;
  server = await startTestServer();
  project = await seedProject(server.ctx, { name: 'Acme Chat', settings: { returnUrl: appUrl } });
  browser = await launchChromium();
}, 60_000);

afterAll(async () => {
  await browser?.close();
  await server?.close();
  await new Promise((resolve) => (app ? app.close(resolve) : resolve(undefined)));
});

describe('hosted connect page in Chromium', () => {
  it.skipIf(!hasChromium)(
    'connects with the keyboard and the Connect button, returns to the app, and refuses the used link',
    async () => {
      const link = await api(server, project.apiKey, 'POST', '/v1/user/connect', { user: 'browser-user' });
      const context = await browser.newContext({ javaScriptEnabled: false });
      const page = await context.newPage();
      try {
        const response = await page.goto(link.body.url);
        expect(response?.status()).toBe(200);
        expect(await page.title()).toBe('Connect to Acme Chat');
        expect(await page.locator('html').getAttribute('lang')).toBe('en');
        expect(await page.getByRole('heading', { level: 1 }).textContent()).toBe('Connect to Acme Chat');
        expect(await page.getByText('Connecting allows Acme Chat to:').isVisible()).toBe(true);
        const button = page.getByRole('button', { name: 'Connect' });
        expect(await button.isVisible()).toBe(true);

        // The button is reachable with the keyboard and shows a focus ring.
        await page.keyboard.press('Tab');
        // (the callbacks run in the page; the test is not compiled with the DOM library)
        expect(await button.evaluate((el) => el === (globalThis as any).document.activeElement)).toBe(true);
        const outline = await button.evaluate((el) => (globalThis as any).getComputedStyle(el).outlineStyle);
        expect(outline).toBe('solid');

        // For a look by eye: the connect page as a user sees it.
        await page.screenshot({ path: join(tmpdir(), 'tollgate-connect-page.png'), fullPage: true });

        // Still not connected until the button is pressed.
        const before = await api(server, project.apiKey, 'GET', '/v1/user/balance?user=browser-user');
        expect(before.body.connected).toBe(false);

        await Promise.all([page.waitForURL(appUrl), button.click()]);
        expect(await page.getByRole('heading', { level: 1 }).textContent()).toBe('Back in the app');
        const after = await api(server, project.apiKey, 'GET', '/v1/user/balance?user=browser-user');
        expect(after.body.connected).toBe(true);

        const reused = await page.goto(link.body.url);
        expect(reused?.status()).toBe(410);
        expect(await page.getByRole('heading', { level: 1 }).textContent()).toBe(
          'This link was already used',
        );

        const forged = await page.goto(`${link.body.url.slice(0, -4)}AAAA`);
        expect(forged?.status()).toBe(400);
        expect(await page.getByRole('heading', { level: 1 }).textContent()).toBe('This link is not valid');
      } finally {
        await context.close();
      }
    },
  );
});
