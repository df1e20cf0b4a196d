import type { FastifyInstance } from 'fastify';
import { ApiError, badRequest } from '../core/errors.ts';

/**
 * The `application/json` body parser of every route: strict UTF-8 (a body with invalid byte sequences
 * is refused rather than decoded with U+FFFD) and a nesting limit checked on the text before it is
 * parsed, so that no deeply nested value reaches validation, hashing or a provider (each would recurse
 * once per level). The parsing itself is fastify's (prototype poisoning refused).
 */
export function installJsonParser(app: FastifyInstance, maxDepth: number): void {
  const parse = app.getDefaultJsonParser('error', 'error');
  const decoder = new TextDecoder('utf-8', { fatal: true });
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (request, body: Buffer, done) => {
    let text: string;
    try {
      text = decoder.decode(body);
    } catch {
      done(
        new ApiError(400, 'invalid_request_error', 'Request body is not valid UTF-8.', {
          code: 'invalid_encoding',
        }),
        undefined,
      );
      return;
    }
    if (jsonDepthExceeds(text, maxDepth)) {
      done(
        badRequest(`Request body is nested more than ${maxDepth} levels deep.`, null, 'json_too_deep'),
        undefined,
      );
      return;
    }
    parse(request, text, done);
  });
}

/**
 * Whether JSON text nests objects and arrays more than `max` levels deep (the top-level value counts
 * as one). Brackets inside strings do not count. One pass, no recursion; malformed text is left to the
 * parser.
 */
export function jsonDepthExceeds(text: string, max: number): boolean {
  let depth = 0;
  const length = text.length;
  for (let i = 0; i < length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      // skip the string: to the next quote not escaped by a backslash
      for (i++; i < length; i++) {
        const s = text.charCodeAt(i);
        if (s === 0x5c) i++;
        else if (s === 0x22) break;
      }
    } else if (c === 0x7b || c === 0x5b) {
      if (++depth > max) return true;
    } else if (c === 0x7d || c === 0x5d) {
      depth--;
    }
  }
  return false;
}
