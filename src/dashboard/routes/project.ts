import { z } from 'zod';
import { reconciliationCsv, reconciliationReport, usageReport } from '../../admin/reports.ts';
import { sendCsv } from '../../admin/routes/schemas.ts';
import {
  connectProvider,
  createApiKey,
  listApiKeys,
  listModels,
  type ProjectView,
  projectView,
  providerBody,
  revokeApiKey,
  updateOwnedProject,
} from '../../admin/service.ts';
import { displayAmount } from '../../core/money.ts';
import { routeModule } from '../../core/plugins.ts';
import { storableText } from '../../core/validation.ts';
import { dataTable, html, money } from '../../html/index.ts';
import { DEFAULT_PROVIDER, projectSettingsSchema } from '../../projects/service.ts';
import { PROVIDER_KINDS } from '../../routing/providers.ts';
import { type Bar, barChart, lastDays, rankChart } from '../charts.ts';
import { keyPage } from '../key-page.ts';
import {
  csrfField,
  done,
  formBody,
  optionalField,
  projectItemAction,
  projectPage,
  projectPageSchema,
  projectParams,
  projectPath,
  revocableColumns,
  revocableRows,
} from '../pages.ts';

/** One project's overview (`/dashboard/projects/:id`): usage charts, provider, settings, API keys. */

const providerForm = formBody({
  kind: z.enum(PROVIDER_KINDS).default('openai-compatible'),
  baseUrl: providerBody.shape.baseUrl,
  apiKey: optionalField(providerBody.shape.apiKey.unwrap()),
});

const settings = projectSettingsSchema.shape;
const settingsForm = formBody({
  name: storableText(200),
  checkoutUrl: optionalField(settings.checkoutUrl.unwrap()),
  returnUrl: optionalField(settings.returnUrl.unwrap()),
  connectMessage: optionalField(settings.connectMessage.unwrap()),
  topupMessage: optionalField(settings.topupMessage.unwrap()),
  lowBalanceThreshold: optionalField(settings.lowBalanceThreshold.unwrap()),
  debtLimit: optionalField(settings.debtLimit.unwrap()),
});

type Raw = ReturnType<typeof html>;
type UsageRow = Awaited<ReturnType<typeof usageReport>>['data'][number];
type ReconciliationRow = Awaited<ReturnType<typeof reconciliationReport>>['data'][number];
type KeyRow = Awaited<ReturnType<typeof listApiKeys>>['data'][number];

/** The usage charts: requests, tokens and revenue per day (14 days) and per model (30 days). */
function usageCharts(currency: string, byDay: UsageRow[], byModel: UsageRow[]): Raw {
  const days = new Map(byDay.map((r) => [r.key, r]));
  const dayRows = lastDays(14).map((d) => ({ d, r: days.get(d) }));
  const revenue = (label: string, amount: string): Bar => ({
    label,
    value: Number(amount),
    shown: displayAmount(amount, currency),
    exact: amount,
  });
  return html`<section class="card" aria-labelledby="charts-h"><h2 id="charts-h">Usage</h2>
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
  `Revenue per day (${currency})`,
  dayRows.map(({ d, r }) => revenue(d.slice(5), r?.revenue ?? '0')),
  'chart-revenue-day',
)}
${rankChart(
  'Requests per model (30 days)',
  byModel.map((r) => ({ label: r.key, value: r.requests })),
  'chart-requests-model',
)}
${rankChart(
  'Tokens per model (30 days)',
  byModel.map((r) => ({ label: r.key, value: r.inputTokens + r.outputTokens })),
  'chart-tokens-model',
)}
${rankChart(
  `Revenue per model (30 days, ${currency})`,
  byModel.map((r) => revenue(r.key, r.revenue)),
  'chart-revenue-model',
)}
</div></section>`;
}

/** The provider connection and its form. */
function providerCard(project: ProjectView, kind: string | undefined, csrf: string): Raw {
  const path = projectPath(project.id);
  return html`<section class="card" id="provider" aria-labelledby="provider-h"><h2 id="provider-h">Provider</h2>
<p>${project.provider.baseUrl ? html`Connected to <code>${project.provider.baseUrl}</code> (${kind === 'anthropic' ? "Anthropic's API" : 'OpenAI-compatible'})${project.provider.keySet ? ' with a key (stored encrypted)' : ' without a key'}.` : 'No provider connected yet.'}</p>
<form method="post" action="${path}/provider">${csrfField(csrf)}
<div class="row"><div><label for="kind">Provider API</label><select id="kind" name="kind"><option value="openai-compatible"${kind === 'anthropic' ? '' : ' selected'}>OpenAI-compatible</option><option value="anthropic"${kind === 'anthropic' ? ' selected' : ''}>Anthropic</option></select></div>
<div><label for="baseUrl">Provider base URL</label><input id="baseUrl" name="baseUrl" type="text" value="${project.provider.baseUrl ?? 'https://api.openai.com/v1'}" required></div>
<div><label for="apiKey">Provider API key (paste it again to save)</label><input id="apiKey" name="apiKey" type="password" autocomplete="off" required></div></div>
<button type="submit">Check and save the provider</button></form></section>`;
}

/** The project's name, links and messages. */
function settingsCard(project: ProjectView, csrf: string): Raw {
  const path = projectPath(project.id);
  return html`<section class="card" aria-labelledby="settings-h"><h2 id="settings-h">Settings</h2>
<form method="post" action="${path}/settings">${csrfField(csrf)}
<div class="row"><div><label for="projectName">Project name</label><input id="projectName" name="name" value="${project.name}" required maxlength="200"></div>
<div><label for="checkoutUrl">Checkout URL (top-up links redirect there)</label><input id="checkoutUrl" name="checkoutUrl" type="url" value="${project.settings.checkoutUrl ?? ''}"></div>
<div><label for="returnUrl">Return URL (after connecting)</label><input id="returnUrl" name="returnUrl" type="url" value="${project.settings.returnUrl ?? ''}"></div></div>
<label for="connectMessage">Connect message (<code>{link}</code> is replaced by the link)</label><input id="connectMessage" name="connectMessage" maxlength="2000" value="${project.settings.connectMessage ?? ''}">
<label for="topupMessage">Top-up message (<code>{link}</code> and <code>{amount}</code> are replaced)</label><input id="topupMessage" name="topupMessage" maxlength="2000" value="${project.settings.topupMessage ?? ''}">
<label for="lowBalanceThreshold">Low-balance threshold (<code>balance.low</code> when a charge takes a balance below it; empty: none)</label><input id="lowBalanceThreshold" name="lowBalanceThreshold" inputmode="decimal" value="${project.settings.lowBalanceThreshold ?? ''}">
<label for="debtLimit">Debt limit (how far below zero a request's worst case may take a user; empty: 0)</label><input id="debtLimit" name="debtLimit" inputmode="decimal" value="${project.settings.debtLimit ?? ''}">
<button type="submit">Save the settings</button></form></section>`;
}

/** The reconciliation with the provider's invoice (30 days). */
function reconciliationCard(project: ProjectView, rows: ReconciliationRow[]): Raw {
  const path = projectPath(project.id);
  return html`<section class="card" aria-labelledby="reconciliation-h"><h2 id="reconciliation-h">Reconciliation with the provider (30 days)</h2>
<p class="muted">Charges are the provider's reported usage × your prices. Per day and model: the tokens charged, those the provider reported (compare them with its invoice), estimates where it reported none, what went above the holds or below zero, and the tokens reported above a request's bounds (not charged).</p>
${
  rows.length
    ? dataTable(
        [
          { label: 'Day' },
          { label: 'Model' },
          { label: 'Requests', num: true },
          { label: 'Estimated', num: true },
          { label: 'Provider input tokens', num: true },
          { label: 'Provider output tokens', num: true },
          { label: `Charged (${project.currency})`, num: true },
          { label: 'Above holds', num: true },
          { label: 'Debt', num: true },
          { label: 'Tokens above bounds', num: true },
        ],
        rows.map((r) => [
          r.day,
          html`<code>${r.model}</code>`,
          r.requests,
          r.estimated,
          r.providerInputTokens,
          r.providerOutputTokens,
          money(r.amount, project.currency),
          money(r.overage, project.currency),
          money(r.debt, project.currency),
          r.anomalousTokens,
        ]),
        { id: 'reconciliation' },
      )
    : html`<p>No metered charges in the last 30 days.</p>`
}
${rows.length ? html`<p class="muted">Amounts are shown at the currency's precision (the exact value on hover); the CSV has them exact.</p>` : ''}
<p><a href="${path}/reconciliation.csv">Download as CSV</a></p>
</section>`;
}

/** The API keys: revoke one, create one. */
function keysCard(path: string, keys: KeyRow[], csrf: string): Raw {
  return html`<section class="card" aria-labelledby="keys-h"><h2 id="keys-h">API keys</h2>
${dataTable(
  revocableColumns('Key'),
  revocableRows(
    keys,
    csrf,
    (k) => `${path}/keys/${encodeURIComponent(k.id)}/revoke`,
    (k) => `key ${k.prefix}`,
  ),
)}
<form method="post" action="${path}/keys">${csrfField(csrf)}<div class="row"><div><label for="keyName">New key name</label><input id="keyName" name="name" value="default" required maxlength="200"></div><div><button type="submit">Create an API key</button></div></div></form>
</section>`;
}

export default routeModule((app, ctx) => {
  app.get('/projects/:id', { schema: projectPageSchema }, async (request, reply) => {
    const project = projectView(request.ownedProject);
    const keys = await listApiKeys(ctx, request.developer, project.id);
    const kind = (await ctx.projects.get(project.id))?.providers.get(DEFAULT_PROVIDER)?.kind;
    const [byDay, byModel, reconciliation] = await Promise.all([
      usageReport(ctx, request.ownedProject, { group: 'day', days: 14 }),
      usageReport(ctx, request.ownedProject, { group: 'model', days: 30 }),
      reconciliationReport(ctx, request.ownedProject, { days: 30 }),
    ]);
    const path = projectPath(project.id);
    return projectPage(
      reply,
      { project, title: project.name, heading: project.name, tab: 'Overview' },
      (csrf) => html`
${usageCharts(project.currency, byDay.data, byModel.data)}
${providerCard(project, kind, csrf)}
${settingsCard(project, csrf)}
${reconciliationCard(project, reconciliation.data)}
${keysCard(path, keys.data, csrf)}`,
    );
  });

  app.post(
    '/projects/:id/provider',
    { schema: { params: projectParams, body: providerForm } },
    async (request, reply) => {
      const { baseUrl, apiKey, kind } = request.body;
      await connectProvider(ctx, request.developer, request.params.id, {
        kind,
        baseUrl,
        ...(apiKey ? { apiKey } : {}),
      });
      return reply.redirect(done(projectPath(request.params.id), 'provider_saved'), 303);
    },
  );

  app.get(
    '/projects/:id/reconciliation.csv',
    { schema: { params: projectParams } },
    async (request, reply) => {
      const report = await reconciliationReport(ctx, request.ownedProject, { days: 30 });
      const name = `tollgate-reconciliation-${request.params.id}-30d.csv`;
      return sendCsv(reply, name, reconciliationCsv(report.data));
    },
  );

  app.post(
    '/projects/:id/settings',
    { schema: { params: projectParams, body: settingsForm } },
    async (request, reply) => {
      const { csrf: _csrf, name, ...given } = request.body;
      const settings = Object.fromEntries(Object.entries(given).filter(([, v]) => v !== undefined));
      await updateOwnedProject(ctx, request.developer, request.params.id, { name, settings });
      return reply.redirect(done(projectPath(request.params.id), 'settings_saved'), 303);
    },
  );

  app.post(
    '/projects/:id/keys',
    { schema: { params: projectParams, body: formBody({ name: storableText(200) }) } },
    async (request, reply) => {
      const project = projectView(request.ownedProject);
      const key = await createApiKey(ctx, request.developer, project.id, request.body.name);
      const models = await listModels(ctx, request.developer, project.id);
      return keyPage(request, reply, project, key.key, models.models[0]?.id ?? 'gpt-4o-mini', false);
    },
  );

  app.post(
    '/projects/:id/keys/:key/revoke',
    { schema: projectItemAction('key', 'a key id') },
    async (request, reply) => {
      await revokeApiKey(ctx, request.developer, request.params.id, request.params.key);
      return reply.redirect(done(projectPath(request.params.id), 'key_revoked'), 303);
    },
  );
});
