import {
  type DatabaseIntrospector,
  type Kysely,
  PGliteDialect,
  PostgresDialect,
  type SchemaMetadata,
  sql,
  type TableMetadata,
} from 'kysely';

/**
 * Kysely's own Postgres introspector (which its migrator uses to find its bookkeeping tables) reads the
 * columns of every table in every schema of the database, calling functions per schema: slow where a
 * database holds many schemas, and failing with "schema … does not exist" when another session drops a
 * schema meanwhile. Tollgate only ever asks about the schema it works in, so this introspector reads
 * the current schema's tables, and schema names, and nothing else.
 */
class CurrentSchemaIntrospector implements DatabaseIntrospector {
  readonly #db: Kysely<unknown>;

  constructor(db: Kysely<unknown>) {
    this.#db = db;
  }

  async getSchemas(): Promise<SchemaMetadata[]> {
    const { rows } = await sql<{ name: string }>`SELECT nspname AS name FROM pg_catalog.pg_namespace`.execute(
      this.#db,
    );
    return rows;
  }

  async getTables(): Promise<TableMetadata[]> {
    const { rows } = await sql<{ name: string; schema: string; kind: string }>`
      SELECT c.relname AS name, n.nspname AS schema, c.relkind AS kind
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'v', 'p', 'f')`.execute(this.#db);
    return rows.map((r) => ({
      name: r.name,
      schema: r.schema,
      isView: r.kind === 'v',
      isForeign: r.kind === 'f',
      columns: [],
    }));
  }

  async getMetadata(): Promise<{ tables: TableMetadata[] }> {
    return { tables: await this.getTables() };
  }
}

export class TollgatePostgresDialect extends PostgresDialect {
  override createIntrospector(db: Kysely<unknown>): DatabaseIntrospector {
    return new CurrentSchemaIntrospector(db);
  }
}

export class TollgatePGliteDialect extends PGliteDialect {
  override createIntrospector(db: Kysely<unknown>): DatabaseIntrospector {
    return new CurrentSchemaIntrospector(db);
  }
}
