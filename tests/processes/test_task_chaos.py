"""Chaos for tasks: processes running a TaskApp's fenced Worker, killed with ``kill -9``
and restarted while they drain a queue of tasks, on every database.

At the end every task is completed, by its final claim (its stored result names the
generation it ran under, and that is the row's final generation), at most one completion
per task was answered True (the final generation's), no worker met a raw exception, and
nothing was lost. The figures are printed.
"""

from __future__ import annotations

import asyncio
import collections
import multiprocessing
import pathlib
import random
import time

import chaos_task_worker
import pytest
from test_chaos import read_log

from tenure.adapters import TaskApp

pytestmark = pytest.mark.slow

TASKS = 300
WORKERS = 4
LEASE_S = 1.5
CHAOS_WINDOW_S = 90.0
"""Workers are killed for this long; then the survivors finish (see test_chaos.py)."""
HANG_GUARD_S = 600.0
"""A run not finished by then hangs: a hang guard, not a timing."""

FORK_SERVER = multiprocessing.get_context("forkserver")
FORK_SERVER.set_forkserver_preload(["chaos_task_worker"])


async def defer_all(db_url: str) -> list[str]:
    async with TaskApp(db_url) as app:
        @app.task(queue="chaos", name="chaos.drain", max_attempts=10_000)
        async def drain(ctx: object, n: int) -> None: ...

        return await drain.defer_many([{"n": n} for n in range(TASKS)],
                                      submission_ids=[f"chaos-{n}" for n in range(TASKS)])


async def rows(db_url: str) -> dict[str, object]:
    async with TaskApp(db_url) as app:
        return {info.job_id: info for info in await app.source.list_tasks(limit=10_000)}


def test_task_workers_killed_at_random_finish_every_task_exactly_once(
    db_url: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_ids = asyncio.run(defer_all(db_url))
    log_path = tmp_path / "chaos.log"
    rng = random.Random(20261205)
    processes: dict[str, multiprocessing.process.BaseProcess] = {}
    names: dict[str, str] = {}
    serial = 0
    kills = 0
    exit_codes: list[int] = []

    def start(slot: str) -> None:
        nonlocal serial
        serial += 1
        names[slot] = f"{slot}-{serial}"
        process = FORK_SERVER.Process(target=chaos_task_worker.run_process, args=(
            db_url, str(log_path), names[slot], serial, LEASE_S, str(tmp_path / f"{names[slot]}.stderr")))
        process.start()
        processes[slot] = process

    for index in range(WORKERS):
        start(f"w{index}")
    started = time.monotonic()
    try:
        while True:
            time.sleep(rng.uniform(0.3, 0.8))
            # Kill only a process that finished a task (so every life makes progress).
            finished = {event["worker"] for event in read_log(log_path)
                        if event["event"] in ("completed", "refused")} if log_path.exists() else set()
            working = [slot for slot in sorted(processes) if names[slot] in finished]
            if working and time.monotonic() - started < CHAOS_WINDOW_S:
                slot = rng.choice(working)
                processes[slot].kill()
                processes[slot].join()
                kills += 1
                start(slot)
            for slot, process in list(processes.items()):
                if process.exitcode is not None:
                    exit_codes.append(process.exitcode)
                    start(slot)
            stored = asyncio.run(rows(db_url))
            if all(info.status.value == "completed" for info in stored.values()):  # type: ignore[attr-defined]
                break
            assert time.monotonic() - started < HANG_GUARD_S, "tasks unfinished after the hang guard"
    finally:
        for process in processes.values():
            process.kill()
        for process in processes.values():
            process.join()
    stored = asyncio.run(rows(db_url))
    events = read_log(log_path)
    accepted: dict[str, list[int]] = collections.defaultdict(list)
    for event in events:
        if event["event"] == "completed":
            accepted[event["job"]].append(event["generation"])
    raw = [event for event in events if event["event"] == "raw_exception"]
    assert not raw and 3 not in exit_codes, "a worker met a raw exception"
    assert sorted(stored) == sorted(job_ids), "a task was lost"
    for job_id in job_ids:
        info = stored[job_id]
        assert info.status.value == "completed"  # type: ignore[attr-defined]
        assert info.result["generation"] == info.generation, "finished by the final claim"  # type: ignore[attr-defined]
        assert accepted[job_id] in ([], [info.generation]), "at most one accepted completion, the final claim's"  # type: ignore[attr-defined]
    takeovers = sum(info.generation - 1 for info in stored.values())  # type: ignore[attr-defined]
    refused = sum(1 for event in events if event["event"] == "refused")
    with capsys.disabled():
        print(f"\ntask chaos: {TASKS} tasks, {kills} kills, {takeovers} takeovers, {refused} stale completions "
              f"refused, {sum(map(len, accepted.values()))} accepted completions logged, lost 0")
