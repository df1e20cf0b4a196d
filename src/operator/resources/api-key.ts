import type { V1Secret } from '@kubernetes/client-node';
import { sha256Hex } from '../../core/crypto.ts';
import { Failure } from '../failure.ts';
import {
  finalized,
  type HandlerContext,
  type KindHandler,
  normal,
  projectChanged,
  type RecordedEvent,
  secretWatch,
  synced,
} from '../handler.ts';
import { FIELD_MANAGER, statusOf } from '../runtime/kube.ts';
import type { Resource } from '../status.ts';
import {
  ownedSecret,
  type ProjectLookup,
  type ProjectRef,
  projectOf,
  projectScoped,
  secretValue,
} from './common.ts';

/**
 * The ApiKey kind: a key of a project, issued into a Secret the resource owns. Only the key's hash is
 * stored: a key whose Secret is gone or altered is revoked and a new one issued.
 */

export interface ApiKeySpec extends ProjectRef {
  /** The key's name in the project (default: the resource's name). */
  keyName?: string;
  /** The Secret the key is written to (default `<name>-api-key`), owned by the resource. */
  secretName?: string;
}

export interface ManagedKey {
  id: string;
  project_id: string;
  prefix: string;
  key_hash: string;
}

/** The api_keys table as the ApiKey handler reads and writes it (the writes audited). */
export interface ApiKeyStore extends ProjectLookup {
  findByManager(managedBy: string): Promise<ManagedKey | undefined>;
  issue(
    projectId: string,
    name: string,
    managedBy: string,
  ): Promise<{ id: string; key: string; prefix: string }>;
  /** Revokes the key on every pod. */
  revoke(key: ManagedKey, managedBy: string): Promise<void>;
}

/** Keys of the Secret an ApiKey writes. */
export const API_KEY_SECRET_KEY = 'apiKey';
const apiKeySecretName = (r: Resource<ApiKeySpec>) => r.spec?.secretName || `${r.metadata.name}-api-key`;

export function apiKeyHandler(store: ApiKeyStore): KindHandler<Resource<ApiKeySpec>> {
  return {
    ...projectScoped<Resource<ApiKeySpec>>(
      'ApiKey',
      'apikeys',
      secretWatch((r) => [apiKeySecretName(r)]),
    ),
    async sync(r, h) {
      const namespace = r.metadata.namespace ?? '';
      const project = await projectOf(store, r);
      const secretName = apiKeySecretName(r);
      const events: RecordedEvent[] = [];
      let key = await store.findByManager(h.managedBy);
      if (key && key.project_id !== project.id) {
        // Its Project was re-created (a new project): a key of the old one is revoked, one of the new issued.
        await store.revoke(key, h.managedBy);
        events.push(
          projectChanged(project.id, `revoked key ${key.prefix}… (${key.id}) of ${key.project_id}`),
        );
        key = undefined;
      }
      let secret = await h.secret(namespace, secretName);
      let value = secret ? secretValue(secret, API_KEY_SECRET_KEY) : undefined;
      if (key && (!value || sha256Hex(value) !== key.key_hash)) {
        // The cache may not have seen our last write yet: only the API server's copy proves a drift.
        secret = await h.secret(namespace, secretName, { fresh: true });
        value = secret ? secretValue(secret, API_KEY_SECRET_KEY) : undefined;
      }
      const ownedByUs = secret?.metadata?.ownerReferences?.some((o) => o.uid === r.metadata.uid) ?? false;
      if (secret && !ownedByUs)
        throw new Failure(
          'SecretConflict',
          `Secret ${namespace}/${secretName} exists and is not owned by this ApiKey; choose another spec.secretName`,
          true,
        );
      if (!key || !value || sha256Hex(value) !== key.key_hash) {
        // The value is shown once and only its hash is stored: a key whose Secret is gone or altered cannot
        // be written back, so it is revoked and a new one issued (as cert-manager re-issues a certificate).
        if (key) {
          await store.revoke(key, h.managedBy);
          events.push(
            normal(
              'Revoked',
              `Revoked key ${key.prefix}… (${key.id}): Secret ${secretName} was missing or changed`,
            ),
          );
        }
        const created = await store.issue(project.id, r.spec?.keyName || r.metadata.name, h.managedBy);
        const values = { [API_KEY_SECRET_KEY]: created.key, projectId: project.id };
        await writeKeySecret(h, r, secretName, secret, values);
        events.push(
          normal(
            key ? 'Reissued' : 'Created',
            `Issued key ${created.prefix}… (${created.id}) into Secret ${secretName}`,
          ),
        );
        key = await store.findByManager(h.managedBy);
      }
      if (!key) throw new Failure('ReconcileError', 'the key just issued is not found', true);
      return synced(`Key ${key.prefix}… is active; its value is in Secret ${secretName}`, {
        status: { projectId: project.id, keyId: key.id, prefix: key.prefix, secretName },
        events,
      });
    },
    async finalize(_r, h) {
      const key = await store.findByManager(h.managedBy);
      if (!key) return [];
      await store.revoke(key, h.managedBy);
      return finalized(`Revoked key ${key.prefix}… (${key.id})`);
    },
    async orphan(managedBy) {
      const key = await store.findByManager(managedBy);
      if (key) await store.revoke(key, managedBy);
    },
  };
}

async function writeKeySecret(
  h: HandlerContext,
  r: Resource,
  name: string,
  existing: V1Secret | undefined,
  values: Record<string, string>,
): Promise<void> {
  const labels = { 'app.kubernetes.io/managed-by': FIELD_MANAGER, 'tollgate.dev/api-key': r.metadata.name };
  const owned = ownedSecret('ApiKey', r, name, labels, values);
  const { namespace } = owned.metadata;
  const replace = (resourceVersion: string | undefined) =>
    h.kube.core.replaceNamespacedSecret({
      name,
      namespace,
      fieldManager: FIELD_MANAGER,
      body: { ...owned, metadata: { ...owned.metadata, ...(resourceVersion ? { resourceVersion } : {}) } },
    });
  if (existing) {
    await replace(existing.metadata?.resourceVersion);
    return;
  }
  try {
    await h.kube.core.createNamespacedSecret({ namespace, body: owned, fieldManager: FIELD_MANAGER });
  } catch (err) {
    if (statusOf(err) !== 409) throw err;
    const current = await h.kube.core.readNamespacedSecret({ name, namespace });
    await replace(current.metadata?.resourceVersion);
  }
}
