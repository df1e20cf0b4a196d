import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { routeModule } from '../core/plugins.ts';
import { responsesApi } from './api.ts';
import { BACKGROUND_POLL_MS, BackgroundResponses } from './background.ts';

/**
 * `POST /v1/responses` (metered, paywalled: through `app.metering`), and the Responses API's own
 * sub-resources passed through
 * unmetered to providers that support them — only these, as OpenAI's API reference lists them:
 *
 * - `GET /v1/responses/{id}` (retrieve), `DELETE /v1/responses/{id}` (delete)
 * - `POST /v1/responses/{id}/cancel` (cancel a background response)
 * - `GET /v1/responses/{id}/input_items` (list input items)
 *
 * A retrieved (or cancelled) `background` response that is finished settles its charge
 * (./background.ts); a poller on every serving process settles those no client retrieves.
 *
 * The path sent to the provider is rebuilt from the checked id, never copied from the request: an id is
 * letters, digits and `_ - . :` and does not start with a dot, so `.`/`..` segments (raw or
 * percent-encoded), encoded slashes and backslashes cannot reach other provider endpoints with the
 * project's key. Anything else under `/v1/responses/` is 404.
 */
export const responseIdSchema = z
  .string()
  .max(256, { message: 'must be at most 256 characters' })
  .regex(/^[A-Za-z0-9_-][A-Za-z0-9._:-]*$/, {
    message: 'must be a response id (letters, digits, _ - . :), such as resp_abc123',
  });

const idParams = z.object({ id: responseIdSchema });

/** The request's query string as received (`?…`, or empty); never part of the path. */
function queryOf(request: FastifyRequest): string {
  const url = request.raw.url ?? '';
  const at = url.indexOf('?');
  if (at < 0) return '';
  return new URL(url.slice(at), 'http://localhost').search;
}

export const responsesRoutes = routeModule((app, ctx) => {
  const flow = app.metering;
  const background = new BackgroundResponses({
    db: ctx.db,
    billing: ctx.billing,
    projects: ctx.projects,
    log: ctx.log,
    retrieve: (project, path, signal) => flow.retrieve(project, path, signal),
  });
  flow.onPending = (x, id, charged) => background.open(x, id, charged);
  let polling: Promise<unknown> | undefined;
  const timer = setInterval(() => {
    polling ??= background
      .poll()
      .catch((err) => ctx.log.warn({ err }, 'background responses: poll failed; will retry'))
      .finally(() => {
        polling = undefined;
      });
  }, BACKGROUND_POLL_MS);
  timer.unref();
  app.addHook('onClose', async () => {
    clearInterval(timer);
    await polling;
  });

  app.post('/responses', { schema: { body: responsesApi.schema } }, (request, reply) =>
    flow.handle(responsesApi, request.body, request, reply),
  );

  const pass =
    (suffix: string, settles = false) =>
    (request: FastifyRequest, reply: FastifyReply) => {
      const { id } = request.params as { id: string };
      const project = request.project.id;
      return flow.passthrough(
        request,
        reply,
        `/responses/${encodeURIComponent(id)}${suffix}${queryOf(request)}`,
        settles ? (answer) => background.observe(project, answer) : undefined,
      );
    };
  app.get('/responses/:id', { schema: { params: idParams } }, pass('', true));
  app.delete('/responses/:id', { schema: { params: idParams } }, pass(''));
  app.post('/responses/:id/cancel', { schema: { params: idParams } }, pass('/cancel', true));
  app.get('/responses/:id/input_items', { schema: { params: idParams } }, pass('/input_items'));
});
