import { z } from 'zod';
import { createAdminToken, revokeAdminToken } from '../../admin/accounts.ts';
import { routeModule } from '../../core/plugins.ts';
import { storableText, textInput } from '../../core/validation.ts';
import { html } from '../../html/index.ts';
import { invalidBody } from '../forms.ts';
import { done, formBody, page, secretBox } from '../pages.ts';
import { FORMS, projectsPage } from './projects.ts';

const tokenForm = formBody({ name: storableText(200) });

/** Admin tokens (listed on the projects page): create one (shown once), revoke one. */
export default routeModule((app, ctx) => {
  app.post(
    '/admin-tokens',
    { schema: { body: tokenForm }, attachValidation: true },
    async (request, reply) => {
      if (request.validationError)
        return projectsPage(request, reply, invalidBody(FORMS.adminToken, tokenForm, request));
      const created = await createAdminToken(ctx.db, request.developer, request.body.name);
      return page(
        request,
        reply,
        'Admin token',
        () => html`<section class="card"><h1>Admin token created</h1>
${secretBox('admin-token', 'Your admin token', created.token)}
<pre>export TOLLGATE_URL=${ctx.publicBaseUrl} TOLLGATE_ADMIN_TOKEN=${created.token}</pre>
<p><a href="/dashboard">Back to the projects</a></p></section>`,
        { script: true },
      );
    },
  );

  app.post(
    '/admin-tokens/:id/revoke',
    { schema: { params: z.object({ id: textInput(255, 'an id') }), body: formBody({}) } },
    async (request, reply) => {
      await revokeAdminToken(ctx.db, request.developer, request.params.id);
      return reply.redirect(done('/dashboard', 'admin_token_revoked'), 303);
    },
  );
});
