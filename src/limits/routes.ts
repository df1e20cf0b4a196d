import { z } from 'zod';
import { routeModule } from '../core/plugins.ts';
import { userIdSchema } from '../users/schema.ts';
import { chargedSince, periodOf, setUserSpendCaps, spendCapsSchema } from './spend.ts';

/**
 * `/v1/user/spend-caps`: a user's own spend caps (over the project's, field by field), and what they
 * spent in the current day and month.
 */
const capsBody = spendCapsSchema.extend({ user: userIdSchema });
const userQuery = z.strictObject({ user: userIdSchema });

export const spendCapRoutes = routeModule((app, ctx) => {
  const view = async (projectId: string, user: string) => {
    const project = await ctx.projects.get(projectId);
    const own = project?.spendCaps.get(user);
    const base = project?.limits?.spend;
    const day = periodOf('day');
    const month = periodOf('month');
    const [spentToday, spentThisMonth] = await Promise.all([
      chargedSince(ctx.db, projectId, user, day.start),
      chargedSince(ctx.db, projectId, user, month.start),
    ]);
    return {
      object: 'spend_caps',
      user,
      daily: own?.daily ?? base?.daily ?? null,
      monthly: own?.monthly ?? base?.monthly ?? null,
      override: { daily: own?.daily ?? null, monthly: own?.monthly ?? null },
      spent: { day: spentToday, month: spentThisMonth },
      resetsAt: { day: day.end.toISOString(), month: month.end.toISOString() },
      currency: project?.currency ?? null,
    };
  };

  app.get('/user/spend-caps', { schema: { querystring: userQuery } }, async (request) =>
    view(request.project.id, request.query.user),
  );

  app.post('/user/spend-caps', { schema: { body: capsBody } }, async (request) => {
    const { user, ...caps } = request.body;
    await setUserSpendCaps(ctx.db, request.project.id, user, caps, {
      actor: { type: 'api_key', id: request.apiKeyId, ip: request.ip, via: 'v1' },
    });
    await ctx.projects.changed(request.project.id);
    return view(request.project.id, user);
  });
});
