"""A task's ``timeout_s`` (issue 52 item 3), on every database: an attempt that runs past it
is cancelled and fails with ``TaskTimeout``, retried by the task's policy and written
under the claim's fence like any failure; an attempt within it keeps its result; a
handler that swallows its cancellation and returns has its result discarded; one that
ignores its cancellation for good fails its attempt all the same after the grace, is left
running detached and counted, and its late result is never written; the worker's own
cancellation (shutdown) still reaches a handler under a timeout; a handler's
``SystemExit`` stays a failure of its attempt. Bad limits are refused at registration.

No test waits on a clock to pass: the handlers that time out wait on an event nobody sets
(bounded by a hang guard), so only the timeout can end them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from tenure.adapters import Backoff, TaskApp, TaskContext, TaskTimeout
from tenure.adapters.tasks import app as app_module
from tenure.model import ConfigValidationError, JobStatus, WorkerConfig

HANG_GUARD_S = 120.0
"""How long a handler that must be cancelled waits before giving up (a hang guard)."""
TIMEOUT_S = 0.2
"""The tasks' limit: any positive value; nothing here depends on how long it is."""
NO_RETRY = Backoff(base_s=0, max_s=0, jitter=False)


def make_app(db_url: str) -> TaskApp:
    return TaskApp(db_url, config=WorkerConfig(db_url, lease_seconds=5, heartbeat_seconds=1))


async def never_set() -> None:
    """Wait on an event nobody sets: the caller ends only when it is cancelled."""
    await asyncio.wait_for(asyncio.Event().wait(), HANG_GUARD_S)


async def test_an_attempt_past_its_timeout_is_cancelled_and_retried_by_its_policy(db_url: str) -> None:
    cancelled: list[int] = []
    async with make_app(db_url) as app:
        @app.task(queue="slow", max_attempts=2, retry=NO_RETRY, timeout_s=TIMEOUT_S)
        async def stuck(ctx: TaskContext) -> str:
            try:
                await never_set()
            except asyncio.CancelledError:
                cancelled.append(ctx.attempt)
                raise
            return "finished by the hang guard: the timeout never fired"

        @app.task(queue="slow", timeout_s=HANG_GUARD_S)
        async def quick(ctx: TaskContext) -> dict[str, int]:
            return {"attempt": ctx.attempt}

        stuck_id, quick_id = await stuck.defer(), await quick.defer()
        stats = await asyncio.wait_for(app.worker(idle_wait_s=0.1).run_until_idle(), HANG_GUARD_S)
        assert (stats.retried, stats.failed, stats.completed) == (1, 1, 1)
        outcome = await app.result(stuck_id)
        assert outcome is not None and outcome.status is JobStatus.FAILED and outcome.attempts == 2
        assert outcome.error == f"TaskTimeout: ran past its timeout of {TIMEOUT_S:g} s"
        assert cancelled == [1, 2]  # each attempt's handler was cancelled, not left running
        kept = await app.result(quick_id)
        assert kept is not None and kept.ok and kept.result == {"attempt": 1}  # within its limit: untouched
        assert app.abandoned == 0


async def test_a_handler_that_swallows_its_cancellation_and_returns_has_its_result_discarded(
        db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    async with make_app(db_url) as app:
        @app.task(queue="slow", max_attempts=1, timeout_s=TIMEOUT_S)
        async def stubborn(ctx: TaskContext) -> str:
            try:
                await never_set()
            except asyncio.CancelledError:
                pass  # swallowed: the task goes on and returns
            return "late result"

        job_id = await stubborn.defer()
        with caplog.at_level(logging.WARNING, logger="tenure.adapters.queue.worker"):
            stats = await asyncio.wait_for(app.worker(idle_wait_s=0.1).run_until_idle(), HANG_GUARD_S)
        assert (stats.failed, stats.completed) == (1, 0)
        outcome = await app.result(job_id)
        assert outcome is not None and outcome.status is JobStatus.FAILED and outcome.result is None
        assert outcome.error is not None and outcome.error.startswith("TaskTimeout")
        assert any("without letting its cancellation through" in record.getMessage() for record in caplog.records)


async def test_a_handler_that_ignores_its_cancellation_fails_its_attempt_and_runs_on_detached(
        db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(app_module, "TIMEOUT_GRACE_S", 0.2)  # how long the worker waits for it: any value
    release = asyncio.Event()
    ignored: list[int] = []
    returned: list[str] = []
    async with make_app(db_url) as app:
        @app.task(queue="slow", max_attempts=1, timeout_s=TIMEOUT_S)
        async def deaf(ctx: TaskContext) -> str:
            while not release.is_set():
                try:
                    await asyncio.wait_for(release.wait(), HANG_GUARD_S)
                except asyncio.CancelledError:
                    ignored.append(ctx.attempt)  # and on it goes
            returned.append("late")
            return "late result"

        job_id = await deaf.defer()
        with caplog.at_level(logging.ERROR, logger="tenure.adapters.queue.worker"):
            stats = await asyncio.wait_for(app.worker(idle_wait_s=0.1).run_until_idle(), HANG_GUARD_S)
        assert (stats.failed, stats.completed) == (1, 0)
        assert app.abandoned == 1 and ignored == [1] and returned == []  # still running, detached
        assert any("ignored its cancellation" in record.getMessage() for record in caplog.records)
        outcome = await app.result(job_id)
        assert outcome is not None and outcome.status is JobStatus.FAILED
        assert outcome.error is not None and outcome.error.startswith("TaskTimeout")
        release.set()  # the detached handler ends and returns: nothing of it is written
        for _ in range(100):
            if returned:
                break
            await asyncio.sleep(0.01)
        assert returned == ["late"]
        after = await app.result(job_id)
        assert after is not None and (after.status, after.result, after.error) == (
            outcome.status, None, outcome.error)


async def test_the_workers_own_cancellation_still_reaches_a_handler_under_a_timeout(db_url: str) -> None:
    started, stopped = asyncio.Event(), asyncio.Event()
    async with make_app(db_url) as app:
        @app.task(queue="slow", timeout_s=HANG_GUARD_S)
        async def long(ctx: TaskContext) -> None:
            started.set()
            try:
                await never_set()
            except asyncio.CancelledError:
                stopped.set()
                raise

        job_id = await long.defer()
        stop = asyncio.Event()
        worker = asyncio.ensure_future(app.worker(idle_wait_s=0.1, shutdown_grace_s=0).run(stop))
        await asyncio.wait_for(started.wait(), HANG_GUARD_S)
        stop.set()
        stats = await asyncio.wait_for(worker, HANG_GUARD_S)
        assert stopped.is_set() and stats.released == 1  # cancelled at shutdown and given back
        outcome = await app.result(job_id)
        assert outcome is not None and outcome.status is JobStatus.PENDING and outcome.error is None


async def test_a_handler_exit_under_a_timeout_fails_its_attempt_and_the_worker_goes_on(db_url: str) -> None:
    async with make_app(db_url) as app:
        @app.task(queue="slow", max_attempts=1, timeout_s=HANG_GUARD_S)
        async def leaving(ctx: TaskContext) -> None:
            raise SystemExit(3)

        @app.task(queue="slow", timeout_s=HANG_GUARD_S)
        async def after(ctx: TaskContext) -> str:
            return "ran"

        leaving_id = await leaving.defer()
        after_id = await after.defer()
        stats = await asyncio.wait_for(app.worker(idle_wait_s=0.1).run_until_idle(), HANG_GUARD_S)
        assert (stats.failed, stats.completed) == (1, 1)
        outcome = await app.result(leaving_id)
        assert outcome is not None and outcome.status is JobStatus.FAILED
        assert outcome.error is not None and outcome.error.startswith("SystemExit")
        ran = await app.result(after_id)
        assert ran is not None and ran.ok and ran.result == "ran"


@pytest.mark.parametrize("limit", [0, -1, float("nan"), float("inf"), "5", True, 10**400,
                                   app_module.MAX_TIMEOUT_S * 2])
def test_a_timeout_out_of_range_is_refused_at_registration(limit: Any) -> None:
    app = TaskApp("sqlite:///unused.db")

    async def fine(ctx: Any) -> None: ...

    async def ticking(ctx: Any, tick: str) -> None: ...

    with pytest.raises(ConfigValidationError) as refused:
        app.task(name="x.fine", timeout_s=limit)(fine)
    assert refused.value.fields == ("timeout_s",) and refused.value.problems == ("number_out_of_range",)
    assert "x.fine" not in app.tasks  # nothing registered
    with pytest.raises(ConfigValidationError) as periodic:
        app.periodic(cron="* * * * *", name="x.tick", timeout_s=limit)(ticking)
    assert periodic.value.fields == ("timeout_s",) and app.periodics == []
    app.task(name="x.fine", timeout_s=app_module.MAX_TIMEOUT_S)(fine)  # the bound itself is allowed
    assert app.get("x.fine").timeout_s == app_module.MAX_TIMEOUT_S


def test_a_timeout_is_a_retried_failure_with_its_limit_in_its_message() -> None:
    error = TaskTimeout(2.5)
    assert error.retry is True and str(error) == "ran past its timeout of 2.5 s"
