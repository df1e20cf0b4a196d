import { randomUUID } from 'node:crypto';
import { ApiError, type ErrorBody } from '../core/errors.ts';
import { modelLine } from '../models/service.ts';
import { type Output, UsageError } from './output.ts';
import {
  days,
  grantInputFrom,
  grantSummary,
  optional,
  pricingFileFrom,
  required,
  settingsFrom,
  type Values,
} from './values.ts';

/**
 * The admin commands over HTTP: with TOLLGATE_URL and TOLLGATE_ADMIN_TOKEN set, `project`, `key`,
 * `models` and `users` call the running server's admin API (`/admin/v1`) instead of opening the
 * database — the way to administer a `tollgate dev` (whose embedded database is locked) or a cluster.
 */

// biome-ignore lint/suspicious/noExplicitAny: JSON answers of the admin API, read field by field
type Json = any;

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

export async function remoteAdminCommand(
  client: AdminClient,
  command: string,
  values: Values,
  out: Output,
): Promise<void> {
  switch (command) {
    case 'project create': {
      const created = await client.call('POST', '/projects', {
        name: required(values, 'name'),
        currency: optional(values, 'currency') ?? 'usd',
      });
      const id = created.project.id as string;
      const upstreamUrl = optional(values, 'upstream-url');
      if (upstreamUrl) {
        const apiKey = optional(values, 'upstream-key');
        await client.call('PUT', `/projects/${enc(id)}/provider`, {
          baseUrl: upstreamUrl,
          ...(apiKey ? { apiKey } : {}),
        });
      }
      const settings = settingsFrom(values);
      if (Object.keys(settings).length) await client.call('PATCH', `/projects/${enc(id)}`, { settings });
      out.result(
        { id, apiKey: created.apiKey.key, apiKeyId: created.apiKey.id, currency: created.project.currency },
        [
          `Created project ${id} (${created.project.name}, ${created.project.currency})`,
          `API key (shown once, keep it safe): ${created.apiKey.key}`,
        ],
      );
      return;
    }
    case 'project list': {
      const page = await client.call('GET', '/projects?limit=100');
      out.result(
        page.data,
        page.data.length
          ? page.data.map(
              (p: Json) => `${p.id}  ${p.name}  ${p.currency}  ${p.provider.baseUrl ?? '(no provider)'}`,
            )
          : ['no projects'],
      );
      return;
    }
    case 'project show': {
      const project = await client.call('GET', `/projects/${enc(required(values, 'project'))}`);
      out.result(
        project,
        Object.entries(project).map(([k, v]) => `${k}: ${typeof v === 'object' ? JSON.stringify(v) : v}`),
      );
      return;
    }
    case 'project set': {
      const id = required(values, 'project');
      const name = optional(values, 'name');
      const settings = settingsFrom(values);
      let project = await client.call('GET', `/projects/${enc(id)}`);
      if (name || Object.keys(settings).length) {
        project = await client.call('PATCH', `/projects/${enc(id)}`, {
          ...(name ? { name } : {}),
          ...(Object.keys(settings).length ? { settings } : {}),
        });
      }
      const upstreamUrl = optional(values, 'upstream-url');
      const upstreamKey = optional(values, 'upstream-key');
      if (upstreamUrl !== undefined || upstreamKey !== undefined) {
        const baseUrl = upstreamUrl ?? project.provider.baseUrl;
        if (!baseUrl) throw new UsageError('--upstream-url is required: the project has no provider yet');
        await client.call('PUT', `/projects/${enc(id)}/provider`, {
          baseUrl,
          ...(upstreamKey ? { apiKey: upstreamKey } : {}),
        });
        project = await client.call('GET', `/projects/${enc(id)}`);
      }
      out.result(
        {
          id: project.id,
          name: project.name,
          settings: project.settings,
          upstreamUrl: project.provider.baseUrl,
        },
        `Updated project ${id}`,
      );
      return;
    }
    case 'key create': {
      const created = await client.call('POST', `/projects/${enc(required(values, 'project'))}/keys`, {
        name: optional(values, 'name') ?? 'default',
      });
      out.result({ id: created.id, apiKey: created.key, prefix: created.prefix }, [
        `Created key ${created.id} (${created.prefix}…)`,
        `API key (shown once, keep it safe): ${created.key}`,
      ]);
      return;
    }
    case 'key list': {
      const keys = await client.call('GET', `/projects/${enc(required(values, 'project'))}/keys`);
      out.result(
        keys.data,
        keys.data.length
          ? keys.data.map(
              (k: Json) => `${k.id}  ${k.prefix}…  ${k.name}  ${k.revokedAt ? 'revoked' : 'active'}`,
            )
          : ['no keys'],
      );
      return;
    }
    case 'key revoke': {
      const keyId = required(values, 'key');
      const project = optional(values, 'project');
      if (!project) throw new UsageError('--project is required over the admin API (TOLLGATE_URL)');
      const result = await client.call('DELETE', `/projects/${enc(project)}/keys/${enc(keyId)}`);
      out.result(
        { id: keyId, projectId: project, revoked: true, propagated: result.propagated },
        `Revoked key ${keyId}`,
      );
      return;
    }
    case 'models apply': {
      const projectId = required(values, 'project');
      const file = pricingFileFrom(values);
      const result = await client.call('PUT', `/projects/${enc(projectId)}/models`, file);
      const view = { created: result.created, updated: result.updated, deleted: result.deleted };
      out.result(view, [
        `Applied ${values.file} to ${projectId}:`,
        `  created: ${view.created.join(', ') || '-'}`,
        `  updated: ${view.updated.join(', ') || '-'}`,
        `  deleted: ${view.deleted.join(', ') || '-'}`,
      ]);
      return;
    }
    case 'models list': {
      const result = await client.call('GET', `/projects/${enc(required(values, 'project'))}/models`);
      out.result(result, result.models.length ? result.models.map(modelLine) : ['no models']);
      return;
    }
    case 'users connect': {
      const user = required(values, 'user');
      const result = await client.call(
        'POST',
        `/projects/${enc(required(values, 'project'))}/users/${enc(user)}/connect`,
      );
      out.result(result, result.changed ? `Connected ${user}` : `${user} was already connected`);
      return;
    }
    case 'users deposit': {
      const user = required(values, 'user');
      const amount = required(values, 'amount');
      const result = await client.call(
        'POST',
        `/projects/${enc(required(values, 'project'))}/users/${enc(user)}/deposit`,
        { amount },
        // One key per invocation: a retried request is not credited twice.
        { 'idempotency-key': `cli-${randomUUID()}` },
      );
      out.result(
        { id: result.id, user, amount: result.amount, currency: result.currency, balance: result.balance },
        `Deposited ${result.amount} ${result.currency} to ${user}; balance ${result.balance} ${result.currency}`,
      );
      return;
    }
    case 'users grant': {
      const { user, ...body } = grantInputFrom(values);
      const result = await client.call(
        'POST',
        `/projects/${enc(required(values, 'project'))}/users/${enc(user)}/credits`,
        body,
        // One key per invocation: a retried request is not granted twice.
        { 'idempotency-key': `cli-${randomUUID()}` },
      );
      out.result(result, grantSummary(result));
      return;
    }
    case 'invite create': {
      const expiresInDays = days(values);
      const invite = await client.call('POST', '/invites', {
        email: required(values, 'email'),
        ...(expiresInDays !== undefined ? { expiresInDays } : {}),
      });
      out.result(invite, [`Invite for ${invite.email} (until ${invite.expiresAt}):`, invite.url]);
      return;
    }
    default:
      throw new UsageError(
        `\`tollgate ${command}\` works on the database only: unset TOLLGATE_URL to run it`,
      );
  }
}
