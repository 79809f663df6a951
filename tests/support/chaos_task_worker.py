"""A task worker process for tests/processes/test_task_chaos.py: a TaskApp's own fenced
Worker, written as docs/tasks.md tells a user to run one, killed with ``kill -9`` at random.

Its task returns the generation it ran under; a few runs stall past the lease (the
worker cancels them when the lease may have ended, and another worker takes over). Every
answer of a completion write is appended to the log as one JSON line (``os.write`` on an
``O_APPEND`` file), so the test can count the completions that were accepted.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from typing import Any

from tenure.adapters import Backoff, TaskApp, TaskContext
from tenure.model import WorkerConfig

RAW_EXCEPTION_EXIT = 3


def build_app(db_url: str, lease_s: float, seed: int, log: Any) -> TaskApp:
    config = WorkerConfig(db_url, lease_seconds=lease_s, heartbeat_seconds=lease_s / 4, timeout_seconds=2)
    app = TaskApp(db_url, config=config)
    rng = random.Random(seed)

    @app.task(queue="chaos", name="chaos.drain", max_attempts=10_000, retry=Backoff(0.01, 0.1))
    async def drain(ctx: TaskContext, n: int) -> dict[str, Any]:
        if rng.random() < 0.1:
            await asyncio.sleep(lease_s * 3)  # a stall: the lease runs out, the handler is cancelled
        else:
            await asyncio.sleep(rng.random() * lease_s / 8)
        return {"generation": ctx.generation, "n": n}

    return app


def run_process(db_url: str, log_path: str, worker: str, seed: int, lease_s: float, stderr_path: str) -> None:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(event: str, **fields: object) -> None:
        os.write(fd, (json.dumps({"event": event, "worker": worker, **fields}) + "\n").encode())

    async def main() -> None:
        app = build_app(db_url, lease_s, seed, log)
        source = app.source
        complete_many = source.complete_many_owned

        async def logged(items: Any) -> list[bool]:
            answers = await complete_many(items)
            for (fence, _), accepted in zip(items, answers):
                log("completed" if accepted else "refused", job=fence.job_id, generation=fence.generation)
            return answers

        source.complete_many_owned = logged  # type: ignore[method-assign]
        log("started", pid=os.getpid())
        try:
            await app.worker(concurrency=4, batch_size=4, idle_wait_s=0.2, worker_id=worker).run()
        except Exception as error:  # noqa: BLE001 - a raw exception must never reach a worker
            from tenure.model import TenureError

            if isinstance(error, TenureError):
                log("tenure_error", code=error.code.value, reason=error.reason)
                raise SystemExit(2) from None
            log("raw_exception", kind=type(error).__name__)
            raise SystemExit(RAW_EXCEPTION_EXIT) from None

    asyncio.run(main())
