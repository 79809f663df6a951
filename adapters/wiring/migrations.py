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

Step ``versions_v1`` gives every table a ``row_version`` that an update trigger raises
(see :data:`tenure.adapters.core.tables.ROW_VERSION`); the upgrade checks each trigger is
in place and re-creates one that went missing.

``downgrade`` locks first, then refuses while protected submissions or live owned claims
remain; otherwise it removes everything the owned step added (columns, indexes,
``tenure_migrations``, ``tenure_clock``), leaving pycharter's tables exactly as pycharter
creates them. It never changes SQLite's journal mode.

``dry_run=True`` runs every statement and rolls back: the report lists the statements
(``tenure migrate --sql`` prints them for review in one's own migration workflow).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tenure.model import ConfigValidationError

from ..core.catalog import CatalogColumn, CatalogIndex, Executor, MigrationDialect
from ..core.migration_report import Check, MigrationReport, refuse_if_failed
from ..core.schema import MIGRATIONS_TABLE, migrations_ddl, owned_column_ddl, owned_index_ddl, row_version_column_ddl
from ..core.tables import LEGACY_STEP, ROW_VERSION, VERSIONS_STEP, Step, TableSpec, qualified
from ..queue.table import OWNED_STEP
from .dialects import open_migration_target
from .registry import RECORDED_STEPS, RETIREMENT_GUARDS, STEPS, TABLES

__all__ = [
    "upgrade",
    "downgrade",
    "MigrationReport",
    "Check",
    "OWNED_MIGRATION",
    "RECORDED_STEPS",
    "CatalogColumn",
    "CatalogIndex",
    "MigrationDialect",
]

OWNED_MIGRATION = OWNED_STEP.value
"""The queue's first step, the one every tenure database has."""


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


def _type_checks(dialect: MigrationDialect, spec: TableSpec, found: dict[str, CatalogColumn], steps: set[Step]) -> list[Check]:
    """Every existing column of these steps has a type tenure can read and compare."""
    checks = []
    for column in spec.columns:
        if column.step not in steps:
            continue
        existing = found.get(column.name)
        if existing is None:
            missing = "missing_legacy_column" if column.step == LEGACY_STEP else "missing_column"
            checks.append(Check(spec.name, column.name, "present", False, missing))
            continue
        requirement, problem = dialect.type_check(column, existing)
        checks.append(Check(spec.name, column.name, requirement, problem is None, problem or ""))
        if spec.created_by != LEGACY_STEP and column.step == spec.created_by and not column.admission:
            # tenure's own tables: their nullability is tenure's too.
            wanted_not_null = not column.nullable
            ok = existing.notnull == wanted_not_null or column.primary_key
            checks.append(Check(spec.name, column.name, "NOT NULL" if wanted_not_null else "nullable", ok,
                                "" if ok else "wrong_nullability"))
    return checks


def _owned_column_checks(dialect: MigrationDialect, spec: TableSpec, found: dict[str, CatalogColumn]) -> list[Check]:
    """What admission requires of the columns the owned step adds to existing tables."""
    checks: list[Check] = []
    for column in spec.columns:
        existing = found.get(column.name)
        if not column.admission or existing is None:
            continue
        wanted_not_null = not column.nullable
        nullability_ok = existing.notnull == wanted_not_null
        checks.append(Check(spec.name, column.name, "NOT NULL" if wanted_not_null else "nullable", nullability_ok,
                            "" if nullability_ok else "wrong_nullability"))
        requirement, problem = dialect.default_check(column, existing.default)
        checks.append(Check(spec.name, column.name, requirement, problem is None, problem or ""))
    for name in spec.exact_unique_columns:
        existing = found.get(name)
        if existing is not None:
            checks.append(Check(spec.name, name, "deterministic collation", existing.deterministic,
                                "" if existing.deterministic else "nondeterministic_collation"))
    return checks


def _unique_index_checks(spec: TableSpec, indexes: list[CatalogIndex]) -> list[Check]:
    """Each identity column has one full unique index of its own that compares exactly,
    and no other unique index (partial, over an expression, or differently collated)
    compares it differently."""
    checks = []
    for column in spec.exact_unique_columns:
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


async def _applied_steps(dialect: MigrationDialect, reader: Executor, schema: str | None) -> set[Step]:
    if not await dialect.columns(reader, MIGRATIONS_TABLE, schema):
        return set()
    rows = await reader.execute(f"SELECT name FROM {qualified(schema, MIGRATIONS_TABLE)}")
    names = {name for (name,) in rows}
    return {step for step in STEPS if step.value in names}




async def run_upgrade(dialect: MigrationDialect, tx: Executor, schema: str | None, *, explicit_schema: bool,
                      own_schema: bool = False) -> tuple[list[str], list[Check], list[str]]:
    """The upgrade's statements inside ``tx``: (changed steps, checks, statements).
    ``own_schema``: the schema is a new one of the caller's own (``tenure conform``'s
    scratch schema), so queue tables in another schema are no sign of a mistyped URL."""
    recorder = Recorder(tx)
    reader = _catalog_reader(recorder)
    await dialect.begin(recorder)
    adopted = [spec.name for spec in TABLES if spec.created_by == LEGACY_STEP]
    schema_checks = await dialect.schema_checks(reader, schema, explicit=explicit_schema, adopted=adopted)
    if not own_schema:
        refuse_if_failed(schema_checks, "queue_tables_elsewhere")
    elif any([await dialect.columns(reader, spec.name, schema) for spec in TABLES]):
        # The check it skips is safe to skip only in a schema that holds nothing yet.
        raise ConfigValidationError("own_schema_not_new", fields=("db_schema",), problems=("schema_not_new",))

    async def create_missing(step: Step) -> None:
        for spec in TABLES:
            if spec.created_by == step and not await dialect.columns(reader, spec.name, schema):
                for statement in spec.create_ddl(dialect.sql_dialect, schema):
                    await recorder.execute(statement)

    existed_before = {spec.name for spec in TABLES if await dialect.columns(reader, spec.name, schema)}
    await create_missing(LEGACY_STEP)
    # An existing table must hold every legacy column, each of a type tenure can read.
    legacy_checks: list[Check] = []
    for spec in TABLES:
        if spec.created_by == LEGACY_STEP:
            legacy_checks += _type_checks(dialect, spec, await dialect.columns(reader, spec.name, schema), {LEGACY_STEP})
    refuse_if_failed(legacy_checks)
    applied_before = await _applied_steps(dialect, reader, schema)
    for statement in migrations_ddl(dialect.sql_dialect, schema) + dialect.bookkeeping_ddl(schema):
        await recorder.execute(statement)
    for step in RECORDED_STEPS:
        await create_missing(step)
        for spec in TABLES:
            if spec.created_by == step:
                continue  # created whole above, or existing: its columns are checked below
            existing = await dialect.columns(reader, spec.name, schema)
            for column in spec.columns_of(step):
                if column.name not in existing:
                    await recorder.execute(owned_column_ddl(spec, column, dialect.sql_dialect, schema))
            for index in spec.indexes_of(step):
                await recorder.execute(owned_index_ddl(spec, index, schema))
        if step == VERSIONS_STEP or (step.number > VERSIONS_STEP.number
                                     and any(spec.created_by == step for spec in TABLES)):
            # Every table gets its row version: at versions_v1, and again after a later
            # step that creates one.
            await _keep_row_versions(dialect, recorder, reader, schema)
        for spec in TABLES:
            # A table created before this step keeps the checks it was created with
            # until the step that widened them replaces them (once: the step records).
            if spec.checks_replaced_by == step and step not in applied_before and spec.name in existed_before:
                await dialect.replace_checks(recorder, spec, schema)
    checks = list(legacy_checks)
    later_steps: set[Step] = set(RECORDED_STEPS)
    for spec in TABLES:
        found = await dialect.columns(reader, spec.name, schema)
        table_checks = _type_checks(dialect, spec, found, later_steps)
        table_checks += _owned_column_checks(dialect, spec, found)
        table_checks += _unique_index_checks(spec, await dialect.indexes(reader, spec.name, schema))
        table_checks.append(await _row_version_check(dialect, reader, spec, found, schema))
        if all(check.passed for check in table_checks):
            table_checks += await dialect.probe(recorder, spec, schema)
        checks += table_checks
    refuse_if_failed(checks)
    changed = []
    for step in RECORDED_STEPS:
        if step not in applied_before:
            await recorder.execute(
                f"INSERT INTO {qualified(schema, MIGRATIONS_TABLE)} (name, applied_at) "
                f"VALUES ({dialect.placeholder}, {dialect.now_sql()})",
                [step.value],
            )
            changed.append(step.value)
    return changed, checks, recorder.statements


async def _keep_row_versions(dialect: MigrationDialect, recorder: Recorder, reader: Executor, schema: str | None) -> None:
    """Step versions_v1: every table gets its row version column (existing rows at 0)
    and the trigger that raises it; a table whose trigger went missing gets it again."""
    missing: list[tuple[TableSpec, bool]] = []  # (table, whether it has the column already)
    for spec in TABLES:
        columns = await dialect.columns(reader, spec.name, schema)
        if not columns:
            continue  # created by a later step, which versions it then
        has_column = ROW_VERSION in columns
        if not has_column or not await dialect.row_version_kept(reader, spec, schema):
            missing.append((spec, has_column))
    if not missing:
        return
    for statement in dialect.row_version_setup(schema):
        await recorder.execute(statement)
    for spec, has_column in missing:
        if not has_column:
            await recorder.execute(row_version_column_ddl(spec, dialect.sql_dialect, schema))
        for statement in dialect.row_version_ddl(spec, schema):
            await recorder.execute(statement)


async def _row_version_check(
    dialect: MigrationDialect, reader: Executor, spec: TableSpec, found: dict[str, CatalogColumn], schema: str | None,
) -> Check:
    column = found.get(ROW_VERSION)
    if column is None:
        problem = "missing_row_version"
    elif not column.notnull or column.type_key not in ("bigint", "integer"):
        problem = "row_version_not_a_bigint"
    elif not await dialect.row_version_kept(reader, spec, schema):
        problem = "row_version_trigger_missing"
    else:
        problem = ""
    return Check(spec.name, ROW_VERSION, "raised on every update by a trigger", not problem, problem)


async def run_downgrade(dialect: MigrationDialect, tx: Executor, schema: str | None) -> tuple[list[str], list[Check], list[str]]:
    """Remove every recorded step, the latest first, once nothing any of them protects remains."""
    recorder = Recorder(tx)
    reader = _catalog_reader(recorder)
    await dialect.begin(recorder)
    applied = await _applied_steps(dialect, reader, schema)
    if not applied:
        return [], [], recorder.statements
    await dialect.lock_tables(recorder, schema, [spec.name for spec in TABLES])
    checks: list[Check] = []
    for step in RECORDED_STEPS:
        if step not in applied:
            continue
        for guard in RETIREMENT_GUARDS.get(step, ()):
            if not await dialect.columns(reader, guard.table, schema):
                continue
            condition = guard.condition.replace("?", dialect.placeholder)
            parameters = [True] if "?" in guard.condition else []
            count = (await reader.execute(
                f"SELECT count(*) FROM {qualified(schema, guard.table)} WHERE {condition}", parameters
            ))[0][0]
            checks.append(Check(guard.table, guard.subject, guard.requirement, count == 0,
                                "" if count == 0 else guard.problem))
    refuse_if_failed(checks, "downgrade_refused")
    removed = []
    for step in reversed(RECORDED_STEPS):
        if step not in applied:
            continue
        if step == VERSIONS_STEP:
            for spec in TABLES:
                if ROW_VERSION in await dialect.columns(reader, spec.name, schema):
                    for statement in dialect.row_version_drop(spec, schema):
                        await recorder.execute(statement)
                    await recorder.execute(f"ALTER TABLE {qualified(schema, spec.name)} DROP COLUMN {ROW_VERSION}")
            for statement in dialect.row_version_teardown(schema):
                await recorder.execute(statement)
        for spec in TABLES:
            table = qualified(schema, spec.name)
            if spec.created_by == step:
                await recorder.execute(f"DROP TABLE IF EXISTS {table}")
                continue
            for index in spec.indexes_of(step):
                await recorder.execute(f"DROP INDEX IF EXISTS {qualified(schema, index.name)}")
            existing = await dialect.columns(reader, spec.name, schema)
            for column in spec.columns_of(step):
                if column.name in existing:
                    await recorder.execute(f"ALTER TABLE {table} DROP COLUMN {column.name}")
        removed.append(step.value)
    for name in (MIGRATIONS_TABLE, *dialect.bookkeeping_tables()):
        await recorder.execute(f"DROP TABLE IF EXISTS {qualified(schema, name)}")
    return removed, checks, recorder.statements


async def upgrade(db_url: str, *, schema: str | None = None, dry_run: bool = False,
                  own_schema: bool = False) -> MigrationReport:
    """Apply the legacy schema (if missing) and the additive owned migration, then qualify it.
    ``own_schema`` (PostgreSQL, with a schema named): the schema is new and the caller's
    own, so tables of the same names in another schema are not refused (by default they
    are: ``queue_tables_elsewhere``, the sign of a URL that forgot its schema)."""
    return await _migrate(db_url, schema, dry_run, "upgrade", own_schema=own_schema)


async def downgrade(db_url: str, *, schema: str | None = None, dry_run: bool = False) -> MigrationReport:
    """Remove the owned migration; refused while protected or owned work remains."""
    return await _migrate(db_url, schema, dry_run, "downgrade")


async def _migrate(db_url: str, schema: str | None, dry_run: bool, direction: str, *,
                   own_schema: bool = False) -> MigrationReport:
    # A dry run never creates a missing SQLite file: it must leave no trace.
    target = open_migration_target(db_url, schema, create=direction == "upgrade" and not dry_run)
    result: tuple[list[str], list[Check], list[str]] = ([], [], [])
    try:
        try:
            async with target.store.transaction(write=True) as tx:
                if direction == "upgrade":
                    result = await run_upgrade(target.dialect, tx, target.schema, explicit_schema=target.explicit_schema,
                                               own_schema=own_schema and target.explicit_schema)
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

