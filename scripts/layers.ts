// The house's structure, measured from the code: `node scripts/layers.ts` prints it.
//
// Rooms are the folders under src/; each stands on a floor (FLOORS below, the same table as
// docs/architecture.md). A room may import rooms on its own floor or lower, never one above, and no two
// rooms may import each other, directly or round a circle. Also measured: the files that import
// `AppContext`, circles between files, files over 600 lines and functions over 120 lines.
// test/platform/architecture.test.ts holds the code to these rules.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import ts from 'typescript';

/** The floors, ground first: a room's number is its floor. docs/architecture.md says what each room holds. */
export const FLOORS: readonly (readonly string[])[] = [
  ['core', 'config', 'db', 'bus', 'net', 'metrics', 'tracing'],
  ['events', 'audit', 'idempotency', 'retention', 'tokens', 'html'],
  ['upstream'],
  ['projects', 'auth', 'models'],
  ['routing'],
  ['billing', 'limits', 'users'],
  ['paywall'],
  ['metering'],
  ['chat', 'responses', 'embeddings', 'messages', 'webhooks', 'payments'],
  ['admin', 'operator'],
  ['pages', 'dashboard'],
  ['http', 'app', 'cli'],
];

/** Files that are data or history, not code to read: exempt from the size rules. */
const DATA_FILES = [/^src\/db\/migrations\//, /^src\/db\/schema\.ts$/];

export interface Arrow {
  from: string;
  to: string;
  typeOnly: boolean;
}

export interface Structure {
  /** Every import between two files of src/ (and cmd/). */
  arrows: Arrow[];
  /** Imports from a room to a room on a higher floor, or to a room no floor lists. */
  climbs: Arrow[];
  /** Rooms that import each other, directly or round a circle (each circle once, its rooms sorted). */
  roomCircles: string[][];
  /** Files that import each other round a circle. */
  fileCircles: string[][];
  /** Files of src/ that import src/app/context.ts (for `AppContext`). */
  appContextImporters: string[];
  /** src files over 600 lines, data and migrations aside. */
  longFiles: Array<{ file: string; lines: number }>;
  /** Functions over 120 lines. */
  longFunctions: Array<{ file: string; line: number; name: string; lines: number }>;
}

const root = join(dirname(new URL(import.meta.url).pathname), '..');
const IMPORT =
  /(?:^|\n)\s*(?:import|export)\s+(type\s+)?(?:[^'"`;]*?\s+from\s+)?['"](\.[^'"]+)['"]|import\(\s*['"](\.[^'"]+)['"]\s*\)/g;

function sourceFiles(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(join(root, dir))) {
    const path = join(dir, name);
    if (statSync(join(root, path)).isDirectory()) out.push(...sourceFiles(path));
    else if (name.endsWith('.ts')) out.push(path);
  }
  return out;
}

/** `src/billing/ledger.ts` → `billing`; a file directly in src/ or outside it is its own room. */
export function roomOf(file: string): string {
  const parts = file.split('/');
  return parts[0] === 'src' && parts.length > 2 ? parts[1]! : file;
}

const floorOf = new Map(FLOORS.flatMap((rooms, i) => rooms.map((room) => [room, i + 1] as const)));

function circlesOf(nodes: string[], next: (node: string) => Iterable<string>): string[][] {
  // Tarjan's strongly connected components; a component of two or more is a circle.
  let index = 0;
  const indexOf = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const circles: string[][] = [];
  const visit = (v: string) => {
    indexOf.set(v, index);
    low.set(v, index++);
    stack.push(v);
    onStack.add(v);
    for (const w of next(v)) {
      if (!indexOf.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, indexOf.get(w)!));
    }
    if (low.get(v) === indexOf.get(v)) {
      const component: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      if (component.length > 1) circles.push(component.sort());
    }
  };
  for (const v of nodes) if (!indexOf.has(v)) visit(v);
  return circles;
}

function longFunctionsOf(file: string, text: string, limit: number): Structure['longFunctions'] {
  const out: Structure['longFunctions'] = [];
  const sf = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const visit = (node: ts.Node) => {
    if (ts.isFunctionLike(node) && 'body' in node && node.body) {
      const first = sf.getLineAndCharacterOfPosition(node.getStart()).line;
      const last = sf.getLineAndCharacterOfPosition(node.end).line;
      if (last - first + 1 > limit) {
        const parent = node.parent;
        const name =
          node.name?.getText(sf) ||
          (parent && (ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent))
            ? parent.name.getText(sf)
            : '(anonymous)');
        out.push({ file, line: first + 1, name, lines: last - first + 1 });
      }
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return out;
}

export function measure(): Structure {
  const files = [...sourceFiles('src'), ...sourceFiles('cmd')];
  // One arrow per pair of files: type-only when every import between them is.
  const byPair = new Map<string, Arrow>();
  const longFiles: Structure['longFiles'] = [];
  const longFunctions: Structure['longFunctions'] = [];
  for (const file of files) {
    const text = readFileSync(join(root, file), 'utf8');
    for (const m of text.matchAll(IMPORT)) {
      const spec = m[2] ?? m[3]!;
      const to = normalize(join(dirname(file), spec)).replace(/\.js$/, '.ts');
      const arrow = { from: file, to: to.endsWith('.ts') ? to : `${to}.ts`, typeOnly: Boolean(m[1]) };
      const key = `${arrow.from} ${arrow.to}`;
      const seen = byPair.get(key);
      if (seen) seen.typeOnly &&= arrow.typeOnly;
      else byPair.set(key, arrow);
    }
    if (!file.startsWith('src/') || DATA_FILES.some((re) => re.test(file))) continue;
    const lines = text.split('\n').length;
    if (lines > 600) longFiles.push({ file, lines });
    longFunctions.push(...longFunctionsOf(file, text, 120));
  }
  const arrows = [...byPair.values()];
  const between = arrows.filter((a) => roomOf(a.from) !== roomOf(a.to) && a.from.startsWith('src/'));
  const climbs = between.filter((a) => {
    const from = floorOf.get(roomOf(a.from));
    const to = floorOf.get(roomOf(a.to));
    return from === undefined || to === undefined || to > from;
  });
  const roomEdges = new Map<string, Set<string>>();
  for (const a of between) {
    const set = roomEdges.get(roomOf(a.from)) ?? new Set();
    set.add(roomOf(a.to));
    roomEdges.set(roomOf(a.from), set);
  }
  const fileEdges = new Map<string, Set<string>>();
  for (const a of arrows) {
    const set = fileEdges.get(a.from) ?? new Set();
    set.add(a.to);
    fileEdges.set(a.from, set);
  }
  return {
    arrows,
    climbs,
    roomCircles: circlesOf([...roomEdges.keys()].sort(), (r) => roomEdges.get(r) ?? []),
    fileCircles: circlesOf([...fileEdges.keys()].sort(), (f) => fileEdges.get(f) ?? []),
    appContextImporters: [
      ...new Set(
        arrows.filter((a) => a.to === 'src/app/context.ts' && a.from.startsWith('src/')).map((a) => a.from),
      ),
    ]
      .filter((f) => f !== 'src/app/context.ts')
      .sort(),
    longFiles,
    longFunctions,
  };
}

if (process.argv[1] && relative(process.argv[1], new URL(import.meta.url).pathname) === '') {
  const s = measure();
  const say = (title: string, rows: string[]) => {
    console.log(`${title}: ${rows.length}`);
    for (const row of rows) console.log(`  ${row}`);
  };
  say(
    'imports that climb to a higher floor',
    s.climbs.map((a) => `${a.from} -> ${a.to}${a.typeOnly ? ' (types)' : ''}`),
  );
  say(
    'rooms in a circle',
    s.roomCircles.map((c) => c.join(' ↔ ')),
  );
  say(
    'files in a circle',
    s.fileCircles.map((c) => c.join(' ↔ ')),
  );
  say('files importing AppContext', s.appContextImporters);
  say(
    'files over 600 lines',
    s.longFiles.map((f) => `${f.file} (${f.lines})`),
  );
  say(
    'functions over 120 lines',
    s.longFunctions.map((f) => `${f.file}:${f.line} ${f.name} (${f.lines})`),
  );
}
