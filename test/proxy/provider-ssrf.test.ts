import { createServer as createHttpServer, type Server } from 'node:http';
import { createServer as createTcpServer, type Socket, type Server as TcpServer } from 'node:net';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config/index.ts';
import { REFUSED_DESTINATION } from '../../src/net/destination.ts';
import { createUpstreamAgent } from '../../src/upstream/openai-compatible.ts';
import { connectUser } from '../../src/users/service.ts';
import { api, seedProject, signUpAndIn, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * Provider base URLs cannot reach internal services (issue 22, item 1). With
 * TOLLGATE_ALLOW_PRIVATE_PROVIDERS off (production), a "metadata" service on loopback that hands out
 * secrets for any path is never reached through a provider URL: not by the connect check (an address
 * literal, `localhost`, an IPv4-mapped IPv6 literal, a query or fragment that swallows the appended
 * path), and not on requests — metered or passed through — even when such a URL is already stored (a
 * row from before, or a name that resolved elsewhere when it was saved). With the setting on (the test
 * helper's default, and `tollgate dev`), a provider that cannot be reached answers one fixed message
 * whatever the port behind it does, so the check is no port scanner.
 */
const SECRET = { AccessKeyId: 'AKIAEXAMPLE', SecretAccessKey: 'do-not-leak' };

let metadata: Server;
let metadataPort: number;
let metadataHits = 0;
let strict: TestServer;
let relaxed: TestServer;
let garbage: TcpServer;
let garbagePort: number;
const sockets = new Set<Socket>();

beforeAll(async () => {
  metadata = createHttpServer((req, res) => {
    metadataHits++;
    req.resume();
    // Any path answers 200 JSON (it passes a check that only wants "200 and JSON").
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ object: 'list', data: [{ id: 'm' }], ...SECRET }));
  });
  await new Promise<void>((resolve) => metadata.listen(0, '127.0.0.1', resolve));
  metadataPort = (metadata.address() as { port: number }).port;
  // An open port that does not speak HTTP.
  garbage = createTcpServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    socket.end('SSH-2.0-OpenSSH_9.6\r\n');
  });
  await new Promise<void>((resolve) => garbage.listen(0, '127.0.0.1', resolve));
  garbagePort = (garbage.address() as { port: number }).port;
  strict = await startTestServer({ TOLLGATE_ALLOW_PRIVATE_PROVIDERS: 'false' });
  relaxed = await startTestServer();
});
afterAll(async () => {
  await strict?.close();
  await relaxed?.close();
  metadata?.closeAllConnections();
  await new Promise((resolve) => metadata?.close(resolve));
  for (const socket of sockets) socket.destroy();
  await new Promise((resolve) => garbage?.close(resolve));
});

async function developerProject(server: TestServer, email: string) {
  const token = await signUpAndIn(server, { email, password: 'a long enough password' });
  const created = await api(server, token, 'POST', '/admin/v1/projects', { name: 'Probe' });
  return { token, projectId: created.body.project.id as string };
}

describe('provider URLs with private providers refused (production)', () => {
  it('is the default', () => {
    expect(loadConfig({}).TOLLGATE_ALLOW_PRIVATE_PROVIDERS).toBe(false);
  });

  it('the connect check refuses private hosts and never reaches them', async () => {
    const { token, projectId } = await developerProject(strict, 'ssrf-check@example.com');
    const before = metadataHits;
    const urls = [
      `http://127.0.0.1:${metadataPort}/v1`,
      `http://localhost:${metadataPort}/v1`,
      `http://[::ffff:127.0.0.1]:${metadataPort}/v1`,
      `http://[::1]:${metadataPort}/v1`,
      `http://0.0.0.0:${metadataPort}/v1`,
      `http://169.254.169.254/latest/meta-data`,
    ];
    const messages = new Set<string>();
    for (const baseUrl of urls) {
      const res = await api(strict, token, 'PUT', `/admin/v1/projects/${projectId}/provider`, {
        baseUrl,
        apiKey: 'sk-x',
      });
      expect(res.status, baseUrl).toBe(400);
      expect(res.body.error, baseUrl).toMatchObject({ code: 'provider_check_failed', param: 'baseUrl' });
      expect(JSON.stringify(res.body)).not.toContain('SecretAccessKey');
      messages.add(res.body.error.message);
    }
    // one message for every refusal, naming no address (what a name resolves to is no one's business)
    expect([...messages]).toEqual([`Provider check failed: ${REFUSED_DESTINATION}.`]);
    expect(metadataHits).toBe(before);
    const project = await api(strict, token, 'GET', `/admin/v1/projects/${projectId}`);
    expect(project.body.provider.connected).toBe(false);
  });

  it('refuses base URLs with a query, a fragment or credentials (400, before any request)', async () => {
    const { token, projectId } = await developerProject(strict, 'ssrf-shape@example.com');
    const before = metadataHits;
    for (const baseUrl of [
      `http://127.0.0.1:${metadataPort}/latest/meta-data/iam?x=`,
      `http://127.0.0.1:${metadataPort}/latest/meta-data/iam#`,
      'https://api.example.com/v1?x=1',
      'https://api.example.com/v1#frag',
      'https://user:pass@api.example.com/v1',
      'https://user@api.example.com/v1',
      'http://[zz]/v1',
    ]) {
      const res = await api(strict, token, 'PUT', `/admin/v1/projects/${projectId}/provider`, {
        baseUrl,
        apiKey: 'sk-x',
      });
      expect(res.status, baseUrl).toBe(400);
      expect(res.body.error.param, baseUrl).toBe('baseUrl');
      expect(res.body.error.message, baseUrl).toMatch(/query|fragment|user name or password|base URL/);
    }
    expect(metadataHits).toBe(before);
  });

  it('requests never reach a private address already stored as a provider (metered or passed through)', async () => {
    for (const host of ['127.0.0.1', 'localhost']) {
      // Stored without the check (as a row from before, or a name that resolved elsewhere when saved).
      const seeded = await seedProject(strict.ctx, {
        upstreamUrl: `http://${host}:${metadataPort}/latest/meta-data/iam`,
        models: [{ id: 'm', pricing: { mode: 'per_request', perRequest: '0.01' } }],
      });
      const project = { id: seeded.projectId, owner_user_id: 'o', currency: 'usd' };
      const trigger = { source: 't', actorType: 't', actorId: 't' };
      await connectUser(strict.ctx.db, strict.ctx.events, project, 'u', trigger);
      await strict.ctx.billing.deposit({ project, externalId: 'u', amount: '1.00', source: 't', trigger });
      const before = metadataHits;
      const passthrough = await api(strict, seeded.apiKey, 'GET', '/v1/responses/anything');
      const chat = await api(strict, seeded.apiKey, 'POST', '/v1/chat/completions', {
        model: 'm',
        user: 'u',
        messages: [{ role: 'user', content: 'hi' }],
      });
      const responses = await api(strict, seeded.apiKey, 'POST', '/v1/responses', {
        model: 'm',
        user: 'u',
        input: 'hi',
      });
      for (const [name, res] of Object.entries({ passthrough, chat, responses })) {
        expect(res.status, `${host} ${name}`).toBe(502);
        expect(res.body.error, `${host} ${name}`).toMatchObject({
          code: 'upstream_unreachable',
          message: 'Could not connect to the model provider.',
        });
      }
      expect(metadataHits, host).toBe(before);
    }
  });
});

describe('the upstream agent', () => {
  it('refuses private addresses on the connection itself: literals before connecting, names in the lookup', async () => {
    const agent = createUpstreamAgent({ connectMs: 2000, responseMs: 2000, allowPrivate: false });
    try {
      const before = metadataHits;
      for (const host of ['127.0.0.1', 'localhost', '[::ffff:7f00:1]', '[::1]']) {
        const err = await request(`http://${host}:${metadataPort}/latest/meta-data`, {
          dispatcher: agent,
        }).then(
          () => undefined,
          (e: NodeJS.ErrnoException) => e,
        );
        expect(err?.code, host).toBe('EPRIVATEADDRESS');
      }
      expect(metadataHits).toBe(before);
    } finally {
      await agent.close();
    }
    const open = createUpstreamAgent({ connectMs: 2000, responseMs: 2000, allowPrivate: true });
    try {
      const res = await request(`http://localhost:${metadataPort}/v1/models`, { dispatcher: open });
      expect(res.statusCode).toBe(200);
      await res.body.text();
    } finally {
      await open.close();
    }
  });
});

describe('provider URLs with private providers allowed (dev, tests)', () => {
  it('connects to a model server on loopback', async () => {
    const { token, projectId } = await developerProject(relaxed, 'local-model@example.com');
    const res = await api(relaxed, token, 'PUT', `/admin/v1/projects/${projectId}/provider`, {
      baseUrl: `http://127.0.0.1:${metadataPort}/v1`,
      apiKey: 'sk-x',
    });
    expect(res.status).toBe(200);
  });

  it('an unreachable provider gets one fixed message: closed, non-HTTP and non-API ports look alike', async () => {
    const { token, projectId } = await developerProject(relaxed, 'ports@example.com');
    const check = (baseUrl: string) =>
      api(relaxed, token, 'PUT', `/admin/v1/projects/${projectId}/provider`, { baseUrl, apiKey: 'sk-x' });
    const closed = await check('http://127.0.0.1:1/v1');
    const notHttp = await check(`http://127.0.0.1:${garbagePort}/v1`);
    for (const res of [closed, notHttp]) {
      expect(res.status).toBe(400);
      expect(res.body.error.code).toBe('provider_check_failed');
      expect(res.body.error.message).not.toMatch(/ECONN|UND_ERR|HPE_|socket|refused|closed|parse/i);
    }
    const strip = (m: string) => m.replace(/:\d+\//, ':PORT/');
    expect(strip(closed.body.error.message)).toBe(strip(notHttp.body.error.message));

    // The same on requests: no error code or parser message in what the client sees.
    const answers: string[] = [];
    for (const port of [1, garbagePort]) {
      const seeded = await seedProject(relaxed.ctx, { upstreamUrl: `http://127.0.0.1:${port}/v1` });
      const res = await api(relaxed, seeded.apiKey, 'GET', '/v1/responses/resp_1');
      expect(res.status).toBe(502);
      answers.push(JSON.stringify(res.body));
    }
    expect(answers[0]).toBe(answers[1]);
  });
});
