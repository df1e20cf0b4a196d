import { describe, expect, it } from 'vitest';
import { FLOORS, measure, roomOf } from '../../scripts/layers.ts';

/**
 * The house keeps its shape (docs/architecture.md): a room imports only rooms on its own floor or below,
 * no two rooms import each other, only the top floor imports `AppContext`, and no file or function
 * grows past what one person reads at once. `node scripts/layers.ts` prints the same measures.
 */
const structure = measure();

describe('the structure of src/', () => {
  it('has every room on a floor', () => {
    const rooms = new Set(
      structure.arrows.filter((a) => a.from.startsWith('src/')).map((a) => roomOf(a.from)),
    );
    const placed = new Set(FLOORS.flat());
    expect([...rooms].filter((room) => !placed.has(room) && !room.endsWith('.ts'))).toEqual([]);
  });

  it('has no import that climbs to a higher floor', () => {
    expect(structure.climbs.map((a) => `${a.from} -> ${a.to}`)).toEqual([]);
  });

  it('has no rooms in a circle', () => {
    expect(structure.roomCircles).toEqual([]);
  });

  it('has no files in a circle but the tracing SDK, imported lazily when traces are on', () => {
    expect(structure.fileCircles).toEqual([['src/tracing/index.ts', 'src/tracing/sdk.ts']]);
  });

  it('has AppContext imported by the top floor only, and by at most 12 files', () => {
    const top = new Set(FLOORS.at(-1));
    expect(structure.appContextImporters.filter((file) => !top.has(roomOf(file)))).toEqual([]);
    expect(structure.appContextImporters.length).toBeLessThanOrEqual(12);
  });

  it('has no src file over 600 lines (data and migrations aside) and no function over 120', () => {
    expect(structure.longFiles).toEqual([]);
    expect(structure.longFunctions).toEqual([]);
  });
});
