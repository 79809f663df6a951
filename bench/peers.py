"""The peer queues' own worker loops on the same server, for comparison with tenure.

Runs in its own virtual environment (bench/run.sh installs procrastinate, pgqueuer and
saq there, never into tenure's). Two measures:

* burn-down: for each peer and each concurrency, install its schema in a fresh
  database, enqueue and process a warm-up, enqueue ``jobs`` no-op jobs, then time how
  long its worker loop takes to run them all to completion; every (peer, concurrency)
  ``ROUNDS`` times (or that concurrency's own count), taking turns. "Concurrency" is each peer's own knob: one
  procrastinate worker with ``concurrency=C``, one saq Worker with ``concurrency=C``, and
  C pgqueuer QueueManagers (pgqueuer's unit of parallelism: one connection each, each
  dispatching the jobs of its fetched batch at once). Prints
  ``{"bench": "burn_down", "peer": ..., "batch": ..., "workers": C, "jobs": ..., "rounds": [...],
  "jobs_per_second": median}``;
* latency: an idle worker (concurrency 1, each peer's LISTEN/NOTIFY wake-up with a 5 s
  fallback poll or dequeue timeout) and one job enqueued at a time, ``spacing`` apart:
  the time from just before the enqueue call to the task's first line (same process,
  ``time.perf_counter``). Prints ``{"bench": "latency", "peer": ..., "p50_ms": ..., "p99_ms": ...}``.

    python bench/peers.py DSN JOBS CONCURRENCIES ROUNDS [LATENCY_SAMPLES]
    (CONCURRENCIES: comma-separated, each C or C:R for R rounds instead of ROUNDS,
    e.g. 1:1,4,16:1)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
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


MEASURED: dict[tuple[str, int, int], list[float]] = {}
"""(peer, batch, workers): one figure per round."""
IDLE_WAIT_S = 5.0
"""The latency workers' fallback poll (or dequeue timeout): only NOTIFY is faster."""


def report(peer: str, batch: int, workers: int, jobs: int, seconds: float) -> None:
    """Keep one round's figure; ``main`` prints the median of the rounds."""
    MEASURED.setdefault((peer, batch, workers), []).append(round(jobs / seconds, 1))


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
            for start in range(0, size, 50):  # saq enqueues one job per call: 50 calls at a time
                await asyncio.gather(*(queue.enqueue("noop") for _ in range(min(50, size - start))))
            async def drain() -> None:
                worker = Worker(queue, functions=[noop], concurrency=workers, burst=True, dequeue_timeout=0.5)
                await worker.start()
                with contextlib.suppress(Exception):
                    await worker.stop()

            elapsed = await until_done(drain, lambda: queue.count("incomplete"))
        report("saq", 1, workers, jobs, elapsed)
    finally:
        await queue.disconnect()


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile (as bench/tenure_bench.py)."""
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(len(ordered) * fraction))) - 1]


class Timing:
    """One sample at a time: the task's start time for the sample waited on."""

    def __init__(self) -> None:
        self.waiting: asyncio.Future[float] | None = None

    def started(self) -> None:
        now = time.perf_counter()
        if self.waiting is not None and not self.waiting.done():
            self.waiting.set_result(now)

    async def sample(self, enqueue: Callable[[int], Awaitable[Any]], n: int) -> float:
        self.waiting = asyncio.get_running_loop().create_future()
        before = time.perf_counter()
        await enqueue(n)
        return await asyncio.wait_for(self.waiting, 3 * IDLE_WAIT_S) - before


async def sample_latencies(peer: str, timing: Timing, enqueue: Callable[[int], Awaitable[Any]], samples: int,
                           spacing_s: float, note: str) -> None:
    warmup = max(3, samples // 10)
    latencies = []
    for n in range(warmup + samples):
        latency = await timing.sample(enqueue, n)
        if n >= warmup:
            latencies.append(latency)
        await asyncio.sleep(spacing_s)
    print(json.dumps({"bench": "latency", "peer": peer, "samples": samples, "spacing_ms": spacing_s * 1000,
                      "wake_up": note, "p50_ms": round(statistics.median(latencies) * 1000, 3),
                      "p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
                      "max_ms": round(max(latencies) * 1000, 3)}), flush=True)


async def settle(ready: Callable[[], bool] | None = None) -> None:
    """Let a just-started worker reach its idle wait (LISTEN issued) before sampling."""
    for _ in range(200):
        if ready is not None and ready():
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)


async def procrastinate_latency(server_dsn: str, samples: int, spacing_s: float) -> None:
    import procrastinate

    dsn = await fresh_database(server_dsn)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    timing = Timing()

    @app.task(name="started")
    async def started(n: int) -> None:
        timing.started()

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        worker = asyncio.create_task(app.run_worker_async(
            concurrency=1, wait=True, listen_notify=True, fetch_job_polling_interval=IDLE_WAIT_S,
            install_signal_handlers=False))
        await settle()
        try:
            await sample_latencies("procrastinate", timing, lambda n: started.defer_async(n=n), samples, spacing_s,
                                   "LISTEN/NOTIFY (listen_notify=True, fetch_job_polling_interval=5)")
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker


async def pgqueuer_latency(server_dsn: str, samples: int, spacing_s: float) -> None:
    from pgqueuer import AsyncpgDriver, QueueManager
    from pgqueuer.queries import Queries

    dsn = await fresh_database(server_dsn)
    worker_connection = await asyncpg.connect(dsn)
    enqueue_connection = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(enqueue_connection)).install()
        manager = QueueManager(Queries(AsyncpgDriver(worker_connection)))
        timing = Timing()

        @manager.entrypoint("started")
        async def started(job: Any) -> None:
            timing.started()

        worker = asyncio.create_task(manager.run(dequeue_timeout=timedelta(seconds=IDLE_WAIT_S), batch_size=1,
                                                 log_aggregation_interval=timedelta(0)))
        await settle()
        queries = Queries(AsyncpgDriver(enqueue_connection))
        try:
            await sample_latencies("pgqueuer", timing, lambda n: queries.enqueue("started", str(n).encode()), samples,
                                   spacing_s, "LISTEN/NOTIFY (dequeue_timeout=5 s, batch_size=1)")
        finally:
            manager.shutdown.set()
            await asyncio.wait_for(worker, 30)
    finally:
        await enqueue_connection.close()
        await worker_connection.close()


SAQ_TIMING = Timing()


async def started(ctx: Any, *, n: int) -> None:
    """saq's latency task ("started")."""
    SAQ_TIMING.started()


async def saq_latency(server_dsn: str, samples: int, spacing_s: float) -> None:
    from saq import Worker
    from saq.queue.postgres import PostgresQueue

    dsn = await fresh_database(server_dsn)
    queue = PostgresQueue.from_url(dsn)
    await queue.connect()
    try:
        worker = Worker(queue, functions=[started], concurrency=1, dequeue_timeout=IDLE_WAIT_S)
        running = asyncio.create_task(worker.start())
        await settle()
        try:
            await sample_latencies("saq", SAQ_TIMING, lambda n: queue.enqueue("started", n=n), samples, spacing_s,
                                   "LISTEN/NOTIFY (PostgresQueue's listener, dequeue_timeout=5 s)")
        finally:
            with contextlib.suppress(Exception):
                await worker.stop()
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await running
    finally:
        await queue.disconnect()


async def main(server_dsn: str, jobs: int, concurrencies: dict[int, int], latency_samples: int) -> None:
    """Every peer at every concurrency as many rounds as ``concurrencies`` gives it,
    taking turns (as tenure's subjects do); the median counts. Then the latencies."""
    warmup = max(50, jobs // 10)
    for round_ in range(max(concurrencies.values())):
        for workers in (c for c, rounds in concurrencies.items() if round_ < rounds):
            await procrastinate_burn_down(server_dsn, jobs, workers, warmup)
            await pgqueuer_burn_down(server_dsn, jobs, workers, warmup, batch=1)
            await pgqueuer_burn_down(server_dsn, jobs, workers, warmup, batch=10)
            await saq_burn_down(server_dsn, jobs, workers, warmup)
    for (peer, batch, workers), measured in MEASURED.items():
        print(json.dumps({"bench": "burn_down", "peer": peer, "batch": batch, "workers": workers, "jobs": jobs,
                          "rounds": measured, "jobs_per_second": statistics.median(measured)}), flush=True)
    if latency_samples:
        for latency in (procrastinate_latency, pgqueuer_latency, saq_latency):
            await latency(server_dsn, latency_samples, 0.02)


def concurrency_rounds(spec: str, rounds: int) -> dict[int, int]:
    """``"1:1,4,16:1"`` with ROUNDS 3: {1: 1, 4: 3, 16: 1} (rounds per concurrency)."""
    parsed = {}
    for item in spec.split(","):
        concurrency, _, own = item.partition(":")
        parsed[int(concurrency)] = int(own) if own else rounds
    return parsed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), concurrency_rounds(sys.argv[3], int(sys.argv[4])),
                     int(sys.argv[5]) if len(sys.argv) > 5 else 0))
