import { randomUUID } from 'node:crypto';
import { ApiError, type ErrorBody } from '../core/errors.ts';
import { type AdminOperations, type Json, UsageError } from './operations.ts';

/**
 * The admin operations over HTTP: a running server's admin API (`/admin/v1`), with TOLLGATE_URL and
 * TOLLGATE_ADMIN_TOKEN — the way to administer a `tollgate dev` (whose embedded database is locked) or
 * a cluster. An error answer becomes the same `ApiError` the server threw.
 */

export interface AdminClient {
  call<T = Json>(method: string, path: string, body?: unknown, headers?: Record<string, string>): Promise<T>;
}

export function adminClient(baseUrl: string, token: string): AdminClient {
  const base = `${baseUrl.replace(/\/+$/, '')}/admin/v1`;
  return {
    async call(method, path, body, headers = {}) {
      let res: Response;
      try {
        res = await fetch(base + path, {
          method,
          headers: {
            authorization: `Bearer ${token}`,
            ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
            ...headers,
          },
          ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
        });
      } catch (err) {
        const code = (err as { cause?: { code?: string } }).cause?.code ?? (err as Error).message;
        throw new Error(`cannot reach TOLLGATE_URL (${baseUrl}): ${code}; is the server running?`);
      }
      const text = await res.text();
      let parsed: unknown;
      try {
        parsed = text ? JSON.parse(text) : undefined;
      } catch {
        throw new Error(`${method} ${base}${path} answered ${res.status} with a body that is not JSON`);
      }
      if (!res.ok) {
        const e = (parsed as Partial<ErrorBody> | undefined)?.error;
        throw new ApiError(res.status, e?.type ?? 'server_error', e?.message ?? `HTTP ${res.status}`, {
          code: e?.code ?? null,
          param: e?.param ?? null,
        });
      }
      return parsed as Json;
    },
  };
}

const enc = encodeURIComponent;
const project = (id: string) => `/projects/${enc(id)}`;
/** One key per invocation: a retried request is not applied twice. */
const once = () => ({ 'idempotency-key': `cli-${randomUUID()}` });

export function remoteAdmin(client: AdminClient): AdminOperations {
  const connectProvider = (id: string, baseUrl: string, apiKey: string | undefined) =>
    client.call('PUT', `${project(id)}/provider`, { baseUrl, ...(apiKey ? { apiKey } : {}) });
  return {
    async createProject(input) {
      const created = await client.call('POST', '/projects', { name: input.name, currency: input.currency });
      const id = created.project.id as string;
      if (input.upstreamUrl) await connectProvider(id, input.upstreamUrl, input.upstreamKey);
      if (Object.keys(input.settings).length)
        await client.call('PATCH', project(id), { settings: input.settings });
      return {
        id,
        apiKey: created.apiKey.key,
        apiKeyId: created.apiKey.id,
        currency: created.project.currency,
        name: created.project.name,
      };
    },
    listProjects: async () => (await client.call('GET', '/projects?limit=100')).data,
    showProject: (id) => client.call('GET', project(id)),
    async updateProject(id, { name, settings, upstreamUrl, upstreamKey }) {
      let view = await client.call('GET', project(id));
      if (name || Object.keys(settings).length) {
        view = await client.call('PATCH', project(id), {
          ...(name ? { name } : {}),
          ...(Object.keys(settings).length ? { settings } : {}),
        });
      }
      if (upstreamUrl !== undefined || upstreamKey !== undefined) {
        const baseUrl = upstreamUrl ?? view.provider.baseUrl;
        if (!baseUrl) throw new UsageError('--upstream-url is required: the project has no provider yet');
        await connectProvider(id, baseUrl, upstreamKey);
        view = await client.call('GET', project(id));
      }
      return { id: view.id, name: view.name, settings: view.settings, upstreamUrl: view.provider.baseUrl };
    },
    async createKey(id, name) {
      const created = await client.call('POST', `${project(id)}/keys`, { name });
      return { id: created.id, apiKey: created.key, prefix: created.prefix };
    },
    listKeys: async (id) => (await client.call('GET', `${project(id)}/keys`)).data,
    createUserKey: (id, { user, ...input }) =>
      client.call('POST', `${project(id)}/users/${enc(user)}/keys`, input),
    listUserKeys: async (id, user) =>
      (await client.call('GET', `${project(id)}/users/${enc(user)}/keys`)).data,
    revokeUserKey: (id, keyId) => client.call('DELETE', `${project(id)}/user-keys/${enc(keyId)}`),
    async revokeKey(keyId, id) {
      if (!id) throw new UsageError('--project is required over the admin API (TOLLGATE_URL)');
      const result = await client.call('DELETE', `${project(id)}/keys/${enc(keyId)}`);
      return { id: keyId, projectId: id, revoked: true, propagated: result.propagated };
    },
    async applyModels(id, file) {
      const result = await client.call('PUT', `${project(id)}/models`, file);
      return { created: result.created, updated: result.updated, deleted: result.deleted };
    },
    listModels: (id) => client.call('GET', `${project(id)}/models`),
    connectUser: (id, user) => client.call('POST', `${project(id)}/users/${enc(user)}/connect`),
    showUser: (id, user) => client.call('GET', `${project(id)}/users/${enc(user)}`),
    listUsers: (id, { search, limit }) =>
      client.call('GET', `${project(id)}/users?limit=${limit}${search ? `&q=${enc(search)}` : ''}`),
    async deposit(id, user, amount) {
      const result = await client.call(
        'POST',
        `${project(id)}/users/${enc(user)}/deposit`,
        { amount },
        once(),
      );
      return {
        id: result.id,
        user,
        amount: result.amount,
        currency: result.currency,
        balance: result.balance,
      };
    },
    grant: (id, { user, ...body }) =>
      client.call('POST', `${project(id)}/users/${enc(user)}/credits`, body, once()),
    createInvite: (email, expiresInDays) =>
      client.call('POST', '/invites', { email, ...(expiresInDays !== undefined ? { expiresInDays } : {}) }),
    connectPayments: (id, body) => client.call('PUT', `${project(id)}/payments`, body),
    showPayments: (id) => client.call('GET', `${project(id)}/payments`),
    updatePaymentSettings: (id, body) => client.call('PATCH', `${project(id)}/payments`, body),
    disconnectPayments: (id) => client.call('DELETE', `${project(id)}/payments`),
    listPayments: (id, user) =>
      client.call('GET', `${project(id)}/payments/list?limit=100${user ? `&user=${enc(user)}` : ''}`),
    refundPayment: (id, paymentId, amount) =>
      client.call('POST', `${project(id)}/payments/${enc(paymentId)}/refund`, amount ? { amount } : {}),
  };
}
