import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { textInput } from '../core/validation.ts';
import { portalLink } from './pages.ts';
import { RechargeService } from './recharge.ts';
import { handleWebhook, type PaymentsContext } from './service.ts';

const rechargeServices = new WeakMap<object, RechargeService>();

/** The auto-recharge runner of a server's context (src/payments/recharge.ts), once its routes are up. */
export function rechargeServiceOf(ctx: object): RechargeService | undefined {
  return rechargeServices.get(ctx);
}

/**
 * `POST /payments/stripe/{projectId}/webhook` — the receiver of the developer's Stripe account's
 * webhooks for one project (no API key: the `Stripe-Signature` header, checked against the project's
 * sealed signing secret, is the credential). The body is kept raw: the signature covers its bytes.
 */
export async function paymentWebhookRoutes(app: FastifyInstance): Promise<void> {
  const ctx = app.ctx;
  // Auto-recharge watches every committed debit of this process, and finishes its work before closing.
  const recharges = new RechargeService(ctx as PaymentsContext);
  rechargeServices.set(ctx, recharges);
  const stopWatching = ctx.billing.onDebit(recharges.onDebit);
  app.addHook('onClose', async () => {
    stopWatching();
    await recharges.idle();
  });
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: 1024 * 1024 }, (_request, body, done) => {
    done(null, body);
  });
  const routes = app.withTypeProvider<ZodTypeProvider>();
  // The project id is checked like every id in a path (no control characters: 400, not a database error).
  const params = z.object({ project: textInput(255, 'a project id') });
  routes.post('/payments/stripe/:project/webhook', { schema: { params } }, async (request, reply) => {
    const body = Buffer.isBuffer(request.body) ? request.body : Buffer.alloc(0);
    const signature = request.headers['stripe-signature'];
    const outcome = await handleWebhook(
      ctx,
      request.params.project,
      body,
      typeof signature === 'string' ? signature : undefined,
    );
    return reply.status(outcome.status).send(outcome.body);
  });
}

const userBody = z.strictObject({ user: textInput(256, 'your end user’s id') });

/** `POST /v1/user/portal` — a signed link to the user's portal (balance, top-ups with receipts, usage). */
export async function paymentUserRoutes(plain: FastifyInstance): Promise<void> {
  const app = plain.withTypeProvider<ZodTypeProvider>();
  const ctx = app.ctx;
  app.post('/user/portal', { schema: { body: userBody } }, async (request) => {
    const { user } = request.body;
    return { object: 'user.portal_link', user, ...portalLink(ctx, request.project.id, user) };
  });
}
