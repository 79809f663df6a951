"""What SQLite contributes to the migration runner (see :mod:`tenure.adapters.wiring.migrations`).

The whole migration runs in one ``BEGIN IMMEDIATE`` transaction. The catalog comes from
``PRAGMA table_info``/``index_list``/``index_xinfo``. SQLite-specific rules:

* types, by declared name: text columns need text affinity (``VARCHAR``, ``CHAR``,
  ``TEXT``: SQLite neither pads nor truncates), integers an integer type, flags
  ``BOOLEAN``, instants ``DATETIME`` (SQLAlchemy's text), JSON ``JSON`` or ``TEXT``;
  tenure's identity columns must be declared ``VARCHAR(255)`` or wider;
* defaults: ``generation`` ``0`` or ``'0'``; ``fence_required`` ``0``, ``'0'`` or
  ``false``/``FALSE`` (a quoted ``'false'`` is a truthy text and refuses);
* unique indexes compare exactly only with BINARY collation;
* a native collation probe: inside a savepoint, rows whose identities differ only by
  case and by a trailing space are inserted (every NOT NULL column filled from the table
  description) and must all coexist and be found exactly; the savepoint is rolled back,
  so no probe row or object remains. An insert the database refuses for another reason
  is reported as such (``probe_insert_refused``), never as a collation problem.

These checks run at migration time only; privileged schema changes made afterwards are
outside their guarantee. Each table's row version is raised by an AFTER UPDATE trigger
(SQLite's triggers cannot change ``NEW``); a rebuild keeps the versions and the trigger.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sqlalchemy.schema import CreateIndex, CreateTable

from tenure.model import TenureError

from ..core.catalog import CatalogColumn, CatalogIndex, Executor
from ..core.migration_report import Check, refuse_if_failed
from ..core.schema import CLOCK_TABLE, clock_ddl, row_version_column_ddl
from ..core.tables import (
    ROW_VERSION,
    SQLITE_DIALECT,
    ColumnSpec,
    TableSpec,
    instant_to_sqlite_text,
    sql_dialect,
)
from .store import wall_clock_us

__all__ = ["SQLITE_MIGRATION", "SqliteMigration"]

_DECLARED = re.compile(r"\s*([A-Za-z ]+?)\s*(?:\(\s*(\d+)\s*(?:,\s*\d+\s*)?\))?\s*")


def _type_key(declared: str) -> tuple[str, int | None]:
    match = _DECLARED.fullmatch(declared or "")
    if match is None:
        return declared.lower(), None
    name = " ".join(match.group(1).lower().split())
    length = int(match.group(2)) if match.group(2) else None
    keys = {
        "varchar": "varchar", "character varying": "varchar", "nvarchar": "varchar",
        "char": "char", "character": "char", "text": "text", "clob": "text",
        "integer": "integer", "int": "integer", "bigint": "bigint", "smallint": "smallint",
        "boolean": "boolean", "datetime": "datetime", "json": "json",
    }
    return keys.get(name, name), length


class SqliteMigration:
    name = "sqlite"
    sql_dialect = sql_dialect("sqlite")
    placeholder = "?"

    async def begin(self, tx: Executor) -> None:
        """The transaction is already ``BEGIN IMMEDIATE``: the file's write lock is held."""

    async def schema_checks(self, tx: Executor, schema: str | None, *, explicit: bool,
                            adopted: Sequence[str]) -> list[Check]:
        return []

    async def columns(self, tx: Executor, table: str, schema: str | None) -> dict[str, CatalogColumn]:
        found = {}
        for row in await tx.execute(f"PRAGMA table_info({table})"):
            type_key, length = _type_key(row[2] or "")
            found[row[1]] = CatalogColumn(row[1], type_key, length, bool(row[3]), None if row[4] is None else str(row[4]))
        return found

    async def indexes(self, tx: Executor, table: str, schema: str | None) -> list[CatalogIndex]:
        indexes = []
        for _seq, name, unique, _origin, partial in await tx.execute(f"PRAGMA index_list({table})"):
            info = [row for row in await tx.execute(f"PRAGMA index_xinfo({name})") if row[5] == 1]  # key columns
            expression = None
            if any(row[1] == -2 for row in info):  # an expression key, such as lower(claim_token)
                rows = await tx.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?", [name])
                expression = rows[0][0] if rows else ""
            columns = tuple(row[2] for row in info if row[1] >= 0)
            exact = all((row[4] or "BINARY").upper() == "BINARY" for row in info)
            indexes.append(CatalogIndex(name, bool(unique), bool(partial), columns, expression, exact))
        return indexes

    def type_check(self, column: ColumnSpec, found: CatalogColumn) -> tuple[str, str | None]:
        key = found.type_key
        if column.admission in ("identity", "text"):
            ok = key == "varchar" and (found.length is None or found.length >= 255)
            return "declared VARCHAR(255) or wider", None if ok else "not_canonical_varchar"
        if column.admission == "document":
            return "declared TEXT", None if key == "text" else "not_text_type"
        base = column.codec.base
        if base in ("text", "enum"):
            return "a text type", None if key in ("varchar", "char", "text") else "not_text_type"
        if base == "int":
            return "an integer type", None if key in ("integer", "bigint") else "not_integer_type"
        if base == "flag":
            return "declared BOOLEAN", None if key == "boolean" else "not_boolean_type"
        if base == "instant":
            return "declared DATETIME (SQLAlchemy's text instants)", None if key == "datetime" else "not_datetime_type"
        return "declared JSON or TEXT", None if key in ("json", "text") else "not_json_type"

    def default_check(self, column: ColumnSpec, default: str | None) -> tuple[str, str | None]:
        text = None if default is None else default.strip()
        if column.admission in ("identity", "text", "document"):
            ok = text is None or text.upper() == "NULL"
            return "no default", None if ok else "default_manufactures_identity"
        if column.admission == "generation":
            return "default 0", None if text in ("0", "'0'") else "default_not_zero"
        ok = text in ("0", "'0'", "false", "FALSE")
        return "default false", None if ok else "default_not_false"

    async def probe(self, tx: Executor, spec: TableSpec, schema: str | None) -> list[Check]:
        """Identities differing only by case or a trailing space must be distinct values
        (the tables other clients create, whose identity columns tenure adds: those with a
        :attr:`~tenure.adapters.core.tables.TableSpec.probe_row`; tenure's own tables
        compare with SQLite's BINARY default)."""
        probe_row = spec.probe_row
        if probe_row is None:
            return []
        table = spec.name
        insert = f"INSERT INTO {table} ({', '.join(spec.column_names)}) VALUES ({', '.join('?' for _ in spec.columns)})"
        await tx.execute("SAVEPOINT tenure_probe")
        problem: str | None = None
        try:
            for number, identity in enumerate(("Case", "case", "case ")):
                row = probe_row(SQLITE_DIALECT, str(number + 1), identity, wall_clock_us())
                try:
                    await tx.execute(insert, [row[name] for name in spec.column_names])
                except TenureError as error:
                    collided = number > 0 and error.reason == "constraint_violated"
                    # A unique index saw two spellings as one; anything else is the insert
                    # itself refused (a trigger, a CHECK, a column tenure did not fill).
                    problem = "identities_not_compared_exactly" if collided else "probe_insert_refused"
                    break
            if problem is None:
                for column in spec.exact_unique_columns:
                    rows = await tx.execute(f"SELECT count(*) FROM {table} WHERE {column} = ?", ["tenure-probe-case"])
                    if rows[0][0] != 1:
                        problem = "identities_not_compared_exactly"
        finally:
            await tx.execute("ROLLBACK TO SAVEPOINT tenure_probe")
            await tx.execute("RELEASE SAVEPOINT tenure_probe")
        return [
            Check(table, column, "exact comparison (native probe, rolled back)", problem is None, problem or "")
            for column in spec.exact_unique_columns
        ]

    def bookkeeping_ddl(self, schema: str | None) -> list[str]:
        return clock_ddl()

    def bookkeeping_tables(self) -> tuple[str, ...]:
        return (CLOCK_TABLE,)

    async def lock_tables(self, tx: Executor, schema: str | None, tables: Sequence[str]) -> None:
        """The write transaction already excludes every other writer."""

    async def replace_checks(self, tx: Executor, spec: TableSpec, schema: str | None) -> None:
        """SQLite cannot alter a constraint: the table is rebuilt in the migration's
        transaction (sqlite.org/lang_altertable.html, "other kinds of table schema
        changes"): renamed aside, created again as the spec declares it (every column
        and index), its rows copied, the old one dropped. A column the spec does not
        declare would be lost, so it refuses instead."""
        found = list(await self.columns(tx, spec.name, schema))
        foreign = [name for name in found if name not in spec.column_names and name != ROW_VERSION]
        refuse_if_failed([Check(spec.name, name, "declared by tenure", False, "unknown_column") for name in foreign])
        aside = f"{spec.name}__before_rebuild"
        await tx.execute(f"ALTER TABLE {spec.name} RENAME TO {aside}")
        for (index,) in await tx.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL", [aside]):
            await tx.execute(f"DROP INDEX {index}")  # the new table's indexes take their names
        table = spec.sqlalchemy_table(schema, steps=spec.steps)
        await tx.execute(str(CreateTable(table).compile(dialect=self.sql_dialect)).strip())
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            await tx.execute(str(CreateIndex(index).compile(dialect=self.sql_dialect)).strip())
        if ROW_VERSION in found:  # kept with the rows, and kept raised by a new trigger
            await tx.execute(row_version_column_ddl(spec, self.sql_dialect, schema))
        columns = ", ".join(found)
        await tx.execute(f"INSERT INTO {spec.name} ({columns}) SELECT {columns} FROM {aside}")
        await tx.execute(f"DROP TABLE {aside}")
        if ROW_VERSION in found:
            for statement in self.row_version_ddl(spec, schema):
                await tx.execute(statement)

    def now_sql(self) -> str:
        return f"'{instant_to_sqlite_text(wall_clock_us())}'"

    # SQLite's triggers cannot change NEW: an AFTER UPDATE trigger raises the version in
    # a second write when the statement did not raise it itself (recursive triggers are
    # off by default; were they on, the WHEN clause stops after that one write).

    def row_version_setup(self, schema: str | None) -> list[str]:
        return []

    def row_version_ddl(self, spec: TableSpec, schema: str | None) -> list[str]:
        key = next(column.name for column in spec.columns if column.primary_key)
        return [
            *self.row_version_drop(spec, schema),
            f"CREATE TRIGGER {_version_trigger(spec)} AFTER UPDATE ON {spec.name} FOR EACH ROW "
            f"WHEN NEW.{ROW_VERSION} <= OLD.{ROW_VERSION} BEGIN "
            f"UPDATE {spec.name} SET {ROW_VERSION} = OLD.{ROW_VERSION} + 1 WHERE {key} = NEW.{key}; END",
        ]

    def row_version_drop(self, spec: TableSpec, schema: str | None) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {_version_trigger(spec)}"]

    def row_version_teardown(self, schema: str | None) -> list[str]:
        return []

    async def row_version_kept(self, tx: Executor, spec: TableSpec, schema: str | None) -> bool:
        rows = await tx.execute("SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name = ? AND tbl_name = ?",
                                [_version_trigger(spec), spec.name])
        return bool(rows[0][0])


def _version_trigger(spec: TableSpec) -> str:
    """SQLite names triggers per database: one per table."""
    return f"{spec.name}_{ROW_VERSION}"


SQLITE_MIGRATION = SqliteMigration()
