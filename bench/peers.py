"""No-op burn-down with the peer queues, for comparison with tenure on the same server.

Runs in its own virtual environment (bench/run.sh installs procrastinate, pgqueuer and
saq there, never into tenure's). For each peer: install its schema in a fresh
database, enqueue the jobs, process a warm-up, then time how long its workers take to
run ``jobs`` no-op jobs to completion, ``ROUNDS`` times. Prints one JSON object per line:
``{"peer": ..., "batch": ..., "workers": ..., "jobs": ..., "rounds": [...], "jobs_per_second": median}``.

    python bench/peers.py DSN JOBS WORKERS ROUNDS
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import time
import uuid
from datetime import timedelta
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg


async def fresh_database(server_dsn: str) -> str:
    name = "peer_" + uuid.uuid4().hex[:12]
    connection = await asyncpg.connect(server_dsn)
    try:
        await connection.execute(f"CREATE DATABASE {name}")
    finally:
        await connection.close()
    return server_dsn.rsplit("/", 1)[0] + "/" + name


MEASURED: dict[tuple[str, int], list[float]] = {}
WORKERS_AND_JOBS: dict[str, int] = {}


def report(peer: str, batch: int, workers: int, jobs: int, seconds: float) -> None:
    """Keep one round's figure; ``main`` prints the median of the rounds."""
    MEASURED.setdefault((peer, batch), []).append(round(jobs / seconds, 1))
    WORKERS_AND_JOBS.update(workers=workers, jobs=jobs)


async def until_done(drain: Callable[[], Awaitable[None]], unfinished: Callable[[], Awaitable[int]]) -> float:
    """Seconds for ``drain`` to leave no job unfinished, counted by the peer's own table:
    a worker that stops early (a burst mode racing its last fetch) must not inflate the
    rate, so draining repeats, inside the timed window, until nothing is left."""
    started = time.perf_counter()
    await drain()
    for passes in range(1, 21):
        if await unfinished() == 0:
            if passes > 1:
                print(f"(a peer needed {passes} passes to finish every job)", file=sys.stderr)
            return time.perf_counter() - started
        await drain()
    raise RuntimeError("the peer left jobs unfinished")


async def count(dsn: str, sql: str) -> int:
    connection = await asyncpg.connect(dsn)
    try:
        return int(await connection.fetchval(sql))
    finally:
        await connection.close()


async def procrastinate_burn_down(server_dsn: str, jobs: int, workers: int, warmup: int) -> None:
    import procrastinate

    dsn = await fresh_database(server_dsn)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for size in (warmup, jobs):
            for start in range(0, size, 1000):
                await noop.batch_defer_async(*({} for _ in range(min(1000, size - start))))
            elapsed = await until_done(
                lambda: app.run_worker_async(concurrency=workers, wait=False, install_signal_handlers=False),
                lambda: count(dsn, "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"),
            )
        report("procrastinate", 1, workers, jobs, elapsed)


async def pgqueuer_burn_down(server_dsn: str, jobs: int, workers: int, warmup: int, batch: int) -> None:
    from pgqueuer import AsyncpgDriver, QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    dsn = await fresh_database(server_dsn)
    connection = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(connection))
        await queries.install()
    finally:
        await connection.close()

    async def drain() -> None:
        async def one_worker() -> None:
            worker_connection = await asyncpg.connect(dsn)
            try:
                manager = QueueManager(Queries(AsyncpgDriver(worker_connection)))

                @manager.entrypoint("noop")
                async def noop(job: Any) -> None:
                    return None

                await manager.run(
                    dequeue_timeout=timedelta(seconds=0.2), batch_size=batch, mode=QueueExecutionMode.drain,
                    log_aggregation_interval=timedelta(0),
                )
            finally:
                await worker_connection.close()

        await asyncio.gather(*(one_worker() for _ in range(workers)))

    for size in (warmup, jobs):
        connection = await asyncpg.connect(dsn)
        try:
            queries = Queries(AsyncpgDriver(connection))
            for start in range(0, size, 1000):
                count = min(1000, size - start)
                await queries.enqueue(["noop"] * count, [None] * count, [0] * count)
        finally:
            await connection.close()
        elapsed = await until_done(drain, lambda: pgqueuer_left(dsn))
    report("pgqueuer", batch, workers, jobs, elapsed)


async def pgqueuer_left(dsn: str) -> int:
    from pgqueuer import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(dsn)
    try:
        return sum(entry.count for entry in await Queries(AsyncpgDriver(connection)).queue_size())
    finally:
        await connection.close()


async def noop(ctx: Any) -> None:
    """saq registers functions by their qualified name: this one is "noop"."""
    return None


async def saq_burn_down(server_dsn: str, jobs: int, workers: int, warmup: int) -> None:
    from saq import Worker
    from saq.queue.postgres import PostgresQueue

    dsn = await fresh_database(server_dsn)
    queue = PostgresQueue.from_url(dsn)
    await queue.connect()
    try:
        for size in (warmup, jobs):
            for _ in range(size):
                await queue.enqueue("noop")
            async def drain() -> None:
                worker = Worker(queue, functions=[noop], concurrency=workers, burst=True, dequeue_timeout=0.5)
                await worker.start()
                with contextlib.suppress(Exception):
                    await worker.stop()

            elapsed = await until_done(drain, lambda: queue.count("incomplete"))
        report("saq", 1, workers, jobs, elapsed)
    finally:
        await queue.disconnect()


async def main(server_dsn: str, jobs: int, workers: int, rounds: int) -> None:
    """Every peer ``rounds`` times, taking turns (as tenure's subjects do); the median counts."""
    warmup = max(50, jobs // 10)
    for _ in range(rounds):
        await procrastinate_burn_down(server_dsn, jobs, workers, warmup)
        await pgqueuer_burn_down(server_dsn, jobs, workers, warmup, batch=1)
        await pgqueuer_burn_down(server_dsn, jobs, workers, warmup, batch=10)
        await saq_burn_down(server_dsn, jobs, workers, warmup)
    for (peer, batch), measured in MEASURED.items():
        print(json.dumps({"peer": peer, "batch": batch, **WORKERS_AND_JOBS, "rounds": measured,
                          "jobs_per_second": statistics.median(measured)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
