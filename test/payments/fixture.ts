import { api, signUpAndIn, type TestServer } from '../helpers/server.ts';

/**
 * The payments tests' set-up for the dashboard: a new developer (`<prefix>-<now>@example.com`) signed
 * in, with a project of their own created over the admin API; the session cookie the dashboard reads.
 */
export async function developerWithProject(
  server: TestServer,
  prefix: string,
  name: string,
): Promise<{ projectId: string; cookie: string }> {
  const token = await signUpAndIn(server, {
    email: `${prefix}-${Date.now()}@example.com`,
    password: 'correct horse battery staple',
  });
  const created = await api(server, token, 'POST', '/admin/v1/projects', { name });
  return {
    projectId: created.body.project.id as string,
    cookie: `tollgate_session=${encodeURIComponent(token)}`,
  };
}
