import { existsSync } from 'node:fs';
import { type Browser, chromium } from 'playwright-core';

/**
 * The headless Chromium of the browser tests (Debian's `chromium` package, installed in CI by
 * scripts/ci-system-packages.sh). Without it, each browser test file warns once and skips its tests.
 */
export const CHROMIUM = '/usr/bin/chromium';

/** True when Chromium is installed; else warns `<file>: skipped — no Chromium at …`. */
export function chromiumPresent(file: string, hint = ''): boolean {
  const present = existsSync(CHROMIUM);
  if (!present) console.warn(`${file}: skipped — no Chromium at ${CHROMIUM}${hint}`);
  return present;
}

/** Launches Chromium headless, with the network chatter of a desktop browser switched off. */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}
