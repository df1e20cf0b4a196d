import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { applyPricing, parsePricingFile } from '../../src/models/service.ts';
import { type SeededProject, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

let server: TestServer;
let project: SeededProject;
let client: OpenAI;

beforeAll(async () => {
  server = await startTestServer();
  project = await seedProject(server.ctx);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: project.apiKey, maxRetries: 0 });
});
afterAll(() => server?.close());

const PRICING = `
currency: usd
models:
  - id: gpt-4o-mini
    upstreamModel: gpt-4o-mini-2024-07-18
    pricing: { mode: per_token, inputPerMillion: "0.15", outputPerMillion: "0.60" }
  - id: quick
    pricing: { mode: per_request, perRequest: 0.01 }
  - id: pro
    pricing: { mode: subscription, fee: "10.00", period: "30d" }
`;

describe('models', () => {
  it('lists and retrieves the models of the key’s project, with pricing, through the openai client', async () => {
    const result = await applyPricing(server.ctx.db, project.projectId, parsePricingFile(PRICING));
    expect(result).toEqual({ created: ['gpt-4o-mini', 'quick', 'pro'], updated: [], deleted: [] });
    await server.ctx.projects.changed(project.projectId);

    const list = await client.models.list();
    const byId = Object.fromEntries(list.data.map((m) => [m.id, m as unknown as Record<string, unknown>]));
    expect(Object.keys(byId).sort()).toEqual(['gpt-4o-mini', 'pro', 'quick']);
    expect(byId['gpt-4o-mini']).toMatchObject({
      object: 'model',
      owned_by: 'Test project',
      pricing: { mode: 'per_token', inputPerMillion: '0.15', outputPerMillion: '0.6', currency: 'usd' },
    });
    expect(byId.quick!.pricing).toEqual({ mode: 'per_request', perRequest: '0.01', currency: 'usd' });
    expect(byId.pro!.pricing).toEqual({ mode: 'subscription', fee: '10', period: '30d', currency: 'usd' });

    const one = await client.models.retrieve('pro');
    expect(one.id).toBe('pro');
    await expect(client.models.retrieve('missing')).rejects.toBeInstanceOf(OpenAI.NotFoundError);
  });

  it('keeps projects apart', async () => {
    const other = await seedProject(server.ctx, {
      models: [{ id: 'secret-model', pricing: { mode: 'per_request', perRequest: '1' } }],
    });
    const otherClient = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: other.apiKey, maxRetries: 0 });
    expect((await otherClient.models.list()).data.map((m) => m.id)).toEqual(['secret-model']);
    await expect(client.models.retrieve('secret-model')).rejects.toBeInstanceOf(OpenAI.NotFoundError);
  });

  it('applies declaratively: updates, deletes what the file no longer lists', async () => {
    const next = parsePricingFile(`
currency: usd
models:
  - id: quick
    pricing: { mode: per_request, perRequest: "0.02" }
`);
    const result = await applyPricing(server.ctx.db, project.projectId, next);
    expect(result).toEqual({ created: [], updated: ['quick'], deleted: ['gpt-4o-mini', 'pro'] });
    await server.ctx.projects.changed(project.projectId);
    expect((await client.models.list()).data.map((m) => m.id)).toEqual(['quick']);
  });

  it('rejects bad pricing files with the field named', async () => {
    const cases: Array<[string, RegExp]> = [
      ['currency: usd\nmodels: []', /models/],
      ['currency: USD\nmodels: [{id: a, pricing: {mode: per_request, perRequest: "1"}}]', /currency/],
      [
        'currency: usd\nmodels: [{id: a, pricing: {mode: per_token, inputPerMillion: "-1", outputPerMillion: "1"}}]',
        /inputPerMillion/,
      ],
      [
        'currency: usd\nmodels: [{id: a, pricing: {mode: per_token, inputPerMillion: "0.1234567", outputPerMillion: "1"}}]',
        /at most 6 decimal/,
      ],
      [
        'currency: usd\nmodels: [{id: a, pricing: {mode: subscription, fee: "1", period: "monthly"}}]',
        /period/,
      ],
      ['currency: usd\nmodels: [{id: a, pricing: {mode: flat}}]', /mode/],
      [
        'currency: usd\nmodels: [{id: a, pricing: {mode: per_request, perRequest: "1"}}, {id: a, pricing: {mode: per_request, perRequest: "1"}}]',
        /duplicate model id a/,
      ],
      [
        'currency: usd\nmodels: [{id: a, colour: red, pricing: {mode: per_request, perRequest: "1"}}]',
        /colour/,
      ],
      ['currency: usd\nmodels: [{', /not valid YAML/],
    ];
    for (const [text, message] of cases) expect(() => parsePricingFile(text), text).toThrowError(message);
  });

  it('refuses a file in another currency than the project’s', async () => {
    const eur = parsePricingFile(
      'currency: eur\nmodels: [{id: a, pricing: {mode: per_request, perRequest: "1"}}]',
    );
    await expect(applyPricing(server.ctx.db, project.projectId, eur)).rejects.toThrowError(
      /differs from the project's currency usd/,
    );
  });
});
