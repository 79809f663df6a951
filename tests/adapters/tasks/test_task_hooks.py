"""Task hooks (issue 52 item 10), on every database: ``before_task``, ``after_task`` and
``on_failure`` run around every attempt in the handler's own asyncio task (a context
variable a ``before_task`` hook sets is the handler's), in registration order, async or
plain; a ``before_task`` hook that raises fails the attempt and the handler never runs; an
``after_task`` or ``on_failure`` hook that raises is logged and the outcome stands; the
worker's own cancellation runs no hook after the handler; ``on_worker_start`` runs before
a worker claims anything (one that raises stops the start, nothing claimed) and
``on_worker_stop`` once it ended. Hooks are refused when they are not functions."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any

import pytest

from tenure.adapters import Backoff, TaskApp, TaskContext
from tenure.model import ConfigValidationError, JobStatus, WorkerConfig

HANG_GUARD_S = 120.0
NO_RETRY = Backoff(base_s=0, max_s=0, jitter=False)
SPAN: contextvars.ContextVar[str] = contextvars.ContextVar("span", default="none")


def make_app(db_url: str) -> TaskApp:
    return TaskApp(db_url, config=WorkerConfig(db_url, lease_seconds=5, heartbeat_seconds=1))


async def drained(app: TaskApp) -> Any:
    return await asyncio.wait_for(app.worker(idle_wait_s=0.1).run_until_idle(), HANG_GUARD_S)


async def test_hooks_run_around_every_attempt_in_order_inside_the_handlers_task(
        db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    events: list[tuple[Any, ...]] = []
    async with make_app(db_url) as app:
        @app.on_worker_start
        def started() -> None:
            events.append(("worker_start",))

        @app.before_task
        async def open_span(ctx: TaskContext) -> None:
            SPAN.set(f"span-{ctx.job_id[:4]}")
            events.append(("before", ctx.task_name))

        @app.before_task
        def second(ctx: TaskContext) -> None:
            events.append(("before-2", ctx.task_name))

        @app.after_task
        async def close_span(ctx: TaskContext, result: Any, error: BaseException | None) -> None:
            events.append(("after", ctx.task_name, result, type(error).__name__ if error else None))

        @app.after_task
        def broken(ctx: TaskContext, result: Any, error: BaseException | None) -> None:
            raise RuntimeError("a hook's own bug")

        @app.on_failure
        def failed(ctx: TaskContext, error: BaseException) -> None:
            events.append(("failure", ctx.task_name, type(error).__name__))

        @app.on_worker_stop
        async def stopped() -> None:
            events.append(("worker_stop",))

        @app.task(queue="hooked", name="t.ok")
        async def ok(ctx: TaskContext) -> str:
            events.append(("handler", ctx.task_name, SPAN.get().startswith("span-")))
            return "fine"

        @app.task(queue="hooked", name="t.bad", max_attempts=1)
        def bad(ctx: TaskContext) -> None:  # a plain def task: its thread sees the span too
            events.append(("handler", ctx.task_name, SPAN.get().startswith("span-")))
            raise ValueError("no")

        ok_id = await ok.defer()
        stats = await drained(app)
        bad_id = await bad.defer()
        with caplog.at_level(logging.ERROR, logger="tenure.adapters.queue.worker"):
            stats_bad = await drained(app)
        assert (stats.completed, stats_bad.failed) == (1, 1)
        assert events == [
            ("worker_start",), ("before", "t.ok"), ("before-2", "t.ok"), ("handler", "t.ok", True),
            ("after", "t.ok", "fine", None), ("worker_stop",),
            ("worker_start",), ("before", "t.bad"), ("before-2", "t.bad"), ("handler", "t.bad", True),
            ("failure", "t.bad", "ValueError"), ("after", "t.bad", None, "ValueError"), ("worker_stop",),
        ]
        # The broken after_task hook changed no outcome, and said so.
        done = await app.result(ok_id)
        assert done is not None and done.ok and done.result == "fine"
        failed_outcome = await app.result(bad_id)
        assert failed_outcome is not None and failed_outcome.error == "ValueError: no"
        assert any("after_task hook" in record.getMessage() and "RuntimeError" in record.getMessage()
                   for record in caplog.records)


async def test_a_before_task_hook_that_raises_fails_the_attempt_and_the_handler_never_runs(db_url: str) -> None:
    ran: list[str] = []
    seen: list[str] = []
    async with make_app(db_url) as app:
        @app.before_task
        def refuse_it(ctx: TaskContext) -> None:
            raise PermissionError("not today")

        @app.on_failure
        def failed(ctx: TaskContext, error: BaseException) -> None:
            seen.append(type(error).__name__)

        @app.task(queue="hooked", max_attempts=1)
        async def guarded(ctx: TaskContext) -> None:
            ran.append("ran")

        job_id = await guarded.defer()
        stats = await drained(app)
        assert stats.failed == 1 and ran == [] and seen == ["PermissionError"]
        outcome = await app.result(job_id)
        assert outcome is not None and outcome.status is JobStatus.FAILED
        assert outcome.error == "PermissionError: not today"


async def test_a_worker_start_hook_that_raises_stops_the_start_before_any_claim(db_url: str) -> None:
    stopped: list[str] = []
    async with make_app(db_url) as app:
        @app.on_worker_start
        async def no_config() -> None:
            raise RuntimeError("missing configuration")

        @app.on_worker_stop
        def stop() -> None:
            stopped.append("stop")

        @app.task(queue="hooked")
        async def waiting(ctx: TaskContext) -> None: ...

        job_id = await waiting.defer()
        with pytest.raises(RuntimeError):
            await drained(app)
        info = await app.source.get_job(job_id)
        assert info is not None and info.status is JobStatus.PENDING and info.attempt == 0  # nothing claimed
        assert stopped == []  # never started, so never stopped


async def test_the_workers_own_cancellation_runs_no_hook_after_the_handler(db_url: str) -> None:
    after: list[str] = []
    started = asyncio.Event()
    async with make_app(db_url) as app:
        @app.after_task
        def record(ctx: TaskContext, result: Any, error: BaseException | None) -> None:
            after.append(type(error).__name__ if error else "returned")

        @app.on_failure
        def failure(ctx: TaskContext, error: BaseException) -> None:
            after.append("failure")

        @app.task(queue="hooked")
        async def long(ctx: TaskContext) -> None:
            started.set()
            await asyncio.wait_for(asyncio.Event().wait(), HANG_GUARD_S)

        job_id = await long.defer()
        stop = asyncio.Event()
        worker = asyncio.ensure_future(app.worker(idle_wait_s=0.1, shutdown_grace_s=0).run(stop))
        await asyncio.wait_for(started.wait(), HANG_GUARD_S)
        stop.set()
        stats = await asyncio.wait_for(worker, HANG_GUARD_S)
        assert stats.released == 1 and after == []
        outcome = await app.result(job_id)
        assert outcome is not None and outcome.status is JobStatus.PENDING


def test_a_hook_must_be_a_function() -> None:
    app = TaskApp("sqlite:///unused.db")

    def generator(ctx: Any) -> Any:
        yield ctx

    for register in (app.before_task, app.after_task, app.on_failure, app.on_worker_start, app.on_worker_stop):
        for target in (object(), generator, print):
            with pytest.raises(ConfigValidationError) as refused:
                register(target)  # type: ignore[arg-type]
            assert refused.value.fields == ("function",) and refused.value.reason == "invalid_hook"
    assert all(app.hooks(kind) == [] for kind in ("before_task", "after_task", "on_failure"))
    with pytest.raises(ConfigValidationError):
        app.hooks("after_everything")


async def test_no_hook_runs_after_a_handler_that_swallowed_the_workers_cancellation(db_url: str) -> None:
    after: list[str] = []
    started = asyncio.Event()
    async with make_app(db_url) as app:
        @app.after_task
        def record(ctx: TaskContext, result: Any, error: BaseException | None) -> None:
            after.append(repr(result))

        @app.task(queue="hooked")
        async def stubborn(ctx: TaskContext) -> str:
            started.set()
            try:
                await asyncio.wait_for(asyncio.Event().wait(), HANG_GUARD_S)
            except asyncio.CancelledError:
                return "swallowed"  # the worker's cancellation, swallowed
            return "hang guard"

        await stubborn.defer()
        stop = asyncio.Event()
        worker = asyncio.ensure_future(app.worker(idle_wait_s=0.1, shutdown_grace_s=0).run(stop))
        await asyncio.wait_for(started.wait(), HANG_GUARD_S)
        stop.set()
        await asyncio.wait_for(worker, HANG_GUARD_S)
        assert after == []


async def test_a_hook_after_the_fact_that_raises_a_base_exception_changes_no_outcome(db_url: str) -> None:
    async with make_app(db_url) as app:
        @app.after_task
        def leaving(ctx: TaskContext, result: Any, error: BaseException | None) -> None:
            raise SystemExit(1)

        @app.on_failure
        async def cancelled_inside(ctx: TaskContext, error: BaseException) -> None:
            raise asyncio.CancelledError()  # its own, not the worker's

        @app.task(queue="hooked", name="t.fine")
        async def fine(ctx: TaskContext) -> str:
            return "kept"

        @app.task(queue="hooked", name="t.failing", max_attempts=1)
        async def failing(ctx: TaskContext) -> None:
            raise ValueError("its own error")

        fine_id, failing_id = await fine.defer(), await failing.defer()
        stats = await drained(app)
        assert (stats.completed, stats.failed) == (1, 1)
        kept = await app.result(fine_id)
        assert kept is not None and kept.ok and kept.result == "kept"
        failed = await app.result(failing_id)
        assert failed is not None and failed.error == "ValueError: its own error"


async def test_a_run_the_worker_refuses_runs_no_worker_hook(db_url: str) -> None:
    calls: list[str] = []
    async with make_app(db_url) as app:
        @app.on_worker_start
        def start() -> None:
            calls.append("start")

        @app.on_worker_stop
        def stop() -> None:
            calls.append("stop")

        @app.task(queue="hooked")
        async def nothing(ctx: TaskContext) -> None: ...

        worker = app.worker(idle_wait_s=0.1)
        await asyncio.wait_for(worker.run_until_idle(), HANG_GUARD_S)
        assert calls == ["start", "stop"]
        with pytest.raises(ConfigValidationError):
            await worker.run_until_idle()  # a second run: refused by the worker
        with pytest.raises(ConfigValidationError):
            await app.worker().run(stop="not an event")  # type: ignore[arg-type]
        assert calls == ["start", "stop"]


async def test_an_apps_launch_runs_the_worker_hooks_and_a_failing_start_fails_the_entry(db_url: str) -> None:
    from tenure.adapters import App

    calls: list[str] = []
    app = App(db_url)

    @app.on_worker_start
    def start() -> None:
        calls.append("start")

    @app.on_worker_stop
    def stop() -> None:
        calls.append("stop")

    @app.task(queue="hooked")
    async def ping(ctx: TaskContext) -> str:
        return "pong"

    @app.workflow(name="hooked_flow")
    async def flow(ctx: Any) -> None:
        return None

    async with app.launch(migrate=False):
        job_id = await ping.defer()
        outcome = await app.result(job_id, wait_s=HANG_GUARD_S)
        assert outcome is not None and outcome.ok and calls == ["start"]
    assert calls == ["start", "stop"]

    failing = App(db_url)

    @failing.on_worker_start
    def refuse_to_start() -> None:
        raise RuntimeError("no configuration")

    @failing.task(queue="hooked")
    async def other(ctx: TaskContext) -> None: ...

    entered: list[str] = []
    with pytest.raises(RuntimeError):
        async with failing.launch(migrate=False):
            entered.append("the block ran")  # never: the entry itself fails
    assert entered == []
    await app.close()
    await failing.close()
