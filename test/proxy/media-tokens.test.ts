import { describe, expect, it } from 'vitest';
import {
  dataUrlImageSize,
  IMAGE_TOKENS_BOUND,
  imageTokens,
  tiledImageTokens,
} from '../../src/tokens/media.ts';

/** The hold's image-token rule (OpenAI's, for its vision models) and the sizes read from data URLs. */
describe('image tokens', () => {
  it('follows OpenAI’s published examples', () => {
    expect(tiledImageTokens(1024, 1024)).toBe(765); // 768×768: 4 tiles
    expect(tiledImageTokens(2048, 4096)).toBe(1105); // 1024×2048 → 768×1536: 6 tiles
    expect(tiledImageTokens(512, 512)).toBe(255); // 1 tile
    expect(imageTokens('https://example.com/x.png', 'low')).toBe(85);
  });

  it('never exceeds the bound used for images of unknown size', () => {
    for (const [w, h] of [
      [768, 2048],
      [800, 20000],
      [4096, 4096],
      [100, 10000],
      [1500, 2047],
    ] as const) {
      expect(tiledImageTokens(w, h)).toBeLessThanOrEqual(IMAGE_TOKENS_BOUND);
    }
    expect(IMAGE_TOKENS_BOUND).toBe(1445);
    expect(imageTokens('https://example.com/x.png', 'high')).toBe(IMAGE_TOKENS_BOUND);
    expect(imageTokens('data:image/png;base64,AAAA', 'auto')).toBe(IMAGE_TOKENS_BOUND);
  });

  it('reads the size of PNG, GIF, JPEG and WebP data URLs', () => {
    const png = Buffer.alloc(24);
    png.writeUInt32BE(0x89504e47, 0);
    png.writeUInt32BE(640, 16);
    png.writeUInt32BE(480, 20);
    const gif = Buffer.from('GIF89a\x20\x03\x58\x02', 'latin1'); // 800×600
    // JPEG: SOI, an APP0 segment, then SOF0 with height 300 and width 400.
    const jpeg = Buffer.from([
      0xff, 0xd8, 0xff, 0xe0, 0x00, 0x04, 0x00, 0x00, 0xff, 0xc0, 0x00, 0x11, 0x08, 0x01, 0x2c, 0x01, 0x90,
      0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ]);
    const webp = Buffer.alloc(30);
    webp.write('RIFF', 0, 'ascii');
    webp.write('WEBPVP8X', 8, 'ascii');
    webp.writeUIntLE(1919, 24, 3);
    webp.writeUIntLE(1079, 27, 3);
    const url = (type: string, b: Buffer) => `data:image/${type};base64,${b.toString('base64')}`;
    expect(dataUrlImageSize(url('png', png))).toEqual({ width: 640, height: 480 });
    expect(dataUrlImageSize(url('gif', gif))).toEqual({ width: 800, height: 600 });
    expect(dataUrlImageSize(url('jpeg', jpeg))).toEqual({ width: 400, height: 300 });
    expect(dataUrlImageSize(url('webp', webp))).toEqual({ width: 1920, height: 1080 });
    expect(dataUrlImageSize('https://example.com/cat.png')).toBeUndefined();
  });
});
