"""Schema step ``runs_v8``: a database migrated before it (the Runs' and checkpoints'
checks refuse ``awaiting_message`` and the owner kind ``message``, and no message table
exists) is upgraded in place, every Run kept: the table is created and the checks are
replaced (PostgreSQL: each constraint; SQLite: the tables rebuilt), so a Run can park on
a receive and resume from a message. On SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

import paths
import pytest
from adapter_support import raw
from run_support import PIN

from tenure.adapters import InMemoryBroker, RunLedger, upgrade
from tenure.model import MessageStatus, RunIntent, RunStatus, WaitKind

DATA = paths.SUPPORT / "data"


async def _a_run_waits_on_a_receive_and_a_message_resumes_it(url: str) -> None:
    async with RunLedger(url) as ledger:
        broker = InMemoryBroker()
        admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=PIN, queue="runs",
                                       priority=50)
        run_id = admission.run.run_id
        assert await ledger.publish(run_id, 0, broker) and await ledger.claim(run_id, 0, node="node-a") is not None
        waiting = await ledger.messages.receive(run_id, 0, "go", key="@1")
        # The seed's order: the receive, the checkpoint naming it, the park.
        assert await ledger.checkpoints.save(run_id, 0, state={}, owner_kind=WaitKind.MESSAGE, owner_id=waiting.slot_id)
        assert await ledger.park(run_id, 0, kind=WaitKind.MESSAGE, owner_id=waiting.slot_id)
        assert (await ledger.get(run_id)).status is RunStatus.AWAITING_MESSAGE  # type: ignore[union-attr]
        sent = await ledger.messages.send(run_id, "go", {"n": 1}, broker=broker)
        assert sent.status is MessageStatus.RECEIVED
        assert (await ledger.get(run_id)).status is RunStatus.QUEUED  # type: ignore[union-attr]


@pytest.mark.parametrize("database", ["postgresql"], indirect=True)
async def test_a_postgres_schema_from_before_runs_v8_gets_the_message_table_and_the_wider_checks(db_url: str) -> None:
    old_status = ("status IN ('queued', 'running', 'awaiting_hardware', 'awaiting_consent', 'awaiting_delegate', "
                  "'awaiting_service', 'awaiting_timer', 'cancelling', 'done', 'failed', 'cancelled')")
    old_owner = "owner_kind IS NULL OR owner_kind IN ('hardware', 'consent', 'delegate', 'service', 'timer')"
    raw(db_url, "DROP TABLE tenure_run_messages")
    raw(db_url, "ALTER TABLE tenure_runs DROP CONSTRAINT ck_tenure_runs_status")
    raw(db_url, f"ALTER TABLE tenure_runs ADD CONSTRAINT ck_tenure_runs_status CHECK ({old_status})")
    raw(db_url, "ALTER TABLE tenure_runs DROP CONSTRAINT ck_tenure_runs_owner_kind")
    raw(db_url, f"ALTER TABLE tenure_runs ADD CONSTRAINT ck_tenure_runs_owner_kind CHECK ({old_owner})")
    raw(db_url, "DELETE FROM tenure_migrations WHERE name = 'runs_v8'")
    report = await upgrade(db_url)
    assert report.applied == ("runs_v8",)
    definitions = {name: text for name, text in raw(
        db_url, "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conname LIKE 'ck_tenure_run%'")}
    assert "awaiting_message" in definitions["ck_tenure_runs_status"]
    assert "message" in definitions["ck_tenure_runs_owner_kind"]
    assert "message" in definitions["ck_tenure_run_checkpoints_owner"]
    assert (await upgrade(db_url)).applied == ()
    await _a_run_waits_on_a_receive_and_a_message_resumes_it(db_url)


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
async def test_a_sqlite_database_from_before_runs_v8_is_rebuilt_with_the_wider_checks(tmp_path: Path, db_url: str) -> None:
    """The committed database the release before runs_v4 wrote: no message table, and
    checks that refuse a message wait. Every Run is kept."""
    path = tmp_path / "old.db"
    shutil.copy(DATA / "runs_before_v4.db", path)
    url = f"sqlite:///{path}"
    with contextlib.closing(sqlite3.connect(path)) as connection:
        before = connection.execute("SELECT run_id, status, enqueue_seq FROM tenure_runs ORDER BY run_id").fetchall()
    report = await upgrade(url)
    assert "runs_v8" in report.applied
    with contextlib.closing(sqlite3.connect(path)) as connection:
        after = connection.execute("SELECT run_id, status, enqueue_seq FROM tenure_runs ORDER BY run_id").fetchall()
        runs_sql = connection.execute("SELECT sql FROM sqlite_master WHERE name = 'tenure_runs'").fetchone()[0]
        checkpoints_sql = connection.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'tenure_run_checkpoints'").fetchone()[0]
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert "awaiting_message" in runs_sql and "'message'" in checkpoints_sql
    assert after == before and before
    await _a_run_waits_on_a_receive_and_a_message_resumes_it(url)
