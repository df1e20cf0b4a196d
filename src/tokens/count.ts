import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { O200K_TOKEN_SPLIT_REGEX } from 'gpt-tokenizer/encodingParams/constants';
import { Money } from '../core/money.ts';
import { BpeTable } from './bpe-table.ts';

/**
 * Token counting for o200k_base (the encoding of current OpenAI models): gpt-tokenizer's pre-tokenizer
 * and vocabulary (its `.tiktoken` file), tiktoken's merge rule. Used for the hold of per-token requests,
 * for charging when a provider reports no `usage`, and to enforce the completion bound while streaming.
 * The count is exactly gpt-tokenizer's (test/proxy/chat-token-counting.test.ts).
 *
 * The vocabulary is read on the first count (a process that counts nothing never holds it) into a
 * compact table (./bpe-table.ts): about 5 MB, where importing gpt-tokenizer's o200k module kept some
 * 20 MB of heap for as long as the process lived.
 *
 * Counting is linear in the input: a merge loop that rescans the whole piece on every merge (tiktoken's,
 * gpt-tokenizer's) makes one long piece (a run of 1 MB of "a" is one pre-tokenizer piece) cost O(n²) —
 * minutes. Here a piece longer than SHORT_PIECE_BYTES is merged with a priority queue instead
 * (O(n log n)), with the same rule (lowest rank first, leftmost on ties), so the count is the same.
 *
 * Text is always counted as text: `<|endoftext|>` in a prompt is ordinary characters (as OpenAI counts
 * user content), where gpt-tokenizer's `countTokens` would throw.
 */

let table: BpeTable | undefined;

/** The o200k_base vocabulary, read on first use and shared by every count. */
function o200k(): BpeTable {
  if (!table) {
    const file = createRequire(import.meta.url).resolve('gpt-tokenizer/data/o200k_base.tiktoken');
    table = new BpeTable(readFileSync(file, 'latin1'));
    // Heap keys are rank * SHIFT + start (see mergeCount).
    if (table.size >= 2 ** 18) throw new Error('src/tokens/count.ts: vocabulary too large');
  }
  return table;
}

const utf8 = new TextEncoder();

/** Heap keys are rank * SHIFT + start (see mergeCount). */
const SHIFT = 2 ** 34;

/** Pieces up to this many bytes are merged by tiktoken's own loop (quadratic, but small). */
const SHORT_PIECE_BYTES = 192;

/** Pieces up to this many UTF-16 units are encoded into a buffer kept for the next one. */
const SCRATCH_UNITS = 4096;
let scratch = new Uint8Array(3 * 256);

/**
 * Margin of the hold over the counted prompt when none is given: the o200k family's default (the model's
 * margin, src/models/hold-margin.ts, is what the metered flow passes).
 */
const DEFAULT_PROMPT_MARGIN = '1.1';

/**
 * Text the hold counts exactly before it falls back to the byte bound; keeps the paywall decision at a
 * few milliseconds whatever the body size.
 */
export const EXACT_COUNT_BUDGET_BYTES = 32 * 1024;

/** Counts one text: the exact o200k_base token count. */
export type TextCounter = (text: string) => number;

/**
 * The pre-tokenizer, sticky: `test` moves `lastIndex` to the end of each piece without building a match
 * array (`matchAll` also built an iterator). Its pieces cover any text end to end; should one ever not
 * start where the last ended, the rest is split the usual way. Shared: counting is synchronous and never
 * re-entered.
 */
const piece = new RegExp(O200K_TOKEN_SPLIT_REGEX.source, 'yu');
const pieces = new RegExp(O200K_TOKEN_SPLIT_REGEX.source, 'gu');

/** The exact o200k_base token count of a text, in O(n log n). */
export function countText(text: string): number {
  if (!text) return 0;
  let tokens = 0;
  let start = 0;
  piece.lastIndex = 0;
  while (start < text.length) {
    if (!piece.test(text)) return tokens + countFrom(text, start);
    const end = piece.lastIndex;
    tokens += countPiece(text.slice(start, end));
    start = end;
  }
  return tokens;
}

function countFrom(text: string, start: number): number {
  let tokens = 0;
  pieces.lastIndex = start;
  let match = pieces.exec(text);
  while (match !== null) {
    tokens += countPiece(match[0]);
    match = pieces.exec(text);
  }
  return tokens;
}

/**
 * A counter for bounds: exact while the texts it has seen stay within `budgetBytes`, then each piece
 * beyond counts as its UTF-8 length. Sound because every byte is a token of o200k_base and a merge only
 * ever lowers the count, so a piece never has more tokens than bytes. Linear and cheap past the budget.
 */
export function boundingCounter(budgetBytes = EXACT_COUNT_BUDGET_BYTES): TextCounter & { exact: boolean } {
  let left = budgetBytes;
  const counter = (text: string): number => {
    if (!text) return 0;
    if (left <= 0) {
      counter.exact = false;
      return Buffer.byteLength(text, 'utf8');
    }
    // Fits the budget in any case (a UTF-16 unit is at most 3 UTF-8 bytes): count exactly.
    if (text.length * 3 <= left) {
      left -= Buffer.byteLength(text, 'utf8');
      return countText(text);
    }
    let tokens = 0;
    const split = new RegExp(O200K_TOKEN_SPLIT_REGEX.source, 'gu');
    let match: RegExpExecArray | null = split.exec(text);
    while (match !== null) {
      if (left <= 0) {
        // The pieces from here on, bounded by their bytes (the pre-tokenizer split is unchanged by
        // stopping: the pieces counted so far are the whole text's pieces).
        counter.exact = false;
        return tokens + Buffer.byteLength(text.slice(match.index), 'utf8');
      }
      const piece = match[0];
      const bytes = Buffer.byteLength(piece, 'utf8');
      if (bytes > left) {
        counter.exact = false;
        return tokens + Buffer.byteLength(text.slice(match.index), 'utf8');
      }
      left -= bytes;
      tokens += countPiece(piece);
      match = split.exec(text);
    }
    return tokens;
  };
  counter.exact = true;
  return counter;
}

function countPiece(piece: string): number {
  const bpe = o200k();
  let bytes: Uint8Array;
  let n: number;
  if (piece.length <= SCRATCH_UNITS) {
    if (scratch.length < 3 * piece.length) scratch = new Uint8Array(3 * SCRATCH_UNITS);
    bytes = scratch;
    n = 0;
    for (; n < piece.length; n++) {
      const c = piece.charCodeAt(n);
      if (c >= 0x80) break;
      bytes[n] = c;
    }
    if (n < piece.length) n = utf8.encodeInto(piece, bytes).written;
  } else {
    bytes = utf8.encode(piece);
    n = bytes.length;
  }
  if (bpe.rank(bytes, 0, n) >= 0) return 1;
  if (n > SHORT_PIECE_BYTES) return mergeCount(bpe, bytes, n);
  let count = merged.get(piece);
  if (count === undefined) {
    count = mergeShort(bpe, bytes, n);
    if (merged.size >= MERGED_PIECES) merged.delete(merged.keys().next().value!);
    merged.set(piece, count);
  }
  return count;
}

/**
 * Counts of the short pieces that are not one token (words of languages other than English, mostly):
 * the most recent MERGED_PIECES, oldest out first. (gpt-tokenizer keeps 100,000 such results.)
 */
const MERGED_PIECES = 16_384;
const merged = new Map<string, number>();

const NO_RANK = 0x7fffffff;
const starts = new Int32Array(SHORT_PIECE_BYTES + 1);
const ranks = new Int32Array(SHORT_PIECE_BYTES + 1);

function rankOr(bpe: BpeTable, bytes: Uint8Array, start: number, end: number): number {
  const rank = bpe.rank(bytes, start, end);
  return rank < 0 ? NO_RANK : rank;
}

/**
 * tiktoken's byte-pair merge of a short piece: merge the adjacent pair of lowest rank (leftmost on ties)
 * until no pair is a token. Returns the number of tokens.
 */
function mergeShort(bpe: BpeTable, bytes: Uint8Array, n: number): number {
  let parts = n + 1;
  for (let i = 0; i < parts; i++) {
    starts[i] = i;
    ranks[i] = i + 2 <= n ? rankOr(bpe, bytes, i, i + 2) : NO_RANK;
  }
  while (parts > 1) {
    let lowest = NO_RANK;
    let at = -1;
    for (let i = 0; i < parts - 1; i++) {
      if (ranks[i]! < lowest) {
        lowest = ranks[i]!;
        at = i;
      }
    }
    if (at < 0) break;
    // The part at `at` takes in the next one: its pair (and the previous part's) is now longer.
    ranks[at] = at + 3 < parts ? rankOr(bpe, bytes, starts[at]!, starts[at + 3]!) : NO_RANK;
    if (at > 0)
      ranks[at - 1] = at + 2 < parts ? rankOr(bpe, bytes, starts[at - 1]!, starts[at + 2]!) : NO_RANK;
    for (let i = at + 1; i < parts - 1; i++) {
      starts[i] = starts[i + 1]!;
      ranks[i] = ranks[i + 1]!;
    }
    parts--;
  }
  return parts - 1;
}

/**
 * Byte-pair merge of one long piece with a binary heap keyed by (rank, position): pops the lowest-ranked
 * adjacent pair, leftmost among equal ranks — the pair tiktoken's linear scan picks — so the result is
 * the same, in O(n log n). Stale heap entries are skipped on pop. Returns the number of tokens.
 */
function mergeCount(bpe: BpeTable, bytes: Uint8Array, n: number): number {
  const rankOf = (start: number, end: number): number => {
    const rank = bpe.rank(bytes, start, end);
    return rank < 0 ? Number.POSITIVE_INFINITY : rank;
  };
  // Parts as a linked list over their start offsets; `next[i]` is where the part starting at i ends.
  const next = new Int32Array(n + 1);
  const prev = new Int32Array(n + 1);
  const pairRank = new Float64Array(n); // rank of merging the part at i with its successor
  for (let i = 0; i <= n; i++) {
    next[i] = i + 1;
    prev[i] = i - 1;
  }
  const alive = new Uint8Array(n).fill(1);
  // Min-heap of rank * SHIFT + start (exact in a double: ranks < 2^18, starts < 2^34).
  const heap = new Float64Array(3 * n + 1);
  let size = 0;
  const sink = (from: number, key: number) => {
    let i = from;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= size) break;
      const r = l + 1;
      const child = r < size && heap[r]! < heap[l]! ? r : l;
      if (heap[child]! >= key) break;
      heap[i] = heap[child]!;
      i = child;
    }
    heap[i] = key;
  };
  const push = (key: number) => {
    let i = size++;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (heap[parent]! <= key) break;
      heap[i] = heap[parent]!;
      i = parent;
    }
    heap[i] = key;
  };
  const pop = (): number => {
    const top = heap[0]!;
    size--;
    if (size > 0) sink(0, heap[size]!);
    return top;
  };
  const rankAfter = (start: number): number => {
    const mid = next[start]!;
    return mid < n ? rankOf(start, next[mid]!) : Number.POSITIVE_INFINITY;
  };
  const update = (start: number) => {
    const rank = rankAfter(start);
    pairRank[start] = rank;
    if (rank !== Number.POSITIVE_INFINITY) push(rank * SHIFT + start);
  };
  // Initial pairs, heapified in O(n).
  for (let i = 0; i < n; i++) {
    const rank = rankAfter(i);
    pairRank[i] = rank;
    if (rank !== Number.POSITIVE_INFINITY) heap[size++] = rank * SHIFT + i;
  }
  for (let i = (size >> 1) - 1; i >= 0; i--) sink(i, heap[i]!);
  let parts = n;
  while (size > 0) {
    const key = pop();
    const start = key % SHIFT;
    const rank = (key - start) / SHIFT;
    if (!alive[start] || pairRank[start] !== rank) continue;
    // Merge the part at `start` with its successor.
    const gone = next[start]!;
    alive[gone] = 0;
    next[start] = next[gone]!;
    if (next[gone]! <= n) prev[next[gone]!] = start;
    parts--;
    update(start);
    if (prev[start]! >= 0) update(prev[start]!);
  }
  return parts;
}

/**
 * What the hold assumes the prompt costs: the count times the model's margin for its provider's
 * tokenizer (a decimal string such as "1.25"), rounded up — exactly, in decimals.
 */
export function promptTokensUpperBound(counted: number, margin: string = DEFAULT_PROMPT_MARGIN): number {
  const m = marginOf(margin);
  if (m) {
    // Exact in integers: ceil(counted × units / scale), while the product stays a safe integer.
    const product = counted * m.units;
    if (Number.isSafeInteger(product)) {
      const rest = product % m.scale;
      return (product - rest) / m.scale + (rest > 0 ? 1 : 0);
    }
  }
  return new Money(counted).times(margin).ceil().toNumber();
}

/** A margin such as "1.25" as 125 / 100 (undefined: not a plain decimal; decimal.js then). */
const margins = new Map<string, { units: number; scale: number } | undefined>();

function marginOf(margin: string): { units: number; scale: number } | undefined {
  if (margins.has(margin)) return margins.get(margin);
  const match = /^(\d{1,6})(?:\.(\d{1,6}))?$/.exec(margin);
  const parsed = match
    ? {
        units: Number(match[1]! + (match[2] ?? '')),
        scale: 10 ** (match[2]?.length ?? 0),
      }
    : undefined;
  // Margins come from model rows (a handful); the map stays small.
  if (margins.size < 1000) margins.set(margin, parsed);
  return parsed;
}

/**
 * Text the hold's estimate counts exactly (about 20 ms at the 6–7 MB/s countText runs on a shared core,
 * bench/count-tokens.ts); beyond it, the rest is estimated at the ratio counted so far.
 */
export const EXACT_ESTIMATE_BUDGET_BYTES = 128 * 1024;

/** Below this many bytes counted, the ratio is not trusted: the rest is bounded by its bytes. */
const MIN_SAMPLE_BYTES = 4 * 1024;

/**
 * A counter for estimates: exact while the texts it has seen stay within `budgetBytes`, then each text
 * (or the rest of one) beyond counts as its UTF-8 length times the tokens per byte of what was counted
 * exactly, rounded up — the same text keeps its ratio, so the estimate of a long homogeneous prompt is
 * within a few percent of its exact count (measured: test/proxy/hold-estimates.test.ts), at the cost of
 * the budget whatever the size. When too little was counted to trust a ratio (one huge piece), each byte
 * is a token (a bound). `exact` stays true while nothing was estimated.
 */
export function estimatingCounter(
  budgetBytes = EXACT_ESTIMATE_BUDGET_BYTES,
): TextCounter & { exact: boolean } {
  let left = budgetBytes;
  let bytesCounted = 0;
  let tokensCounted = 0;
  const estimate = (bytes: number): number =>
    bytesCounted < MIN_SAMPLE_BYTES ? bytes : Math.ceil((bytes * tokensCounted) / bytesCounted);
  const exactly = (text: string, bytes: number): number => {
    const tokens = countText(text);
    left -= bytes;
    bytesCounted += bytes;
    tokensCounted += tokens;
    return tokens;
  };
  const counter = (text: string): number => {
    if (!text) return 0;
    // Fits the budget in any case (a UTF-16 unit is at most 3 UTF-8 bytes): count exactly.
    if (text.length * 3 <= left) return exactly(text, Buffer.byteLength(text, 'utf8'));
    const bytes = Buffer.byteLength(text, 'utf8');
    if (bytes <= left) return exactly(text, bytes);
    counter.exact = false;
    if (left <= 0) return estimate(bytes);
    // The budget ends inside this text: its head (cut between pre-tokenizer pieces) is counted.
    const split = splitAtBudget(text, left);
    const head = split.head ? exactly(split.head, Buffer.byteLength(split.head, 'utf8')) : 0;
    left = 0;
    return head + estimate(bytes - Buffer.byteLength(split.head, 'utf8'));
  };
  counter.exact = true;
  return counter;
}

/** `text` cut at a pre-tokenizer piece boundary so that the head has at most `bytes` UTF-8 bytes. */
function splitAtBudget(text: string, bytes: number): { head: string; tail: string } {
  const split = new RegExp(O200K_TOKEN_SPLIT_REGEX.source, 'gu');
  let left = bytes;
  let end = 0;
  let match: RegExpExecArray | null = split.exec(text);
  while (match !== null) {
    const size = Buffer.byteLength(match[0], 'utf8');
    if (size > left) break;
    left -= size;
    end = match.index + match[0].length;
    match = split.exec(text);
  }
  return { head: text.slice(0, end), tail: text.slice(end) };
}

/**
 * The input estimate for the hold, cheaply: `countInput` run with an estimating counter (exact up to
 * EXACT_ESTIMATE_BUDGET_BYTES of text, the same ratio beyond), times the model's margin. `exact` is the
 * count itself when the whole input fitted the budget (the count to charge if the provider reports no
 * usage), else undefined (then the exact count is made only if it is needed).
 */
export function holdInputTokens<B>(
  countInput: (body: B, count: TextCounter) => number,
  body: B,
  margin: string = DEFAULT_PROMPT_MARGIN,
): { bound: number; exact: number | undefined } {
  const counter = estimatingCounter();
  const counted = countInput(body, counter);
  return { bound: promptTokensUpperBound(counted, margin), exact: counter.exact ? counted : undefined };
}
