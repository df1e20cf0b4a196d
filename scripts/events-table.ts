// Prints the event catalog table of docs/webhooks.md from src/events/catalog.ts: `node scripts/events-table.ts`.
import { eventCatalog } from '../src/events/catalog.ts';

export function eventsTable(): string {
  const lines = ['| Event | Version | When | `data` |', '|---|---|---|---|'];
  for (const [type, info] of Object.entries(eventCatalog)) {
    const data = Object.entries(info.data as Record<string, string>)
      .map(([field, meaning]) => `\`${field}\`: ${meaning}`)
      .join('; ');
    lines.push(`| \`${type}\` | ${info.version} | ${info.description} | ${data} |`);
  }
  return lines.join('\n');
}

if (process.argv[1]?.endsWith('events-table.ts')) console.log(eventsTable());
