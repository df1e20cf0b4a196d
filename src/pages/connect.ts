import type { FastifyReply } from 'fastify';
import { routeModule } from '../core/plugins.ts';
import { PRIVATE_HEADERS, sendPage } from '../html/hosted-page.ts';
import { html, raw } from '../html/index.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { keyNameOf } from '../users/schema.ts';
import { useConnectLink } from '../users/sessions.ts';
import { foreignPost, formProof, openToken, problemPage, tokenParam } from './links.ts';

/**
 * The connect page (no API key; the signed token is the credential):
 * - `GET /connect/{token}` — names the project and what connecting allows, with a Connect button
 * - `POST /connect/{token}` — the button (a plain form post): connects the user once, then returns to
 *   the project's `returnUrl` (303) or shows a done page. Only the rendered page's own form counts
 *   (./links.ts `foreignPost`).
 * - `?key=NAME` on the link (`POST /v1/user/connect {"user", "keyName"}` adds it): the page says so,
 *   and connecting also makes the user an end-user key of that name, shown once on the done page (no
 *   redirect) — the key a coding agent is configured with. The link is single-use, so is the key's
 *   showing. A name that is not one (empty, too long, control characters) is ignored.
 */

function foreignPostPage(reply: FastifyReply, why: 'cross_site' | 'not_the_form') {
  return sendPage(
    reply,
    why === 'cross_site' ? 403 : 400,
    'Connect from the connect page',
    html`<h1>Connect from the connect page</h1>
<p>To connect, open the link you received and press its Connect button.</p>
<p class="muted">Nothing was changed.</p>`,
  );
}

function connectPage(reply: FastifyReply, project: ProjectContext, proof: string, keyName?: string) {
  const name = project.name;
  const keyNote = keyName
    ? html`<p id="key-offer">Connecting also gives you an API key named “${keyName}” for your own tools (it is shown once, on the next page).</p>`
    : raw('');
  return sendPage(
    reply,
    200,
    `Connect to ${name}`,
    html`<h1>Connect to ${name}</h1>
<p>${name} asks you to connect your account to its pay-as-you-go balance.</p>
<p>Connecting allows ${name} to:</p>
<ul>
<li>charge your prepaid ${name} balance (in ${project.currency.toUpperCase()}) for the requests you make and the actions you choose;</li>
<li>show you a link to top up your balance when it runs low.</li>
</ul>
<p>It never charges more than your balance holds. ${name} can disconnect you at any time; your balance stays yours.</p>
${keyNote}
<form method="post">
<input type="hidden" name="confirm" value="${proof}">
<button type="submit">Connect</button>
</form>`,
  );
}

function connectedPage(reply: FastifyReply, project: ProjectContext) {
  return sendPage(
    reply,
    200,
    `Connected to ${project.name}`,
    html`<h1>You are connected</h1>
<p>Your account is now connected to ${project.name}.</p>
<p>You can close this page and go back to ${project.name}.</p>`,
  );
}

/** The done page with the user's new key, shown once. */
function keyPage(reply: FastifyReply, project: ProjectContext, keyName: string, key: string) {
  return sendPage(
    reply,
    200,
    `Connected to ${project.name}`,
    html`<h1>You are connected</h1>
<p>Your account is now connected to ${project.name}. Your API key “${keyName}”:</p>
<p><code id="end-user-key">${key}</code></p>
<p>Copy it now: it is not shown again. It is yours alone: requests with it are charged to your ${project.name} balance. Revoke it from your balance page at any time.</p>`,
  );
}

export const connectPageRoutes = routeModule((app, ctx) => {
  app.get('/connect/*', async (request, reply) => {
    const token = tokenParam(request);
    const opened = await openToken(reply, ctx, 'connect', token);
    if (!opened) return reply;
    return connectPage(reply, opened.project, formProof(ctx, 'connect', token), keyNameOf(request.query));
  });

  app.post('/connect/*', async (request, reply) => {
    const token = tokenParam(request);
    const opened = await openToken(reply, ctx, 'connect', token);
    if (!opened) return reply;
    const foreign = foreignPost(request, ctx, 'connect', token);
    if (foreign) return foreignPostPage(reply, foreign);
    const keyName = keyNameOf(request.query);
    const used = await useConnectLink(ctx.db, ctx.events, opened.project, opened.payload, keyName);
    if (!used.ok) return problemPage(reply, used.problem);
    if (keyName !== undefined && used.key) return keyPage(reply, opened.project, keyName, used.key);
    const returnUrl = opened.project.settings.returnUrl;
    if (returnUrl) return reply.headers(PRIVATE_HEADERS).redirect(returnUrl, 303);
    return connectedPage(reply, opened.project);
  });
});
