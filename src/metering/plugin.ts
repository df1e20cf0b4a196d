import type { FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';
import { Limits } from '../limits/index.ts';
import { linkReply } from '../paywall/replies.ts';
import { Router } from '../routing/router.ts';
import { createUpstreamAgent } from '../upstream/openai-compatible.ts';
import { ResponseChains } from './chains.ts';
import { EventsObserver } from './events-observer.ts';
import { MeteredFlow } from './flow.ts';
import { LimitsObserver } from './limits-observer.ts';
import { MetricsObserver } from './metrics-observer.ts';
import { Pending } from './pending.ts';
import { RequestLogObserver } from './request-log.ts';
import { TracingObserver } from './tracing-observer.ts';

declare module 'fastify' {
  interface FastifyInstance {
    /** The metered flow every metered API's routes serve through (src/metering/flow.ts). */
    metering: MeteredFlow;
  }
}

/**
 * The metered flow of a server, built once from `app.ctx` with its observers (limits, metrics, events,
 * tracing), its router and its upstream connection pool, and published as `app.metering` to the scope
 * that registers this plugin. When the server closes, the settles still running are finished (before
 * the database closes), then the connections are closed.
 */
export const metering = fp(
  async (app: FastifyInstance) => {
    const ctx = app.ctx;
    const agent = createUpstreamAgent({
      connectMs: ctx.config.UPSTREAM_CONNECT_TIMEOUT_MS,
      responseMs: ctx.config.UPSTREAM_RESPONSE_TIMEOUT_MS,
      allowPrivate: ctx.config.TOLLGATE_ALLOW_PRIVATE_PROVIDERS,
    });
    const router = new Router(ctx, agent);
    const pending = new Pending(ctx.log);
    const limits = new LimitsObserver(new Limits(ctx));
    const flow = new MeteredFlow(ctx, {
      router,
      paywall: (project, externalId, refusal) => linkReply(ctx, project, externalId, refusal),
      pending,
      chains: new ResponseChains(ctx),
      limits,
      metrics: new MetricsObserver(ctx.metrics),
      events: new EventsObserver(ctx, pending),
      tracing: new TracingObserver(ctx.tracing),
      requestLog: new RequestLogObserver(),
    });
    app.decorate('metering', flow);
    app.addHook('onClose', async () => {
      await flow.idle();
      await Promise.all([agent.close(), router.close(), limits.close()]);
    });
  },
  { name: 'metering' },
);
