import { ApiException } from '@kubernetes/client-node';
import { ApiError } from '../core/errors.ts';
import { kubeErrorMessage, statusOf } from './runtime/kube.ts';

/**
 * Why a reconcile cannot complete, as the resource shows it: the reason of Ready=False, its message, and
 * whether a retry may fix it. How errors of the services and of the Kubernetes API map to reasons.
 */

export interface FailureInfo {
  reason: string;
  message: string;
  retry: boolean;
}

/** A reconcile that cannot complete: its reason becomes Ready=False's reason. */
export class Failure extends Error implements FailureInfo {
  readonly reason: string;
  readonly retry: boolean;
  constructor(reason: string, message: string, retry: boolean) {
    super(message);
    this.reason = reason;
    this.retry = retry;
  }

  static of(info: FailureInfo): Failure {
    return info instanceof Failure ? info : new Failure(info.reason, info.message, info.retry);
  }
}

export const isKubeError = (err: unknown) => statusOf(err) !== undefined || err instanceof ApiException;

/** A Kubernetes API call failed during the reconcile (a 403, a 500, a conflict): retried with backoff. */
export function kubeFailure(err: unknown): FailureInfo {
  return { reason: 'ReconcileError', message: `Kubernetes API: ${kubeErrorMessage(err)}`, retry: true };
}

const DB_ERROR_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EPIPE',
]);

/** How a failed service call shows in the resource: a spec the service refuses, or a transient fault. */
export function classifyServiceError(err: unknown): FailureInfo {
  if (err instanceof ApiError) {
    if (err.status === 400 || err.status === 422) {
      const param = err.param ? ` (${err.param.startsWith('spec.') ? err.param : `spec.${err.param}`})` : '';
      return { reason: 'InvalidSpec', message: `${err.message}${param}`, retry: false };
    }
    if (err.status === 404) return { reason: 'PaywallNotFound', message: err.message, retry: true };
    return { reason: 'ReconcileError', message: err.message, retry: true };
  }
  const code = String((err as { code?: unknown } | null)?.code ?? '');
  // Foreign key violation: the project does not exist.
  if (code === '23503')
    return { reason: 'PaywallNotFound', message: 'spec.paywallId names no paywall', retry: true };
  const message = (err as Error)?.message ?? String(err);
  if (
    DB_ERROR_CODES.has(code) ||
    code.startsWith('08') ||
    code.startsWith('57P') ||
    code.startsWith('53') ||
    /connect|terminat|timeout|pool/i.test(message)
  )
    return { reason: 'DatabaseUnavailable', message: `database unavailable: ${message}`, retry: true };
  return { reason: 'ReconcileError', message, retry: true };
}

/**
 * The failure of a sync or finalize of the deployment's kinds: a Failure as thrown; a 409 of a service
 * (the rows are another resource's, or changed meanwhile); a Kubernetes API error; else the service
 * error's class, a refused spec taking the kind's reason (`InvalidSpec`, `InvalidPrice` for prices) and
 * an unknown project showing as ProjectNotFound.
 */
export function asFailure(err: unknown, invalidReason = 'InvalidSpec'): Failure {
  if (err instanceof Failure) return err;
  if (err instanceof ApiError && err.status === 409)
    return new Failure(
      err.code === 'managed_by_resource' ? 'ManagedElsewhere' : 'Conflict',
      err.message,
      true,
    );
  if (statusOf(err) !== undefined) return Failure.of(kubeFailure(err));
  const f = classifyServiceError(err);
  if (f.reason === 'InvalidSpec') return new Failure(invalidReason, f.message, false);
  if (f.reason === 'PaywallNotFound') return new Failure('ProjectNotFound', f.message, true);
  return Failure.of(f);
}
