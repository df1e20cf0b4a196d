import { z } from 'zod';
import { projectView } from '../../admin/service.ts';
import { type AuditView, auditCsv, listAudit } from '../../audit/index.ts';
import { routeModule } from '../../core/plugins.ts';
import { textInput } from '../../core/validation.ts';
import { dataTable, html } from '../../html/index.ts';
import { flashQuery, optionalField, projectPage, projectParams, projectPath } from '../pages.ts';

/**
 * A project's audit log (`/dashboard/projects/:id/audit`): who changed what, when, from where, with the
 * settings before and after (secrets redacted when written, src/audit). Filters by action (exact, or a
 * prefix ending in `.`), actor (id, e-mail or type) and day range; newest first, 100 a page; the same
 * filters export as CSV (`audit.csv`).
 */

const day = z
  .string()
  .trim()
  .regex(/^\d{4}-\d{2}-\d{2}$/, { message: 'must be a day, e.g. 2026-01-31' })
  .refine((v) => !Number.isNaN(Date.parse(`${v}T00:00:00Z`)), { message: 'must be a real day' });

const filterQuery = flashQuery.extend({
  action: optionalField(textInput(100)),
  actor: optionalField(textInput(255)),
  since: optionalField(day),
  until: optionalField(day),
  starting_after: optionalField(textInput(64)),
});
type Filters = z.infer<typeof filterQuery>;

const PAGE = 100;

function queryOf(f: Filters, limit: number) {
  return {
    limit,
    ...(f.action ? { action: f.action } : {}),
    ...(f.actor ? { actor: f.actor } : {}),
    ...(f.since ? { since: new Date(`${f.since}T00:00:00Z`) } : {}),
    // `until` is the whole day named
    ...(f.until ? { until: new Date(Date.parse(`${f.until}T00:00:00Z`) + 86_400_000) } : {}),
    ...(f.starting_after ? { starting_after: f.starting_after } : {}),
  };
}

function search(f: Filters, extra: Record<string, string> = {}): string {
  const params = new URLSearchParams();
  for (const k of ['action', 'actor', 'since', 'until'] as const) if (f[k]) params.set(k, f[k]);
  for (const [k, v] of Object.entries(extra)) params.set(k, v);
  const text = params.toString();
  return text ? `?${text}` : '';
}

/** Settings before or after a change, as JSON; nothing (a creation's before, a deletion's after): "(none)". */
const json = (v: unknown) =>
  v === null || v === undefined
    ? html`<span class="muted">(none)</span>`
    : html`<pre>${JSON.stringify(v, null, 1)}</pre>`;

const COLUMNS = [
  { label: 'When (UTC)' },
  { label: 'Who' },
  { label: 'From' },
  { label: 'Action' },
  { label: 'Target' },
  { label: 'Before', wide: true },
  { label: 'After', wide: true },
];

function who(e: AuditView) {
  const a = e.actor;
  return html`${a.email ?? a.id} <span class="muted">(${a.type}${a.email ? html`, <code>${a.id}</code>` : ''})</span>`;
}

export default routeModule((app, ctx) => {
  app.get(
    '/projects/:id/audit',
    { schema: { params: projectParams, querystring: filterQuery } },
    async (request, reply) => {
      const project = projectView(request.ownedProject);
      const f = request.query;
      const { data, hasMore } = await listAudit(ctx.db, { projectId: project.id }, queryOf(f, PAGE));
      const path = `${projectPath(project.id)}/audit`;
      const last = data.at(-1);
      return projectPage(
        reply,
        { project, title: `Audit log · ${project.name}`, heading: 'Audit log', tab: 'Audit log' },
        () => html`
<section class="card"><form method="get" action="${path}" role="search"><div class="row">
<div><label for="action">Action</label><input id="action" name="action" value="${f.action ?? ''}" placeholder="pricing. or money.deposit" maxlength="100"></div>
<div><label for="actor">Actor</label><input id="actor" name="actor" value="${f.actor ?? ''}" placeholder="e-mail, id or type" maxlength="255"></div>
<div><label for="since">From</label><input id="since" name="since" type="date" value="${f.since ?? ''}"></div>
<div><label for="until">To</label><input id="until" name="until" type="date" value="${f.until ?? ''}"></div>
<div><button type="submit">Filter</button></div></div></form>
<p><a href="${path}.csv${search(f)}">Download as CSV</a></p></section>
<section class="card">${dataTable(
          COLUMNS,
          data.map((e) => [
            e.createdAt.replace('T', ' ').slice(0, 19),
            who(e),
            html`${e.actor.ip ?? ''} <span class="muted">${e.actor.via}</span>`,
            html`<code>${e.action}</code>`,
            html`${e.target.type}${e.target.id ? html` <code>${e.target.id}</code>` : ''}`,
            json(e.before),
            json(e.after),
          ]),
          { id: 'audit' },
        )}${data.length ? '' : html`<p class="muted">No entries${f.action || f.actor || f.since || f.until ? ' match' : ' yet'}.</p>`}
${hasMore && last ? html`<p><a href="${path}${search(f, { starting_after: last.id })}">Older entries</a></p>` : ''}</section>`,
      );
    },
  );

  app.get(
    '/projects/:id/audit.csv',
    { schema: { params: projectParams, querystring: filterQuery } },
    async (request, reply) => {
      const project = request.ownedProject;
      const { data } = await listAudit(ctx.db, { projectId: project.id }, queryOf(request.query, 1000));
      return reply
        .type('text/csv; charset=utf-8')
        .header('content-disposition', `attachment; filename="tollgate-audit-${project.id}.csv"`)
        .send(auditCsv(data));
    },
  );
});
