import cookie from '@fastify/cookie';
import csrfProtection from '@fastify/csrf-protection';
import formbody from '@fastify/formbody';
import type { FastifyError, FastifyInstance, FastifyRequest } from 'fastify';
import { type Principal, resolveSession } from '../admin/accounts.ts';
import { ownProject } from '../admin/hooks.ts';
import { ApiError } from '../core/errors.ts';
import { registerAll } from '../core/plugins.ts';
import { toApiError } from '../core/request-errors.ts';
import { html, htmlHeaders } from '../html/index.ts';
import { csrfOnPost, csrfToken, page, SESSION_COOKIE } from './pages.ts';
import accountRoutes from './routes/accounts.ts';
import adminTokenRoutes from './routes/admin-tokens.ts';
import auditRoutes from './routes/audit.ts';
import paymentRoutes from './routes/payments.ts';
import pricingRoutes from './routes/pricing.ts';
import projectRoutes from './routes/project.ts';
import projectsRoutes from './routes/projects.ts';
import signOutRoutes from './routes/signout.ts';
import userRoutes from './routes/users.ts';
import webhookRoutes from './routes/webhooks.ts';

/**
 * The developer dashboard at `/dashboard`: server-rendered HTML forms over the admin service
 * (../admin/service.ts), so the dashboard and the admin API do the same things the same way. The
 * security pieces are fastify's own plugins:
 *
 * - @fastify/cookie: the session cookie `tollgate_session` (HttpOnly, SameSite=Strict, Secure over
 *   https — behind a proxy only when TOLLGATE_TRUSTED_PROXIES trusts its X-Forwarded-Proto) holds the
 *   session token; the token is itself the credential (only its hash is stored), so it is not signed.
 *   The anonymous CSRF secret cookie `tollgate_csrf` is signed (a key derived from the encryption key).
 * - @fastify/csrf-protection: every POST carries a `csrf` field. Signed in, the token is made from the
 *   session's CSRF secret (kept with the session, playing @fastify/session's part); on the sign-in and
 *   sign-up forms, from the signed cookie's. Cross-site posts (Sec-Fetch-Site, Origin) are refused too.
 * - @fastify/formbody: form bodies, then each route's zod schemas (`schema: { params, querystring, body }`)
 *   validate them as the API's do: nothing is written, and a refused form comes back on its page with a
 *   400, what was typed and each problem beside its field (./forms.ts); a bad path is a 400 page.
 * - @fastify/helmet: the security headers and the CSP (../html/index.ts).
 * - @fastify/rate-limit: the sign-in and sign-up limits shared with the admin API (../admin/rate-limit.ts).
 *
 * Routes: ./routes/, one module per page or resource. Forms have visible labels and work from the
 * keyboard; the only script is the copy button's.
 */

declare module 'fastify' {
  interface FastifyRequest {
    dashboard: { principal: Principal; email: string; csrf: string } | null;
    /** The signed-in developer, in the scope behind the sign-in hook (a visitor never gets there). */
    developer: Principal;
    /** The CSRF secret of the signed-in session, where @fastify/csrf-protection reads it. */
    session: { csrf?: string | undefined };
  }
}

const CSRF_FAILED = 'The form expired or did not come from this dashboard. Reload the page and try again.';

const forbidden = (message: string) =>
  new ApiError(403, 'permission_error', message, { code: 'csrf_check_failed' });

/** Refuses cross-site form posts (browsers say where a request comes from). */
function sameOrigin(request: FastifyRequest): void {
  if (request.headers['sec-fetch-site'] === 'cross-site')
    throw forbidden('Cross-site form posts are refused.');
  const origin = request.headers.origin;
  if (origin && origin !== 'null') {
    let host: string | undefined;
    try {
      host = new URL(origin).host;
    } catch {}
    if (host !== request.headers.host) throw forbidden('Form posts from another site are refused.');
  }
}

export async function dashboardRoutes(app: FastifyInstance): Promise<void> {
  const ctx = app.ctx;
  // every key of the ring: cookies signed with an older key stay valid through a rotation
  await app.register(cookie, { secret: ctx.sealer.signatures('tollgate/dashboard-cookies') });
  await app.register(formbody, { bodyLimit: 256 * 1024 });
  await app.register(htmlHeaders);

  app.decorateRequest('dashboard', null);
  app.decorateRequest('session', null as unknown as FastifyRequest['session']);
  app.addHook('onRequest', async (request) => {
    request.session = {};
    const token = request.cookies[SESSION_COOKIE];
    const principal = token?.startsWith('tgs_') ? await resolveSession(ctx.db, token) : undefined;
    if (principal) {
      // for the audit log: the address (TOLLGATE_TRUSTED_PROXIES honoured by fastify) and the way in
      principal.ip = request.ip;
      principal.via = 'dashboard';
    }
    request.dashboard =
      principal?.csrf && principal.email ? { principal, email: principal.email, csrf: principal.csrf } : null;
    request.session.csrf = request.dashboard?.csrf;
    if (request.method === 'POST') sameOrigin(request);
  });

  app.setErrorHandler((error: FastifyError, request, reply) => {
    const csrfFailed = error.code?.startsWith('FST_CSRF_');
    const apiError = csrfFailed ? forbidden(CSRF_FAILED) : toApiError(error);
    const status = apiError.status;
    if (status >= 500) request.log.error({ err: error, url: request.url }, 'dashboard page failed');
    const message = status >= 500 ? 'Something went wrong. Please try again in a moment.' : apiError.message;
    reply.headers(apiError.headers);
    return page(
      request,
      reply,
      'Problem',
      () =>
        html`<section class="card"><h1>${status === 404 ? 'Not found' : 'This did not work'}</h1><p class="error" role="alert">${message}</p><p><a href="/dashboard">Back to the dashboard</a></p></section>`,
      { status },
    );
  });

  // Sign-up and sign-in: forms for visitors, with their own CSRF secret in a signed cookie.
  await app.register(accountRoutes);

  // Everything else: a signed-in developer's pages.
  await app.register(async (scope) => {
    await scope.register(csrfProtection, {
      sessionPlugin: '@fastify/session',
      sessionKey: 'csrf',
      getToken: csrfToken,
    });
    scope.addHook('preValidation', csrfOnPost(scope));
    // Visitors are sent to the sign-in page; a developer's pages read them as `request.developer`.
    scope.decorateRequest('developer', null as unknown as Principal);
    scope.addHook('preHandler', async (request, reply) => {
      if (request.dashboard) request.developer = request.dashboard.principal;
      else if (!request.is404) return reply.redirect('/dashboard/signin', 303);
    });
    // Unknown pages (in this scope, so the page's sign-out form gets a CSRF token).
    scope.setNotFoundHandler((request, reply) =>
      page(
        request,
        reply,
        'Not found',
        () =>
          html`<section class="card"><h1>Not found</h1><p>There is no dashboard page at <code>${request.url.split('?')[0]}</code>.</p><p><a href="/dashboard">Back to the dashboard</a></p></section>`,
        { status: 404 },
      ),
    );
    await registerAll(scope, [signOutRoutes, projectsRoutes, adminTokenRoutes]);
    // A project's pages (`/projects/:id/…`): the project, once the developer owns it, is `request.ownedProject`.
    await scope.register(async (project) => {
      ownProject(project, { db: ctx.db, param: 'id', principal: (request) => request.developer });
      await registerAll(project, [
        projectRoutes,
        pricingRoutes,
        auditRoutes,
        paymentRoutes,
        userRoutes,
        webhookRoutes,
      ]);
    });
  });
}
