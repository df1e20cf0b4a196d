/**
 * Polls a condition on stored state (written after a response or a delivery was answered) every 20 ms
 * until it holds; the value it returned. Bounded: throws after `timeoutMs`.
 */
export async function eventually<T>(
  fn: () => Promise<T | undefined | false>,
  timeoutMs = 10_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await fn();
    if (value) return value;
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 20));
  }
}
