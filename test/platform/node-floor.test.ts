import { spawnSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

/**
 * One Node floor, 22.18 (the first Node 22 that runs the `.ts` entry points as they are): the floor in
 * scripts/with-node.sh, `engines` and the README agree, and below it with-node.sh puts Node 24 from
 * ~/.node24 first — as it does below 22. The Node "found" is the real one reporting another version.
 */

const root = join(import.meta.dirname, '..', '..');
const scratch = mkdtempSync(join(tmpdir(), 'tollgate-node-floor-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

const floorOf = (text: string, pattern: RegExp) => pattern.exec(text)?.[1];

/** A directory whose `node` is this Node reporting `version` (undefined: its own). */
function nodeReporting(name: string, version: string | undefined): string {
  const dir = join(scratch, name);
  mkdirSync(dir, { recursive: true });
  const fake = join(scratch, 'version.cjs');
  writeFileSync(
    fake,
    'if (process.env.FAKE_NODE_VERSION) Object.defineProperty(process.versions, "node", { value: process.env.FAKE_NODE_VERSION });\n',
  );
  const script = version
    ? `#!/bin/sh\nFAKE_NODE_VERSION=${version} exec "${process.execPath}" --require "${fake}" "$@"\n`
    : `#!/bin/sh\nFAKE_NODE_VERSION= exec "${process.execPath}" "$@"\n`;
  writeFileSync(join(dir, 'node'), script);
  chmodSync(join(dir, 'node'), 0o755);
  return dir;
}

/** The Node version with-node.sh runs a command on, when the Node on PATH says `found`. */
function versionRunWith(found: string): string {
  const home = join(scratch, `home-${found}`);
  // ~/.node24 as with-node.sh installs it: here the real Node (24), so nothing is downloaded
  const provisioned = nodeReporting(join(`home-${found}`, '.node24', 'node_modules', '.bin'), undefined);
  expect(provisioned.startsWith(home)).toBe(true);
  const bin = nodeReporting(`path-${found}`, found);
  const res = spawnSync('bash', ['scripts/with-node.sh', 'node', '-p', 'process.versions.node'], {
    cwd: root,
    env: { PATH: `${bin}:/usr/bin:/bin`, HOME: home },
    encoding: 'utf8',
    timeout: 60_000,
  });
  expect(res.stderr).not.toContain('installing Node 24');
  expect(res.status).toBe(0);
  return res.stdout.trim();
}

describe('the Node floor', () => {
  it('is 22.18 in with-node.sh, engines and the README', () => {
    const script = readFileSync(join(root, 'scripts', 'with-node.sh'), 'utf8');
    const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { engines: { node: string } };
    const readme = readFileSync(join(root, 'README.md'), 'utf8');
    expect(floorOf(script, /^NODE_FLOOR=(\S+)$/m)).toBe('22.18');
    expect(pkg.engines.node).toBe('>=22.18');
    expect(floorOf(readme, /Node found is older than (\d+\.\d+)/)).toBe('22.18');
  });

  it('runs on a Node at the floor, and on Node 24 from ~/.node24 below it (22.17, 22.12, 20)', () => {
    expect(versionRunWith('22.18.0')).toBe('22.18.0');
    expect(versionRunWith('23.1.0')).toBe('23.1.0');
    for (const below of ['22.17.1', '22.12.0', '20.20.2']) {
      expect(versionRunWith(below)).toBe(process.versions.node);
    }
  });
});
