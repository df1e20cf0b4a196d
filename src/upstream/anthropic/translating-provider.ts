import type {
  PassthroughAnswer,
  PassthroughCall,
  Provider,
  SseMessage,
  UpstreamAnswer,
  UpstreamCall,
} from '../types.ts';

type Json = Record<string, unknown>;

/**
 * A provider that answers one API by translating it to another API of the provider it wraps: a call it
 * translates goes in translated, and its answer — JSON or stream — comes back in the client's API;
 * every other call (and every passthrough) goes to the wrapped provider as is. The two translations
 * between Anthropic's Messages API and Chat Completions are its subclasses (./chat-over-messages.ts,
 * ./messages-over-chat.ts).
 */
export interface Translation {
  /** True for a call the wrapped provider answers as is. */
  passes(path: string): boolean;
  /** The call in the wrapped provider's API. */
  call(call: UpstreamCall): UpstreamCall;
  /** The wrapped provider's JSON answer in the client's API. */
  answer(json: Json, model: string): Json;
  /** The wrapped provider's stream in the client's API (`sent`: the translated call). */
  stream(events: AsyncIterable<SseMessage>, model: string, sent: UpstreamCall): AsyncIterable<SseMessage>;
}

export class TranslatingProvider implements Provider {
  readonly #inner: Provider;
  readonly #translation: Translation;

  constructor(inner: Provider, translation: Translation) {
    this.#inner = inner;
    this.#translation = translation;
  }

  async complete(call: UpstreamCall): Promise<UpstreamAnswer> {
    const t = this.#translation;
    if (t.passes(call.path)) {
      call.onDropped?.([]);
      return this.#inner.complete(call);
    }
    const answer = await this.#inner.complete(t.call(call));
    const json = t.answer(answer.json, String(call.body.model));
    return { text: JSON.stringify(json), json };
  }

  async stream(call: UpstreamCall): Promise<AsyncIterable<SseMessage>> {
    const t = this.#translation;
    if (t.passes(call.path)) {
      call.onDropped?.([]);
      return this.#inner.stream(call);
    }
    const sent = t.call(call);
    const events = await this.#inner.stream(sent);
    return t.stream(events, String(call.body.model), sent);
  }

  passthrough(call: PassthroughCall): Promise<PassthroughAnswer> {
    return this.#inner.passthrough(call);
  }
}
