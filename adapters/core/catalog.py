"""What a database contributes to the migration runner, as types: its catalog's view
of a column and an index, the executor a migration runs statements on, and the
``MigrationDialect`` protocol each database implements (``adapters/<database>/migration.py``).

Kept apart from the runner (``migrations``) so that a database's migration module
imports only these types, and the backend registry that names the databases
(``dialects``) closes no import circle with the runner that uses it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy.engine import Dialect as SqlDialect

from .migration_report import Check
from .tables import ColumnSpec, TableSpec

__all__ = ["CatalogColumn", "CatalogIndex", "Executor", "MigrationDialect"]


@dataclasses.dataclass(frozen=True, slots=True)
class CatalogColumn:
    """A column as the database's catalog describes it."""

    name: str
    type_key: str
    """Normalized type: varchar, char, text, integer, bigint, boolean, datetime,
    timestamptz, timestamp, json, jsonb, uuid, or the declared name lowercased."""
    length: int | None
    notnull: bool
    default: str | None
    deterministic: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class CatalogIndex:
    name: str
    unique: bool
    partial: bool
    columns: tuple[str, ...]
    expression_sql: str | None
    """The index's definition when a key is an expression, else None."""
    exact: bool
    """Every key compares exactly (SQLite BINARY; PostgreSQL a deterministic collation)."""


class Executor(Protocol):
    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]: ...


class MigrationDialect(Protocol):
    """What one database contributes to the migration runner."""

    name: str
    sql_dialect: SqlDialect
    placeholder: str
    """The first positional parameter's spelling (``?`` or ``$1``)."""

    async def begin(self, tx: Executor) -> None: ...

    async def schema_checks(self, tx: Executor, schema: str | None, *, explicit: bool,
                            adopted: Sequence[str]) -> list[Check]:
        """Whether the target schema is the one that holds the tables other clients
        create (``adopted``, by name): where another schema holds them and the target
        none, a failed check naming it."""
        ...

    async def columns(self, tx: Executor, table: str, schema: str | None) -> dict[str, CatalogColumn]: ...

    async def indexes(self, tx: Executor, table: str, schema: str | None) -> list[CatalogIndex]: ...

    def type_check(self, column: ColumnSpec, found: CatalogColumn) -> tuple[str, str | None]: ...

    def default_check(self, column: ColumnSpec, default: str | None) -> tuple[str, str | None]: ...

    async def probe(self, tx: Executor, spec: TableSpec, schema: str | None) -> list[Check]: ...

    def bookkeeping_ddl(self, schema: str | None) -> list[str]: ...

    def bookkeeping_tables(self) -> tuple[str, ...]: ...

    async def lock_tables(self, tx: Executor, schema: str | None, tables: Sequence[str]) -> None:
        """Lock the tables (by name, those present) against every other writer until the
        transaction ends."""
        ...

    async def replace_checks(self, tx: Executor, spec: TableSpec, schema: str | None) -> None:
        """Re-create the table's CHECK constraints as its spec declares them now."""
        ...

    def now_sql(self) -> str: ...

    # --- the row version (step versions_v1; see tenure.adapters.core.tables.ROW_VERSION) ---

    def row_version_setup(self, schema: str | None) -> list[str]:
        """Statements run once before any table's trigger (a trigger function)."""
        ...

    def row_version_ddl(self, spec: TableSpec, schema: str | None) -> list[str]:
        """(Re-)create the trigger that raises the table's row version on every UPDATE."""
        ...

    def row_version_drop(self, spec: TableSpec, schema: str | None) -> list[str]:
        """Remove that trigger (before its column is dropped)."""
        ...

    def row_version_teardown(self, schema: str | None) -> list[str]:
        """Remove what :meth:`row_version_setup` created (after every trigger is gone)."""
        ...

    async def row_version_kept(self, tx: Executor, spec: TableSpec, schema: str | None) -> bool:
        """Whether the table's version trigger exists and is enabled."""
        ...
