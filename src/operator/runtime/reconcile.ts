/**
 * What a reconcile tells the controller to do next, after controller-runtime's `reconcile.Result` and
 * `reconcile.TerminalError`:
 * - a result with `requeueAfterMs`: done for now, look again after that delay (status mirroring);
 * - a result with `requeue`: not done, retry with the work queue's exponential backoff;
 * - a thrown error: retried with backoff, like `requeue`;
 * - a thrown `TerminalError`: not retried (only a change to the object brings the key back).
 */
export interface Result {
  /** Reconcile the key again after this delay (its backoff is forgotten). */
  requeueAfterMs?: number;
  /** Retry with exponential backoff. */
  requeue?: boolean;
}

/** An error retrying cannot fix: the controller logs it, forgets the key's backoff and does not requeue. */
export class TerminalError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = 'TerminalError';
  }
}

export const isTerminal = (err: unknown): err is TerminalError => err instanceof TerminalError;
