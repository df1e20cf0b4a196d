import { z } from 'zod';
import { listAdminTokens, type Principal } from '../../admin/accounts.ts';
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
import { dataTable, html, type Raw } from '../../html/index.ts';
import { PROVIDER_KINDS } from '../../routing/providers.ts';
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

export default routeModule((app, ctx) => {
  app.get('/', { schema: { querystring: flashQuery } }, async (request, reply) => {
    const projects = await listProjects(ctx, request.developer, { limit: 100 });
    if (projects.data.length === 0) return reply.redirect('/dashboard/start', 303);
    const tokens = await adminTokensSection(request.developer);
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
${tokens(csrf)}`,
    );
  });

  /** Admin tokens of the developer: for the CLI over TOLLGATE_URL and for automation. */
  async function adminTokensSection(principal: Principal): Promise<(csrf: string) => Raw> {
    const tokens = await listAdminTokens(ctx.db, principal);
    return (csrf) => html`<section class="card" aria-labelledby="tokens-h"><h2 id="tokens-h">Admin tokens</h2>
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
<form method="post" action="/dashboard/admin-tokens">${csrfField(csrf)}<div class="row"><div><label for="tokenName">New admin token name</label><input id="tokenName" name="name" value="cli" required maxlength="200"></div><div><button type="submit">Create an admin token</button></div></div></form>
</section>`;
  }

  /** The first run (and every new project): paste the provider's key, get the project's API key. */
  app.get('/start', { schema: { querystring: flashQuery } }, async (request, reply) =>
    page(
      request,
      reply,
      'Connect a provider',
      ({ csrf, flash }) => html`<section class="card" style="max-width:40rem">
<h1>Connect your model provider</h1>
<p>Paste your provider's API key. Tollgate checks it with a live call to the provider's <code>/models</code>,
stores it encrypted, and gives you the API key your app uses instead.</p>
${flash}
<form method="post" action="/dashboard/start">
${csrfField(csrf)}
<label for="name">Project name</label>
<input id="name" name="name" value="My app" required maxlength="200">
<label for="kind">Provider API</label>
<select id="kind" name="kind"><option value="openai-compatible" selected>OpenAI-compatible (OpenAI, Azure, OpenRouter, vLLM, …)</option><option value="anthropic">Anthropic (https://api.anthropic.com)</option></select>
<label for="baseUrl">Provider base URL (any OpenAI-compatible API, or Anthropic's)</label>
<input id="baseUrl" name="baseUrl" type="url" value="https://api.openai.com/v1" required>
<label for="apiKey">Provider API key</label>
<input id="apiKey" name="apiKey" type="password" autocomplete="off" required>
<label for="currency">Currency your users pay in</label>
<input id="currency" name="currency" value="usd" pattern="[a-z]{3}" required>
<button type="submit">Connect and create the API key</button>
</form></section>
<section class="card" style="max-width:40rem" aria-labelledby="starter-h">
<h2 id="starter-h">No provider key at hand? Try it now</h2>
<p>Start on Tollgate's built-in echo provider (it answers with your own message, offline) with a starter
price list, so your API key works at once. Connect your model provider later on the project's page.</p>
<form method="post" action="/dashboard/start/echo">
${csrfField(csrf)}
<label for="starter-name">Project name</label>
<input id="starter-name" name="name" value="My app" required maxlength="200">
<label for="starter-currency">Currency your users pay in</label>
<input id="starter-currency" name="currency" value="usd" pattern="[a-z]{3}" required>
<button type="submit" class="secondary">Start with the echo provider</button>
</form></section>`,
    ),
  );

  app.post('/start/echo', { schema: { body: starterForm } }, async (request, reply) => {
    const created = await createStarterProject(ctx, request.developer, request.body);
    return keyPage(request, reply, created.project, created.apiKey.key, created.models[0]!, true, {
      echo: true,
    });
  });

  app.post('/start', { schema: { body: startForm } }, async (request, reply) => {
    const { name, currency, baseUrl, apiKey, kind } = request.body;
    const provider = { kind, baseUrl, ...(apiKey ? { apiKey } : {}) };
    // Check first: a project is made only for a provider that answers.
    const { models } = await checkProvider(ctx, provider);
    const created = await createOwnedProject(ctx, request.developer, { name, currency });
    await connectProvider(ctx, request.developer, created.project.id, provider);
    return keyPage(request, reply, created.project, created.apiKey.key, models[0] ?? 'gpt-4o-mini', true);
  });
});
