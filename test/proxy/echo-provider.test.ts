import { createAnthropic } from '@ai-sdk/anthropic';
import { createOpenAI } from '@ai-sdk/openai';
import { embed, embedMany, generateText, streamText } from 'ai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { type ChatFixture, startChatFixture } from '../helpers/chat-fixture.ts';
import { anthropicFor } from '../helpers/clients.ts';

/**
 * The built-in echo provider (`echo://local`, the `tollgate dev` demo) serves every API Tollgate
 * advertises, streaming and not, with usage: Chat Completions, Responses (the AI SDK's default
 * `openai()` provider), Embeddings and Anthropic's Messages (the Anthropic SDK, the AI SDK's Anthropic
 * provider). Each call is charged from the usage the echo reports.
 */
let f: ChatFixture;
const ECHO = '[echo provider] Hello offline';

beforeAll(async () => {
  f = await startChatFixture({
    upstream: 'echo',
    models: [
      { id: 'demo-echo', pricing: { mode: 'per_token', inputPerMillion: '1', outputPerMillion: '2' } },
      {
        id: 'demo-embed',
        pricing: { mode: 'per_token', inputPerMillion: '0.1' },
        endpoints: ['embeddings'],
      },
    ],
  });
  await f.fund('echo-user', '1.00');
});
afterAll(() => f.close());

/** Charges of the user by source, once settled; nothing stays held. */
async function charges(): Promise<Record<string, number>> {
  await f.settled();
  const out: Record<string, number> = {};
  for (const e of await f.ledger('echo-user')) {
    if (e.kind === 'charge') out[e.source] = (out[e.source] ?? 0) + 1;
    if (e.kind === 'charge') expect(new Money(e.amount).isNegative()).toBe(true);
  }
  expect((await f.holds('echo-user')).filter((h) => h.status === 'open')).toEqual([]);
  return out;
}

describe('the echo provider', () => {
  it("serves the Responses API to the AI SDK's default openai() provider, streaming and not", async () => {
    const openai = createOpenAI({
      baseURL: `${f.server.url}/v1`,
      apiKey: f.apiKey,
      headers: { 'X-Service-User': 'echo-user' },
    });
    const generated = await generateText({ model: openai('demo-echo'), prompt: 'Hello offline' });
    expect(generated.text).toBe(ECHO);
    expect(generated.usage.outputTokens).toBeGreaterThan(0);
    const streamed = streamText({ model: openai('demo-echo'), prompt: 'Hello offline' });
    expect(await streamed.text).toBe(ECHO);
    const cut = await generateText({
      model: openai('demo-echo'),
      prompt: 'Hello offline',
      maxOutputTokens: 16,
    });
    expect(cut.text).toBe(ECHO);
    expect((await charges()).responses).toBe(3);
  });

  it('serves embeddings (the AI SDK and the openai client, floats and base64)', async () => {
    const openai = createOpenAI({
      baseURL: `${f.server.url}/v1`,
      apiKey: f.apiKey,
      headers: { 'X-Service-User': 'echo-user' },
    });
    const one = await embed({ model: openai.embedding('demo-embed'), value: 'Hello' });
    expect(one.embedding).toHaveLength(8);
    expect(Math.hypot(...one.embedding)).toBeCloseTo(1, 5);
    const many = await embedMany({
      model: openai.embedding('demo-embed'),
      values: ['Hello', 'Hello', 'other'],
    });
    expect(many.embeddings[0]).toEqual(one.embedding);
    expect(many.embeddings[2]).not.toEqual(one.embedding);
    // The openai client asks for base64 by default and decodes it.
    const viaClient = await f.client.embeddings.create({
      model: 'demo-embed',
      input: 'Hello',
      user: 'echo-user',
    });
    expect(viaClient.data[0]!.embedding.map((v) => Number(v.toFixed(5)))).toEqual(
      one.embedding.map((v) => Number(v.toFixed(5))),
    );
    expect(viaClient.usage.prompt_tokens).toBe(1);
    expect((await charges()).embeddings).toBe(3);
  });

  it('serves the Messages API to the Anthropic SDK and the AI SDK Anthropic provider', async () => {
    const claude = anthropicFor(f.server.url, f.apiKey, 'echo-user');
    const message = await claude.messages.create({
      model: 'demo-echo',
      max_tokens: 100,
      messages: [{ role: 'user', content: 'Hello offline' }],
    });
    expect(message.content).toEqual([{ type: 'text', text: ECHO }]);
    expect(message.usage.output_tokens).toBeGreaterThan(0);
    const stream = claude.messages.stream({
      model: 'demo-echo',
      max_tokens: 100,
      messages: [{ role: 'user', content: [{ type: 'text', text: 'Hello offline' }] }],
    });
    expect(await stream.finalText()).toBe(ECHO);
    const anthropic = createAnthropic({
      baseURL: `${f.server.url}/v1`,
      apiKey: f.apiKey,
      headers: { 'X-Service-User': 'echo-user' },
    });
    const streamed = streamText({ model: anthropic('demo-echo'), prompt: 'Hello offline' });
    expect(await streamed.text).toBe(ECHO);
    expect((await charges()).messages).toBe(3);
  });

  it('still serves Chat Completions; an unmetered call it does not serve is a 400 naming the API', async () => {
    const reply = await f.client.chat.completions.create({
      model: 'demo-echo',
      user: 'echo-user',
      messages: [{ role: 'user', content: 'Hello offline' }],
    });
    expect(reply.choices[0]!.message.content).toBe(ECHO);
    const res = await fetch(`${f.server.url}/v1/responses/resp_unknown`, {
      headers: { authorization: `Bearer ${f.apiKey}` },
    });
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({ error: { code: 'unsupported_endpoint' } });
  });
});
