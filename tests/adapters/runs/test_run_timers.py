"""Durable timers (issue 27): ``ctx.sleep`` / ``ctx.sleep_until`` park a Run on a timer
whose owner is its due time on the database clock; the checkpoint and the park are one
transaction; relays resume the Run once the database clock reaches the due time, from
any process and across a restart (nothing is kept in memory); nothing resumes it
earlier; a sleeping Run can be cancelled; and a database written before ``runs_v5``
(whose CHECK constraints refuse the new status) accepts timers once upgraded. Every
test runs on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import paths
from run_support import admit, ports, serving, status_of, worker
from tenure.adapters import InMemoryBroker, RunLedger, RunRuntime, RunWorker, Workflows, upgrade
from tenure.model import ConfigValidationError, RunStatus, WaitKind

DATA = paths.SUPPORT / "data"


@pytest.fixture
async def ledger(db_url: str) -> AsyncIterator[RunLedger]:
    async with RunLedger(db_url) as made:
        yield made


def sleeper(flows: Workflows, seen: list[Any], *, seconds: float = 0.3) -> None:
    @flows.workflow("nap", "1")
    async def nap(ctx: Any) -> dict[str, Any]:
        if ctx.timer is None:
            await ctx.sleep(seconds, state={"slept": False, "n": ctx.payload["n"]})
        seen.append((ctx.timer, ctx.state, ctx.enqueue_seq))
        return {"woke": ctx.timer, "n": ctx.state["n"]}


@contextlib.asynccontextmanager
async def runtime(ledger: RunLedger, broker: Any, flows: Workflows, node: str = "node-a") -> AsyncIterator[RunRuntime]:
    runner = RunWorker(ledger, broker, flows, node=node, watch_interval_s=0.05)
    async with RunRuntime(ledger, brokers=[broker], workers=[runner], node=node, relay_interval_s=0.1,
                          node_lease_s=5, require_clean=False) as started:
        yield started


async def test_a_sleeping_run_is_resumed_by_a_relay_once_due_and_the_next_hop_sees_the_timer(
    ledger: RunLedger,
) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []
    sleeper(flows, seen)
    async with runtime(ledger, broker, flows):
        run_id = await admit(ledger, flows.pin("nap", "1"))
        await ledger.publish(run_id, 0, broker)
        parked = await status_of(ledger, run_id, RunStatus.AWAITING_TIMER, RunStatus.DONE)
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    if parked.status is RunStatus.AWAITING_TIMER:  # a loaded machine may see only the end
        assert (parked.owner_kind, parked.owner_id) == (WaitKind.TIMER, "sleep:0")
        assert parked.wake_at is not None and parked.wake_at >= parked.updated_at
    assert (done.status, done.result) == (RunStatus.DONE, {"woke": "sleep:0", "n": 1})
    assert done.wake_at is None and done.enqueue_seq == 1
    assert seen == [("sleep:0", {"slept": False, "n": 1}, 1)]  # the body after the sleep ran once


async def test_nothing_resumes_a_timer_before_it_is_due(ledger: RunLedger) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []
    sleeper(flows, seen, seconds=3600)
    async with serving(worker(ledger, broker, flows)):
        run_id = await admit(ledger, flows.pin("nap", "1"))
        await ledger.publish(run_id, 0, broker)
        parked = await status_of(ledger, run_id, RunStatus.AWAITING_TIMER)
    assert parked.wake_at - parked.updated_at >= dt.timedelta(seconds=3599)
    assert await ledger.resume(run_id, owner_id="sleep:0") is None  # its own name, an hour early
    report = await ledger.relay(ports(ledger, broker))
    assert report.counts.get("resumed", 0) == 0
    report = await ledger.reconcile(ports(ledger, broker), node="node-a", boot_cutoff=await ledger.database_now())
    assert report.counts.get("resumed", 0) == 0
    still = await ledger.get(run_id)
    assert still is not None and (still.status, still.enqueue_seq) == (RunStatus.AWAITING_TIMER, 0)
    checkpoint = await ledger.checkpoints.load(run_id)
    assert checkpoint is not None and (checkpoint.owner_kind, checkpoint.owner_id) == (WaitKind.TIMER, "sleep:0")
    assert checkpoint.state == {"slept": False, "n": 1}


async def test_a_timer_survives_a_restart_and_the_next_process_resumes_it(db_url: str) -> None:
    """The process that parked the Run stops before the timer is due; a later process
    (another node, new objects, nothing shared in memory) resumes and finishes it."""
    flows, seen = Workflows(), []
    sleeper(flows, seen, seconds=1.0)
    async with RunLedger(db_url) as first:
        broker = InMemoryBroker()
        async with runtime(first, broker, flows, node="node-a"):
            run_id = await admit(first, flows.pin("nap", "1"))
            await first.publish(run_id, 0, broker)
            await status_of(first, run_id, RunStatus.AWAITING_TIMER)
    assert seen == []
    async with RunLedger(db_url) as second:
        broker = InMemoryBroker()
        async with runtime(second, broker, flows, node="node-b"):
            done = await status_of(second, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (done.status, done.result) == (RunStatus.DONE, {"woke": "sleep:0", "n": 1})
    assert seen == [("sleep:0", {"slept": False, "n": 1}, 1)]


async def test_a_timer_already_due_resumes_at_once_and_sleep_until_takes_an_aware_instant(
    ledger: RunLedger,
) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []

    @flows.workflow("past", "1")
    async def past(ctx: Any) -> dict[str, Any]:
        if ctx.timer is None:
            await ctx.sleep_until(dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc), name="millennium", state=[1])
        seen.append(ctx.timer)
        return {"state": ctx.state}

    async with serving(worker(ledger, broker, flows)):  # no relay: the park resumes it itself
        run_id = await admit(ledger, flows.pin("past", "1"))
        await ledger.publish(run_id, 0, broker)
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (done.status, done.result, seen) == (RunStatus.DONE, {"state": [1]}, ["millennium"])


async def test_a_sleeping_run_can_be_cancelled(ledger: RunLedger) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []
    sleeper(flows, seen, seconds=3600)
    async with serving(worker(ledger, broker, flows)):
        run_id = await admit(ledger, flows.pin("nap", "1"))
        await ledger.publish(run_id, 0, broker)
        await status_of(ledger, run_id, RunStatus.AWAITING_TIMER)
        ticket = await ledger.begin_cancel(run_id)
        assert ticket is not None
        assert await ledger.finish_cancel(run_id, ticket.enqueue_seq, broker)
    cancelled = await ledger.get(run_id)
    assert cancelled is not None and cancelled.status is RunStatus.CANCELLED and seen == []
    assert await ledger.resume(run_id, owner_id="sleep:0") is None


async def test_bad_timers_are_refused_before_anything_is_written(ledger: RunLedger) -> None:
    flows, broker, errors = Workflows(), InMemoryBroker(), []

    @flows.workflow("bad", "1")
    async def bad(ctx: Any) -> dict[str, Any]:
        for call in (lambda: ctx.sleep_until(dt.datetime(2030, 1, 1)),  # naive
                     lambda: ctx.sleep(-1), lambda: ctx.sleep(True), lambda: ctx.sleep(10**9),
                     lambda: ctx.sleep(1, name=""), lambda: ctx.sleep(1, state={"x": {1, 2}})):
            try:
                await call()
            except ConfigValidationError as error:
                errors.append(error.problems)
        return {"refused": len(errors)}

    async with serving(worker(ledger, broker, flows)):
        run_id = await admit(ledger, flows.pin("bad", "1"))
        await ledger.publish(run_id, 0, broker)
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (done.status, done.result) == (RunStatus.DONE, {"refused": 6}), errors
    with pytest.raises(ConfigValidationError):
        await ledger.park_timer(run_id, 0, name="t", delay_s=1, wake_at=dt.datetime.now(dt.timezone.utc))
    with pytest.raises(ConfigValidationError):
        await ledger.park(run_id, 0, kind=WaitKind.TIMER, owner_id="t")  # timers park through park_timer
    assert not await ledger.park_timer(run_id, 0, name="t", delay_s=1)  # the Run is done: nothing held


# --- a database written before runs_v5 ---------------------------------------------------------


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
async def test_a_sqlite_database_from_before_runs_v5_is_rebuilt_with_the_wider_checks(
    tmp_path: Path, db_url: str
) -> None:
    """The committed database the release before runs_v4 wrote: its tenure_runs and
    checkpoint tables were created with CHECK constraints that refuse a timer. The
    upgrade rebuilds them (SQLite cannot alter a constraint), keeping every row."""
    path = tmp_path / "old.db"
    shutil.copy(DATA / "runs_before_v4.db", path)
    url = f"sqlite:///{path}"

    with contextlib.closing(sqlite3.connect(path)) as raw:
        before = raw.execute("SELECT run_id, status, enqueue_seq FROM tenure_runs ORDER BY run_id").fetchall()
        assert "awaiting_timer" not in raw.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'tenure_runs'").fetchone()[0]
    report = await upgrade(url)
    assert "runs_v5" in report.applied
    with contextlib.closing(sqlite3.connect(path)) as raw:
        after = raw.execute("SELECT run_id, status, enqueue_seq FROM tenure_runs ORDER BY run_id").fetchall()
        assert "awaiting_timer" in raw.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'tenure_runs'").fetchone()[0]
        assert "'timer'" in raw.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'tenure_run_checkpoints'").fetchone()[0]
        indexes = {row[0] for row in raw.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tenure_runs' AND sql IS NOT NULL")}
        assert {"ix_tenure_runs_status_updated", "ix_tenure_runs_idempotency_key"} <= indexes
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        names = {row[0] for row in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert not any(name.endswith("__before_rebuild") for name in names)
    assert after == before and before
    again = await upgrade(url)  # idempotent: nothing left to apply
    assert again.applied == ()
    await _a_timer_parks_and_resumes(url)


@pytest.mark.parametrize("database", ["postgresql"], indirect=True)
async def test_a_postgres_schema_from_before_runs_v5_gets_the_wider_checks(db_url: str) -> None:
    """A schema whose checks were created before runs_v5 (rebuilt here: the old checks
    put back and the records of runs_v5 and of the later step that widens them again,
    runs_v8, removed: such a schema has neither) has them replaced by the upgrade."""
    import asyncpg

    connection = await asyncpg.connect(db_url)
    try:
        old_status = "status IN ('queued', 'running', 'awaiting_hardware', 'awaiting_consent', " \
                     "'awaiting_delegate', 'awaiting_service', 'cancelling', 'done', 'failed', 'cancelled')"
        await connection.execute("ALTER TABLE tenure_runs DROP CONSTRAINT ck_tenure_runs_status")
        await connection.execute(f"ALTER TABLE tenure_runs ADD CONSTRAINT ck_tenure_runs_status CHECK ({old_status})")
        await connection.execute("DELETE FROM tenure_migrations WHERE name IN ('runs_v5', 'runs_v8')")
    finally:
        await connection.close()
    report = await upgrade(db_url)
    assert "runs_v5" in report.applied
    connection = await asyncpg.connect(db_url)
    try:
        definition = await connection.fetchval(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'ck_tenure_runs_status'")
    finally:
        await connection.close()
    assert "awaiting_timer" in definition
    await _a_timer_parks_and_resumes(db_url)


async def _a_timer_parks_and_resumes(url: str) -> None:
    flows, seen = Workflows(), []
    sleeper(flows, seen, seconds=0.2)
    async with RunLedger(url) as ledger:
        broker = InMemoryBroker()
        async with runtime(ledger, broker, flows):
            run_id = await admit(ledger, flows.pin("nap", "1"))
            await ledger.publish(run_id, 0, broker)
            done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (done.status, done.result) == (RunStatus.DONE, {"woke": "sleep:0", "n": 1})
