import type { Dispatcher } from 'undici';
import { OpenAICompatibleProvider } from '../openai-compatible.ts';
import type { CacheCreation } from '../types.ts';

/**
 * The client of Anthropic's Messages API: the same HTTP client as an OpenAI-compatible provider, with
 * Anthropic's base path, key header and version header. The translations between the Messages API and
 * Chat Completions are beside it (./chat-over-messages.ts, ./messages-over-chat.ts).
 */

/** Anthropic's API version sent when the client named none. */
export const ANTHROPIC_VERSION = '2023-06-01';

/**
 * A provider of kind `anthropic`: the Messages API at `{baseUrl}/v1/messages` (the base URL is
 * `https://api.anthropic.com`, or any URL of a compatible API, with or without its `/v1`), the key in
 * `x-api-key`, `anthropic-version` (the client's, else ANTHROPIC_VERSION) on every call.
 */
export function anthropicProvider(
  agent: Dispatcher,
  baseUrl: string,
  apiKey: string | undefined,
  responseMs?: number,
  headers: Record<string, string> = {},
): OpenAICompatibleProvider {
  const trimmed = baseUrl.replace(/\/+$/, '');
  const base = /\/v1$/.test(trimmed) ? trimmed : `${trimmed}/v1`;
  return new OpenAICompatibleProvider(agent, base, apiKey, responseMs, {
    auth: 'x-api-key',
    headers: { 'anthropic-version': ANTHROPIC_VERSION, ...headers },
  });
}

/** Anthropic's `usage` as its messages and events report it (the fields Tollgate reads). */
export interface AnthropicUsage {
  input_tokens?: number | null;
  output_tokens?: number | null;
  cache_creation_input_tokens?: number | null;
  cache_read_input_tokens?: number | null;
  /** The cache writes by lifetime (5 minutes, 1 hour); their sum is `cache_creation_input_tokens`. */
  cache_creation?: CacheCreation | null;
}

/** Cache writes of an Anthropic usage: all of them, and the 1-hour part (undefined: none reported). */
export function cacheWritesOf(
  usage: Pick<AnthropicUsage, 'cache_creation_input_tokens' | 'cache_creation'> | null | undefined,
): { write: number; write1h: number } | undefined {
  const split = usage?.cache_creation;
  const hour = num(split?.ephemeral_1h_input_tokens);
  const five = num(split?.ephemeral_5m_input_tokens);
  const total = num(usage?.cache_creation_input_tokens);
  if (total === undefined && hour === undefined && five === undefined) return undefined;
  const write = total ?? (five ?? 0) + (hour ?? 0);
  return { write, write1h: Math.min(hour ?? 0, write) };
}

const num = (value: unknown): number | undefined =>
  typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : undefined;

/** The usage of a message that cost nothing (Tollgate's own replies; a translated stream's start). */
export function noAnthropicUsage() {
  return { input_tokens: 0, output_tokens: 0, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 };
}

/**
 * Claude Code's `metadata.user_id`: a JSON object naming its device and session
 * (`{"device_id":…,"account_uuid":…,"session_id":…}`), or in older versions
 * `user_<device>_account_<account>_session_<session>` — a new value per session, not the end user.
 */
export function isSessionUserId(id: string): boolean {
  if (/^user_[0-9a-f]{16,}_account_[0-9a-f-]*_session_[0-9a-f-]{8,}$/i.test(id)) return true;
  if (!id.startsWith('{')) return false;
  try {
    const parsed: unknown = JSON.parse(id);
    return parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed);
  } catch {
    return false;
  }
}
