import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { applyModels, deleteModel, listModels, projectView, putModel } from '../../admin/service.ts';
import { routeModule } from '../../core/plugins.ts';
import { parseInput } from '../../core/validation.ts';
import { yaml as yamlLibrary } from '../../core/yaml.ts';
import { dataTable, html, raw } from '../../html/index.ts';
import type { ModelSpec } from '../../models/pricing.ts';
import { modelSpecSchema } from '../../models/pricing.ts';
import { parsePricingFile, pricingSummary } from '../../models/service.ts';
import { type FormSpec, formView, invalidBody, type Refused, refusedBy } from '../forms.ts';
import {
  csrfField,
  done,
  formBody,
  projectItemAction,
  projectPage,
  projectPageSchema,
  projectParams,
  projectPath,
} from '../pages.ts';

/** A project's pricing (`/dashboard/projects/:id/pricing`): the models, one price, the whole file. */

const field = z.string().max(256).optional();
const priceForm = formBody({
  model: field,
  upstreamModel: field,
  mode: z.enum(['per_request', 'per_token', 'subscription']).default('per_request'),
  perRequest: field,
  inputPerMillion: field,
  outputPerMillion: field,
  cacheWritePerMillion: field,
  cacheWrite1hPerMillion: field,
  holdMargin: field,
  fee: field,
  period: field,
  maxOutputTokens: field,
  contextWindow: field,
});

const fileForm = formBody({ file: z.string().max(200_000).default('') });

/** The pricing page's forms, refused ones shown again in place (../forms.ts). */
const FORMS = {
  price: {
    name: 'price',
    fields: {
      model: { id: 'model', label: 'Model' },
      upstreamModel: { id: 'upstreamModel', label: 'Provider model' },
      mode: { id: 'mode', label: 'Pricing', help: 'mode-help' },
      perRequest: { id: 'perRequest', label: 'Price per request' },
      inputPerMillion: { id: 'inputPerMillion', label: 'Input per 1M tokens' },
      outputPerMillion: { id: 'outputPerMillion', label: 'Output per 1M tokens' },
      cacheWritePerMillion: { id: 'cacheWritePerMillion', label: 'Cache writes per 1M, 5 min' },
      cacheWrite1hPerMillion: { id: 'cacheWrite1hPerMillion', label: 'Cache writes per 1M, 1 h' },
      holdMargin: { id: 'holdMargin', label: 'Hold margin', help: 'hold-help' },
      fee: { id: 'fee', label: 'Subscription fee' },
      period: { id: 'period', label: 'Period' },
      maxOutputTokens: { id: 'maxOutputTokens', label: 'Max output tokens' },
      contextWindow: { id: 'contextWindow', label: 'Context window' },
    },
    params: { id: 'model' },
  },
  file: { name: 'file', fields: { file: { id: 'file', label: 'Pricing file' } } },
} satisfies Record<string, FormSpec>;

/** The priced models, each deletable unless a resource manages the pricing. */
function modelsCard(
  path: string,
  currency: string,
  models: ModelSpec[],
  managed: string | null,
  csrf: string,
): ReturnType<typeof html> {
  return html`<section class="card"><h2>Models</h2>
${
  models.length
    ? dataTable(
        [
          { label: 'Model' },
          { label: 'Provider model' },
          { label: `Price (${currency})` },
          { label: 'APIs' },
          { label: 'Action', action: true },
        ],
        models.map((m) => [
          html`<code>${m.id}</code>`,
          html`<code>${m.upstreamModel ?? m.id}</code>`,
          pricingSummary(m.pricing, '; '),
          (m.endpoints ?? []).join(', '),
          managed
            ? ''
            : html`<form method="post" action="${path}/pricing/${encodeURIComponent(m.id)}/delete">${csrfField(csrf)}<button type="submit" class="secondary" aria-label="Delete model ${m.id}">Delete</button></form>`,
        ]),
      )
    : html`<p>No models yet: clients can use only the models priced here.</p>`
}</section>`;
}

/**
 * The form that sets one model's price. Each pricing mode's fields are in a fieldset of their own:
 * the style sheet shows the chosen mode's only (CSS `:has()`, no script); without it, all of them,
 * each labelled with its mode.
 */
function priceFormCard(
  path: string,
  currency: string,
  csrf: string,
  refused?: Refused,
): ReturnType<typeof html> {
  const f = formView(FORMS.price, refused);
  /** A price field: its input, what was typed, its problem. */
  const input = (name: keyof typeof FORMS.price.fields, label: string, attrs: string) =>
    html`<div><label for="${name}">${label}</label><input id="${name}" name="${name}"${raw(attrs)}${f.input(name)}>${f.error(name)}</div>`;
  return html`<section class="card"><h2>Set a price</h2>
<form method="post" action="${path}/pricing">${csrfField(csrf)}${f.alert()}
<div class="row">
${input('model', 'Model (what clients send)', ' required maxlength="128" placeholder="gpt-4o-mini"')}
${input('upstreamModel', 'Provider model (optional)', ' maxlength="256" placeholder="the same"')}
<div><label for="mode">Pricing</label><select id="mode" name="mode"${f.invalid('mode')}><option value="per_request"${f.selected('mode', 'per_request', true)}>Per request</option><option value="per_token"${f.selected('mode', 'per_token', false)}>Per token</option><option value="subscription"${f.selected('mode', 'subscription', false)}>Subscription</option></select>${f.error('mode')}</div>
</div>
<p class="muted" id="mode-help">Fill in the fields of the pricing you chose (the others are ignored); prices are in ${currency}.</p>
<fieldset data-mode="per_request"><legend>If per request</legend>
<div class="row">${input('perRequest', 'Price per request', ' inputmode="decimal" placeholder="0.01"')}</div>
</fieldset>
<fieldset data-mode="per_token"><legend>If per token</legend>
<div class="row">
${input('inputPerMillion', 'Input per 1M tokens', ' inputmode="decimal" placeholder="0.15"')}
${input('outputPerMillion', 'Output per 1M tokens', ' inputmode="decimal" placeholder="0.60"')}
${input('cacheWritePerMillion', 'Cache writes per 1M, 5 min (optional; Claude: 1.25 × input)', ' inputmode="decimal"')}
${input('cacheWrite1hPerMillion', 'Cache writes per 1M, 1 h (optional; Claude: 2 × input)', ' inputmode="decimal"')}
${input('holdMargin', 'Hold margin (optional, 1 to 10)', ' inputmode="decimal"')}
</div>
<p class="muted" id="hold-help">The prompt Tollgate counts is held times the hold margin, by default the measured one of the provider model's tokenizer family; the charge is always the provider's usage.</p>
</fieldset>
<fieldset data-mode="subscription"><legend>If subscription</legend>
<div class="row">
${input('fee', 'Subscription fee', ' inputmode="decimal" placeholder="10.00"')}
${input('period', 'Period', ' placeholder="30d"')}
</div>
</fieldset>
<div class="row">
${input('maxOutputTokens', "Max output tokens (optional; default: the provider model's)", ' inputmode="numeric"')}
${input('contextWindow', "Context window (optional; default: the provider model's)", ' inputmode="numeric"')}
</div>
<button type="submit">Save the price</button></form></section>`;
}

/** The form's token limits, as numbers when given (the schema says what is wrong with them). */
function tokenLimits(maxOutputTokens: string | undefined, contextWindow: string | undefined) {
  const num = (value: string) => (/^\d+$/.test(value) ? Number(value) : value);
  return {
    ...(maxOutputTokens ? { maxOutputTokens: num(maxOutputTokens) } : {}),
    ...(contextWindow ? { contextWindow: num(contextWindow) } : {}),
  };
}

export default routeModule((app, ctx) => {
  /** The pricing page, with its refused form (a price, the file) shown again. */
  async function pricingPage(request: FastifyRequest, reply: FastifyReply, refused?: Refused) {
    const project = projectView(request.ownedProject);
    const pricing = await listModels(ctx, request.developer, project.id);
    const path = projectPath(project.id);
    const managed = project.managedBy.pricing;
    const file = formView(FORMS.file, refused);
    const yaml = yamlLibrary().stringify({
      currency: pricing.currency,
      models: pricing.models,
      ...(pricing.limits ? { limits: pricing.limits } : {}),
    });
    return projectPage(
      reply,
      { project, title: `Pricing · ${project.name}`, heading: 'Pricing', tab: 'Pricing' },
      (csrf) => html`
${
  managed
    ? html`<section class="card" role="note"><p>This pricing is declared by the Kubernetes resource <code>${managed}</code>: change it there (a reviewed change in Git), not here.</p></section>`
    : ''
}
${modelsCard(path, project.currency, pricing.models, managed, csrf)}
${
  managed
    ? ''
    : html`${priceFormCard(path, project.currency, csrf, refused)}
<section class="card"><h2>Pricing file</h2>
<p class="muted">The whole pricing as a file (as <code>tollgate models apply</code> takes it): applying it makes the models, their routes and the limits exactly these.</p>
<form method="post" action="${path}/pricing/file">${csrfField(csrf)}${file.alert()}
<label for="file">Pricing file (YAML)</label><textarea id="file" name="file" spellcheck="false"${file.invalid('file')}>${file.value('file', yaml)}</textarea>${file.error('file')}
<button type="submit">Apply the pricing file</button></form></section>`
}`,
      { status: refused ? 400 : 200 },
    );
  }

  app.get('/projects/:id/pricing', { schema: projectPageSchema }, async (request, reply) =>
    pricingPage(request, reply),
  );

  app.post(
    '/projects/:id/pricing',
    { schema: { params: projectParams, body: priceForm }, attachValidation: true },
    async (request, reply) => {
      if (request.validationError)
        return pricingPage(request, reply, invalidBody(FORMS.price, priceForm, request));
      const path = `${projectPath(request.params.id)}/pricing`;
      const f = request.body;
      const v = (name: keyof typeof f) => {
        const value = f[name]?.trim();
        return value ? value : undefined;
      };
      const pricing =
        f.mode === 'per_token'
          ? {
              mode: 'per_token',
              inputPerMillion: v('inputPerMillion'),
              outputPerMillion: v('outputPerMillion'),
              cacheWritePerMillion: v('cacheWritePerMillion'),
              cacheWrite1hPerMillion: v('cacheWrite1hPerMillion'),
              holdMargin: v('holdMargin'),
            }
          : f.mode === 'subscription'
            ? { mode: 'subscription', fee: v('fee'), period: v('period') }
            : { mode: 'per_request', perRequest: v('perRequest') };
      try {
        const spec = parseInput(
          modelSpecSchema,
          {
            id: v('model'),
            ...(v('upstreamModel') ? { upstreamModel: v('upstreamModel') } : {}),
            pricing: Object.fromEntries(Object.entries(pricing).filter(([, x]) => x !== undefined)),
            ...tokenLimits(v('maxOutputTokens'), v('contextWindow')),
          },
          'form',
        );
        await putModel(ctx, request.developer, request.params.id, spec);
      } catch (err) {
        return pricingPage(request, reply, refusedBy(FORMS.price, err, f));
      }
      return reply.redirect(done(path, 'price_saved'), 303);
    },
  );

  app.post(
    '/projects/:id/pricing/:model/delete',
    { schema: projectItemAction('model', 'a model id') },
    async (request, reply) => {
      await deleteModel(ctx, request.developer, request.params.id, request.params.model);
      return reply.redirect(done(`${projectPath(request.params.id)}/pricing`, 'model_deleted'), 303);
    },
  );

  app.post(
    '/projects/:id/pricing/file',
    { schema: { params: projectParams, body: fileForm }, attachValidation: true },
    async (request, reply) => {
      if (request.validationError)
        return pricingPage(request, reply, invalidBody(FORMS.file, fileForm, request));
      try {
        const file = parsePricingFile(request.body.file);
        await applyModels(ctx, request.developer, request.params.id, file);
      } catch (err) {
        return pricingPage(request, reply, refusedBy(FORMS.file, err, request.body));
      }
      return reply.redirect(done(`${projectPath(request.params.id)}/pricing`, 'pricing_applied'), 303);
    },
  );
});
