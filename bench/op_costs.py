"""Client CPU and wall time of single owned operations, tenure beside the locked floor.

Where the benchmark suite measures throughput, this measures one call at a time on one
connection, so that a change to tenure's own per-call work (the pool, row reading, the
kernel) shows up above the noise of a shared machine:

    python bench/op_costs.py DSN [CALLS]

Prints, for ``heartbeat_owned`` on one live claim and for a claim + complete of 10 jobs,
microseconds of wall time and of this process's CPU time per call (the server's CPU is
not counted), for tenure and for tenure_bench.LockedFloor (the same transaction shape,
hand-written).
"""

from __future__ import annotations

import asyncio
import pathlib
import sys
import time
import uuid

import asyncpg

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import tenure_bench as bench  # noqa: E402

from tenure.adapters import ValidationJobSource  # noqa: E402


def line(label: str, calls: int, wall: float, cpu: float) -> None:
    print(f"{label:<44} wall {wall / calls * 1e6:8.0f} us   client cpu {cpu / calls * 1e6:8.0f} us", flush=True)


async def timed(calls: int, call) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    for _ in range(max(10, calls // 10)):  # warm-up
        await call()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        await call()
    return time.perf_counter() - wall, time.process_time() - cpu


async def main(server_dsn: str, calls: int) -> None:
    db_url = await bench.fresh_database(server_dsn)
    await bench.bulk_load(db_url, 20 * (calls + calls // 10 + 10))
    async with ValidationJobSource(db_url, bench.config(db_url)) as source:
        claimed = await source.claim_next_owned("worker", claim_token=uuid.uuid4().hex)
        line("tenure heartbeat_owned", calls, *await timed(calls, lambda: source.heartbeat_owned(claimed.claim_fence)))

        async def batch() -> None:
            claims = await source.claim_batch_owned("worker", claim_tokens=[uuid.uuid4().hex for _ in range(10)])
            assert all(await source.complete_many_owned([(c.claim_fence, {}) for c in claims]))

        line("tenure claim_batch_owned + complete_many (10)", calls, *await timed(calls, batch))
    connection = await asyncpg.connect(db_url)
    try:
        floor = bench.LockedFloor(connection, "worker")
        claims = await floor.claim(1)
        line("locked floor heartbeat", calls, *await timed(calls, lambda: floor.heartbeat(claims)))

        async def floor_batch() -> None:
            await floor.complete(await floor.claim(10))

        line("locked floor claim + complete (10)", calls, *await timed(calls, floor_batch))
    finally:
        await connection.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2000))
