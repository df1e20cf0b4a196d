import type {
  FastifyBaseLogger,
  FastifyInstance,
  FastifyPluginAsync,
  RawReplyDefaultExpression,
  RawRequestDefaultExpression,
  RawServerDefault,
} from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';

/**
 * How route modules are written and registered: a module is `routeModule((app, ctx) => …)`, its routes
 * typed by their zod schemas; a scope registers its modules, in order, with `registerAll`.
 */

/** The instance a route module declares its routes on: request and reply types come from zod schemas. */
export type RouteApp = FastifyInstance<
  RawServerDefault,
  RawRequestDefaultExpression,
  RawReplyDefaultExpression,
  FastifyBaseLogger,
  ZodTypeProvider
>;

/** A fastify plugin that declares routes on `app`, with the application's services `ctx` (`app.ctx`). */
export function routeModule(
  declare: (app: RouteApp, ctx: FastifyInstance['ctx']) => void | Promise<void>,
): FastifyPluginAsync {
  return async (plain) => {
    const app = plain.withTypeProvider<ZodTypeProvider>();
    await declare(app, app.ctx);
  };
}

/** Registers `plugins` in `app`, one after the other, each awaited as `await app.register(plugin)` would be. */
export async function registerAll(
  app: FastifyInstance,
  plugins: readonly FastifyPluginAsync[],
): Promise<void> {
  for (const plugin of plugins) await app.register(plugin);
}
