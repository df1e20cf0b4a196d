import csrfProtection from '@fastify/csrf-protection';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import {
  admitSignUp,
  checkCredentials,
  createSession,
  emailSchema,
  newPasswordSchema,
  passwordSchema,
  SESSION_TTL_SECONDS,
  signUp,
} from '../../admin/accounts.ts';
import { ApiError } from '../../core/errors.ts';
import { routeModule } from '../../core/plugins.ts';
import { html } from '../../html/index.ts';
import {
  CSRF_COOKIE,
  csrfField,
  csrfOnPost,
  csrfToken,
  type ErrorCode,
  flashQuery,
  formBody,
  optionalField,
  page,
  SESSION_COOKIE,
} from '../pages.ts';

/**
 * Sign-up and sign-in (`/dashboard/signup`, `/dashboard/signin`): forms for visitors. Their CSRF secret
 * is a signed cookie (@fastify/csrf-protection with @fastify/cookie). Sign-up answers the same whether
 * or not the address had an account, then the developer signs in; both are limited per address
 * (../../admin/rate-limit.ts), sign-in also per e-mail and address, counted before the password check.
 */

const signUpForm = formBody({
  email: emailSchema,
  password: newPasswordSchema,
  invite: optionalField(z.string().trim().max(2000)),
});
/** The sign-up page's query: a flash message, and the code of an invite link (`tollgate invite create`). */
const signUpQuery = flashQuery.extend({ invite: z.string().max(2000).optional() });
const signInForm = formBody({ email: emailSchema, password: passwordSchema });

/** Sign-in failures shown on the form (by code); anything else is an error page. */
const FORM_ERRORS = new Set<string>([
  'invalid_credentials',
  'sign_in_rate_limited',
  'sign_up_rate_limited',
  'invite_required',
  'invalid_invite',
  'signup_closed',
]);

export default routeModule(async (app, ctx) => {
  await app.register(csrfProtection, {
    cookieKey: CSRF_COOKIE,
    cookieOpts: {
      path: '/dashboard',
      httpOnly: true,
      sameSite: 'strict',
      secure: 'auto',
      signed: true,
      maxAge: 12 * 3600,
    },
    getToken: csrfToken,
  });
  app.addHook('preValidation', csrfOnPost(app));

  function credentialsPage(request: FastifyRequest, reply: FastifyReply, kind: 'signup' | 'signin') {
    if (request.dashboard) return reply.redirect('/dashboard', 303);
    const signup = kind === 'signup';
    const closed = ctx.config.TOLLGATE_SIGNUP === 'closed';
    if (signup && closed) {
      // No form to fill in for nothing: an administrator creates accounts.
      return page(
        request,
        reply,
        'Sign up',
        () => html`<section class="card" style="max-width:28rem;margin:2rem auto">
<h1>Sign-up is closed</h1>
<p>Sign-up is closed on this server; an administrator creates accounts.</p>
<p class="muted">Already have an account? <a href="/dashboard/signin">Sign in</a>.</p>
</section>`,
      );
    }
    return page(
      request,
      reply,
      signup ? 'Sign up' : 'Sign in',
      ({ csrf, flash }) => html`<section class="card" style="max-width:28rem;margin:2rem auto">
<h1>${signup ? 'Create your Tollgate account' : 'Sign in to Tollgate'}</h1>
${flash}
<form method="post" action="/dashboard/${kind}">
${csrfField(csrf)}
<label for="email">E-mail</label>
<input id="email" name="email" type="email" autocomplete="email" required autofocus>
<label for="password">Password${signup ? ' (at least 10 characters, not a common one)' : ''}</label>
<input id="password" name="password" type="password" autocomplete="${signup ? 'new-password' : 'current-password'}" minlength="${signup ? 10 : 1}" required>
${signup && ctx.config.TOLLGATE_SIGNUP === 'invite' ? html`<label for="invite">Invite code</label><input id="invite" name="invite" value="${(request.query as { invite?: string }).invite ?? ''}" required>` : ''}
<button type="submit">${signup ? 'Sign up' : 'Sign in'}</button>
</form>
<p class="muted">${
        signup
          ? html`Already have an account? <a href="/dashboard/signin">Sign in</a>.`
          : closed
            ? ''
            : html`New here? <a href="/dashboard/signup">Create an account</a>.`
      }</p>
</section>`,
    );
  }

  /** Back to a form with a message chosen by code (a 429 keeps its Retry-After). */
  function backWith(reply: FastifyReply, path: string, err: unknown): FastifyReply {
    if (err instanceof ApiError && err.code && FORM_ERRORS.has(err.code)) {
      reply.headers(err.headers);
      return reply.redirect(`${path}?error=${err.code as ErrorCode}`, 303);
    }
    throw err;
  }

  app.get('/signup', { schema: { querystring: signUpQuery } }, async (request, reply) =>
    credentialsPage(request, reply, 'signup'),
  );
  app.get('/signin', { schema: { querystring: flashQuery } }, async (request, reply) =>
    credentialsPage(request, reply, 'signin'),
  );

  // The same answer whether or not the address had an account: sign in next.
  app.post('/signup', { schema: { body: signUpForm } }, async (request, reply) => {
    const { email, password, invite } = request.body;
    try {
      await app.accountLimits.signUp(request);
      admitSignUp(ctx.config.TOLLGATE_SIGNUP, ctx.sealer, { email, invite }, false);
    } catch (err) {
      return backWith(reply, '/dashboard/signup', err);
    }
    await signUp(ctx.db, { email, password });
    return reply.redirect('/dashboard/signin?done=signed_up', 303);
  });

  app.post('/signin', { schema: { body: signInForm } }, async (request, reply) => {
    const { email, password } = request.body;
    let developerId: string;
    try {
      // The attempt is counted before the password is checked.
      await app.accountLimits.signIn(request, email);
      developerId = (await checkCredentials(ctx.db, { email, password })).id;
    } catch (err) {
      return backWith(reply, '/dashboard/signin', err);
    }
    const created = await createSession(ctx.db, developerId);
    reply.setCookie(SESSION_COOKIE, created.token, {
      path: '/',
      httpOnly: true,
      sameSite: 'strict',
      secure: 'auto',
      maxAge: SESSION_TTL_SECONDS,
    });
    reply.clearCookie(CSRF_COOKIE, { path: '/dashboard' });
    return reply.redirect('/dashboard', 303);
  });
});
