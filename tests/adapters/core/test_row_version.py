"""Step ``versions_v1``: every machine table has a ``row_version`` the database raises on
every UPDATE, whoever writes; the upgrade checks each trigger and puts back one that was
dropped or disabled; the downgrade removes them with the column.

The writers tenure does not control (pycharter's own code, a plain UPDATE) changing a row
between tenure's read and its write are in tests/adapters/core/test_pycharter.py."""

from __future__ import annotations

import pytest
from adapter_support import kind_of, raw

from tenure.adapters import ValidationJobSource, downgrade, upgrade
from tenure.adapters.wiring.registry import TABLES
from tenure.model import ValidationJob, WorkerConfig


def columns_of(db_url: str, table: str) -> set[str]:
    if kind_of(db_url) == "sqlite":
        return {row[1] for row in raw(db_url, f"PRAGMA table_info({table})")}
    return {name for (name,) in raw(db_url, "SELECT column_name FROM information_schema.columns "
                                            "WHERE table_schema = current_schema() AND table_name = ?", (table,))}


async def test_every_table_gets_a_version_that_every_write_moves_to_one_never_seen_before(db_url: str) -> None:
    for spec in TABLES:
        assert "row_version" in columns_of(db_url, spec.name), spec.name
    seen: list[int] = []
    async with ValidationJobSource(db_url, WorkerConfig(db_url, lease_seconds=60, heartbeat_seconds=10)) as source:
        job_id = await source.submit_owned(ValidationJob("orders", "1.0", "a.jsonl"), submission_id="v-1")

        def moved() -> None:
            version = raw(db_url, "SELECT row_version FROM validation_jobs WHERE id = ?", (job_id,))[0][0]
            assert not seen or version > seen[-1], (seen, version)  # never back, never equal
            seen.append(version)

        moved()  # as inserted
        claim = await source.claim_next_owned("worker", claim_token="token-1")
        moved()
        assert await source.heartbeat_owned(claim.claim_fence)
        moved()
        raw(db_url, "UPDATE validation_jobs SET error_message = error_message WHERE id = ?", (job_id,))
        moved()  # an UPDATE that changes nothing counts all the same
        raw(db_url, "UPDATE validation_jobs SET row_version = 0 WHERE id = ?", (job_id,))
        moved()  # a writer cannot set an old version
        raw(db_url, "UPDATE validation_jobs SET row_version = ? WHERE id = ?", (seen[-1], job_id))
        moved()
        assert await source.complete_owned(claim.claim_fence, {})
        moved()
    if kind_of(db_url) == "postgresql":
        # A key deleted and inserted again starts from a version no row ever had.
        raw(db_url, "WITH gone AS (DELETE FROM validation_jobs WHERE id = ? RETURNING *) "
                    "INSERT INTO validation_jobs SELECT * FROM gone", (job_id,))
        moved()


async def test_the_upgrade_checks_every_trigger_and_puts_back_a_missing_or_disabled_one(db_url: str) -> None:
    report = await upgrade(db_url)
    version_checks = [check for check in report.checks if check.subject == "row_version"]
    assert {check.table for check in version_checks} == {spec.name for spec in TABLES}
    assert all(check.passed for check in version_checks) and report.changed == ()
    assert not [statement for statement in report.statements if "row_version" in statement]  # nothing to repair
    if kind_of(db_url) == "sqlite":
        raw(db_url, "DROP TRIGGER validation_jobs_row_version")
    else:
        raw(db_url, "ALTER TABLE validation_jobs DISABLE TRIGGER tenure_row_version")
    async with ValidationJobSource(db_url, WorkerConfig(db_url, lease_seconds=60, heartbeat_seconds=10)) as source:
        job_id = await source.submit_owned(ValidationJob("orders", "1.0", "a.jsonl"), submission_id="v-1")
    before = raw(db_url, "SELECT row_version FROM validation_jobs")
    raw(db_url, "UPDATE validation_jobs SET error_message = 'unseen' WHERE id = ?", (job_id,))
    assert raw(db_url, "SELECT row_version FROM validation_jobs") == before  # the gap the check closes
    repaired = await upgrade(db_url)
    assert repaired.changed == () and all(check.passed for check in repaired.checks)
    assert any("validation_jobs" in statement and "TRIGGER" in statement for statement in repaired.statements)
    raw(db_url, "UPDATE validation_jobs SET error_message = 'seen' WHERE id = ?", (job_id,))
    assert raw(db_url, "SELECT row_version FROM validation_jobs")[0][0] > before[0][0]
    kept = await upgrade(db_url)
    assert not [statement for statement in kept.statements if "row_version" in statement]


async def test_the_downgrade_removes_the_versions_and_their_triggers(db_url: str) -> None:
    removed = await downgrade(db_url)
    assert removed.changed[:4] == ("workers_v1", "runs_v8", "runs_v7", "attempts_v2")
    assert "row_version" not in columns_of(db_url, "validation_jobs")
    if kind_of(db_url) == "sqlite":
        assert raw(db_url, "SELECT name FROM sqlite_master WHERE type = 'trigger'") == []
    else:
        assert raw(db_url, "SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal") == [(0,)]
        assert raw(db_url, "SELECT count(*) FROM pg_proc WHERE proname = 'tenure_row_version'") == [(0,)]
        assert raw(db_url, "SELECT count(*) FROM pg_class WHERE relname = 'tenure_row_versions'") == [(0,)]


@pytest.mark.parametrize("database", ["postgresql"])
async def test_a_dry_run_reports_the_repair_and_keeps_nothing(db_url: str) -> None:
    """A dry run repairs nothing it keeps, but it reports what it would repair."""
    raw(db_url, "ALTER TABLE validation_jobs DISABLE TRIGGER tenure_row_version")
    report = await upgrade(db_url, dry_run=True)
    assert any("tenure_row_version" in statement for statement in report.statements)
    assert raw(db_url, "SELECT tgenabled FROM pg_trigger WHERE tgname = 'tenure_row_version' "
                       "AND tgrelid = 'validation_jobs'::regclass") == [(b"D",)]
