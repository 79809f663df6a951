"""What the Run ledger costs end to end: no-op single-hop Runs per second beside SAQ's own
no-op jobs, in one run.

    python bench/runs.py POSTGRESQL_DSN [RUNS] [--rounds N] [--json]

Needs the extra ``tenure[saq]``. Migrates ``POSTGRESQL_DSN`` (use a throwaway database),
then for each concurrency (1, 4, 16) times, from a queue already filled with ``RUNS``
items (default 400):

* ``saq``: plain SAQ, one no-op job per item (enqueued before the clock starts), one
  SAQ worker in this process until every job completed;
* ``runs on saq``: tenure Runs admitted and published before the clock starts, one
  :class:`RunWorker` on :class:`SaqBroker` until every Run is DONE (each hop: claim,
  workflow, settle, checkpoint cleanup, and SAQ's own job bookkeeping);
* ``runs on queue``: the same with :class:`QueueBroker` (tenure's owned queue in the same
  database as the broker: no broker service);
* ``runs, in-memory broker``: the same with the broker in memory on the same database
  (the ledger's cost alone).

Prints one line per case (items per second) and the ratio of ``runs on saq`` to ``saq``
at each concurrency (issue 29's target is at least 0.8), or with ``--json`` one JSON line
per round and concurrency (bench/run.sh). A SQLite URL runs the queue and in-memory cases.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

from tenure.adapters import InMemoryBroker, QueueBroker, RunLedger, RunWorker, SaqBroker, Workflows, upgrade
from tenure.adapters.runs.saq_broker import stop_saq_worker
from tenure.model import RunIntent, RunStatus

CONCURRENCIES = (1, 4, 16)
workflows = Workflows()


@workflows.workflow("noop", "1")
async def noop(ctx: Any) -> None:
    return None


PIN = workflows.pin("noop", "1")


async def plain_saq(dsn: str, items: int, concurrency: int) -> float:
    from saq import Worker

    queue_name = f"plain-{uuid.uuid4().hex[:8]}"
    async with SaqBroker(dsn, queues=[queue_name]) as broker:
        queue = broker.queue(queue_name)
        done = asyncio.Event()
        finished = 0

        async def job(ctx: Any) -> None:
            return None

        async def after(ctx: Any) -> None:
            nonlocal finished
            finished += 1
            if finished >= items:
                done.set()

        keys = [f"plain:{n}" for n in range(items)]
        for key in keys:
            await queue.enqueue("job", key=key, retries=0, timeout=0)
        worker: Any = Worker(queue, functions=[("job", job)], concurrency=concurrency, after_process=[after])
        worker.SIGNALS = []
        started = time.perf_counter()
        launcher = asyncio.ensure_future(worker.start())
        await done.wait()
        elapsed = time.perf_counter() - started
        # Not worker.stop(): an idle worker can absorb its one cancellation and never stop.
        await stop_saq_worker(worker)
        await launcher
    return items / elapsed


async def tenure_runs(db_url: str, broker: Any, items: int, concurrency: int, queue: str) -> float:
    async with RunLedger(db_url) as ledger:
        source = f"bench-{uuid.uuid4().hex[:8]}"
        run_ids = []
        for n in range(items):
            intent = RunIntent(None, source, "bench", frozenset(), {"n": n})
            run_id = (await ledger.admit(intent, workflow=PIN, queue=queue, priority=50)).run.run_id
            assert await ledger.publish(run_id, 0, broker)
            run_ids.append(run_id)
        worker = RunWorker(ledger, broker, workflows, node="bench", concurrency=concurrency, queues=[queue])
        started = time.perf_counter()
        await worker.start()
        while worker.outcomes["done"] < items:
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
        await worker.stop(30)
        for run_id in run_ids[:: max(1, items // 20)]:  # a sample: every Run really finished
            run = await ledger.get(run_id)
            assert run is not None and run.status is RunStatus.DONE
    return items / elapsed


async def measure(db_url: str, items: int, concurrency: int, postgres: bool) -> dict[str, float]:
    """One round at one concurrency: items per second of each case."""
    rates = {"memory": await tenure_runs(db_url, InMemoryBroker(), items, concurrency, "runs")}
    queue = f"hops-{uuid.uuid4().hex[:8]}"
    hops = QueueBroker(db_url, queues=[queue])
    try:
        rates["runs_on_queue"] = await tenure_runs(db_url, hops, items, concurrency, queue)
    finally:
        await hops.close()
    if postgres:
        rates["saq"] = await plain_saq(db_url, items, concurrency)
        queue = f"runs-{uuid.uuid4().hex[:8]}"
        async with SaqBroker(db_url, queues=[queue]) as broker:
            rates["runs_on_saq"] = await tenure_runs(db_url, broker, items, concurrency, queue)
    return rates


async def main(db_url: str, items: int, rounds: int, as_json: bool) -> None:
    await upgrade(db_url)
    postgres = not db_url.startswith("sqlite")
    if not as_json:
        print(f"{items} no-op items per case, one process, this machine")
    for round_number in range(rounds):
        for concurrency in CONCURRENCIES:
            rates = await measure(db_url, items, concurrency, postgres)
            if as_json:
                print(json.dumps({"bench": "runs", "round": round_number, "concurrency": concurrency, "items": items,
                                  **{name: round(rate, 1) for name, rate in rates.items()}}), flush=True)
                continue
            line = (f"concurrency {concurrency:>2}: runs, in-memory broker {rates['memory']:8.1f}/s   "
                    f"runs on queue {rates['runs_on_queue']:8.1f}/s")
            if postgres:
                line += (f"   saq {rates['saq']:8.1f}/s   runs on saq {rates['runs_on_saq']:8.1f}/s   "
                         f"ratio {rates['runs_on_saq'] / rates['saq']:5.2f}")
            print(line, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("db_url")
    parser.add_argument("items", nargs="?", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="one JSON line per round and concurrency (bench/run.sh)")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.db_url, arguments.items, arguments.rounds, arguments.json))
