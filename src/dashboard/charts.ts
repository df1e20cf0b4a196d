import { html, type Raw } from '../html/index.ts';

/**
 * Bar charts drawn on the server as inline SVG (no script, no build step), with a text equivalent
 * (`aria-label`) for screen readers and the exact value of each bar on hover (`<title>`):
 * - `barChart`: one vertical bar per day, oldest first; the dates under the bars (today's always);
 * - `rankChart`: one horizontal bar per name (models), each name written in full above its bar.
 * The SVG scales with its card; on a phone the style sheet enlarges its text (src/html).
 */
export interface Bar {
  label: string;
  value: number;
  /** The value as shown (e.g. "0.25" for 0.250018); default String(value). */
  shown?: string;
  /** The exact value (on hover); default `shown`. */
  exact?: string;
}

const WIDTH = 460;
const HEIGHT = 200;
const PAD = { top: 22, right: 8, bottom: 34, left: 8 };
/** The widest a character of the charts' text gets (14 px on a phone, in the SVG's units). */
const CHAR = 8.5;

const shownOf = (b: Bar) => b.shown ?? String(b.value);
const titleOf = (b: Bar) => `${b.label}: ${b.exact ?? shownOf(b)}`;

function frame(title: string, id: string, bars: Bar[], height: number, items: Raw[]): Raw {
  const summary = bars.length ? bars.map((b) => `${b.label}: ${shownOf(b)}`).join('; ') : 'no data yet';
  return html`<figure id="${id}">
<figcaption>${title}</figcaption>
<svg role="img" aria-label="${title}: ${summary}" viewBox="0 0 ${WIDTH} ${height}" width="100%" preserveAspectRatio="xMidYMid meet">
${items}
${bars.length ? '' : html`<text x="${WIDTH / 2}" y="${height / 2}" text-anchor="middle">No data yet</text>`}
</svg>
</figure>`;
}

/** A text centred on `x`, moved in from the chart's edges so that it is never cut off. */
function textAt(x: number, y: number, text: string): Raw {
  const half = (text.length * CHAR) / 2;
  const cx = Math.min(Math.max(x, half), WIDTH - half);
  return html`<text x="${cx.toFixed(1)}" y="${y.toFixed(1)}" text-anchor="middle">${text}</text>`;
}

/**
 * Vertical bars (days). The value is written above each bar when the values fit side by side, else
 * above the highest bar only; the date under every bar that has room, counted back from the last one.
 */
export function barChart(title: string, bars: Bar[], id: string): Raw {
  const inner = { w: WIDTH - PAD.left - PAD.right, h: HEIGHT - PAD.top - PAD.bottom };
  const max = Math.max(0, ...bars.map((b) => b.value));
  const slot = bars.length ? inner.w / bars.length : inner.w;
  const barWidth = Math.max(2, Math.min(48, slot * 0.7));
  const widest = Math.max(0, ...bars.map((b) => shownOf(b).length * CHAR));
  const allValues = widest < slot;
  const highest = bars.findIndex((b) => b.value === max);
  const dateWidth = Math.max(0, ...bars.map((b) => b.label.length * CHAR)) + 4;
  const every = Math.max(1, Math.ceil(dateWidth / slot));
  const items = bars.map((b, i) => {
    const h = max > 0 ? (b.value / max) * inner.h : 0;
    const x = PAD.left + i * slot + (slot - barWidth) / 2;
    const y = PAD.top + inner.h - h;
    const cx = x + barWidth / 2;
    const valued = b.value > 0 && (allValues || i === highest);
    const dated = (bars.length - 1 - i) % every === 0;
    return html`<g data-label="${b.label}" data-value="${b.exact ?? shownOf(b)}"><title>${titleOf(b)}</title>
<rect class="bar" x="${x.toFixed(1)}" y="${y.toFixed(1)}" width="${barWidth.toFixed(1)}" height="${Math.max(h, b.value > 0 ? 1 : 0).toFixed(1)}"></rect>
${valued ? textAt(cx, y - 5, shownOf(b)) : ''}
${dated ? textAt(cx, HEIGHT - PAD.bottom + 16, b.label) : ''}</g>`;
  });
  const axis = html`<line class="axis" x1="${PAD.left}" y1="${PAD.top + inner.h}" x2="${WIDTH - PAD.right}" y2="${PAD.top + inner.h}"></line>`;
  return frame(title, id, bars, HEIGHT, [axis, ...items]);
}

const ROW = 38;
/** The longest name written in full; a longer one ends in "…" (in full on hover and for screen readers). */
const NAME_CHARS = Math.floor((WIDTH - PAD.left - PAD.right) / CHAR);

/** Horizontal bars (models): the name in full above its bar, the value at the bar's end. */
export function rankChart(title: string, bars: Bar[], id: string): Raw {
  const max = Math.max(0, ...bars.map((b) => b.value));
  const widest = Math.max(0, ...bars.map((b) => shownOf(b).length * CHAR));
  const room = WIDTH - PAD.left - PAD.right - widest - 6;
  const height = Math.max(HEIGHT / 2, 8 + bars.length * ROW);
  const items = bars.map((b, i) => {
    const top = 4 + i * ROW;
    const w = max > 0 ? Math.max((b.value / max) * room, b.value > 0 ? 1 : 0) : 0;
    const name = b.label.length > NAME_CHARS ? `${b.label.slice(0, NAME_CHARS - 1)}…` : b.label;
    return html`<g data-label="${b.label}" data-value="${b.exact ?? shownOf(b)}"><title>${titleOf(b)}</title>
<text x="${PAD.left}" y="${top + 14}">${name}</text>
<rect class="bar" x="${PAD.left}" y="${top + 20}" width="${w.toFixed(1)}" height="12"></rect>
<text x="${(PAD.left + w + 4).toFixed(1)}" y="${top + 31}">${shownOf(b)}</text></g>`;
  });
  return frame(title, id, bars, height, items);
}

/** The last `days` UTC dates (YYYY-MM-DD), oldest first. */
export function lastDays(days: number, now = new Date()): string[] {
  const out: string[] = [];
  for (let i = days - 1; i >= 0; i--) {
    out.push(new Date(now.getTime() - i * 86_400_000).toISOString().slice(0, 10));
  }
  return out;
}
