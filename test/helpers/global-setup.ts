import net from 'node:net';
import pg from 'pg';

/**
 * Runs once before the suite: finds out whether the local Postgres and Redis answer, and tells the test
 * files through the environment (`TOLLGATE_TEST_PG`, `TOLLGATE_TEST_REDIS`: a URL, or empty for the
 * embedded fallback). Drops schemas left behind by earlier runs.
 */
const DEFAULT_PG = 'postgres://postgres@127.0.0.1:5432/test';
const DEFAULT_REDIS = 'redis://127.0.0.1:6379';

function reachable(url: string): Promise<boolean> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    const socket = net.connect({ host: hostname, port: Number(port), timeout: 1000 });
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
    socket.once('timeout', () => {
      socket.destroy();
      resolve(false);
    });
  });
}

export default async function setup(): Promise<() => Promise<void>> {
  const pgUrl = process.env.TEST_DATABASE_URL ?? DEFAULT_PG;
  const redisUrl = process.env.TEST_REDIS_URL ?? DEFAULT_REDIS;
  let pgOk = false;
  if (await reachable(pgUrl)) {
    const client = new pg.Client({ connectionString: pgUrl });
    try {
      await client.connect();
      const { rows } = await client.query<{ nspname: string }>(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'tgt\\_%'",
      );
      // Schemas are named tgt_<seconds since the epoch in base 36>_…: drop those older than an hour, so
      // runs in progress elsewhere keep theirs.
      const cutoff = Math.floor(Date.now() / 1000) - 3600;
      for (const { nspname } of rows) {
        const born = Number.parseInt(nspname.split('_')[1] ?? '', 36);
        if (!(born > cutoff)) await client.query(`DROP SCHEMA IF EXISTS ${nspname} CASCADE`);
      }
      pgOk = true;
    } catch (err) {
      console.warn(
        `Postgres at ${pgUrl} is not usable (${(err as Error).message}); tests use the embedded database`,
      );
    } finally {
      await client.end().catch(() => {});
    }
  } else {
    console.warn(`Postgres at ${pgUrl} is not reachable; tests use the embedded database`);
  }
  const redisOk = await reachable(redisUrl);
  if (!redisOk) console.warn(`Redis at ${redisUrl} is not reachable; tests use the in-process bus`);
  process.env.TOLLGATE_TEST_PG = pgOk ? pgUrl : '';
  process.env.TOLLGATE_TEST_REDIS = redisOk ? redisUrl : '';
  return async () => {};
}
