import {
  makeTestCa,
  type Receiver,
  type Responder,
  startReceiver,
  type TestCa,
} from '../helpers/https-receiver.ts';

/**
 * The webhook tests' set-up: a fresh test CA, what the test starts on it (a server or a context, given
 * `WEBHOOK_CA_FILE` and `env`), and an HTTPS receiver with the CA's certificate answering `respond`.
 * close() ends the receiver and what was started, then removes the CA.
 */
export interface WebhookBench<T> {
  ca: TestCa;
  receiver: Receiver;
  started: T;
  close(): Promise<void>;
}

export async function startWebhookBench<T extends { close(): Promise<void> }>(
  start: (env: Record<string, string>) => Promise<T>,
  env: Record<string, string> = {},
  respond?: Responder,
): Promise<WebhookBench<T>> {
  const ca = makeTestCa();
  const started = await start({ WEBHOOK_CA_FILE: ca.caFile, ...env });
  const receiver = await startReceiver(ca, respond);
  return {
    ca,
    receiver,
    started,
    async close() {
      await receiver.close();
      await started.close();
      ca.remove();
    },
  };
}
