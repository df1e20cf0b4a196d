import type { Config } from '../config/index.ts';

/** Entry of `tollgate operator`. */
export async function runOperator(_config: Config, _options: { namespaces: string[] }): Promise<number> {
  process.stderr.write('tollgate operator: the Kubernetes operator is not part of this build yet\n');
  return 1;
}
