import { formatAmount } from '../../core/money.ts';
import type { Project, ProjectSettings } from '../../db/schema.ts';
import { Failure } from '../failure.ts';
import { finalized, type KindHandler, normal, synced, updateEvent } from '../handler.ts';
import type { Resource } from '../status.ts';
import { canonical, finalizerOf } from './common.ts';

/** The Project kind: a project whose name, currency and settings the resource declares. */

export interface ProjectSpec {
  displayName?: string;
  currency?: string;
  ownerUserId?: string;
  settings?: ProjectSettings;
}

/** The projects table as the Project handler reads and writes it (the writes audited, then published). */
export interface ProjectStore {
  findByManager(managedBy: string): Promise<Project | undefined>;
  create(
    input: { name: string; currency: string; settings: ProjectSettings; ownerUserId?: string },
    managedBy: string,
  ): Promise<Project>;
  update(
    before: Project,
    input: { name: string; settings: ProjectSettings },
    managedBy: string,
  ): Promise<Project>;
  /** Hands the project back to hand editing: its balances and ledger stay. */
  release(project: Project, managedBy: string): Promise<void>;
}

/** Settings as the database keeps them (the debt limit as a canonical decimal: "1.00" is "1"). */
function normalSettings(settings: ProjectSettings): ProjectSettings {
  const debtLimit = settings.debtLimit;
  if (typeof debtLimit !== 'string' || !/^\d+(\.\d+)?$/.test(debtLimit)) return settings;
  return { ...settings, debtLimit: formatAmount(debtLimit) };
}

export function projectHandler(store: ProjectStore): KindHandler<Resource<ProjectSpec>> {
  return {
    kind: 'Project',
    plural: 'projects',
    finalizer: finalizerOf('Project'),
    async sync(r, h) {
      const spec = r.spec ?? {};
      if (!spec.currency) throw new Failure('InvalidSpec', 'spec.currency is required', false);
      const name = spec.displayName ?? r.metadata.name;
      const settings = normalSettings(spec.settings ?? {});
      let row = await store.findByManager(h.managedBy);
      const events = [];
      if (!row) {
        const owner = spec.ownerUserId ? { ownerUserId: spec.ownerUserId } : {};
        row = await store.create({ name, currency: spec.currency, settings, ...owner }, h.managedBy);
        events.push(normal('Created', `Created project ${row.id}`));
      } else {
        if (row.currency !== spec.currency)
          throw new Failure(
            'InvalidSpec',
            `spec.currency cannot change (project ${row.id} holds balances in ${row.currency}); delete and re-create the resource to change it`,
            false,
          );
        const drift = [
          ...(row.name !== name ? ['name'] : []),
          ...(canonical(row.settings) !== canonical(settings) ? ['settings'] : []),
        ];
        if (drift.length) {
          row = await store.update(row, { name, settings }, h.managedBy);
          events.push(updateEvent(r, `project ${row.id} (${drift.join(', ')})`));
        }
      }
      return synced(`Project ${row.id} is in sync`, {
        status: { projectId: row.id, currency: row.currency },
        events,
      });
    },
    async finalize(_r, h) {
      const row = await store.findByManager(h.managedBy);
      if (!row) return [];
      await store.release(row, h.managedBy);
      return finalized(
        `Released project ${row.id}: its balances and ledger stay; it is editable by hand again`,
      );
    },
  };
}
