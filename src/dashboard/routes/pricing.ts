import { z } from 'zod';
import { applyModels, deleteModel, listModels, projectView, putModel } from '../../admin/service.ts';
import { routeModule } from '../../core/plugins.ts';
import { parseInput } from '../../core/validation.ts';
import { yaml as yamlLibrary } from '../../core/yaml.ts';
import { dataTable, html } from '../../html/index.ts';
import type { ModelSpec } from '../../models/pricing.ts';
import { modelSpecSchema } from '../../models/pricing.ts';
import { parsePricingFile, pricingSummary } from '../../models/service.ts';
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
function priceFormCard(path: string, currency: string, csrf: string): ReturnType<typeof html> {
  return html`<section class="card"><h2>Set a price</h2>
<form method="post" action="${path}/pricing">${csrfField(csrf)}
<div class="row">
<div><label for="model">Model (what clients send)</label><input id="model" name="model" required maxlength="128" placeholder="gpt-4o-mini"></div>
<div><label for="upstreamModel">Provider model (optional)</label><input id="upstreamModel" name="upstreamModel" maxlength="256" placeholder="the same"></div>
<div><label for="mode">Pricing</label><select id="mode" name="mode" aria-describedby="mode-help"><option value="per_request">Per request</option><option value="per_token">Per token</option><option value="subscription">Subscription</option></select></div>
</div>
<p class="muted" id="mode-help">Fill in the fields of the pricing you chose (the others are ignored); prices are in ${currency}.</p>
<fieldset data-mode="per_request"><legend>If per request</legend>
<div class="row"><div><label for="perRequest">Price per request</label><input id="perRequest" name="perRequest" inputmode="decimal" placeholder="0.01"></div></div>
</fieldset>
<fieldset data-mode="per_token"><legend>If per token</legend>
<div class="row">
<div><label for="inputPerMillion">Input per 1M tokens</label><input id="inputPerMillion" name="inputPerMillion" inputmode="decimal" placeholder="0.15"></div>
<div><label for="outputPerMillion">Output per 1M tokens</label><input id="outputPerMillion" name="outputPerMillion" inputmode="decimal" placeholder="0.60"></div>
<div><label for="cacheWritePerMillion">Cache writes per 1M, 5 min (optional; Claude: 1.25 × input)</label><input id="cacheWritePerMillion" name="cacheWritePerMillion" inputmode="decimal"></div>
<div><label for="cacheWrite1hPerMillion">Cache writes per 1M, 1 h (optional; Claude: 2 × input)</label><input id="cacheWrite1hPerMillion" name="cacheWrite1hPerMillion" inputmode="decimal"></div>
<div><label for="holdMargin">Hold margin (optional, 1 to 10)</label><input id="holdMargin" name="holdMargin" inputmode="decimal" aria-describedby="hold-help"></div>
</div>
<p class="muted" id="hold-help">The prompt Tollgate counts is held times the hold margin, by default the measured one of the provider model's tokenizer family; the charge is always the provider's usage.</p>
</fieldset>
<fieldset data-mode="subscription"><legend>If subscription</legend>
<div class="row">
<div><label for="fee">Subscription fee</label><input id="fee" name="fee" inputmode="decimal" placeholder="10.00"></div>
<div><label for="period">Period</label><input id="period" name="period" placeholder="30d"></div>
</div>
</fieldset>
<div class="row">
<div><label for="maxOutputTokens">Max output tokens (optional; default: the provider model's)</label><input id="maxOutputTokens" name="maxOutputTokens" inputmode="numeric"></div>
<div><label for="contextWindow">Context window (optional; default: the provider model's)</label><input id="contextWindow" name="contextWindow" inputmode="numeric"></div>
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
  app.get('/projects/:id/pricing', { schema: projectPageSchema }, async (request, reply) => {
    const project = projectView(request.ownedProject);
    const pricing = await listModels(ctx, request.developer, project.id);
    const path = projectPath(project.id);
    const managed = project.managedBy.pricing;
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
    : html`${priceFormCard(path, project.currency, csrf)}
<section class="card"><h2>Pricing file</h2>
<p class="muted">The whole pricing as a file (as <code>tollgate models apply</code> takes it): applying it makes the models, their routes and the limits exactly these.</p>
<form method="post" action="${path}/pricing/file">${csrfField(csrf)}
<label for="file">Pricing file (YAML)</label><textarea id="file" name="file" spellcheck="false">${yaml}</textarea>
<button type="submit">Apply the pricing file</button></form></section>`
}`,
    );
  });

  app.post(
    '/projects/:id/pricing',
    { schema: { params: projectParams, body: priceForm } },
    async (request, reply) => {
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
    { schema: { params: projectParams, body: formBody({ file: z.string().max(200_000).default('') }) } },
    async (request, reply) => {
      const file = parsePricingFile(request.body.file);
      await applyModels(ctx, request.developer, request.params.id, file);
      return reply.redirect(done(`${projectPath(request.params.id)}/pricing`, 'pricing_applied'), 303);
    },
  );
});
