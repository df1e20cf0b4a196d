import type { FastifyInstance, FastifyPluginAsync } from 'fastify';

/** How a scope registers its route modules and plugins: all of them, in order, with `registerAll`. */

/** Registers `plugins` in `app`, one after the other, each awaited as `await app.register(plugin)` would be. */
export async function registerAll(
  app: FastifyInstance,
  plugins: readonly FastifyPluginAsync[],
): Promise<void> {
  for (const plugin of plugins) await app.register(plugin);
}
