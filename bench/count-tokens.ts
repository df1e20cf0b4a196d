/**
 * Prompt token counting cost: `node bench/count-tokens.ts [old]`. Times the exact count (countText) and
 * the hold's bound (holdPromptTokens) for prompts of one long run of "a" (the worst case of a quadratic
 * merge) and of English-like text, at 50 KB, 1 MB and 4 MB. With `old`, times gpt-tokenizer's own
 * countTokens instead (skips sizes that would take minutes; pass `old all` to run them anyway).
 */
import os from 'node:os';
import { countTokens } from 'gpt-tokenizer';
import { countText, holdPromptTokens } from '../src/chat/tokens.ts';

const old = process.argv[2] === 'old';
const all = process.argv[3] === 'all';
const words = 'the quick brown fox jumps over a lazy dog while 42 wizards quietly judge; ';
const inputs: Array<[string, number, string]> = [];
for (const size of [50_000, 1_000_000, 4_000_000]) {
  inputs.push(['run of "a"', size, 'a'.repeat(size)]);
  inputs.push(['English-like', size, words.repeat(Math.ceil(size / words.length)).slice(0, size)]);
}
console.log(
  `load average ${os
    .loadavg()
    .map((l) => l.toFixed(2))
    .join(', ')}; ${os.cpus().length} CPUs; Node ${process.version}`,
);
for (const [kind, size, text] of inputs) {
  const time = (f: () => number) => {
    const t = performance.now();
    const n = f();
    return [performance.now() - t, n] as const;
  };
  if (old) {
    if (!all && kind.startsWith('run') && size > 50_000) {
      console.log(`${kind} ${size}: skipped (quadratic)`);
      continue;
    }
    const [ms, n] = time(() => countTokens(text));
    console.log(`${kind} ${size}: gpt-tokenizer countTokens ${ms.toFixed(0)} ms (${n} tokens)`);
    continue;
  }
  const [exactMs, n] = time(() => countText(text));
  const [boundMs, b] = time(
    () => holdPromptTokens({ model: 'x', messages: [{ role: 'user', content: text }] }).bound,
  );
  console.log(
    `${kind} ${size}: exact ${exactMs.toFixed(0)} ms (${n} tokens); hold bound ${boundMs.toFixed(1)} ms (${b})`,
  );
}
