import type { ProviderConfig } from '../../projects/directory.ts';
import { Failure } from '../failure.ts';
import {
  finalized,
  type HandlerContext,
  type KindHandler,
  normal,
  projectChanged,
  type RecordedEvent,
  secretRotated,
  secretWatch,
  synced,
  updateEvent,
} from '../handler.ts';
import { type Resource, readyCondition } from '../status.ts';
import { type ProjectLookup, type ProjectRef, projectOf, projectScoped, secretValue } from './common.ts';

/** The ModelProvider kind: a provider of a project (base URL, key from a Secret, timeouts). */

export interface ModelProviderSpec extends ProjectRef {
  /** `openai-compatible` (the only one today; `anthropic` is reserved). */
  type?: string;
  /** The provider's name in the project, which routes refer to (default: the resource's name). */
  providerName?: string;
  baseUrl?: string;
  secretRef?: { name?: string; key?: string };
  timeouts?: { connectMs?: number; responseMs?: number };
}

export interface ProviderWrite {
  name: string;
  baseUrl: string;
  key: string | null;
  timeouts?: { connectMs?: number; responseMs?: number };
}

/** The providers table as the ModelProvider handler reads and writes it (the writes audited, then published). */
export interface ModelProviderStore extends ProjectLookup {
  find(projectId: string, name: string): Promise<ProviderConfig | undefined>;
  upsert(projectId: string, provider: ProviderWrite, managedBy: string): Promise<void>;
  /**
   * Removes every provider `managedBy` manages but `keep` (audited, then published): the ones removed.
   */
  release(
    managedBy: string,
    keep?: { projectId: string; name: string },
  ): Promise<Array<{ projectId: string; name: string }>>;
  /** Lists the provider's models; throws, with a readable message, when it does not answer. */
  check(input: { baseUrl: string; apiKey?: string }): Promise<{ models: string[] }>;
}

const PROVIDER_SECRET_KEY = 'apiKey';
type ModelProvider = Resource<ModelProviderSpec>;
const providerNameOf = (r: ModelProvider) => r.spec?.providerName || r.metadata.name;

/**
 * The provider's key from its Secret (`spec.secretRef`), null without one, and the Secret as
 * `<name>/<key>@<resourceVersion>` (status.observedSecret: a change is a rotation); SecretNotFound when
 * missing.
 */
async function providerKey(
  r: ModelProvider,
  h: HandlerContext,
): Promise<{ apiKey: string | null; observed?: string }> {
  const ref = r.spec?.secretRef;
  if (!ref?.name) return { apiKey: null };
  const namespace = r.metadata.namespace ?? '';
  const secretKey = ref.key || PROVIDER_SECRET_KEY;
  const secret = await h.secret(namespace, ref.name);
  if (!secret) throw new Failure('SecretNotFound', `Secret ${namespace}/${ref.name} not found`, true);
  const apiKey = secretValue(secret, secretKey);
  if (!apiKey)
    throw new Failure('SecretNotFound', `Secret ${namespace}/${ref.name} has no key "${secretKey}"`, true);
  return { apiKey, observed: `${ref.name}/${secretKey}@${secret.metadata?.resourceVersion ?? ''}` };
}

/**
 * The events of a write of provider `name`: Created, or what changed — a key changed in its Secret
 * since the last write is a rotation; the rest a spec change or a drift put back.
 */
function writeEvents(
  r: ModelProvider,
  where: string,
  changes: string[] | undefined,
  observed: string | undefined,
): RecordedEvent[] {
  if (!changes) return [normal('Created', `Created ${where}`)];
  const rotated = changes.includes('key') && observed !== undefined && observed !== r.status?.observedSecret;
  const others = rotated ? changes.filter((c) => c !== 'key') : changes;
  const secret = `${r.metadata.namespace}/${r.spec?.secretRef?.name}`;
  return [
    ...(rotated ? [secretRotated(`the key of ${where}`, secret)] : []),
    ...(others.length ? [updateEvent(r, `${where} (${others.join(', ')})`)] : []),
  ];
}

function drift(current: ProviderConfig, baseUrl: string, apiKey: string | null, spec: ModelProviderSpec) {
  return [
    ...(current.baseUrl !== baseUrl ? ['baseUrl'] : []),
    ...((current.apiKey ?? null) !== apiKey ? ['key'] : []),
    ...((current.connectMs ?? null) !== (spec.timeouts?.connectMs ?? null) ||
    (current.responseMs ?? null) !== (spec.timeouts?.responseMs ?? null)
      ? ['timeouts']
      : []),
  ];
}

export function modelProviderHandler(store: ModelProviderStore): KindHandler<ModelProvider> {
  return {
    ...projectScoped<ModelProvider>(
      'ModelProvider',
      'modelproviders',
      secretWatch((r) => (r.spec?.secretRef?.name ? [r.spec.secretRef.name] : [])),
    ),
    async sync(r, h) {
      const spec = r.spec ?? {};
      if ((spec.type ?? 'openai-compatible') !== 'openai-compatible')
        throw new Failure(
          'InvalidSpec',
          `spec.type ${spec.type} is not supported yet (openai-compatible is)`,
          false,
        );
      if (!spec.baseUrl) throw new Failure('InvalidSpec', 'spec.baseUrl is required', false);
      const project = await projectOf(store, r);
      const name = providerNameOf(r);
      const { apiKey, observed } = await providerKey(r, h);
      const current = await store.find(project.id, name);
      const baseUrl = spec.baseUrl.replace(/\/+$/, '');
      const changes = current ? drift(current, baseUrl, apiKey, spec) : [];
      const previous = readyCondition(r);
      const status = {
        projectId: project.id,
        providerName: name,
        keySet: apiKey !== null,
        ...(observed ? { observedSecret: observed } : {}),
      };
      const where = `provider ${name} in ${project.id}`;
      /** Its Project was re-created (a new project): the provider moved there, the old project's goes. */
      const moved = async () => {
        const left = await store.release(h.managedBy, { projectId: project.id, name });
        const removed = left.map((p) => `${p.name} of ${p.projectId}`).join(', ');
        return left.length ? [projectChanged(project.id, `removed provider ${removed}`)] : [];
      };
      // Reachability is checked when the provider is written or was not reachable, not on every resync.
      if (current && !changes.length && previous?.reason === 'Synced')
        return synced(previous.message, { status, events: await moved() });
      const timeouts = spec.timeouts ? { timeouts: spec.timeouts } : {};
      await store.upsert(project.id, { name, baseUrl, key: apiKey, ...timeouts }, h.managedBy);
      const events = [
        ...(!current || changes.length ? writeEvents(r, where, current && changes, observed) : []),
        ...(await moved()),
      ];
      try {
        const { models } = await store.check({ baseUrl, ...(apiKey ? { apiKey } : {}) });
        return synced(`Provider ${name} answers (${models.length} models listed)`, { status, events });
      } catch (err) {
        const message = (err as Error).message;
        return {
          reason: 'ProviderUnreachable',
          message,
          notReady: 'retry',
          status,
          events: [...events, { type: 'Warning', reason: 'ProviderUnreachable', message }],
        };
      }
    },
    async finalize(_r, h) {
      const left = await store.release(h.managedBy);
      const removed = left.map((p) => `${p.name} from ${p.projectId}`).join(', ');
      return finalized(left.length ? `Removed provider ${removed}` : undefined);
    },
    async orphan(managedBy) {
      await store.release(managedBy);
    },
  };
}
