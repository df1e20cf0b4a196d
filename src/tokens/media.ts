/**
 * Tokens of non-text inputs, for the hold of per-token requests (the charge itself always comes from
 * the provider's `usage` when it reports one).
 *
 * Images follow OpenAI's rule for its vision models: `detail: "low"` costs 85 tokens; otherwise the
 * image is scaled to fit 2048×2048, then so that its shortest side is at most 768, and costs
 * 85 + 170 × the number of 512-pixel tiles. The size is read from the header of `data:` URLs (PNG, GIF,
 * JPEG, WebP); for a remote URL or an unknown format, the largest result of the rule is assumed
 * (IMAGE_TOKENS_BOUND, 1,445 tokens: 768×2048 → 8 tiles).
 */
export const IMAGE_LOW_TOKENS = 85;
export const IMAGE_TOKENS_BOUND = 85 + 170 * 8;
/** Audio: 10 tokens a second of audio, at most 4,000 bytes a second (32 kbit/s, the least any format takes). */
export const AUDIO_BYTES_PER_TOKEN = 400;
/** A file part (PDF, …): one token per 4 bytes of its data, and at least this many. */
export const FILE_PART_MIN_TOKENS = 2_000;

export function imageTokens(url: string, detail: string | undefined): number {
  if (detail === 'low') return IMAGE_LOW_TOKENS;
  const size = dataUrlImageSize(url);
  if (!size) return IMAGE_TOKENS_BOUND;
  return tiledImageTokens(size.width, size.height);
}

export function tiledImageTokens(width: number, height: number): number {
  let w = width;
  let h = height;
  if (w > 2048 || h > 2048) {
    const scale = 2048 / Math.max(w, h);
    w = Math.floor(w * scale);
    h = Math.floor(h * scale);
  }
  if (Math.min(w, h) > 768) {
    const scale = 768 / Math.min(w, h);
    w = Math.floor(w * scale);
    h = Math.floor(h * scale);
  }
  return 85 + 170 * Math.ceil(w / 512) * Math.ceil(h / 512);
}

/** Audio given as base64: its decoded size over AUDIO_BYTES_PER_TOKEN. */
export function audioTokens(base64: string): number {
  return Math.ceil(decodedLength(base64) / AUDIO_BYTES_PER_TOKEN);
}

/** A file given as base64 (or a data URL), or by id (unknown size). */
export function fileTokens(data: string | undefined): number {
  if (!data) return FILE_PART_MIN_TOKENS;
  const base64 = data.startsWith('data:') ? data.slice(data.indexOf(',') + 1) : data;
  return Math.max(FILE_PART_MIN_TOKENS, Math.ceil(decodedLength(base64) / 4));
}

function decodedLength(base64: string): number {
  return Math.floor((base64.length * 3) / 4);
}

/** Width and height from the header of an image `data:` URL, when the format is one we read. */
export function dataUrlImageSize(url: string): { width: number; height: number } | undefined {
  if (!url.startsWith('data:')) return undefined;
  const comma = url.indexOf(',');
  if (comma < 0 || !url.slice(0, comma).includes(';base64')) return undefined;
  // JPEG's size can follow tens of kilobytes of metadata; read at most 256 KiB of the header.
  const head = Buffer.from(url.slice(comma + 1, comma + 1 + 349_528), 'base64');
  return imageSize(head);
}

export function imageSize(b: Buffer): { width: number; height: number } | undefined {
  if (b.length >= 24 && b.readUInt32BE(0) === 0x89504e47) {
    return { width: b.readUInt32BE(16), height: b.readUInt32BE(20) };
  }
  if (b.length >= 10 && b.toString('ascii', 0, 3) === 'GIF') {
    return { width: b.readUInt16LE(6), height: b.readUInt16LE(8) };
  }
  if (b.length >= 30 && b.toString('ascii', 0, 4) === 'RIFF' && b.toString('ascii', 8, 12) === 'WEBP') {
    const kind = b.toString('ascii', 12, 16);
    if (kind === 'VP8X') return { width: 1 + b.readUIntLE(24, 3), height: 1 + b.readUIntLE(27, 3) };
    if (kind === 'VP8 ') return { width: b.readUInt16LE(26) & 0x3fff, height: b.readUInt16LE(28) & 0x3fff };
    if (kind === 'VP8L') {
      const bits = b.readUInt32LE(21);
      return { width: 1 + (bits & 0x3fff), height: 1 + ((bits >> 14) & 0x3fff) };
    }
    return undefined;
  }
  if (b.length >= 4 && b[0] === 0xff && b[1] === 0xd8) {
    let i = 2;
    while (i + 9 < b.length) {
      if (b[i] !== 0xff) return undefined;
      const marker = b[i + 1]!;
      const length = b.readUInt16BE(i + 2);
      // SOF0…SOF15 except DHT (C4), JPG (C8) and DAC (CC) carry the frame size.
      if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc) {
        return { height: b.readUInt16BE(i + 5), width: b.readUInt16BE(i + 7) };
      }
      i += 2 + length;
    }
  }
  return undefined;
}
