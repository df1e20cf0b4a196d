import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ConfigError, configDocs, configSchema, loadConfig } from '../../src/config/index.ts';

describe('configuration', () => {
  it('applies the documented defaults', () => {
    const config = loadConfig({});
    expect(config.PORT).toBe(8080);
    expect(config.WEBHOOK_MAX_ATTEMPTS).toBe(8);
    expect(config.WEBHOOK_BACKOFF_BASE_MS).toBe(30_000);
    expect(config.DATABASE_URL).toBeUndefined();
  });

  it('names the variable and the problem in one line', () => {
    expect(() => loadConfig({ PORT: 'eighty' })).toThrowError(
      /^configuration error: PORT must be a whole number \(got "eighty"\)$/,
    );
    expect(() => loadConfig({ WEBHOOK_MAX_ATTEMPTS: '0' })).toThrowError(
      /WEBHOOK_MAX_ATTEMPTS must be at least 1/,
    );
    expect(() => loadConfig({ DATABASE_URL: 'mysql://x' })).toThrowError(
      /DATABASE_URL must be a URL starting with postgres:/,
    );
    expect(() => loadConfig({ TOLLGATE_ENCRYPTION_KEY: 'short' })).toThrowError(
      /TOLLGATE_ENCRYPTION_KEY must be 32 bytes/,
    );
    expect(() => loadConfig({ WEBHOOK_ALLOW_HTTP: 'maybe' })).toThrowError(ConfigError);
  });

  it('treats empty strings as unset', () => {
    expect(loadConfig({ PORT: '', REDIS_URL: '  ' }).PORT).toBe(8080);
  });

  it('documents every setting', () => {
    expect(Object.keys(configDocs).sort()).toEqual(Object.keys(configSchema.shape).sort());
  });

  it('is documented in docs/configuration.md exactly as scripts/config-table.ts prints it', () => {
    const table = spawnSync(process.execPath, ['scripts/config-table.ts'], {
      encoding: 'utf8',
    }).stdout.trim();
    expect(table.split('\n').length).toBe(Object.keys(configDocs).length + 2);
    expect(readFileSync('docs/configuration.md', 'utf8')).toContain(table);
  });

  it('stops the CLI at start-up with one clear line', () => {
    const run = spawnSync(process.execPath, ['cmd/tollgate.ts', 'migrate'], {
      env: { ...process.env, PORT: '-1' },
      encoding: 'utf8',
    });
    expect(run.status).toBe(2);
    expect(run.stderr.trim()).toBe('configuration error: PORT must be at least 0 (got "-1")');
  });
});
