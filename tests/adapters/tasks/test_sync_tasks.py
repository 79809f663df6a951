"""Plain ``def`` tasks (issue 52 item 1), on every database: a worker runs each in a thread
of its own while its event loop keeps renewing the claim's lease, and writes the outcome
under the claim's fence as for an async task (results, exceptions, ``FailJob``,
``SystemExit``); ``threads`` bounds how many run at once; a thread that cannot be stopped
at its timeout runs on detached, counted, and what it returns is never written; a program
left with such a thread still exits. Registration refuses what could never run.

No test waits on a clock: the handlers block on events the test sets once it saw what it
waits for (each bounded by a hang guard).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys
import threading
from typing import Any

import pytest

from polling import until
from tenure.adapters import Backoff, TaskApp, TaskContext
from tenure.adapters.queue import FailJob
from tenure.model import ConfigValidationError, JobStatus, WorkerConfig

HANG_GUARD_S = 120.0
NO_RETRY = Backoff(base_s=0, max_s=0, jitter=False)


def make_app(db_url: str, *, lease_seconds: float = 5) -> TaskApp:
    return TaskApp(db_url, config=WorkerConfig(db_url, lease_seconds=lease_seconds, heartbeat_seconds=1))


async def drained(app: TaskApp, **settings: Any) -> Any:
    return await asyncio.wait_for(app.worker(idle_wait_s=0.1, **settings).run_until_idle(), HANG_GUARD_S)


async def test_a_plain_function_runs_in_a_thread_and_its_outcome_is_written_as_an_async_tasks(db_url: str) -> None:
    loop_thread = threading.current_thread()
    seen: list[tuple[str, int]] = []
    async with make_app(db_url) as app:
        @app.task(queue="plain", max_attempts=2, retry=NO_RETRY)
        def square(ctx: TaskContext, n: int) -> dict[str, Any]:
            assert threading.current_thread() is not loop_thread and ctx.task_name == square.name
            seen.append((threading.current_thread().name, ctx.attempt))
            if n < 0:
                raise ValueError("negative")
            if n == 0:
                raise FailJob("zero is refused")
            return {"square": n * n}

        @app.task(queue="plain", max_attempts=1)
        def leaving(ctx: TaskContext) -> None:
            raise SystemExit(2)

        ok, bad, zero, gone = (await square.defer(n=7), await square.defer(n=-1), await square.defer(n=0),
                               await leaving.defer())
        stats = await drained(app)
        assert (stats.completed, stats.retried, stats.failed) == (1, 1, 3)
        done = await app.result(ok)
        assert done is not None and done.ok and done.result == {"square": 49}
        failed = await app.result(bad)
        assert failed is not None and failed.status is JobStatus.FAILED and failed.attempts == 2
        assert failed.error == "ValueError: negative"
        refused = await app.result(zero)
        assert refused is not None and refused.attempts == 1 and refused.error == "FailJob: zero is refused"
        exited = await app.result(gone)
        assert exited is not None and exited.status is JobStatus.FAILED
        assert exited.error is not None and exited.error.startswith("SystemExit")
        assert all(name.startswith("tenure-task-") for name, _ in seen) and len(seen) == 4


async def test_a_plain_task_called_in_process_runs_in_the_callers_thread() -> None:
    app = TaskApp("sqlite:///unused.db")

    @app.task(name="x.double")
    def double(ctx: Any, n: int) -> tuple[int, bool]:
        return 2 * n, threading.current_thread() is threading.main_thread()

    assert await double(None, n=4) == (8, True)


async def test_the_loop_renews_the_lease_while_a_plain_task_blocks_its_thread(db_url: str) -> None:
    release = threading.Event()
    async with make_app(db_url) as app:
        @app.task(queue="plain")
        def blocking(ctx: TaskContext) -> str:
            if not release.wait(HANG_GUARD_S):
                return "released by the hang guard"
            return "released"

        job_id = await blocking.defer()
        worker = asyncio.ensure_future(drained(app))

        async def claimed_until() -> Any:
            info = await app.source.get_job(job_id)
            return info.lease_expires_at if info is not None and info.status is JobStatus.CLAIMED else None

        try:
            first = await until(claimed_until, HANG_GUARD_S, what="the task claimed")
            # Renewed while the thread blocks: the event loop was free to send heartbeats.
            await until(lambda: _later(claimed_until, first), HANG_GUARD_S, what="the lease renewed")
        finally:
            release.set()
        stats = await worker
        assert stats.completed == 1 and stats.lease_losses == 0
        outcome = await app.result(job_id)
        assert outcome is not None and outcome.ok and outcome.result == "released"


async def _later(read: Any, first: Any) -> bool:
    now = await read()
    return now is not None and now > first


async def test_threads_bounds_how_many_plain_tasks_run_at_once(db_url: str) -> None:
    gate = threading.Event()
    lock = threading.Lock()
    running: list[int] = [0]
    most: list[int] = [0]
    async with make_app(db_url) as app:
        @app.task(queue="plain")
        def held(ctx: TaskContext, n: int) -> int:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            try:
                gate.wait(HANG_GUARD_S)
                return n
            finally:
                with lock:
                    running[0] -= 1

        ids = [await held.defer(n=n) for n in range(3)]
        worker = asyncio.ensure_future(drained(app, concurrency=4, threads=1))

        async def all_claimed() -> bool:
            infos = [await app.source.get_job(job_id) for job_id in ids]
            return all(info is not None and info.status is JobStatus.CLAIMED for info in infos)

        try:
            await until(all_claimed, HANG_GUARD_S, what="every task claimed")  # all three hold a slot
            await asyncio.sleep(0.2)  # a thread the bound failed to hold back would have started by now
            assert most[0] == 1
        finally:
            gate.set()
        stats = await worker
        assert stats.completed == 3 and most[0] == 1


async def test_a_plain_task_past_its_timeout_fails_and_its_thread_runs_on_detached(db_url: str) -> None:
    release = threading.Event()
    returned: list[str] = []
    async with make_app(db_url) as app:
        @app.task(queue="plain", max_attempts=1, timeout_s=0.2)
        def stuck(ctx: TaskContext) -> str:
            release.wait(HANG_GUARD_S)
            returned.append("late")
            return "late result"

        job_id = await stuck.defer()
        stats = await drained(app)
        assert (stats.failed, stats.completed) == (1, 0) and app.abandoned == 1 and returned == []
        outcome = await app.result(job_id)
        assert outcome is not None and outcome.status is JobStatus.FAILED
        assert outcome.error is not None and outcome.error.startswith("TaskTimeout")
        release.set()
        await until(lambda: bool(returned), HANG_GUARD_S, what="the detached thread ends")
        after = await app.result(job_id)
        assert after is not None and (after.status, after.result) == (JobStatus.FAILED, None)


def test_registration_takes_plain_functions_and_refuses_what_could_never_run() -> None:
    app = TaskApp("sqlite:///unused.db")

    def plain(ctx: Any) -> None: ...

    def generator(ctx: Any) -> Any:
        yield 1

    async def async_generator(ctx: Any) -> Any:
        yield 1

    assert app.task(name="x.plain")(plain).sync and not app.task(name="x.coroutine")(_coroutine).sync
    for target in (generator, async_generator, object(), print):
        with pytest.raises(ConfigValidationError) as refused:
            app.task(name="x.other")(target)
        assert refused.value.fields == ("function",) and refused.value.problems == ("function_required",)
    for threads in (0, -1, 1001, 2.0, True, "4"):
        with pytest.raises(ConfigValidationError) as bad:
            app.worker(threads=threads)
        assert bad.value.fields == ("threads",)


async def _coroutine(ctx: Any) -> None: ...


PROGRAM = '''
import asyncio
import os
import threading

from tenure.adapters import TaskApp, TaskContext

app = TaskApp(os.environ["EXIT_DB"])
forever = threading.Event()


@app.task(queue="plain", name="stuck", max_attempts=1, timeout_s=0.2)
def stuck(ctx: TaskContext) -> None:
    forever.wait()


async def main() -> None:
    await stuck.defer()
    await app.worker(idle_wait_s=0.1).run_until_idle()
    print("abandoned", app.abandoned)
    await app.close()


asyncio.run(main())
'''


async def test_a_program_with_a_detached_plain_task_still_exits(db_url: str, tmp_path: pathlib.Path) -> None:
    (tmp_path / "program.py").write_text(PROGRAM, encoding="utf-8")
    try:
        ended = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-P", "program.py"], cwd=tmp_path, capture_output=True, text=True,
            timeout=HANG_GUARD_S, check=False, env={**os.environ, "EXIT_DB": db_url})
    except subprocess.TimeoutExpired:
        pytest.fail(f"the program did not exit within {HANG_GUARD_S:.0f} s: a stuck thread held it open")
    assert ended.returncode == 0 and "abandoned 1" in ended.stdout, ended.stdout + ended.stderr


async def test_waiting_for_a_thread_is_not_on_the_timeout_and_a_detached_thread_keeps_its_slot(db_url: str) -> None:
    release_first = threading.Event()
    order: list[str] = []
    async with make_app(db_url) as app:
        @app.task(queue="plain", max_attempts=1, timeout_s=0.2, priority=90)
        def first(ctx: TaskContext) -> None:
            order.append("first")
            release_first.wait(HANG_GUARD_S)  # ignores its timeout: detached, it keeps its thread
            order.append("first ended")

        @app.task(queue="plain", max_attempts=1, timeout_s=0.2, priority=10)
        def second(ctx: TaskContext) -> str:
            order.append("second")
            return "in time"

        first_id = await first.defer()
        second_id = await second.defer()
        worker = asyncio.ensure_future(drained(app, concurrency=2, threads=1))
        try:
            await until(lambda: _status_is(app, first_id, JobStatus.FAILED), HANG_GUARD_S, what="first timed out")
            await asyncio.sleep(0.6)  # longer than second's timeout: were the wait on it, second would fail
            assert order == ["first"] and app.abandoned == 1  # second waits: first's thread still runs
        finally:
            release_first.set()
        stats = await worker
        assert stats.completed == 1 and order[:2] == ["first", "first ended"] and order[2] == "second"
        done = await app.result(second_id)
        assert done is not None and done.ok and done.result == "in time"


async def _status_is(app: TaskApp, job_id: str, status: JobStatus) -> bool:
    info = await app.source.get_job(job_id)
    return info is not None and info.status is status


async def test_a_plain_wrapper_of_an_async_function_is_an_async_task(db_url: str) -> None:
    import functools

    def traced(function: Any) -> Any:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)  # the coroutine, for the worker to await
        return wrapper

    async with make_app(db_url) as app:
        @app.task(queue="plain")
        @traced
        async def wrapped(ctx: TaskContext, n: int) -> int:
            return n + 1

        assert not wrapped.sync
        job_id = await wrapped.defer(n=1)
        stats = await drained(app)
        assert stats.completed == 1
        outcome = await app.result(job_id)
        assert outcome is not None and outcome.result == 2
