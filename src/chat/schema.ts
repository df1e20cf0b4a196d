import { z } from 'zod';
import { userIdSchema } from '../users/schema.ts';

export { END_USER_HEADER, resolveEndUser } from '../metering/end-user.ts';

/**
 * The chat completion request: the spec's rules (roles `system`, `user`, `assistant` with text
 * `content`, the `name` pattern, at least one message) inside OpenAI's full Chat Completions schema as
 * a superset — the `developer`, `tool` and legacy `function` roles, content as a string or an array of
 * parts (text, image, audio, file), assistant messages with `tool_calls` and `content: null`, `refusal`.
 * The request fields Tollgate reads (`max_tokens`, `max_completion_tokens`, `n`, `stream_options`) and
 * the ones OpenAI defines (`tools`, `tool_choice`, `response_format`, …) are checked for their shape;
 * everything is forwarded to the provider as received, unknown fields included.
 */
const str = (what = 'must be a string') => z.string({ message: what });

export const nameSchema = str().regex(/^[a-zA-Z0-9_]{1,64}$/, {
  message: 'must be 1 to 64 letters, digits or underscores',
});

export const textPartSchema = z.looseObject({ type: z.literal('text'), text: str() });
export const imagePartSchema = z.looseObject({
  type: z.literal('image_url'),
  image_url: z.looseObject({
    url: str(),
    detail: z.enum(['auto', 'low', 'high'], { message: "must be one of 'auto', 'low', 'high'" }).optional(),
  }),
});
export const audioPartSchema = z.looseObject({
  type: z.literal('input_audio'),
  input_audio: z.looseObject({ data: str(), format: str() }),
});
export const filePartSchema = z.looseObject({
  type: z.literal('file'),
  file: z.looseObject({ file_data: str().optional(), file_id: str().optional(), filename: str().optional() }),
});
export const refusalPartSchema = z.looseObject({ type: z.literal('refusal'), refusal: str() });

const KNOWN_PARTS = ['text', 'image_url', 'input_audio', 'file', 'refusal'];
/** A part type OpenAI may add later: forwarded as received. */
const otherPartSchema = z.looseObject({
  type: str().refine((t) => !KNOWN_PARTS.includes(t), { message: 'is not a valid part' }),
});

export const contentPartSchema = z.union(
  [textPartSchema, imagePartSchema, audioPartSchema, filePartSchema, refusalPartSchema, otherPartSchema],
  { message: 'must be a content part: text, image_url, input_audio or file, with its fields' },
);
export type ContentPart = z.infer<typeof contentPartSchema>;

export const toolCallSchema = z.looseObject({
  id: str(),
  type: str(),
  function: z.looseObject({ name: str(), arguments: str() }).optional(),
});

export const ROLES = ['system', 'user', 'assistant', 'developer', 'tool', 'function'] as const;
const SPEC_ROLES_MESSAGE = `must be one of ${ROLES.map((r) => `'${r}'`).join(', ')}`;

/** Part types each role may carry (other types are OpenAI's future ones and pass). */
const PARTS_OF_ROLE: Record<(typeof ROLES)[number], readonly string[]> = {
  system: ['text'],
  developer: ['text'],
  user: ['text', 'image_url', 'input_audio', 'file'],
  assistant: ['text', 'refusal'],
  tool: ['text'],
  function: ['text'],
};

export const messageSchema = z
  .looseObject({
    role: z.enum(ROLES, { message: SPEC_ROLES_MESSAGE }),
    content: z
      .union([str(), z.array(contentPartSchema)], {
        message: 'must be a string or an array of content parts',
      })
      .nullable()
      .optional(),
    name: nameSchema.optional(),
    tool_calls: z.array(toolCallSchema, { message: 'must be an array of tool calls' }).optional(),
    tool_call_id: str().optional(),
    function_call: z.looseObject({ name: str(), arguments: str() }).nullable().optional(),
    refusal: str().nullable().optional(),
  })
  .superRefine((m, ctx) => {
    const content = m.content;
    const speaksWithoutContent =
      m.role === 'assistant' && (m.tool_calls?.length || m.function_call || m.refusal != null || m.audio);
    if (content == null) {
      if (!speaksWithoutContent && m.role !== 'function') {
        ctx.addIssue({
          code: 'custom',
          path: ['content'],
          message:
            m.role === 'assistant'
              ? 'must be a string or an array of content parts (null only with tool_calls)'
              : 'must be a string or an array of content parts',
        });
      }
    } else if (Array.isArray(content)) {
      content.forEach((part, i) => {
        if (KNOWN_PARTS.includes(part.type) && !PARTS_OF_ROLE[m.role].includes(part.type)) {
          ctx.addIssue({
            code: 'custom',
            path: ['content', i, 'type'],
            message: `a '${m.role}' message cannot carry '${part.type}' parts`,
          });
        }
      });
    }
    if (m.role === 'tool' && m.tool_call_id === undefined) {
      ctx.addIssue({ code: 'custom', path: ['tool_call_id'], message: 'is required for a tool message' });
    }
    if (m.role === 'function' && m.name === undefined) {
      ctx.addIssue({ code: 'custom', path: ['name'], message: 'is required for a function message' });
    }
  });
export type ChatMessage = z.infer<typeof messageSchema>;

const positiveInt = z
  .number({ message: 'must be a positive integer' })
  .int({ message: 'must be a positive integer' })
  .min(1, { message: 'must be a positive integer' });

export const toolSchema = z.looseObject({
  type: str(),
  function: z.looseObject({ name: str() }).optional(),
});

export const responseFormatSchema = z.looseObject({
  type: z.enum(['text', 'json_object', 'json_schema'], {
    message: "must be one of 'text', 'json_object', 'json_schema'",
  }),
  json_schema: z.looseObject({ name: str() }).optional(),
});

export const chatRequestSchema = z.looseObject({
  model: z.string({ message: 'is required' }).min(1, { message: 'must not be empty' }),
  messages: z
    .array(messageSchema, { message: 'must be an array of messages' })
    .min(1, { message: 'must contain at least 1 message' }),
  stream: z.boolean({ message: 'must be a boolean' }).nullable().optional(),
  user: userIdSchema.optional(),
  max_tokens: positiveInt.nullable().optional(),
  max_completion_tokens: positiveInt.nullable().optional(),
  n: positiveInt.max(128, { message: 'must be at most 128' }).nullable().optional(),
  stream_options: z
    .looseObject({ include_usage: z.boolean({ message: 'must be a boolean' }).optional() })
    .nullable()
    .optional(),
  tools: z.array(toolSchema, { message: 'must be an array of tools' }).nullable().optional(),
  tool_choice: z
    .union([str(), z.looseObject({ type: str() })], { message: 'must be a string or an object' })
    .nullable()
    .optional(),
  parallel_tool_calls: z.boolean({ message: 'must be a boolean' }).nullable().optional(),
  response_format: responseFormatSchema.nullable().optional(),
  logprobs: z.boolean({ message: 'must be a boolean' }).nullable().optional(),
  top_logprobs: z.number({ message: 'must be a number' }).int().min(0).max(20).nullable().optional(),
  stop: z
    .union([str(), z.array(str())], { message: 'must be a string or an array of strings' })
    .nullable()
    .optional(),
  seed: z
    .number({ message: 'must be an integer' })
    .int({ message: 'must be an integer' })
    .nullable()
    .optional(),
  modalities: z.array(str(), { message: 'must be an array of strings' }).nullable().optional(),
  audio: z.looseObject({}).nullable().optional(),
  prediction: z.looseObject({ type: str() }).nullable().optional(),
});
export type ChatRequest = z.infer<typeof chatRequestSchema>;
