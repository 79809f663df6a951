"""The owned migration on SQLite, with the admission checks that qualify a database.

Everything runs in one ``BEGIN IMMEDIATE`` transaction: the legacy tables are created if
missing, the owned columns and unique indexes added, the result checked, and either
all of it commits or none of it does. The checks:

* the new string columns are declared ``VARCHAR`` (a fixed ``CHAR`` or other type
  refuses); ``generation`` is an integer type, ``fence_required`` a ``BOOLEAN``;
* ``generation`` and ``fence_required`` are NOT NULL; the identity columns are nullable;
* defaults cannot manufacture identity or invalid values: no default on the identity
  columns; ``generation`` defaults to ``0`` or ``'0'``; ``fence_required`` to ``0``,
  ``'0'`` or ``false``/``FALSE`` (a quoted ``'false'`` is a truthy text and refuses);
* ``claim_token`` and ``submission_id`` each have a full (non-partial) unique index of
  their own with BINARY collation, and no other unique index compares them differently;
* a native collation probe: inside a savepoint, rows whose identities differ only by
  case and by a trailing space are inserted and must all coexist and be found exactly;
  the savepoint is rolled back, so no probe row or object remains.

These checks run at migration time only; privileged schema changes made afterwards are
outside their guarantee.
"""

from __future__ import annotations

import re
from typing import Any

from tenure.model import ConfigValidationError, QueueKind, TenureError

from ..migration_report import Check, MigrationReport, refuse_if_failed
from ..schema import (
    CLOCK_TABLE,
    MIGRATIONS_TABLE,
    clock_ddl,
    OWNED_COLUMNS,
    OWNED_UNIQUE_INDEXES,
    TABLE_NAMES,
    dialect_for,
    legacy_columns,
    legacy_index_ddl,
    legacy_table_ddl,
    owned_column_ddl,
    owned_index_ddl,
)
from .store import SqliteStore, SqliteTransaction

__all__ = ["upgrade_sqlite", "downgrade_sqlite", "OWNED_MIGRATION"]

OWNED_MIGRATION = "owned_v2"
_DIALECT = dialect_for("sqlite")
_PROBE_PREFIX = "tenure-probe-"


async def _columns(tx: SqliteTransaction, table: str) -> dict[str, dict[str, Any]]:
    rows = await tx.execute(f"PRAGMA table_info({table})")
    return {
        row[1]: {"type": row[2] or "", "notnull": bool(row[3]), "default": row[4]}
        for row in rows
    }


def _type_check(kind: str, declared: str) -> tuple[str, str | None]:
    """(requirement, problem or None) for one owned column's declared type."""
    normalized = declared.strip().upper()
    if kind in ("identity", "text"):
        match = re.fullmatch(r"VARCHAR\s*(\(\s*(\d+)\s*\))?", normalized)
        ok = match is not None and (match.group(2) is None or int(match.group(2)) >= 255)
        return "declared VARCHAR(255) or wider", None if ok else "not_canonical_varchar"
    if kind == "generation":
        ok = normalized in ("INTEGER", "BIGINT", "INT")
        return "declared an integer type", None if ok else "not_integer_type"
    ok = normalized == "BOOLEAN"
    return "declared BOOLEAN", None if ok else "not_boolean_type"


def _default_check(kind: str, default: object) -> tuple[str, str | None]:
    text = None if default is None else str(default).strip()
    if kind in ("identity", "text"):
        ok = text is None or text.upper() == "NULL"
        return "no default", None if ok else "default_manufactures_identity"
    if kind == "generation":
        ok = text in ("0", "'0'")
        return "default 0", None if ok else "default_not_zero"
    ok = text in ("0", "'0'", "false", "FALSE")
    return "default false", None if ok else "default_not_false"


async def _index_checks(tx: SqliteTransaction, table: str) -> list[Check]:
    unique_indexes: dict[str, list[tuple[bool, list[tuple[str, str]]]]] = {}
    expression_sql: list[str] = []
    for _seq, name, unique, _origin, partial in await tx.execute(f"PRAGMA index_list({table})"):
        if not unique:
            continue
        info = [row for row in await tx.execute(f"PRAGMA index_xinfo({name})") if row[5] == 1]  # key columns
        keys = [(row[2], row[4]) for row in info if row[1] >= 0]
        if any(row[1] == -2 for row in info):  # an expression key, such as lower(claim_token)
            expression_sql += [sql or "" for (sql,) in await tx.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?", [name]
            )]
        for column, _collation in keys:
            unique_indexes.setdefault(column, []).append((bool(partial), keys))
    checks = []
    for column in OWNED_UNIQUE_INDEXES:
        found = unique_indexes.get(column, [])
        exact = [
            partial is False and len(keys) == 1 and (keys[0][1] or "BINARY").upper() == "BINARY"
            for partial, keys in found
        ]
        in_expression = any(re.search(rf"\b{column}\b", sql) for sql in expression_sql)
        if not found:
            problem = "missing_full_unique_index"
        elif not all(exact) or in_expression:
            problem = "partial_or_differently_compared_unique_index"
        else:
            problem = None
        checks.append(Check(table, column, "one full unique BINARY index", problem is None, problem or ""))
    return checks


async def _probe_row(tx: SqliteTransaction, queue: QueueKind, suffix: str, identity: str) -> str | None:
    """Insert one probe row; returns a problem when the database refuses it."""
    table = TABLE_NAMES[queue]
    columns = {
        "id": _PROBE_PREFIX + suffix,
        "status": "cancelled",
        "payload_json": "{}",
        "fires_at": 0,
        "created_at": 0,
        "completed_at": 0,
        "attempt": 0,
        "max_attempts": 1,
        "generation": 0,
        "fence_required": 0,
        "claim_token": _PROBE_PREFIX + identity,
        "submission_id": _PROBE_PREFIX + identity,
    }
    if queue is QueueKind.STREAMING:
        columns["cancel_requested"] = 0
    names = ", ".join(columns)
    marks = ", ".join("?" for _ in columns)
    try:
        await tx.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", list(columns.values()))
    except TenureError:
        return "identities_not_compared_exactly"  # a unique index saw two spellings as one
    return None


async def _collation_probe(tx: SqliteTransaction, queue: QueueKind) -> list[Check]:
    """Identities differing only by case or a trailing space must be distinct values."""
    table = TABLE_NAMES[queue]
    await tx.execute("SAVEPOINT tenure_probe")
    problem: str | None = None
    try:
        for suffix, identity in (("1", "Case"), ("2", "case"), ("3", "case ")):
            problem = problem or await _probe_row(tx, queue, suffix, identity)
        if problem is None:
            for column in OWNED_UNIQUE_INDEXES:
                rows = await tx.execute(
                    f"SELECT count(*) FROM {table} WHERE {column} = ?", [_PROBE_PREFIX + "case"]
                )
                if rows[0][0] != 1:
                    problem = "identities_not_compared_exactly"
    finally:
        await tx.execute("ROLLBACK TO SAVEPOINT tenure_probe")
        await tx.execute("RELEASE SAVEPOINT tenure_probe")
    return [
        Check(table, column, "exact comparison (native probe, rolled back)", problem is None, problem or "")
        for column in OWNED_UNIQUE_INDEXES
    ]


async def admission_checks(tx: SqliteTransaction) -> list[Check]:
    checks: list[Check] = []
    for queue, table in TABLE_NAMES.items():
        columns = await _columns(tx, table)
        for owned in OWNED_COLUMNS:
            found = columns.get(owned.name)
            if found is None:
                checks.append(Check(table, owned.name, "present", False, "missing_column"))
                continue
            requirement, problem = _type_check(owned.kind, found["type"])
            checks.append(Check(table, owned.name, requirement, problem is None, problem or ""))
            wanted_not_null = not owned.nullable
            checks.append(
                Check(
                    table,
                    owned.name,
                    "NOT NULL" if wanted_not_null else "nullable",
                    found["notnull"] == wanted_not_null,
                    "" if found["notnull"] == wanted_not_null else "wrong_nullability",
                )
            )
            requirement, problem = _default_check(owned.kind, found["default"])
            checks.append(Check(table, owned.name, requirement, problem is None, problem or ""))
        checks += await _index_checks(tx, table)
        if all(check.passed for check in checks):
            checks += await _collation_probe(tx, queue)
    return checks


async def upgrade_sqlite(store: SqliteStore) -> MigrationReport:
    applied: list[str] = []
    async with store.transaction(write=True) as tx:
        for statement in legacy_table_ddl(_DIALECT) + clock_ddl():
            await tx.execute(statement)
        # A table that exists but lacks legacy columns is not ours to repair.
        legacy_checks = [
            Check(table, column, "legacy column present", column in existing, "" if column in existing else "missing_legacy_column")
            for queue, table in TABLE_NAMES.items()
            for existing in [await _columns(tx, table)]
            for column in legacy_columns(queue)
        ]
        refuse_if_failed(legacy_checks)
        for statement in legacy_index_ddl(_DIALECT):
            await tx.execute(statement)
        done = await tx.execute(f"SELECT 1 FROM {MIGRATIONS_TABLE} WHERE name = ?", [OWNED_MIGRATION])
        for table in TABLE_NAMES.values():
            existing = await _columns(tx, table)
            for owned in OWNED_COLUMNS:
                if owned.name not in existing:
                    await tx.execute(owned_column_ddl(table, owned, _DIALECT))
            for column in OWNED_UNIQUE_INDEXES:
                await tx.execute(owned_index_ddl(table, column))
        checks = await admission_checks(tx)
        refuse_if_failed(checks)
        if not done:
            now = await tx.now_us()
            await tx.execute(f"INSERT INTO {MIGRATIONS_TABLE} (name, applied_at) VALUES (?, ?)", [OWNED_MIGRATION, now])
            applied.append(OWNED_MIGRATION)
    return MigrationReport("sqlite", tuple(applied), tuple(checks))


async def downgrade_sqlite(store: SqliteStore) -> MigrationReport:
    """Remove the owned columns, refusing (under the write lock) while protected
    submissions or live token-bearing claims remain."""
    async with store.transaction(write=True) as tx:
        done = await tx.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [MIGRATIONS_TABLE]
        )
        applied = done and await tx.execute(f"SELECT 1 FROM {MIGRATIONS_TABLE} WHERE name = ?", [OWNED_MIGRATION])
        if not applied:
            return MigrationReport("sqlite", (), ())
        checks: list[Check] = []
        for table in TABLE_NAMES.values():
            protected = (await tx.execute(f"SELECT count(*) FROM {table} WHERE fence_required != 0"))[0][0]
            owned = (
                await tx.execute(
                    f"SELECT count(*) FROM {table} WHERE status = 'claimed' AND claim_token IS NOT NULL"
                )
            )[0][0]
            checks.append(Check(table, "fence_required", "no protected submissions", protected == 0,
                                "" if protected == 0 else "protected_submissions_remain"))
            checks.append(Check(table, "claim_token", "no live owned claims", owned == 0,
                                "" if owned == 0 else "owned_claims_remain"))
        failed = [check for check in checks if not check.passed]
        if failed:
            raise ConfigValidationError(
                "downgrade_refused",
                fields=tuple(f"{check.table}.{check.subject}" for check in failed),
                problems=tuple(check.problem for check in failed),
            )
        for table in TABLE_NAMES.values():
            for column in OWNED_UNIQUE_INDEXES:
                await tx.execute(f"DROP INDEX IF EXISTS ux_{table}_{column}")
            for owned in OWNED_COLUMNS:
                await tx.execute(f"ALTER TABLE {table} DROP COLUMN {owned.name}")
        await tx.execute(f"DROP TABLE IF EXISTS {CLOCK_TABLE}")
        await tx.execute(f"DELETE FROM {MIGRATIONS_TABLE} WHERE name = ?", [OWNED_MIGRATION])
    return MigrationReport("sqlite", (f"removed {OWNED_MIGRATION}",), tuple(checks))
