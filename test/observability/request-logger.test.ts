import Fastify, { LogController } from 'fastify';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { requestLogger } from '../../src/http/request-logger.ts';

/**
 * `request.log` is made on the first line written at an enabled level (src/http/request-logger.ts);
 * what reaches the log is what fastify's own child logger writes.
 */
async function linesOf(lazy: boolean, level: string): Promise<Array<Record<string, unknown>>> {
  const lines: string[] = [];
  const log = pino(
    { level, base: undefined, timestamp: false },
    { write: (line: string) => lines.push(line) },
  );
  const app = Fastify({
    loggerInstance: log,
    logController: new LogController({ disableRequestLogging: true }),
    ...(lazy ? { childLoggerFactory: requestLogger } : {}),
    genReqId: () => 'req-1',
  });
  app.get('/', async (request) => {
    request.log.debug({ a: 1 }, 'debug line');
    request.log.info('info line');
    request.log.warn({ err: new Error('boom') }, 'warn line');
    request.log.child({ step: 'x' }).error('child line');
    return { level: request.log.level, enabled: request.log.isLevelEnabled('info') };
  });
  const res = await app.inject({ method: 'GET', url: '/' });
  expect(res.statusCode).toBe(200);
  lines.push(res.body);
  await app.close();
  return lines.map((l) => JSON.parse(l));
}

describe('the lazy request logger', () => {
  it('writes what fastify’s child logger writes, at every level', async () => {
    for (const level of ['trace', 'debug', 'info', 'warn', 'error', 'silent']) {
      const strip = (lines: Array<Record<string, unknown>>) =>
        lines.map(({ err, ...rest }) => ({ ...rest, err: (err as { message?: string })?.message }));
      expect(strip(await linesOf(true, level))).toEqual(strip(await linesOf(false, level)));
    }
  });

  it('makes no child logger for a request that writes nothing', () => {
    let children = 0;
    const parent = pino({ level: 'warn' }, { write: () => {} });
    const counting = Object.assign(Object.create(parent), {
      child: (...args: Parameters<typeof parent.child>) => {
        children++;
        return parent.child(...args);
      },
    }) as typeof parent;
    const log = requestLogger(counting, { reqId: 'req-1' }, {});
    log.debug('nothing');
    log.info('nothing');
    expect(children).toBe(0);
    log.warn('something');
    log.error('more');
    expect(children).toBe(1);
  });
});
