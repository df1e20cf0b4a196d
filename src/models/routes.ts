import type { FastifyRequest } from 'fastify';
import { z } from 'zod';
import { notFound } from '../core/errors.ts';
import { routeModule } from '../core/plugins.ts';
import { textInput } from '../core/validation.ts';
import type { ModelRow } from '../db/schema.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { holdMarginOf } from './hold-margin.ts';
import { endpointsOf, pricingOf } from './pricing.ts';

/**
 * OpenAI's model object, with Tollgate's pricing (decimal strings in the project's currency) and the
 * APIs that serve the model (`endpoints`: `chat` → /v1/chat/completions, `responses` → /v1/responses,
 * `embeddings` → /v1/embeddings) added. A client that sends `anthropic-version` (Anthropic's SDKs) gets
 * Anthropic's shapes instead.
 */
export function modelObject(project: ProjectContext, model: ModelRow) {
  return {
    id: model.id,
    object: 'model' as const,
    created: Math.floor(model.created_at.getTime() / 1000),
    owned_by: project.name,
    pricing: { ...pricingOf(model), ...perTokenMargin(model), currency: project.currency },
    endpoints: endpointsOf(model),
  };
}

/** Per-token models show the hold margin in force (the pricing file's, or the tokenizer family's default). */
function perTokenMargin(model: ModelRow): { holdMargin?: string } {
  return model.pricing_mode === 'per_token' ? { holdMargin: holdMarginOf(model).margin } : {};
}

/** Anthropic's model object (its clients send `anthropic-version`), with the same additions. */
export function anthropicModelObject(project: ProjectContext, model: ModelRow) {
  return {
    type: 'model' as const,
    id: model.id,
    display_name: model.id,
    created_at: model.created_at.toISOString(),
    pricing: { ...pricingOf(model), ...perTokenMargin(model), currency: project.currency },
    endpoints: endpointsOf(model),
  };
}

const modelParams = z.object({ '*': textInput(255, 'a model id') });

const fromAnthropicClient = (request: FastifyRequest) => request.headers['anthropic-version'] !== undefined;

export const modelRoutes = routeModule((app) => {
  app.get('/models', async (request) => {
    const project = request.project;
    const models = [...project.models.values()];
    if (fromAnthropicClient(request)) {
      // Anthropic's list shape: one page, newest first.
      const data = models
        .sort((a, b) => b.created_at.getTime() - a.created_at.getTime())
        .map((m) => anthropicModelObject(project, m));
      return { data, has_more: false, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null };
    }
    return { object: 'list', data: models.map((m) => modelObject(project, m)) };
  });

  app.get('/models/*', { schema: { params: modelParams } }, async (request) => {
    const id = request.params['*'];
    const model = request.project.models.get(id);
    if (!model) throw notFound(`The model '${id}' does not exist`, 'model_not_found', 'model');
    if (fromAnthropicClient(request)) return anthropicModelObject(request.project, model);
    return modelObject(request.project, model);
  });
});
