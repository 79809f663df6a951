"""tenure's own benchmarks, each beside the floor that does the same work with least effort.

Prints one JSON object per line (bench/report.py turns them into RESULTS.md):

* ``cycle``: owned submit + claim + heartbeat + complete per job, at 1, 4 and 16 workers,
  for tenure and three hand-written floors doing the same fenced work: ``floor`` (one
  autocommit statement per step, four round trips per job, which does not keep tenure's
  lock-then-clock guarantee), ``locked_floor`` (the guarantee with the fewest asyncpg round
  trips) and ``pipelined_locked_floor`` (the same on psycopg's pipeline mode);
* ``per_call``: microseconds of wall time and client CPU (``time.process_time``) per owned
  submit, claim, heartbeat and complete, one call at a time, for tenure, the floor and the
  lock-first floor;
* ``burn_down``: pre-submitted no-op jobs claimed and completed (the peers' benchmark),
  one job at a time and in batches of 10, for tenure and the floors;
* ``claim_latency``: median and 99th percentile of one owned claim with 1,000, 100,000
  and 1,000,000 waiting rows;
* ``worker``: the fenced worker runtime end to end (``tenure.adapters.Worker``): waiting
  no-op jobs drained by one Worker at concurrency 1, 4 and 16 (batch 1), and 16 with
  batch 10 (bench/peers.py runs the peers' own worker loops at the same concurrencies);
* ``worker_latency``: submit-to-start latency with an idle Worker on PostgreSQL (woken
  by NOTIFY; its fallback poll is 5 s), from just before ``submit_owned`` to the
  handler's first line;
* ``sqlite_cycle``: the owned cycle on SQLite against a raw ``sqlite3`` floor;
* ``kernel``: microseconds per kernel decision;
* ``fingerprint``: a 1 MiB payload from a plain dict to its fingerprint, against
  ``json.dumps`` + ``hashlib.sha256`` of the same data.

* ``task_worker``: a TaskApp's Worker drains waiting no-op tasks (the peers' burn-down
  count), at concurrency 4 (batch 1 and 10) and 16 (batch 10); ``task_defer``: the
  ``defer_many`` rate of the same tasks;
* ``task_claim_latency``: one task claim from one of four queues, at 10^3, 10^5 and 10^6
  waiting tasks.

    python bench/tenure_bench.py DSN [--smoke] [--only NAME[,NAME]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import math
import pathlib
import sqlite3
import statistics
import tempfile
import time
import timeit
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from tenure.adapters import ValidationJobSource, Worker, upgrade
from tenure.adapters.queue.table import stored_payload
from tenure.kernel import QUEUE
from tenure.kernel.queue.commands import ClaimFence, ClaimOwned, CompleteOwned, HeartbeatOwned
from tenure.kernel.queue.record import QueueRow
from tenure.model import JobStatus, QueueKind, ValidationJob, WorkerConfig, snapshot_submission

LEASE_SECONDS = 60
BATCHES = (1, 10)
WORKER_RUNS = ((1, 1), (4, 1), (16, 1), (16, 10))
"""(concurrency, batch_size) of the Worker burn-downs."""
IDLE_WAIT_S = 5.0
"""The Workers' fallback poll: on PostgreSQL only NOTIFY can make them faster than this."""


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def fresh_database(server_dsn: str) -> str:
    name = "bench_" + uuid.uuid4().hex[:12]
    connection = await asyncpg.connect(server_dsn)
    try:
        await connection.execute(f"CREATE DATABASE {name}")
    finally:
        await connection.close()
    url = server_dsn.rsplit("/", 1)[0] + "/" + name
    await upgrade(url)
    return url


def config(db_url: str) -> WorkerConfig:
    return WorkerConfig(db_url, lease_seconds=LEASE_SECONDS, heartbeat_seconds=10)


def request(n: int) -> ValidationJob:
    return ValidationJob("orders", "1.0.0", f"orders-{n}.jsonl")


# --- the floor: the same fenced work, one statement per step -------------------------------

FLOOR_SUBMIT = """
INSERT INTO validation_jobs (id, contract_name, contract_version, data_json, status, fires_at, created_at, attempt,
                             max_attempts, generation, fence_required, submission_id, fingerprint)
VALUES ($1, 'orders', '1.0.0', $2, 'pending', clock_timestamp(), clock_timestamp(), 0, 5, 0, true, $3, $4)
ON CONFLICT (submission_id) DO NOTHING RETURNING id"""
FLOOR_CLAIM = """
UPDATE validation_jobs SET status = 'claimed', attempt = attempt + 1, generation = generation + 1,
       claimed_by = $1, claim_token = t.token, claimed_at = clock_timestamp(),
       lease_expires_at = clock_timestamp() + make_interval(secs => $2)
  FROM (SELECT numbered.id, ($3::text[])[numbered.n] AS token FROM (
          SELECT id, row_number() OVER (ORDER BY fires_at, id) AS n FROM (
            SELECT id, fires_at FROM validation_jobs
             WHERE status = 'pending' AND fires_at <= clock_timestamp() AND attempt < max_attempts
             ORDER BY fires_at, id LIMIT cardinality($3::text[]) FOR UPDATE SKIP LOCKED) picked) numbered
        ) AS t
 WHERE validation_jobs.id = t.id
RETURNING validation_jobs.id, validation_jobs.generation, validation_jobs.claim_token"""
FLOOR_CLAIM_ONE = """
UPDATE validation_jobs SET status = 'claimed', attempt = attempt + 1, generation = generation + 1,
       claimed_by = $1, claim_token = $3, claimed_at = clock_timestamp(),
       lease_expires_at = clock_timestamp() + make_interval(secs => $2)
 WHERE id = (SELECT id FROM validation_jobs
              WHERE status = 'pending' AND fires_at <= clock_timestamp() AND attempt < max_attempts
              ORDER BY fires_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, generation, claim_token"""
FLOOR_FENCE = """id = ANY($1::text[]) AND (id, claimed_by, claim_token, generation) IN
       (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]))
   AND status = 'claimed' AND lease_expires_at > clock_timestamp()"""
FLOOR_HEARTBEAT = f"""
UPDATE validation_jobs SET lease_expires_at = clock_timestamp() + make_interval(secs => $5)
 WHERE {FLOOR_FENCE} RETURNING id"""
FLOOR_COMPLETE = f"""
UPDATE validation_jobs SET status = 'completed', result_json = '{{}}', lease_expires_at = NULL,
       completed_at = clock_timestamp()
 WHERE {FLOOR_FENCE} RETURNING id"""
FLOOR_HEARTBEAT_ONE = """
UPDATE validation_jobs SET lease_expires_at = clock_timestamp() + make_interval(secs => $5)
 WHERE id = $1 AND claimed_by = $2 AND claim_token = $3 AND generation = $4
   AND status = 'claimed' AND lease_expires_at > clock_timestamp() RETURNING id"""
FLOOR_COMPLETE_ONE = """
UPDATE validation_jobs SET status = 'completed', result_json = '{}', lease_expires_at = NULL,
       completed_at = clock_timestamp()
 WHERE id = $1 AND claimed_by = $2 AND claim_token = $3 AND generation = $4
   AND status = 'claimed' AND lease_expires_at > clock_timestamp() RETURNING id"""


class Floor:
    """One worker of the floor, on its own connection (autocommit: one round trip per step)."""

    def __init__(self, connection: asyncpg.Connection, name: str) -> None:
        self.connection = connection
        self.name = name

    @staticmethod
    async def connect(db_url: str) -> Any:
        return await asyncpg.connect(db_url)

    async def submit(self, n: int) -> None:
        snapshot = snapshot_submission(QueueKind.VALIDATION, request(n), f"floor-{uuid.uuid4().hex}")
        await self.connection.fetch(
            FLOOR_SUBMIT, str(uuid.uuid4()), stored_payload(QueueKind.VALIDATION, snapshot.field_texts)[2],
            snapshot.submission_id, snapshot.fingerprint
        )

    async def claim(self, count: int) -> list[tuple[str, int, str]]:
        tokens = [uuid.uuid4().hex for _ in range(count)]
        if count == 1:
            rows = await self.connection.fetch(FLOOR_CLAIM_ONE, self.name, LEASE_SECONDS, tokens[0])
        else:
            rows = await self.connection.fetch(FLOOR_CLAIM, self.name, LEASE_SECONDS, tokens)
        return [(row[0], row[1], row[2]) for row in rows]

    async def heartbeat(self, claims: list[tuple[str, int, str]]) -> None:
        if len(claims) == 1:
            job_id, generation, token = claims[0]
            await self.connection.fetch(FLOOR_HEARTBEAT_ONE, job_id, self.name, token, generation, LEASE_SECONDS)
            return
        ids, generations, tokens = zip(*claims)
        await self.connection.fetch(FLOOR_HEARTBEAT, list(ids), [self.name] * len(ids), list(tokens), list(generations), LEASE_SECONDS)

    async def complete(self, claims: list[tuple[str, int, str]]) -> None:
        if len(claims) == 1:
            job_id, generation, token = claims[0]
            await self.connection.fetch(FLOOR_COMPLETE_ONE, job_id, self.name, token, generation)
            return
        ids, generations, tokens = zip(*claims)
        await self.connection.fetch(FLOOR_COMPLETE, list(ids), [self.name] * len(ids), list(tokens), list(generations))


# --- the lock-first floor: the guarantee in one statement, hand-written --------------------------
#
# The shape tenure's decided-ahead statements take, with the decision written in SQL: a
# MATERIALIZED CTE locks the fenced rows, a second reads the clock in an aggregate over
# them (so only after every lock), and the UPDATE compares the locked rows' lease with that
# clock. One round trip per step, and no write with a time from before the lock.

LOCKFIRST_FENCE = """id = ANY($1::text[]) AND (id, claimed_by, claim_token, generation) IN
       (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])) AND status = 'claimed'"""
LOCKFIRST_HEAD = f"""
WITH locked AS MATERIALIZED (SELECT id, lease_expires_at FROM validation_jobs WHERE {LOCKFIRST_FENCE} ORDER BY id FOR UPDATE),
     clock AS MATERIALIZED (SELECT clock_timestamp() AS now, count(*) AS locked_rows FROM locked)"""
LOCKFIRST_HEARTBEAT = f"""{LOCKFIRST_HEAD}
UPDATE validation_jobs SET lease_expires_at = clock.now + make_interval(secs => $5) FROM locked, clock
 WHERE validation_jobs.id = locked.id AND locked.lease_expires_at > clock.now RETURNING validation_jobs.id"""
LOCKFIRST_COMPLETE = f"""{LOCKFIRST_HEAD}
UPDATE validation_jobs SET status = 'completed', result_json = '{{}}', lease_expires_at = NULL, completed_at = clock.now
  FROM locked, clock
 WHERE validation_jobs.id = locked.id AND locked.lease_expires_at > clock.now RETURNING validation_jobs.id"""


class LockFirstFloor(Floor):
    """The floor's steps, its fenced writes in the lock-first one-statement shape."""

    async def heartbeat(self, claims: list[tuple[str, int, str]]) -> None:
        ids, generations, tokens = zip(*claims)
        await self.connection.fetch(LOCKFIRST_HEARTBEAT, list(ids), [self.name] * len(ids), list(tokens), list(generations),
                                    LEASE_SECONDS)

    async def complete(self, claims: list[tuple[str, int, str]]) -> None:
        ids, generations, tokens = zip(*claims)
        await self.connection.fetch(LOCKFIRST_COMPLETE, list(ids), [self.name] * len(ids), list(tokens), list(generations))


# --- the locked floor: tenure's transaction shape, hand-written ----------------------------------
#
# The guarantee tenure keeps is "lock the rows, then read the database clock, then decide,
# then write with a compare-and-set": a decision never rests on a clock read before a lock
# wait. The single-statement floor above cannot keep it (tests/adapters/postgres/test_postgres.py shows its
# fenced UPDATE accepting a write after the lease expired behind a lock wait). This floor
# keeps it with the fewest round trips asyncpg allows: BEGIN, one statement that locks and
# then reads the clock, one compare-and-set write, COMMIT. It decides in a few lines of
# Python instead of the kernel and reads no row back, so tenure / locked floor is what
# tenure itself costs, and locked floor / floor is what the guarantee costs.

LOCKED_SUBMIT_FIND = """
WITH locked AS MATERIALIZED (SELECT fingerprint FROM validation_jobs WHERE submission_id = $1 FOR UPDATE)
SELECT clock_timestamp(), locked.fingerprint FROM (SELECT 1) AS one LEFT JOIN locked ON true"""
LOCKED_SUBMIT_INSERT = """
INSERT INTO validation_jobs (id, contract_name, contract_version, data_json, status, fires_at, created_at, attempt,
                             max_attempts, generation, fence_required, submission_id, fingerprint)
VALUES ($1, 'orders', '1.0.0', $2, 'pending', $5, $5, 0, 5, 0, true, $3, $4)"""
LOCKED_CLAIM_VIEW = """
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now),
     picked AS MATERIALIZED (
       SELECT id, generation FROM validation_jobs
        WHERE status = 'pending' AND fires_at <= (SELECT now FROM clock) AND attempt < max_attempts
        ORDER BY fires_at, id LIMIT cardinality($1::text[]) FOR UPDATE SKIP LOCKED)
SELECT (SELECT now FROM clock), EXISTS (SELECT 1 FROM validation_jobs WHERE claim_token = ANY($1::text[])),
       picked.id, picked.generation
  FROM (SELECT 1) AS one LEFT JOIN picked ON true"""
LOCKED_CLAIM_WRITE = """
UPDATE validation_jobs SET status = 'claimed', attempt = attempt + 1, generation = u.generation + 1,
       claimed_by = $4, claim_token = u.token, claimed_at = $5, lease_expires_at = $6
  FROM unnest($1::text[], $2::bigint[], $3::text[]) AS u(id, generation, token)
 WHERE validation_jobs.id = u.id AND validation_jobs.generation = u.generation
   AND validation_jobs.status = 'pending'
RETURNING validation_jobs.id"""
LOCKED_FENCE_VIEW = """
WITH locked AS MATERIALIZED (
  SELECT id, claimed_by, claim_token, generation, status, lease_expires_at
    FROM validation_jobs WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE)
SELECT clock_timestamp(), locked.* FROM (SELECT 1) AS one LEFT JOIN locked ON true"""
LOCKED_FENCED_WRITE = """
UPDATE validation_jobs SET {assignments}
  FROM unnest($1::text[], $2::bigint[]) AS u(id, generation)
 WHERE validation_jobs.id = u.id AND validation_jobs.generation = u.generation
   AND validation_jobs.status = 'claimed'
RETURNING validation_jobs.id"""
LOCKED_HEARTBEAT = LOCKED_FENCED_WRITE.format(assignments="lease_expires_at = $3")
LOCKED_COMPLETE = LOCKED_FENCED_WRITE.format(
    assignments="status = 'completed', result_json = '{}', lease_expires_at = NULL, completed_at = $3")


Write = tuple[str, list[Any]]
"""A compare-and-set statement and its positional arguments."""


class LockedFloor(Floor):
    """One worker doing the fenced work as tenure does (lock, clock, decide, compare-and-set),
    hand-written: four round trips per step on asyncpg."""

    async def _locked_then_write(self, view: str, view_args: list[Any],
                                 decide: Callable[[list[Any]], Write | None]) -> list[Any]:
        """BEGIN, the locking statement, the decided write (if any), COMMIT; the written rows."""
        async with self.connection.transaction():
            write = decide(await self.connection.fetch(view, *view_args))
            return [] if write is None else await self.connection.fetch(write[0], *write[1])

    async def submit(self, n: int) -> None:
        snapshot = snapshot_submission(QueueKind.VALIDATION, request(n), f"locked-{uuid.uuid4().hex}")

        def decide(rows: list[Any]) -> Write | None:
            now, stored = rows[0]
            if stored is not None:
                assert stored == snapshot.fingerprint, "conflict"
                return None
            return LOCKED_SUBMIT_INSERT, [str(uuid.uuid4()), stored_payload(QueueKind.VALIDATION, snapshot.field_texts)[2],
                                          snapshot.submission_id,
                                          snapshot.fingerprint, now]

        await self._locked_then_write(LOCKED_SUBMIT_FIND, [snapshot.submission_id], decide)

    async def claim(self, count: int) -> list[tuple[str, int, str]]:
        tokens = [uuid.uuid4().hex for _ in range(count)]
        picked: list[tuple[str, int]] = []

        def decide(rows: list[Any]) -> Write | None:
            now, token_stored = rows[0][0], rows[0][1]
            assert not token_stored, "nonce reused"
            picked.extend((row[2], row[3]) for row in rows if row[2] is not None)
            if not picked:
                return None
            return LOCKED_CLAIM_WRITE, [[j for j, _ in picked], [g for _, g in picked], tokens[: len(picked)],
                                        self.name, now, now + dt.timedelta(seconds=LEASE_SECONDS)]

        written = await self._locked_then_write(LOCKED_CLAIM_VIEW, [tokens], decide)
        assert len(written) == len(picked), "compare-and-set missed"
        return [(job_id, generation + 1, token) for (job_id, generation), token in zip(picked, tokens)]

    async def _fenced(self, claims: list[tuple[str, int, str]], write: str, heartbeat: bool) -> None:
        def decide(rows: list[Any]) -> Write | None:
            now = rows[0][0]
            found = {row[1]: row for row in rows if row[1] is not None}
            live = [
                (job_id, generation) for job_id, generation, token in claims
                if (row := found.get(job_id)) is not None and row[2] == self.name and row[3] == token
                and row[4] == generation and row[5] == "claimed" and row[6] > now
            ]
            if not live:
                return None
            value = now + dt.timedelta(seconds=LEASE_SECONDS) if heartbeat else now
            return write, [[j for j, _ in live], [g for _, g in live], value]

        await self._locked_then_write(LOCKED_FENCE_VIEW, [[job_id for job_id, _, _ in claims]], decide)

    async def heartbeat(self, claims: list[tuple[str, int, str]]) -> None:
        await self._fenced(claims, LOCKED_HEARTBEAT, heartbeat=True)

    async def complete(self, claims: list[tuple[str, int, str]]) -> None:
        await self._fenced(claims, LOCKED_COMPLETE, heartbeat=False)


# --- the locked floor on a pipelining driver -----------------------------------------------------
#
# asyncpg sends one message and waits for its answer, so BEGIN and COMMIT each cost a round
# trip. psycopg 3's pipeline mode sends several statements before waiting: BEGIN with the
# locking statement, then the write with COMMIT, two round trips per step for the same
# guarantee. This floor measures what a driver change would buy; psycopg is installed into
# the benchmark's own environment only (bench/run.sh), tenure does not depend on it.


def _percent_style(sql: str) -> str:
    """``$n`` placeholders as psycopg's ``%(pn)s``."""
    import re

    return re.sub(r"\$(\d+)", r"%(p\1)s", sql)


def _named(values: list[Any]) -> dict[str, Any]:
    return {f"p{index}": value for index, value in enumerate(values, start=1)}


class PipelinedLockedFloor(LockedFloor):
    """The locked floor's statements and decisions, on psycopg in pipeline mode."""

    @staticmethod
    async def connect(db_url: str) -> Any:
        import psycopg

        return await psycopg.AsyncConnection.connect(db_url)

    async def _locked_then_write(self, view: str, view_args: list[Any],
                                 decide: Callable[[list[Any]], Write | None]) -> list[Any]:
        """BEGIN + the locking statement in one round trip; the write + COMMIT in another."""
        connection = self.connection
        async with connection.pipeline() as pipeline:
            cursor = await connection.execute(_percent_style(view), _named(view_args))
            await pipeline.sync()
            write = decide(await cursor.fetchall())
            if write is None:
                await connection.commit()
                return []
            written = await connection.execute(_percent_style(write[0]), _named(write[1]))
            await connection.commit()
            return await written.fetchall() if written.description is not None else []


# --- runners ---------------------------------------------------------------------------------


async def run_workers(workers: int, work: Callable[[int], Awaitable[int]]) -> tuple[int, float]:
    started = time.perf_counter()
    done = await asyncio.gather(*(work(index) for index in range(workers)))
    return sum(done), time.perf_counter() - started


async def tenure_cycle(db_url: str, workers: int, jobs: int) -> tuple[int, float]:
    per_worker = jobs // workers
    run = uuid.uuid4().hex[:8]

    async def work(index: int) -> int:
        async with ValidationJobSource(db_url, config(db_url)) as source:
            for n in range(per_worker):
                await source.submit_owned(request(n), submission_id=f"{run}-{index}-{n}")
                claimed = None
                while claimed is None:  # another worker may hold the only pending rows for a moment
                    claimed = await source.claim_next_owned(f"worker-{index}", claim_token=uuid.uuid4().hex)
                assert await source.heartbeat_owned(claimed.claim_fence)
                assert await source.complete_owned(claimed.claim_fence, {})
        return per_worker

    return await run_workers(workers, work)


async def floor_cycle(db_url: str, workers: int, jobs: int, kind: type[Floor] = Floor) -> tuple[int, float]:
    per_worker = jobs // workers

    async def work(index: int) -> int:
        connection = await kind.connect(db_url)
        floor = kind(connection, f"floor-worker-{index}")
        try:
            for n in range(per_worker):
                await floor.submit(index * per_worker + n)
                claims = await floor.claim(1)
                while not claims:
                    claims = await floor.claim(1)
                await floor.heartbeat(claims)
                await floor.complete(claims)
        finally:
            await connection.close()
        return per_worker

    return await run_workers(workers, work)


async def bulk_load(db_url: str, count: int, *, offset: int = 0) -> None:
    """Pending owned rows, inserted by SQL (submission speed is not what is measured)."""
    connection = await asyncpg.connect(db_url)
    try:
        payload = '{"data_source":"orders-0.jsonl","options":null}'
        await connection.execute(
            """INSERT INTO validation_jobs (id, contract_name, contract_version, data_json, status, fires_at, created_at,
                                            attempt, max_attempts, generation, fence_required, submission_id, fingerprint)
               SELECT md5(($3 + n)::text)::uuid::text, 'orders', '1.0.0', $1, 'pending',
                      clock_timestamp() - make_interval(secs => 1), clock_timestamp(), 0, 5, 0, true,
                      'bulk-' || ($3 + n), 'v1:' || md5(n::text)
                 FROM generate_series(1, $2) AS n""",
            payload, count, offset,
        )
        await connection.execute("ANALYZE validation_jobs")
    finally:
        await connection.close()


async def tenure_burn_down(db_url: str, workers: int, batch: int) -> int:
    async def work(index: int) -> int:
        done = 0
        async with ValidationJobSource(db_url, config(db_url)) as source:
            while True:
                if batch == 1:
                    claimed = await source.claim_next_owned(f"worker-{index}", claim_token=uuid.uuid4().hex)
                    if claimed is None:
                        return done
                    assert await source.complete_owned(claimed.claim_fence, {})
                    done += 1
                else:
                    claims = await source.claim_batch_owned(
                        f"worker-{index}", claim_tokens=[uuid.uuid4().hex for _ in range(batch)]
                    )
                    if not claims:
                        return done
                    results = await source.complete_many_owned([(c.claim_fence, {}) for c in claims])
                    assert all(results)
                    done += len(claims)

    return sum(await asyncio.gather(*(work(index) for index in range(workers))))


async def floor_burn_down(db_url: str, workers: int, batch: int, kind: type[Floor] = Floor) -> int:
    async def work(index: int) -> int:
        done = 0
        connection = await kind.connect(db_url)
        floor = kind(connection, f"floor-{index}")
        try:
            while True:
                claims = await floor.claim(batch)
                if not claims:
                    return done
                await floor.complete(claims)
                done += len(claims)
        finally:
            await connection.close()

    return sum(await asyncio.gather(*(work(index) for index in range(workers))))


async def burn_down(server_dsn: str, jobs: int, workers: int, rounds: int) -> None:
    """Like the cycles: every subject ``rounds`` times, taking turns; the median counts."""
    async def locked_floor_burn_down(db_url: str, workers: int, batch: int) -> int:
        return await floor_burn_down(db_url, workers, batch, LockedFloor)

    async def pipelined_floor_burn_down(db_url: str, workers: int, batch: int) -> int:
        return await floor_burn_down(db_url, workers, batch, PipelinedLockedFloor)

    async def lockfirst_floor_burn_down(db_url: str, workers: int, batch: int) -> int:
        return await floor_burn_down(db_url, workers, batch, LockFirstFloor)

    subjects = (("tenure", tenure_burn_down), ("floor", floor_burn_down), ("locked_floor", locked_floor_burn_down),
                ("lockfirst_floor", lockfirst_floor_burn_down), ("pipelined_locked_floor", pipelined_floor_burn_down))
    warmup = max(100, jobs // 10)
    rates: dict[tuple[str, int], list[float]] = {(name, batch): [] for name, _ in subjects for batch in BATCHES}
    for _ in range(rounds):
        for name, runner in subjects:
            for batch in BATCHES:
                db_url = await fresh_database(server_dsn)
                await bulk_load(db_url, warmup)
                await runner(db_url, workers, batch)
                await bulk_load(db_url, jobs, offset=warmup)
                started = time.perf_counter()
                done = await runner(db_url, workers, batch)
                elapsed = time.perf_counter() - started
                assert done == jobs, (name, batch, done)
                rates[(name, batch)].append(round(jobs / elapsed, 1))
    for (name, batch), measured in rates.items():
        emit(bench="burn_down", subject=name, batch=batch, workers=workers, jobs=jobs, rounds=measured,
             jobs_per_second=statistics.median(measured))


async def locked_floor_cycle(db_url: str, workers: int, jobs: int) -> tuple[int, float]:
    return await floor_cycle(db_url, workers, jobs, LockedFloor)


async def lockfirst_floor_cycle(db_url: str, workers: int, jobs: int) -> tuple[int, float]:
    return await floor_cycle(db_url, workers, jobs, LockFirstFloor)


async def pipelined_floor_cycle(db_url: str, workers: int, jobs: int) -> tuple[int, float]:
    return await floor_cycle(db_url, workers, jobs, PipelinedLockedFloor)


async def cycles(server_dsn: str, jobs: int, rounds: int) -> None:
    """Each subject runs ``rounds`` times, the subjects taking turns, and the median round
    counts: a noisy moment on a shared machine then moves one round, not one subject."""
    subjects = (("tenure", tenure_cycle), ("floor", floor_cycle), ("locked_floor", locked_floor_cycle),
                ("lockfirst_floor", lockfirst_floor_cycle), ("pipelined_locked_floor", pipelined_floor_cycle))
    for workers in (1, 4, 16):
        rates: dict[str, list[float]] = {name: [] for name, _ in subjects}
        for _ in range(rounds):
            for name, runner in subjects:
                db_url = await fresh_database(server_dsn)
                await runner(db_url, workers, max(workers, jobs // 10))  # warm-up
                done, elapsed = await runner(db_url, workers, jobs)
                rates[name].append(round(done / elapsed, 1))
        for name, measured in rates.items():
            emit(bench="cycle", subject=name, workers=workers, jobs=jobs, rounds=measured,
                 cycles_per_second=statistics.median(measured))


STEPS = ("submit", "claim", "heartbeat", "complete")


async def tenure_steps(db_url: str, jobs: int, totals: dict[str, list[float]]) -> None:
    run = uuid.uuid4().hex[:8]
    async with ValidationJobSource(db_url, config(db_url)) as source:
        claimed: Any = None

        async def submit(n: int) -> None:
            await source.submit_owned(request(n), submission_id=f"{run}-{n}")

        async def claim(n: int) -> None:
            nonlocal claimed
            claimed = await source.claim_next_owned("worker", claim_token=uuid.uuid4().hex)
            assert claimed is not None

        async def heartbeat(n: int) -> None:
            assert await source.heartbeat_owned(claimed.claim_fence)

        async def complete(n: int) -> None:
            assert await source.complete_owned(claimed.claim_fence, {})

        await timed_steps(jobs, (submit, claim, heartbeat, complete), totals)


async def floor_steps(db_url: str, jobs: int, totals: dict[str, list[float]], kind: type[Floor] = Floor) -> None:
    connection = await kind.connect(db_url)
    floor = kind(connection, "floor-worker")
    claims: list[tuple[str, int, str]] = []
    try:
        async def submit(n: int) -> None:
            await floor.submit(n)

        async def claim(n: int) -> None:
            nonlocal claims
            claims = await floor.claim(1)
            assert claims

        async def heartbeat(n: int) -> None:
            await floor.heartbeat(claims)

        async def complete(n: int) -> None:
            await floor.complete(claims)

        await timed_steps(jobs, (submit, claim, heartbeat, complete), totals)
    finally:
        await connection.close()


async def timed_steps(jobs: int, steps: tuple[Callable[[int], Awaitable[None]], ...],
                      totals: dict[str, list[float]]) -> None:
    """Runs the cycle ``jobs`` times, one step at a time, and adds each step's wall and
    client CPU seconds (``time.perf_counter`` and ``time.process_time``) to ``totals``."""
    for n in range(jobs):
        for name, step in zip(STEPS, steps):
            wall, cpu = time.perf_counter(), time.process_time()
            await step(n)
            totals[name][0] += time.perf_counter() - wall
            totals[name][1] += time.process_time() - cpu


async def per_call(server_dsn: str, jobs: int, rounds: int) -> None:
    """Microseconds of wall time and of this process's CPU per owned call, one call at a
    time on one connection (the server's CPU is not counted), for tenure and the floors;
    the subjects take turns, each round on a fresh database after a warm-up, and each
    figure is the median of the rounds."""
    subjects: tuple[tuple[str, Callable[..., Awaitable[None]]], ...] = (
        ("tenure", tenure_steps), ("floor", floor_steps),
        ("lockfirst_floor", lambda url, jobs, totals: floor_steps(url, jobs, totals, LockFirstFloor)),
    )
    measured: dict[str, dict[str, list[tuple[float, float]]]] = {name: {step: [] for step in STEPS} for name, _ in subjects}
    for _ in range(rounds):
        for name, steps in subjects:
            db_url = await fresh_database(server_dsn)
            await steps(db_url, max(10, jobs // 10), {step: [0.0, 0.0] for step in STEPS})  # warm-up
            totals = {step: [0.0, 0.0] for step in STEPS}
            await steps(db_url, jobs, totals)
            for step, (wall, cpu) in totals.items():
                measured[name][step].append((wall / jobs * 1e6, cpu / jobs * 1e6))
    for name, by_step in measured.items():
        for step, figures in by_step.items():
            emit(bench="per_call", subject=name, step=step, jobs=jobs,
                 wall_us=round(statistics.median(wall for wall, _ in figures), 1),
                 cpu_us=round(statistics.median(cpu for _, cpu in figures), 1),
                 cpu_rounds=[round(cpu, 1) for _, cpu in figures])


async def claim_latency(server_dsn: str, sizes: list[int], samples: int) -> None:
    for size in sizes:
        db_url = await fresh_database(server_dsn)
        for start in range(0, size, 250_000):
            await bulk_load(db_url, min(250_000, size - start), offset=start)
        latencies = []
        async with ValidationJobSource(db_url, config(db_url)) as source:
            for _ in range(samples // 10):  # warm-up
                await source.claim_next_owned("worker", claim_token=uuid.uuid4().hex)
            for _ in range(samples):
                started = time.perf_counter()
                claimed = await source.claim_next_owned("worker", claim_token=uuid.uuid4().hex)
                latencies.append(time.perf_counter() - started)
                assert claimed is not None
        latencies.sort()
        emit(bench="claim_latency", waiting_rows=size, samples=samples,
             median_ms=round(statistics.median(latencies) * 1000, 3),
             p99_ms=round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3))


# --- tasks (TaskApp on tenure_tasks) -----------------------------------------------------------

TASK_RUNS = ((4, 1), (4, 10), (16, 10))
"""(concurrency, batch_size) of the task burn-downs."""


def task_app(db_url: str) -> Any:
    from tenure.adapters import TaskApp

    app = TaskApp(db_url, config=config(db_url))

    @app.task(queue="bench", name="bench.noop")
    async def noop(ctx: Any, n: int) -> None:
        return None

    return app, noop


async def task_drain(app: Any, concurrency: int, batch: int) -> tuple[int, float]:
    return await drain(app.worker(concurrency=concurrency, batch_size=batch, idle_wait_s=IDLE_WAIT_S))


async def task_burn_down(server_dsn: str, jobs: int, rounds: dict[int, int]) -> None:
    """A TaskApp's Worker drains ``jobs`` waiting no-op tasks (the peers' count and
    rounds). The tasks are deferred with ``defer_many`` (1,000 per transaction, not
    measured) after a warm-up drained by its own Worker on the same app; each
    configuration as many rounds as ``rounds`` gives its concurrency; the median counts.
    The deferral rate is emitted too (``task_defer``)."""
    warmup = max(50, jobs // 10)
    rates: dict[tuple[int, int], list[float]] = {run: [] for run in TASK_RUNS}
    defer_rates: list[float] = []
    for round_ in range(max(rounds.values())):
        for concurrency, batch in (run for run in TASK_RUNS if round_ < rounds[run[0]]):
            db_url = await fresh_database(server_dsn)
            app, noop = task_app(db_url)
            async with app:
                await noop.defer_many([{"n": n} for n in range(warmup)])
                done, _ = await task_drain(app, concurrency, batch)
                assert done == warmup
                started = time.perf_counter()
                await noop.defer_many([{"n": n} for n in range(jobs)])
                defer_rates.append(round(jobs / (time.perf_counter() - started), 1))
                done, elapsed = await task_drain(app, concurrency, batch)
                assert done == jobs, (concurrency, batch, done)
            rates[(concurrency, batch)].append(round(jobs / elapsed, 1))
    for (concurrency, batch), measured in rates.items():
        emit(bench="task_worker", subject="tenure", concurrency=concurrency, batch=batch, jobs=jobs, rounds=measured,
             jobs_per_second=statistics.median(measured))
    emit(bench="task_defer", subject="tenure", jobs=jobs, rounds=defer_rates,
         jobs_per_second=statistics.median(defer_rates))


async def bulk_load_tasks(db_url: str, count: int, *, offset: int = 0) -> None:
    """Pending tasks inserted by SQL, 90% in queue ``bench_1`` and the rest in three
    others, over 101 priorities (the claim reads ``bench_1``, highest priority first)."""
    connection = await asyncpg.connect(db_url)
    try:
        await connection.execute(
            """INSERT INTO tenure_tasks (id, queue_name, task_name, args_json, priority, status, fires_at, attempt,
                                         max_attempts, retry_json, created_at, generation, fence_required,
                                         authored_json)
               SELECT md5(($2 + n)::text)::uuid::text,
                      CASE WHEN n % 10 = 0 THEN 'bench_other_' || (n % 3) ELSE 'bench_1' END,
                      'bench.noop', ('{"n":' || n || '}')::json,
                      n % 101, 'pending', clock_timestamp() - make_interval(secs => 1), 0, 3,
                      '{"retry_base_ms":1000,"retry_jitter":true,"retry_max_ms":300000}'::json, clock_timestamp(), 0,
                      false, '{"delay_ms":null,"fires_at":null,"job_id":null,"max_attempts":3}'
                 FROM generate_series(1, $1) AS n""",
            count, offset,
        )
        await connection.execute("ANALYZE tenure_tasks")
    finally:
        await connection.close()


async def task_claim_latency(server_dsn: str, sizes: list[int], samples: int) -> None:
    """One task claim at a time from one queue, ``size`` tasks waiting (see
    :func:`bulk_load_tasks`): the claim index keeps it flat as the table grows; then the
    same from two queues at once (``bench_1`` and one other)."""
    from tenure.adapters import TaskSource

    for size in sizes:
        db_url = await fresh_database(server_dsn)
        for start in range(0, size, 250_000):
            await bulk_load_tasks(db_url, min(250_000, size - start), offset=start)
        async with TaskSource(db_url, config(db_url)) as source:
            for queues in (["bench_1"], ["bench_1", "bench_other_1"]):
                latencies = []
                for _ in range(samples // 10):  # warm-up
                    await source.claim_next_owned("worker", claim_token=uuid.uuid4().hex, queues=queues)
                for _ in range(samples):
                    started = time.perf_counter()
                    claimed = await source.claim_next_owned("worker", claim_token=uuid.uuid4().hex, queues=queues)
                    latencies.append(time.perf_counter() - started)
                    assert claimed is not None
                latencies.sort()
                emit(bench="task_claim_latency", waiting_rows=size, queues=len(queues), samples=samples,
                     median_ms=round(statistics.median(latencies) * 1000, 3),
                     p99_ms=round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3))


# --- the fenced worker runtime ---------------------------------------------------------------


async def noop_handler(claimed: Any, context: Any) -> None:
    return None


async def submit_concurrently(source: ValidationJobSource, count: int, prefix: str, parallel: int = 8) -> None:
    """``count`` owned submissions through ``submit_owned``, ``parallel`` at a time."""
    async def submitter(index: int) -> None:
        for n in range(index, count, parallel):
            await source.submit_owned(request(n), submission_id=f"{prefix}-{n}")

    await asyncio.gather(*(submitter(index) for index in range(parallel)))


async def worker_drain(source: ValidationJobSource, concurrency: int, batch: int) -> tuple[int, float]:
    """A fresh Worker run until idle: (jobs completed, seconds)."""
    return await drain(Worker(source, noop_handler, concurrency=concurrency, batch_size=batch,
                              idle_wait_s=IDLE_WAIT_S))


async def drain(worker: Worker) -> tuple[int, float]:
    """``worker`` run until idle, every claim completed and nothing refused or lost:
    (jobs completed, seconds)."""
    started = time.perf_counter()
    stats = await worker.run_until_idle()
    elapsed = time.perf_counter() - started
    assert stats.claimed == stats.completed, stats
    assert stats.persistence_failures == stats.lease_losses == stats.stale_writes_refused == 0, stats
    return stats.completed, elapsed


async def worker_burn_down(server_dsn: str, jobs: int, rounds: dict[int, int]) -> None:
    """One Worker per run drains ``jobs`` waiting no-op jobs (the same count the peers get).
    A warm-up of real ``submit_owned`` submissions is drained first by its own Worker on
    the same source (connections open, statements prepared); the measured jobs are then
    inserted by SQL as owned rows (bulk_load: submission is not what is measured, and the
    peers enqueue theirs with their own batch calls). Every configuration as many rounds
    as ``rounds`` gives its concurrency, taking turns; the median counts."""
    warmup = max(50, jobs // 10)
    rates: dict[tuple[int, int], list[float]] = {run: [] for run in WORKER_RUNS}
    for round_ in range(max(rounds.values())):
        for concurrency, batch in (run for run in WORKER_RUNS if round_ < rounds[run[0]]):
            db_url = await fresh_database(server_dsn)
            async with ValidationJobSource(db_url, config(db_url)) as source:
                await submit_concurrently(source, warmup, "warm")
                done, _ = await worker_drain(source, concurrency, batch)
                assert done == warmup, (concurrency, batch, done)
                await bulk_load(db_url, jobs, offset=warmup)
                done, elapsed = await worker_drain(source, concurrency, batch)
                assert done == jobs, (concurrency, batch, done)
            rates[(concurrency, batch)].append(round(jobs / elapsed, 1))
    for (concurrency, batch), measured in rates.items():
        emit(bench="worker", subject="tenure", concurrency=concurrency, batch=batch, jobs=jobs, rounds=measured,
             jobs_per_second=statistics.median(measured))


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile (the claim latency's rule)."""
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(len(ordered) * fraction))) - 1]


async def worker_latency(server_dsn: str, samples: int, spacing_s: float) -> None:
    """An idle Worker (concurrency 1, idle_wait_s 5) on PostgreSQL; one job submitted at
    a time from a second source, ``spacing_s`` after the previous one started: the time
    from just before ``submit_owned`` to the handler's start, and the submission's own
    part (``submit_owned`` returned)."""
    db_url = await fresh_database(server_dsn)
    loop = asyncio.get_running_loop()
    waiting: asyncio.Future[float] = loop.create_future()

    async def handler(claimed: Any, context: Any) -> None:
        started = time.perf_counter()
        if not waiting.done():
            waiting.set_result(started)
        return None

    warmup = max(3, samples // 10)
    latencies: list[float] = []
    submits: list[float] = []
    async with ValidationJobSource(db_url, config(db_url)) as worker_source, \
            ValidationJobSource(db_url, config(db_url)) as submitter:
        worker = Worker(worker_source, handler, concurrency=1, idle_wait_s=IDLE_WAIT_S)
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        try:
            for _ in range(500):
                if worker.listening:
                    break
                await asyncio.sleep(0.01)
            listening = worker.listening
            for n in range(warmup + samples):
                waiting = loop.create_future()
                before = time.perf_counter()
                await submitter.submit_owned(request(n), submission_id=f"latency-{n}")
                submitted = time.perf_counter()
                started = await asyncio.wait_for(waiting, 3 * IDLE_WAIT_S)
                if n >= warmup:
                    latencies.append(started - before)
                    submits.append(submitted - before)
                await asyncio.sleep(spacing_s)
            for _ in range(500):  # the last completion written before stopping
                if worker.stats.completed == warmup + samples:
                    break
                await asyncio.sleep(0.01)
        finally:
            stop.set()
            stats = await running
    assert stats.completed == warmup + samples, stats

    def ms(value: float) -> float:
        return round(value * 1000, 3)

    emit(bench="worker_latency", subject="tenure", samples=samples, spacing_ms=spacing_s * 1000,
         idle_wait_s=IDLE_WAIT_S, listening=listening, p50_ms=ms(statistics.median(latencies)),
         p99_ms=ms(percentile(latencies, 0.99)), max_ms=ms(max(latencies)),
         submit_p50_ms=ms(statistics.median(submits)),
         wake_p50_ms=ms(statistics.median(l - s for l, s in zip(latencies, submits))))


# --- SQLite ------------------------------------------------------------------------------------


async def sqlite_cycle(jobs: int) -> None:
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tenure-bench-"))
    url = f"sqlite:///{folder / 'tenure.db'}"
    await upgrade(url)
    async with ValidationJobSource(url, config(url)) as source:
        started = time.perf_counter()
        for n in range(jobs):
            await source.submit_owned(request(n), submission_id=f"s-{n}")
            claimed = await source.claim_next_owned("worker", claim_token=uuid.uuid4().hex)
            assert await source.heartbeat_owned(claimed.claim_fence)
            assert await source.complete_owned(claimed.claim_fence, {})
        tenure_rate = jobs / (time.perf_counter() - started)
    floor_path = folder / "floor.db"
    await upgrade(f"sqlite:///{floor_path}")
    connection = sqlite3.connect(floor_path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    # SQLAlchemy's DATETIME text, as the queue tables store instants (SQLite's own clock
    # has millisecond resolution: three zeros complete the microseconds).
    now = "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"
    lease = "(strftime('%Y-%m-%d %H:%M:%f', 'now', '+60 seconds') || '000')"
    started = time.perf_counter()
    for n in range(jobs):
        snapshot = snapshot_submission(QueueKind.VALIDATION, request(n), f"s-{n}")
        job_id = str(uuid.uuid4())
        connection.execute(
            f"""INSERT INTO validation_jobs (id, contract_name, contract_version, data_json, status, fires_at, created_at,
                    attempt, max_attempts, generation, fence_required, submission_id, fingerprint)
                VALUES (?, 'orders', '1.0.0', ?, 'pending', {now}, {now}, 0, 5, 0, 1, ?, ?)
                ON CONFLICT (submission_id) DO NOTHING""",
            (job_id, stored_payload(QueueKind.VALIDATION, snapshot.field_texts)[2], snapshot.submission_id,
             snapshot.fingerprint),
        )
        token = uuid.uuid4().hex
        row = connection.execute(
            f"""UPDATE validation_jobs SET status = 'claimed', attempt = attempt + 1, generation = generation + 1,
                    claimed_by = 'worker', claim_token = ?, claimed_at = {now}, lease_expires_at = {lease}
                WHERE id = (SELECT id FROM validation_jobs WHERE status = 'pending' AND fires_at <= {now}
                            AND attempt < max_attempts ORDER BY fires_at, id LIMIT 1)
                RETURNING id, generation""",
            (token,),
        ).fetchone()
        fence = "id = ? AND claimed_by = 'worker' AND claim_token = ? AND generation = ? AND status = 'claimed'"
        connection.execute(
            f"UPDATE validation_jobs SET lease_expires_at = {lease} WHERE {fence} AND lease_expires_at > {now}",
            (row[0], token, row[1]),
        )
        connection.execute(
            f"""UPDATE validation_jobs SET status = 'completed', result_json = '{{}}', lease_expires_at = NULL,
                    completed_at = {now} WHERE {fence} AND lease_expires_at > {now}""",
            (row[0], token, row[1]),
        )
    floor_rate = jobs / (time.perf_counter() - started)
    connection.close()
    emit(bench="sqlite_cycle", jobs=jobs, tenure_per_second=round(tenure_rate, 1), floor_per_second=round(floor_rate, 1),
         journal="wal", synchronous="full (default)")


# --- kernel and fingerprint --------------------------------------------------------------------


def kernel_decisions(repeat: int) -> None:
    claimed = QueueRow(
        queue=QueueKind.VALIDATION, job_id="job-1", run_id=None, status=JobStatus.CLAIMED, attempts=1,
        max_attempts=5, generation=1, owner_id="worker", claim_token="token", claimed_at_us=10,
        lease_expires_at_us=10**15, fires_at_us=0, created_at_us=0, completed_at_us=None,
        cancel_requested=False, pid=None, fence_required=True, submission_id="sub", fingerprint="v1:x",
        idempotency_key=None, active_key=None, dlq_record_id=None, error_message=None, result_json=None,
        payload=("orders", "1.0.0", '{"data_source":"s","options":null}', None),
    )
    pending = QueueRow(**{**{f: getattr(claimed, f) for f in claimed.__dataclass_fields__},
                           "status": JobStatus.PENDING, "attempts": 0, "generation": 0, "owner_id": None,
                           "claim_token": None, "claimed_at_us": None, "lease_expires_at_us": None})
    fence = ClaimFence(queue=QueueKind.VALIDATION, job_id="job-1", owner_id="worker", generation=1, claim_token="token")
    commands = {
        "complete_owned": (claimed, CompleteOwned(fence=fence, result_json="{}")),
        "heartbeat_owned": (claimed, HeartbeatOwned(fence=fence, lease_us=60_000_000)),
        "claim_owned": (pending, ClaimOwned(owner_id="w", claim_token="t", nonce_already_stored=False, lease_us=60_000_000)),
    }
    for name, (record, command) in commands.items():
        seconds = min(timeit.repeat(lambda: QUEUE.decide(record, command, 10**12), number=repeat, repeat=5))
        emit(bench="kernel", command=name, microseconds=round(seconds / repeat * 1e6, 2))


def fingerprint(size_bytes: int, repeat: int) -> None:
    def row(n: int) -> dict[str, Any]:
        return {"id": n, "name": f"customer-{n}", "score": n * 0.5, "tags": ["a", "b", str(n)], "ok": n % 2 == 0}

    sample = len(json.dumps({"rows": [row(n) for n in range(1000)]}))
    count = -(-size_bytes * 1000 // sample)  # enough rows for size_bytes (sizes grow slowly with n)
    payload = {"rows": [row(n) for n in range(count)]}
    size = len(json.dumps(payload).encode())

    def floor() -> str:
        return hashlib.sha256(
            json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        ).hexdigest()

    def envelope_and_fingerprint() -> str:
        job = ValidationJob("orders", "1.0.0", "orders.jsonl", options=payload)
        return snapshot_submission(QueueKind.VALIDATION, job, "sub-1").fingerprint

    constructed = ValidationJob("orders", "1.0.0", "orders.jsonl", options=payload)

    def fingerprint_of_envelope() -> str:
        return snapshot_submission(QueueKind.VALIDATION, constructed, "sub-1").fingerprint

    floor_seconds = min(timeit.repeat(floor, number=repeat, repeat=3)) / repeat
    snapshot_seconds = min(timeit.repeat(fingerprint_of_envelope, number=repeat, repeat=3)) / repeat
    full_seconds = min(timeit.repeat(envelope_and_fingerprint, number=repeat, repeat=3)) / repeat
    emit(bench="fingerprint", payload_bytes=size, floor_ms=round(floor_seconds * 1000, 2),
         snapshot_ms=round(snapshot_seconds * 1000, 2), envelope_and_snapshot_ms=round(full_seconds * 1000, 2),
         floor_mib_per_second=round(size / floor_seconds / 2**20, 1),
         snapshot_mib_per_second=round(size / snapshot_seconds / 2**20, 1),
         envelope_and_snapshot_mib_per_second=round(size / full_seconds / 2**20, 1))


async def machine(server_dsn: str) -> None:
    """What the figures were measured on, printed beside them."""
    import os
    import platform

    model = "unknown"
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    connection = await asyncpg.connect(server_dsn)
    try:
        settings = {name: await connection.fetchval(f"SHOW {name}") for name in
                    ("server_version", "fsync", "synchronous_commit", "full_page_writes", "shared_buffers")}
    finally:
        await connection.close()
    emit(bench="machine", cpu=model, cores=os.cpu_count(), python=platform.python_version(),
         sqlite=sqlite3.sqlite_version, postgresql=settings)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--only", default="")
    arguments = parser.parse_args()
    smoke = arguments.smoke
    wanted = set(filter(None, arguments.only.split(",")))

    def selected(name: str) -> bool:
        return not wanted or name in wanted

    await machine(arguments.dsn)
    if selected("kernel"):
        kernel_decisions(2_000 if smoke else 100_000)
    if selected("fingerprint"):
        fingerprint(2**20, 2 if smoke else 10)
    if selected("sqlite"):
        await sqlite_cycle(50 if smoke else 2_000)
    if selected("cycle"):
        await cycles(arguments.dsn, 64 if smoke else 2_000, 1 if smoke else 3)
    if selected("per_call"):
        await per_call(arguments.dsn, 50 if smoke else 2_000, 1 if smoke else 3)
    if selected("burn_down"):
        await burn_down(arguments.dsn, 200 if smoke else 20_000, 4, 1 if smoke else 3)
    if selected("claim_latency"):
        await claim_latency(arguments.dsn, [1_000, 10_000] if smoke else [1_000, 100_000, 1_000_000], 20 if smoke else 500)
    if selected("worker"):
        # Concurrency 4 gets the burn-down's three rounds; 1 and 16 one each (the full run's time).
        await worker_burn_down(arguments.dsn, 200 if smoke else 20_000, {1: 1, 4: 1, 16: 1} if smoke else {1: 1, 4: 3, 16: 1})
    if selected("worker_latency"):
        await worker_latency(arguments.dsn, 20 if smoke else 200, 0.02)
    if selected("task_worker"):
        await task_burn_down(arguments.dsn, 200 if smoke else 20_000, {4: 1, 16: 1} if smoke else {4: 3, 16: 1})
    if selected("task_claim_latency"):
        await task_claim_latency(arguments.dsn, [1_000, 10_000] if smoke else [10_000, 100_000, 1_000_000],
                                 20 if smoke else 500)


if __name__ == "__main__":
    asyncio.run(main())
