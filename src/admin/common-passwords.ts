import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The common passwords sign-up refuses: ./common-passwords.txt (where the list comes from is written at
 * its top), read on first use. The file is found from this module up: beside the sources, or — in the
 * bundle, dist/bin/ — at the same path under the directory holding dist/ (rolldown.config.ts
 * `runtimeFiles` lists it, so the image and the tests' bundle carry it).
 */

const DATA = join('src', 'admin', 'common-passwords.txt');

let common: Set<string> | undefined;

function load(): Set<string> {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const file = join(dir, DATA);
    if (existsSync(file)) {
      const lines = readFileSync(file, 'utf8').split('\n');
      return new Set(lines.filter((line) => line !== '' && !line.startsWith('#')));
    }
    const parent = dirname(dir);
    if (parent === dir) throw new Error(`${DATA} not found above ${fileURLToPath(import.meta.url)}`);
    dir = parent;
  }
}

/** Whether the password, lower-cased, is one of the common passwords of leaked password sets. */
export function isCommonPassword(password: string): boolean {
  common ??= load();
  return common.has(password.toLowerCase());
}
