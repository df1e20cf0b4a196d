import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const FILE = join(dirname(fileURLToPath(import.meta.url)), '..', 'docs', 'benchmarks.md');

/**
 * Writes a benchmark's results into docs/benchmarks.md between `<!-- NAME:start -->` and
 * `<!-- NAME:end -->`, keeping the rest of the file. Without the markers the block goes right under the
 * `## heading` (added at the end when missing).
 */
export function writeResultsBlock(name: string, heading: string, results: string): void {
  const start = `<!-- ${name}:start -->`;
  const end = `<!-- ${name}:end -->`;
  const block = `${start}\n${results}\n${end}`;
  let text = existsSync(FILE) ? readFileSync(FILE, 'utf8') : '# Benchmarks\n';
  if (text.includes(start) && text.includes(end)) {
    text = text.slice(0, text.indexOf(start)) + block + text.slice(text.indexOf(end) + end.length);
  } else if (text.includes(`## ${heading}\n`)) {
    const at = text.indexOf('\n', text.indexOf(`## ${heading}\n`)) + 1;
    text = `${text.slice(0, at)}\n${block}\n${text.slice(at)}`;
  } else {
    text = `${text.trimEnd()}\n\n## ${heading}\n\n${block}\n`;
  }
  writeFileSync(FILE, text);
  console.log(`\nwrote ${FILE}`);
}
