"""``tenure worker`` as a process on every database: ``kill -9`` in the middle of jobs
loses nothing and leaves each job finished by exactly one accepted write (the final
claim's); SIGTERM finishes or abandons in-flight work within the grace period and
exits 0; bad arguments exit 2."""

from __future__ import annotations

import asyncio
import collections
import os
import pathlib
import random
import signal
import subprocess
import sys
import time
from typing import Any

import paths

from tenure.adapters import ValidationJobSource, Worker
from tenure.model import JobStatus, ValidationJob, WorkerConfig

TESTS = paths.SUPPORT  # the handlers module


def worker_command(db_url: str, handler: str, *extra: str) -> list[str]:
    return [sys.executable, "-P", "-m", "tenure.apps.cli", "worker", "--db", db_url, "--queue", "validation",
            "--handler", f"worker_handlers:{handler}", *extra]


def start(db_url: str, handler: str, *extra: str, log: pathlib.Path | None = None) -> subprocess.Popen[bytes]:
    """A worker process, returned once it runs (its SIGTERM handler is installed: a
    signal that arrives during interpreter startup would kill it instead)."""
    process = subprocess.Popen(
        worker_command(db_url, handler, *extra), env={**os.environ, "PYTHONPATH": str(TESTS)},
        stdout=subprocess.PIPE, stderr=log.open("ab") if log is not None else subprocess.DEVNULL,
    )
    assert process.stdout is not None
    assert process.stdout.readline().startswith(b"worker on the"), "the worker did not start"
    return process


def run(db_url: str, handler: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(worker_command(db_url, handler, *extra), env={**os.environ, "PYTHONPATH": str(TESTS)},
                          capture_output=True, text=True, timeout=60)


async def submit(db_url: str, count: int, prefix: str) -> list[str]:
    async with ValidationJobSource(db_url, WorkerConfig(db_url)) as source:
        return [await source.submit_owned(ValidationJob("orders", "1", f"{prefix}-{n}.jsonl", max_attempts=1000),
                                          submission_id=f"{prefix}-{n}") for n in range(count)]


async def statuses(db_url: str) -> dict[str, Any]:
    async with ValidationJobSource(db_url, WorkerConfig(db_url)) as source:
        return {info.job_id: info for info in await source.list_jobs(limit=10_000)}


async def wait_until(db_url: str, done: Any, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        rows = await statuses(db_url)
        if done(rows) or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.3)


LEASE = ("--lease-seconds", "1", "--heartbeat-seconds", "0.25", "--idle-wait", "0.3", "--status-seconds", "1")
"""A killed worker's claims run out within a second, so another worker takes them over."""
LONG_LEASE = ("--lease-seconds", "600", "--heartbeat-seconds", "0.25", "--idle-wait", "0.3", "--status-seconds", "1")
"""For workers that must keep their claims to the end (a finish or a give-back needs a live
claim): a stall of a loaded machine never lapses these."""


async def test_kill_9_in_the_middle_of_jobs_loses_nothing_and_each_job_has_one_accepted_write(
    db_url: str, tmp_path: pathlib.Path
) -> None:
    ids = await submit(db_url, 400, "kill")
    rng = random.Random(13)
    log = tmp_path / "workers.log"
    processes = [start(db_url, "steady", *LEASE, "--concurrency", "4", log=log) for _ in range(2)]
    kills = 0
    try:
        for _ in range(4):
            await asyncio.sleep(rng.uniform(0.8, 1.5))
            victim = rng.randrange(len(processes))
            processes[victim].send_signal(signal.SIGKILL)
            processes[victim].wait()
            kills += 1
            processes[victim] = start(db_url, "steady", *LEASE, "--concurrency", "4", log=log)
        rows = await wait_until(db_url, lambda rows: all(r.status is JobStatus.COMPLETED for r in rows.values()), 120)
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        codes = [process.wait(timeout=30) for process in processes]
    assert codes == [0, 0], log.read_text()[-2000:]
    counts = collections.Counter(row.status.value for row in rows.values())
    lost = [job_id for job_id in ids if job_id not in rows or rows[job_id].status is not JobStatus.COMPLETED]
    assert not lost, f"{len(lost)} jobs lost or unfinished: {counts}"
    for job_id in ids:
        row = rows[job_id]
        # The stored result names the claim that wrote it: the final one. A completed row
        # takes no second completion, so that write is the job's only accepted one.
        assert row.result["generation"] == row.generation and row.result["owner"] == row.owner_id
    takeovers = sum(rows[job_id].generation - 1 for job_id in ids)
    assert kills == 4
    assert takeovers > 0, "no kill landed while claims were held"
    print(f"kill -9: {len(ids)} jobs, {kills} kills, {takeovers} takeovers after killed claims expired, lost {len(lost)}")


async def test_sigterm_lets_in_flight_work_finish_within_the_grace_and_loses_nothing(db_url: str) -> None:
    ids = await submit(db_url, 30, "term")
    # Handlers of a third of a second and a grace of a minute: every claim held at the
    # signal ends completed, none is given back (no timing asserted; a loaded machine
    # only makes the handlers slower, never the grace shorter than they need).
    process = start(db_url, "third_of_a_second", *LONG_LEASE, "--concurrency", "4", "--grace-seconds", "60")
    await wait_until(db_url, lambda rows: sum(r.status is JobStatus.COMPLETED for r in rows.values()) >= 4, 60)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0
    assert b"stopped: claimed" in output
    rows = await statuses(db_url)
    assert not [row for row in rows.values() if row.status is JobStatus.CLAIMED], "in-flight handlers finished"
    given_back = [row for row in rows.values() if row.status is JobStatus.PENDING and row.generation > 0]
    assert not given_back, "a claim held at the signal was given back: its handler did not finish within the grace"
    finished = sum(row.status is JobStatus.COMPLETED for row in rows.values())
    async with ValidationJobSource(db_url, WorkerConfig(db_url)) as source:
        async def handler(claimed: Any, context: Any) -> dict[str, Any]:
            return {"generation": context.generation}

        stats = await Worker(source, handler).run_until_idle()
    rows = await statuses(db_url)
    assert stats.completed == len(ids) - finished
    assert all(rows[job_id].status is JobStatus.COMPLETED for job_id in ids)


async def test_sigterm_stops_handlers_that_outlast_the_grace_and_gives_their_claims_back(db_url: str) -> None:
    ids = await submit(db_url, 3, "stuck")
    process = start(db_url, "stuck", *LONG_LEASE, "--concurrency", "3", "--batch", "3", "--grace-seconds", "0.5")
    await wait_until(db_url, lambda rows: sum(r.status is JobStatus.CLAIMED for r in rows.values()) == 3, 60)
    process.send_signal(signal.SIGTERM)
    # The handlers never end: only the half-second grace ends the process within the
    # hang guard (no timing asserted).
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0
    rows = await statuses(db_url)
    # Given back: pending at once, the attempt returned, nothing else written.
    assert all((row.status, row.attempt, row.generation, row.result) == (JobStatus.PENDING, 0, 1, None)
               for row in rows.values())
    async with ValidationJobSource(db_url, WorkerConfig(db_url)) as source:
        async def handler(claimed: Any, context: Any) -> dict[str, Any]:
            return {"generation": context.generation}

        stats = await Worker(source, handler).run_until_idle()
    assert stats.completed == 3
    rows = await statuses(db_url)
    assert all(rows[job_id].status is JobStatus.COMPLETED and rows[job_id].generation == 2 for job_id in ids)


async def test_a_handler_that_calls_sys_exit_or_raises_keyboard_interrupt_fails_its_job_and_the_process_goes_on(
    db_url: str,
) -> None:
    async with ValidationJobSource(db_url, WorkerConfig(db_url)) as source:
        bad = {name: await source.submit_owned(ValidationJob("orders", "1", f"{name}-0.jsonl", max_attempts=2),
                                               submission_id=name) for name in ("exit", "interrupt")}
        good = [await source.submit_owned(ValidationJob("orders", "1", f"good-{n}.jsonl", max_attempts=1),
                                          submission_id=f"good-{n}") for n in range(5)]
    process = start(db_url, "exits_on_request", *LEASE, "--concurrency", "1")
    try:
        settled = (JobStatus.COMPLETED, JobStatus.FAILED)
        rows = await wait_until(db_url, lambda rows: process.poll() is not None
                                or all(row.status in settled for row in rows.values()), 60)
        alive = process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    assert alive and code == 0, f"the worker process ended early with {process.returncode}"
    assert all(rows[job_id].status is JobStatus.COMPLETED for job_id in good)
    assert (rows[bad["exit"]].status, rows[bad["exit"]].error, rows[bad["exit"]].attempt) == (
        JobStatus.FAILED, "SystemExit: 3", 2)
    assert (rows[bad["interrupt"]].status, rows[bad["interrupt"]].error) == (JobStatus.FAILED, "KeyboardInterrupt")


def test_the_cli_refuses_bad_handlers_and_unmigrated_databases(fresh_db_url: str, database: str) -> None:
    missing = run(fresh_db_url, "brief")
    if database == "sqlite":
        # A source never creates a SQLite file: the folder exists, the file does not.
        assert missing.returncode == 2 and "tenure migrate" in missing.stdout, missing.stdout
    else:
        assert missing.returncode == 2 and "schema_missing" in missing.stdout, missing.stdout
    asyncio.run(_upgrade(fresh_db_url))
    unknown = run(fresh_db_url, "no_such_handler")
    assert unknown.returncode == 2 and "has no attribute of that name" in unknown.stdout
    nomodule = subprocess.run(worker_command(fresh_db_url, "x")[:-1] + ["no_such_module:handler"],
                              capture_output=True, text=True, timeout=60)
    assert nomodule.returncode == 2 and "ModuleNotFoundError" in nomodule.stdout
    sync = run(fresh_db_url, "not_async")
    assert sync.returncode == 2 and "async_callable_required" in sync.stdout
    bad_lease = run(fresh_db_url, "brief", "--lease-seconds", "1", "--heartbeat-seconds", "2")
    assert bad_lease.returncode == 2 and "heartbeat" in bad_lease.stdout
    bad_concurrency = run(fresh_db_url, "brief", "--concurrency", "0")
    assert bad_concurrency.returncode == 2 and "concurrency: integer_out_of_range" in bad_concurrency.stdout
    for result in (missing, unknown, sync, bad_lease):
        assert fresh_db_url not in result.stdout + result.stderr  # never echoes the URL


async def _upgrade(url: str) -> None:
    from tenure.adapters import upgrade

    await upgrade(url)
