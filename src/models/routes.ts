import type { FastifyInstance } from 'fastify';
import { notFound } from '../core/errors.ts';
import type { ModelRow } from '../db/schema.ts';
import type { ProjectContext } from '../projects/directory.ts';
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
    pricing: { ...pricingOf(model), currency: project.currency },
    endpoints: endpointsOf(model),
  };
}

export async function modelRoutes(app: FastifyInstance): Promise<void> {
  app.get('/models', async (request) => {
    const project = request.project;
    return { object: 'list', data: [...project.models.values()].map((m) => modelObject(project, m)) };
  });

  app.get<{ Params: { '*': string } }>('/models/*', async (request) => {
    const id = request.params['*'];
    const model = request.project.models.get(id);
    if (!model) throw notFound(`The model '${id}' does not exist`, 'model_not_found', 'model');
    return modelObject(request.project, model);
  });
}
