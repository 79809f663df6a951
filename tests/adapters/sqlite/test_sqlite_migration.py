"""The owned migration on SQLite: what it adds, what it refuses, and that a refusal changes nothing."""

from __future__ import annotations

import pathlib
import sqlite3

import pytest

from tenure.adapters import ValidationJobSource, downgrade, upgrade
from tenure.adapters.core.schema import owned_column_ddl
from tenure.adapters.core.tables import sql_dialect
from tenure.adapters.queue.table import OWNED_STEP, QUEUE_TABLES, TABLE_NAMES, legacy_ddl
from tenure.model import ConfigValidationError, TenureError, ValidationJob

DIALECT = sql_dialect("sqlite")


def prepare(path: pathlib.Path, *, replace: dict[str, str] | None = None, extra: list[str] | None = None) -> str:
    """The legacy schema plus owned columns added by hand; ``replace`` swaps the DDL of one
    validation_jobs column (the wrongly prepared part), ``extra`` runs after."""
    connection = sqlite3.connect(path)
    for statement in legacy_ddl(DIALECT, None):
        connection.execute(statement)
    replace = replace or {}
    for spec in QUEUE_TABLES.values():
        table = spec.name
        for column in spec.columns_of(OWNED_STEP):
            ddl = owned_column_ddl(spec, column, DIALECT, None)
            if table == "validation_jobs" and column.name in replace:
                ddl = f"ALTER TABLE {table} ADD COLUMN {column.name} {replace[column.name]}"
            connection.execute(ddl)
    for statement in extra or []:
        connection.execute(statement)
    connection.commit()
    connection.close()
    return f"sqlite:///{path}"


def schema_of(path: pathlib.Path) -> list[tuple[str, str, str]]:
    connection = sqlite3.connect(path)
    try:
        return sorted(connection.execute("SELECT type, name, coalesce(sql, '') FROM sqlite_master").fetchall())
    finally:
        connection.close()


BAD_SCHEMAS = {
    "fixed_char_token": ({"claim_token": "CHAR(255)"}, [], "not_canonical_varchar"),
    "text_submission_id": ({"submission_id": "TEXT"}, [], "not_canonical_varchar"),
    "narrow_varchar_token": ({"claim_token": "VARCHAR(16)"}, [], "not_canonical_varchar"),
    "real_generation": ({"generation": "REAL DEFAULT 0 NOT NULL"}, [], "not_integer_type"),
    "nullable_generation": ({"generation": "BIGINT DEFAULT 0"}, [], "wrong_nullability"),
    "generation_default_one": ({"generation": "BIGINT DEFAULT 1 NOT NULL"}, [], "default_not_zero"),
    "quoted_false_flag": ({"fence_required": "BOOLEAN DEFAULT 'false' NOT NULL"}, [], "default_not_false"),
    "true_flag": ({"fence_required": "BOOLEAN DEFAULT 1 NOT NULL"}, [], "default_not_false"),
    "token_default_manufactures_identity": ({"claim_token": "VARCHAR(255) DEFAULT 'x'"}, [], "default_manufactures_identity"),
    "partial_token_index": (
        {}, ["CREATE UNIQUE INDEX ux_validation_jobs_claim_token ON validation_jobs (claim_token) WHERE claim_token IS NOT NULL"],
        "partial_or_differently_compared_unique_index",
    ),
    "nocase_submission_index": (
        {}, ["CREATE UNIQUE INDEX other_submission ON validation_jobs (submission_id COLLATE NOCASE)"],
        "partial_or_differently_compared_unique_index",
    ),
    "expression_token_index": (
        {}, ["CREATE UNIQUE INDEX lowered ON validation_jobs (lower(claim_token))"],
        "partial_or_differently_compared_unique_index",
    ),
    "nocase_token_column": ({"claim_token": "VARCHAR(255) COLLATE NOCASE"}, [], "partial_or_differently_compared_unique_index"),
}


@pytest.mark.parametrize("case", sorted(BAD_SCHEMAS))
async def test_a_wrongly_prepared_database_is_refused_and_left_unchanged(tmp_path: pathlib.Path, case: str) -> None:
    replace, extra, problem = BAD_SCHEMAS[case]
    path = tmp_path / "bad.db"
    url = prepare(path, replace=replace, extra=extra)
    before = schema_of(path)
    with pytest.raises(ConfigValidationError) as caught:
        await upgrade(url)
    assert caught.value.reason == "migration_admission_refused"
    assert problem in caught.value.problems
    assert str(path) not in str(caught.value)
    assert schema_of(path) == before


async def test_the_collation_probe_refuses_identities_compared_without_case(tmp_path: pathlib.Path) -> None:
    # A NOCASE column with no unique index of its own: only the native probe can tell.
    path = tmp_path / "probe.db"
    url = prepare(
        path,
        replace={"submission_id": "VARCHAR(255) COLLATE RTRIM"},
        extra=["CREATE UNIQUE INDEX ux_validation_jobs_submission_id ON validation_jobs (submission_id COLLATE BINARY)"],
    )
    with pytest.raises(ConfigValidationError) as caught:
        await upgrade(url)
    assert "identities_not_compared_exactly" in caught.value.problems


@pytest.mark.parametrize(
    "replace",
    [
        {"generation": "BIGINT DEFAULT '0' NOT NULL"},
        {"fence_required": "BOOLEAN DEFAULT FALSE NOT NULL"},
        {"fence_required": "BOOLEAN DEFAULT '0' NOT NULL"},
        {"claim_token": "VARCHAR(512)"},
    ],
    ids=["quoted-zero-generation", "false-keyword-flag", "quoted-zero-flag", "wider-varchar"],
)
async def test_compatible_variants_are_admitted(tmp_path: pathlib.Path, replace: dict[str, str]) -> None:
    url = prepare(tmp_path / "ok.db", replace=replace)
    report = await upgrade(url)
    assert all(check.passed for check in report.checks)


async def test_a_fresh_database_is_migrated_and_the_probe_leaves_nothing_behind(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "fresh.db"
    report = await upgrade(f"sqlite:///{path}")
    assert report.applied == ("owned_v2", "attempts_v1", "runs_v1", "runs_v2", "runs_v3", "runs_v4", "runs_v5", "tasks_v1", "runs_v6", "console_v1", "versions_v1", "attempts_v2", "runs_v7", "runs_v8", "workers_v1")
    assert report.checks and all(check.passed for check in report.checks)
    probes = [check for check in report.checks if "probe" in check.requirement]
    assert len(probes) == 2 * len(TABLE_NAMES)
    connection = sqlite3.connect(path)
    try:
        for table in TABLE_NAMES.values():
            assert connection.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
        assert not [name for (name,) in connection.execute("SELECT name FROM sqlite_master") if "probe" in name]
    finally:
        connection.close()
    again = await upgrade(f"sqlite:///{path}")
    assert again.applied == ()


async def test_old_rows_start_with_generation_zero_no_token_and_no_submission_identity(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "legacy.db"
    connection = sqlite3.connect(path)
    for statement in legacy_ddl(DIALECT, None):
        connection.execute(statement)
    # A row as pycharter writes it: its domain columns, DATETIME text, JSON text.
    connection.execute(
        "INSERT INTO validation_jobs (id, contract_name, contract_version, data_json, status, fires_at, created_at,"
        " attempt, max_attempts) VALUES ('old-1', 'c', '1', ?, 'pending', ?, ?, 0, 5)",
        ('{"data_source": "s", "options": {}}', "2026-01-01 00:00:00.000000", "2026-01-01 00:00:00.000000"),
    )
    connection.commit()
    connection.close()
    await upgrade(f"sqlite:///{path}")
    async with ValidationJobSource(f"sqlite:///{path}") as source:
        info = await source.get_job("old-1")
        assert (info.generation, info.protected, info.submission_id) == (0, False, None)
        got = await source.claim_next_owned("worker-a", claim_token="token-1")
        assert got.job_id == "old-1" and got.claim_fence.generation == 1


async def test_downgrade_refuses_while_protected_or_owned_work_remains_then_removes_the_columns(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path}/down.db"
    await upgrade(url)
    async with ValidationJobSource(url) as source:
        owned = await source.submit_owned(ValidationJob("c", "1", "s"), submission_id="sub-1")
        with pytest.raises(ConfigValidationError) as caught:
            await downgrade(url)
        assert "protected_submissions_remain" in caught.value.problems
        # An owned claim of a legacy row is not protected, but a live token-bearing claim.
        legacy = await source.submit(ValidationJob("c", "1", "s2"))
        assert await source.delete_job(legacy) is True
        legacy = await source.submit(ValidationJob("c", "1", "s3"))
    connection = sqlite3.connect(tmp_path / "down.db")
    connection.execute("DELETE FROM validation_jobs WHERE id = ?", (owned,))
    connection.commit()
    connection.close()
    async with ValidationJobSource(url) as source:
        got = await source.claim_next_owned("worker-a", claim_token="token-1")
        assert got.job_id == legacy
        with pytest.raises(ConfigValidationError) as caught:
            await downgrade(url)
        assert caught.value.problems == ("owned_claims_remain",)
        assert await source.complete_owned(got.claim_fence)
    report = await downgrade(url)
    assert report.changed == ("workers_v1", "runs_v8", "runs_v7", "attempts_v2", "versions_v1", "console_v1", "runs_v6", "tasks_v1", "runs_v5", "runs_v4", "runs_v3", "runs_v2", "runs_v1", "attempts_v1", "owned_v2")
    connection = sqlite3.connect(tmp_path / "down.db")
    try:
        columns = {row[1] for row in connection.execute("PRAGMA table_info(validation_jobs)")}
        assert not {"generation", "claim_token", "submission_id", "fingerprint", "fence_required"} & columns
    finally:
        connection.close()
    assert (await upgrade(url)).applied == ("owned_v2", "attempts_v1", "runs_v1", "runs_v2", "runs_v3", "runs_v4", "runs_v5", "tasks_v1", "runs_v6", "console_v1", "versions_v1", "attempts_v2", "runs_v7", "runs_v8", "workers_v1")


async def test_a_missing_file_is_database_missing_and_no_file_is_left_behind(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "empty.db"
    async with ValidationJobSource(f"sqlite:///{path}") as source:
        with pytest.raises(TenureError) as caught:
            await source.claim_next_owned("worker-a", claim_token="token-1")
        assert caught.value.reason == "database_missing"
    assert list(tmp_path.iterdir()) == [], "opening a mistyped path creates nothing"


async def test_a_file_that_was_never_migrated_is_schema_missing(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "empty.db"
    sqlite3.connect(path).close()
    async with ValidationJobSource(f"sqlite:///{path}") as source:
        with pytest.raises(TenureError) as caught:
            await source.claim_next_owned("worker-a", claim_token="token-1")
        assert caught.value.reason == "schema_missing"
