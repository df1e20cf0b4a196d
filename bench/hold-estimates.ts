/**
 * The prompt estimate of the hold, against the exact count: `node bench/hold-estimates.ts`.
 *
 * For code and for prose (bench/corpus/, numbered repetitions, as a coding agent's system prompt) from
 * 10 KB to 4 MB, prints the exact o200k count and its time, the estimate (src/tokens/count.ts
 * `estimatingCounter`: exact up to 128 KiB, the same ratio beyond) and its time, the estimate's ratio to
 * the exact count, and the Messages hold's input over the exact count before and after: before, every
 * byte past 32 KiB a token, × 1.9 (the Claude margin then), × 1.3 (the Messages API's own); after, the
 * estimate × 1.3, once. Claude's `count_tokens` is 1.16–1.30× the o200k count (docs/benchmarks.md), so
 * "after" stays within 1.3× of it; "before" divided by 1.16–1.30 is what it was over `count_tokens`.
 */
import { readdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { boundingCounter, countText, estimatingCounter } from '../src/tokens/count.ts';

const dir = path.join(import.meta.dirname, 'corpus');
const files = readdirSync(dir).sort();
const read = (file: string) => readFileSync(path.join(dir, file), 'utf8');
const sources = {
  code: files
    .filter((f) => /\.(ts|py|json)\.txt$/.test(f))
    .map(read)
    .join('\n'),
  prose: files.map(read).join('\n'),
};

function textOf(source: string, bytes: number): string {
  const parts: string[] = [];
  let size = 0;
  for (let i = 0; size < bytes; i++) {
    const part = `// part ${i}\n${source}\n`;
    parts.push(part);
    size += Buffer.byteLength(part);
  }
  return parts.join('');
}

function timed<T>(f: () => T): [T, number] {
  const start = performance.now();
  const value = f();
  return [value, performance.now() - start];
}

console.log(
  `load average ${os
    .loadavg()
    .map((l) => l.toFixed(2))
    .join(', ')}; ${os.cpus().length} CPUs; Node ${process.version}`,
);
countText(sources.prose); // the vocabulary, loaded
console.log(
  '| text | size | exact count | exact ms | estimate | estimate ms | estimate / exact | Messages hold input / exact, before | after |',
);
console.log('|---|---:|---:|---:|---:|---:|---:|---:|---:|');
for (const [name, source] of Object.entries(sources)) {
  for (const bytes of [10_000, 87_000, 300_000, 1_000_000, 4_000_000]) {
    const text = textOf(source, bytes);
    const [exact, exactMs] = timed(() => countText(text));
    const [estimate, estimateMs] = timed(() => estimatingCounter()(text));
    const bound = boundingCounter()(text);
    const before = Math.ceil(Math.ceil(bound * 1.9) * 1.3);
    const after = Math.ceil(estimate * 1.3);
    console.log(
      `| ${name} | ${(bytes / 1000).toFixed(0)} KB | ${exact} | ${exactMs.toFixed(0)} | ${estimate} | ${estimateMs.toFixed(0)} | ${(estimate / exact).toFixed(3)} | ${(before / exact).toFixed(2)} | ${(after / exact).toFixed(2)} |`,
    );
  }
}
