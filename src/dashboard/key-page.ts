import type { FastifyReply, FastifyRequest } from 'fastify';
import type { ProjectView } from '../admin/service.ts';
import { html, type Raw } from '../html/index.ts';
import { page, secretBox } from './pages.ts';

function snippets(base: string, key: string, model: string): Raw {
  const curl = `curl ${base}/v1/chat/completions \\
  -H "Authorization: Bearer ${key}" \\
  -H "Content-Type: application/json" \\
  -d '{"model":"${model}","user":"user-42","messages":[{"role":"user","content":"Hello"}]}'`;
  const js = `import OpenAI from 'openai';

const client = new OpenAI({ baseURL: '${base}/v1', apiKey: '${key}' });
const reply = await client.chat.completions.create({
  model: '${model}',
  user: 'user-42', // your end user: unconnected users get a connect link, broke ones a top-up link
  messages: [{ role: 'user', content: 'Hello' }],
});
console.log(reply.choices[0].message.content);`;
  const py = `from openai import OpenAI

client = OpenAI(base_url="${base}/v1", api_key="${key}")
reply = client.chat.completions.create(
    model="${model}",
    user="user-42",  # your end user
    messages=[{"role": "user", "content": "Hello"}],
)
print(reply.choices[0].message.content)`;
  return html`<h2>Try it</h2>
<p>With <code>curl</code>:</p><pre id="snippet-curl">${curl}</pre>
<p>With the <code>openai</code> package for JavaScript:</p><pre id="snippet-js">${js}</pre>
<p>With the <code>openai</code> package for Python:</p><pre id="snippet-py">${py}</pre>`;
}

/** The page that shows a new API key once, with snippets that use it. */
export function keyPage(
  request: FastifyRequest,
  reply: FastifyReply,
  project: Pick<ProjectView, 'id' | 'name'>,
  key: string,
  model: string,
  first: boolean,
  options: { echo?: boolean } = {},
) {
  const base = request.server.ctx.publicBaseUrl;
  const link = `/dashboard/projects/${encodeURIComponent(project.id)}`;
  return page(
    request,
    reply,
    'Your API key',
    () => html`<section class="card">
<h1>${first ? `${project.name} is connected` : 'New API key'}</h1>
${secretBox('api-key', 'Your API key', key)}
${snippets(base, key, model)}
<h2>Next</h2>
<ol>
${
  options.echo
    ? html`<li>The built-in echo provider answers <code>${model}</code> for now: <a href="${link}#provider">connect your model provider</a> when you are ready.</li>`
    : ''
}
<li><a href="${link}/pricing">Set a price</a> for each model you sell (clients may use only priced models).</li>
<li><a href="${link}/users">Fund a user</a>, or let users connect and top up through the links Tollgate sends them.</li>
<li>Watch requests, tokens and revenue on the <a href="${link}">project overview</a>.</li>
</ol>
</section>`,
    { script: true },
  );
}
