"""Where the workers are, on every database: a worker records itself when it starts (its
queues, task names and concurrency), reports its claims in flight while it runs and
records its stop; one that stops reporting is missing; long-gone rows are forgotten; and
``tenure workers`` lists them (stopped ones with ``--all``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
from polling import until

from tenure.adapters import TaskApp, TaskContext
from tenure.adapters.queue import presence as presence_module
from tenure.adapters.queue.presence import Presence, presence_of
from tenure.adapters.queue.table import WorkerRow
from tenure.model import WorkerConfig

HANG_GUARD_S = 120.0
"""Only stops a hang: every wait below ends as soon as its condition holds."""


def make_app(db_url: str, release: asyncio.Event, started: asyncio.Event) -> TaskApp:
    app = TaskApp(db_url, config=WorkerConfig(db_url, lease_seconds=30, heartbeat_seconds=1))

    @app.task(queue="emails", name="send_welcome")
    async def send_welcome(ctx: TaskContext, user_id: int) -> None:
        started.set()
        await release.wait()

    @app.task(queue="reports", name="build_report")
    async def build_report(ctx: TaskContext) -> None:
        return None

    return app


async def test_a_worker_records_itself_reports_its_claims_and_records_its_stop(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(presence_module, "REPORT_EVERY_S", 0.05)
    monkeypatch.setattr("tenure.adapters.queue.worker.REPORT_EVERY_S", 0.05)
    release, started = asyncio.Event(), asyncio.Event()
    app = make_app(db_url, release, started)
    await app.get("send_welcome").defer(user_id=1)
    stop = asyncio.Event()
    worker = app.worker(worker_id="worker-7", concurrency=3)
    running = asyncio.create_task(worker.run(stop))
    await asyncio.wait_for(started.wait(), HANG_GUARD_S)

    async def reports_one_in_flight() -> bool:
        views = await app.source.workers()
        return len(views) == 1 and views[0].in_flight == 1

    await until(reports_one_in_flight, HANG_GUARD_S, what="the worker reports its claim in flight")
    (view,) = await app.source.workers()
    assert (view.worker_id, view.presence, view.queues, view.tasks, view.concurrency) == (
        "worker-7", Presence.LIVE, ("emails", "reports"), ("build_report", "send_welcome"), 3)
    release.set()
    stop.set()
    await running
    (view,) = await app.source.workers()
    assert (view.presence, view.in_flight) == (Presence.STOPPED, 0) and view.stopped_at_us is not None
    await app.close()


async def test_a_worker_that_stops_reporting_is_missing_and_long_gone_rows_are_forgotten(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    app = TaskApp(db_url)
    frozen = app.source.presence("frozen-1", queues=["emails"], tasks=[], concurrency=1)
    frozen._every_ms = 1  # it promised a report every millisecond, and sends none
    await frozen.started()
    await until(lambda: _presence_of(app, "frozen-1", Presence.MISSING), HANG_GUARD_S,
                what="the silent worker is missing")
    monkeypatch.setattr(presence_module, "FORGET_AFTER_S", 0.0)  # anything seen before now is long gone
    await until(lambda: _forgotten_by_a_new_worker(app), HANG_GUARD_S, what="the missing worker forgotten")
    assert [view.worker_id for view in await app.source.workers()] == ["fresh-2"]
    await app.close()


async def _presence_of(app: TaskApp, worker_id: str, presence: Presence) -> bool:
    return [(view.worker_id, view.presence) for view in await app.source.workers()] == [(worker_id, presence)]


async def _forgotten_by_a_new_worker(app: TaskApp) -> bool:
    await app.source.presence("fresh-2", queues=["emails"], tasks=[], concurrency=1).started()
    return "frozen-1" not in [view.worker_id for view in await app.source.workers()]


def test_presence_is_stopped_once_recorded_else_missing_after_three_silent_reports() -> None:
    row = WorkerRow(worker_id="w", host="h", pid=1, queues_json="[]", tasks_json="[]", concurrency=1,
                    report_every_ms=10_000, started_at_us=0, last_seen_at_us=1_000_000, in_flight=0)
    assert presence_of(row, 1_000_000 + 30_000_000) is Presence.LIVE
    assert presence_of(row, 1_000_000 + 30_000_001) is Presence.MISSING
    stopped = WorkerRow(**{**{name: getattr(row, name) for name in row.__slots__}, "stopped_at_us": 2_000_000})
    assert presence_of(stopped, 10**12) is Presence.STOPPED


def _tenure(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "tenure.apps.cli", *arguments], capture_output=True,
                          text=True, timeout=HANG_GUARD_S, check=False)


async def test_the_workers_command_lists_live_and_missing_workers_and_stopped_ones_with_all(db_url: str) -> None:
    app = TaskApp(db_url)
    live = app.source.presence("live-1", queues=["emails"], tasks=["send_welcome"], concurrency=4)
    await live.started()
    gone = app.source.presence("gone-1", queues=["reports"], tasks=[], concurrency=1)
    await gone.started()
    await gone.stopped()
    listed = await asyncio.to_thread(_tenure, "workers", "--db", db_url)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("live-1: live, host ") and "queues emails, 1 tasks" in lines[0]
    assert "concurrency 4, in flight 0, last seen " in lines[0] and db_url not in listed.stdout
    every = await asyncio.to_thread(_tenure, "workers", "--db", db_url, "--all", "--json")
    assert every.returncode == 0, every.stderr
    shown: list[dict[str, Any]] = json.loads(every.stdout)
    assert [(row["worker_id"], row["state"], row["queues"]) for row in shown] == [
        ("live-1", "live", ["emails"]), ("gone-1", "stopped", ["reports"])]
    await app.close()


def test_the_workers_command_refuses_a_database_never_migrated(tmp_path: Any) -> None:
    ended = _tenure("workers", "--db", f"sqlite:///{tmp_path / 'fresh.db'}")
    assert ended.returncode == 2 and "tenure migrate" in ended.stdout, ended.stdout + ended.stderr
