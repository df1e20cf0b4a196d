import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { notFound } from '../core/errors.ts';
import { textInput } from '../core/validation.ts';
import type { ModelRow } from '../db/schema.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { holdMarginOf } from './hold-margin.ts';
import { endpointsOf, pricingOf } from './pricing.ts';

/**
 * OpenAI's model object, with Tollgate's pricing (decimal strings in the project's currency) and the
 * APIs that serve the model (`endpoints`: `chat` → /v1/chat/completions, `responses` → /v1/responses,
 * `embeddings` → /v1/embeddings) added.
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

const modelParams = z.object({ '*': textInput(255, 'a model id') });

export async function modelRoutes(plain: FastifyInstance): Promise<void> {
  const app = plain.withTypeProvider<ZodTypeProvider>();
  app.get('/models', async (request) => {
    const project = request.project;
    return { object: 'list', data: [...project.models.values()].map((m) => modelObject(project, m)) };
  });

  app.get('/models/*', { schema: { params: modelParams } }, async (request) => {
    const id = request.params['*'];
    const model = request.project.models.get(id);
    if (!model) throw notFound(`The model '${id}' does not exist`, 'model_not_found', 'model');
    return modelObject(request.project, model);
  });
}
