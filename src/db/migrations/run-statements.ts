import { type Kysely, sql } from 'kysely';

/**
 * Runs a block of semicolon-separated DDL one statement at a time (the embedded database accepts one
 * statement per query). Statements must end with `;` at the end of a line.
 */
export async function runStatements(db: Kysely<unknown>, text: string): Promise<void> {
  for (const statement of text.split(/;\s*$/m)) {
    if (statement.trim()) await sql.raw(statement).execute(db);
  }
}
