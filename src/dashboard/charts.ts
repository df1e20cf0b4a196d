import { html, type Raw } from '../html/index.ts';

/**
 * Bar charts drawn on the server as inline SVG (no script, no build step): one bar per label, the value
 * written above each bar, and a text equivalent (`<title>`, `aria-label`) for screen readers.
 */
export interface Bar {
  label: string;
  value: number;
  /** The value as shown (e.g. "0.25"); default String(value). */
  shown?: string;
}

const WIDTH = 460;
const HEIGHT = 200;
const PAD = { top: 18, right: 8, bottom: 34, left: 8 };

export function barChart(title: string, bars: Bar[], id: string): Raw {
  const inner = { w: WIDTH - PAD.left - PAD.right, h: HEIGHT - PAD.top - PAD.bottom };
  const max = Math.max(0, ...bars.map((b) => b.value));
  const slot = bars.length ? inner.w / bars.length : inner.w;
  const barWidth = Math.max(2, Math.min(48, slot * 0.7));
  const summary = bars.length
    ? bars.map((b) => `${b.label}: ${b.shown ?? b.value}`).join('; ')
    : 'no data yet';
  const every = Math.ceil(bars.length / 10);
  const items = bars.map((b, i) => {
    const h = max > 0 ? (b.value / max) * inner.h : 0;
    const x = PAD.left + i * slot + (slot - barWidth) / 2;
    const y = PAD.top + inner.h - h;
    const cx = x + barWidth / 2;
    const label = b.label.length > 12 ? `${b.label.slice(0, 11)}…` : b.label;
    return html`<g data-label="${b.label}" data-value="${b.shown ?? String(b.value)}"><title>${b.label}: ${b.shown ?? b.value}</title>
<rect class="bar" x="${x.toFixed(1)}" y="${y.toFixed(1)}" width="${barWidth.toFixed(1)}" height="${Math.max(h, b.value > 0 ? 1 : 0).toFixed(1)}"></rect>
${b.value > 0 ? html`<text x="${cx.toFixed(1)}" y="${(y - 4).toFixed(1)}" text-anchor="middle">${b.shown ?? b.value}</text>` : ''}
${i % every === 0 ? html`<text x="${cx.toFixed(1)}" y="${(HEIGHT - PAD.bottom + 14).toFixed(1)}" text-anchor="middle">${label}</text>` : ''}</g>`;
  });
  return html`<figure id="${id}">
<figcaption>${title}</figcaption>
<svg role="img" aria-label="${title}: ${summary}" viewBox="0 0 ${WIDTH} ${HEIGHT}" width="100%" preserveAspectRatio="xMidYMid meet">
<line class="axis" x1="${PAD.left}" y1="${PAD.top + inner.h}" x2="${WIDTH - PAD.right}" y2="${PAD.top + inner.h}"></line>
${items}
${bars.length ? '' : html`<text x="${WIDTH / 2}" y="${HEIGHT / 2}" text-anchor="middle">No data yet</text>`}
</svg>
</figure>`;
}

/** The last `days` UTC dates (YYYY-MM-DD), oldest first. */
export function lastDays(days: number, now = new Date()): string[] {
  const out: string[] = [];
  for (let i = days - 1; i >= 0; i--) {
    out.push(new Date(now.getTime() - i * 86_400_000).toISOString().slice(0, 10));
  }
  return out;
}
