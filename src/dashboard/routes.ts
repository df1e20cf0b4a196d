import { randomUUID } from 'node:crypto';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { stringify as toYaml } from 'yaml';
import { z } from 'zod';
import {
  checkCredentials,
  createAdminToken,
  createSession,
  credentialsSchema,
  endSession,
  listAdminTokens,
  type Principal,
  resolveSession,
  revokeAdminToken,
  SESSION_TTL_SECONDS,
  signUp,
} from '../admin/accounts.ts';
import { SignInLimiter } from '../admin/rate-limit.ts';
import {
  applyModels,
  checkProvider,
  connectProvider,
  createApiKey,
  createOwnedProject,
  deleteModel,
  listApiKeys,
  listModels,
  listProjects,
  moveMoney,
  ownedProject,
  type ProjectView,
  projectView,
  providerBody,
  putModel,
  revokeApiKey,
  searchUsers,
  setUserConnected,
  updateOwnedProject,
  usageReport,
} from '../admin/service.ts';
import { safeEqual } from '../core/crypto.ts';
import { ApiError } from '../core/errors.ts';
import { randomToken } from '../core/ids.ts';
import { amountSchema } from '../core/money.ts';
import { parseInput } from '../core/validation.ts';
import { modelSpecSchema, type Pricing } from '../models/pricing.ts';
import { parsePricingFile } from '../models/service.ts';
import { projectSettingsSchema } from '../projects/service.ts';
import { userIdSchema } from '../users/routes.ts';
import { getBalance, listActivity } from '../users/service.ts';
import { listDeliveryLogs, retryDelivery } from '../webhooks/logs.ts';
import { createSubscription, listSubscriptions, setSubscriptionActive } from '../webhooks/subscriptions.ts';
import { barChart, lastDays } from './charts.ts';
import { html, layout, type Raw, raw, sendHtml } from './html.ts';
import { paymentDashboardRoutes } from './payments.ts';

/**
 * The developer dashboard at `/dashboard`: server-rendered HTML forms over the admin service
 * (../admin/service.ts), so the dashboard and the admin API do the same things the same way.
 *
 * - Sessions: an HttpOnly, SameSite=Strict cookie (Secure when the request came over https, also behind
 *   a proxy that says so in X-Forwarded-Proto) holding a session token; sign-out deletes the session.
 * - CSRF: every POST carries a `csrf` field: the session's CSRF token when signed in, else the value of a
 *   separate `tollgate_csrf` cookie (double submit) for the sign-in and sign-up forms. A cross-site POST
 *   (Sec-Fetch-Site: cross-site, or an Origin of another host) is refused as well.
 * - Sign-in is rate limited per e-mail and per address (the admin API's limiter).
 * - Forms have visible labels and work from the keyboard; the only script is the copy button's.
 */

const SESSION_COOKIE = 'tollgate_session';
const CSRF_COOKIE = 'tollgate_csrf';

declare module 'fastify' {
  interface FastifyRequest {
    dashboard: { principal: Principal; email: string; csrf: string } | null;
  }
}

type Form = Record<string, string | undefined>;

function cookiesOf(request: FastifyRequest): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of (request.headers.cookie ?? '').split(';')) {
    const i = part.indexOf('=');
    if (i > 0) {
      try {
        out[part.slice(0, i).trim()] = decodeURIComponent(part.slice(i + 1).trim());
      } catch {}
    }
  }
  return out;
}

function cookie(request: FastifyRequest, name: string, value: string, maxAgeSeconds: number): string {
  const secure = request.protocol === 'https' ? '; Secure' : '';
  return `${name}=${encodeURIComponent(value)}; Path=/; HttpOnly; SameSite=Strict; Max-Age=${maxAgeSeconds}${secure}`;
}

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

const flashSchema = z.object({ done: z.string().max(300).optional(), error: z.string().max(500).optional() });

function flash(request: FastifyRequest): Raw {
  const q = flashSchema.safeParse(request.query);
  if (!q.success) return html``;
  return html`${q.data.done ? html`<p class="notice" role="status">${q.data.done}</p>` : ''}${
    q.data.error ? html`<p class="error" role="alert">${q.data.error}</p>` : ''
  }`;
}

function back(path: string, key: 'done' | 'error', message: string): string {
  return `${path}${path.includes('?') ? '&' : '?'}${key}=${encodeURIComponent(message)}`;
}

const csrfField = (csrf: string) => html`<input type="hidden" name="csrf" value="${csrf}">`;

function projectNav(project: { id: string; name: string }, current: string): Raw {
  const base = `/dashboard/projects/${encodeURIComponent(project.id)}`;
  const items: Array<[string, string]> = [
    ['Overview', base],
    ['Pricing', `${base}/pricing`],
    ['Users', `${base}/users`],
    ['Webhooks', `${base}/webhooks`],
    ['Payments', `${base}/payments`],
  ];
  return html`<p class="muted"><a href="/dashboard">Projects</a> / ${project.name} <code>${project.id}</code></p>
<nav aria-label="Project" class="row" style="gap:1rem;margin-bottom:1rem">${items.map(
    ([label, href]) =>
      html`<a href="${href}"${raw(label === current ? ' aria-current="page" style="font-weight:700"' : '')}>${label}</a>`,
  )}</nav>`;
}

function pricingText(p: Pricing): string {
  switch (p.mode) {
    case 'per_request':
      return `${p.perRequest} per request`;
    case 'per_token':
      return `${p.inputPerMillion} in / ${p.outputPerMillion ?? '0'} out per 1M tokens${
        p.cachedInputPerMillion ? ` (${p.cachedInputPerMillion} cached)` : ''
      }`;
    case 'subscription':
      return `${p.fee} every ${p.period}`;
  }
}

function snippets(base: string, key: string, model: string): Raw {
  const curl = `curl ${base}/v1/chat/completions \\
  -H "Authorization: Bearer ${key}" \\
  -H "Content-Type: application/json" \\
  -d '{"model":"${model}","user":"user-42","messages":[{"role":"user","content":"Hello"}]}'`;
  const js = `import OpenAI from 'openai';

const client = new OpenAI({ baseURL: '${base}/v1', apiKey: '${key}' });
const reply = await client.chat.completions.create({
  model: '${model}',
  user: 'user-42', // your end user: unconnected users get a connect link, broke ones a top-up link
  messages: [{ role: 'user', content: 'Hello' }],
});
console.log(reply.choices[0].message.content);`;
  const py = `from openai import OpenAI

client = OpenAI(base_url="${base}/v1", api_key="${key}")
reply = client.chat.completions.create(
    model="${model}",
    user="user-42",  # your end user
    messages=[{"role": "user", "content": "Hello"}],
)
print(reply.choices[0].message.content)`;
  return html`<h2>Try it</h2>
<p>With <code>curl</code>:</p><pre id="snippet-curl">${curl}</pre>
<p>With the <code>openai</code> package for JavaScript:</p><pre id="snippet-js">${js}</pre>
<p>With the <code>openai</code> package for Python:</p><pre id="snippet-py">${py}</pre>`;
}

function secretBox(id: string, label: string, value: string): Raw {
  return html`<p><strong>${label}</strong> — shown once: copy it now, it cannot be shown again.</p>
<div class="secret"><code id="${id}">${value}</code><button type="button" data-copy="#${id}" hidden>Copy</button></div>`;
}

export async function dashboardRoutes(app: FastifyInstance): Promise<void> {
  const ctx = app.ctx;
  const limiter = app.hasDecorator('signInLimiter') ? app.signInLimiter : new SignInLimiter();

  app.addContentTypeParser(
    'application/x-www-form-urlencoded',
    { parseAs: 'string', bodyLimit: 256 * 1024 },
    (_request, body, done) => {
      done(null, Object.fromEntries(new URLSearchParams(body as string)));
    },
  );

  app.decorateRequest('dashboard', null);
  app.addHook('preHandler', async (request) => {
    const token = cookiesOf(request)[SESSION_COOKIE];
    const principal = token?.startsWith('tgs_') ? await resolveSession(ctx.db, token) : undefined;
    request.dashboard =
      principal?.csrf && principal.email ? { principal, email: principal.email, csrf: principal.csrf } : null;
    if (request.method !== 'POST') return;
    sameOrigin(request);
    const sent = (request.body as Form | undefined)?.csrf ?? '';
    const expected = request.dashboard?.csrf ?? cookiesOf(request)[CSRF_COOKIE] ?? '';
    if (!expected || !sent || !safeEqual(sent, expected)) {
      throw forbidden('The form expired or did not come from this dashboard. Reload the page and try again.');
    }
  });

  app.setErrorHandler((error: FastifyError, request, reply) => {
    const status =
      error.statusCode && error.statusCode >= 400 && error.statusCode < 600 ? error.statusCode : 500;
    if (status >= 500) request.log.error({ err: error, url: request.url }, 'dashboard page failed');
    const message = status >= 500 ? 'Something went wrong. Please try again in a moment.' : error.message;
    if (error instanceof ApiError) reply.headers(error.headers);
    return sendHtml(
      reply,
      status,
      layout(
        { title: 'Problem', email: request.dashboard?.email, csrf: request.dashboard?.csrf },
        html`<section class="card"><h1>${status === 404 ? 'Not found' : 'This did not work'}</h1><p class="error" role="alert">${message}</p><p><a href="/dashboard">Back to the dashboard</a></p></section>`,
      ),
    );
  });

  app.setNotFoundHandler((request, reply) =>
    sendHtml(
      reply,
      404,
      layout(
        { title: 'Not found' },
        html`<section class="card"><h1>Not found</h1><p>There is no dashboard page at <code>${request.url.split('?')[0]}</code>.</p><p><a href="/dashboard">Back to the dashboard</a></p></section>`,
      ),
    ),
  );

  /** Pages of a signed-in developer; others are sent to the sign-in page. */
  function session(request: FastifyRequest, reply: FastifyReply) {
    const s = request.dashboard;
    if (!s) {
      reply.redirect('/dashboard/signin', 303);
      return undefined;
    }
    return s;
  }

  function page(
    request: FastifyRequest,
    reply: FastifyReply,
    title: string,
    body: Raw,
    options: { status?: number; script?: boolean } = {},
  ) {
    const s = request.dashboard;
    const nonce = options.script ? randomToken(16) : undefined;
    return sendHtml(
      reply,
      options.status ?? 200,
      layout({ title, email: s?.email, csrf: s?.csrf, ...(nonce ? { nonce } : {}) }, body),
      nonce,
    );
  }

  /** Runs a form action; a problem with the input goes back to the form as a message. */
  async function action(
    reply: FastifyReply,
    backTo: string,
    fn: () => Promise<string | undefined | FastifyReply>,
  ): Promise<FastifyReply> {
    try {
      const result = await fn();
      if (typeof result === 'string') return reply.redirect(back(backTo, 'done', result), 303);
      return result ?? reply.redirect(backTo, 303);
    } catch (err) {
      if (err instanceof ApiError && err.status < 500 && err.status !== 403) {
        if (err.status === 429) reply.headers(err.headers);
        return reply.redirect(back(backTo, 'error', err.message), 303);
      }
      throw err;
    }
  }

  // ---- sign up, sign in, sign out ----

  function anonymousForm(request: FastifyRequest, reply: FastifyReply): string {
    let token = cookiesOf(request)[CSRF_COOKIE];
    if (!token) {
      token = randomToken(24);
      reply.header('set-cookie', cookie(request, CSRF_COOKIE, token, 3600 * 12));
    }
    return token;
  }

  function credentialsPage(request: FastifyRequest, reply: FastifyReply, kind: 'signup' | 'signin') {
    if (request.dashboard) return reply.redirect('/dashboard', 303);
    const csrf = anonymousForm(request, reply);
    const signup = kind === 'signup';
    return page(
      request,
      reply,
      signup ? 'Sign up' : 'Sign in',
      html`<section class="card" style="max-width:28rem;margin:2rem auto">
<h1>${signup ? 'Create your Tollgate account' : 'Sign in to Tollgate'}</h1>
${flash(request)}
<form method="post" action="/dashboard/${kind}">
${csrfField(csrf)}
<label for="email">E-mail</label>
<input id="email" name="email" type="email" autocomplete="email" required autofocus>
<label for="password">Password${signup ? ' (at least 10 characters)' : ''}</label>
<input id="password" name="password" type="password" autocomplete="${signup ? 'new-password' : 'current-password'}" minlength="${signup ? 10 : 1}" required>
<button type="submit">${signup ? 'Sign up' : 'Sign in'}</button>
</form>
<p class="muted">${
        signup
          ? html`Already have an account? <a href="/dashboard/signin">Sign in</a>.`
          : html`New here? <a href="/dashboard/signup">Create an account</a>.`
      }</p>
</section>`,
    );
  }

  async function startSession(request: FastifyRequest, reply: FastifyReply, developerId: string) {
    const created = await createSession(ctx.db, developerId);
    reply.header('set-cookie', [
      cookie(request, SESSION_COOKIE, created.token, SESSION_TTL_SECONDS),
      cookie(request, CSRF_COOKIE, '', 0),
    ]);
  }

  app.get('/signup', async (request, reply) => credentialsPage(request, reply, 'signup'));
  app.get('/signin', async (request, reply) => credentialsPage(request, reply, 'signin'));

  app.post('/signup', async (request, reply) =>
    action(reply, '/dashboard/signup', async () => {
      const input = parseInput(credentialsSchema, pick(request.body as Form, ['email', 'password']));
      const developer = await signUp(ctx.db, input);
      await startSession(request, reply, developer.id);
      return reply.redirect('/dashboard/start', 303);
    }),
  );

  app.post('/signin', async (request, reply) =>
    action(reply, '/dashboard/signin', async () => {
      const input = parseInput(credentialsSchema, pick(request.body as Form, ['email', 'password']));
      limiter.check(input.email, request.ip);
      let developerId: string;
      try {
        developerId = (await checkCredentials(ctx.db, input)).id;
      } catch (err) {
        limiter.failed(input.email, request.ip);
        throw err;
      }
      limiter.succeeded(input.email);
      await startSession(request, reply, developerId);
      return reply.redirect('/dashboard', 303);
    }),
  );

  app.post('/signout', async (request, reply) => {
    if (request.dashboard?.principal.sessionId)
      await endSession(ctx.db, request.dashboard.principal.sessionId);
    reply.header('set-cookie', cookie(request, SESSION_COOKIE, '', 0));
    return reply.redirect('/dashboard/signin?done=Signed%20out.', 303);
  });

  // ---- projects ----

  app.get('/', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    const projects = await listProjects(ctx, s.principal, { limit: 100 });
    if (projects.data.length === 0) return reply.redirect('/dashboard/start', 303);
    return page(
      request,
      reply,
      'Projects',
      html`<h1>Projects</h1>${flash(request)}
<section class="card"><table><caption class="muted" style="text-align:left">Your projects (paywalls)</caption>
<thead><tr><th>Name</th><th>Id</th><th>Currency</th><th>Provider</th></tr></thead><tbody>
${projects.data.map(
  (p) =>
    html`<tr><td><a href="/dashboard/projects/${encodeURIComponent(p.id)}">${p.name}</a></td><td><code>${p.id}</code></td><td>${p.currency}</td><td>${p.provider.baseUrl ?? html`<a href="/dashboard/projects/${encodeURIComponent(p.id)}#provider">connect a provider</a>`}</td></tr>`,
)}
</tbody></table>
<p><a class="button" href="/dashboard/start">New project</a></p></section>
${await adminTokensSection(s)}`,
    );
  });

  /** Admin tokens of the developer: for the CLI over TOLLGATE_URL and for automation. */
  async function adminTokensSection(s: { principal: Principal; csrf: string }): Promise<Raw> {
    const tokens = await listAdminTokens(ctx.db, s.principal);
    return html`<section class="card" aria-labelledby="tokens-h"><h2 id="tokens-h">Admin tokens</h2>
<p class="muted">For the admin API and the CLI (<code>TOLLGATE_URL=${ctx.publicBaseUrl} TOLLGATE_ADMIN_TOKEN=…</code>); a token acts as you.</p>
${
  tokens.length
    ? html`<table><thead><tr><th>Name</th><th>Token</th><th>Created</th><th>Status</th><th><span class="muted">Action</span></th></tr></thead><tbody>
${tokens.map(
  (t) =>
    html`<tr><td>${t.name}</td><td><code>${t.prefix}…</code></td><td>${t.createdAt.slice(0, 10)}</td><td>${t.revokedAt ? 'revoked' : 'active'}</td><td>${
      t.revokedAt
        ? ''
        : html`<form method="post" action="/dashboard/admin-tokens/${encodeURIComponent(t.id)}/revoke">${csrfField(s.csrf)}<button type="submit" class="secondary" aria-label="Revoke admin token ${t.name}">Revoke</button></form>`
    }</td></tr>`,
)}</tbody></table>`
    : ''
}
<form method="post" action="/dashboard/admin-tokens">${csrfField(s.csrf)}<div class="row"><div><label for="tokenName">New admin token name</label><input id="tokenName" name="name" value="cli" required maxlength="200"></div><div><button type="submit">Create an admin token</button></div></div></form>
</section>`;
  }

  app.post('/admin-tokens', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    return action(reply, '/dashboard', async () => {
      const name = parseInput(z.string().trim().min(1).max(200), (request.body as Form).name, 'name');
      const created = await createAdminToken(ctx.db, s.principal, name);
      return page(
        request,
        reply,
        'Admin token',
        html`<section class="card"><h1>Admin token created</h1>
${secretBox('admin-token', 'Your admin token', created.token)}
<pre>export TOLLGATE_URL=${ctx.publicBaseUrl} TOLLGATE_ADMIN_TOKEN=${created.token}</pre>
<p><a href="/dashboard">Back to the projects</a></p></section>`,
        { script: true },
      );
    });
  });

  app.post<{ Params: { id: string } }>('/admin-tokens/:id/revoke', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    return action(reply, '/dashboard', async () => {
      await revokeAdminToken(ctx.db, s.principal, request.params.id);
      return 'Admin token revoked.';
    });
  });

  /** The first run (and every new project): paste the provider's key, get the project's API key. */
  app.get('/start', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    return page(
      request,
      reply,
      'Connect a provider',
      html`<section class="card" style="max-width:40rem">
<h1>Connect your model provider</h1>
<p>Paste your provider's API key. Tollgate checks it with a live call to the provider's <code>/models</code>,
stores it encrypted, and gives you the API key your app uses instead.</p>
${flash(request)}
<form method="post" action="/dashboard/start">
${csrfField(s.csrf)}
<label for="name">Project name</label>
<input id="name" name="name" value="My app" required maxlength="200">
<label for="baseUrl">Provider base URL (any OpenAI-compatible API)</label>
<input id="baseUrl" name="baseUrl" type="url" value="https://api.openai.com/v1" required>
<label for="apiKey">Provider API key</label>
<input id="apiKey" name="apiKey" type="password" autocomplete="off" required>
<label for="currency">Currency your users pay in</label>
<input id="currency" name="currency" value="usd" pattern="[a-z]{3}" required>
<button type="submit">Connect and create the API key</button>
</form></section>`,
    );
  });

  app.post('/start', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    return action(reply, '/dashboard/start', async () => {
      const form = request.body as Form;
      const provider = parseInput(providerBody, pick(form, ['baseUrl', 'apiKey']));
      // Check first: a project is made only for a provider that answers.
      const { models } = await checkProvider(ctx, provider);
      const created = await createOwnedProject(
        ctx,
        s.principal,
        parseInput(
          z.object({ name: z.string().trim().min(1).max(200), currency: z.string().regex(/^[a-z]{3}$/) }),
          pick(form, ['name', 'currency']),
          'form',
        ),
      );
      await connectProvider(ctx, s.principal, created.project.id, provider);
      return keyPage(request, reply, created.project, created.apiKey.key, models[0] ?? 'gpt-4o-mini', true);
    });
  });

  function keyPage(
    request: FastifyRequest,
    reply: FastifyReply,
    project: Pick<ProjectView, 'id' | 'name'>,
    key: string,
    model: string,
    first: boolean,
  ) {
    const base = ctx.publicBaseUrl;
    const link = `/dashboard/projects/${encodeURIComponent(project.id)}`;
    return page(
      request,
      reply,
      'Your API key',
      html`<section class="card">
<h1>${first ? `${project.name} is connected` : 'New API key'}</h1>
${secretBox('api-key', 'Your API key', key)}
${snippets(base, key, model)}
<h2>Next</h2>
<ol>
<li><a href="${link}/pricing">Set a price</a> for each model you sell (clients may use only priced models).</li>
<li><a href="${link}/users">Fund a user</a>, or let users connect and top up through the links Tollgate sends them.</li>
<li>Watch requests, tokens and revenue on the <a href="${link}">project overview</a>.</li>
</ol>
</section>`,
      { script: true },
    );
  }

  // ---- one project ----

  paymentDashboardRoutes(app, { session, page, action, nav: projectNav, csrfField }); // ./payments.ts

  const projectPath = (id: string) => `/dashboard/projects/${encodeURIComponent(id)}`;
  type P = { Params: { id: string } };

  app.get<P>('/projects/:id', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    const project = projectView(await ownedProject(ctx, s.principal, request.params.id));
    const keys = await listApiKeys(ctx, s.principal, project.id);
    const [byDay, byModel] = await Promise.all([
      usageReport(ctx, s.principal, project.id, { group: 'day', days: 14 }),
      usageReport(ctx, s.principal, project.id, { group: 'model', days: 30 }),
    ]);
    const days = new Map(byDay.data.map((r) => [r.key, r]));
    const dayRows = lastDays(14).map((d) => ({ d, r: days.get(d) }));
    const path = projectPath(project.id);
    return page(
      request,
      reply,
      project.name,
      html`<h1>${project.name}</h1>${projectNav(project, 'Overview')}${flash(request)}
<section class="card" aria-labelledby="charts-h"><h2 id="charts-h">Usage</h2>
<div class="charts">
${barChart(
  'Requests per day',
  dayRows.map(({ d, r }) => ({ label: d.slice(5), value: r?.requests ?? 0 })),
  'chart-requests-day',
)}
${barChart(
  'Tokens per day',
  dayRows.map(({ d, r }) => ({ label: d.slice(5), value: (r?.inputTokens ?? 0) + (r?.outputTokens ?? 0) })),
  'chart-tokens-day',
)}
${barChart(
  `Revenue per day (${project.currency})`,
  dayRows.map(({ d, r }) => ({
    label: d.slice(5),
    value: Number(r?.revenue ?? 0),
    shown: r?.revenue ?? '0',
  })),
  'chart-revenue-day',
)}
${barChart(
  'Requests per model (30 days)',
  byModel.data.map((r) => ({ label: r.key, value: r.requests })),
  'chart-requests-model',
)}
${barChart(
  'Tokens per model (30 days)',
  byModel.data.map((r) => ({ label: r.key, value: r.inputTokens + r.outputTokens })),
  'chart-tokens-model',
)}
${barChart(
  `Revenue per model (30 days, ${project.currency})`,
  byModel.data.map((r) => ({ label: r.key, value: Number(r.revenue), shown: r.revenue })),
  'chart-revenue-model',
)}
</div></section>
<section class="card" id="provider" aria-labelledby="provider-h"><h2 id="provider-h">Provider</h2>
<p>${project.provider.baseUrl ? html`Connected to <code>${project.provider.baseUrl}</code>${project.provider.keySet ? ' with a key (stored encrypted)' : ' without a key'}.` : 'No provider connected yet.'}</p>
<form method="post" action="${path}/provider">${csrfField(s.csrf)}
<div class="row"><div><label for="baseUrl">Provider base URL</label><input id="baseUrl" name="baseUrl" type="text" value="${project.provider.baseUrl ?? 'https://api.openai.com/v1'}" required></div>
<div><label for="apiKey">Provider API key (paste it again to save)</label><input id="apiKey" name="apiKey" type="password" autocomplete="off" required></div></div>
<button type="submit">Check and save the provider</button></form></section>
<section class="card" aria-labelledby="settings-h"><h2 id="settings-h">Settings</h2>
<form method="post" action="${path}/settings">${csrfField(s.csrf)}
<div class="row"><div><label for="projectName">Project name</label><input id="projectName" name="name" value="${project.name}" required maxlength="200"></div>
<div><label for="checkoutUrl">Checkout URL (top-up links redirect there)</label><input id="checkoutUrl" name="checkoutUrl" type="url" value="${project.settings.checkoutUrl ?? ''}"></div>
<div><label for="returnUrl">Return URL (after connecting)</label><input id="returnUrl" name="returnUrl" type="url" value="${project.settings.returnUrl ?? ''}"></div></div>
<label for="connectMessage">Connect message (<code>{link}</code> is replaced by the link)</label><input id="connectMessage" name="connectMessage" maxlength="2000" value="${project.settings.connectMessage ?? ''}">
<label for="topupMessage">Top-up message (<code>{link}</code> and <code>{amount}</code> are replaced)</label><input id="topupMessage" name="topupMessage" maxlength="2000" value="${project.settings.topupMessage ?? ''}">
<button type="submit">Save the settings</button></form></section>
<section class="card" aria-labelledby="keys-h"><h2 id="keys-h">API keys</h2>
<table><thead><tr><th>Name</th><th>Key</th><th>Created</th><th>Status</th><th><span class="muted">Action</span></th></tr></thead><tbody>
${keys.data.map(
  (k) =>
    html`<tr><td>${k.name}</td><td><code>${k.prefix}…</code></td><td>${k.createdAt.slice(0, 10)}</td><td>${k.revokedAt ? 'revoked' : 'active'}</td><td>${
      k.revokedAt
        ? ''
        : html`<form method="post" action="${path}/keys/${encodeURIComponent(k.id)}/revoke">${csrfField(s.csrf)}<button type="submit" class="secondary" aria-label="Revoke key ${k.prefix}">Revoke</button></form>`
    }</td></tr>`,
)}
</tbody></table>
<form method="post" action="${path}/keys">${csrfField(s.csrf)}<div class="row"><div><label for="keyName">New key name</label><input id="keyName" name="name" value="default" required maxlength="200"></div><div><button type="submit">Create an API key</button></div></div></form>
</section>`,
    );
  });

  app.post<P>('/projects/:id/provider', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    const path = projectPath(request.params.id);
    return action(reply, path, async () => {
      const form = request.body as Form;
      const input = parseInput(providerBody, {
        baseUrl: form.baseUrl,
        ...(form.apiKey ? { apiKey: form.apiKey } : {}),
      });
      const result = await connectProvider(ctx, s.principal, request.params.id, input);
      return `Provider checked and saved (${result.models.length} models listed).`;
    });
  });

  app.post<P>('/projects/:id/settings', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    return action(reply, projectPath(request.params.id), async () => {
      const f = request.body as Form;
      const value = (name: string) => (f[name]?.trim() ? f[name]!.trim() : undefined);
      const settings = Object.fromEntries(
        ['checkoutUrl', 'returnUrl', 'connectMessage', 'topupMessage']
          .map((name) => [name, value(name)] as const)
          .filter(([, v]) => v !== undefined),
      );
      await updateOwnedProject(ctx, s.principal, request.params.id, {
        name: f.name ?? '',
        settings: parseInput(projectSettingsSchema.partial(), settings, 'settings'),
      });
      return 'Settings saved.';
    });
  });

  app.post<P>('/projects/:id/keys', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    return action(reply, projectPath(request.params.id), async () => {
      const name = parseInput(z.string().trim().min(1).max(200), (request.body as Form).name, 'name');
      const project = projectView(await ownedProject(ctx, s.principal, request.params.id));
      const key = await createApiKey(ctx, s.principal, project.id, name);
      const models = await listModels(ctx, s.principal, project.id);
      return keyPage(request, reply, project, key.key, models.models[0]?.id ?? 'gpt-4o-mini', false);
    });
  });

  app.post<{ Params: { id: string; key: string } }>(
    '/projects/:id/keys/:key/revoke',
    async (request, reply) => {
      const s = session(request, reply);
      if (!s) return reply;
      return action(reply, projectPath(request.params.id), async () => {
        await revokeApiKey(ctx, s.principal, request.params.id, request.params.key);
        return 'Key revoked: it stops working at once.';
      });
    },
  );

  // ---- pricing ----

  app.get<P>('/projects/:id/pricing', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    const project = projectView(await ownedProject(ctx, s.principal, request.params.id));
    const pricing = await listModels(ctx, s.principal, project.id);
    const path = projectPath(project.id);
    const yaml = toYaml({ currency: pricing.currency, models: pricing.models });
    return page(
      request,
      reply,
      `Pricing · ${project.name}`,
      html`<h1>Pricing</h1>${projectNav(project, 'Pricing')}${flash(request)}
<section class="card"><h2>Models</h2>
${
  pricing.models.length
    ? html`<table><thead><tr><th>Model</th><th>Provider model</th><th>Price (${project.currency})</th><th>APIs</th><th><span class="muted">Action</span></th></tr></thead><tbody>
${pricing.models.map(
  (m) =>
    html`<tr><td><code>${m.id}</code></td><td><code>${m.upstreamModel ?? m.id}</code></td><td>${pricingText(m.pricing)}</td><td>${(m.endpoints ?? []).join(', ')}</td><td><form method="post" action="${path}/pricing/${encodeURIComponent(m.id)}/delete">${csrfField(s.csrf)}<button type="submit" class="secondary" aria-label="Delete model ${m.id}">Delete</button></form></td></tr>`,
)}</tbody></table>`
    : html`<p>No models yet: clients can use only the models priced here.</p>`
}</section>
<section class="card"><h2>Set a price</h2>
<form method="post" action="${path}/pricing">${csrfField(s.csrf)}
<div class="row">
<div><label for="model">Model (what clients send)</label><input id="model" name="model" required maxlength="128" placeholder="gpt-4o-mini"></div>
<div><label for="upstreamModel">Provider model (optional)</label><input id="upstreamModel" name="upstreamModel" maxlength="256" placeholder="same as the model"></div>
<div><label for="mode">Pricing</label><select id="mode" name="mode"><option value="per_request">Per request</option><option value="per_token">Per token</option><option value="subscription">Subscription</option></select></div>
</div>
<div class="row">
<div><label for="perRequest">Per request</label><input id="perRequest" name="perRequest" inputmode="decimal" placeholder="0.01"></div>
<div><label for="inputPerMillion">Input per 1M tokens</label><input id="inputPerMillion" name="inputPerMillion" inputmode="decimal" placeholder="0.15"></div>
<div><label for="outputPerMillion">Output per 1M tokens</label><input id="outputPerMillion" name="outputPerMillion" inputmode="decimal" placeholder="0.60"></div>
<div><label for="fee">Subscription fee</label><input id="fee" name="fee" inputmode="decimal" placeholder="10.00"></div>
<div><label for="period">Period</label><input id="period" name="period" placeholder="30d"></div>
</div>
<p class="muted">Fill in the fields of the pricing you chose; prices are in ${project.currency}.</p>
<button type="submit">Save the price</button></form></section>
<section class="card"><h2>Pricing file</h2>
<p class="muted">The whole pricing as a file (as <code>tollgate models apply</code> takes it): applying it makes the models exactly these.</p>
<form method="post" action="${path}/pricing/file">${csrfField(s.csrf)}
<label for="file">Pricing file (YAML)</label><textarea id="file" name="file" spellcheck="false">${yaml}</textarea>
<button type="submit">Apply the pricing file</button></form></section>`,
    );
  });

  app.post<P>('/projects/:id/pricing', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    const path = `${projectPath(request.params.id)}/pricing`;
    return action(reply, path, async () => {
      const f = request.body as Form;
      const v = (name: string) => (f[name]?.trim() ? f[name]!.trim() : undefined);
      const pricing =
        f.mode === 'per_token'
          ? {
              mode: 'per_token',
              inputPerMillion: v('inputPerMillion'),
              outputPerMillion: v('outputPerMillion'),
            }
          : f.mode === 'subscription'
            ? { mode: 'subscription', fee: v('fee'), period: v('period') }
            : { mode: 'per_request', perRequest: v('perRequest') };
      const spec = parseInput(
        modelSpecSchema,
        {
          id: v('model'),
          ...(v('upstreamModel') ? { upstreamModel: v('upstreamModel') } : {}),
          pricing: Object.fromEntries(Object.entries(pricing).filter(([, x]) => x !== undefined)),
        },
        'form',
      );
      await putModel(ctx, s.principal, request.params.id, spec);
      return `Saved the price of ${spec.id}.`;
    });
  });

  app.post<{ Params: { id: string; model: string } }>(
    '/projects/:id/pricing/:model/delete',
    async (request, reply) => {
      const s = session(request, reply);
      if (!s) return reply;
      return action(reply, `${projectPath(request.params.id)}/pricing`, async () => {
        await deleteModel(ctx, s.principal, request.params.id, request.params.model);
        return `Deleted ${request.params.model}.`;
      });
    },
  );

  app.post<P>('/projects/:id/pricing/file', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    return action(reply, `${projectPath(request.params.id)}/pricing`, async () => {
      const file = parsePricingFile((request.body as Form).file ?? '');
      const r = await applyModels(ctx, s.principal, request.params.id, file);
      return `Applied: created ${r.created.join(', ') || '-'}; updated ${r.updated.join(', ') || '-'}; deleted ${r.deleted.join(', ') || '-'}.`;
    });
  });

  // ---- end users ----

  app.get<P & { Querystring: { q?: string } }>('/projects/:id/users', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    const project = projectView(await ownedProject(ctx, s.principal, request.params.id));
    const q = typeof request.query.q === 'string' ? request.query.q.slice(0, 256) : '';
    const users = await searchUsers(ctx, s.principal, project.id, { q: q || undefined, limit: 100 });
    const path = projectPath(project.id);
    return page(
      request,
      reply,
      `Users · ${project.name}`,
      html`<h1>End users</h1>${projectNav(project, 'Users')}${flash(request)}
<section class="card"><form method="get" action="${path}/users" role="search"><div class="row"><div><label for="q">Search users by id</label><input id="q" name="q" value="${q}"></div><div><button type="submit">Search</button></div></div></form>
<table><thead><tr><th>User</th><th>Connected</th><th class="num">Balance</th><th class="num">Held</th><th class="num">Available</th></tr></thead><tbody>
${users.data.map(
  (u) =>
    html`<tr><td><a href="${path}/users/${encodeURIComponent(u.user)}">${u.user}</a></td><td>${u.connected ? 'yes' : 'no'}</td><td class="num">${u.balance}</td><td class="num">${u.held}</td><td class="num">${u.available}</td></tr>`,
)}
</tbody></table>${users.data.length ? '' : html`<p class="muted">No users${q ? ' match' : ' yet'}.</p>`}</section>
<section class="card"><h2>Deposit to a user</h2>
${depositForm(path, s.csrf, project.currency)}
</section>`,
    );
  });

  function depositForm(path: string, csrf: string, currency: string, user?: string): Raw {
    return html`<form method="post" action="${path}/users/deposit">${csrfField(csrf)}<input type="hidden" name="idem" value="${randomUUID()}">
<div class="row">${
      user
        ? html`<input type="hidden" name="user" value="${user}">`
        : html`<div><label for="depositUser">User id</label><input id="depositUser" name="user" required maxlength="256"></div>`
    }
<div><label for="depositAmount">Amount (${currency})</label><input id="depositAmount" name="amount" inputmode="decimal" required placeholder="10.00"></div>
<div><button type="submit">Deposit</button></div></div></form>`;
  }

  const moneyForm = z.object({
    user: userIdSchema,
    amount: z.string().trim().min(1, { message: 'is required' }),
    idem: z.string().max(100).optional(),
    description: z.string().max(200).optional(),
  });

  for (const kind of ['deposit', 'charge'] as const) {
    app.post<P>(`/projects/:id/users/${kind}`, async (request, reply) => {
      const s = session(request, reply);
      if (!s) return reply;
      const form = request.body as Form;
      const userPath = form.user
        ? `${projectPath(request.params.id)}/users/${encodeURIComponent(form.user)}`
        : `${projectPath(request.params.id)}/users`;
      return action(reply, userPath, async () => {
        const project = await ownedProject(ctx, s.principal, request.params.id);
        const input = parseInput(moneyForm, pick(form, ['user', 'amount', 'idem', 'description']), 'form');
        const amount = parseInput(amountSchema(project.currency), input.amount, 'amount');
        const result = await moveMoney(
          ctx,
          s.principal,
          project.id,
          kind,
          {
            user: input.user,
            amount,
            metadata: { via: 'dashboard', ...(input.description ? { description: input.description } : {}) },
          },
          input.idem ? `dashboard-${input.idem}` : undefined,
        );
        const body = result.body as { success?: boolean; balance: string; reason?: string };
        if (kind === 'charge' && body.success === false)
          throw new ApiError(400, 'invalid_request_error', `Not charged: ${body.reason}.`, {
            code: 'not_charged',
          });
        return `${kind === 'deposit' ? 'Deposited' : 'Charged'} ${amount} ${project.currency}; balance ${body.balance} ${project.currency}.`;
      });
    });
  }

  app.get<{ Params: { id: string; user: string } }>('/projects/:id/users/:user', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    const row = await ownedProject(ctx, s.principal, request.params.id);
    const project = projectView(row);
    const user = parseInput(userIdSchema, request.params.user, 'user');
    const balance = await getBalance(ctx.db, row, user);
    const activity = await listActivity(ctx.db, row, user, { limit: 50 });
    const path = projectPath(project.id);
    const userPath = `${path}/users/${encodeURIComponent(user)}`;
    return page(
      request,
      reply,
      `${user} · ${project.name}`,
      html`<h1>User ${user}</h1>${projectNav(project, 'Users')}${flash(request)}
<section class="card"><h2>Balance</h2>
<p><strong id="balance">${balance.balance}</strong> ${project.currency} (held ${balance.held}, available ${balance.available}); ${balance.connected ? 'connected' : 'not connected'}.</p>
<form method="post" action="${userPath}/${balance.connected ? 'disconnect' : 'connect'}">${csrfField(s.csrf)}<button type="submit" class="secondary">${balance.connected ? 'Disconnect' : 'Connect'} this user</button></form>
</section>
<section class="card"><h2>Deposit</h2>${depositForm(path, s.csrf, project.currency, user)}</section>
<section class="card"><h2>Charge</h2>
<form method="post" action="${path}/users/charge">${csrfField(s.csrf)}<input type="hidden" name="idem" value="${randomUUID()}"><input type="hidden" name="user" value="${user}">
<div class="row"><div><label for="chargeAmount">Amount (${project.currency})</label><input id="chargeAmount" name="amount" inputmode="decimal" required></div>
<div><label for="chargeDescription">What for (optional)</label><input id="chargeDescription" name="description" maxlength="200"></div>
<div><button type="submit">Charge</button></div></div></form></section>
<section class="card"><h2>Activity</h2>
<table id="activity"><thead><tr><th>When (UTC)</th><th>Type</th><th class="num">Amount</th><th class="num">Balance after</th><th>Source</th><th>Details</th></tr></thead><tbody>
${activity.data.map(
  (a) =>
    html`<tr><td>${a.createdAt.replace('T', ' ').slice(0, 19)}</td><td>${a.type}</td><td class="num">${a.amount}</td><td class="num">${a.balance}</td><td>${a.source}</td><td>${a.description ?? (typeof a.metadata.model === 'string' ? a.metadata.model : '')}</td></tr>`,
)}
</tbody></table>${activity.data.length ? '' : html`<p class="muted">No activity yet.</p>`}</section>`,
    );
  });

  for (const act of ['connect', 'disconnect'] as const) {
    app.post<{ Params: { id: string; user: string } }>(
      `/projects/:id/users/:user/${act}`,
      async (request, reply) => {
        const s = session(request, reply);
        if (!s) return reply;
        const userPath = `${projectPath(request.params.id)}/users/${encodeURIComponent(request.params.user)}`;
        return action(reply, userPath, async () => {
          await setUserConnected(ctx, s.principal, request.params.id, request.params.user, act === 'connect');
          return act === 'connect' ? 'Connected.' : 'Disconnected.';
        });
      },
    );
  }

  // ---- webhooks ----

  app.get<P>('/projects/:id/webhooks', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    const project = projectView(await ownedProject(ctx, s.principal, request.params.id));
    const subs = await listSubscriptions(ctx, project.id, { status: undefined, limit: 100 });
    const logs = await listDeliveryLogs(ctx, project.id, { limit: 50 });
    const path = projectPath(project.id);
    return page(
      request,
      reply,
      `Webhooks · ${project.name}`,
      html`<h1>Webhooks</h1>${projectNav(project, 'Webhooks')}${flash(request)}
<section class="card"><h2>Subscriptions</h2>
<table><thead><tr><th>URL</th><th>Events</th><th>Active</th><th class="num">Failures</th><th><span class="muted">Action</span></th></tr></thead><tbody>
${subs.data.map(
  (w) =>
    html`<tr><td><code>${w.url}</code>${w.description ? html`<br><span class="muted">${w.description}</span>` : ''}</td><td>${w.events.join(', ')}</td><td>${w.isActive ? 'yes' : 'no'}</td><td class="num">${w.consecutiveFailures}</td><td>${
      w.isActive && !w.managedBy
        ? html`<form method="post" action="${path}/webhooks/${encodeURIComponent(w.id)}/deactivate">${csrfField(s.csrf)}<button type="submit" class="secondary" aria-label="Deactivate ${w.url}">Deactivate</button></form>`
        : w.managedBy
          ? html`<span class="muted">managed by ${w.managedBy}</span>`
          : ''
    }</td></tr>`,
)}</tbody></table>
<form method="post" action="${path}/webhooks">${csrfField(s.csrf)}
<div class="row"><div><label for="url">Endpoint URL</label><input id="url" name="url" type="url" required placeholder="https://example.com/tollgate"></div>
<div><label for="events">Events (patterns, separated by spaces or commas)</label><input id="events" name="events" required value="balance.* user.*"></div></div>
<label for="description">Description (optional)</label><input id="description" name="description" maxlength="512">
<button type="submit">Add the subscription</button></form></section>
<section class="card"><h2>Delivery log</h2>
<table><thead><tr><th>When (UTC)</th><th>Event</th><th>Status</th><th class="num">Attempts</th><th>Last answer</th><th><span class="muted">Action</span></th></tr></thead><tbody>
${logs.data.map(
  (d) =>
    html`<tr><td>${d.createdAt.replace('T', ' ').slice(0, 19)}</td><td>${d.eventType}</td><td>${d.status}</td><td class="num">${d.attempts}</td><td>${d.lastResponseStatus ?? d.lastError ?? ''}</td><td>${
      d.status === 'pending'
        ? ''
        : html`<form method="post" action="${path}/webhooks/deliveries/${encodeURIComponent(d.id)}/resend">${csrfField(s.csrf)}<button type="submit" class="secondary" aria-label="Resend delivery ${d.id}">Resend</button></form>`
    }</td></tr>`,
)}</tbody></table>${logs.data.length ? '' : html`<p class="muted">No deliveries yet.</p>`}</section>`,
    );
  });

  app.post<P>('/projects/:id/webhooks', async (request, reply) => {
    const s = session(request, reply);
    if (!s) return reply;
    const path = `${projectPath(request.params.id)}/webhooks`;
    return action(reply, path, async () => {
      await ownedProject(ctx, s.principal, request.params.id);
      const f = request.body as Form;
      const { subscription, secret } = await createSubscription(
        ctx,
        request.params.id,
        {
          url: f.url ?? '',
          events: (f.events ?? '').split(/[\s,]+/).filter(Boolean),
          ...(f.description?.trim() ? { description: f.description.trim() } : {}),
        },
        { createdBy: `developer:${s.principal.actorId}` },
      );
      return page(
        request,
        reply,
        'Webhook secret',
        html`<section class="card"><h1>Subscription added</h1><p>Deliveries to <code>${subscription.url}</code> are signed with this secret.</p>
${secretBox('webhook-secret', 'Signing secret', secret)}
<p><a href="${path}">Back to webhooks</a></p></section>`,
        { script: true },
      );
    });
  });

  app.post<{ Params: { id: string; sub: string } }>(
    '/projects/:id/webhooks/:sub/deactivate',
    async (request, reply) => {
      const s = session(request, reply);
      if (!s) return reply;
      return action(reply, `${projectPath(request.params.id)}/webhooks`, async () => {
        await ownedProject(ctx, s.principal, request.params.id);
        await setSubscriptionActive(ctx, request.params.id, request.params.sub, false);
        return 'Subscription deactivated.';
      });
    },
  );

  app.post<{ Params: { id: string; delivery: string } }>(
    '/projects/:id/webhooks/deliveries/:delivery/resend',
    async (request, reply) => {
      const s = session(request, reply);
      if (!s) return reply;
      return action(reply, `${projectPath(request.params.id)}/webhooks`, async () => {
        await ownedProject(ctx, s.principal, request.params.id);
        await retryDelivery(ctx, request.params.id, request.params.delivery);
        return 'Delivery queued to be sent again.';
      });
    },
  );
}

function pick(form: Form | undefined, names: string[]): Form {
  const out: Form = {};
  for (const name of names) if (form?.[name] !== undefined) out[name] = form[name];
  return out;
}
