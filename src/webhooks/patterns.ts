/**
 * Event patterns of a subscription: `*` (every event, alone), a group `balance.*` (every event whose
 * name starts with `balance.`, at any depth) or an exact name such as `balance.deposit.created`.
 * The one matcher used by the event filter and by the fan-out.
 */
const SEGMENT = '[a-z][a-z0-9_]*';
const NAME = new RegExp(`^${SEGMENT}(\\.${SEGMENT})*$`);
const GROUP = new RegExp(`^${SEGMENT}(\\.${SEGMENT})*\\.\\*$`);

/** Why a pattern list is invalid (a message and the index of the offending entry), or undefined. */
export function patternProblem(patterns: readonly string[]): { index: number; message: string } | undefined {
  if (patterns.length === 0) return { index: -1, message: 'must list at least one event name or pattern' };
  const seen = new Set<string>();
  for (const [index, pattern] of patterns.entries()) {
    if (pattern === '*') {
      if (patterns.length > 1)
        return { index, message: "'*' receives every event and cannot be combined with other names" };
      continue;
    }
    if (pattern.length > 200) return { index, message: 'is longer than 200 characters' };
    if (!NAME.test(pattern) && !GROUP.test(pattern)) {
      return {
        index,
        message: `'${pattern}' is neither an event name (lowercase dotted, e.g. 'balance.deposit.created') nor a group pattern ending in '.*' (e.g. 'balance.*')`,
      };
    }
    if (seen.has(pattern)) return { index, message: `'${pattern}' is listed twice` };
    seen.add(pattern);
  }
  return undefined;
}

/** True when an event type matches one pattern. */
export function patternMatches(pattern: string, type: string): boolean {
  if (pattern === '*') return true;
  if (pattern.endsWith('.*')) return type.startsWith(pattern.slice(0, -1));
  return pattern === type;
}

/** True when an event type matches any of the patterns. */
export function matchesAny(patterns: readonly string[], type: string): boolean {
  for (const pattern of patterns) if (patternMatches(pattern, type)) return true;
  return false;
}
