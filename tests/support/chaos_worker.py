"""A worker process for tests/processes/test_chaos.py, written as docs/workers.md tells a user to write one.

    python chaos_worker.py DB_URL LOG_PATH WORKER_NAME SEED LEASE_SECONDS

It claims with a fresh nonce (recovering the claim after an uncertain answer), sometimes
stalls past its lease, heartbeats, and completes with ``{"generation": g, "owner": w}``.
It handles ``TenureError`` only, as docs/workers.md says a worker should: anything else is a
raw exception, logged and fatal (exit code 3). Every answer is appended to LOG_PATH as
one JSON line (``os.write`` on an ``O_APPEND`` file: a line is never interleaved with
another process's, though ``kill -9`` may cut the last one short).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import uuid

from tenure.adapters import ValidationJobSource
from tenure.model import ErrorCode, TenureError, WorkerConfig

RAW_EXCEPTION_EXIT = 3


class Log:
    def __init__(self, path: str, worker: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._worker = worker

    def write(self, event: str, **fields: object) -> None:
        line = json.dumps({"event": event, "worker": self._worker, **fields}) + "\n"
        os.write(self._fd, line.encode())


async def claim(source: ValidationJobSource, worker: str, log: Log) -> object:
    token = f"{worker}-{uuid.uuid4().hex}"
    try:
        return await source.claim_next_owned(worker, claim_token=token)
    except TenureError as error:
        if error.code is not ErrorCode.QUEUE_PERSISTENCE_FAILED:
            raise
        log.write("claim_failed", reason=error.reason)
    # The claim may have committed: recover it with the same owner and nonce.
    try:
        recovered = await source.recover_owned_claim(worker, claim_token=token)
    except TenureError as error:
        log.write("recover_failed", reason=error.reason)
        return None
    if recovered is not None:
        log.write("claim_recovered", job=recovered.job_id)
    return recovered


async def work(source: ValidationJobSource, claimed: object, worker: str, lease_s: float, rng: random.Random, log: Log) -> None:
    fence = claimed.claim_fence  # type: ignore[attr-defined]
    if rng.random() < 0.12:
        await asyncio.sleep(lease_s * 1.6)  # stalls past the lease: another worker takes over
    elif rng.random() < 0.5:
        await asyncio.sleep(rng.random() * lease_s / 4)
        try:
            if not await source.heartbeat_owned(fence):
                log.write("heartbeat_refused", job=fence.job_id, generation=fence.generation)
        except TenureError as error:
            log.write("heartbeat_failed", reason=error.reason)
    result = {"generation": fence.generation, "owner": worker}
    for attempt in range(3):
        try:
            accepted = await source.complete_owned(fence, result)
        except TenureError as error:
            log.write("complete_failed", job=fence.job_id, generation=fence.generation, reason=error.reason)
            if error.reason == "commit_unacknowledged":
                return  # it may have applied; a repeat would answer False either way
            await asyncio.sleep(0.05 * (attempt + 1))
            continue
        log.write("completed" if accepted else "refused", job=fence.job_id, generation=fence.generation)
        return


async def main(db_url: str, log_path: str, worker: str, seed: int, lease_s: float) -> None:
    log = Log(log_path, worker)
    rng = random.Random(seed)
    config = WorkerConfig(db_url, lease_seconds=lease_s, heartbeat_seconds=lease_s / 4, timeout_seconds=2,
                          backoff_base_ms=10, backoff_max_ms=100)
    log.write("started", pid=os.getpid())
    try:
        async with ValidationJobSource(db_url, config) as source:
            idle = 0.0
            while True:
                claimed = await claim(source, worker, log)
                if claimed is None:
                    idle = min(0.2, idle + 0.02)
                    await asyncio.sleep(idle)
                    continue
                idle = 0.0
                await work(source, claimed, worker, lease_s, rng, log)
    except TenureError as error:
        log.write("tenure_error", code=error.code.value, reason=error.reason)
        raise SystemExit(2) from None
    except Exception as error:  # noqa: BLE001 - the point: a raw exception must never reach a worker
        log.write("raw_exception", kind=type(error).__name__)
        raise SystemExit(RAW_EXCEPTION_EXIT) from None


def run_process(db_url: str, log_path: str, worker: str, seed: int, lease_s: float, stderr_path: str) -> None:
    """The worker process's body when a fork server starts it (test_chaos.py): its
    output goes where a started interpreter's would, then :func:`main` runs."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
    asyncio.run(main(db_url, log_path, worker, seed, lease_s))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])))
