/**
 * A delivery worker in its own process, configured from the environment (plus TEST_SCHEMA and
 * TEST_BUS_PREFIX). Prints `ready` once it listens; tests kill it with SIGKILL to play a crash.
 */
import { createContext } from '../../src/app/context.ts';
import { loadConfig } from '../../src/config/index.ts';
import { startDeliveryWorker } from '../../src/webhooks/worker/index.ts';

const config = loadConfig(process.env);
const ctx = await createContext(config, {
  ...(process.env.TEST_SCHEMA ? { schema: process.env.TEST_SCHEMA } : {}),
  ...(process.env.TEST_BUS_PREFIX ? { busPrefix: process.env.TEST_BUS_PREFIX } : {}),
});
const worker = startDeliveryWorker(ctx);
await worker.ready;
process.stdout.write('ready\n');
process.once('SIGTERM', async () => {
  await worker.stop(1000);
  await ctx.close();
  process.exit(0);
});
