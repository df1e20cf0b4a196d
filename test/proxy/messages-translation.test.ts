import { describe, expect, it } from 'vitest';
import { ApiError } from '../../src/core/errors.ts';
import {
  chatToMessages,
  messagesStreamToChat,
  messageToChat,
} from '../../src/upstream/anthropic/chat-over-messages.ts';
import {
  chatStreamToMessages,
  chatToMessage,
  messagesToChat,
} from '../../src/upstream/anthropic/messages-over-chat.ts';
import type { SseMessage } from '../../src/upstream/types.ts';

/**
 * The Messages ⇄ Chat Completions translation as pure functions, table-tested: each row of docs/api.md's
 * mapping tables, both directions, and the fields that are refused with a 400 naming them.
 */
const base = { model: 'm', max_tokens: 10 };
const user = (content: unknown) => ({ role: 'user', content });

describe('Messages → Chat Completions (messagesToChat)', () => {
  const cases: Array<[string, Record<string, unknown>, Record<string, unknown>]> = [
    [
      'a string system',
      { system: 'S', messages: [user('Hi')] },
      {
        messages: [
          { role: 'system', content: 'S' },
          { role: 'user', content: 'Hi' },
        ],
      },
    ],
    [
      'system text blocks',
      {
        system: [
          { type: 'text', text: 'A' },
          { type: 'text', text: 'B', cache_control: { type: 'ephemeral' } },
        ],
        messages: [],
      },
      { messages: [{ role: 'system', content: 'A\nB' }] },
    ],
    [
      'an image by URL, a text document',
      {
        messages: [
          user([
            { type: 'image', source: { type: 'url', url: 'https://x/y.png' } },
            { type: 'document', source: { type: 'text', media_type: 'text/plain', data: 'doc' } },
          ]),
        ],
      },
      {
        messages: [
          {
            role: 'user',
            content: [
              { type: 'image_url', image_url: { url: 'https://x/y.png' } },
              { type: 'text', text: 'doc' },
            ],
          },
        ],
      },
    ],
    [
      'a PDF document',
      {
        messages: [
          user([
            {
              type: 'document',
              title: 'a.pdf',
              source: { type: 'base64', media_type: 'application/pdf', data: 'JVB' },
            },
          ]),
        ],
      },
      {
        messages: [
          {
            role: 'user',
            content: [
              { type: 'file', file: { filename: 'a.pdf', file_data: 'data:application/pdf;base64,JVB' } },
            ],
          },
        ],
      },
    ],
    [
      'tool results before the user text, an error result',
      {
        messages: [
          user([
            { type: 'tool_result', tool_use_id: 't1', content: [{ type: 'text', text: 'ok' }] },
            { type: 'tool_result', tool_use_id: 't2', content: 'boom', is_error: true },
            { type: 'text', text: 'and?' },
          ]),
        ],
      },
      {
        messages: [
          { role: 'tool', tool_call_id: 't1', content: 'ok' },
          { role: 'tool', tool_call_id: 't2', content: 'Error: boom' },
          { role: 'user', content: [{ type: 'text', text: 'and?' }] },
        ],
      },
    ],
    [
      'tool choice any without parallel calls, sampling, user, thinking',
      {
        messages: [],
        tools: [{ name: 'f', input_schema: { type: 'object' } }],
        tool_choice: { type: 'any', disable_parallel_tool_use: true },
        temperature: 0.5,
        top_p: 0.9,
        stop_sequences: ['X'],
        metadata: { user_id: 'u' },
        thinking: { type: 'enabled', budget_tokens: 8000 },
      },
      {
        tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
        tool_choice: 'required',
        parallel_tool_calls: false,
        temperature: 0.5,
        top_p: 0.9,
        stop: ['X'],
        user: 'u',
        reasoning_effort: 'medium',
      },
    ],
    [
      'a named tool choice',
      { messages: [], tool_choice: { type: 'tool', name: 'f' } },
      { tool_choice: { type: 'function', function: { name: 'f' } } },
    ],
    [
      'streaming asks for usage',
      { messages: [], stream: true },
      { stream: true, stream_options: { include_usage: true } },
    ],
    ['max_completion_tokens for gpt-5', { model: 'gpt-5-mini', messages: [] }, { max_completion_tokens: 10 }],
  ];
  it.each(cases)('%s', (_name, body, expected) => {
    expect(messagesToChat({ ...base, ...body })).toMatchObject(expected);
  });

  const refused: Array<[string, Record<string, unknown>, string]> = [
    ['top_k', { messages: [], top_k: 3 }, 'top_k'],
    ['mcp_servers', { messages: [], mcp_servers: [{}] }, 'mcp_servers'],
    [
      'a server tool',
      { messages: [], tools: [{ type: 'web_search_20250305', name: 'web_search' }] },
      'tools.0',
    ],
    [
      'another output format',
      { messages: [], output_config: { format: { type: 'xml' } } },
      'output_config.format',
    ],
    [
      'a server tool result in the history',
      { messages: [{ role: 'assistant', content: [{ type: 'web_search_tool_result', content: [] }] }] },
      'messages.0.content.0',
    ],
    [
      'a file image',
      { messages: [user([{ type: 'image', source: { type: 'file', file_id: 'f' } }])] },
      'messages.0.content.0.source',
    ],
    [
      'an image tool result',
      {
        messages: [
          user([{ type: 'tool_result', tool_use_id: 't', content: [{ type: 'image', source: {} }] }]),
        ],
      },
      'messages.0.content.0.content.0',
    ],
  ];
  it.each(refused)('refuses %s with a 400 naming it', (_name, body, param) => {
    const err = (() => {
      try {
        messagesToChat({ ...base, ...body });
      } catch (e) {
        return e;
      }
    })() as ApiError;
    expect(err).toBeInstanceOf(ApiError);
    expect(err.status).toBe(400);
    expect(err.param).toBe(param);
  });

  it("Claude Code's request: system turns in place, effort → reasoning_effort, every tool sent, hints named", () => {
    const dropped: string[] = [];
    const chat = messagesToChat(
      {
        ...base,
        system: [{ type: 'text', text: 'You are an agent.', cache_control: { type: 'ephemeral' } }],
        messages: [
          user('Read hello.txt'),
          { role: 'system', content: '# Environment' },
          {
            role: 'assistant',
            content: [
              { type: 'thinking', thinking: 'Let me read it.', signature: 'sig' },
              { type: 'tool_use', id: 'toolu_1', name: 'Read', input: { file_path: 'hello.txt' } },
            ],
          },
          user([
            {
              type: 'tool_result',
              tool_use_id: 'toolu_1',
              content: 'hello',
              cache_control: { type: 'ephemeral' },
            },
          ]),
          { role: 'system', content: [{ type: 'text', text: 'A reminder.' }] },
          { role: 'system', output_config: { effort: 'low' } },
        ],
        tools: [
          { name: 'Read', description: 'Reads a file', input_schema: { type: 'object', properties: {} } },
          { name: 'Later', input_schema: { type: 'object', properties: {} }, defer_loading: true },
        ],
        metadata: {
          user_id: JSON.stringify({ device_id: 'd'.repeat(64), account_uuid: '', session_id: 's-1' }),
        },
        thinking: { type: 'adaptive', display: 'omitted' },
        context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] },
        output_config: { effort: 'high', task_budget: { type: 'tokens', total: 1000 } },
      },
      dropped,
    );
    expect(chat).toEqual({
      model: 'm',
      max_tokens: 10,
      reasoning_effort: 'high',
      messages: [
        { role: 'system', content: 'You are an agent.' },
        { role: 'user', content: 'Read hello.txt' },
        { role: 'system', content: '# Environment' },
        {
          role: 'assistant',
          content: null,
          tool_calls: [
            {
              id: 'toolu_1',
              type: 'function',
              function: { name: 'Read', arguments: '{"file_path":"hello.txt"}' },
            },
          ],
        },
        { role: 'tool', tool_call_id: 'toolu_1', content: 'hello' },
        { role: 'system', content: 'A reminder.' },
      ],
      tools: [
        {
          type: 'function',
          function: {
            name: 'Read',
            description: 'Reads a file',
            parameters: { type: 'object', properties: {} },
          },
        },
        { type: 'function', function: { name: 'Later', parameters: { type: 'object', properties: {} } } },
      ],
    });
    expect([...dropped].sort()).toEqual(
      [
        'context_management',
        'defer_loading',
        'messages.output_config',
        'metadata.user_id',
        'output_config.task_budget',
        'thinking blocks',
      ].sort(),
    );
  });

  it('effort levels, structured output, the tool search and its loaded tools', () => {
    const effort = (value: string) =>
      messagesToChat({ ...base, messages: [], output_config: { effort: value } }).reasoning_effort;
    expect(['low', 'medium', 'high', 'xhigh', 'max'].map(effort)).toEqual([
      'low',
      'medium',
      'high',
      'high',
      'high',
    ]);
    // effort wins over thinking's budget
    expect(
      messagesToChat({
        ...base,
        messages: [],
        thinking: { type: 'enabled', budget_tokens: 1024 },
        output_config: { effort: 'medium' },
      }).reasoning_effort,
    ).toBe('medium');
    const schema = { type: 'object', properties: { a: { type: 'string' } } };
    expect(
      messagesToChat({ ...base, messages: [], output_config: { format: { type: 'json_schema', schema } } })
        .response_format,
    ).toEqual({ type: 'json_schema', json_schema: { name: 'output', schema, strict: true } });
    const dropped: string[] = [];
    const chat = messagesToChat(
      {
        ...base,
        tools: [
          { type: 'tool_search_tool_regex_20251119', name: 'tool_search_tool_regex' },
          { name: 'get_weather', input_schema: { type: 'object' }, defer_loading: true },
        ],
        messages: [
          user('Weather?'),
          {
            role: 'assistant',
            content: [
              {
                type: 'server_tool_use',
                id: 'srv_1',
                name: 'tool_search_tool_regex',
                input: { query: 'weather' },
              },
              {
                type: 'tool_search_tool_result',
                tool_use_id: 'srv_1',
                content: { type: 'tool_search_tool_search_result', tool_references: [] },
              },
              { type: 'tool_use', id: 'toolu_2', name: 'ToolSearch', input: { query: 'select:get_weather' } },
            ],
          },
          user([
            {
              type: 'tool_result',
              tool_use_id: 'toolu_2',
              content: [{ type: 'tool_reference', tool_name: 'get_weather' }],
            },
          ]),
        ],
      },
      dropped,
    );
    expect(chat.tools).toEqual([
      { type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } },
    ]);
    expect((chat.messages as unknown[]).at(-1)).toEqual({
      role: 'tool',
      tool_call_id: 'toolu_2',
      content: "Tool 'get_weather' is loaded.",
    });
    expect([...dropped].sort()).toEqual([
      'defer_loading',
      'tool search steps',
      'tool_search_tool_regex_20251119',
    ]);
  });

  it('answers: text, tool calls, stop reasons and usage', () => {
    const message = chatToMessage(
      {
        id: 'chatcmpl-1',
        choices: [
          {
            finish_reason: 'tool_calls',
            message: {
              content: 'Let me see',
              tool_calls: [{ id: 'c', function: { name: 'f', arguments: '{"a":1}' } }],
            },
          },
        ],
        usage: { prompt_tokens: 10, completion_tokens: 3, prompt_tokens_details: { cached_tokens: 4 } },
      },
      'm',
    );
    expect(message).toEqual({
      id: 'msg_1',
      type: 'message',
      role: 'assistant',
      model: 'm',
      content: [
        { type: 'text', text: 'Let me see' },
        { type: 'tool_use', id: 'c', name: 'f', input: { a: 1 } },
      ],
      stop_reason: 'tool_use',
      stop_sequence: null,
      usage: {
        input_tokens: 6,
        output_tokens: 3,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 4,
      },
    });
    for (const [finish, stop] of [
      ['stop', 'end_turn'],
      ['length', 'max_tokens'],
      ['content_filter', 'refusal'],
    ]) {
      expect(
        chatToMessage({ choices: [{ finish_reason: finish, message: { content: 'x' } }] }, 'm').stop_reason,
      ).toBe(stop);
    }
  });
});

describe('Chat Completions → Messages (chatToMessages)', () => {
  const cases: Array<[string, Record<string, unknown>, Record<string, unknown>]> = [
    [
      'system and developer messages, consecutive user turns merged',
      {
        messages: [
          { role: 'system', content: 'A' },
          { role: 'developer', content: [{ type: 'text', text: 'B' }] },
          user('x'),
          user('y'),
        ],
      },
      {
        system: 'A\n\nB',
        messages: [
          {
            role: 'user',
            content: [
              { type: 'text', text: 'x' },
              { type: 'text', text: 'y' },
            ],
          },
        ],
      },
    ],
    [
      'a data URL image, a URL image, a PDF file',
      {
        messages: [
          user([
            { type: 'image_url', image_url: { url: 'data:image/png;base64,AAA' } },
            { type: 'image_url', image_url: { url: 'https://x/y.png' } },
            { type: 'file', file: { file_data: 'data:application/pdf;base64,JVB' } },
          ]),
        ],
      },
      {
        messages: [
          {
            role: 'user',
            content: [
              { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAA' } },
              { type: 'image', source: { type: 'url', url: 'https://x/y.png' } },
              { type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: 'JVB' } },
            ],
          },
        ],
      },
    ],
    [
      'tool calls and their results',
      {
        messages: [
          {
            role: 'assistant',
            content: null,
            tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{"a":1}' } }],
          },
          { role: 'tool', tool_call_id: 'c', content: 'ok' },
        ],
      },
      {
        messages: [
          { role: 'assistant', content: [{ type: 'tool_use', id: 'c', name: 'f', input: { a: 1 } }] },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'c', content: 'ok' }] },
        ],
      },
    ],
    [
      'tools, a named choice without parallel calls, sampling, stop, user',
      {
        messages: [],
        tools: [
          { type: 'function', function: { name: 'f', description: 'd', parameters: { type: 'object' } } },
        ],
        tool_choice: { type: 'function', function: { name: 'f' } },
        parallel_tool_calls: false,
        temperature: 0.3,
        stop: 'END',
        user: 'u',
        max_completion_tokens: 50,
      },
      {
        tools: [{ name: 'f', description: 'd', input_schema: { type: 'object' } }],
        tool_choice: { type: 'tool', name: 'f', disable_parallel_tool_use: true },
        temperature: 0.3,
        stop_sequences: ['END'],
        metadata: { user_id: 'u' },
        max_tokens: 50,
      },
    ],
  ];
  it.each(cases)('%s', (_name, body, expected) => {
    expect(chatToMessages({ model: 'm', max_tokens: 10, ...body })).toMatchObject(expected);
  });

  const refused: Array<[string, Record<string, unknown>, string]> = [
    ['n > 1', { n: 2 }, 'n'],
    ['response_format', { response_format: { type: 'json_object' } }, 'response_format'],
    ['a temperature above 1', { temperature: 1.5 }, 'temperature'],
    [
      'an audio part',
      { messages: [user([{ type: 'input_audio', input_audio: {} }])] },
      'messages.0.content.0',
    ],
    ['a function message', { messages: [{ role: 'function', name: 'f', content: 'x' }] }, 'messages.0.role'],
  ];
  it.each(refused)('refuses %s with a 400 naming it', (_name, body, param) => {
    let err: unknown;
    try {
      chatToMessages({ model: 'm', max_tokens: 10, messages: [], ...body });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ApiError);
    expect((err as ApiError).param).toBe(param);
  });

  it('answers: text, thinking, tool use, stop reasons and usage', () => {
    const completion = messageToChat(
      {
        id: 'msg_1',
        content: [
          { type: 'thinking', thinking: 'hmm', signature: 's' },
          { type: 'text', text: 'Hi' },
          { type: 'tool_use', id: 't', name: 'f', input: { a: 1 } },
        ],
        stop_reason: 'tool_use',
        usage: {
          input_tokens: 5,
          cache_creation_input_tokens: 2,
          cache_read_input_tokens: 3,
          output_tokens: 4,
        },
      },
      'm',
    );
    expect(completion).toMatchObject({
      id: 'chatcmpl-1',
      choices: [
        {
          finish_reason: 'tool_calls',
          message: {
            content: 'Hi',
            reasoning_content: 'hmm',
            tool_calls: [{ id: 't', type: 'function', function: { name: 'f', arguments: '{"a":1}' } }],
          },
        },
      ],
      usage: {
        prompt_tokens: 10,
        completion_tokens: 4,
        total_tokens: 14,
        prompt_tokens_details: { cached_tokens: 3 },
      },
    });
  });
});

async function collect(events: AsyncIterable<SseMessage>): Promise<Array<Record<string, unknown> | string>> {
  const out: Array<Record<string, unknown> | string> = [];
  for await (const e of events) {
    if (e.data === '') continue; // usage only, for the metering: not relayed
    out.push(e.data === '[DONE]' ? '[DONE]' : JSON.parse(e.data));
  }
  return out;
}

async function* of(items: unknown[]): AsyncGenerator<SseMessage> {
  for (const item of items)
    yield { event: undefined, data: typeof item === 'string' ? item : JSON.stringify(item) };
}

describe('streams', () => {
  it('chat chunks → Anthropic events (text, then a tool call, usage at the end)', async () => {
    const chunk = (delta: unknown, finish: string | null = null) => ({
      id: 'chatcmpl-9',
      choices: [{ index: 0, delta, finish_reason: finish }],
    });
    const events = await collect(
      chatStreamToMessages(
        of([
          chunk({ role: 'assistant', content: '' }),
          chunk({ content: 'Hi' }),
          chunk({ tool_calls: [{ index: 0, id: 'c', function: { name: 'f', arguments: '{"a"' } }] }),
          chunk({ tool_calls: [{ index: 0, function: { arguments: ':1}' } }] }),
          chunk({}, 'tool_calls'),
          { id: 'chatcmpl-9', choices: [], usage: { prompt_tokens: 7, completion_tokens: 2 } },
          '[DONE]',
        ]),
        'm',
      ),
    );
    expect(events.map((e) => (e as { type: string }).type)).toEqual([
      'message_start',
      'content_block_start',
      'content_block_delta',
      'content_block_stop',
      'content_block_start',
      'content_block_delta',
      'content_block_delta',
      'content_block_stop',
      'message_delta',
      'message_stop',
    ]);
    expect(events[4]).toMatchObject({ index: 1, content_block: { type: 'tool_use', id: 'c', name: 'f' } });
    expect(events[8]).toMatchObject({
      delta: { stop_reason: 'tool_use' },
      usage: { input_tokens: 7, output_tokens: 2 },
    });
  });

  it('a chat stream without [DONE] ends without message_stop', async () => {
    const events = await collect(
      chatStreamToMessages(of([{ id: 'x', choices: [{ delta: { content: 'a' } }] }]), 'm'),
    );
    expect(events.map((e) => (e as { type: string }).type)).not.toContain('message_stop');
  });

  it('Anthropic events → chat chunks (text, tool use, finish, usage, [DONE])', async () => {
    const chunks = await collect(
      messagesStreamToChat(
        of([
          {
            type: 'message_start',
            message: {
              id: 'msg_9',
              usage: { input_tokens: 5, cache_read_input_tokens: 2, output_tokens: 1 },
            },
          },
          { type: 'ping' },
          { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } },
          { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Hi' } },
          { type: 'content_block_stop', index: 0 },
          {
            type: 'content_block_start',
            index: 1,
            content_block: { type: 'tool_use', id: 't', name: 'f', input: {} },
          },
          { type: 'content_block_delta', index: 1, delta: { type: 'input_json_delta', partial_json: '{}' } },
          { type: 'content_block_stop', index: 1 },
          { type: 'message_delta', delta: { stop_reason: 'tool_use' }, usage: { output_tokens: 6 } },
          { type: 'message_stop' },
        ]),
        'm',
      ),
    );
    const deltas = chunks
      .slice(0, -2)
      .map((c) => (c as { choices: Array<{ delta: unknown }> }).choices[0]!.delta);
    expect(deltas).toEqual([
      { role: 'assistant', content: '' },
      { content: 'Hi' },
      { tool_calls: [{ index: 0, id: 't', type: 'function', function: { name: 'f', arguments: '' } }] },
      { tool_calls: [{ index: 0, function: { arguments: '{}' } }] },
      {},
    ]);
    expect(chunks.at(-2)).toMatchObject({
      choices: [],
      usage: { prompt_tokens: 7, completion_tokens: 6, prompt_tokens_details: { cached_tokens: 2 } },
    });
    expect(chunks.at(-1)).toBe('[DONE]');
  });

  it('Anthropic usage reaches the metering as it arrives (message_start input, message_delta output)', async () => {
    const messages: SseMessage[] = [];
    for await (const m of messagesStreamToChat(
      of([
        {
          type: 'message_start',
          message: {
            id: 'msg_9',
            usage: { input_tokens: 5, cache_creation_input_tokens: 3, output_tokens: 1 },
          },
        },
        { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } },
        { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Hi' } },
        { type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 6 } },
      ]),
      'm',
    )) {
      messages.push(m);
    }
    // the role chunk carries the input (no output: message_start's is a placeholder)
    expect(messages[0]!.usage).toEqual({
      prompt_tokens: 8,
      prompt_tokens_details: { cached_tokens: 0 },
      cache_creation_input_tokens: 3,
    });
    // message_delta: a usage-only message, not relayed, with the whole usage so far
    expect(messages.at(-1)).toEqual({
      event: undefined,
      data: '',
      usage: {
        prompt_tokens: 8,
        completion_tokens: 6,
        total_tokens: 14,
        prompt_tokens_details: { cached_tokens: 0 },
        cache_creation_input_tokens: 3,
      },
    });
  });

  it('a translated message_start carries Tollgate’s estimate, flagged as no provider usage', async () => {
    const sent = {
      path: '/chat/completions',
      body: { messages: [{ role: 'user', content: 'Hello there' }] },
    };
    const events: SseMessage[] = [];
    for await (const e of chatStreamToMessages(
      of([{ id: 'c', choices: [{ index: 0, delta: { content: 'Hi' } }] }, '[DONE]']),
      'm',
      sent as never,
    )) {
      events.push(e);
    }
    const start = events[0]!;
    expect(start.placeholderUsage).toBe(true);
    expect(JSON.parse(start.data).message.usage.input_tokens).toBe(3 + 4 + 2); // 'Hello there': 2 tokens
    // no usage chunk from the provider: the message_delta's zeros are no usage either
    expect(events.find((e) => e.event === 'message_delta')!.placeholderUsage).toBe(true);
  });
});
