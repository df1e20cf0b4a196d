import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { html, htmlHeaders, layout, sendHtml } from '../html/index.ts';

/** The README beside the package.json above this file (source checkout, build or image). */
function findReadme(): string | undefined {
  let dir = import.meta.dirname;
  for (let i = 0; i < 5; i++) {
    if (existsSync(join(dir, 'package.json'))) {
      const file = join(dir, 'README.md');
      return existsSync(file) ? file : undefined;
    }
    dir = dirname(dir);
  }
  return undefined;
}

/** `GET /`: a small page pointing at the dashboard, the API and the docs (instead of a JSON 404). */
export async function homeRoutes(app: FastifyInstance): Promise<void> {
  await app.register(htmlHeaders);
  app.get('/', async (_request, reply) => {
    const base = app.ctx.publicBaseUrl;
    const body = html`<section class="card">
<h1>Tollgate is running</h1>
<p>A metered, OpenAI-compatible proxy with a paywall per end user.</p>
<ul>
<li><a href="/dashboard">Open the dashboard</a> — sign up, connect your model provider, get an API key.</li>
<li>OpenAI clients: <code>baseURL: ${base}/v1</code> with a Tollgate API key.</li>
<li>Admin API: <code>${base}/admin/v1</code> (an admin token or a session token as the bearer).</li>
<li><a href="/docs">Documentation</a> (the README), health at <a href="/healthz">/healthz</a>.</li>
</ul>
</section>`;
    return sendHtml(reply, 200, layout({ title: 'Tollgate', narrow: false }, body));
  });

  const readme = findReadme();
  app.get('/docs', async (_request, reply) => {
    if (!readme) return reply.redirect('/', 302);
    return reply
      .type('text/markdown; charset=utf-8')
      .header('x-content-type-options', 'nosniff')
      .send(readFileSync(readme, 'utf8'));
  });
}
