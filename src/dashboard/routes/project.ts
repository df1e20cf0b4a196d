import type { FastifyReply, FastifyRequest } from 'fastify';
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
import { type FormSpec, formView, invalidBody, type Refused, refusedBy } from '../forms.ts';
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

/** The overview's forms, refused ones shown again in place (../forms.ts). */
const FORMS = {
  provider: {
    name: 'provider',
    fields: {
      kind: { id: 'kind', label: 'Provider API' },
      baseUrl: { id: 'baseUrl', label: 'Provider base URL' },
      apiKey: { id: 'apiKey', label: 'Provider API key', secret: true },
    },
  },
  settings: {
    name: 'settings',
    fields: {
      name: { id: 'projectName', label: 'Project name' },
      checkoutUrl: { id: 'checkoutUrl', label: 'Checkout URL' },
      returnUrl: { id: 'returnUrl', label: 'Return URL' },
      connectMessage: { id: 'connectMessage', label: 'Connect message' },
      topupMessage: { id: 'topupMessage', label: 'Top-up message' },
      lowBalanceThreshold: { id: 'lowBalanceThreshold', label: 'Low-balance threshold' },
      debtLimit: { id: 'debtLimit', label: 'Debt limit' },
    },
  },
  key: { name: 'key', fields: { name: { id: 'keyName', label: 'Key name' } } },
} satisfies Record<string, FormSpec>;

const keyForm = formBody({ name: storableText(200) });

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
function providerCard(project: ProjectView, kind: string | undefined, csrf: string, refused?: Refused): Raw {
  const path = projectPath(project.id);
  const f = formView(FORMS.provider, refused);
  const anthropic = kind === 'anthropic';
  return html`<section class="card" id="provider" aria-labelledby="provider-h"><h2 id="provider-h">Provider</h2>
<p>${project.provider.baseUrl ? html`Connected to <code>${project.provider.baseUrl}</code> (${kind === 'anthropic' ? "Anthropic's API" : 'OpenAI-compatible'})${project.provider.keySet ? ' with a key (stored encrypted)' : ' without a key'}.` : 'No provider connected yet.'}</p>
<form method="post" action="${path}/provider">${csrfField(csrf)}${f.alert()}
<div class="row"><div><label for="kind">Provider API</label><select id="kind" name="kind"${f.invalid('kind')}><option value="openai-compatible"${f.selected('kind', 'openai-compatible', !anthropic)}>OpenAI-compatible</option><option value="anthropic"${f.selected('kind', 'anthropic', anthropic)}>Anthropic</option></select>${f.error('kind')}</div>
<div><label for="baseUrl">Provider base URL</label><input id="baseUrl" name="baseUrl" type="text" required${f.input('baseUrl', project.provider.baseUrl ?? 'https://api.openai.com/v1')}>${f.error('baseUrl')}</div>
<div><label for="apiKey">Provider API key (paste it again to save)</label><input id="apiKey" name="apiKey" type="password" autocomplete="off" required${f.invalid('apiKey')}>${f.error('apiKey')}</div></div>
<button type="submit">Check and save the provider</button></form></section>`;
}

/** The project's name, links and messages. */
function settingsCard(project: ProjectView, csrf: string, refused?: Refused): Raw {
  const path = projectPath(project.id);
  const f = formView(FORMS.settings, refused);
  const s = project.settings;
  return html`<section class="card" aria-labelledby="settings-h"><h2 id="settings-h">Settings</h2>
<form method="post" action="${path}/settings">${csrfField(csrf)}${f.alert()}
<div class="row"><div><label for="projectName">Project name</label><input id="projectName" name="name" required maxlength="200"${f.input('name', project.name)}>${f.error('name')}</div>
<div><label for="checkoutUrl">Checkout URL (top-up links redirect there)</label><input id="checkoutUrl" name="checkoutUrl" type="url"${f.input('checkoutUrl', s.checkoutUrl ?? '')}>${f.error('checkoutUrl')}</div>
<div><label for="returnUrl">Return URL (after connecting)</label><input id="returnUrl" name="returnUrl" type="url"${f.input('returnUrl', s.returnUrl ?? '')}>${f.error('returnUrl')}</div></div>
<label for="connectMessage">Connect message (<code>{link}</code> is replaced by the link)</label><input id="connectMessage" name="connectMessage" maxlength="2000"${f.input('connectMessage', s.connectMessage ?? '')}>${f.error('connectMessage')}
<label for="topupMessage">Top-up message (<code>{link}</code> and <code>{amount}</code> are replaced)</label><input id="topupMessage" name="topupMessage" maxlength="2000"${f.input('topupMessage', s.topupMessage ?? '')}>${f.error('topupMessage')}
<label for="lowBalanceThreshold">Low-balance threshold (<code>balance.low</code> when a charge takes a balance below it; empty: none)</label><input id="lowBalanceThreshold" name="lowBalanceThreshold" inputmode="decimal"${f.input('lowBalanceThreshold', s.lowBalanceThreshold ?? '')}>${f.error('lowBalanceThreshold')}
<label for="debtLimit">Debt limit (how far below zero a request's worst case may take a user; empty: 0)</label><input id="debtLimit" name="debtLimit" inputmode="decimal"${f.input('debtLimit', s.debtLimit ?? '')}>${f.error('debtLimit')}
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
function keysCard(path: string, keys: KeyRow[], csrf: string, refused?: Refused): Raw {
  const f = formView(FORMS.key, refused);
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
<form method="post" action="${path}/keys">${csrfField(csrf)}${f.alert()}<div class="row"><div><label for="keyName">New key name</label><input id="keyName" name="name" required maxlength="200"${f.input('name', 'default')}>${f.error('name')}</div><div><button type="submit">Create an API key</button></div></div></form>
</section>`;
}

/** The overview, with its refused form (provider, settings, a new key) shown again. */
async function overview(request: FastifyRequest, reply: FastifyReply, refused?: Refused) {
  const ctx = request.server.ctx;
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
${providerCard(project, kind, csrf, refused)}
${settingsCard(project, csrf, refused)}
${reconciliationCard(project, reconciliation.data)}
${keysCard(path, keys.data, csrf, refused)}`,
    { status: refused ? 400 : 200 },
  );
}

export default routeModule((app, ctx) => {
  app.get('/projects/:id', { schema: projectPageSchema }, async (request, reply) => overview(request, reply));

  app.post(
    '/projects/:id/provider',
    { schema: { params: projectParams, body: providerForm }, attachValidation: true },
    async (request, reply) => {
      if (request.validationError)
        return overview(request, reply, invalidBody(FORMS.provider, providerForm, request));
      const { baseUrl, apiKey, kind } = request.body;
      try {
        await connectProvider(ctx, request.developer, request.params.id, {
          kind,
          baseUrl,
          ...(apiKey ? { apiKey } : {}),
        });
      } catch (err) {
        return overview(request, reply, refusedBy(FORMS.provider, err, request.body));
      }
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
    { schema: { params: projectParams, body: settingsForm }, attachValidation: true },
    async (request, reply) => {
      if (request.validationError)
        return overview(request, reply, invalidBody(FORMS.settings, settingsForm, request));
      const { csrf: _csrf, name, ...given } = request.body;
      const settings = Object.fromEntries(Object.entries(given).filter(([, v]) => v !== undefined));
      try {
        await updateOwnedProject(ctx, request.developer, request.params.id, { name, settings });
      } catch (err) {
        return overview(request, reply, refusedBy(FORMS.settings, err, request.body));
      }
      return reply.redirect(done(projectPath(request.params.id), 'settings_saved'), 303);
    },
  );

  app.post(
    '/projects/:id/keys',
    { schema: { params: projectParams, body: keyForm }, attachValidation: true },
    async (request, reply) => {
      if (request.validationError) return overview(request, reply, invalidBody(FORMS.key, keyForm, request));
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
