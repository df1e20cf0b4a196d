import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { chatRequestSchema } from '../../src/chat/schema.ts';
import { fastChatRequest } from '../../src/chat/schema-fast.ts';

/**
 * The chat request's fast path (src/chat/schema-fast.ts) accepts only what zod accepts, and returns
 * exactly zod's output: the same values, the same keys in the same order (what is forwarded upstream is
 * serialised from it).
 */

const text = fc.oneof(
  fc.string({ maxLength: 20 }),
  fc.constantFrom('', 'Hello!', 'bench-model', 'user-1', 'a\u0000b', 'x\ud800y', 'é'.repeat(300)),
);
const anyJson = fc.oneof(
  text,
  fc.integer({ min: -3, max: 200 }),
  fc.constantFrom(0, 1, 1.5, -0, 2 ** 60, null, true, false, [], {}, ['a'], { type: 'text', text: 'x' }),
);
const role = fc.oneof(
  fc.constantFrom('system', 'user', 'assistant', 'developer', 'tool', 'function', 'robot'),
  anyJson,
);
const message = fc
  .record(
    {
      role,
      content: fc.oneof(text, anyJson, fc.constant([{ type: 'text', text: 'hi' }])),
      name: fc.oneof(fc.constantFrom('bob', 'a_b9', 'bad name', ''), anyJson),
      tool_calls: fc.constant([{ id: '1', type: 'function', function: { name: 'f', arguments: '{}' } }]),
      tool_call_id: text,
      refusal: text,
      audio: anyJson,
      extra: anyJson,
    },
    { requiredKeys: [] },
  )
  // Keys in a random order, most often the simple ones only.
  .chain((m) =>
    fc
      .shuffledSubarray(Object.keys(m))
      .map((keys) => Object.fromEntries(keys.map((k) => [k, m[k as keyof typeof m]]))),
  )
  .chain((m) => fc.boolean().map((plain) => (plain ? { role: 'user', content: 'hi', ...m } : m)));

const requestFields = {
  model: fc.oneof(text, anyJson),
  messages: fc.oneof(fc.array(message, { minLength: 0, maxLength: 4 }), anyJson),
  stream: anyJson,
  user: fc.oneof(text, anyJson),
  max_tokens: anyJson,
  max_completion_tokens: anyJson,
  n: anyJson,
  stream_options: fc.oneof(
    fc.record({ include_usage: anyJson, other: anyJson }, { requiredKeys: [] }),
    anyJson,
  ),
  temperature: anyJson,
  metadata: anyJson,
  tools: anyJson,
  stop: anyJson,
  seed: anyJson,
  constructor: anyJson,
};

const request = fc
  .record(requestFields, { requiredKeys: [] })
  .chain((r) =>
    fc
      .shuffledSubarray(Object.keys(r))
      .map((keys) => Object.fromEntries(keys.map((k) => [k, r[k as keyof typeof r]]))),
  )
  .chain((r) =>
    fc
      .boolean()
      .map((plain) =>
        plain ? { model: 'bench-model', messages: [{ role: 'user', content: 'Hello' }], ...r } : r,
      ),
  );

describe('the chat request’s fast path', () => {
  it('accepts only what zod accepts, and returns zod’s output key for key', () => {
    let fast = 0;
    fc.assert(
      fc.property(request, (body) => {
        const input = JSON.parse(JSON.stringify(body));
        const quick = fastChatRequest(input);
        if (quick === undefined) return;
        fast++;
        const parsed = chatRequestSchema.safeParse(JSON.parse(JSON.stringify(body)));
        expect(parsed.success).toBe(true);
        expect(JSON.stringify(quick)).toBe(JSON.stringify(parsed.data));
        expect(quick).toEqual(parsed.data);
      }),
      { numRuns: 20_000 },
    );
    // The property saw the fast path often, not just its refusals.
    expect(fast).toBeGreaterThan(1000);
  });

  it('takes the common request', () => {
    const body = {
      model: 'bench-model',
      user: 'user-1',
      stream: true,
      max_tokens: 16,
      temperature: 0.2,
      stream_options: { include_usage: true },
      messages: [
        { role: 'system', content: 'You are a helpful assistant.' },
        { role: 'user', content: 'Hello!', name: 'bob' },
      ],
    };
    expect(fastChatRequest(body)).toEqual(chatRequestSchema.parse(body));
    expect(JSON.stringify(fastChatRequest(body))).toBe(JSON.stringify(chatRequestSchema.parse(body)));
  });
});
