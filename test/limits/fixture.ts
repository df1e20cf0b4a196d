import type { AppContext } from '../../src/app/context.ts';
import type { ModelSpec } from '../../src/models/pricing.ts';
import { getProject } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';
import { seedProject, startPods, type TestServer, testTrigger } from '../helpers/server.ts';

/**
 * The limits tests' set-up: `podCount` servers on one schema and one set of bus channels (pods of one
 * deployment), a mock upstream, and a project on it priced with `models`.
 */
export interface Pods {
  pods: TestServer[];
  mock: MockUpstream;
  /** The first pod's context. */
  ctx: AppContext;
  projectId: string;
  apiKey: string;
  /** Connects the user and deposits `amount`. */
  fund(user: string, amount: string): Promise<void>;
  close(): Promise<void>;
}

export async function startPricedPods(
  env: Record<string, string>,
  podCount: number,
  models: ModelSpec[],
): Promise<Pods> {
  const pods = await startPods(env, podCount);
  const mock = await startMockUpstream();
  const ctx = pods[0]!.ctx;
  const seeded = await seedProject(ctx, { upstreamUrl: mock.baseUrl, models });
  return {
    pods,
    mock,
    ctx,
    projectId: seeded.projectId,
    apiKey: seeded.apiKey,
    async fund(user, amount) {
      const project = await getProject(ctx.db, seeded.projectId);
      await connectUser(ctx.db, ctx.events, project, user, testTrigger);
      await ctx.billing.deposit({ project, externalId: user, amount, source: 'test', trigger: testTrigger });
    },
    async close() {
      for (const pod of pods) await pod.close();
      await mock.close();
    },
  };
}
