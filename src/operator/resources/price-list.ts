import { parseInput } from '../../core/validation.ts';
import { DEFAULT_ENDPOINTS, type PricingFile, pricingFileSchema } from '../../models/pricing.ts';
import type { ApplyResult } from '../../models/service.ts';
import { Failure } from '../failure.ts';
import {
  finalized,
  type KindHandler,
  namespaceWatch,
  normal,
  projectChanged,
  synced,
  updateEvent,
} from '../handler.ts';
import type { Resource } from '../status.ts';
import { canonical, type ProjectLookup, type ProjectRef, projectOf, projectScoped } from './common.ts';

/** The PriceList kind: the models of a project and their prices, as a pricing file declares them. */

export interface PriceListSpec extends ProjectRef {
  currency?: string;
  models?: PricingFile['models'];
}

/** The models (and the projects' pricing owner) as the PriceList handler reads and writes them. */
export interface PriceListStore extends ProjectLookup {
  /** The project's models as a pricing file lists them, and the resource that manages its pricing. */
  current(projectId: string): Promise<{ models: PricingFile['models']; managedBy: string | null }>;
  /** Applies the file (audited, then published). */
  apply(
    project: { id: string; currency: string },
    file: PricingFile,
    managedBy: string,
  ): Promise<ApplyResult>;
  providerNames(projectId: string): Promise<Set<string>>;
  /**
   * Deletes the models of every project whose pricing `managedBy` manages but `keep`, and hands their
   * pricing back (audited, then published): the projects released.
   */
  release(managedBy: string, keep?: string): Promise<string[]>;
}

/** Decimal strings compared by value ("0.150000" from the database equals "0.15"). */
const decimal = (v: string | undefined) =>
  v === undefined ? undefined : v.includes('.') ? v.replace(/0+$/, '').replace(/\.$/, '') : v;

function normalModels(models: PricingFile['models']): string {
  return canonical(
    [...models]
      .sort((a, b) => a.id.localeCompare(b.id))
      .map((m) => ({
        id: m.id,
        upstreamModel: m.upstreamModel ?? m.id,
        endpoints: m.endpoints ?? DEFAULT_ENDPOINTS,
        routes: m.routes ?? null,
        maxOutputTokens: m.maxOutputTokens ?? null,
        contextWindow: m.contextWindow ?? null,
        pricing: Object.fromEntries(
          Object.entries({
            ...(m.pricing.mode === 'per_token' ? { outputPerMillion: '0' } : {}),
            ...m.pricing,
          }).map(([k, v]) => [k, k === 'mode' || k === 'period' ? v : decimal(String(v))]),
        ),
      })),
  );
}

/** The providers the file's routes name that the project lacks. */
function missingProviders(file: PricingFile, providers: Set<string>): string[] {
  const named = file.models.flatMap((m) =>
    (m.routes ?? [{ provider: 'default' }]).map((route) => route.provider),
  );
  return [...new Set(named.filter((p) => !providers.has(p)))];
}

type PriceList = Resource<PriceListSpec>;

function parseFile(r: PriceList, currency: string): PricingFile {
  let file: PricingFile;
  try {
    file = parseInput(pricingFileSchema, { currency: r.spec?.currency, models: r.spec?.models }, 'spec');
  } catch (err) {
    throw new Failure('InvalidPrice', (err as Error).message, false);
  }
  if (file.currency !== currency)
    throw new Failure(
      'InvalidPrice',
      `spec.currency ${file.currency} differs from the project's currency ${currency}`,
      false,
    );
  return file;
}

export function priceListHandler(store: PriceListStore): KindHandler<PriceList> {
  return {
    // A provider that changes may satisfy the routes of the price lists of its namespace.
    ...projectScoped<PriceList>('PriceList', 'pricelists', namespaceWatch('ModelProvider')),
    invalidReason: 'InvalidPrice',
    async sync(r, h) {
      const project = await projectOf(store, r);
      const file = parseFile(r, project.currency);
      const current = await store.current(project.id);
      const events = [];
      if (current.managedBy !== h.managedBy || normalModels(current.models) !== normalModels(file.models)) {
        const result = await store.apply(project, file, h.managedBy);
        const what = `the prices of ${project.id} (created ${result.created.length}, updated ${result.updated.length}, deleted ${result.deleted.length})`;
        events.push(
          current.managedBy !== h.managedBy ? normal('Applied', `Applied ${what}`) : updateEvent(r, what),
        );
      }
      // Its Project was re-created (a new project): the prices moved there, the old project's go.
      const left = await store.release(h.managedBy, project.id);
      if (left.length) events.push(projectChanged(project.id, `deleted the models of ${left.join(', ')}`));
      const status = { projectId: project.id, models: file.models.length };
      // Routes naming a provider the project lacks would fail at request time: say so now.
      const missing = missingProviders(file, await store.providerNames(project.id));
      if (missing.length)
        return {
          reason: 'ProviderNotFound',
          message: `prices applied, but the project has no provider ${missing.join(', ')} (declare a ModelProvider with that providerName)`,
          notReady: 'retry',
          status,
          events,
        };
      return synced(`${file.models.length} models priced in ${file.currency}`, { status, events });
    },
    async finalize(_r, h) {
      const left = await store.release(h.managedBy);
      return finalized(left.length ? `Deleted the models of ${left.join(', ')}` : undefined);
    },
    async orphan(managedBy) {
      await store.release(managedBy);
    },
  };
}
