"""The seed's own system: pycharter 0.0.67's submit + claim + heartbeat + complete cycle.

Runs in pycharter's own environment (``.venv-pycharter``, which bench/run.sh builds when
missing, as the test suite does; tenure is not importable there), against a fresh database on the server it is given:

    python bench/pycharter_cycle.py SERVER_DSN [JOBS] [ROUNDS]

pycharter's tables come from its own ``pycharter db init`` (with alembic's version column
widened, as tests/support/pycharter_client.py does: its revision IDs do not fit the
default 32 characters on PostgreSQL). Each job goes through pycharter's
``ValidationJobSource`` exactly as its worker drives it: ``submit``, ``claim_next``,
``heartbeat`` and ``complete`` (each step is its own transaction, run on a thread by
pycharter). Prints one JSON line per worker count, the median of ``ROUNDS`` rounds of
``JOBS`` jobs after a warm-up (bench/report.py sets it beside tenure's cycle of the same
run).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import pathlib
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "support"))
import pycharter_client  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from scratch_database import create_database  # noqa: E402

WORKERS = (1, 4, 16)


def fresh_database(server_dsn: str) -> str:
    url = create_database(server_dsn, "pycharter")
    with contextlib.redirect_stdout(io.StringIO()):  # pycharter's CLI prints its progress
        assert pycharter_client.init(url)["status"] == 0
    return url


async def cycle(url: str, workers: int, jobs: int) -> float:
    from pycharter.worker.models import ValidationJob

    validation, _, _ = pycharter_client._sources(url)

    async def work(index: int) -> int:
        done = 0
        for n in range(jobs // workers):
            await validation.submit(ValidationJob("orders", "1.0", f"w{index}-{n}.jsonl"))
            claimed = None
            while claimed is None:  # another worker may hold the only pending rows for a moment
                claimed = await validation.claim_next(f"worker-{index}")
            assert await validation.heartbeat(claimed.event_id, f"worker-{index}")
            await validation.complete(claimed.event_id, {"ok": True})
            done += 1
        return done

    started = time.perf_counter()
    done = sum(await asyncio.gather(*(work(index) for index in range(workers))))
    return done / (time.perf_counter() - started)


async def main(server_dsn: str, jobs: int, rounds: int) -> None:
    for workers in WORKERS:
        measured = []
        for _ in range(rounds):
            url = fresh_database(server_dsn)
            await cycle(url, workers, max(workers, jobs // 10))  # warm-up
            measured.append(round(await cycle(url, workers, jobs), 1))
        print(json.dumps({"bench": "pycharter_cycle", "workers": workers, "jobs": jobs, "rounds": measured,
                          "cycles_per_second": statistics.median(measured)}), flush=True)


if __name__ == "__main__":
    arguments: list[Any] = sys.argv[1:]
    asyncio.run(main(arguments[0], int(arguments[1]) if len(arguments) > 1 else 2_000,
                     int(arguments[2]) if len(arguments) > 2 else 3))
