"""SQLite tail latency: several worker processes on one database file.

SQLite lets one connection write at a time; the others wait in SQLite's busy handler,
which sleeps and retries rather than queueing them in order. The median call stays
short, but an unlucky call can wait for many others' turns. This measures that tail so
that lease lengths can be chosen from figures:

    python bench/sqlite_contention.py [--processes 1,8] [--seconds 10]

Each process loops claim -> heartbeat -> complete on owned jobs (fresh nonce per claim)
for the given time, timing every call; the parent prints one JSON line per process count
with p50/p99/p999/max per call and overall, calls per second, and how many calls ended
in the ``timeout`` reason. Nothing here asserts on time: it reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from tenure.adapters import ValidationJobSource, upgrade
from tenure.model import TenureError, ValidationJob, WorkerConfig

LEASE_SECONDS = 60.0  # long enough that no lease expires during the run: this measures waiting only
KINDS = ("claim", "heartbeat", "complete")


async def worker(db_url: str, name: str, seconds: float) -> None:
    config = WorkerConfig(db_url, lease_seconds=LEASE_SECONDS, heartbeat_seconds=LEASE_SECONDS / 4)
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    timeouts = 0

    async def timed(kind: str, call):  # type: ignore[no-untyped-def]
        nonlocal timeouts
        started = time.perf_counter()
        try:
            return await call
        except TenureError as error:
            if error.reason != "timeout":
                raise
            timeouts += 1
            return None
        finally:
            samples[kind].append(time.perf_counter() - started)

    async with ValidationJobSource(db_url, config) as source:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            claimed = await timed("claim", source.claim_next_owned(name, claim_token=uuid.uuid4().hex))
            if claimed is None:
                continue
            await timed("heartbeat", source.heartbeat_owned(claimed.claim_fence))
            await timed("complete", source.complete_owned(claimed.claim_fence, {}))
    print(json.dumps({"samples": samples, "timeouts": timeouts}))


def quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "calls": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(quantile(ordered, 0.99) * 1000, 2),
        "p999_ms": round(quantile(ordered, 0.999) * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


async def prepare(db_url: str, jobs: int) -> None:
    await upgrade(db_url)
    async with ValidationJobSource(db_url, WorkerConfig(db_url)) as source:
        for n in range(jobs):
            await source.submit_owned(ValidationJob("bench", "1", f"data-{n}.jsonl"), submission_id=f"s-{n}")


def measure(processes: int, seconds: float) -> dict[str, object]:
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tenure-contention-"))
    db_url = f"sqlite:///{folder / 'tenure.db'}"
    # More jobs than the processes can finish in the time, so no claim finds the queue empty.
    asyncio.run(prepare(db_url, int(1000 * seconds)))
    children = [
        subprocess.Popen([sys.executable, __file__, "--worker", db_url, f"w{index}", str(seconds)],
                         stdout=subprocess.PIPE, text=True)
        for index in range(processes)
    ]
    merged: dict[str, list[float]] = {kind: [] for kind in KINDS}
    timeouts = 0
    for child in children:
        out, _ = child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"a contention worker failed with exit code {child.returncode}")
        report = json.loads(out.strip().splitlines()[-1])
        timeouts += report["timeouts"]
        for kind in KINDS:
            merged[kind] += report["samples"][kind]
    every = [value for kind in KINDS for value in merged[kind]]
    return {
        "bench": "sqlite_contention", "processes": processes, "seconds": seconds,
        "calls_per_second": round(len(every) / seconds, 1), "timeouts": timeouts,
        "all": summary(every), **{kind: summary(merged[kind]) for kind in KINDS},
    }


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        asyncio.run(worker(sys.argv[2], sys.argv[3], float(sys.argv[4])))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", default="1,8")
    parser.add_argument("--seconds", type=float, default=10.0)
    arguments = parser.parse_args()
    for count in (int(part) for part in arguments.processes.split(",")):
        print(json.dumps(measure(count, arguments.seconds)), flush=True)


if __name__ == "__main__":
    main()
