import { routeModule } from '../core/plugins.ts';
import { addFastPath } from '../core/validation.ts';
import { chatApi } from './api.ts';
import { fastChatRequest } from './schema-fast.ts';

/**
 * `POST /v1/chat/completions` (registered inside the authenticated `/v1` scope), served by the metered
 * flow the server publishes as `app.metering` (src/metering/plugin.ts).
 */
export const chatRoutes = routeModule((app) => {
  const flow = app.metering;
  // The common request is checked without zod (./schema-fast.ts); the rest by the schema.
  addFastPath(chatApi.schema, fastChatRequest);
  app.post('/chat/completions', { schema: { body: chatApi.schema } }, (request, reply) =>
    flow.handle(chatApi, request.body, request, reply),
  );
});
