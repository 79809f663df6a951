"""Absurd 0.5 (a durable-execution system on PostgreSQL) running no-op one-step tasks, the
peer of tenure's single-hop Runs (bench/runs.py).

Runs in the peers' environment (bench/run.sh installs ``absurd-sdk`` and ``absurdctl``
there), against a fresh database on the server it is given:

    python bench/absurd_tasks.py SERVER_DSN [TASKS] [ROUNDS]

The schema comes from ``absurdctl init``. For each concurrency (1, 4 and 16) and round, a
new queue is filled with ``TASKS`` spawned tasks before the clock starts; then one
``AsyncAbsurd`` worker (its own ``start_worker`` loop, claim batch = concurrency) runs
them until every task's completion has been written: each task runs one checkpointed
step (``ctx.step``) that returns None. Prints one JSON line per concurrency with the
rounds' tasks per second.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

from absurd_sdk import AsyncAbsurd

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from scratch_database import create_database  # noqa: E402

CONCURRENCIES = (1, 4, 16)


def fresh_database(server_dsn: str) -> str:
    url = create_database(server_dsn, "absurd")
    absurdctl = pathlib.Path(sys.executable).parent / "absurdctl"
    subprocess.run([str(absurdctl), "init"], env={**os.environ, "ABSURD_DATABASE_URL": url}, check=True,
                   capture_output=True)
    return url


class CountingAbsurd(AsyncAbsurd):
    """Counts tasks whose execution, completion write included, has returned."""

    finished = 0
    all_done: asyncio.Event

    async def _execute_task(self, task: Any, claim_timeout: int) -> None:
        await super()._execute_task(task, claim_timeout)
        self.finished += 1
        if self.finished >= self.expected:
            self.all_done.set()


async def one_run(url: str, tasks: int, concurrency: int) -> float:
    queue = f"q{uuid.uuid4().hex[:8]}"
    client = CountingAbsurd(url, queue_name=queue)
    client.expected = tasks
    client.all_done = asyncio.Event()

    @client.register_task("noop")
    async def noop(params: Any, ctx: Any) -> None:
        async def nothing() -> None:
            return None

        await ctx.step("one", nothing)

    await client.create_queue(queue)
    task_ids = [(await client.spawn("noop", {"n": n}))["task_id"] for n in range(tasks)]
    started = time.perf_counter()
    worker = asyncio.ensure_future(client.start_worker(worker_id="bench", concurrency=concurrency, poll_interval=0.05))
    await client.all_done.wait()
    elapsed = time.perf_counter() - started
    client.stop_worker()
    await worker
    for task_id in task_ids[:: max(1, tasks // 20)]:  # a sample: every task really completed
        snapshot = await client.fetch_task_result(task_id)
        assert snapshot is not None and snapshot.state == "completed", snapshot
    await client.close()
    return tasks / elapsed


async def main(server_dsn: str, tasks: int, rounds: int) -> None:
    url = fresh_database(server_dsn)
    await one_run(url, max(10, tasks // 10), 4)  # warm-up
    for concurrency in CONCURRENCIES:
        measured = [round(await one_run(url, tasks, concurrency), 1) for _ in range(rounds)]
        print(json.dumps({"bench": "absurd_tasks", "concurrency": concurrency, "tasks": tasks, "rounds": measured,
                          "tasks_per_second": statistics.median(measured)}), flush=True)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    asyncio.run(main(arguments[0], int(arguments[1]) if len(arguments) > 1 else 400,
                     int(arguments[2]) if len(arguments) > 2 else 3))
