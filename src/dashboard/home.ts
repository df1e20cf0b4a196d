import type { FastifyInstance } from 'fastify';
import { html, htmlHeaders, layout, sendHtml } from '../html/index.ts';

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
<li><a href="/docs">Documentation</a>, health at <a href="/healthz">/healthz</a>.</li>
</ul>
</section>`;
    return sendHtml(reply, 200, layout({ title: 'Tollgate', narrow: false }, body));
  });
}
