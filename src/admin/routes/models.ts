import { routeModule } from '../../core/plugins.ts';
import { modelSpecSchema, pricingFileSchema } from '../../models/pricing.ts';
import { applyModels, deleteModel, listModels, putModel } from '../service.ts';
import { projectItemParams, projectParams } from './schemas.ts';

/** A project's models and pricing: the whole pricing document, or one model at a time. */
export const modelRoutes = routeModule((app, ctx) => {
  app.get('/projects/:project/models', { schema: { params: projectParams } }, async (request) =>
    listModels(ctx, request.principal, request.ownedProject.id),
  );
  app.put(
    '/projects/:project/models',
    { schema: { params: projectParams, body: pricingFileSchema } },
    async (request) => applyModels(ctx, request.principal, request.ownedProject.id, request.body),
  );
  app.put(
    '/projects/:project/models/:id',
    { schema: { params: projectItemParams, body: modelSpecSchema.omit({ id: true }) } },
    async (request) =>
      putModel(ctx, request.principal, request.ownedProject.id, { ...request.body, id: request.params.id }),
  );
  app.delete('/projects/:project/models/:id', { schema: { params: projectItemParams } }, async (request) =>
    deleteModel(ctx, request.principal, request.ownedProject.id, request.params.id),
  );
});
