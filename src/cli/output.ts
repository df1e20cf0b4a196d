/** CLI output: human-readable lines by default, one JSON document with --json. */
export interface Output {
  json: boolean;
  /** Prints a result: the object as JSON, or the human lines. */
  result(value: unknown, human: string | string[]): void;
  info(line: string): void;
}

export function createOutput(json: boolean): Output {
  return {
    json,
    result(value, human) {
      if (json) process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
      else process.stdout.write(`${(Array.isArray(human) ? human : [human]).join('\n')}\n`);
    },
    info(line) {
      if (!json) process.stderr.write(`${line}\n`);
    },
  };
}
