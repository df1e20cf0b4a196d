import {
  createCipheriv,
  createDecipheriv,
  createHmac,
  hash,
  randomBytes,
  timingSafeEqual,
} from 'node:crypto';

/**
 * Secrets at rest (provider keys, payment keys, webhook secrets) are sealed with AES-256-GCM under a key
 * derived from the encryption key, and links are signed with HMAC-SHA256.
 *
 * The sealer holds a key ring (TOLLGATE_ENCRYPTION_KEYS, the active key first): it seals and signs with
 * the active key, and opens and verifies with any key of the ring, so a key can be rotated online —
 * start every process with the new key first and the old one after it, re-seal (`tollgate keys rotate`),
 * then drop the old key once the links it signed have expired. A sealed value names the key that sealed
 * it: `v2.<key id>.<iv>.<tag>.<ciphertext>` (base64url parts); values from before the ring,
 * `v1.<iv>.<tag>.<ciphertext>`, open with whichever key of the ring authenticates them.
 */
interface RingKey {
  /** A public id of the key (an HMAC under it: it reveals nothing about the key). */
  id: string;
  encKey: Buffer;
  signKey: Buffer;
  check: string;
}

export class Sealer {
  readonly #ring: RingKey[];

  constructor(keys: Buffer | Buffer[]) {
    const list = Array.isArray(keys) ? keys : [keys];
    if (list.length === 0) throw new Error('the key ring is empty');
    this.#ring = list.map((masterKey) => {
      if (masterKey.length !== 32) throw new Error('encryption key must be 32 bytes');
      const derive = (purpose: string) => createHmac('sha256', masterKey).update(purpose).digest();
      return {
        id: derive('tollgate/key-id').toString('base64url').slice(0, 11),
        encKey: derive('tollgate/encryption'),
        signKey: derive('tollgate/signing'),
        check: `v1.${derive('tollgate/key-check').toString('base64url')}`,
      };
    });
  }

  get #active(): RingKey {
    return this.#ring[0]!;
  }

  /** The id of the active key (what `seal` writes into a sealed value). */
  get activeKeyId(): string {
    return this.#active.id;
  }

  /** Whether a sealed value is sealed with the active key (a rotation has nothing left to do for it). */
  isCurrent(sealed: string): boolean {
    return sealed.startsWith(`v2.${this.#active.id}.`);
  }

  /**
   * A fingerprint of the active key, kept in the database (`system_settings`), so a process started
   * with a ring that does not hold the database's key can be refused. An HMAC under the key.
   */
  keyCheck(): string {
    return this.#active.check;
  }

  /** The fingerprints of every key of the ring. */
  keyChecks(): string[] {
    return this.#ring.map((k) => k.check);
  }

  seal(plaintext: string): string {
    const key = this.#active;
    const iv = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', key.encKey, iv);
    const body = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()]);
    return [
      'v2',
      key.id,
      iv.toString('base64url'),
      cipher.getAuthTag().toString('base64url'),
      body.toString('base64url'),
    ].join('.');
  }

  /** The plaintext of a sealed value; SealedValueError when no key of the ring opens it. */
  open(sealed: string): string {
    const parts = sealed.split('.');
    if (parts[0] === 'v2' && parts.length === 5) {
      const key = this.#ring.find((k) => k.id === parts[1]);
      if (!key) throw new SealedValueError(`sealed with key ${parts[1]}, which is not in the key ring`);
      try {
        return decrypt(key.encKey, parts[2]!, parts[3]!, parts[4]!);
      } catch {
        throw new SealedValueError(`sealed with key ${parts[1]}, but it does not open (damaged)`);
      }
    }
    if (parts[0] === 'v1' && parts.length === 4) {
      for (const key of this.#ring) {
        try {
          return decrypt(key.encKey, parts[1]!, parts[2]!, parts[3]!);
        } catch {
          // the next key
        }
      }
      throw new SealedValueError('a v1 sealed value no key of the ring opens');
    }
    throw new SealedValueError('a sealed value of an unknown format');
  }

  /** HMAC-SHA256 (base64url) with the active signing key; used for link tokens and invite codes. */
  sign(data: string): string {
    return hmac(this.#active.signKey, data);
  }

  /** The signatures of `data` under every key of the ring, the active one first (cookie secrets). */
  signatures(data: string): string[] {
    return this.#ring.map((k) => hmac(k.signKey, data));
  }

  /** True when `signature` is the signature of `data` under any key of the ring. */
  verify(data: string, signature: string): boolean {
    return this.#ring.some((k) => safeEqual(hmac(k.signKey, data), signature));
  }
}

function hmac(key: Buffer, data: string): string {
  return createHmac('sha256', key).update(data).digest('base64url');
}

function decrypt(encKey: Buffer, iv: string, tag: string, body: string): string {
  const decipher = createDecipheriv('aes-256-gcm', encKey, Buffer.from(iv, 'base64url'));
  decipher.setAuthTag(Buffer.from(tag, 'base64url'));
  return Buffer.concat([decipher.update(Buffer.from(body, 'base64url')), decipher.final()]).toString('utf8');
}

export function sha256Hex(value: string): string {
  // One-shot: no Hash object per call (every API request hashes its key).
  return hash('sha256', value, 'hex');
}

/** Constant-time comparison of two strings; false when the lengths differ. */
export function safeEqual(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/**
 * A sealed value (a provider key, a payment secret, a webhook signing secret) that no key of the ring
 * opens: the key it was sealed with left TOLLGATE_ENCRYPTION_KEYS too early, or the value is damaged.
 * A request that needs it answers 503 (`sealed_value_unreadable`) with a log line saying which; `tollgate
 * keys rotate` reports such values and goes on.
 */
export class SealedValueError extends Error {
  constructor(detail: string) {
    super(`A secret could not be opened: ${detail} (TOLLGATE_ENCRYPTION_KEYS).`);
    this.name = 'SealedValueError';
  }
}
