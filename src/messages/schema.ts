import { z } from 'zod';

/**
 * The body of `POST /v1/messages` (Anthropic's Messages API). Every field of Anthropic's request is
 * accepted; the ones Tollgate reads or translates are checked for their shape (`model`, `max_tokens` —
 * required, the hold's output bound —, `messages` (user, assistant and system turns) and their content
 * blocks, `system`, `tools`, `tool_choice`, `stop_sequences`, `temperature`, `top_p`, `top_k`,
 * `thinking`, `output_config`, `context_management`, `metadata.user_id`, `stream`). Blocks of types Tollgate does not know (Anthropic adds some) pass through as received to a
 * native Anthropic provider. Forwarded as received, with the provider's model name.
 */
const positiveInt = z
  .number({ message: 'must be a positive integer' })
  .int({ message: 'must be a positive integer' })
  .min(1, { message: 'must be a positive integer' });

const cacheControl = z.looseObject({ type: z.string({ message: 'must be a string' }) }).nullish();

const textBlock = z.looseObject({
  type: z.literal('text'),
  text: z.string({ message: 'must be a string' }),
  cache_control: cacheControl,
  citations: z.array(z.looseObject({})).nullish(),
});

const imageSource = z.discriminatedUnion(
  'type',
  [
    z.looseObject({
      type: z.literal('base64'),
      media_type: z.string({ message: 'must be an image media type' }),
      data: z.string({ message: 'must be base64 text' }),
    }),
    z.looseObject({ type: z.literal('url'), url: z.string({ message: 'must be a URL' }) }),
    z.looseObject({ type: z.literal('file'), file_id: z.string({ message: 'must be a file id' }) }),
  ],
  { message: "must be a source of type 'base64', 'url' or 'file'" },
);

const imageBlock = z.looseObject({
  type: z.literal('image'),
  source: imageSource,
  cache_control: cacheControl,
});

const documentBlock = z.looseObject({
  type: z.literal('document'),
  source: z.looseObject({ type: z.string({ message: 'must be a string' }) }),
  title: z.string().nullish(),
  context: z.string().nullish(),
  cache_control: cacheControl,
});

const toolUseBlock = z.looseObject({
  type: z.literal('tool_use'),
  id: z.string({ message: 'must be a string' }),
  name: z.string({ message: 'must be a string' }),
  input: z.record(z.string(), z.unknown(), { message: 'must be an object' }),
  cache_control: cacheControl,
});

/** Blocks a tool result may carry (text, images, documents, search results…). */
const toolResultBlock = z.looseObject({
  type: z.literal('tool_result'),
  tool_use_id: z.string({ message: 'must be a string' }),
  content: z
    .union([z.string(), z.array(z.looseObject({ type: z.string({ message: 'must be a string' }) }))], {
      message: 'must be a string or an array of content blocks',
    })
    .optional(),
  is_error: z.boolean({ message: 'must be a boolean' }).optional(),
  cache_control: cacheControl,
});

const thinkingBlock = z.looseObject({
  type: z.literal('thinking'),
  thinking: z.string({ message: 'must be a string' }),
  signature: z.string({ message: 'must be a string' }),
});

const redactedThinkingBlock = z.looseObject({
  type: z.literal('redacted_thinking'),
  data: z.string({ message: 'must be a string' }),
});

const KNOWN_BLOCKS: Record<string, z.ZodType> = {
  text: textBlock,
  image: imageBlock,
  document: documentBlock,
  tool_use: toolUseBlock,
  tool_result: toolResultBlock,
  thinking: thinkingBlock,
  redacted_thinking: redactedThinkingBlock,
};

/** A content block: the known types checked for their shape, others (server tools, …) passed through. */
const contentBlock = z
  .looseObject({ type: z.string({ message: 'must be a content block type' }) })
  .superRefine((block, ctx) => {
    const schema = KNOWN_BLOCKS[block.type];
    if (!schema) return;
    const checked = schema.safeParse(block);
    if (checked.success) return;
    for (const issue of checked.error.issues) {
      ctx.addIssue({ code: 'custom', message: issue.message, path: issue.path });
    }
  });
export type ContentBlock = z.infer<typeof contentBlock> & Record<string, unknown>;

/**
 * `output_config`: `effort` (`low` … `max`: how much the model reasons), `format` (structured output,
 * `{type: "json_schema", schema}`), `task_budget` (advisory). Also accepted on a `system` turn.
 */
const outputConfigSchema = z.looseObject({
  effort: z.string({ message: 'must be a string' }).nullish(),
  format: z.looseObject({ type: z.string({ message: 'must be a string' }) }).nullish(),
});

/**
 * A turn: `user`, `assistant`, or `system` (Claude Code puts system turns between the others: an
 * instruction at that point of the conversation). A system turn may carry only `output_config`.
 */
const messageSchema = z
  .looseObject({
    role: z.enum(['user', 'assistant', 'system'], { message: "must be 'user', 'assistant' or 'system'" }),
    content: z
      .union([z.string(), z.array(contentBlock)], {
        message: 'must be a string or an array of content blocks',
      })
      .optional(),
    output_config: outputConfigSchema.optional(),
  })
  .superRefine((message, ctx) => {
    if (message.content !== undefined) return;
    if (message.role === 'system' && message.output_config) return;
    ctx.addIssue({ code: 'custom', message: 'is required', path: ['content'] });
  });
export type AnthropicMessage = z.infer<typeof messageSchema>;

const toolSchema = z.looseObject({
  name: z.string({ message: 'must be a string' }).min(1, { message: 'must not be empty' }),
  type: z.string({ message: 'must be a string' }).nullish(),
  description: z.string({ message: 'must be a string' }).optional(),
  input_schema: z.looseObject({}).optional(),
  cache_control: cacheControl,
  /** Loaded only when the tool search finds it (Anthropic); sent with the others on the translated path. */
  defer_loading: z.boolean({ message: 'must be a boolean' }).optional(),
});

const toolChoiceSchema = z.discriminatedUnion(
  'type',
  [
    z.looseObject({ type: z.literal('auto'), disable_parallel_tool_use: z.boolean().optional() }),
    z.looseObject({ type: z.literal('any'), disable_parallel_tool_use: z.boolean().optional() }),
    z.looseObject({
      type: z.literal('tool'),
      name: z.string({ message: 'must be a string' }),
      disable_parallel_tool_use: z.boolean().optional(),
    }),
    z.looseObject({ type: z.literal('none') }),
  ],
  { message: "must be a tool choice of type 'auto', 'any', 'tool' or 'none'" },
);

const thinkingSchema = z.looseObject({
  type: z.enum(['enabled', 'disabled', 'adaptive'], {
    message: "must be 'enabled', 'disabled' or 'adaptive'",
  }),
  budget_tokens: positiveInt.optional(),
});

/** The fields `count_tokens` takes: the request without `max_tokens` and `stream`. */
const promptFields = {
  model: z.string({ message: 'is required' }).min(1, { message: 'must not be empty' }),
  messages: z.array(messageSchema, { message: 'must be an array of messages' }),
  system: z
    .union([z.string(), z.array(textBlock)], { message: 'must be a string or an array of text blocks' })
    .optional(),
  tools: z.array(toolSchema, { message: 'must be an array of tools' }).optional(),
  tool_choice: toolChoiceSchema.optional(),
  thinking: thinkingSchema.optional(),
  output_config: outputConfigSchema.optional(),
  /** Anthropic's context editing (`{edits: [{type: "clear_tool_uses_20250919", …}]}`): a hint elsewhere. */
  context_management: z.looseObject({}, { message: 'must be an object' }).nullish(),
};

export const countTokensRequestSchema = z.looseObject(promptFields);
export type CountTokensRequest = z.infer<typeof countTokensRequestSchema>;

export const messagesRequestSchema = z.looseObject({
  ...promptFields,
  max_tokens: positiveInt,
  /** Checked as an end user's id where it names one (./api.ts: not Claude Code's session ids). */
  metadata: z.looseObject({ user_id: z.string({ message: 'must be a string' }).nullish() }).optional(),
  stop_sequences: z.array(z.string({ message: 'must be a string' })).optional(),
  stream: z.boolean({ message: 'must be a boolean' }).optional(),
  temperature: z.number({ message: 'must be a number' }).min(0).max(1).optional(),
  top_p: z.number({ message: 'must be a number' }).min(0).max(1).optional(),
  top_k: z.number({ message: 'must be a number' }).int().min(0).optional(),
  service_tier: z.string({ message: 'must be a string' }).optional(),
});
export type MessagesRequest = z.infer<typeof messagesRequestSchema>;
