import { parseInput } from '../../core/validation.ts';
import type { ProjectLimits } from '../../db/schema.ts';
import { limitsSchema } from '../../models/pricing.ts';
import { Failure } from '../failure.ts';
import { finalized, type KindHandler, normal, synced, updateEvent } from '../handler.ts';
import { type Resource, statusProject } from '../status.ts';
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
  /** Removes the limits if `managedBy` manages them (audited, then published). */
  release(projectId: string, managedBy: string): Promise<boolean>;
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
      return synced(`Limits of ${project.id} are in sync`, { status: { projectId: project.id }, events });
    },
    async finalize(r, h) {
      const projectId = statusProject(r);
      if (!projectId) return [];
      return finalized(
        (await store.release(projectId, h.managedBy)) ? `Removed the limits of ${projectId}` : undefined,
      );
    },
  };
}
