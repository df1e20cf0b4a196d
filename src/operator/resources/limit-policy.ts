import { parseInput } from '../../core/validation.ts';
import type { ProjectLimits } from '../../db/schema.ts';
import { limitsSchema } from '../../models/pricing.ts';
import { Failure } from '../failure.ts';
import { finalized, type KindHandler, normal, projectChanged, synced, updateEvent } from '../handler.ts';
import type { Resource } from '../status.ts';
import { canonical, type ProjectLookup, type ProjectRef, projectOf, projectScoped } from './common.ts';

/** The LimitPolicy kind: the limits of a project. */

export interface LimitPolicySpec extends ProjectRef, ProjectLimits {}

/** The projects' limits as the LimitPolicy handler reads and writes them. */
export interface LimitPolicyStore extends ProjectLookup {
  current(projectId: string): Promise<{ limits: ProjectLimits | null; managedBy: string | null }>;
  /** Sets the limits, then publishes them; `replaced`: the limits before, audited (undefined: unchanged). */
  set(
    projectId: string,
    limits: ProjectLimits,
    managedBy: string,
    replaced: ProjectLimits | null | undefined,
  ): Promise<void>;
  /**
   * Removes the limits of every project whose limits `managedBy` manages but `keep`, and hands them back
   * (audited, then published): the projects released.
   */
  release(managedBy: string, keep?: string): Promise<string[]>;
}

export function limitPolicyHandler(store: LimitPolicyStore): KindHandler<Resource<LimitPolicySpec>> {
  return {
    ...projectScoped<Resource<LimitPolicySpec>>('LimitPolicy', 'limitpolicies'),
    async sync(r, h) {
      const project = await projectOf(store, r);
      const { projectRef: _ref, ...declared } = r.spec ?? {};
      let limits: ProjectLimits;
      try {
        limits = parseInput(limitsSchema, declared, 'spec') as ProjectLimits;
      } catch (err) {
        throw new Failure('InvalidSpec', (err as Error).message, false);
      }
      const current = await store.current(project.id);
      const changed = canonical(current.limits) !== canonical(limits);
      const events = [];
      if (current.managedBy !== h.managedBy || changed) {
        await store.set(project.id, limits, h.managedBy, changed ? current.limits : undefined);
        events.push(
          current.managedBy !== h.managedBy
            ? normal('Applied', `Applied the limits of ${project.id}`)
            : updateEvent(r, `the limits of ${project.id}`),
        );
      }
      // Its Project was re-created (a new project): the limits moved there, the old project's go.
      const left = await store.release(h.managedBy, project.id);
      if (left.length) events.push(projectChanged(project.id, `removed the limits of ${left.join(', ')}`));
      return synced(`Limits of ${project.id} are in sync`, { status: { projectId: project.id }, events });
    },
    async finalize(_r, h) {
      const left = await store.release(h.managedBy);
      return finalized(left.length ? `Removed the limits of ${left.join(', ')}` : undefined);
    },
    async orphan(managedBy) {
      await store.release(managedBy);
    },
  };
}
