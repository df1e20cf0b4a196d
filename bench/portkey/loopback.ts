import { writeSync } from 'node:fs';
import { Server } from 'node:net';

/**
 * Preloaded (`node --import`) into the Portkey gateway as bench/proxy.ts starts it. The gateway's
 * `start-server.js` listens on every interface at the `--port` it is given; this keeps it on loopback
 * (127.0.0.1) and, with `--port=0`, reports the port the kernel chose as `{"url": …}` on file
 * descriptor 3 (the gateway's own stdout is a start-up animation).
 */
const listen = Server.prototype.listen;
let reported = false;
Server.prototype.listen = function (this: Server, ...args: unknown[]) {
  if (typeof args[0] === 'number') {
    if (args[1] === undefined) args[1] = '127.0.0.1';
    else if (typeof args[1] === 'function') args.splice(1, 0, '127.0.0.1');
  }
  this.once('listening', () => {
    const address = this.address();
    if (reported || !address || typeof address === 'string') return;
    reported = true;
    writeSync(3, `${JSON.stringify({ url: `http://127.0.0.1:${address.port}` })}\n`);
  });
  return listen.apply(this, args as Parameters<typeof listen>);
} as typeof listen;
