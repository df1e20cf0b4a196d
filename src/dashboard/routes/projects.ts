import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { listAdminTokens } from '../../admin/accounts.ts';
import {
  checkProvider,
  connectProvider,
  createOwnedProject,
  createProjectBody,
  listProjects,
  providerBody,
} from '../../admin/service.ts';
import { createStarterProject } from '../../admin/starter.ts';
import { routeModule } from '../../core/plugins.ts';
import { dataTable, html } from '../../html/index.ts';
import { PROVIDER_KINDS } from '../../routing/providers.ts';
import { type FormSpec, formView, invalidBody, type Refused, refusedBy } from '../forms.ts';
import { keyPage } from '../key-page.ts';
import { csrfField, flashQuery, formBody, page, revocableColumns, revocableRows } from '../pages.ts';

/** The projects list (`/dashboard`) with the admin tokens, and the first run (`/dashboard/start`). */

const starterForm = formBody({
  name: createProjectBody.shape.name,
  currency: createProjectBody.shape.currency,
});

const startForm = formBody({
  name: createProjectBody.shape.name,
  currency: createProjectBody.shape.currency,
  kind: z.enum(PROVIDER_KINDS).default('openai-compatible'),
  baseUrl: providerBody.shape.baseUrl,
  apiKey: providerBody.shape.apiKey,
});

/** The forms of the projects page and the first run, shown again in place when refused (../forms.ts). */
export const FORMS = {
  adminToken: { name: 'admin-token', fields: { name: { id: 'tokenName', label: 'Admin token name' } } },
  start: {
    name: 'start',
    fields: {
      name: { id: 'name', label: 'Project name' },
      kind: { id: 'kind', label: 'Provider API' },
      baseUrl: { id: 'baseUrl', label: 'Provider base URL' },
      apiKey: { id: 'apiKey', label: 'Provider API key', secret: true },
      currency: { id: 'currency', label: 'Currency' },
    },
  },
  starter: {
    name: 'starter',
    fields: {
      name: { id: 'starter-name', label: 'Project name' },
      currency: { id: 'starter-currency', label: 'Currency' },
    },
  },
} satisfies Record<string, FormSpec>;

/** The projects page (`/dashboard`) with the admin tokens, the new-token form refused when `refused` says so. */
export async function projectsPage(request: FastifyRequest, reply: FastifyReply, refused?: Refused) {
  const ctx = request.server.ctx;
  const projects = await listProjects(ctx, request.developer, { limit: 100 });
  if (projects.data.length === 0 && !refused) return reply.redirect('/dashboard/start', 303);
  const tokens = await listAdminTokens(ctx.db, request.developer);
  const f = formView(FORMS.adminToken, refused);
  return page(
    request,
    reply,
    'Projects',
    ({ csrf, flash }) => html`<h1>Projects</h1>${flash}
<section class="card">${dataTable(
      [{ label: 'Name' }, { label: 'Id' }, { label: 'Currency' }, { label: 'Provider' }],
      projects.data.map((p) => [
        html`<a href="/dashboard/projects/${encodeURIComponent(p.id)}">${p.name}</a>`,
        html`<code>${p.id}</code>`,
        p.currency,
        p.provider.baseUrl ??
          html`<a href="/dashboard/projects/${encodeURIComponent(p.id)}#provider">connect a provider</a>`,
      ]),
      { caption: 'Your projects (paywalls)' },
    )}
<p><a class="button" href="/dashboard/start">New project</a></p></section>
<section class="card" aria-labelledby="tokens-h"><h2 id="tokens-h">Admin tokens</h2>
<p class="muted">For the admin API and the CLI (<code>TOLLGATE_URL=${ctx.publicBaseUrl} TOLLGATE_ADMIN_TOKEN=…</code>); a token acts as you.</p>
${
  tokens.length
    ? dataTable(
        revocableColumns('Token'),
        revocableRows(
          tokens,
          csrf,
          (t) => `/dashboard/admin-tokens/${encodeURIComponent(t.id)}/revoke`,
          (t) => `admin token ${t.name}`,
        ),
      )
    : ''
}
<form method="post" action="/dashboard/admin-tokens">${csrfField(csrf)}${f.alert()}<div class="row"><div><label for="tokenName">New admin token name</label><input id="tokenName" name="name" required maxlength="200"${f.input('name', 'cli')}>${f.error('name')}</div><div><button type="submit">Create an admin token</button></div></div></form>
</section>`,
    { status: refused ? 400 : 200 },
  );
}

/** The first run (and every new project): paste the provider's key, get the project's API key. */
function startPage(request: FastifyRequest, reply: FastifyReply, refused?: Refused) {
  const f = formView(FORMS.start, refused);
  const starter = formView(FORMS.starter, refused);
  return page(
    request,
    reply,
    'Connect a provider',
    ({ csrf, flash }) => html`<section class="card" style="max-width:40rem">
<h1>Connect your model provider</h1>
<p>Paste your provider's API key. Tollgate checks it with a live call to the provider's <code>/models</code>,
stores it encrypted, and gives you the API key your app uses instead.</p>
${flash}
<form method="post" action="/dashboard/start">
${csrfField(csrf)}${f.alert()}
<label for="name">Project name</label>
<input id="name" name="name" required maxlength="200"${f.input('name', 'My app')}>${f.error('name')}
<label for="kind">Provider API</label>
<select id="kind" name="kind"${f.invalid('kind')}><option value="openai-compatible"${f.selected('kind', 'openai-compatible', true)}>OpenAI-compatible (OpenAI, Azure, OpenRouter, vLLM, …)</option><option value="anthropic"${f.selected('kind', 'anthropic', false)}>Anthropic (https://api.anthropic.com)</option></select>${f.error('kind')}
<label for="baseUrl">Provider base URL (any OpenAI-compatible API, or Anthropic's)</label>
<input id="baseUrl" name="baseUrl" type="url" required${f.input('baseUrl', 'https://api.openai.com/v1')}>${f.error('baseUrl')}
<label for="apiKey">Provider API key</label>
<input id="apiKey" name="apiKey" type="password" autocomplete="off" required${f.invalid('apiKey')}>${f.error('apiKey')}
<label for="currency">Currency your users pay in</label>
<input id="currency" name="currency" pattern="[a-z]{3}" required${f.input('currency', 'usd')}>${f.error('currency')}
<button type="submit">Connect and create the API key</button>
</form></section>
<section class="card" style="max-width:40rem" aria-labelledby="starter-h">
<h2 id="starter-h">No provider key at hand? Try it now</h2>
<p>Start on Tollgate's built-in echo provider (it answers with your own message, offline) with a starter
price list, so your API key works at once. Connect your model provider later on the project's page.</p>
<form method="post" action="/dashboard/start/echo">
${csrfField(csrf)}${starter.alert()}
<label for="starter-name">Project name</label>
<input id="starter-name" name="name" required maxlength="200"${starter.input('name', 'My app')}>${starter.error('name')}
<label for="starter-currency">Currency your users pay in</label>
<input id="starter-currency" name="currency" pattern="[a-z]{3}" required${starter.input('currency', 'usd')}>${starter.error('currency')}
<button type="submit" class="secondary">Start with the echo provider</button>
</form></section>`,
    { status: refused ? 400 : 200 },
  );
}

export default routeModule((app, ctx) => {
  app.get('/', { schema: { querystring: flashQuery } }, async (request, reply) =>
    projectsPage(request, reply),
  );

  app.get('/start', { schema: { querystring: flashQuery } }, async (request, reply) =>
    startPage(request, reply),
  );

  app.post(
    '/start/echo',
    { schema: { body: starterForm }, attachValidation: true },
    async (request, reply) => {
      if (request.validationError)
        return startPage(request, reply, invalidBody(FORMS.starter, starterForm, request));
      let created: Awaited<ReturnType<typeof createStarterProject>>;
      try {
        created = await createStarterProject(ctx, request.developer, request.body);
      } catch (err) {
        return startPage(request, reply, refusedBy(FORMS.starter, err, request.body));
      }
      return keyPage(request, reply, created.project, created.apiKey.key, created.models[0]!, true, {
        echo: true,
      });
    },
  );

  app.post('/start', { schema: { body: startForm }, attachValidation: true }, async (request, reply) => {
    if (request.validationError)
      return startPage(request, reply, invalidBody(FORMS.start, startForm, request));
    const { name, currency, baseUrl, apiKey, kind } = request.body;
    const provider = { kind, baseUrl, ...(apiKey ? { apiKey } : {}) };
    let created: Awaited<ReturnType<typeof createOwnedProject>>;
    let models: string[];
    try {
      // Check first: a project is made only for a provider that answers.
      models = (await checkProvider(ctx, provider)).models;
      created = await createOwnedProject(ctx, request.developer, { name, currency });
    } catch (err) {
      return startPage(request, reply, refusedBy(FORMS.start, err, request.body));
    }
    await connectProvider(ctx, request.developer, created.project.id, provider);
    return keyPage(request, reply, created.project, created.apiKey.key, models[0] ?? 'gpt-4o-mini', true);
  });
});
