import { type Bus, channels } from '../bus/index.ts';
import { TtlCache } from '../core/cache.ts';
import type { Sealer } from '../core/crypto.ts';
import type { Database } from '../db/index.ts';
import type { ModelRow, ProjectLimits, ProjectSettings, ProviderKind } from '../db/schema.ts';
import { DEFAULT_PROVIDER } from './service.ts';

/** What a request needs to know about its project, loaded once and cached. */
export interface ProjectContext {
  id: string;
  name: string;
  currency: string;
  owner_user_id: string;
  settings: ProjectSettings;
  upstream: { baseUrl: string; apiKey: string | undefined } | undefined;
  models: Map<string, ModelRow>;
  /** Named providers (src/routing); `default` is the project's upstream. */
  providers: Map<string, ProviderConfig>;
  /** Rate and spend limits (src/limits); undefined when the pricing file sets none. */
  limits: ProjectLimits | undefined;
  /** Per-user spend cap overrides, by external user id. */
  spendCaps: Map<string, SpendCaps>;
}

/** A provider as the router uses it (key unsealed; cached with the project). src/routing writes them. */
export interface ProviderConfig {
  name: string;
  baseUrl: string;
  kind: ProviderKind;
  apiKey: string | undefined;
  connectMs: number | undefined;
  responseMs: number | undefined;
}

/**
 * Spend caps per end user: at most `daily` per UTC day and `monthly` per UTC month (decimal amounts in
 * the project's currency). The project's caps come from the pricing file (`limits.spend`); a user's own
 * caps (set through `PUT /v1/users/{user}/spend-caps` or the CLI, src/limits/spend.ts) replace them field
 * by field.
 */
export interface SpendCaps {
  daily?: string | undefined;
  monthly?: string | undefined;
}

/** The providers of a project with their keys unsealed (the directory caches them). */
export async function loadProviders(
  db: Database,
  sealer: Sealer,
  projectId: string,
): Promise<Map<string, ProviderConfig>> {
  const rows = await db.selectFrom('providers').selectAll().where('project_id', '=', projectId).execute();
  return new Map(
    rows.map((r) => [
      r.name,
      {
        name: r.name,
        baseUrl: r.base_url,
        kind: r.kind,
        apiKey: r.key_sealed ? sealer.open(r.key_sealed) : undefined,
        connectMs: r.connect_timeout_ms ?? undefined,
        responseMs: r.response_timeout_ms ?? undefined,
      },
    ]),
  );
}

/** The users' own spend caps of a project, by external user id. */
async function loadSpendCaps(db: Database, projectId: string): Promise<Map<string, SpendCaps>> {
  const rows = await db.selectFrom('spend_caps').selectAll().where('project_id', '=', projectId).execute();
  return new Map(
    rows.map((r) => [r.external_id, { daily: r.daily ?? undefined, monthly: r.monthly ?? undefined }]),
  );
}

const TTL_MS = 60_000;

/**
 * Cached project contexts (project row, unsealed provider key, models). Any change to a project or its
 * models is published on the bus and drops the entry on every pod; the TTL bounds staleness.
 */
export class ProjectDirectory {
  readonly #db: Database;
  readonly #bus: Bus;
  readonly #sealer: Sealer;
  readonly #cache = new TtlCache<string, ProjectContext | null>(10_000);
  #unsubscribe: (() => Promise<void>) | undefined;

  constructor(db: Database, bus: Bus, sealer: Sealer) {
    this.#db = db;
    this.#bus = bus;
    this.#sealer = sealer;
  }

  async start(): Promise<void> {
    this.#unsubscribe = await this.#bus.subscribe(channels.projectChanged, (id) =>
      this.#cache.invalidate(id),
    );
  }

  async stop(): Promise<void> {
    await this.#unsubscribe?.();
  }

  /** The project from memory, without a promise: null when gone, undefined when `get` has to load it. */
  cached(projectId: string): ProjectContext | null | undefined {
    return this.#cache.get(projectId);
  }

  async get(projectId: string): Promise<ProjectContext | undefined> {
    const found = await this.#cache.getOrLoad(
      projectId,
      () => this.#load(projectId),
      () => TTL_MS,
    );
    return found ?? undefined;
  }

  /** Call after changing a project or its models. */
  async changed(projectId: string): Promise<void> {
    this.#cache.invalidate(projectId);
    // Best effort: without the bus, other pods see the change when their entry expires (60 s).
    await this.#bus.publish(channels.projectChanged, projectId).catch(() => {});
  }

  async #load(projectId: string): Promise<ProjectContext | null> {
    const project = await this.#db
      .selectFrom('projects')
      .selectAll()
      .where('id', '=', projectId)
      .executeTakeFirst();
    if (!project) return null;
    const models = await this.#db
      .selectFrom('models')
      .selectAll()
      .where('project_id', '=', projectId)
      .orderBy('id')
      .execute();
    const [providers, spendCaps] = await Promise.all([
      loadProviders(this.#db, this.#sealer, projectId),
      loadSpendCaps(this.#db, projectId),
    ]);
    const fallback = providers.get(DEFAULT_PROVIDER);
    return {
      id: project.id,
      name: project.name,
      currency: project.currency,
      owner_user_id: project.owner_user_id,
      settings: project.settings,
      upstream: fallback
        ? { baseUrl: fallback.baseUrl, apiKey: fallback.apiKey }
        : project.upstream_base_url
          ? {
              baseUrl: project.upstream_base_url,
              apiKey: project.upstream_key_sealed
                ? this.#sealer.open(project.upstream_key_sealed)
                : undefined,
            }
          : undefined,
      models: new Map(models.map((m) => [m.id, m])),
      providers,
      limits: project.limits ?? undefined,
      spendCaps,
    };
  }
}
