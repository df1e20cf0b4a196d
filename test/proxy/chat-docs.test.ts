import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { eventsTable } from '../../scripts/events-table.ts';

/** The event catalog of docs/webhooks.md is the one in src/events/catalog.ts (`node scripts/events-table.ts`). */
describe('documentation', () => {
  it('docs/webhooks.md lists every event of the catalog as the generator prints it', () => {
    const readme = readFileSync(new URL('../../docs/webhooks.md', import.meta.url), 'utf8');
    expect(readme).toContain(eventsTable());
  });
});
