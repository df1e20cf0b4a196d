/**
 * Prompt token counting cost: `node bench/count-tokens.ts [old]`. Times the exact count (countText) and
 * the hold's bound (holdPromptTokens) for prompts of one long run of "a" (the worst case of a quadratic
 * merge) and of English-like text, at 50 KB, 1 MB and 4 MB. With `old`, times gpt-tokenizer's own
 * countTokens instead (skips sizes that would take minutes; pass `old all` to run them anyway).
 */
import os from 'node:os';
import { countTokens } from 'gpt-tokenizer';
import { countText } from '../src/tokens/count.ts';
import { holdPromptTokens } from '../src/tokens/inputs.ts';

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
  /** Wall-clock and CPU ms of one call (CPU is what matters on a busy machine). */
  const time = (f: () => number) => {
    const t = performance.now();
    const cpu = process.cpuUsage();
    const n = f();
    const used = process.cpuUsage(cpu);
    return [performance.now() - t, n, (used.user + used.system) / 1000] as const;
  };
  const ms = (wall: number, cpu: number) =>
    `${wall.toFixed(wall < 10 ? 1 : 0)} ms (CPU ${cpu.toFixed(cpu < 10 ? 1 : 0)} ms)`;
  if (old) {
    if (!all && kind.startsWith('run') && size > 50_000) {
      console.log(`${kind} ${size}: skipped (quadratic)`);
      continue;
    }
    const [wall, n, cpu] = time(() => countTokens(text));
    console.log(`${kind} ${size}: gpt-tokenizer countTokens ${ms(wall, cpu)}, ${n} tokens`);
    continue;
  }
  const [exactWall, n, exactCpu] = time(() => countText(text));
  const [boundWall, b, boundCpu] = time(
    () => holdPromptTokens({ model: 'x', messages: [{ role: 'user', content: text }] }).bound,
  );
  console.log(
    `${kind} ${size}: exact ${ms(exactWall, exactCpu)}, ${n} tokens; hold bound ${ms(boundWall, boundCpu)}, ${b}`,
  );
}
