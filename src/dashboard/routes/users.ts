import { randomUUID } from 'node:crypto';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { grantCredit, moveMoney, searchUsers, setUserConnected } from '../../admin/end-users.ts';
import { projectView } from '../../admin/service.ts';
import { ApiError, badRequest } from '../../core/errors.ts';
import { amountSchema } from '../../core/money.ts';
import { routeModule } from '../../core/plugins.ts';
import { isStorable, NOT_STORABLE, parseInput, textInput } from '../../core/validation.ts';
import { dataTable, html, money, type Raw } from '../../html/index.ts';
import { grantBody, userIdSchema } from '../../users/schema.ts';
import { getBalance, listActivity, listGrants } from '../../users/service.ts';
import { type FormSpec, formView, invalidBody, type Refused, refusedBy } from '../forms.ts';
import {
  csrfField,
  done,
  flashQuery,
  formBody,
  optionalField,
  projectPage,
  projectParams,
  projectPath,
} from '../pages.ts';

/** A project's end users (`/dashboard/projects/:id/users`): search, balances, deposits, charges. */

const moneyForm = formBody({
  user: userIdSchema,
  amount: z.string().trim().min(1, { message: 'is required' }).max(64),
  idem: optionalField(textInput(100)),
  description: optionalField(z.string().max(200).refine(isStorable, { message: NOT_STORABLE })),
  /** A deposit from the user's page (hidden): a refusal comes back there. */
  from: optionalField(z.literal('user')),
});
const userParams = projectParams.extend({ user: userIdSchema });
/** A credit grant from the user page: the API's own rules (reason, priority, a future expiry). */
const grantForm = formBody({
  user: userIdSchema,
  amount: z.string().trim().min(1, { message: 'is required' }).max(64),
  reason: grantBody.shape.reason,
  priority: optionalField(z.coerce.number().pipe(grantBody.shape.priority.unwrap())),
  expiresAt: optionalField(z.string().trim().max(64)),
  idem: optionalField(textInput(100)),
});

/** The forms of the users' pages, refused ones shown again in place (../forms.ts). */
const FORMS = {
  deposit: {
    name: 'deposit',
    fields: {
      user: { id: 'depositUser', label: 'User id' },
      amount: { id: 'depositAmount', label: 'Amount' },
    },
  },
  charge: {
    name: 'charge',
    fields: {
      amount: { id: 'chargeAmount', label: 'Amount' },
      description: { id: 'chargeDescription', label: 'What for' },
    },
  },
  credit: {
    name: 'credit',
    fields: {
      amount: { id: 'grantAmount', label: 'Amount' },
      reason: { id: 'grantReason', label: 'Reason' },
      priority: { id: 'grantPriority', label: 'Priority' },
      expiresAt: { id: 'grantExpires', label: 'Expires' },
    },
  },
} satisfies Record<string, FormSpec>;

function depositForm(path: string, csrf: string, currency: string, user?: string, refused?: Refused): Raw {
  // on the user's page, the user is not a field to fill in
  const f = formView(
    user ? { ...FORMS.deposit, fields: { amount: FORMS.deposit.fields.amount } } : FORMS.deposit,
    refused,
  );
  return html`<form method="post" action="${path}/users/deposit">${csrfField(csrf)}<input type="hidden" name="idem" value="${randomUUID()}">${f.alert()}
<div class="row">${
    user
      ? html`<input type="hidden" name="user" value="${user}"><input type="hidden" name="from" value="user">`
      : html`<div><label for="depositUser">User id</label><input id="depositUser" name="user" required maxlength="256"${f.input('user')}>${f.error('user')}</div>`
  }
<div><label for="depositAmount">Amount (${currency})</label><input id="depositAmount" name="amount" inputmode="decimal" required placeholder="10.00"${f.input('amount')}>${f.error('amount')}</div>
<div><button type="submit">Deposit</button></div></div></form>`;
}

/** The users found, with the search form. */
function usersCard(
  path: string,
  q: string,
  currency: string,
  users: Awaited<ReturnType<typeof searchUsers>>['data'],
): Raw {
  return html`<section class="card"><form method="get" action="${path}/users" role="search"><div class="row"><div><label for="q">Search users by id</label><input id="q" name="q" value="${q}"></div><div><button type="submit">Search</button></div></div></form>
${dataTable(
  [
    { label: 'User' },
    { label: 'Connected' },
    { label: `Balance (${currency})`, num: true },
    { label: 'Held', num: true },
    { label: 'Available', num: true },
  ],
  users.map((u) => [
    html`<a href="${path}/users/${encodeURIComponent(u.user)}">${u.user}</a>`,
    u.connected ? 'yes' : 'no',
    money(u.balance, currency),
    money(u.held, currency),
    money(u.available, currency),
  ]),
  { id: 'users' },
)}${users.length ? '' : html`<p class="muted">No users${q ? ' match' : ' yet'}.</p>`}</section>`;
}

/** The grant a credit form asks for, checked as the API checks one. */
function grantOf(input: z.infer<typeof grantForm>, currency: string) {
  const amount = parseInput(amountSchema(currency), input.amount, 'amount');
  // a date from the form's date field is the end of that day (UTC); a full ISO time as given
  const expiresAt =
    input.expiresAt === undefined
      ? undefined
      : /^\d{4}-\d{2}-\d{2}$/.test(input.expiresAt)
        ? `${input.expiresAt}T23:59:59Z`
        : input.expiresAt;
  return parseInput(grantBody, {
    user: input.user,
    amount,
    reason: input.reason,
    ...(input.priority === undefined ? {} : { priority: input.priority }),
    ...(expiresAt === undefined ? {} : { expiresAt }),
    metadata: { via: 'dashboard' },
  });
}

/** The form that charges a user by hand. */
function chargeCard(path: string, user: string, currency: string, csrf: string, refused?: Refused): Raw {
  const f = formView(FORMS.charge, refused);
  return html`<section class="card"><h2>Charge</h2>
<form method="post" action="${path}/users/charge">${csrfField(csrf)}<input type="hidden" name="idem" value="${randomUUID()}"><input type="hidden" name="user" value="${user}">${f.alert()}
<div class="row"><div><label for="chargeAmount">Amount (${currency})</label><input id="chargeAmount" name="amount" inputmode="decimal" required${f.input('amount')}>${f.error('amount')}</div>
<div><label for="chargeDescription">What for (optional)</label><input id="chargeDescription" name="description" maxlength="200"${f.input('description')}>${f.error('description')}</div>
<div><button type="submit">Charge</button></div></div></form></section>`;
}

/** A user's credit grants, and the form that grants credit. */
function creditCard(
  path: string,
  user: string,
  currency: string,
  grants: Awaited<ReturnType<typeof listGrants>>['data'],
  csrf: string,
  refused?: Refused,
): Raw {
  const f = formView(FORMS.credit, refused);
  return html`<section class="card"><h2>Credit</h2>
<p class="muted">Credit that is not money (a promotion, a trial, goodwill): spent before the paid balance, highest priority first, then soonest expiry; what is left at its expiry leaves the balance.</p>
${
  grants.length
    ? dataTable(
        [
          { label: 'Grant' },
          { label: 'Reason' },
          { label: 'Amount', num: true },
          { label: 'Left', num: true },
          { label: 'Priority' },
          { label: 'Expires (UTC)' },
        ],
        grants.map((g) => [
          html`<code>${g.id}</code>`,
          g.reason,
          money(g.amount, currency),
          g.expired
            ? html`expired (${money(g.expiredAmount ?? '0', currency)})`
            : money(g.remaining, currency),
          g.priority,
          g.expiresAt ? g.expiresAt.replace('T', ' ').slice(0, 16) : 'never',
        ]),
        { id: 'grants' },
      )
    : ''
}
<form method="post" action="${path}/users/credits">${csrfField(csrf)}<input type="hidden" name="idem" value="${randomUUID()}"><input type="hidden" name="user" value="${user}">${f.alert()}
<div class="row"><div><label for="grantAmount">Amount (${currency})</label><input id="grantAmount" name="amount" inputmode="decimal" required${f.input('amount')}>${f.error('amount')}</div>
<div><label for="grantReason">Reason</label><input id="grantReason" name="reason" required maxlength="32" pattern="[a-z][a-z0-9_-]{0,31}"${f.input('reason', 'goodwill')}>${f.error('reason')}</div>
<div><label for="grantPriority">Priority (optional)</label><input id="grantPriority" name="priority" inputmode="numeric"${f.input('priority')}>${f.error('priority')}</div>
<div><label for="grantExpires">Expires (optional)</label><input id="grantExpires" name="expiresAt" type="date"${f.input('expiresAt')}>${f.error('expiresAt')}</div>
<div><button type="submit">Grant credit</button></div></div></form></section>`;
}

/** A user's ledger entries, newest first. */
function activityCard(activity: Awaited<ReturnType<typeof listActivity>>['data'], currency: string): Raw {
  return html`<section class="card"><h2>Activity</h2>
${dataTable(
  [
    { label: 'When (UTC)' },
    { label: 'Type' },
    { label: 'Amount', num: true },
    { label: 'Balance after', num: true },
    { label: 'Source' },
    { label: 'Details' },
  ],
  activity.map((a) => [
    a.createdAt.replace('T', ' ').slice(0, 19),
    a.type,
    money(a.amount, currency),
    money(a.balance, currency),
    a.source,
    a.description ?? (typeof a.metadata.model === 'string' ? a.metadata.model : ''),
  ]),
  { id: 'activity' },
)}${activity.length ? '' : html`<p class="muted">No activity yet.</p>`}</section>`;
}

/** The users page, with the deposit form refused when `refused` says so. */
async function usersPage(request: FastifyRequest, reply: FastifyReply, q: string, refused?: Refused) {
  const ctx = request.server.ctx;
  const project = projectView(request.ownedProject);
  const users = await searchUsers(ctx, request.ownedProject, { q: q || undefined, limit: 100 });
  const path = projectPath(project.id);
  return projectPage(
    reply,
    { project, title: `Users · ${project.name}`, heading: 'End users', tab: 'Users' },
    (csrf) => html`
${usersCard(path, q, project.currency, users.data)}
<section class="card"><h2>Deposit to a user</h2>
${depositForm(path, csrf, project.currency, undefined, refused)}
</section>`,
    { status: refused ? 400 : 200 },
  );
}

/** One user's page, with its refused form (deposit, charge, credit) shown again. */
async function userPage(request: FastifyRequest, reply: FastifyReply, user: string, refused?: Refused) {
  const ctx = request.server.ctx;
  const row = request.ownedProject;
  const project = projectView(row);
  const balance = await getBalance(ctx.db, row, user);
  const activity = await listActivity(ctx.db, row, user, { limit: 50 });
  const grants = await listGrants(ctx.db, row, user);
  const path = projectPath(project.id);
  const userPath = `${path}/users/${encodeURIComponent(user)}`;
  return projectPage(
    reply,
    { project, title: `${user} · ${project.name}`, heading: `User ${user}`, tab: 'Users' },
    (csrf) => html`
<section class="card"><h2>Balance</h2>
<p><strong id="balance">${money(balance.balance, project.currency)}</strong> ${project.currency} (held ${money(balance.held, project.currency)}, available ${money(balance.available, project.currency)}; paid ${money(balance.paid, project.currency)}, credits ${money(balance.credits, project.currency)}); ${balance.connected ? 'connected' : 'not connected'}.</p>
<form method="post" action="${userPath}/${balance.connected ? 'disconnect' : 'connect'}">${csrfField(csrf)}<button type="submit" class="secondary">${balance.connected ? 'Disconnect' : 'Connect'} this user</button></form>
</section>
<section class="card"><h2>Deposit</h2>${depositForm(path, csrf, project.currency, user, refused)}</section>
${chargeCard(path, user, project.currency, csrf, refused)}
${creditCard(path, user, project.currency, grants.data, csrf, refused)}
${activityCard(activity.data, project.currency)}`,
    { status: refused ? 400 : 200 },
  );
}

/**
 * A refused money form, again on the page it came from: the user's page (a charge, a credit, a
 * deposit made there) when the user id is valid, else the users page.
 */
function formAgain(request: FastifyRequest, reply: FastifyReply, refused: Refused) {
  const body = (request.body ?? {}) as { user?: unknown; from?: unknown };
  const user = userIdSchema.safeParse(body.user);
  const onUserPage = refused.form !== 'deposit' || body.from === 'user';
  if (onUserPage && user.success) return userPage(request, reply, user.data, refused);
  if (refused.form !== 'deposit') throw request.validationError ?? badRequest('Invalid user id.', 'user');
  return usersPage(request, reply, '', refused);
}

export default routeModule((app, ctx) => {
  app.get(
    '/projects/:id/users',
    {
      schema: { params: projectParams, querystring: flashQuery.extend({ q: optionalField(textInput(256)) }) },
    },
    async (request, reply) => usersPage(request, reply, request.query.q ?? ''),
  );

  for (const kind of ['deposit', 'charge'] as const) {
    app.post(
      `/projects/:id/users/${kind}`,
      { schema: { params: projectParams, body: moneyForm }, attachValidation: true },
      async (request, reply) => {
        const spec = FORMS[kind];
        if (request.validationError) return formAgain(request, reply, invalidBody(spec, moneyForm, request));
        const input = request.body;
        const project = request.ownedProject;
        try {
          const amount = parseInput(amountSchema(project.currency), input.amount, 'amount');
          const result = await moveMoney(
            ctx,
            request.developer,
            project,
            kind,
            {
              user: input.user,
              amount,
              metadata: {
                via: 'dashboard',
                ...(input.description ? { description: input.description } : {}),
              },
            },
            input.idem ? `dashboard-${input.idem}` : undefined,
          );
          const body = result.body as { success?: boolean; balance: string; reason?: string };
          if (kind === 'charge' && body.success === false)
            throw new ApiError(400, 'invalid_request_error', `Not charged: ${body.reason}.`, {
              code: 'not_charged',
            });
        } catch (err) {
          return formAgain(request, reply, refusedBy(spec, err, input));
        }
        const userPath = `${projectPath(project.id)}/users/${encodeURIComponent(input.user)}`;
        return reply.redirect(done(userPath, kind === 'deposit' ? 'deposited' : 'charged'), 303);
      },
    );
  }

  app.post(
    '/projects/:id/users/credits',
    { schema: { params: projectParams, body: grantForm }, attachValidation: true },
    async (request, reply) => {
      if (request.validationError)
        return formAgain(request, reply, invalidBody(FORMS.credit, grantForm, request));
      const input = request.body;
      const project = request.ownedProject;
      try {
        const grant = grantOf(input, project.currency);
        await grantCredit(
          ctx,
          request.developer,
          project,
          grant,
          input.idem ? `dashboard-${input.idem}` : undefined,
        );
      } catch (err) {
        return formAgain(request, reply, refusedBy(FORMS.credit, err, input));
      }
      const userPath = `${projectPath(project.id)}/users/${encodeURIComponent(input.user)}`;
      return reply.redirect(done(userPath, 'credit_granted'), 303);
    },
  );

  app.get(
    '/projects/:id/users/:user',
    { schema: { params: userParams, querystring: flashQuery } },
    async (request, reply) => userPage(request, reply, request.params.user),
  );

  for (const act of ['connect', 'disconnect'] as const) {
    app.post(
      `/projects/:id/users/:user/${act}`,
      { schema: { params: userParams, body: formBody({}) } },
      async (request, reply) => {
        const { id, user } = request.params;
        await setUserConnected(ctx, request.developer, request.ownedProject, user, act === 'connect');
        const userPath = `${projectPath(id)}/users/${encodeURIComponent(user)}`;
        return reply.redirect(done(userPath, act === 'connect' ? 'connected' : 'disconnected'), 303);
      },
    );
  }
});
