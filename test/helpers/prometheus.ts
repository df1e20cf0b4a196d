import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect } from 'vitest';

/**
 * A real Prometheus server (the Debian package's /usr/bin/prometheus, or PROMETHEUS_BIN) scraping one
 * target on loopback every second, with its HTTP API to read results back.
 */
export const PROMETHEUS = process.env.PROMETHEUS_BIN ?? '/usr/bin/prometheus';

/** True when the binary is there; otherwise warns once, naming the test that skips. */
export function prometheusAvailable(testName: string): boolean {
  if (existsSync(PROMETHEUS)) return true;
  console.warn(
    `${testName}: skipped, ${PROMETHEUS} is missing (install the Debian package \`prometheus\`, ` +
      'as scripts/ci-system-packages.sh does, or set PROMETHEUS_BIN)',
  );
  return false;
}

export interface VectorResult {
  metric: Record<string, string>;
  value: [number, string];
}

export interface RunningPrometheus {
  /** Runs an instant query; no result while Prometheus is still starting. */
  query(promql: string): Promise<VectorResult[]>;
  /** True once the process has exited (an early exit means a broken start: see `log()`). */
  exited(): boolean;
  /** The last 4 000 characters Prometheus wrote to stderr. */
  log(): string;
  /** Stops Prometheus (SIGTERM, SIGKILL after 10 s) and removes its data. */
  stop(): Promise<void>;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

/** Starts Prometheus scraping `target` (`host:port`, path `/metrics`). */
export async function startPrometheus(target: string): Promise<RunningPrometheus> {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-prometheus-'));
  writeFileSync(
    join(dir, 'prometheus.yml'),
    [
      'global:',
      '  scrape_interval: 1s',
      '  scrape_timeout: 1s',
      'scrape_configs:',
      '  - job_name: tollgate',
      '    metrics_path: /metrics',
      '    static_configs:',
      `      - targets: ['${target}']`,
      '',
    ].join('\n'),
  );
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const child: ChildProcess = spawn(
    PROMETHEUS,
    [
      `--config.file=${join(dir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--storage.tsdb.retention.time=1h',
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let log = '';
  child.stderr?.on('data', (chunk: Buffer) => {
    log = (log + chunk.toString()).slice(-4000);
  });
  return {
    async query(promql) {
      let res: Response;
      try {
        res = await fetch(`${url}/api/v1/query?query=${encodeURIComponent(promql)}`);
      } catch (err) {
        if (err instanceof TypeError) return []; // not listening yet
        throw err;
      }
      // Prometheus answers 503 "Service Unavailable" (not JSON) until it has started: no result yet.
      if (res.status === 503) return [];
      const body = (await res.json()) as { status: string; error?: string; data: { result: VectorResult[] } };
      expect(body.status, `${promql}: ${body.error ?? ''}`).toBe('success');
      return body.data.result;
    },
    exited: () => child.exitCode !== null,
    log: () => log,
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((resolve) => child.once('exit', resolve));
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
        await exited;
        clearTimeout(timer);
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
