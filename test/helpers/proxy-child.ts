/**
 * A Tollgate proxy in its own process on the test schema named by TEST_ID (a second pod of a test's
 * context). Prints its URL once it listens; tests kill it with SIGKILL to play a crash.
 */
import { buildServer } from '../../src/http/server.ts';
import { createTestContext } from './context.ts';

const ctx = await createTestContext({}, { id: process.env.TEST_ID! });
const app = await buildServer(ctx);
await app.listen({ port: 0, host: '127.0.0.1' });
const { port } = app.server.address() as { port: number };
process.stdout.write(`http://127.0.0.1:${port}\n`);
