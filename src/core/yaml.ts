import { createRequire } from 'node:module';
import type * as Yaml from 'yaml';

let loaded: typeof Yaml | undefined;

/**
 * The yaml library, loaded when a pricing file is first read or shown (the CLI, the admin API, the
 * dashboard): a proxy serving requests never needs it. (Its Node build is CommonJS either way.)
 */
export function yaml(): typeof Yaml {
  loaded ??= createRequire(import.meta.url)('yaml') as typeof Yaml;
  return loaded;
}
