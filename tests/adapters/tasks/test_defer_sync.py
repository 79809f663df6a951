"""Deferring from sync code on every database (``defer_sync``, ``defer_many_sync``,
``app.defer_sync``, ``app.result_sync``): the same checks, replay and errors as the async
forms, many threads at once, a refusal inside a running event loop and of ``using``,
nothing written by a refused call, and a script that defers and exits without closing."""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys
import threading
from typing import Any

import pytest

from tenure.adapters import App, TaskApp, TaskContext
from tenure.model import ConfigValidationError, JobStatus, TenureError, WorkerConfig

HANG_GUARD_S = 120
"""A program still running by then has hung."""


def make_app(db_url: str) -> tuple[TaskApp, Any]:
    app = TaskApp(db_url, config=WorkerConfig(db_url, lease_seconds=5, heartbeat_seconds=1))

    @app.task(queue="emails", name="send_welcome")
    def send_welcome(ctx: TaskContext, user_id: int) -> dict[str, int]:
        return {"sent": user_id}

    return app, send_welcome


def sync_view(task: Any, user_id: int) -> tuple[str, str]:
    """What a Django or Flask view does: no event loop in its thread."""
    first = task.defer_sync(user_id=user_id, submission_id=f"welcome-{user_id}")
    return first, task.defer_sync(user_id=user_id, submission_id=f"welcome-{user_id}")


async def test_sync_code_defers_with_the_same_replay_and_checks_and_reads_the_result(db_url: str) -> None:
    app, send_welcome = make_app(db_url)
    first, again = await asyncio.to_thread(sync_view, send_welcome, 42)
    assert first == again  # an exact replay answers the same job
    with pytest.raises(TenureError) as changed:
        await asyncio.to_thread(send_welcome.defer_sync, user_id=43, submission_id="welcome-42")
    assert changed.value.reason == "fingerprint_mismatch"
    by_name = await asyncio.to_thread(app.defer_sync, "send_welcome", {"user_id": 7})
    many = await asyncio.to_thread(send_welcome.defer_many_sync, [{"user_id": n} for n in range(3)])
    assert len({first, by_name, *many}) == 5
    stats = await app.worker(idle_wait_s=0.1).run_until_idle()
    assert stats.completed == 5
    outcome = await asyncio.to_thread(app.result_sync, first, wait_s=5)
    assert outcome is not None and outcome.status is JobStatus.COMPLETED and outcome.result == {"sent": 42}
    await app.close()  # closes the sync client too
    assert app.sync._loop is None


async def test_many_threads_defer_at_once_and_each_deferral_is_written_once(db_url: str) -> None:
    app, send_welcome = make_app(db_url)
    ids: list[str] = []
    lock = threading.Lock()

    def view(thread: int) -> None:
        for n in range(10):
            job_id = send_welcome.defer_sync(user_id=thread * 100 + n)
            with lock:
                ids.append(job_id)

    threads = [threading.Thread(target=view, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join, HANG_GUARD_S)
    assert len(ids) == 80 and len(set(ids)) == 80
    assert len(await app.source.list_tasks(limit=200)) == 80
    await asyncio.to_thread(app.close_sync)
    await app.close()


async def test_a_sync_call_inside_a_running_loop_and_a_sync_using_are_refused_with_nothing_written(
        db_url: str) -> None:
    app, send_welcome = make_app(db_url)
    with pytest.raises(ConfigValidationError) as inside:
        send_welcome.defer_sync(user_id=1)  # this test's own loop is running: it would block it
    assert (inside.value.fields, inside.value.problems) == (("defer_sync",), ("called_inside_a_running_event_loop",))
    with pytest.raises(ConfigValidationError) as inside_result:
        app.result_sync("any")
    assert inside_result.value.fields == ("result_sync",)
    with pytest.raises(ConfigValidationError) as using:
        await asyncio.to_thread(send_welcome.defer_sync, user_id=1, using=object())
    assert using.value.fields == ("using",)
    with pytest.raises(ConfigValidationError) as bad_args:
        await asyncio.to_thread(send_welcome.defer_sync, user_id=1, extra=2)
    assert bad_args.value.fields == ("args",)
    assert await app.source.list_tasks() == []
    await app.close()


async def test_an_app_with_workflows_defers_from_sync_code_on_connections_of_its_own(db_url: str) -> None:
    app = App(db_url)

    @app.task(queue="emails", name="send_welcome")
    async def send_welcome(ctx: TaskContext, user_id: int) -> None:
        return None

    before = await send_welcome.defer(user_id=4)  # the app's own source is open
    assert await app.ledger.list_runs() is not None  # and its own ledger
    job_id = await asyncio.to_thread(send_welcome.defer_sync, user_id=5)
    await asyncio.to_thread(app.close_sync)  # closes only the sync client's connections
    assert (await app.result(job_id)) is not None and (await app.result(before)) is not None  # still open
    assert (await app.ledger.list_runs()).items == ()
    await app.close()


async def test_a_call_under_way_when_the_client_closes_is_refused_not_left_waiting(db_url: str) -> None:
    app, send_welcome = make_app(db_url)
    job_id = await asyncio.to_thread(send_welcome.defer_sync, user_id=1)
    outcome: list[BaseException | Any] = []

    def waiting_view() -> None:
        try:
            outcome.append(app.result_sync(job_id, wait_s=HANG_GUARD_S))  # no worker: it waits the whole time
        except BaseException as error:  # noqa: BLE001 - what it raised is the outcome under test
            outcome.append(error)

    waiter = threading.Thread(target=waiting_view)
    waiter.start()

    async def waiting_on_the_loop() -> bool:
        loop = app.sync._loop
        return loop is not None and len(asyncio.all_tasks(loop)) >= 1

    from polling import until
    # (read from another thread: a set the loop changes meanwhile is read again)
    await until(waiting_on_the_loop, HANG_GUARD_S, what="the sync call under way", tolerate=(RuntimeError,))
    await asyncio.to_thread(app.close_sync)
    await asyncio.to_thread(waiter.join, HANG_GUARD_S)
    assert not waiter.is_alive(), "a sync call was left waiting after its client closed"
    (raised,) = outcome
    assert isinstance(raised, ConfigValidationError) and raised.problems == ("sync_client_closed",)
    assert await asyncio.to_thread(send_welcome.defer_sync, user_id=2)  # a later call opens the client again
    await app.close()


PROGRAM = '''
import os

from tenure.adapters import TaskApp

app = TaskApp(os.environ["SYNC_DB"])


@app.task(queue="emails", name="send_welcome")
def send_welcome(ctx, user_id: int) -> None: ...


print(send_welcome.defer_sync(user_id=1))
'''


async def test_a_script_that_defers_from_sync_code_and_never_closes_exits(db_url: str, tmp_path: pathlib.Path) -> None:
    (tmp_path / "script.py").write_text(PROGRAM, encoding="utf-8")
    environment = {**os.environ, "SYNC_DB": db_url}
    try:
        ended = await asyncio.to_thread(subprocess.run, [sys.executable, "-P", "script.py"], cwd=tmp_path,
                                        capture_output=True, text=True, timeout=HANG_GUARD_S, env=environment)
    except subprocess.TimeoutExpired:
        pytest.fail("a script that deferred from sync code and never closed did not exit")
    assert ended.returncode == 0, ended.stderr[-2000:]
    app = TaskApp(db_url)
    assert await app.result(ended.stdout.strip()) is not None
    await app.close()
