"""What PostgreSQL contributes to the migration runner (see :mod:`tenure.adapters.wiring.migrations`).

One transaction (PostgreSQL DDL is transactional), serialized against concurrent
migrations by an advisory lock; the catalog comes from ``pg_attribute``, ``pg_index``
and ``pg_collation`` in the target schema (the URL's ``schema``, else the connection's
current schema). PostgreSQL-specific rules:

* the schema: when the target schema holds none of the queue tables but another schema
  does (pycharter keeps its tables in ``pycharter``), the upgrade refuses and names it;
  a schema the URL names explicitly is created when missing;
* types: text columns ``character varying``, ``character`` or ``text`` (``id`` may be a
  genuine ``uuid``), integers ``integer`` or ``bigint``, flags ``boolean``, instants
  ``timestamp with time zone``, JSON ``json`` or ``text`` (``jsonb`` rewrites the text it
  stores, so what tenure wrote would not read back: refused); tenure's identity columns
  ``character varying(255)`` or wider, ``generation`` ``bigint``;
* defaults: ``generation`` ``0`` (a quoted numeric ``'0'`` is the same);
  ``fence_required`` ``false`` (typed quoted ``'false'::boolean`` is the same);
* identity columns and their unique indexes use deterministic collations.

Downgrade locks the three tables (ACCESS EXCLUSIVE) before it counts what remains.
"""

from __future__ import annotations

from tenure.model.errors import is_authored_word

from collections.abc import Sequence

from ..core.catalog import CatalogColumn, CatalogIndex, Executor
from ..core.migration_report import Check
from ..core.tables import ROW_VERSION, ColumnSpec, TableSpec, qualified, sql_dialect

__all__ = ["POSTGRESQL_MIGRATION", "PostgresMigration"]

_TYPE_KEYS = {
    "varchar": "varchar", "bpchar": "char", "text": "text", "int2": "smallint", "int4": "integer",
    "int8": "bigint", "bool": "boolean", "timestamptz": "timestamptz", "timestamp": "timestamp",
    "json": "json", "jsonb": "jsonb", "uuid": "uuid",
}
_SCHEMA = "coalesce($2::text, current_schema())"
VERSION_FUNCTION = "tenure_row_version"
"""The trigger function that raises :data:`~tenure.adapters.core.tables.ROW_VERSION`."""
VERSION_SEQUENCE = "tenure_row_versions"
"""Where every version of the schema's rows comes from."""
VERSION_TRIGGER = "tenure_row_version"
"""Its trigger's name on each table (PostgreSQL names triggers per table)."""


class PostgresMigration:
    name = "postgresql"
    sql_dialect = sql_dialect("postgresql")
    placeholder = "$1"

    async def begin(self, tx: Executor) -> None:
        # One migration at a time: concurrent upgrades wait here rather than racing DDL.
        await tx.execute("SELECT pg_advisory_xact_lock(hashtext('tenure-migrations'))")

    async def schema_checks(self, tx: Executor, schema: str | None, *, explicit: bool,
                            adopted: Sequence[str]) -> list[Check]:
        rows = await tx.execute(
            "SELECT table_schema, count(*) FROM information_schema.tables"
            " WHERE table_name = ANY($1::text[]) GROUP BY table_schema ORDER BY table_schema",
            [list(adopted)],
        )
        target = schema
        if target is None:
            target = (await tx.execute("SELECT current_schema()"))[0][0]
        found = {name: count for name, count in rows}
        if target is not None and found.get(target):
            return []
        elsewhere = [name for name in found if name != target]
        if elsewhere:
            # A schema name comes from the catalog, not from a caller's secret: it may be
            # named, when it is a plain word.
            return [
                Check("schema", "queue_tables", "the queue tables are in the target schema", False,
                      f"tables_in_schema_{name}" if is_authored_word(f"tables_in_schema_{name}")
                      else "tables_in_another_schema")
                for name in elsewhere
            ]
        if explicit and schema is not None:
            await tx.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        return []

    async def columns(self, tx: Executor, table: str, schema: str | None) -> dict[str, CatalogColumn]:
        rows = await tx.execute(
            f"""SELECT a.attname, t.typname, a.atttypmod, a.attnotnull, pg_get_expr(d.adbin, d.adrelid),
                       coalesce(c.collisdeterministic, true)
                  FROM pg_attribute a
                  JOIN pg_class r ON r.oid = a.attrelid
                  JOIN pg_namespace n ON n.oid = r.relnamespace
                  JOIN pg_type t ON t.oid = a.atttypid
             LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
             LEFT JOIN pg_collation c ON c.oid = a.attcollation
                 WHERE r.relname = $1 AND n.nspname = {_SCHEMA} AND r.relkind = 'r'
                   AND a.attnum > 0 AND NOT a.attisdropped""",
            [table, schema],
        )
        found = {}
        for name, typname, typmod, notnull, default, deterministic in rows:
            key = _TYPE_KEYS.get(typname, typname)
            length = typmod - 4 if key in ("varchar", "char") and typmod >= 4 else None
            found[name] = CatalogColumn(name, key, length, notnull, default, deterministic)
        return found

    async def indexes(self, tx: Executor, table: str, schema: str | None) -> list[CatalogIndex]:
        rows = await tx.execute(
            f"""SELECT ic.relname, i.indisunique, i.indpred IS NOT NULL,
                       ARRAY(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                             JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum = k.attnum ORDER BY k.ord),
                       CASE WHEN i.indexprs IS NULL THEN NULL ELSE pg_get_indexdef(i.indexrelid) END,
                       coalesce((SELECT bool_and(coalesce(c.collisdeterministic, true))
                                   FROM unnest(i.indcollation) AS k(collation_oid)
                              LEFT JOIN pg_collation c ON c.oid = k.collation_oid), true)
                  FROM pg_index i
                  JOIN pg_class r ON r.oid = i.indrelid
                  JOIN pg_class ic ON ic.oid = i.indexrelid
                  JOIN pg_namespace n ON n.oid = r.relnamespace
                 WHERE r.relname = $1 AND n.nspname = {_SCHEMA}""",
            [table, schema],
        )
        return [
            CatalogIndex(name, unique, partial, tuple(columns), expression, exact)
            for name, unique, partial, columns, expression, exact in rows
        ]

    def type_check(self, column: ColumnSpec, found: CatalogColumn) -> tuple[str, str | None]:
        key = found.type_key
        if column.admission in ("identity", "text"):
            ok = key == "varchar" and (found.length is None or found.length >= 255)
            return "character varying(255) or wider", None if ok else "not_canonical_varchar"
        if column.admission == "document":
            return "text", None if key == "text" else "not_text_type"
        if column.admission == "generation":
            return "bigint", None if key == "bigint" else "not_bigint"
        base = column.codec.base
        if base in ("text", "enum"):
            allowed = ("varchar", "char", "text", "uuid") if column.name == "id" else ("varchar", "char", "text")
            return "a text type", None if key in allowed else "not_text_type"
        if base == "int":
            return "integer or bigint", None if key in ("integer", "bigint") else "not_integer_type"
        if base == "flag":
            return "boolean", None if key == "boolean" else "not_boolean_type"
        if base == "instant":
            return "timestamp with time zone", None if key == "timestamptz" else "not_timestamptz_type"
        if key == "jsonb":
            return "json or text", "jsonb_rewrites_stored_text"
        return "json or text", None if key in ("json", "text") else "not_json_type"

    def default_check(self, column: ColumnSpec, default: str | None) -> tuple[str, str | None]:
        text = None if default is None else default.strip()
        if column.admission in ("identity", "text", "document"):
            ok = text is None or text.upper().startswith("NULL")
            return "no default", None if ok else "default_manufactures_identity"
        if column.admission == "generation":
            ok = text in ("0", "'0'::bigint", "'0'::integer", "(0)::bigint")
            return "default 0", None if ok else "default_not_zero"
        ok = text in ("false", "'false'::boolean", "'f'::boolean")
        return "default false", None if ok else "default_not_false"

    async def probe(self, tx: Executor, spec: TableSpec, schema: str | None) -> list[Check]:
        """Deterministic collations are read from the catalog; no probe row is needed."""
        return []

    def bookkeeping_ddl(self, schema: str | None) -> list[str]:
        return []

    def bookkeeping_tables(self) -> tuple[str, ...]:
        return ()

    async def lock_tables(self, tx: Executor, schema: str | None, tables: Sequence[str]) -> None:
        present = [name for name in tables if await self.columns(tx, name, schema)]
        tables = ", ".join(qualified(schema, name) for name in present)
        await tx.execute(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE")

    async def replace_checks(self, tx: Executor, spec: TableSpec, schema: str | None) -> None:
        table = qualified(schema, spec.name)
        for name, condition in spec.checks:
            await tx.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {name}")
            await tx.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({condition})")

    def now_sql(self) -> str:
        return "clock_timestamp()::text"

    # A BEFORE INSERT OR UPDATE trigger takes the new version from one sequence per
    # schema, whatever the statement wrote: every row state any writer makes gets a
    # version no row of the schema ever had, even a row deleted and inserted again under
    # its old key, or a write whose transaction rolled back (sequences never give a value
    # twice). The sequence is found from the trigger's own table, not the search path.

    def row_version_setup(self, schema: str | None) -> list[str]:
        return [
            f"CREATE SEQUENCE IF NOT EXISTS {qualified(schema, VERSION_SEQUENCE)}",
            f"CREATE OR REPLACE FUNCTION {qualified(schema, VERSION_FUNCTION)}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$BEGIN NEW.{ROW_VERSION} := nextval(quote_ident(TG_TABLE_SCHEMA) || '.{VERSION_SEQUENCE}'); "
            "RETURN NEW; END$$",
        ]

    def row_version_ddl(self, spec: TableSpec, schema: str | None) -> list[str]:
        return [
            *self.row_version_drop(spec, schema),
            f"CREATE TRIGGER {VERSION_TRIGGER} BEFORE INSERT OR UPDATE ON {qualified(schema, spec.name)} "
            f"FOR EACH ROW EXECUTE FUNCTION {qualified(schema, VERSION_FUNCTION)}()",
        ]

    def row_version_drop(self, spec: TableSpec, schema: str | None) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {VERSION_TRIGGER} ON {qualified(schema, spec.name)}"]

    def row_version_teardown(self, schema: str | None) -> list[str]:
        return [f"DROP FUNCTION IF EXISTS {qualified(schema, VERSION_FUNCTION)}()",
                f"DROP SEQUENCE IF EXISTS {qualified(schema, VERSION_SEQUENCE)}"]

    async def row_version_kept(self, tx: Executor, spec: TableSpec, schema: str | None) -> bool:
        rows = await tx.execute(
            f"""SELECT count(*) FROM pg_trigger g
                  JOIN pg_class r ON r.oid = g.tgrelid
                  JOIN pg_namespace n ON n.oid = r.relnamespace
                  JOIN pg_proc f ON f.oid = g.tgfoid
                 WHERE r.relname = $1 AND n.nspname = {_SCHEMA} AND g.tgname = $3 AND f.proname = $4
                   AND g.tgenabled <> 'D' AND g.tgtype & 23 = 23  -- per row (1), before (2), insert (4), update (16)""",
            [spec.name, schema, VERSION_TRIGGER, VERSION_FUNCTION],
        )
        return bool(rows[0][0])


POSTGRESQL_MIGRATION = PostgresMigration()
