"""Applying and removing the owned migration: ``upgrade(db_url)`` and ``downgrade(db_url)``.

One runner serves every database; a dialect contributes only how to read its catalog,
which stored types it accepts and how it locks (``adapters/<dialect>/migration.py``).

``upgrade`` runs in one transaction: it creates the legacy queue tables where missing
(exactly pycharter's), checks that every existing column tenure reads or compares has
a type it can handle, adds the owned columns, indexes and bookkeeping tables, and
qualifies the result (types, nullability and defaults of the owned columns, full unique
indexes that compare identities exactly, and on SQLite a native collation probe rolled
back inside a savepoint). A wrongly prepared database is refused with
``ConfigValidationError`` naming each failed check, and left exactly as it was. On
PostgreSQL, when the target schema holds no queue tables but another schema does
(pycharter keeps them in ``pycharter``), the upgrade refuses and names that schema
instead of creating empty tables beside them.

``downgrade`` locks first, then refuses while protected submissions or live owned claims
remain; otherwise it removes everything the owned step added (columns, indexes,
``tenure_migrations``, ``tenure_clock``), leaving pycharter's tables exactly as pycharter
creates them. It never changes SQLite's journal mode.

``dry_run=True`` runs every statement and rolls back: the report lists the statements
(``tenure migrate --sql`` prints them for review in one's own migration workflow).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy.engine import Dialect as SqlDialect

from tenure.model import QueueKind

from .dialects import open_migration_target
from .migration_report import Check, MigrationReport, refuse_if_failed
from .queue.table import OWNED_UNIQUE_COLUMNS, QUEUE_TABLES
from .schema import MIGRATIONS_TABLE, migrations_ddl, owned_column_ddl, owned_index_ddl
from .tables import ColumnSpec, Step, TableSpec, qualified

__all__ = [
    "upgrade",
    "downgrade",
    "MigrationReport",
    "Check",
    "OWNED_MIGRATION",
    "CatalogColumn",
    "CatalogIndex",
    "MigrationDialect",
]

OWNED_MIGRATION = "owned_v2"


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

    async def schema_checks(self, tx: Executor, schema: str | None, *, explicit: bool) -> list[Check]: ...

    async def columns(self, tx: Executor, table: str, schema: str | None) -> dict[str, CatalogColumn]: ...

    async def indexes(self, tx: Executor, table: str, schema: str | None) -> list[CatalogIndex]: ...

    def type_check(self, column: ColumnSpec, found: CatalogColumn) -> tuple[str, str | None]: ...

    def default_check(self, column: ColumnSpec, default: str | None) -> tuple[str, str | None]: ...

    async def probe(self, tx: Executor, queue: QueueKind, schema: str | None) -> list[Check]: ...

    def bookkeeping_ddl(self, schema: str | None) -> list[str]: ...

    def bookkeeping_tables(self) -> tuple[str, ...]: ...

    async def lock_tables(self, tx: Executor, schema: str | None) -> None: ...

    def now_sql(self) -> str: ...


class Recorder:
    """Runs each statement on the transaction and keeps its text, in order."""

    def __init__(self, tx: Executor) -> None:
        self._tx = tx
        self.statements: list[str] = []

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        self.statements.append(sql)
        return await self._tx.execute(sql, list(parameters))

    async def read(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        """A catalog read: not a migration statement, so not recorded."""
        return await self._tx.execute(sql, list(parameters))


class _DryRun(Exception):
    """Raised inside the transaction to roll a dry run back."""


def _catalog_reader(recorder: Recorder) -> Executor:
    class Reader:
        async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
            return await recorder.read(sql, parameters)

    return Reader()


def _legacy_checks(dialect: MigrationDialect, spec: TableSpec, found: dict[str, CatalogColumn]) -> list[Check]:
    checks = []
    for column in spec.columns_of(Step.LEGACY):
        existing = found.get(column.name)
        if existing is None:
            checks.append(Check(spec.name, column.name, "legacy column present", False, "missing_legacy_column"))
            continue
        requirement, problem = dialect.type_check(column, existing)
        checks.append(Check(spec.name, column.name, requirement, problem is None, problem or ""))
    return checks


def _owned_column_checks(dialect: MigrationDialect, spec: TableSpec, found: dict[str, CatalogColumn]) -> list[Check]:
    checks: list[Check] = []
    for column in spec.columns_of(Step.OWNED):
        existing = found.get(column.name)
        if existing is None:
            checks.append(Check(spec.name, column.name, "present", False, "missing_column"))
            continue
        requirement, problem = dialect.type_check(column, existing)
        checks.append(Check(spec.name, column.name, requirement, problem is None, problem or ""))
        wanted_not_null = not column.nullable
        nullability_ok = existing.notnull == wanted_not_null
        checks.append(Check(spec.name, column.name, "NOT NULL" if wanted_not_null else "nullable", nullability_ok,
                            "" if nullability_ok else "wrong_nullability"))
        requirement, problem = dialect.default_check(column, existing.default)
        checks.append(Check(spec.name, column.name, requirement, problem is None, problem or ""))
        if column.name in OWNED_UNIQUE_COLUMNS:
            checks.append(Check(spec.name, column.name, "deterministic collation", existing.deterministic,
                                "" if existing.deterministic else "nondeterministic_collation"))
    return checks


def _unique_index_checks(spec: TableSpec, indexes: list[CatalogIndex]) -> list[Check]:
    """Each identity column has one full unique index of its own that compares exactly,
    and no other unique index (partial, over an expression, or differently collated)
    compares it differently."""
    checks = []
    for column in OWNED_UNIQUE_COLUMNS:
        found = [index for index in indexes if index.unique and column in index.columns]
        exact = [not index.partial and index.columns == (column,) and index.exact for index in found]
        in_expression = any(
            index.unique and index.expression_sql is not None and re.search(rf"\b{column}\b", index.expression_sql)
            for index in indexes
        )
        if not found:
            problem: str | None = "missing_full_unique_index"
        elif not all(exact) or in_expression:
            problem = "partial_or_differently_compared_unique_index"
        else:
            problem = None
        checks.append(Check(spec.name, column, "one full unique index comparing exactly", problem is None, problem or ""))
    return checks


async def _applied(dialect: MigrationDialect, reader: Executor, schema: str | None) -> bool:
    found = await dialect.columns(reader, MIGRATIONS_TABLE, schema)
    if not found:
        return False
    rows = await reader.execute(
        f"SELECT 1 FROM {qualified(schema, MIGRATIONS_TABLE)} WHERE name = {dialect.placeholder}", [OWNED_MIGRATION]
    )
    return bool(rows)


async def run_upgrade(dialect: MigrationDialect, tx: Executor, schema: str | None, *, explicit_schema: bool) -> tuple[list[str], list[Check], list[str]]:
    """The upgrade's statements inside ``tx``: (changed steps, checks, statements)."""
    recorder = Recorder(tx)
    reader = _catalog_reader(recorder)
    await dialect.begin(recorder)
    refuse_if_failed(await dialect.schema_checks(reader, schema, explicit=explicit_schema), "queue_tables_elsewhere")
    for spec in QUEUE_TABLES.values():
        if not await dialect.columns(reader, spec.name, schema):
            for statement in spec.create_ddl(dialect.sql_dialect, schema):
                await recorder.execute(statement)
    # An existing table must hold every legacy column, each of a type tenure can read.
    legacy_checks: list[Check] = []
    for spec in QUEUE_TABLES.values():
        legacy_checks += _legacy_checks(dialect, spec, await dialect.columns(reader, spec.name, schema))
    refuse_if_failed(legacy_checks)
    applied_before = await _applied(dialect, reader, schema)
    for statement in migrations_ddl(dialect.sql_dialect, schema) + dialect.bookkeeping_ddl(schema):
        await recorder.execute(statement)
    for spec in QUEUE_TABLES.values():
        existing = await dialect.columns(reader, spec.name, schema)
        for column in spec.columns_of(Step.OWNED):
            if column.name not in existing:
                await recorder.execute(owned_column_ddl(spec, column, dialect.sql_dialect, schema))
        for index in spec.indexes_of(Step.OWNED):
            await recorder.execute(owned_index_ddl(spec, index, schema))
    checks = list(legacy_checks)
    for queue, spec in QUEUE_TABLES.items():
        owned_checks = _owned_column_checks(dialect, spec, await dialect.columns(reader, spec.name, schema))
        owned_checks += _unique_index_checks(spec, await dialect.indexes(reader, spec.name, schema))
        if all(check.passed for check in owned_checks):
            owned_checks += await dialect.probe(recorder, queue, schema)
        checks += owned_checks
    refuse_if_failed(checks)
    changed = []
    if not applied_before:
        await recorder.execute(
            f"INSERT INTO {qualified(schema, MIGRATIONS_TABLE)} (name, applied_at) "
            f"VALUES ({dialect.placeholder}, {dialect.now_sql()})",
            [OWNED_MIGRATION],
        )
        changed.append(OWNED_MIGRATION)
    return changed, checks, recorder.statements


async def run_downgrade(dialect: MigrationDialect, tx: Executor, schema: str | None) -> tuple[list[str], list[Check], list[str]]:
    recorder = Recorder(tx)
    reader = _catalog_reader(recorder)
    await dialect.begin(recorder)
    if not await _applied(dialect, reader, schema):
        return [], [], recorder.statements
    await dialect.lock_tables(recorder, schema)
    checks: list[Check] = []
    for spec in QUEUE_TABLES.values():
        table = qualified(schema, spec.name)
        # Counted in SQL and compared with an integer: a flag is stored as 0/1 on SQLite.
        protected = (await reader.execute(
            f"SELECT count(*) FROM {table} WHERE fence_required = {dialect.placeholder}", [True]
        ))[0][0]
        owned = (await reader.execute(
            f"SELECT count(*) FROM {table} WHERE status = 'claimed' AND claim_token IS NOT NULL"
        ))[0][0]
        checks.append(Check(spec.name, "fence_required", "no protected submissions", protected == 0,
                            "" if protected == 0 else "protected_submissions_remain"))
        checks.append(Check(spec.name, "claim_token", "no live owned claims", owned == 0,
                            "" if owned == 0 else "owned_claims_remain"))
    refuse_if_failed(checks, "downgrade_refused")
    for spec in QUEUE_TABLES.values():
        table = qualified(schema, spec.name)
        for index in spec.indexes_of(Step.OWNED):
            await recorder.execute(f"DROP INDEX IF EXISTS {qualified(schema, index.name)}")
        existing = await dialect.columns(reader, spec.name, schema)
        for column in spec.columns_of(Step.OWNED):
            if column.name in existing:
                await recorder.execute(f"ALTER TABLE {table} DROP COLUMN {column.name}")
    for name in (MIGRATIONS_TABLE, *dialect.bookkeeping_tables()):
        await recorder.execute(f"DROP TABLE IF EXISTS {qualified(schema, name)}")
    return [OWNED_MIGRATION], checks, recorder.statements


async def upgrade(db_url: str, *, schema: str | None = None, dry_run: bool = False) -> MigrationReport:
    """Apply the legacy schema (if missing) and the additive owned migration, then qualify it."""
    return await _migrate(db_url, schema, dry_run, "upgrade")


async def downgrade(db_url: str, *, schema: str | None = None, dry_run: bool = False) -> MigrationReport:
    """Remove the owned migration; refused while protected or owned work remains."""
    return await _migrate(db_url, schema, dry_run, "downgrade")


async def _migrate(db_url: str, schema: str | None, dry_run: bool, direction: str) -> MigrationReport:
    # A dry run never creates a missing SQLite file: it must leave no trace.
    target = open_migration_target(db_url, schema, create=direction == "upgrade" and not dry_run)
    result: tuple[list[str], list[Check], list[str]] = ([], [], [])
    try:
        try:
            async with target.store.transaction(write=True) as tx:
                if direction == "upgrade":
                    result = await run_upgrade(target.dialect, tx, target.schema, explicit_schema=target.explicit_schema)
                else:
                    result = await run_downgrade(target.dialect, tx, target.schema)
                if dry_run:
                    raise _DryRun()
        except _DryRun:
            pass
    finally:
        await target.store.close()
    changed, checks, statements = result
    return MigrationReport(target.dialect.name, direction, tuple(changed), tuple(checks), tuple(statements), dry_run)

