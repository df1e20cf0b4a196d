import { randomUUID } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import {
  ApiextensionsV1Api,
  CoreV1Api,
  CustomObjectsApi,
  KubeConfig,
  loadYaml,
  PatchStrategy,
  setHeaderOptions,
  type V1CustomResourceDefinition,
} from '@kubernetes/client-node';
import { evaluate as evaluateCel } from '@marcbachmann/cel-js';
import { parse as parseYaml } from 'yaml';

/**
 * A Kubernetes API server on loopback, for the resources the operator uses, written from the API's
 * documented behaviour:
 * - one resourceVersion counter for every write (like etcd's revision), returned on lists;
 * - list, and watch (`?watch=true`) from a resourceVersion: the changes after it are replayed, then live
 *   ones follow as newline-delimited `{"type","object"}`; a resourceVersion older than the compacted
 *   history gets an `ERROR` event carrying a 410 Expired Status; `timeoutSeconds` ends the stream;
 * - create (`generateName`, 409 AlreadyExists), replace (409 Conflict on a stale
 *   `metadata.resourceVersion`), JSON merge patch and JSON patch (415 for other patch types on custom
 *   resources), delete;
 * - custom resources with a status subresource: writes to the resource ignore `status`, writes to
 *   `/status` change only `status`; `metadata.generation` starts at 1 and moves when anything but
 *   metadata and status changes; the CRD's OpenAPI schema is applied (defaults, pruning of unknown fields,
 *   type/required/pattern/length/count/range checks → 422 Invalid; with `cel: true`, the
 *   `x-kubernetes-validations` rules too, by a real CEL evaluator (@marcbachmann/cel-js), transition rules
 *   (`oldSelf`) on updates only — without Kubernetes' CEL extension libraries beyond what it implements);
 * - finalizers: DELETE of an object with finalizers sets `deletionTimestamp`; the object goes when the
 *   last finalizer is removed; deleting an object removes the objects it owns (garbage collection);
 * - Secrets (`stringData` folded into base64 `data`), Events, coordination.k8s.io/v1 Leases.
 */

export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata: {
    name: string;
    namespace?: string;
    uid?: string;
    resourceVersion?: string;
    generation?: number;
    generateName?: string;
    creationTimestamp?: string;
    deletionTimestamp?: string;
    finalizers?: string[];
    ownerReferences?: Array<{ uid: string }>;
    [key: string]: unknown;
  };
  [key: string]: unknown;
}

interface ResourceType {
  group: string;
  version: string;
  plural: string;
  kind: string;
  namespaced: true;
  custom: boolean;
  statusSubresource: boolean;
  schema?: Schema;
}

/** The part of an OpenAPI v3 schema a CustomResourceDefinition uses. */
export interface Schema {
  type?: string;
  properties?: Record<string, Schema>;
  additionalProperties?: Schema | boolean;
  items?: Schema;
  required?: string[];
  pattern?: string;
  minLength?: number;
  maxLength?: number;
  minItems?: number;
  maxItems?: number;
  maxProperties?: number;
  enum?: unknown[];
  default?: unknown;
  nullable?: boolean;
  'x-kubernetes-list-type'?: string;
  'x-kubernetes-list-map-keys'?: string[];
  'x-kubernetes-int-or-string'?: boolean;
  'x-kubernetes-preserve-unknown-fields'?: boolean;
  'x-kubernetes-validations'?: Array<{ rule: string; message?: string; fieldPath?: string }>;
  [key: string]: unknown;
}

export interface RecordedRequest {
  method: string;
  path: string;
  query: Record<string, string>;
  contentType: string | undefined;
  body: unknown;
  status: number;
}

interface Change {
  rv: number;
  type: 'ADDED' | 'MODIFIED' | 'DELETED';
  typeKey: string;
  object: KubeObject;
}

interface Watcher {
  typeKey: string;
  namespace: string | undefined;
  res: ServerResponse;
  timer: NodeJS.Timeout | undefined;
  /** Receives nothing more (a network partition between the client and the server). */
  muted: boolean;
}

interface Fault {
  method: string;
  path: RegExp;
  status: number;
  times: number;
}

const clone = <T>(v: T): T => structuredClone(v);

class HttpError extends Error {
  readonly code: number;
  readonly reason: string;
  constructor(code: number, reason: string, message: string) {
    super(message);
    this.code = code;
    this.reason = reason;
  }
}

export class FakeKubeApiServer {
  readonly #types = new Map<string, ResourceType>();
  readonly #objects = new Map<string, Map<string, KubeObject>>();
  readonly #history: Change[] = [];
  readonly #watchers = new Set<Watcher>();
  readonly #listeners = new Set<() => void>();
  #faults: Fault[] = [];
  #rv = 100;
  #compactedRv = 0;
  #server: Server | undefined;
  readonly requests: RecordedRequest[] = [];
  url = '';
  readonly #cel: boolean;

  constructor(options: { crdFiles?: string[]; cel?: boolean } = {}) {
    this.#cel = options.cel ?? false;
    this.#register({
      group: '',
      version: 'v1',
      plural: 'secrets',
      kind: 'Secret',
      namespaced: true,
      custom: false,
      statusSubresource: false,
    });
    this.#register({
      group: '',
      version: 'v1',
      plural: 'events',
      kind: 'Event',
      namespaced: true,
      custom: false,
      statusSubresource: false,
    });
    this.#register({
      group: 'coordination.k8s.io',
      version: 'v1',
      plural: 'leases',
      kind: 'Lease',
      namespaced: true,
      custom: false,
      statusSubresource: false,
    });
    for (const file of options.crdFiles ?? []) this.installCrd(parseYaml(readFileSync(file, 'utf8')));
  }

  /** Serves a CustomResourceDefinition (apiextensions.k8s.io/v1) as the API server would. */
  installCrd(crd: {
    spec: {
      group: string;
      scope: string;
      names: { plural: string; kind: string };
      versions: Array<{
        name: string;
        served: boolean;
        subresources?: { status?: object };
        schema?: { openAPIV3Schema: Schema };
      }>;
    };
  }): void {
    if (crd.spec.scope !== 'Namespaced') throw new Error('only namespaced resources are served');
    for (const version of crd.spec.versions) {
      if (!version.served) continue;
      this.#register({
        group: crd.spec.group,
        version: version.name,
        plural: crd.spec.names.plural,
        kind: crd.spec.names.kind,
        namespaced: true,
        custom: true,
        statusSubresource: Boolean(version.subresources?.status),
        ...(version.schema ? { schema: version.schema.openAPIV3Schema } : {}),
      });
    }
  }

  #register(type: ResourceType): void {
    const key = `${type.group}/${type.version}/${type.plural}`;
    this.#types.set(key, type);
    if (!this.#objects.has(`${type.group}/${type.plural}`))
      this.#objects.set(`${type.group}/${type.plural}`, new Map());
  }

  async start(): Promise<string> {
    this.#server = createServer((req, res) => {
      this.#handle(req, res).catch((err) => {
        if (!res.headersSent) this.#sendStatus(res, 500, 'InternalError', (err as Error).message);
        else res.destroy();
      });
    });
    await new Promise<void>((resolve) => this.#server!.listen(0, '127.0.0.1', resolve));
    const { port } = this.#server.address() as { port: number };
    this.url = `http://127.0.0.1:${port}`;
    return this.url;
  }

  async stop(): Promise<void> {
    this.closeWatches();
    if (!this.#server) return;
    this.#server.closeAllConnections();
    await new Promise<void>((resolve) => this.#server!.close(() => resolve()));
  }

  // ---- test controls -------------------------------------------------------------------------------

  /** Forgets the change history: a watch from a resourceVersion older than the current one gets 410 Gone. */
  compact(): void {
    this.#compactedRv = this.#rv;
    this.#history.length = 0;
  }

  /** Open watch streams stay open but receive no more events (until closeWatches). */
  muteWatches(): void {
    for (const watcher of this.#watchers) watcher.muted = true;
  }

  /** Ends every open watch stream, as a restarting API server would. */
  closeWatches(): void {
    for (const watcher of [...this.#watchers]) this.#endWatch(watcher);
  }

  get openWatches(): number {
    return this.#watchers.size;
  }

  /** The next `times` requests matching method and path fail with `status`. */
  failNext(method: string, path: RegExp, status: number, times = 1): void {
    this.#faults.push({ method, path, status, times });
  }

  /** Resolves when `check` holds, re-checked after every write; rejects after timeoutMs. */
  waitFor<T>(check: () => T | undefined | false, timeoutMs = 10_000, what = 'condition'): Promise<T> {
    return new Promise((resolve, reject) => {
      const attempt = () => {
        let value: T | undefined | false;
        try {
          value = check();
        } catch (err) {
          finish();
          reject(err);
          return;
        }
        if (value !== undefined && value !== false) {
          finish();
          resolve(value);
        }
      };
      const timer = setTimeout(() => {
        finish();
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`));
      }, timeoutMs);
      const finish = () => {
        clearTimeout(timer);
        this.#listeners.delete(attempt);
      };
      this.#listeners.add(attempt);
      attempt();
    });
  }

  /** Calls `listener` after every write and every new watch; returns the unsubscribe function. */
  onChange(listener: () => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  get(group: string, plural: string, namespace: string, name: string): KubeObject | undefined {
    const found = this.#objects.get(`${group}/${plural}`)?.get(`${namespace}/${name}`);
    return found ? clone(found) : undefined;
  }

  list(group: string, plural: string, namespace?: string): KubeObject[] {
    return [...(this.#objects.get(`${group}/${plural}`)?.values() ?? [])]
      .filter((o) => namespace === undefined || o.metadata.namespace === namespace)
      .map(clone);
  }

  // ---- HTTP ----------------------------------------------------------------------------------------

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://localhost');
    const query = Object.fromEntries(url.searchParams);
    const method = req.method ?? 'GET';
    const raw = await readBody(req);
    const contentType = req.headers['content-type']?.split(';')[0]?.trim();
    let body: unknown;
    if (raw.length) {
      try {
        body = JSON.parse(raw.toString('utf8'));
      } catch {
        return this.#respond(
          res,
          { method, path: url.pathname, query, contentType, body: raw.toString('utf8') },
          () => {
            throw new HttpError(400, 'BadRequest', 'request body is not JSON');
          },
        );
      }
    }
    const record = { method, path: url.pathname, query, contentType, body };
    const fault = this.#faults.find((f) => f.method === method && f.path.test(url.pathname));
    if (fault) {
      fault.times--;
      if (fault.times <= 0) this.#faults = this.#faults.filter((f) => f !== fault);
      return this.#respond(res, record, () => {
        throw new HttpError(
          fault.status,
          fault.status === 409 ? 'Conflict' : 'InternalError',
          'injected failure',
        );
      });
    }
    const route = this.#route(url.pathname);
    if (!route)
      return this.#respond(res, record, () => {
        throw new HttpError(
          404,
          'NotFound',
          `the server could not find the requested resource (${url.pathname})`,
        );
      });
    if (method === 'GET' && !route.name && (query.watch === 'true' || query.watch === '1')) {
      this.requests.push({ ...record, status: 200 });
      return this.#watch(res, route, query);
    }
    return this.#respond(res, record, () => this.#operate(method, route, query, contentType, body));
  }

  #respond(
    res: ServerResponse,
    record: Omit<RecordedRequest, 'status'>,
    fn: () => { status: number; body: unknown },
  ): void {
    let status: number;
    let payload: unknown;
    try {
      const result = fn();
      status = result.status;
      payload = result.body;
    } catch (err) {
      if (!(err instanceof HttpError)) throw err;
      status = err.code;
      payload = statusBody(err.code, err.reason, err.message);
    }
    this.requests.push({ ...record, status });
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(payload));
    if (record.method !== 'GET') this.#notify();
  }

  #sendStatus(res: ServerResponse, code: number, reason: string, message: string): void {
    res.writeHead(code, { 'content-type': 'application/json' });
    res.end(JSON.stringify(statusBody(code, reason, message)));
  }

  #notify(): void {
    for (const listener of [...this.#listeners]) listener();
  }

  #route(
    path: string,
  ):
    | { type: ResourceType; namespace: string | undefined; name: string | undefined; sub: string | undefined }
    | undefined {
    const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
    let group: string;
    let version: string;
    let rest: string[];
    if (parts[0] === 'api' && parts[1]) {
      group = '';
      version = parts[1];
      rest = parts.slice(2);
    } else if (parts[0] === 'apis' && parts[1] && parts[2]) {
      group = parts[1];
      version = parts[2];
      rest = parts.slice(3);
    } else return undefined;
    let namespace: string | undefined;
    if (rest[0] === 'namespaces' && rest.length >= 3) {
      namespace = rest[1];
      rest = rest.slice(2);
    }
    const [plural, name, sub, ...extra] = rest;
    if (!plural || extra.length) return undefined;
    const type = this.#types.get(`${group}/${version}/${plural}`);
    if (!type) return undefined;
    if (sub && !(sub === 'status' && type.statusSubresource)) return undefined;
    if (name && !namespace) return undefined;
    return { type, namespace, name, sub };
  }

  #store(type: ResourceType): Map<string, KubeObject> {
    return this.#objects.get(`${type.group}/${type.plural}`)!;
  }

  #apiVersion(type: ResourceType): string {
    return type.group ? `${type.group}/${type.version}` : type.version;
  }

  #operate(
    method: string,
    route: {
      type: ResourceType;
      namespace: string | undefined;
      name: string | undefined;
      sub: string | undefined;
    },
    query: Record<string, string>,
    contentType: string | undefined,
    body: unknown,
  ): { status: number; body: unknown } {
    const { type, namespace, name, sub } = route;
    const store = this.#store(type);
    const key = `${namespace}/${name}`;
    if (!name) {
      if (method === 'GET') {
        const items = [...store.values()]
          .filter((o) => !namespace || o.metadata.namespace === namespace)
          .map(clone);
        return {
          status: 200,
          body: {
            apiVersion: this.#apiVersion(type),
            kind: `${type.kind}List`,
            metadata: { resourceVersion: String(this.#rv) },
            items,
          },
        };
      }
      if (method === 'POST') {
        if (!namespace) throw new HttpError(405, 'MethodNotAllowed', 'create needs a namespace');
        return { status: 201, body: this.#create(type, namespace, body, query) };
      }
      throw new HttpError(405, 'MethodNotAllowed', `${method} is not allowed on a collection`);
    }
    const current = store.get(key);
    if (!current)
      throw new HttpError(
        404,
        'NotFound',
        `${type.plural}${type.group ? `.${type.group}` : ''} "${name}" not found`,
      );
    switch (method) {
      case 'GET':
        return { status: 200, body: clone(current) };
      case 'PUT': {
        const next = asObject(body);
        return { status: 200, body: this.#update(type, current, next, sub, query) };
      }
      case 'PATCH': {
        let patched: KubeObject;
        if (
          contentType === 'application/merge-patch+json' ||
          (!type.custom && contentType === 'application/strategic-merge-patch+json')
        )
          patched = mergePatch(clone(current), body) as KubeObject;
        else if (contentType === 'application/json-patch+json') patched = jsonPatch(clone(current), body);
        else
          throw new HttpError(
            415,
            'UnsupportedMediaType',
            `the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml`,
          );
        // A patch carrying metadata.resourceVersion is conditional on it; otherwise it applies to the latest.
        const wanted = (body as { metadata?: { resourceVersion?: string } } | null)?.metadata
          ?.resourceVersion;
        if (!wanted) patched.metadata.resourceVersion = current.metadata.resourceVersion;
        return { status: 200, body: this.#update(type, current, patched, sub, query) };
      }
      case 'DELETE':
        return { status: 200, body: this.#delete(type, current) };
      default:
        throw new HttpError(405, 'MethodNotAllowed', `${method} is not allowed`);
    }
  }

  #create(type: ResourceType, namespace: string, body: unknown, query: Record<string, string>): KubeObject {
    const object = asObject(body);
    object.metadata ??= { name: '' };
    const meta = object.metadata;
    if (meta.namespace && meta.namespace !== namespace)
      throw new HttpError(
        400,
        'BadRequest',
        'the namespace of the provided object does not match the namespace sent on the request',
      );
    if (!meta.name && meta.generateName) meta.name = `${meta.generateName}${randomUUID().slice(0, 5)}`;
    if (!meta.name)
      throw new HttpError(
        422,
        'Invalid',
        `${type.kind} is invalid: metadata.name: Required value: name or generateName is required`,
      );
    const store = this.#store(type);
    if (store.has(`${namespace}/${meta.name}`))
      throw new HttpError(409, 'AlreadyExists', `${type.plural} "${meta.name}" already exists`);
    object.apiVersion = this.#apiVersion(type);
    object.kind = type.kind;
    meta.namespace = namespace;
    meta.uid = randomUUID();
    meta.creationTimestamp = new Date().toISOString().replace(/\.\d+Z$/, 'Z');
    delete meta.deletionTimestamp;
    delete meta.resourceVersion;
    if (type.custom) {
      meta.generation = 1;
      if (type.statusSubresource) delete object.status;
      this.#admit(type, object, undefined);
    }
    if (type.plural === 'secrets') foldStringData(object);
    if (type.plural === 'leases') checkLease(object);
    if (query.dryRun) return object;
    meta.resourceVersion = String(++this.#rv);
    store.set(`${namespace}/${meta.name}`, object);
    this.#emit('ADDED', type, object);
    return clone(object);
  }

  #update(
    type: ResourceType,
    current: KubeObject,
    next: KubeObject,
    sub: string | undefined,
    query: Record<string, string>,
  ): KubeObject {
    next.metadata ??= { name: current.metadata.name };
    if (next.metadata.name && next.metadata.name !== current.metadata.name)
      throw new HttpError(400, 'BadRequest', 'the name of the object does not match the name on the URL');
    if (next.metadata.resourceVersion === undefined || next.metadata.resourceVersion === '') {
      if (type.custom || type.plural === 'leases')
        throw new HttpError(
          422,
          'Invalid',
          `${type.kind} "${current.metadata.name}" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update`,
        );
    } else if (next.metadata.resourceVersion !== current.metadata.resourceVersion) {
      throw new HttpError(
        409,
        'Conflict',
        `Operation cannot be fulfilled on ${type.plural}${type.group ? `.${type.group}` : ''} "${current.metadata.name}": the object has been modified; please apply your changes to the latest version and try again`,
      );
    }
    let updated: KubeObject;
    if (sub === 'status') {
      // The status subresource changes status only.
      updated = clone(current);
      if (next.status === undefined) delete updated.status;
      else updated.status = clone(next.status);
    } else {
      updated = clone(next);
      // Immutable and server-owned metadata.
      for (const field of [
        'uid',
        'creationTimestamp',
        'namespace',
        'generation',
        'deletionTimestamp',
      ] as const) {
        if (current.metadata[field] === undefined) delete updated.metadata[field];
        else (updated.metadata as Record<string, unknown>)[field] = current.metadata[field];
      }
      updated.apiVersion = current.apiVersion;
      updated.kind = current.kind;
      updated.metadata.name = current.metadata.name;
      if (type.statusSubresource) {
        if (current.status === undefined) delete updated.status;
        else updated.status = clone(current.status);
      }
      if (current.metadata.deletionTimestamp) {
        const added = (updated.metadata.finalizers ?? []).filter(
          (f) => !(current.metadata.finalizers ?? []).includes(f),
        );
        if (added.length)
          throw new HttpError(
            422,
            'Invalid',
            `${type.kind} "${current.metadata.name}" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted`,
          );
      }
      if (type.plural === 'secrets') foldStringData(updated);
      if (type.plural === 'leases') checkLease(updated);
    }
    if (type.custom) {
      this.#admit(type, updated, sub === 'status' ? undefined : current);
      if (specOf(updated) !== specOf(current))
        updated.metadata.generation = (current.metadata.generation ?? 1) + 1;
    }
    if (query.dryRun) return updated;
    if (JSON.stringify(updated) === JSON.stringify(current)) return clone(current);
    updated.metadata.resourceVersion = String(++this.#rv);
    const store = this.#store(type);
    if (updated.metadata.deletionTimestamp && !(updated.metadata.finalizers ?? []).length) {
      store.delete(`${updated.metadata.namespace}/${updated.metadata.name}`);
      this.#emit('DELETED', type, updated);
      this.#collectGarbage(updated);
      return clone(updated);
    }
    store.set(`${updated.metadata.namespace}/${updated.metadata.name}`, updated);
    this.#emit('MODIFIED', type, updated);
    return clone(updated);
  }

  #delete(type: ResourceType, current: KubeObject): KubeObject {
    const store = this.#store(type);
    if ((current.metadata.finalizers ?? []).length) {
      if (current.metadata.deletionTimestamp) return clone(current);
      const updated = clone(current);
      updated.metadata.deletionTimestamp = new Date().toISOString().replace(/\.\d+Z$/, 'Z');
      if (type.custom) updated.metadata.generation = (current.metadata.generation ?? 1) + 1;
      updated.metadata.resourceVersion = String(++this.#rv);
      store.set(`${updated.metadata.namespace}/${updated.metadata.name}`, updated);
      this.#emit('MODIFIED', type, updated);
      return clone(updated);
    }
    store.delete(`${current.metadata.namespace}/${current.metadata.name}`);
    const gone = clone(current);
    gone.metadata.resourceVersion = String(++this.#rv);
    this.#emit('DELETED', type, gone);
    this.#collectGarbage(gone);
    return gone;
  }

  /** Deletes the objects owned by one that is gone (background cascading deletion). */
  #collectGarbage(owner: KubeObject): void {
    for (const type of new Set(this.#types.values())) {
      for (const object of [...this.#store(type).values()]) {
        if (object.metadata.ownerReferences?.some((ref) => ref.uid === owner.metadata.uid))
          this.#delete(type, object);
      }
    }
  }

  /** Defaults, prunes and validates a custom resource against its schema (422 on violations). */
  #admit(type: ResourceType, object: KubeObject, old: KubeObject | undefined): void {
    if (!type.schema) return;
    const errors: string[] = [];
    for (const [field, schema] of Object.entries(type.schema.properties ?? {})) {
      if (field === 'metadata' || field === 'apiVersion' || field === 'kind') continue;
      if (object[field] === undefined) continue;
      object[field] = applyDefaults(schema, object[field]);
      object[field] = prune(schema, object[field]);
      validate(schema, object[field], field, errors);
      if (this.#cel && !errors.length) validateCel(schema, object[field], old?.[field], field, errors);
    }
    for (const field of type.schema.required ?? [])
      if (object[field] === undefined) errors.push(`${field}: Required value`);
    for (const field of Object.keys(object))
      if (!['apiVersion', 'kind', 'metadata'].includes(field) && !type.schema.properties?.[field])
        delete object[field];
    if (errors.length)
      throw new HttpError(
        422,
        'Invalid',
        `${type.kind}.${type.group} "${object.metadata.name}" is invalid: ${errors.join(', ')}`,
      );
  }

  #emit(type: Change['type'], resource: ResourceType, object: KubeObject): void {
    const change: Change = {
      rv: Number(object.metadata.resourceVersion),
      type,
      typeKey: `${resource.group}/${resource.plural}`,
      object: clone(object),
    };
    this.#history.push(change);
    if (this.#history.length > 10_000) this.#history.shift();
    for (const watcher of this.#watchers) this.#deliver(watcher, change);
  }

  #deliver(watcher: Watcher, change: Change): void {
    if (watcher.muted || watcher.typeKey !== change.typeKey) return;
    if (watcher.namespace && change.object.metadata.namespace !== watcher.namespace) return;
    watcher.res.write(`${JSON.stringify({ type: change.type, object: change.object })}\n`);
  }

  #watch(
    res: ServerResponse,
    route: { type: ResourceType; namespace: string | undefined },
    query: Record<string, string>,
  ): void {
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    res.flushHeaders();
    const watcher: Watcher = {
      typeKey: `${route.type.group}/${route.type.plural}`,
      namespace: route.namespace,
      res,
      timer: undefined,
      muted: false,
    };
    const rv = query.resourceVersion;
    if (rv && rv !== '0') {
      if (Number(rv) < this.#compactedRv) {
        res.write(
          `${JSON.stringify({ type: 'ERROR', object: statusBody(410, 'Expired', `too old resource version: ${rv} (${this.#compactedRv})`) })}\n`,
        );
        res.end();
        return;
      }
      for (const change of this.#history) if (change.rv > Number(rv)) this.#deliver(watcher, change);
    } else {
      // No resourceVersion: the current state as ADDED events, then changes.
      for (const object of this.#store(route.type).values())
        this.#deliver(watcher, {
          rv: this.#rv,
          type: 'ADDED',
          typeKey: watcher.typeKey,
          object: clone(object),
        });
    }
    const timeout = Number(query.timeoutSeconds);
    if (timeout > 0) {
      watcher.timer = setTimeout(() => this.#endWatch(watcher), timeout * 1000);
      watcher.timer.unref();
    }
    this.#watchers.add(watcher);
    res.on('close', () => {
      clearTimeout(watcher.timer);
      if (this.#watchers.delete(watcher)) this.#notify();
    });
    this.#notify();
  }

  #endWatch(watcher: Watcher): void {
    clearTimeout(watcher.timer);
    this.#watchers.delete(watcher);
    watcher.res.end();
  }
}

const MICRO_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$/;

/** Lease times are MicroTime: RFC 3339 with exactly six fractional digits, as the API server parses them. */
function checkLease(object: KubeObject): void {
  const spec = (object.spec ?? {}) as Record<string, unknown>;
  for (const field of ['acquireTime', 'renewTime']) {
    const value = spec[field];
    if (value !== undefined && value !== null && !(typeof value === 'string' && MICRO_TIME.test(value)))
      throw new HttpError(
        400,
        'BadRequest',
        `Lease in version "v1" cannot be handled as a Lease: parsing time ${JSON.stringify(value)} as "2006-01-02T15:04:05.000000Z07:00"`,
      );
  }
}

function statusBody(code: number, reason: string, message: string) {
  return { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code };
}

function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

function asObject(body: unknown): KubeObject {
  if (!body || typeof body !== 'object' || Array.isArray(body))
    throw new HttpError(400, 'BadRequest', 'the request body must be an object');
  return clone(body) as KubeObject;
}

function specOf(object: KubeObject): string {
  const { metadata: _m, status: _s, apiVersion: _a, kind: _k, ...rest } = object;
  return JSON.stringify(rest);
}

function foldStringData(secret: KubeObject): void {
  const stringData = secret.stringData as Record<string, string> | undefined;
  if (!stringData) return;
  const data = { ...((secret.data as Record<string, string> | undefined) ?? {}) };
  for (const [k, v] of Object.entries(stringData)) data[k] = Buffer.from(v, 'utf8').toString('base64');
  secret.data = data;
  delete secret.stringData;
}

/** RFC 7386 JSON merge patch. */
export function mergePatch(target: unknown, patch: unknown): unknown {
  if (!patch || typeof patch !== 'object' || Array.isArray(patch)) return clone(patch);
  const result: Record<string, unknown> =
    target && typeof target === 'object' && !Array.isArray(target)
      ? { ...(target as Record<string, unknown>) }
      : {};
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete result[key];
    else result[key] = mergePatch(result[key], value);
  }
  return result;
}

/** RFC 6902 JSON patch (add, remove, replace, test). */
function jsonPatch(target: KubeObject, ops: unknown): KubeObject {
  if (!Array.isArray(ops)) throw new HttpError(400, 'BadRequest', 'a JSON patch must be an array');
  const doc = target as unknown as Record<string, unknown>;
  for (const op of ops as Array<{ op: string; path: string; value?: unknown }>) {
    const parts = op.path
      .split('/')
      .slice(1)
      .map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'));
    const last = parts.pop();
    if (last === undefined) throw new HttpError(422, 'Invalid', `bad path ${op.path}`);
    let parent: unknown = doc;
    for (const p of parts) {
      parent = (parent as Record<string, unknown>)?.[p];
      if (parent === undefined) throw new HttpError(422, 'Invalid', `path ${op.path} does not exist`);
    }
    const list = Array.isArray(parent) ? (parent as unknown[]) : undefined;
    const record = parent as Record<string, unknown>;
    if (op.op === 'test') {
      const current = list ? list[Number(last)] : record[last];
      if (JSON.stringify(current) !== JSON.stringify(op.value))
        throw new HttpError(422, 'Invalid', `test of ${op.path} failed`);
    } else if (op.op === 'remove') {
      if (list) list.splice(Number(last), 1);
      else delete record[last];
    } else if (op.op === 'add' || op.op === 'replace') {
      if (list) {
        if (op.op === 'add') list.splice(last === '-' ? list.length : Number(last), 0, op.value);
        else list[Number(last)] = op.value;
      } else record[last] = op.value;
    } else throw new HttpError(422, 'Invalid', `unsupported JSON patch op ${op.op}`);
  }
  return doc as unknown as KubeObject;
}

function applyDefaults(schema: Schema, value: unknown): unknown {
  if (value && typeof value === 'object' && !Array.isArray(value) && schema.properties) {
    const object = value as Record<string, unknown>;
    for (const [field, sub] of Object.entries(schema.properties)) {
      if (object[field] === undefined && sub.default !== undefined) object[field] = clone(sub.default);
      if (object[field] !== undefined) object[field] = applyDefaults(sub, object[field]);
    }
  } else if (Array.isArray(value) && schema.items) {
    return value.map((v) => applyDefaults(schema.items!, v));
  }
  return value;
}

function prune(schema: Schema, value: unknown): unknown {
  if (schema['x-kubernetes-preserve-unknown-fields']) return value;
  if (value && typeof value === 'object' && !Array.isArray(value)) {
    const object = value as Record<string, unknown>;
    if (schema.properties) {
      for (const field of Object.keys(object)) {
        const sub = schema.properties[field];
        if (sub) object[field] = prune(sub, object[field]);
        else if (!schema.additionalProperties) delete object[field];
      }
    } else if (typeof schema.additionalProperties === 'object') {
      for (const field of Object.keys(object))
        object[field] = prune(schema.additionalProperties, object[field]);
    }
  } else if (Array.isArray(value) && schema.items) {
    return value.map((v) => prune(schema.items!, v));
  }
  return value;
}

function validate(schema: Schema, value: unknown, path: string, errors: string[]): void {
  if (value === null) {
    if (!schema.nullable)
      errors.push(`${path}: Invalid value: "null": ${path} in body must be of type ${schema.type}`);
    return;
  }
  const actual = Array.isArray(value) ? 'array' : Number.isInteger(value) ? 'integer' : typeof value;
  const okType =
    !schema.type ||
    schema.type === actual ||
    (schema.type === 'number' && actual === 'integer') ||
    (schema.type === 'object' && actual === 'object');
  if (!okType) {
    errors.push(
      `${path}: Invalid value: "${actual}": ${path} in body must be of type ${schema.type}: "${actual}"`,
    );
    return;
  }
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(value)))
    errors.push(`${path}: Unsupported value: ${JSON.stringify(value)}`);
  if (typeof value === 'string') {
    if (schema.minLength !== undefined && value.length < schema.minLength)
      errors.push(
        `${path}: Invalid value: "${value}": ${path} in body should be at least ${schema.minLength} chars long`,
      );
    if (schema.maxLength !== undefined && value.length > schema.maxLength)
      errors.push(`${path}: Too long: may not be more than ${schema.maxLength} bytes`);
    if (schema.pattern && !new RegExp(schema.pattern, 'u').test(value))
      errors.push(`${path}: Invalid value: "${value}": ${path} in body should match '${schema.pattern}'`);
  }
  if (typeof value === 'number') {
    const { minimum, maximum } = schema as { minimum?: number; maximum?: number };
    if (minimum !== undefined && value < minimum)
      errors.push(
        `${path}: Invalid value: ${value}: ${path} in body should be greater than or equal to ${minimum}`,
      );
    if (maximum !== undefined && value > maximum)
      errors.push(
        `${path}: Invalid value: ${value}: ${path} in body should be less than or equal to ${maximum}`,
      );
  }
  if (Array.isArray(value)) {
    if (schema.minItems !== undefined && value.length < schema.minItems)
      errors.push(
        `${path}: Invalid value: ${value.length}: ${path} in body should have at least ${schema.minItems} items`,
      );
    if (schema.maxItems !== undefined && value.length > schema.maxItems)
      errors.push(`${path}: Too many: ${value.length}: must have at most ${schema.maxItems} items`);
    if (schema['x-kubernetes-list-type'] === 'set') {
      const seen = new Set(value.map((v) => JSON.stringify(v)));
      if (seen.size !== value.length) errors.push(`${path}: Duplicate value`);
    }
    if (schema.items)
      for (const [i, v] of value.entries()) validate(schema.items, v, `${path}[${i}]`, errors);
  } else if (value && typeof value === 'object') {
    const object = value as Record<string, unknown>;
    for (const field of schema.required ?? [])
      if (object[field] === undefined) errors.push(`${path}.${field}: Required value`);
    if (schema.maxProperties !== undefined && Object.keys(object).length > schema.maxProperties)
      errors.push(
        `${path}: Too many: ${Object.keys(object).length}: must have at most ${schema.maxProperties} items`,
      );
    for (const [field, v] of Object.entries(object)) {
      const sub =
        schema.properties?.[field] ??
        (typeof schema.additionalProperties === 'object' ? schema.additionalProperties : undefined);
      if (sub) validate(sub, v, `${path}.${field}`, errors);
    }
  }
}

/**
 * Evaluates the CEL rules (`x-kubernetes-validations`) of a schema and its children: `self` is the value,
 * `oldSelf` the value before an update (rules using it are skipped on create, as the API server does).
 */
function validateCel(schema: Schema, value: unknown, old: unknown, path: string, errors: string[]): void {
  if (value === undefined) return;
  for (const { rule, message, fieldPath } of schema['x-kubernetes-validations'] ?? []) {
    if (/\boldSelf\b/.test(rule) && old === undefined) continue;
    let ok: unknown;
    try {
      ok = evaluateCel(rule, { self: value, ...(old !== undefined ? { oldSelf: old } : {}) });
    } catch (err) {
      errors.push(`${path}: Invalid value: rule "${rule}" could not be evaluated: ${(err as Error).message}`);
      continue;
    }
    if (ok !== true)
      errors.push(`${path}${fieldPath ?? ''}: Invalid value: ${message ?? `failed rule: ${rule}`}`);
  }
  if (Array.isArray(value) && schema.items) {
    const keys = (schema as { 'x-kubernetes-list-map-keys'?: string[] })['x-kubernetes-list-map-keys'];
    value.forEach((v, i) => {
      // Items of a map list are matched to their old selves by key; others have none.
      const before =
        keys && Array.isArray(old)
          ? old.find((o) =>
              keys.every((k) => (o as Record<string, unknown>)?.[k] === (v as Record<string, unknown>)?.[k]),
            )
          : undefined;
      validateCel(schema.items!, v, before, `${path}[${i}]`, errors);
    });
  } else if (value && typeof value === 'object' && schema.properties) {
    const object = value as Record<string, unknown>;
    const before = old && typeof old === 'object' ? (old as Record<string, unknown>) : undefined;
    for (const [field, sub] of Object.entries(schema.properties))
      validateCel(sub, object[field], before?.[field], `${path}.${field}`, errors);
  }
}

// ---- test targets ----------------------------------------------------------------------------------

export const CRD_FILE = new URL('../../crds/webhooksubscriptions.tollgate.dev.yaml', import.meta.url)
  .pathname;

/**
 * Where the operator tests run: the fake API server above, or a real cluster when KUBECONFIG is set
 * (the CRD is installed when missing; each target gets its own namespace, deleted afterwards).
 */
export interface KubeTarget {
  kubeConfig: KubeConfig;
  /** Present when running against the fake server (for fault injection and request inspection). */
  fake: FakeKubeApiServer | undefined;
  namespace: string;
  /** Resolves with check()'s first truthy value: re-checked on every change (fake) or every 250 ms (cluster). */
  until<T>(
    check: () => Promise<T | undefined | false> | T | undefined | false,
    what: string,
    timeoutMs?: number,
  ): Promise<T>;
  close(): Promise<void>;
}

export const realCluster = Boolean(process.env.KUBECONFIG);

/** Every CRD of crds/ (the deployment's kinds besides WebhookSubscription). */
export const ALL_CRD_FILES = readdirSync(new URL('../../crds/', import.meta.url).pathname)
  .filter((f) => f.endsWith('.yaml'))
  .map((f) => new URL(`../../crds/${f}`, import.meta.url).pathname);

export async function kubeTarget(
  name: string,
  options: { crdFiles?: string[]; cel?: boolean } = {},
): Promise<KubeTarget> {
  const namespace = `${name}-${randomUUID().slice(0, 6)}`;
  const crdFiles = options.crdFiles ?? [CRD_FILE];
  if (!realCluster) {
    const fake = new FakeKubeApiServer({ crdFiles, ...(options.cel ? { cel: true } : {}) });
    const url = await fake.start();
    const kubeConfig = new KubeConfig();
    kubeConfig.loadFromOptions({
      clusters: [{ name: 'fake', server: url, skipTLSVerify: true }],
      users: [{ name: 'test' }],
      contexts: [{ name: 'fake', cluster: 'fake', user: 'test' }],
      currentContext: 'fake',
    });
    return {
      kubeConfig,
      fake,
      namespace,
      until: (check, what, timeoutMs = 15_000) => untilSignalled(fake, check, what, timeoutMs),
      close: () => fake.stop(),
    };
  }
  const kubeConfig = new KubeConfig();
  kubeConfig.loadFromDefault();
  const core = kubeConfig.makeApiClient(CoreV1Api);
  for (const file of crdFiles) await installCrd(kubeConfig, file);
  await core.createNamespace({ body: { metadata: { name: namespace } } });
  return {
    kubeConfig,
    fake: undefined,
    namespace,
    until: (check, what, timeoutMs = 30_000) => untilPolled(check, what, timeoutMs),
    close: async () => {
      await releaseFinalizers(kubeConfig, namespace);
      await core.deleteNamespace({ name: namespace }).catch(() => {});
    },
  };
}

/**
 * Takes the operator's finalizers off every tollgate.dev resource left in the namespace. The operator under
 * test may have stopped before the resource was deleted: without this the namespace stays Terminating.
 */
export async function releaseFinalizers(kubeConfig: KubeConfig, namespace: string): Promise<void> {
  const custom = kubeConfig.makeApiClient(CustomObjectsApi);
  const plurals = ALL_CRD_FILES.map((file) => parseYaml(readFileSync(file, 'utf8')).spec.names.plural);
  for (const plural of plurals as string[]) {
    const ref = { group: 'tollgate.dev', version: 'v1alpha1', namespace, plural };
    const list = (await custom.listNamespacedCustomObject(ref).catch(() => ({ items: [] }))) as {
      items: Array<{ metadata: { name: string; finalizers?: string[] } }>;
    };
    await Promise.all(
      list.items
        .filter((o) => o.metadata.finalizers?.length)
        .map((o) =>
          custom
            .patchNamespacedCustomObject(
              { ...ref, name: o.metadata.name, body: { metadata: { finalizers: null } } },
              setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
            )
            .catch(() => {}),
        ),
    );
  }
}

async function installCrd(kubeConfig: KubeConfig, file = CRD_FILE): Promise<void> {
  const api = kubeConfig.makeApiClient(ApiextensionsV1Api);
  // Typed, so that fields such as x-kubernetes-validations survive the client's serializer.
  const crd = loadYaml<V1CustomResourceDefinition>(readFileSync(file, 'utf8'));
  const name = crd.metadata!.name!;
  try {
    await api.readCustomResourceDefinition({ name });
    return;
  } catch {}
  await api.createCustomResourceDefinition({ body: crd });
  await untilPolled(
    async () => {
      const got = await api.readCustomResourceDefinition({ name });
      return got.status?.conditions?.some((c) => c.type === 'Established' && c.status === 'True');
    },
    'the CRD to be established',
    30_000,
  );
}

function untilSignalled<T>(
  fake: FakeKubeApiServer,
  check: () => Promise<T | undefined | false> | T | undefined | false,
  what: string,
  timeoutMs: number,
): Promise<T> {
  return new Promise((resolve, reject) => {
    let running = false;
    let again = false;
    let done = false;
    const finish = (fn: () => void) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      unsubscribe();
      fn();
    };
    const attempt = async () => {
      if (running) {
        again = true;
        return;
      }
      running = true;
      try {
        do {
          again = false;
          const value = await check();
          if (value !== undefined && value !== false) return finish(() => resolve(value));
        } while (again && !done);
      } catch (err) {
        finish(() => reject(err));
      } finally {
        running = false;
      }
    };
    const timer = setTimeout(
      () => finish(() => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`))),
      timeoutMs,
    );
    const unsubscribe = fake.onChange(() => void attempt());
    void attempt();
  });
}

async function untilPolled<T>(
  check: () => Promise<T | undefined | false> | T | undefined | false,
  what: string,
  timeoutMs: number,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}
