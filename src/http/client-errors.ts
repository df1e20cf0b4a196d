import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { ErrorBody } from '../core/errors.ts';

// (Not `import { STATUS_CODES } from 'node:http'`: importing node:http as a module reads all its
// exports, and its WebSocket and MessageEvent getters load Node's internal undici — 2 MB of heap.)
const { STATUS_CODES } = process.getBuiltinModule('node:http');

/**
 * fastify's `clientErrorHandler`: a request Node's HTTP parser refuses (a bad request line or method,
 * a malformed header, a Content-Length that disagrees with the body, a bad chunk, unframed bytes, a URL
 * or headers too large) never reaches a route. It is answered here in OpenAI's error shape and the
 * connection is closed, since what follows on it cannot be trusted.
 */
export function clientErrorHandler(error: Error & { code?: string }, socket: Socket): void {
  if (error.code === 'ECONNRESET' || socket.destroyed) return;
  const [status, message, code] =
    error.code === 'ERR_HTTP_REQUEST_TIMEOUT'
      ? [408, 'The request was not received in time.', 'request_timeout']
      : error.code === 'HPE_HEADER_OVERFLOW'
        ? [431, 'The request line or headers are too large.', 'request_header_fields_too_large']
        : [400, `The HTTP request could not be parsed${reason(error.code)}.`, 'malformed_request'];
  const body: ErrorBody = { error: { message, type: 'invalid_request_error', param: null, code } };
  let sent = false;
  const send = () => {
    if (sent || socket.destroyed) return;
    sent = true;
    const text = JSON.stringify(body);
    if (socket.writable) {
      socket.write(
        `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: application/json; charset=utf-8\r\n` +
          `Content-Length: ${Buffer.byteLength(text)}\r\nConnection: close\r\n\r\n${text}`,
      );
    }
    socket.destroySoon();
  };
  // An earlier request on this connection that was received whole is being served (it may move money):
  // its response goes out first. One cut short by the error (a body that cannot be read) is abandoned.
  const pending = (socket as Socket & { _httpMessage?: ServerResponse | null })._httpMessage;
  if (pending && !pending.writableFinished && pending.req?.complete) {
    pending.once('finish', send);
    pending.once('close', send);
    return;
  }
  send();
}

function reason(code: string | undefined): string {
  if (!code?.startsWith('HPE_')) return '';
  return ` (${code.slice(4).toLowerCase().replaceAll('_', ' ')})`;
}
