// Prints the configuration table of docs/configuration.md from the configuration schema: `node scripts/config-table.ts`.
import { configDocs, configSchema } from '../src/config/index.ts';

const defaults = configSchema.parse({}) as Record<string, unknown>;
console.log('| Variable | Default | Meaning |');
console.log('|---|---|---|');
for (const [name, doc] of Object.entries(configDocs)) {
  const value = defaults[name];
  console.log(`| \`${name}\` | ${value === undefined ? '—' : `\`${String(value)}\``} | ${doc} |`);
}
