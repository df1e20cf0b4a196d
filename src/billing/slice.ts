import type { Units } from '../core/money.ts';

/**
 * A pod's slice of a wallet as the pod knows it (escrow.ts), and what one request reserved of it. Its
 * amounts are units (core/money.ts: whole numbers of 10^-LEDGER_SCALE), exact.
 */

/** What one request reserved of a slice. */
export interface Reservation {
  sliceId: string;
  projectId: string;
  userId: string;
  amount: string;
}

/** One pod's slice of one wallet, as the pod knows it. */
export class Slice {
  readonly id: string;
  readonly projectId: string;
  readonly externalId: string;
  userId = '';
  /** The slice's amount (`holds.amount` once this pod's changes are applied). */
  amount: Units = 0n;
  /** Reserved by this pod's requests in flight. */
  reserved: Units = 0n;
  inFlight = 0;
  /** The number of this pod's last change to the slice (a take or a settle). */
  seq = 0;
  /**
   * The slice's `reserved` as this pod last wrote it (the change numbered `writtenSeq`): what the wallet's
   * visible held amount counts of this slice once that change is applied.
   */
  written: Units = 0n;
  writtenSeq = 0;
  lastUsed = Date.now();
  /** No longer admits requests (given back, swept, or its database state unknown). */
  suspended = false;
  /** The last change of this slice submitted by this pod: resolves once it is applied (or failed). */
  applied: Promise<unknown> = Promise.resolve();
  /** A take of this slice succeeded (its `holds` row exists). */
  taken = false;
  /** A take of this slice in flight. */
  taking: Promise<void> | undefined;
  /** How far below zero its wallet may go (the project's `debtLimit` at the last take). */
  debtLimit = '0';

  constructor(id: string, projectId: string, externalId: string) {
    this.id = id;
    this.projectId = projectId;
    this.externalId = externalId;
  }

  get free(): Units {
    return this.suspended ? 0n : this.unreserved;
  }

  /** The slice less what its requests in flight reserved (what a give-back returns), suspended or not. */
  get unreserved(): Units {
    return this.amount - this.reserved;
  }

  /** A change numbered `seq` writes `reserved` (unless a later one was written already). */
  wrote(seq: number, reserved: Units): void {
    if (seq <= this.writtenSeq) return;
    this.writtenSeq = seq;
    this.written = reserved;
  }

  /** Admits a request reserving `amount` (`units`, the same in units). */
  admit(amount: string, units: Units): Reservation {
    this.reserved += units;
    this.inFlight++;
    this.lastUsed = Date.now();
    return { sliceId: this.id, projectId: this.projectId, userId: this.userId, amount };
  }
}
