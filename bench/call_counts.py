"""Python function calls per owned operation: the steadiest figure of tenure's client cost.

    python bench/call_counts.py DSN [CALLS] [--json=PATH]

Counts, with ``sys.setprofile``, the Python function calls (``call`` events: tenure's,
asyncpg's Python layer and asyncio's; C functions are not counted) one owned call makes
on one connection, averaged over CALLS calls after a warm-up: submit, claim, heartbeat,
complete, and a claim + complete of 10, for tenure's validation queue and for the
hand-written floor (tenure_bench.LockFirstFloor: one statement per step, its fenced
writes lock first, as tenure's decided-ahead statements do). The
counts do not depend on the machine's load, so they compare runs on a shared machine.
Issue 51's figures on 4040f57: heartbeat 225 (floor 42), complete 239 (42), claim 453
(47), submit 480 (208). With ``--json=PATH`` the figures are also written there
(bench/run.sh writes bench/call_counts.json; bench/report.py shows them in issue 51's
before/after table). Not a test: nothing is asserted.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import tenure_bench as bench  # noqa: E402

from tenure.adapters import ValidationJobSource  # noqa: E402


async def counted(calls: int, call: Callable[[int], Awaitable[Any]]) -> float:
    """The mean Python function calls of ``call(n)`` over ``calls`` calls (after a warm-up)."""
    for n in range(10):
        await call(-1 - n)
    seen = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen[0] += 1

    for n in range(calls):
        sys.setprofile(profile)
        try:
            await call(n)
        finally:
            sys.setprofile(None)
    return seen[0] / calls


def line(label: str, tenure: float, floor: float) -> None:
    print(f"{label:<32} tenure {tenure:7.0f}   floor {floor:7.0f}   ratio {tenure / floor:5.1f}x", flush=True)


async def main(server_dsn: str, calls: int, json_path: str | None = None) -> None:
    db_url = await bench.fresh_database(server_dsn)
    await bench.bulk_load(db_url, 40 * (calls + 20))
    ours: dict[str, float] = {}
    async with ValidationJobSource(db_url, bench.config(db_url)) as source:
        ours["submit"] = await counted(calls, lambda n: source.submit_owned(
            bench.request(10_000_000 + n), submission_id=f"calls-{n}-{uuid.uuid4().hex}"))
        fences: list[Any] = []

        async def claim(n: int) -> None:
            claimed = await source.claim_next_owned("worker", claim_token=uuid.uuid4().hex)
            fences.append(claimed.claim_fence)

        ours["claim"] = await counted(calls, claim)
        held = fences[-1]
        ours["heartbeat"] = await counted(calls, lambda n: source.heartbeat_owned(held))
        finishing = iter(fences[:-1])
        ours["complete"] = await counted(calls - 1, lambda n: source.complete_owned(next(finishing), {}))

        async def batch(n: int) -> None:
            claims = await source.claim_batch_owned("worker", claim_tokens=[uuid.uuid4().hex for _ in range(10)])
            assert all(await source.complete_many_owned([(c.claim_fence, {}) for c in claims]))

        ours["claim + complete of 10"] = await counted(max(1, calls // 10), batch)
    connection = await asyncpg.connect(db_url)
    floors: dict[str, float] = {}
    try:
        # The single-statement floor (issue 51's "floor"), the lock-first shape for the fenced writes.
        floor = bench.LockFirstFloor(connection, "worker")
        floors["submit"] = await counted(calls, lambda n: floor.submit(20_000_000 + n))
        claims: list[Any] = []

        async def floor_claim(n: int) -> None:
            claims.extend(await floor.claim(1))

        floors["claim"] = await counted(calls, floor_claim)
        floors["heartbeat"] = await counted(calls, lambda n: floor.heartbeat(claims[-1:]))
        floors["complete"] = await counted(calls - 1, lambda n: floor.complete([claims[n]]))

        async def floor_batch(n: int) -> None:
            await floor.complete(await floor.claim(10))

        floors["claim + complete of 10"] = await counted(max(1, calls // 10), floor_batch)
    finally:
        await connection.close()
    print("Python function calls per call (sys.setprofile 'call' events)")
    for name, value in ours.items():
        line(name, value, floors[name])
    if json_path is not None:
        # bench/report.py reads them beside a run's measurements (issue 51's before/after table)
        pathlib.Path(json_path).write_text(json.dumps({"calls": calls, "tenure": ours, "floor": floors}, indent=1) + "\n")


if __name__ == "__main__":
    arguments = [argument for argument in sys.argv[1:] if not argument.startswith("--json=")]
    written = [argument.split("=", 1)[1] for argument in sys.argv[1:] if argument.startswith("--json=")]
    asyncio.run(main(arguments[0], int(arguments[1]) if len(arguments) > 1 else 200, written[0] if written else None))
