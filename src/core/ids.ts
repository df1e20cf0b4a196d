import { randomBytes, randomFillSync } from 'node:crypto';

/**
 * Identifiers are `<prefix>_<time><random>`: 10 Crockford base32 characters of milliseconds followed by
 * 16 random ones. They sort by creation time, so an id doubles as a pagination cursor. Within one
 * process ids are strictly increasing (the random part is incremented when the clock has not moved).
 */
const ALPHABET = '0123456789abcdefghjkmnpqrstvwxyz';

let lastTime = -1;
/**
 * The characters after `<prefix>_` of the last id: 10 of time, 16 random (`digits`, 0–31 each). Updated
 * in place, read as one latin1 string: an id is two allocations, the text and the joined id.
 */
const text = Buffer.alloc(26);
const digits = new Uint8Array(16);

/** Random bytes are drawn from the kernel a page at a time, then handed out 16 by 16. */
const pool = Buffer.alloc(4096);
let poolOffset = pool.length;

function encodeTime(ms: number): string {
  let out = '';
  let t = ms;
  for (let i = 0; i < 10; i++) {
    out = ALPHABET[t % 32] + out;
    t = Math.floor(t / 32);
  }
  return out;
}

/** Moves `text` to the next id made at `now`. */
function next(now: number): void {
  if (now === lastTime) {
    for (let i = digits.length - 1; i >= 0; i--) {
      if (digits[i]! < 31) {
        digits[i]!++;
        text[10 + i] = ALPHABET.charCodeAt(digits[i]!);
        return;
      }
      digits[i] = 0;
      text[10 + i] = ALPHABET.charCodeAt(0);
    }
    return;
  }
  if (poolOffset + 16 > pool.length) {
    randomFillSync(pool);
    poolOffset = 0;
  }
  for (let i = 0; i < 16; i++) digits[i] = pool[poolOffset + i]! % 32;
  poolOffset += 16;
  digits[0] = digits[0]! % 16; // leave headroom for increments
  for (let i = 0; i < 16; i++) text[10 + i] = ALPHABET.charCodeAt(digits[i]!);
  text.write(encodeTime(now), 0, 'latin1');
  lastTime = now;
}

export type IdPrefix =
  | 'pw'
  | 'rcl'
  | 'aud'
  | 'acct'
  | 'atk'
  | 'ses'
  | 'key'
  | 'ukey'
  | 'usr'
  | 'act'
  | 'hold'
  | 'grant'
  | 'evt'
  | 'req'
  | 'sub'
  | 'whsub'
  | 'dlv'
  | 'att'
  | 'resp'
  | 'msg'
  | 'chatcmpl'
  | 'pay';

export function newId(prefix: IdPrefix): string {
  next(Date.now());
  return `${prefix}_${text.toString('latin1')}`;
}

/** A random token of the given byte length in base64url. */
export function randomToken(bytes = 32): string {
  return randomBytes(bytes).toString('base64url');
}

/** The smallest id with this prefix made at `ms`: every id made earlier sorts below it (retention). */
export function idBound(prefix: IdPrefix, ms: number): string {
  return `${prefix}_${encodeTime(ms)}`;
}

/** An id as if made at `ms` (tests and benchmarks that need old rows). */
export function idAt(prefix: IdPrefix, ms: number): string {
  const random = Array.from(randomBytes(16), (b) => ALPHABET[b % 32]).join('');
  return `${idBound(prefix, ms)}${random}`;
}
