/**
 * One operator replica in its own process (for leader-election tests that kill -9 a replica): the real
 * `startOperator` with the real delivery worker, on the test's Postgres schema and bus prefix.
 * Environment: the usual configuration variables, plus TEST_ID (schema tgt_<id>, bus prefix t<id>:),
 * WATCH_NAMESPACE, and FAKE_KUBE_SERVER (an API server URL) or KUBECONFIG.
 * Writes one JSON line per leadership change on stdout; on SIGTERM shuts down like `tollgate operator`.
 */
import { createContext } from '../../src/app/context.ts';
import { startOperator } from '../../src/cli/operator.ts';
import { loadConfig } from '../../src/config/index.ts';
import { kubeConfigForServer, loadKubeConfig, makeClients } from '../../src/operator/runtime/kube.ts';

const id = process.env.TEST_ID;
if (!id) throw new Error('TEST_ID is required');
const config = loadConfig();
const ctx = await createContext(config, { schema: `tgt_${id}`, busPrefix: `t${id}:` });
const server = process.env.FAKE_KUBE_SERVER;
const kube = makeClients(server ? kubeConfigForServer(server) : loadKubeConfig());
const operator = startOperator(ctx, { kube, namespaces: [process.env.WATCH_NAMESPACE ?? 'default'] });

let leading = false;
const report = setInterval(() => {
  if (operator.isLeader() !== leading) {
    leading = operator.isLeader();
    process.stdout.write(`${JSON.stringify({ identity: operator.identity, leading })}\n`);
  }
}, 50);

process.once('SIGTERM', () => {
  clearInterval(report);
  process.stdout.write(`${JSON.stringify({ identity: operator.identity, stopping: true })}\n`);
  operator
    .shutdown(config.OPERATOR_SHUTDOWN_GRACE_SECONDS * 1000)
    .then(() => ctx.close())
    .then(
      () => process.exit(0),
      (err) => {
        process.stderr.write(`${(err as Error).stack}\n`);
        process.exit(1);
      },
    );
});
// The test process holds our stdin open: when it goes away (even killed), so do we.
process.stdin.resume();
process.stdin.once('close', () => process.exit(1));
process.stdout.write(`${JSON.stringify({ identity: operator.identity, started: true })}\n`);
