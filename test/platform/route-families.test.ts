import { describe, expect, it } from 'vitest';
import { familyOf, pathMatches } from '../../src/http/route-families.ts';

/** Every URL belongs to one family of paths; the chart's ingress routes the public ones (helm-chart.test.ts). */
describe('route families', () => {
  it('sorts the server’s URLs into public, dashboard, admin and internal', () => {
    expect(familyOf('/v1/chat/completions')).toBe('public');
    expect(familyOf('/payments/:provider/:project/webhook')).toBe('public');
    expect(familyOf('/payments/done/*')).toBe('public');
    expect(familyOf('/portal/*')).toBe('public');
    expect(familyOf('/')).toBe('public');
    expect(familyOf('/docs')).toBe('public');
    expect(familyOf('/docs/:page')).toBe('public');
    expect(familyOf('/dashboard/projects/:id')).toBe('dashboard');
    expect(familyOf('/admin/v1/projects')).toBe('admin');
    expect(familyOf('/metrics')).toBe('internal');
    expect(familyOf('/healthz')).toBe('internal');
    // a route no family has: the server refuses to register it
    expect(familyOf('/assets/app.js')).toBeUndefined();
    expect(familyOf('/docsearch')).toBeUndefined();
  });

  it('matches as Kubernetes does: Prefix by whole segments, Exact the path alone', () => {
    expect(pathMatches({ path: '/v1', pathType: 'Prefix' }, '/v1')).toBe(true);
    expect(pathMatches({ path: '/v1', pathType: 'Prefix' }, '/v1/models?x=1')).toBe(true);
    expect(pathMatches({ path: '/v1', pathType: 'Prefix' }, '/v10')).toBe(false);
    expect(pathMatches({ path: '/', pathType: 'Exact' }, '/')).toBe(true);
    expect(pathMatches({ path: '/', pathType: 'Exact' }, '/metrics')).toBe(false);
  });
});
