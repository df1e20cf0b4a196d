import { ApiError } from './errors.ts';

/**
 * Rows declared by a Kubernetes resource (src/operator/resources) are read-only everywhere else: the admin
 * API, the dashboard and the CLI get a 409 naming the resource. The one check, called by the service
 * functions that write such rows (projects, API keys, providers, models and limits); `managedBy` on a
 * row is `<Kind> <namespace>/<name>`. A writer passing its own `managedBy` (the operator) may write rows
 * it manages and take over rows made by hand; a row managed by another resource is refused to it too.
 */
export function managedConflict(what: string, managedBy: string): ApiError {
  return new ApiError(
    409,
    'conflict_error',
    `${what} is managed by the Kubernetes resource ${managedBy}; change or delete that resource instead.`,
    { code: 'managed_by_resource' },
  );
}

/** Throws the 409 unless `writer` may write a row currently managed by `rowManagedBy`. */
export function assertWritable(
  what: string,
  rowManagedBy: string | null | undefined,
  writer: string | undefined,
): void {
  if (rowManagedBy && rowManagedBy !== writer) throw managedConflict(what, rowManagedBy);
}
