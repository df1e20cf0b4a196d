import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, posix } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { Marked, Renderer, type Tokens } from 'marked';
import { escapeHtml, html, htmlDocument, htmlHeaders, raw, STYLE, sendHtml } from '../html/index.ts';

/**
 * `/docs`: the documentation as HTML pages, rendered by marked from the Markdown files the package ships
 * (source checkout, build or image): `/docs` is docs/README.md (the index), `/docs/<name>` is
 * docs/<name>.md, `/docs/readme` the repository's README, and `/docs/<name>.png` the images they show.
 * Links between the files are rewritten to these URLs; a heading's anchor is its GitHub slug (`slugOf`),
 * so a link that works on GitHub works here. Links to files that are not pages (source, examples) are
 * shown as text. Raw HTML in the Markdown is shown as text, never inserted (comments are left out).
 */

/** The directory holding package.json above this file (source checkout, build or image). */
export function packageRoot(from = import.meta.dirname): string | undefined {
  let dir = from;
  for (let i = 0; i < 5; i++) {
    if (existsSync(join(dir, 'package.json'))) return dir;
    dir = dirname(dir);
  }
  return undefined;
}

/** The pages and images under /docs: URL → file, relative to the package root. */
export interface DocsSite {
  root: string;
  /** URL path → Markdown file, e.g. `/docs/api` → `docs/api.md`. */
  pages: Map<string, string>;
  /** URL path → image file, e.g. `/docs/dashboard-user.png` → `docs/dashboard-user.png`. */
  images: Map<string, string>;
}

export function docsSite(root: string): DocsSite {
  const pages = new Map<string, string>();
  const images = new Map<string, string>();
  if (existsSync(join(root, 'README.md'))) pages.set('/docs/readme', 'README.md');
  const dir = join(root, 'docs');
  for (const file of existsSync(dir) ? readdirSync(dir).sort() : []) {
    const page = /^([a-z0-9][a-z0-9-]*)\.md$/.exec(file);
    if (file === 'README.md') pages.set('/docs', 'docs/README.md');
    else if (page) pages.set(`/docs/${page[1]}`, `docs/${file}`);
    else if (/^[a-z0-9][a-z0-9-]*\.png$/.test(file)) images.set(`/docs/${file}`, `docs/${file}`);
  }
  return { root, pages, images };
}

/**
 * A heading's anchor, as GitHub makes it: the text without Markdown (link targets, backticks, emphasis),
 * lower-cased, everything but letters, digits, `_`, `-` and spaces dropped, spaces made `-`. A page's
 * second heading with the same slug gets `-1`, the third `-2` (`Slugs`).
 */
export function slugOf(text: string): string {
  return text
    .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
    .replace(/[`*]/g, '')
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}_\- ]/gu, '')
    .replace(/ /g, '-');
}

/** The anchors of one page, in order: duplicates numbered as GitHub numbers them. */
export class Slugs {
  private readonly seen = new Map<string, number>();
  next(text: string): string {
    const slug = slugOf(text);
    const n = this.seen.get(slug) ?? 0;
    this.seen.set(slug, n + 1);
    return n === 0 ? slug : `${slug}-${n}`;
  }
}

/** The headings' anchors of a Markdown text (the ones the rendered page has). */
export function anchorsOf(markdown: string): Set<string> {
  const slugs = new Slugs();
  const out = new Set<string>();
  for (const token of new Marked({ gfm: true }).lexer(markdown)) {
    if (token.type === 'heading') out.add(slugs.next((token as Tokens.Heading).text));
  }
  return out;
}

/**
 * Where a link written in `from` (a file relative to the package root) goes under /docs: a page or image
 * URL (with its `#anchor`), the link as it is when it is absolute or an anchor of the same page, or
 * undefined when it names a file that is not served.
 */
export function docsHref(site: DocsSite, from: string, href: string): string | undefined {
  if (/^[a-z][a-z0-9+.-]*:/i.test(href) || href.startsWith('#')) return href;
  const [path = '', anchor] = href.split('#', 2);
  const file = posix.normalize(posix.join(posix.dirname(from), decodeURI(path)));
  const fragment = anchor === undefined ? '' : `#${anchor}`;
  for (const [url, target] of site.pages) if (target === file) return url + fragment;
  for (const [url, target] of site.images) if (target === file) return url;
  return undefined;
}

/** The first heading of a Markdown text, as plain text (the page's title). */
function titleOf(markdown: string): string {
  const heading = /^# (.+)$/m.exec(markdown)?.[1] ?? 'Documentation';
  return heading.replace(/\[([^\]]*)\]\([^)]*\)/g, '$1').replace(/[`*]/g, '');
}

/** Renders one Markdown file of the site as the body of a page. */
export function renderDoc(site: DocsSite, file: string, markdown: string): { title: string; body: string } {
  const slugs = new Slugs();
  const fallback = new Renderer();
  const marked = new Marked({
    gfm: true,
    renderer: {
      heading(token) {
        const id = slugs.next(token.text);
        const inner = this.parser.parseInline(token.tokens);
        return `<h${token.depth} id="${escapeHtml(id)}">${inner} <a class="anchor" href="#${escapeHtml(id)}" aria-label="Link to this section">#</a></h${token.depth}>\n`;
      },
      link(token) {
        const inner = this.parser.parseInline(token.tokens);
        const href = docsHref(site, file, token.href);
        if (href === undefined) return `<span class="file" title="${escapeHtml(token.href)}">${inner}</span>`;
        const title = token.title ? ` title="${escapeHtml(token.title)}"` : '';
        return `<a href="${escapeHtml(href)}"${title}>${inner}</a>`;
      },
      image(token) {
        const src = docsHref(site, file, token.href);
        if (src === undefined) return escapeHtml(token.text);
        return `<img src="${escapeHtml(src)}" alt="${escapeHtml(token.text)}">`;
      },
      html(token) {
        return /^\s*<!--[\s\S]*-->\s*$/.test(token.text) ? '' : escapeHtml(token.text);
      },
      table(token) {
        fallback.parser = this.parser;
        return `<div class="table">${fallback.table(token)}</div>\n`;
      },
    },
  });
  return { title: titleOf(markdown), body: marked.parse(markdown, { async: false }) };
}

const DOCS_STYLE = `${STYLE}
main.docs{max-width:60rem}
main.docs h1{font-size:1.6rem;margin:1.5rem 0 1rem}
main.docs h2{font-size:1.3rem;margin:2rem 0 .75rem;padding-bottom:.25rem;border-bottom:1px solid var(--line)}
main.docs h3,main.docs h4{font-size:1.05rem;margin:1.5rem 0 .5rem}
main.docs a.anchor{color:var(--muted);text-decoration:none;font-weight:400;opacity:.4}
main.docs ul,main.docs ol{padding-left:1.5rem;margin:0 0 .75rem}
main.docs li{margin:.2rem 0}
main.docs pre{white-space:pre;word-break:normal}
main.docs :not(pre)>code{background:var(--card);border:1px solid var(--line);border-radius:4px;padding:0 .2rem;overflow-wrap:anywhere}
main.docs div.table{overflow-x:auto;margin:0 0 1rem;background:var(--card)}
main.docs img{max-width:100%;height:auto;border:1px solid var(--line);border-radius:6px}
main.docs blockquote{margin:0 0 .75rem;padding:.25rem .75rem;border-left:4px solid var(--line);color:var(--muted)}
main.docs span.file{font-style:italic}
`;

function page(title: string, body: string): string {
  return htmlDocument(
    `${title} · Tollgate`,
    DOCS_STYLE,
    html`<a class="skip" href="#content">Skip to content</a>
<header class="top"><a class="brand" href="/">Tollgate</a><nav aria-label="Main"><a href="/docs">Documentation</a><a href="/dashboard">Dashboard</a></nav></header>
<main id="content" class="docs">
${raw(body)}
</main>`,
  );
}

/** `GET /docs`, `/docs/:page` (a page or an image); anything else under /docs is a 404 page. */
export async function docsRoutes(app: FastifyInstance): Promise<void> {
  await app.register(htmlHeaders);
  const root = packageRoot();
  const site = root ? docsSite(root) : { root: '', pages: new Map(), images: new Map() };
  const rendered = new Map<string, string>();
  const answer = (url: string) => {
    const file = site.pages.get(url);
    if (!file) return undefined;
    let out = rendered.get(url);
    if (out === undefined) {
      const doc = renderDoc(site, file, readFileSync(join(site.root, file), 'utf8'));
      out = page(doc.title, doc.body);
      rendered.set(url, out);
    }
    return out;
  };
  const notFound = () =>
    page('Not found', html`<h1>No such page</h1><p><a href="/docs">The documentation's index</a></p>`.html);

  app.get('/docs', async (_request, reply) => sendHtml(reply, ...found(answer('/docs'))));
  app.get('/docs/:page', async (request, reply) => {
    const url = `/docs/${(request.params as { page: string }).page}`;
    const image = site.images.get(url);
    if (image) {
      return reply
        .type('image/png')
        .header('cache-control', 'public, max-age=3600')
        .send(readFileSync(join(site.root, image)));
    }
    return sendHtml(reply, ...found(answer(url)));
  });

  function found(body: string | undefined): [number, string] {
    return body === undefined ? [404, notFound()] : [200, body];
  }
}
