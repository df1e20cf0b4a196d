import { randomBytes, randomFillSync } from 'node:crypto';

/**
 * Identifiers are `<prefix>_<time><random>`: 10 Crockford base32 characters of milliseconds followed by
 * 16 random ones. They sort by creation time, so an id doubles as a pagination cursor. Within one
 * process ids are strictly increasing (the random part is incremented when the clock has not moved).
 */
const ALPHABET = '0123456789abcdefghjkmnpqrstvwxyz';

let lastTime = -1;
let lastRandom: number[] = [];

function encodeTime(ms: number): string {
  let out = '';
  let t = ms;
  for (let i = 0; i < 10; i++) {
    out = ALPHABET[t % 32] + out;
    t = Math.floor(t / 32);
  }
  return out;
}

/** Random bytes are drawn from the kernel a page at a time, then handed out 16 by 16. */
const pool = Buffer.alloc(4096);
let poolOffset = pool.length;

function randomChunk(): Buffer {
  if (poolOffset + 16 > pool.length) {
    randomFillSync(pool);
    poolOffset = 0;
  }
  const chunk = pool.subarray(poolOffset, poolOffset + 16);
  poolOffset += 16;
  return chunk;
}

function nextRandom(now: number): number[] {
  if (now === lastTime) {
    const r = lastRandom.slice();
    for (let i = r.length - 1; i >= 0; i--) {
      if (r[i]! < 31) {
        r[i]!++;
        break;
      }
      r[i] = 0;
    }
    lastRandom = r;
    return r;
  }
  const bytes = randomChunk();
  lastTime = now;
  lastRandom = Array.from(bytes, (b) => b % 32);
  lastRandom[0] = lastRandom[0]! % 16; // leave headroom for increments
  return lastRandom;
}

export type IdPrefix =
  | 'pw'
  | 'rcl'
  | 'aud'
  | 'acct'
  | 'atk'
  | 'ses'
  | 'key'
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
  const now = Date.now();
  const random = nextRandom(now)
    .map((n) => ALPHABET[n])
    .join('');
  return `${prefix}_${encodeTime(now)}${random}`;
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
