import { startMockUpstream } from '../test/helpers/mock-upstream.ts';

/**
 * The benchmark's provider: the tests' mock upstream (a real HTTP server) in its own process, answering
 * 5 tokens with usage, streaming or not, as fast as it can. Prints `{"baseUrl": …}` once listening.
 */
const mock = await startMockUpstream({ record: false, defaults: { tokens: 5, promptTokens: 14 } });
process.stdout.write(`${JSON.stringify({ baseUrl: mock.baseUrl })}\n`);
process.on('SIGTERM', () => {
  mock.close().finally(() => process.exit(0));
});
