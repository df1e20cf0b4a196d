/**
 * A byte-pair vocabulary held compactly: every token's bytes in one buffer, their offsets by rank, and an
 * open-addressing hash table from bytes to rank — about 5 MB for o200k_base's 200,000 tokens, where
 * gpt-tokenizer's module keeps its 2.4 MB source, a string per token and a Map over them (some 20 MB of
 * heap). Built from a `.tiktoken` file (one `base64(token) rank` per line), the format tiktoken and
 * gpt-tokenizer ship.
 */
export class BpeTable {
  /** The bytes of every token, by rank. */
  readonly #bytes: Buffer;
  /** Token `r` is `#bytes[#offsets[r] .. #offsets[r + 1]]`. */
  readonly #offsets: Uint32Array;
  /** Open addressing by the tokens' hash: rank + 1, or 0 for an empty slot. */
  readonly #slots: Int32Array;
  readonly #mask: number;
  /** Ranks that no line defined (none in o200k_base) have an empty span and are never found. */
  readonly size: number;
  /** The longest token, in bytes: no merge can make a longer one. */
  readonly maxTokenBytes: number;

  constructor(tiktoken: string) {
    // Parsed with typed arrays only (no string per line): reading the vocabulary leaves no garbage
    // behind to grow the heap.
    let lineCount = 1;
    for (let i = tiktoken.indexOf('\n'); i >= 0; i = tiktoken.indexOf('\n', i + 1)) lineCount++;
    const tokenStart = new Uint32Array(lineCount);
    const tokenEnd = new Uint32Array(lineCount);
    const lineRank = new Int32Array(lineCount);
    let lines = 0;
    let size = 0;
    let capacity = 0;
    for (let at = 0; at < tiktoken.length; ) {
      let end = tiktoken.indexOf('\n', at);
      if (end < 0) end = tiktoken.length;
      const space = tiktoken.indexOf(' ', at);
      if (end - at > 0 && !(end - at === 1 && tiktoken.charCodeAt(at) === 13)) {
        if (space < 0 || space >= end || space === at) throw new Error(`not a .tiktoken line at ${at}`);
        let rank = 0;
        let digits = 0;
        for (let i = space + 1; i < end; i++) {
          const c = tiktoken.charCodeAt(i);
          if (c === 13 && i === end - 1) break;
          if (c < 48 || c > 57 || ++digits > 7) throw new Error(`not a .tiktoken rank at ${i}`);
          rank = rank * 10 + (c - 48);
        }
        if (!digits) throw new Error(`not a .tiktoken rank at ${space}`);
        tokenStart[lines] = at;
        tokenEnd[lines] = space;
        lineRank[lines] = rank;
        lines++;
        capacity += Math.ceil(((space - at) * 3) / 4);
        if (rank + 1 > size) size = rank + 1;
      }
      at = end + 1;
    }
    this.size = size;
    const lineOf = new Int32Array(size).fill(-1);
    for (let line = 0; line < lines; line++) lineOf[lineRank[line]!] = line;
    this.#bytes = Buffer.allocUnsafeSlow(capacity);
    this.#offsets = new Uint32Array(size + 1);
    let at = 0;
    let longest = 0;
    for (let rank = 0; rank < size; rank++) {
      this.#offsets[rank] = at;
      const line = lineOf[rank]!;
      if (line < 0) continue;
      const written = decodeBase64(tiktoken, tokenStart[line]!, tokenEnd[line]!, this.#bytes, at);
      at += written;
      if (written > longest) longest = written;
    }
    this.#offsets[size] = at;
    this.maxTokenBytes = longest;
    let slots = 1;
    while (slots < size * 2) slots *= 2;
    this.#slots = new Int32Array(slots);
    this.#mask = slots - 1;
    for (let rank = 0; rank < size; rank++) {
      const from = this.#offsets[rank]!;
      const to = this.#offsets[rank + 1]!;
      if (from === to) continue;
      let slot = hash(this.#bytes, from, to) & this.#mask;
      while (this.#slots[slot] !== 0) slot = (slot + 1) & this.#mask;
      this.#slots[slot] = rank + 1;
    }
  }

  /** The rank of the token `bytes[start..end]`, or -1 when it is not one. */
  rank(bytes: Uint8Array, start: number, end: number): number {
    const length = end - start;
    if (length <= 0 || length > this.maxTokenBytes) return -1;
    const table = this.#bytes;
    const offsets = this.#offsets;
    let slot = hash(bytes, start, end) & this.#mask;
    for (;;) {
      const entry = this.#slots[slot]!;
      if (entry === 0) return -1;
      const rank = entry - 1;
      const from = offsets[rank]!;
      if (offsets[rank + 1]! - from === length) {
        let i = 0;
        while (i < length && table[from + i] === bytes[start + i]) i++;
        if (i === length) return rank;
      }
      slot = (slot + 1) & this.#mask;
    }
  }
}

const BASE64 = new Int8Array(128).fill(-1);
for (const [i, c] of [...'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'].entries()) {
  BASE64[c.charCodeAt(0)] = i;
}

/** Decodes base64 `text[from..to]` into `out` at `at`; returns the number of bytes written. */
function decodeBase64(text: string, from: number, to: number, out: Uint8Array, at: number): number {
  let bits = 0;
  let buffered = 0;
  let written = 0;
  for (let i = from; i < to; i++) {
    const c = text.charCodeAt(i);
    if (c === 61) break; // '=' padding
    const value = c < 128 ? BASE64[c]! : -1;
    if (value < 0) throw new Error(`not base64 at ${i}`);
    bits = (bits << 6) | value;
    buffered += 6;
    if (buffered >= 8) {
      buffered -= 8;
      out[at + written++] = (bits >> buffered) & 0xff;
    }
  }
  return written;
}

/** FNV-1a over bytes. */
function hash(bytes: Uint8Array, start: number, end: number): number {
  let h = 0x811c9dc5;
  for (let i = start; i < end; i++) h = Math.imul(h ^ bytes[i]!, 0x01000193);
  return h >>> 0;
}
