import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, posix } from 'node:path';
import { Marked, type Token, type Tokens } from 'marked';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { anchorsOf, docsSite } from '../../src/dashboard/docs.ts';
import { startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * Every link of the README and of docs/*.md goes somewhere: a relative link names a file that exists, and
 * its #anchor is a heading of that page (the renderer's slug rule, `anchorsOf`). And every page is served
 * as HTML at /docs by a real server, its links to other pages and anchors resolving there too.
 */
const root = join(import.meta.dirname, '..', '..');
const files = [
  'README.md',
  ...readdirSync(join(root, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
];

/** Every link and image of a Markdown text, tables and lists included. */
function linksOf(markdown: string): string[] {
  const out: string[] = [];
  const walk = (tokens: Token[] | undefined) => {
    for (const token of tokens ?? []) {
      if (token.type === 'link' || token.type === 'image') out.push((token as Tokens.Link).href);
      if (token.type === 'table') {
        const table = token as Tokens.Table;
        for (const cell of [...table.header, ...table.rows.flat()]) walk(cell.tokens);
      }
      if (token.type === 'list') for (const item of (token as Tokens.List).items) walk(item.tokens);
      walk((token as { tokens?: Token[] }).tokens);
    }
  };
  walk(new Marked({ gfm: true }).lexer(markdown));
  return out;
}

const anchors = new Map<string, Set<string>>();
const anchorsIn = (file: string) => {
  const known = anchors.get(file);
  if (known) return known;
  const set = anchorsOf(readFileSync(join(root, file), 'utf8'));
  anchors.set(file, set);
  return set;
};

describe('the documentation’s links', () => {
  it('covers the README and every page of docs/', () => {
    expect(files).toContain('docs/README.md');
    expect(files.length).toBeGreaterThan(15);
  });

  it.each(files)('%s: relative links name files that exist, anchors headings that exist', (file) => {
    const broken: string[] = [];
    const links = linksOf(readFileSync(join(root, file), 'utf8'));
    for (const href of links) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(href)) continue;
      const [path = '', anchor] = href.split('#', 2);
      const target = path === '' ? file : posix.normalize(posix.join(posix.dirname(file), decodeURI(path)));
      if (!existsSync(join(root, target))) broken.push(`${href} (no file ${target})`);
      else if (anchor !== undefined && !anchorsIn(target).has(anchor))
        broken.push(`${href} (no heading #${anchor})`);
    }
    expect(broken).toEqual([]);
  });

  it('catches a broken anchor and a missing file (the check can fail)', () => {
    const links = linksOf('See [a](docs/api.md#no-such-heading) and [b](docs/nothing.md).');
    expect(links).toEqual(['docs/api.md#no-such-heading', 'docs/nothing.md']);
    expect(anchorsIn('docs/api.md').has('no-such-heading')).toBe(false);
    expect(existsSync(join(root, 'docs/nothing.md'))).toBe(false);
  });
});

describe('/docs over HTTP', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer();
  });
  afterAll(async () => {
    await server?.close();
  });

  const site = docsSite(root);
  const pages = [...site.pages.keys()];

  it('serves one page per Markdown file: the index, the README and every docs/*.md', () => {
    expect(pages).toContain('/docs');
    expect(pages).toContain('/docs/readme');
    expect(pages.length).toBe(files.length);
    expect(site.images.size).toBeGreaterThan(0);
  });

  it('renders every page as HTML whose links to pages, anchors and images all resolve', async () => {
    const html = new Map<string, string>();
    const get = async (url: string) => {
      let text = html.get(url);
      if (text === undefined) {
        const res = await fetch(`${server.url}${url}`);
        expect(res.status, url).toBe(200);
        expect(res.headers.get('content-type'), url).toMatch(/^text\/html/);
        text = await res.text();
        html.set(url, text);
      }
      return text;
    };
    const broken: string[] = [];
    for (const url of pages) {
      const page = await get(url);
      expect(page, url).toMatch(/<h1 id="[^"]+">/);
      const ids = new Set([...page.matchAll(/ id="([^"]+)"/g)].map((m) => m[1]!));
      for (const [, href] of page.matchAll(/<(?:a|img) [^>]*(?:href|src)="([^"]+)"/g)) {
        const link = href!.replace(/&amp;/g, '&');
        if (/^[a-z][a-z0-9+.-]*:/i.test(link)) continue;
        const [path = '', anchor] = link.split('#', 2);
        if (path === '') {
          if (!ids.has(anchor!)) broken.push(`${url}: ${link}`);
          continue;
        }
        if (!path.startsWith('/docs')) continue; // the header's links to / and /dashboard
        if (path.endsWith('.png')) {
          const res = await fetch(`${server.url}${path}`);
          if (res.status !== 200 || res.headers.get('content-type') !== 'image/png')
            broken.push(`${url}: ${link}`);
          await res.arrayBuffer();
          continue;
        }
        if (!site.pages.has(path)) {
          broken.push(`${url}: ${link} (no page)`);
          continue;
        }
        const target = await get(path);
        if (anchor !== undefined && !target.includes(` id="${anchor}"`)) broken.push(`${url}: ${link}`);
      }
    }
    expect(broken).toEqual([]);
  });

  it('escapes code, links the headings, shows the images and answers 404 for an unknown page', async () => {
    const api = await (await fetch(`${server.url}/docs/api`)).text();
    expect(api).toContain('<code>Authorization: Bearer &lt;key&gt;</code>');
    expect(api).toContain('<h2 id="end-user-keys">End-user keys <a class="anchor" href="#end-user-keys"');
    const readme = await (await fetch(`${server.url}/docs/readme`)).text();
    expect(readme).toContain('href="/docs/configuration"');
    expect(readme).toContain('<img src="/docs/dashboard-api-key.png"');
    const bench = await (await fetch(`${server.url}/docs/benchmarks`)).text();
    expect(bench).not.toContain('<!--');
    for (const missing of ['/docs/nope', '/docs/api.md', '/docs/..%2Fpackage.json', '/docs/readme/x']) {
      const res = await fetch(`${server.url}${missing}`);
      expect(res.status, missing).toBe(404);
      await res.arrayBuffer();
    }
  });

  it('is in the image and the package: the server reads docs/ beside package.json', () => {
    expect(readFileSync(join(root, 'Dockerfile'), 'utf8')).toMatch(/^COPY docs \.\/docs$/m);
    const ignore = readFileSync(join(root, '.dockerignore'), 'utf8');
    expect(ignore).toMatch(/^!docs\/\*\.md$/m);
    expect(ignore).toMatch(/^!docs\/\*\.png$/m);
    const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { files: string[] };
    expect(pkg.files).toContain('docs');
  });
});
