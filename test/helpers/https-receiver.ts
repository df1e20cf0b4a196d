import { execFileSync } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { verifyWebhook } from '../../src/webhooks/verify.ts';

/**
 * A test certificate authority made at test time with openssl, and a server certificate it signed for
 * `localhost` and 127.0.0.1. Tollgate trusts the CA through WEBHOOK_CA_FILE.
 */
export interface TestCa {
  dir: string;
  caFile: string;
  key: string;
  cert: string;
  remove(): void;
}

export function makeTestCa(): TestCa {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-ca-'));
  const run = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
  run(
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:prime256v1',
    '-nodes',
    '-days',
    '1',
    '-subj',
    '/CN=Tollgate Test CA',
    '-keyout',
    'ca.key',
    '-out',
    'ca.pem',
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-addext',
    'keyUsage=critical,keyCertSign,cRLSign',
  );
  run(
    'req',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:prime256v1',
    '-nodes',
    '-subj',
    '/CN=localhost',
    '-keyout',
    'server.key',
    '-out',
    'server.csr',
  );
  writeFileSync(
    join(dir, 'server.ext'),
    'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n',
  );
  run(
    'x509',
    '-req',
    '-in',
    'server.csr',
    '-CA',
    'ca.pem',
    '-CAkey',
    'ca.key',
    '-CAcreateserial',
    '-days',
    '1',
    '-extfile',
    'server.ext',
    '-out',
    'server.pem',
  );
  return {
    dir,
    caFile: join(dir, 'ca.pem'),
    key: readFileSync(join(dir, 'server.key'), 'utf8'),
    cert: readFileSync(join(dir, 'server.pem'), 'utf8'),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}

export interface Received {
  /** Order of arrival, from 0. */
  index: number;
  path: string;
  headers: IncomingHttpHeaders;
  rawBody: Buffer;
  body: { delivery: Record<string, any>; event: Record<string, any> };
  /** Signature and timestamp checked with the subscription's secret (verifyWebhook). */
  verified: boolean;
  verifyReason: string | undefined;
  at: number;
}

export interface Reply {
  status: number;
  headers?: Record<string, string>;
  body?: string;
  /** Never answer (the connection stays open until the receiver closes). */
  hang?: boolean;
}

export type Responder = (request: Received) => Reply | Promise<Reply>;

export interface Receiver {
  /** https://localhost:PORT */
  url: string;
  port: number;
  received: Received[];
  /** Secrets by subscription id, for verification. */
  secrets: Map<string, string>;
  respond: Responder;
  /** Resolves with the requests once `predicate` holds for the list; rejects after `timeoutMs`. */
  waitFor(predicate: (all: Received[]) => boolean, timeoutMs?: number): Promise<Received[]>;
  close(): Promise<void>;
}

export async function startReceiver(
  ca: TestCa,
  respond: Responder = () => ({ status: 200 }),
): Promise<Receiver> {
  const emitter = new EventEmitter().setMaxListeners(0);
  const pending = new Set<ServerResponse>();
  const receiver: Receiver = {
    url: '',
    port: 0,
    received: [],
    secrets: new Map(),
    respond,
    waitFor(predicate, timeoutMs = 15_000) {
      return new Promise((resolve, reject) => {
        if (predicate(receiver.received)) return resolve(receiver.received);
        const timer = setTimeout(() => {
          emitter.off('request', check);
          reject(
            new Error(
              `receiver: condition not met within ${timeoutMs} ms (${receiver.received.length} requests)`,
            ),
          );
        }, timeoutMs);
        const check = () => {
          if (predicate(receiver.received)) {
            clearTimeout(timer);
            emitter.off('request', check);
            resolve(receiver.received);
          }
        };
        emitter.on('request', check);
      });
    },
    async close() {
      for (const res of pending) res.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const server = createServer({ key: ca.key, cert: ca.cert }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', async () => {
      const rawBody = Buffer.concat(chunks);
      let body: Received['body'];
      try {
        body = JSON.parse(rawBody.toString('utf8'));
      } catch {
        body = { delivery: {}, event: {} };
      }
      const secret = receiver.secrets.get(String(body.delivery?.subscriptionId));
      const verdict = secret ? verifyWebhook(secret, rawBody, req.headers) : undefined;
      const received: Received = {
        index: receiver.received.length,
        path: req.url ?? '/',
        headers: req.headers,
        rawBody,
        body,
        verified: verdict?.ok === true,
        verifyReason: verdict && !verdict.ok ? verdict.reason : secret ? undefined : 'no secret known',
        at: Date.now(),
      };
      receiver.received.push(received);
      let reply: Reply;
      try {
        reply = await receiver.respond(received);
      } catch {
        reply = { status: 500 };
      }
      emitter.emit('request');
      if (reply.hang) {
        pending.add(res);
        return;
      }
      res.writeHead(reply.status, { 'content-type': 'text/plain', ...(reply.headers ?? {}) });
      res.end(reply.body ?? 'ok');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  receiver.port = (server.address() as AddressInfo).port;
  receiver.url = `https://localhost:${receiver.port}`;
  return receiver;
}
