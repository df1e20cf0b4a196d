import { type CoordinationV1Api, type V1Lease, V1MicroTime } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { FIELD_MANAGER, isConflict, isNotFound, kubeErrorMessage } from './kube.ts';

/** Replaces refused with 409 retried (after a fresh read) within one acquire/renew round. */
const CONFLICT_RETRIES = 3;

export interface LeaderElectionOptions {
  api: CoordinationV1Api;
  name: string;
  namespace: string;
  identity: string;
  leaseDurationMs: number;
  renewDeadlineMs: number;
  retryPeriodMs: number;
  log: Logger;
  /** Called when this replica becomes leader. */
  onStartedLeading(): void;
  /** Called at once when this replica stops being leader (lost, or released). */
  onStoppedLeading(): void;
  now?: () => number;
}

/**
 * Leader election on a coordination.k8s.io/v1 Lease, the client-go way. Every write is a create or a
 * replace conditional on the resourceVersion read, so two candidates can never both win a round. A
 * candidate takes the lease when it is free, released (no holder) or not renewed for a lease duration as
 * measured by the candidate's own clock since it last saw the record change (no clock-skew assumptions).
 * The leader renews every retry period and steps down when it has not renewed within the renew deadline.
 */
export class LeaderElector {
  readonly #o: LeaderElectionOptions;
  #leading = false;
  #stopped = false;
  #timer: NodeJS.Timeout | undefined;
  #wake: (() => void) | undefined;
  #loop: Promise<void> | undefined;
  /** The record last seen, and when (by our clock) it was first seen. */
  #observed: { holder: string; renewTime: string; resourceVersion: string } | undefined;
  #observedAt = 0;
  #lastRenew = 0;

  constructor(options: LeaderElectionOptions) {
    this.#o = options;
  }

  get isLeader(): boolean {
    return this.#leading;
  }

  #now(): number {
    return this.#o.now?.() ?? Date.now();
  }

  start(): void {
    this.#loop ??= this.#run();
  }

  async #run(): Promise<void> {
    while (!this.#stopped) {
      let ok = false;
      try {
        ok = await this.#tryAcquireOrRenew();
      } catch (err) {
        this.#o.log.warn(
          `leader election: lease ${this.#o.namespace}/${this.#o.name}: ${kubeErrorMessage(err)}`,
        );
      }
      if (this.#stopped) break;
      if (ok) {
        this.#lastRenew = this.#now();
        if (!this.#leading) {
          this.#leading = true;
          this.#o.log.info(`leader election: ${this.#o.identity} is now the leader`);
          this.#o.onStartedLeading();
        }
      } else if (
        this.#leading &&
        (this.#now() - this.#lastRenew >= this.#o.renewDeadlineMs || this.#lostTo())
      ) {
        this.#stepDown(
          this.#lostTo()
            ? `lease taken by ${this.#observed?.holder}`
            : `could not renew within ${this.#o.renewDeadlineMs} ms`,
        );
      }
      await this.#sleep(this.#o.retryPeriodMs);
    }
  }

  #lostTo(): boolean {
    return Boolean(
      this.#observed && this.#observed.holder !== '' && this.#observed.holder !== this.#o.identity,
    );
  }

  #stepDown(why: string): void {
    if (!this.#leading) return;
    this.#leading = false;
    this.#o.log.warn(`leader election: ${this.#o.identity} stopped leading: ${why}`);
    this.#o.onStoppedLeading();
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      this.#timer = setTimeout(resolve, ms);
      this.#wake = () => {
        clearTimeout(this.#timer);
        resolve();
      };
    });
  }

  #observe(lease: V1Lease): void {
    const record = {
      holder: lease.spec?.holderIdentity ?? '',
      renewTime: timeString(lease.spec?.renewTime),
      resourceVersion: lease.metadata?.resourceVersion ?? '',
    };
    if (
      !this.#observed ||
      this.#observed.holder !== record.holder ||
      this.#observed.renewTime !== record.renewTime
    )
      this.#observedAt = this.#now();
    this.#observed = record;
  }

  /**
   * One round: read, then create or replace conditionally. A replace refused with 409 (the record
   * changed between our read and our write: another writer, or a write of ours the read had not seen)
   * is not a verdict on who leads: read again and retry, a bounded number of times in this round.
   */
  async #tryAcquireOrRenew(): Promise<boolean> {
    for (let attempt = 1; ; attempt++) {
      const outcome = await this.#tryOnce();
      if (outcome !== 'conflict') return outcome;
      if (attempt >= CONFLICT_RETRIES || this.#stopped) return false;
    }
  }

  async #tryOnce(): Promise<boolean | 'conflict'> {
    const { api, name, namespace, identity } = this.#o;
    const now = new V1MicroTime(this.#now());
    const durationSeconds = Math.max(1, Math.round(this.#o.leaseDurationMs / 1000));
    let lease: V1Lease;
    try {
      lease = await api.readNamespacedLease({ name, namespace });
    } catch (err) {
      if (!isNotFound(err)) throw err;
      try {
        const created = await api.createNamespacedLease({
          namespace,
          fieldManager: FIELD_MANAGER,
          body: {
            apiVersion: 'coordination.k8s.io/v1',
            kind: 'Lease',
            metadata: { name, namespace },
            spec: {
              holderIdentity: identity,
              leaseDurationSeconds: durationSeconds,
              acquireTime: now,
              renewTime: now,
              leaseTransitions: 0,
            },
          },
        });
        this.#observe(created);
        return true;
      } catch (createErr) {
        if (isConflict(createErr)) return false;
        throw createErr;
      }
    }
    this.#observe(lease);
    const holder = lease.spec?.holderIdentity ?? '';
    const mine = holder === identity;
    if (!mine && holder !== '') {
      const duration = (lease.spec?.leaseDurationSeconds ?? durationSeconds) * 1000;
      if (this.#observedAt + duration > this.#now()) return false;
    }
    const spec = lease.spec ?? {};
    const body: V1Lease = {
      ...lease,
      spec: {
        ...spec,
        holderIdentity: identity,
        leaseDurationSeconds: durationSeconds,
        renewTime: now,
        acquireTime: mine ? spec.acquireTime : now,
        leaseTransitions: mine ? (spec.leaseTransitions ?? 0) : (spec.leaseTransitions ?? 0) + 1,
      },
    };
    try {
      const updated = await api.replaceNamespacedLease({
        name,
        namespace,
        body,
        fieldManager: FIELD_MANAGER,
      });
      this.#observe(updated);
      return true;
    } catch (err) {
      if (isConflict(err)) return 'conflict';
      throw err;
    }
  }

  /**
   * Stops campaigning. A leader gives the lease up (no holder, so the next candidate takes it at its next
   * retry instead of waiting for the lease to expire).
   */
  async stop(options: { release?: boolean } = {}): Promise<void> {
    this.#stopped = true;
    this.#wake?.();
    await this.#loop;
    const wasLeading = this.#leading;
    this.#stepDown('shutting down');
    if (wasLeading && (options.release ?? true)) await this.#release();
  }

  async #release(): Promise<void> {
    const { name, namespace } = this.#o;
    for (let attempt = 1; ; attempt++) {
      try {
        await this.#releaseOnce();
        return;
      } catch (err) {
        if (isConflict(err) && attempt < CONFLICT_RETRIES) continue;
        this.#o.log.warn(
          `leader election: could not release lease ${namespace}/${name}: ${kubeErrorMessage(err)}`,
        );
        return;
      }
    }
  }

  async #releaseOnce(): Promise<void> {
    const { api, name, namespace, identity } = this.#o;
    const lease = await api.readNamespacedLease({ name, namespace });
    if (lease.spec?.holderIdentity !== identity) return;
    const now = new V1MicroTime(this.#now());
    await api.replaceNamespacedLease({
      name,
      namespace,
      fieldManager: FIELD_MANAGER,
      body: {
        ...lease,
        spec: {
          ...lease.spec,
          holderIdentity: '',
          leaseDurationSeconds: 1,
          renewTime: now,
          acquireTime: now,
        },
      },
    });
    this.#o.log.info(`leader election: ${identity} released lease ${namespace}/${name}`);
  }
}

function timeString(value: unknown): string {
  if (value instanceof Date) return value.toISOString();
  return value === undefined || value === null ? '' : String(value);
}
