/**
 * A Tollgate proxy in its own process on the test schema named by TEST_ID (a second pod of a test's
 * context). Prints its URL once it listens; tests kill it with SIGKILL to play a crash. TEST_ESCROW=1 runs
 * escrow (slices of 16 requests, given back when idle) instead of a hold per request.
 */
import { buildServer } from '../../src/http/server.ts';
import { createTestContext } from './context.ts';

const escrow: Record<string, string> =
  process.env.TEST_ESCROW === '1' ? { ESCROW_IDLE_MS: '30000', ESCROW_SLICE_REQUESTS: '16' } : {};
const ctx = await createTestContext(escrow, { id: process.env.TEST_ID! });
const app = await buildServer(ctx);
await app.listen({ port: 0, host: '127.0.0.1' });
const { port } = app.server.address() as { port: number };
process.stdout.write(`http://127.0.0.1:${port}\n`);
