import {
  createCipheriv,
  createDecipheriv,
  createHash,
  createHmac,
  randomBytes,
  timingSafeEqual,
} from 'node:crypto';

/**
 * Secrets at rest (provider keys, webhook secrets) are sealed with AES-256-GCM under a key derived from
 * TOLLGATE_ENCRYPTION_KEY. Format: `v1.<iv>.<tag>.<ciphertext>`, base64url parts.
 */
export class Sealer {
  readonly #encKey: Buffer;
  readonly #signKey: Buffer;
  readonly #keyCheck: string;

  constructor(masterKey: Buffer) {
    if (masterKey.length !== 32) throw new Error('encryption key must be 32 bytes');
    this.#encKey = createHmac('sha256', masterKey).update('tollgate/encryption').digest();
    this.#signKey = createHmac('sha256', masterKey).update('tollgate/signing').digest();
    this.#keyCheck = `v1.${createHmac('sha256', masterKey).update('tollgate/key-check').digest('base64url')}`;
  }

  /**
   * A fingerprint of the key, kept in the database at its first start (`system_settings`), so a process
   * started with a different key can be refused. An HMAC under the key: it reveals nothing about it.
   */
  keyCheck(): string {
    return this.#keyCheck;
  }

  seal(plaintext: string): string {
    const iv = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', this.#encKey, iv);
    const body = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()]);
    return [
      'v1',
      iv.toString('base64url'),
      cipher.getAuthTag().toString('base64url'),
      body.toString('base64url'),
    ].join('.');
  }

  open(sealed: string): string {
    const [version, iv, tag, body] = sealed.split('.');
    if (version !== 'v1' || !iv || !tag || body === undefined)
      throw new Error('sealed value has an unknown format');
    const decipher = createDecipheriv('aes-256-gcm', this.#encKey, Buffer.from(iv, 'base64url'));
    decipher.setAuthTag(Buffer.from(tag, 'base64url'));
    return Buffer.concat([decipher.update(Buffer.from(body, 'base64url')), decipher.final()]).toString(
      'utf8',
    );
  }

  /** HMAC-SHA256 (base64url) with the signing key; used for link tokens. */
  sign(data: string): string {
    return createHmac('sha256', this.#signKey).update(data).digest('base64url');
  }

  verify(data: string, signature: string): boolean {
    return safeEqual(this.sign(data), signature);
  }
}

export function sha256Hex(value: string): string {
  return createHash('sha256').update(value).digest('hex');
}

/** Constant-time comparison of two strings; false when the lengths differ. */
export function safeEqual(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}
