"""The `tenure` command: the demo's checks have teeth, and migrate reports what it checked."""

from __future__ import annotations

import pathlib
import sqlite3

import pytest

from tenure.adapters.cli import main
from tenure.kernel.queue import machine as queue_machine


def test_the_demo_runs_and_every_invariant_holds(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/demo.db"
    status = main(["demo", "--db", url, "--jobs", "80", "--workers", "3", "--lease-seconds", "0.4"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "every invariant held" in out
    assert "lost                                     0" in out
    assert "stale writes accepted                    0" in out


@pytest.mark.parametrize("database", ["postgresql"])
async def test_the_demo_runs_on_postgresql(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from tenure.adapters.demo import DemoSettings, run_demo

    status = await run_demo(DemoSettings(db_url=db_url, jobs=80, workers=3, lease_seconds=0.4))
    out = capsys.readouterr().out
    assert status == 0, out
    assert "every invariant held" in out


def test_the_demo_exits_non_zero_when_the_kernel_accepts_stale_writes(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A kernel that compares fences without their owner and token lets a stalled worker
    # finish a job another worker took over: the demo's takeover drill must catch it.
    def fence_mismatch_by_job_only(record: object, command: object, now: int) -> bool:
        return command.fence.job_id != record.job_id  # type: ignore[attr-defined]

    monkeypatch.setitem(queue_machine.GUARDS, "fence_mismatch", fence_mismatch_by_job_only)
    monkeypatch.setitem(queue_machine.GUARDS, "lease_not_live", lambda record, command, now: False)
    url = f"sqlite:///{tmp_path}/demo.db"
    status = main(["demo", "--db", url, "--jobs", "200", "--workers", "3", "--lease-seconds", "0.3", "--seed", "3"])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "INVARIANT BROKEN" in out


def test_migrate_summarizes_and_lists_every_admission_check_only_when_verbose(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/m.db"
    assert main(["migrate", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "applied: owned_v2" in out and "checks passed" in out
    assert "validation_jobs.claim_token" not in out
    assert main(["migrate", "--db", url, "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "nothing (up to date)" in out
    assert "validation_jobs.claim_token: one full unique index comparing exactly: ok" in out


def test_migrate_sql_prints_the_statements_and_changes_nothing(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.db"
    sqlite3.connect(path).close()  # an empty database file
    assert main(["migrate", "--db", f"sqlite:///{path}", "--sql"]) == 0
    out = capsys.readouterr().out
    assert "CREATE TABLE IF NOT EXISTS validation_jobs" in out
    assert "ALTER TABLE validation_jobs ADD COLUMN claim_token VARCHAR(255);" in out
    assert "dry run: rolled back" in out
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)
    finally:
        connection.close()


def test_downgrade_says_nothing_to_remove_when_nothing_was_applied(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.db"
    sqlite3.connect(path).close()
    assert main(["migrate", "--db", f"sqlite:///{path}", "--downgrade"]) == 0
    assert "removed: nothing to remove" in capsys.readouterr().out


def test_migrate_refuses_a_table_it_did_not_create_with_exit_status_two(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.db"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE validation_jobs (id VARCHAR(36) PRIMARY KEY, claim_token CHAR(255))")
    connection.commit()
    connection.close()
    assert main(["migrate", "--db", f"sqlite:///{path}"]) == 2
    out = capsys.readouterr().out
    assert "refused: migration_admission_refused" in out
    assert "validation_jobs.status: missing_legacy_column" in out
