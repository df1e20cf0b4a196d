import { z } from 'zod';
import { routeModule } from '../../core/plugins.ts';
import { storableText } from '../../core/validation.ts';
import { projectSettingsSchema } from '../../projects/service.ts';
import {
  connectProvider,
  createApiKey,
  createOwnedProject,
  createProjectBody,
  listApiKeys,
  listProjects,
  projectView,
  providerBody,
  revokeApiKey,
  updateOwnedProject,
} from '../service.ts';
import { createStarterProject } from '../starter.ts';
import { nameBody, pageQuery, projectItemParams, projectParams } from './schemas.ts';

/** Projects: the principal's list and a new project (`projectListRoutes`); one project, its provider and API keys. */

const updateProjectBody = z.strictObject({
  name: storableText(200).optional(),
  settings: projectSettingsSchema.partial().optional(),
});

export const projectListRoutes = routeModule((app, ctx) => {
  app.get('/projects', { schema: { querystring: pageQuery } }, async (request) =>
    listProjects(ctx, request.principal, {
      limit: request.query.limit,
      startingAfter: request.query.starting_after,
    }),
  );
  app.post('/projects', { schema: { body: createProjectBody } }, async (request, reply) => {
    reply.status(201);
    const { starter, ...input } = request.body;
    return starter
      ? createStarterProject(ctx, request.principal, input)
      : createOwnedProject(ctx, request.principal, input);
  });
});

export const projectRoutes = routeModule((app, ctx) => {
  app.get('/projects/:project', { schema: { params: projectParams } }, async (request) =>
    projectView(request.ownedProject),
  );
  app.patch(
    '/projects/:project',
    { schema: { params: projectParams, body: updateProjectBody } },
    async (request) => updateOwnedProject(ctx, request.principal, request.ownedProject.id, request.body),
  );
  app.put(
    '/projects/:project/provider',
    { schema: { params: projectParams, body: providerBody } },
    async (request) => connectProvider(ctx, request.principal, request.ownedProject.id, request.body),
  );

  app.get('/projects/:project/keys', { schema: { params: projectParams } }, async (request) =>
    listApiKeys(ctx, request.principal, request.ownedProject.id),
  );
  app.post(
    '/projects/:project/keys',
    { schema: { params: projectParams, body: nameBody } },
    async (request, reply) => {
      reply.status(201);
      return createApiKey(ctx, request.principal, request.ownedProject.id, request.body.name);
    },
  );
  app.delete('/projects/:project/keys/:id', { schema: { params: projectItemParams } }, async (request) =>
    revokeApiKey(ctx, request.principal, request.ownedProject.id, request.params.id),
  );
});
