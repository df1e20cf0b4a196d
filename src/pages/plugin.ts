import type { FastifyError, FastifyInstance } from 'fastify';
import { sendPage } from '../html/hosted-page.ts';
import { html } from '../html/index.ts';
import { connectPageRoutes } from './connect.ts';
import { portalPageRoutes } from './portal.ts';
import { testCheckoutRoutes } from './test-checkout.ts';
import { topupPageRoutes } from './topup.ts';

/**
 * The hosted end-user pages, behind the links a user is given (no API key; the signed token is the
 * credential): connect (./connect.ts), top-up, checkout and the provider's return (./topup.ts), the
 * portal (./portal.ts), and the test provider's checkout where test payments are on (./test-checkout.ts). A token is checked for shape (base64url, a dot, base64url, bounded length)
 * before anything else, so nothing malformed — NUL and control bytes included — reaches a lookup.
 * Small semantic HTML with inline CSS (../html/hosted-page.ts); no JavaScript. Every answer, redirects
 * included, carries `Referrer-Policy: no-referrer` and `Cache-Control: no-store`.
 */
export async function pageRoutes(app: FastifyInstance): Promise<void> {
  // The pages' buttons post plain HTML forms; only this plugin accepts form bodies.
  app.addContentTypeParser(
    'application/x-www-form-urlencoded',
    { parseAs: 'string', bodyLimit: 4096 },
    (_request, body, done) => {
      done(null, Object.fromEntries(new URLSearchParams(body as string)));
    },
  );

  app.setErrorHandler((error: FastifyError, request, reply) => {
    const status =
      error.statusCode && error.statusCode >= 400 && error.statusCode < 500 ? error.statusCode : 500;
    if (status >= 500) request.log.error({ err: error, url: request.url }, 'page failed');
    return sendPage(
      reply,
      status,
      status >= 500 ? 'Something went wrong' : 'This request cannot be handled',
      status >= 500
        ? html`<h1>Something went wrong</h1><p>Please try again in a moment.</p>`
        : html`<h1>This request cannot be handled</h1><p>Open the link exactly as you received it.</p>`,
    );
  });

  await app.register(connectPageRoutes);
  await app.register(topupPageRoutes);
  await app.register(portalPageRoutes);
  await app.register(testCheckoutRoutes);
}
