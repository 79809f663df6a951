"""The owned migration on PostgreSQL, with the admission checks that qualify a database.

One transaction (PostgreSQL DDL is transactional): the legacy tables are created if
missing, the owned columns and unique indexes added, the result checked from the
catalogs, and either all of it commits or none of it does. The checks:

* the new string columns are ``character varying`` of at least 255 characters (a fixed
  ``character`` or ``text`` column refuses); ``generation`` is ``bigint`` and
  ``fence_required`` ``boolean``;
* ``generation`` and ``fence_required`` are NOT NULL; the identity columns are nullable;
* defaults cannot manufacture identity or invalid values: no default on the identity
  columns; ``generation`` defaults to ``0`` (a quoted numeric ``'0'`` is the same);
  ``fence_required`` to ``false`` (typed quoted ``'false'::boolean`` is the same);
* ``claim_token`` and ``submission_id`` use deterministic collations and each has a
  full unique index of its own (no predicate, no expression, one key column, a
  deterministic collation); no other unique index compares them differently.

Downgrade locks the three tables (ACCESS EXCLUSIVE) before it counts what remains.
"""

from __future__ import annotations

import re
from typing import Any

from tenure.model import ConfigValidationError

from ..migration_report import Check, MigrationReport, refuse_if_failed
from ..schema import (
    MIGRATIONS_TABLE,
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
from .store import PostgresStore, PostgresTransaction

__all__ = ["upgrade_postgres", "downgrade_postgres", "OWNED_MIGRATION"]

OWNED_MIGRATION = "owned_v2"
_DIALECT = dialect_for("postgresql")


async def _columns(tx: PostgresTransaction, table: str) -> dict[str, dict[str, Any]]:
    rows = await tx.execute(
        """SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typname, a.atttypmod,
                  a.attnotnull, pg_get_expr(d.adbin, d.adrelid), coalesce(c.collisdeterministic, true)
             FROM pg_attribute a
             JOIN pg_class r ON r.oid = a.attrelid
             JOIN pg_type t ON t.oid = a.atttypid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_collation c ON c.oid = a.attcollation
            WHERE r.relname = $1 AND r.relnamespace = current_schema()::regnamespace
              AND a.attnum > 0 AND NOT a.attisdropped""",
        [table],
    )
    return {
        name: {"type": shown, "base": base, "typmod": typmod, "notnull": notnull, "default": default,
               "deterministic": deterministic}
        for name, shown, base, typmod, notnull, default, deterministic in rows
    }


def _type_check(kind: str, column: dict[str, Any]) -> tuple[str, str | None]:
    if kind in ("identity", "text"):
        ok = column["base"] == "varchar" and (column["typmod"] < 0 or column["typmod"] - 4 >= 255)
        return "character varying(255) or wider", None if ok else "not_canonical_varchar"
    if kind == "generation":
        return "bigint", None if column["base"] == "int8" else "not_bigint"
    return "boolean", None if column["base"] == "bool" else "not_boolean_type"


def _default_check(kind: str, default: str | None) -> tuple[str, str | None]:
    text = None if default is None else default.strip()
    if kind in ("identity", "text"):
        ok = text is None or text.upper().startswith("NULL")
        return "no default", None if ok else "default_manufactures_identity"
    if kind == "generation":
        ok = text in ("0", "'0'::bigint", "'0'::integer", "(0)::bigint")
        return "default 0", None if ok else "default_not_zero"
    ok = text in ("false", "'false'::boolean", "'f'::boolean")
    return "default false", None if ok else "default_not_false"


async def _index_checks(tx: PostgresTransaction, table: str) -> list[Check]:
    rows = await tx.execute(
        """SELECT a.attname, i.indnatts, i.indpred IS NULL, i.indexprs IS NULL,
                  coalesce(c.collisdeterministic, true)
             FROM pg_index i
             JOIN pg_class r ON r.oid = i.indrelid
             JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum = ANY(i.indkey)
        LEFT JOIN pg_collation c ON c.oid = i.indcollation[array_position(i.indkey::int2[], a.attnum) - 1]
            WHERE r.relname = $1 AND r.relnamespace = current_schema()::regnamespace AND i.indisunique""",
        [table],
    )
    # Unique indexes over expressions (say lower(claim_token)) name no key column: find
    # the columns they mention in their definitions.
    expression_definitions = [
        definition
        for (definition,) in await tx.execute(
            """SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class r ON r.oid = i.indrelid
                WHERE r.relname = $1 AND r.relnamespace = current_schema()::regnamespace
                  AND i.indisunique AND i.indexprs IS NOT NULL""",
            [table],
        )
    ]
    checks = []
    for column in OWNED_UNIQUE_INDEXES:
        found = [(natts, full, plain, deterministic) for name, natts, full, plain, deterministic in rows if name == column]
        exact = [natts == 1 and full and plain and deterministic for natts, full, plain, deterministic in found]
        in_expression = any(re.search(rf"\b{column}\b", definition) for definition in expression_definitions)
        if not found:
            problem: str | None = "missing_full_unique_index"
        elif not all(exact) or in_expression:
            problem = "partial_or_differently_compared_unique_index"
        else:
            problem = None
        checks.append(Check(table, column, "one full unique deterministic index", problem is None, problem or ""))
    return checks


async def admission_checks(tx: PostgresTransaction) -> list[Check]:
    checks: list[Check] = []
    for table in TABLE_NAMES.values():
        columns = await _columns(tx, table)
        for owned in OWNED_COLUMNS:
            found = columns.get(owned.name)
            if found is None:
                checks.append(Check(table, owned.name, "present", False, "missing_column"))
                continue
            requirement, problem = _type_check(owned.kind, found)
            checks.append(Check(table, owned.name, requirement, problem is None, problem or ""))
            wanted_not_null = not owned.nullable
            nullability_ok = found["notnull"] == wanted_not_null
            checks.append(Check(table, owned.name, "NOT NULL" if wanted_not_null else "nullable", nullability_ok,
                                "" if nullability_ok else "wrong_nullability"))
            requirement, problem = _default_check(owned.kind, found["default"])
            checks.append(Check(table, owned.name, requirement, problem is None, problem or ""))
            if owned.name in OWNED_UNIQUE_INDEXES:
                checks.append(Check(table, owned.name, "deterministic collation", found["deterministic"],
                                    "" if found["deterministic"] else "nondeterministic_collation"))
        checks += await _index_checks(tx, table)
    return checks


async def upgrade_postgres(store: PostgresStore) -> MigrationReport:
    applied: list[str] = []
    async with store.transaction(write=True) as tx:
        # One migration at a time: concurrent upgrades wait here rather than racing DDL.
        await tx.execute("SELECT pg_advisory_xact_lock(hashtext('tenure-migrations'))")
        for statement in legacy_table_ddl(_DIALECT):
            await tx.execute(statement)
        legacy_checks = []
        for queue, table in TABLE_NAMES.items():
            existing = await _columns(tx, table)
            legacy_checks += [
                Check(table, column, "legacy column present", column in existing,
                      "" if column in existing else "missing_legacy_column")
                for column in legacy_columns(queue)
            ]
        refuse_if_failed(legacy_checks)
        for statement in legacy_index_ddl(_DIALECT):
            await tx.execute(statement)
        done = await tx.execute(f"SELECT 1 FROM {MIGRATIONS_TABLE} WHERE name = $1", [OWNED_MIGRATION])
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
            await tx.execute(
                f"INSERT INTO {MIGRATIONS_TABLE} (name, applied_at) VALUES ($1, clock_timestamp())", [OWNED_MIGRATION]
            )
            applied.append(OWNED_MIGRATION)
    return MigrationReport("postgresql", tuple(applied), tuple(checks))


async def downgrade_postgres(store: PostgresStore) -> MigrationReport:
    """Remove the owned columns, refusing (after locking the tables) while protected
    submissions or live token-bearing claims remain."""
    async with store.transaction(write=True) as tx:
        present = await tx.execute("SELECT to_regclass($1) IS NOT NULL", [MIGRATIONS_TABLE])
        applied = present[0][0] and await tx.execute(
            f"SELECT 1 FROM {MIGRATIONS_TABLE} WHERE name = $1", [OWNED_MIGRATION]
        )
        if not applied:
            return MigrationReport("postgresql", (), ())
        await tx.execute(f"LOCK TABLE {', '.join(TABLE_NAMES.values())} IN ACCESS EXCLUSIVE MODE")
        checks: list[Check] = []
        for table in TABLE_NAMES.values():
            protected = (await tx.execute(f"SELECT count(*) FROM {table} WHERE fence_required"))[0][0]
            owned = (await tx.execute(
                f"SELECT count(*) FROM {table} WHERE status = 'claimed' AND claim_token IS NOT NULL"
            ))[0][0]
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
            for owned in OWNED_COLUMNS:
                await tx.execute(f"ALTER TABLE {table} DROP COLUMN {owned.name}")
        await tx.execute(f"DELETE FROM {MIGRATIONS_TABLE} WHERE name = $1", [OWNED_MIGRATION])
    return MigrationReport("postgresql", (f"removed {OWNED_MIGRATION}",), tuple(checks))
