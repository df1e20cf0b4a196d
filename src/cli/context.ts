import { type AppContext, createContext } from '../app/context.ts';
import type { Config } from '../config/index.ts';

/** Runs a command with a context of its own (no log lines); the context is closed afterwards. */
export async function withContext<T>(config: Config, fn: (ctx: AppContext) => Promise<T>): Promise<T> {
  const ctx = await createContext(config, { log: undefined });
  try {
    return await fn(ctx);
  } finally {
    await ctx.close();
  }
}
