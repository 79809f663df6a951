"""Decision-to-resumed-step latency: a Run parked on a consent, the consent granted and
the Run resumed and published (``resume_and_publish``), until the workflow's resumed step
starts, on QueueBroker and on the in-memory broker, one Run at a time.

    python bench/resume_latency.py DB_URL [SAMPLES] [--json]

Each sample is a fresh Run; the RunWorker idles between samples (QueueBroker polls every
``poll_s`` = 50 ms as its fallback; a publish wakes its serving loop at once). Prints the
median and p90 in milliseconds per broker (JSON lines with ``--json``).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from typing import Any

from tenure.adapters import InMemoryBroker, QueueBroker, RunLedger, RunWorker, Workflows, resume_and_publish, upgrade
from tenure.model import ConsentStatus, RunIntent, RunStatus


async def wait_status(ledger: RunLedger, run_id: str, status: RunStatus) -> Any:
    for _ in range(2000):  # a hang guard of 20 s, not a timing
        run = await ledger.get(run_id)
        if run is not None and run.status is status:
            return run
        await asyncio.sleep(0.01)
    raise AssertionError(f"run never reached {status}")


async def measure(db_url: str, broker: Any, samples: int) -> list[float]:
    resumed: dict[str, asyncio.Future[float]] = {}
    flows = Workflows()

    @flows.workflow("approve", "1")
    async def approve(ctx: Any) -> None:
        if not ctx.resumed:
            await ctx.request_consent(tool_name="email", tool_call_id="call-1", payload={}, state={})
        future = resumed.get(ctx.run_id)
        if future is not None and not future.done():
            future.set_result(time.perf_counter())

    pin = flows.pin("approve", "1")
    latencies: list[float] = []
    async with RunLedger(db_url) as ledger:
        worker = RunWorker(ledger, broker, flows, node="bench", watch_interval_s=0.05)
        await worker.start()
        try:
            for _ in range(samples + 3):  # three warm-up Runs
                admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=pin,
                                               queue="runs", priority=50)
                run_id = admission.run.run_id
                # False when the worker claimed the hop before its publication was recorded
                # (RunLedger.publish says so); the wait below proves the Run went on.
                await ledger.publish(run_id, 0, broker)
                parked = await wait_status(ledger, run_id, RunStatus.AWAITING_CONSENT)
                resumed[run_id] = asyncio.get_running_loop().create_future()
                await asyncio.sleep(0.2)  # the worker idles, as a Run waiting on a person would find it
                started = time.perf_counter()
                assert await ledger.consents.decide(parked.owner_id, ConsentStatus.GRANTED, decided_by="bob")
                await resume_and_publish(ledger, broker, run_id, owner_id=parked.owner_id)
                latencies.append(await asyncio.wait_for(resumed[run_id], 20) - started)
                await wait_status(ledger, run_id, RunStatus.DONE)
        finally:
            await worker.stop(5)
    return latencies[3:]


async def main(db_url: str, samples: int, as_json: bool) -> None:
    await upgrade(db_url)
    for name in ("queue", "memory"):
        broker = QueueBroker(db_url, queues=["runs"]) if name == "queue" else InMemoryBroker()
        try:
            latencies = await measure(db_url, broker, samples)
        finally:
            if name == "queue":
                await broker.close()
        ordered = sorted(latencies)
        p50 = statistics.median(ordered) * 1000
        p90 = ordered[max(0, int(len(ordered) * 0.9) - 1)] * 1000
        if as_json:
            print(json.dumps({"bench": "resume_latency", "broker": name, "samples": samples,
                              "p50_ms": round(p50, 2), "p90_ms": round(p90, 2)}))
        else:
            print(f"{name}: decision to resumed step p50 {p50:.1f} ms, p90 {p90:.1f} ms ({samples} Runs)")


if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if a != "--json"]
    asyncio.run(main(arguments[0], int(arguments[1]) if len(arguments) > 1 else 30, "--json" in sys.argv))
