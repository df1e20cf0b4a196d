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
import { type FormSpec, formView, invalidBody, type Refused } from '../forms.ts';
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
 *
 * A form that does not validate comes back at once (400) with what was typed (never the password) and
 * each problem beside its field. The e-mail address carries over to the next form (signing in after
 * signing up, or after a refusal) in a short-lived signed cookie, never in a URL.
 */

const signUpForm = formBody({
  email: emailSchema,
  password: newPasswordSchema,
  invite: optionalField(z.string().trim().max(2000)),
});
/** The sign-up page's query: a flash message, and the code of an invite link (`tollgate invite create`). */
const signUpQuery = flashQuery.extend({ invite: z.string().max(2000).optional() });
const signInForm = formBody({ email: emailSchema, password: passwordSchema });

/** The signed cookie that carries the e-mail address to the next sign-in or sign-up form. */
const EMAIL_COOKIE = 'tollgate_email';

/** The sign-up and sign-in forms (the password never comes back). */
const credentialsForm = (kind: 'signup' | 'signin'): FormSpec => ({
  name: kind,
  fields: {
    email: { id: 'email', label: 'E-mail' },
    password: { id: 'password', label: 'Password', secret: true },
    invite: { id: 'invite', label: 'Invite code' },
  },
});

/** Sign-in failures shown on the form (by code); anything else is an error page. */
const FORM_ERRORS = new Set<string>([
  'invalid_credentials',
  'sign_in_rate_limited',
  'sign_up_rate_limited',
  'invite_required',
  'invalid_invite',
  'signup_closed',
]);

/** The e-mail address the previous form left in its cookie. */
function rememberedEmail(request: FastifyRequest): string | undefined {
  const cookie = request.cookies[EMAIL_COOKIE];
  const read = cookie ? request.unsignCookie(cookie) : undefined;
  return read?.valid ? (read.value ?? undefined) : undefined;
}
function rememberEmail(reply: FastifyReply, email: string) {
  reply.setCookie(EMAIL_COOKIE, email, {
    path: '/dashboard',
    httpOnly: true,
    sameSite: 'strict',
    secure: 'auto',
    signed: true,
    maxAge: 600,
  });
}

/** The sign-up or sign-in form (`mode`: TOLLGATE_SIGNUP), again with `form` after a problem. */
function credentialsPage(
  request: FastifyRequest,
  reply: FastifyReply,
  mode: string,
  kind: 'signup' | 'signin',
  refused?: Refused,
) {
  if (request.dashboard) return reply.redirect('/dashboard', 303);
  const email = rememberedEmail(request) ?? '';
  const invite = (request.query as { invite?: string }).invite ?? '';
  // the first field with a problem has the focus; else the first empty one
  const f = formView(credentialsForm(kind), refused, email ? 'password' : 'email');
  const signup = kind === 'signup';
  const closed = mode === 'closed';
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
${flash}${f.alert()}
<form method="post" action="/dashboard/${kind}">
${csrfField(csrf)}
<label for="email">E-mail</label>
<input id="email" name="email" type="email" autocomplete="email" required${f.input('email', email)}>
${f.error('email')}
<label for="password">Password${signup ? ' (at least 10 characters, not a common one)' : ''}</label>
<input id="password" name="password" type="password" autocomplete="${signup ? 'new-password' : 'current-password'}" minlength="${signup ? 10 : 1}" required${f.invalid('password')}>
${f.error('password')}
${signup && mode === 'invite' ? html`<label for="invite">Invite code</label><input id="invite" name="invite" required${f.input('invite', invite)}>${f.error('invite')}` : ''}
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
    { status: refused ? 400 : 200 },
  );
}

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

  /** Back to a form with a message chosen by code (a 429 keeps its Retry-After), the e-mail kept. */
  function backWith(reply: FastifyReply, path: string, err: unknown, email: string): FastifyReply {
    if (err instanceof ApiError && err.code && FORM_ERRORS.has(err.code)) {
      reply.headers(err.headers);
      rememberEmail(reply, email);
      return reply.redirect(`${path}?error=${err.code as ErrorCode}`, 303);
    }
    throw err;
  }

  app.get('/signup', { schema: { querystring: signUpQuery } }, async (request, reply) =>
    credentialsPage(request, reply, ctx.config.TOLLGATE_SIGNUP, 'signup'),
  );
  app.get('/signin', { schema: { querystring: flashQuery } }, async (request, reply) =>
    credentialsPage(request, reply, ctx.config.TOLLGATE_SIGNUP, 'signin'),
  );

  // The same answer whether or not the address had an account: sign in next.
  /** The form again, with what was typed and its problems (the body did not validate). */
  function formAgain(request: FastifyRequest, reply: FastifyReply, kind: 'signup' | 'signin') {
    const schema = kind === 'signup' ? signUpForm : signInForm;
    const refused = invalidBody(credentialsForm(kind), schema, request);
    return credentialsPage(request, reply, ctx.config.TOLLGATE_SIGNUP, kind, refused);
  }

  app.post('/signup', { schema: { body: signUpForm }, attachValidation: true }, async (request, reply) => {
    if (request.validationError) return formAgain(request, reply, 'signup');
    const { email, password, invite } = request.body;
    try {
      await app.accountLimits.signUp(request);
      admitSignUp(ctx.config.TOLLGATE_SIGNUP, ctx.sealer, { email, invite }, false);
    } catch (err) {
      return backWith(reply, '/dashboard/signup', err, email);
    }
    await signUp(ctx.db, { email, password });
    rememberEmail(reply, email);
    return reply.redirect('/dashboard/signin?done=signed_up', 303);
  });

  app.post('/signin', { schema: { body: signInForm }, attachValidation: true }, async (request, reply) => {
    if (request.validationError) return formAgain(request, reply, 'signin');
    const { email, password } = request.body;
    let developerId: string;
    try {
      // The attempt is counted before the password is checked.
      await app.accountLimits.signIn(request, email);
      developerId = (await checkCredentials(ctx.db, { email, password })).id;
    } catch (err) {
      return backWith(reply, '/dashboard/signin', err, email);
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
    reply.clearCookie(EMAIL_COOKIE, { path: '/dashboard' });
    return reply.redirect('/dashboard', 303);
  });
});
