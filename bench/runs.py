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

For the in-memory and queue cases it also counts the SQL statements sent per Run (each
one round trip on PostgreSQL, see ``tests/support/statements.py``), split into the
admission, the publication and the hop (everything the worker sent until every Run was
DONE, its polls and the broker's own bookkeeping included, divided by the Runs), and this
process's CPU per Run (admission and publication, then the hop): counts and CPU are
steadier than Runs per second on a shared machine. ``--concurrency 1`` measures one
concurrency, ``--no-saq`` leaves the SAQ cases out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
import time
import uuid
from typing import Any

from tenure.adapters import InMemoryBroker, QueueBroker, RunLedger, RunWorker, SaqBroker, Workflows, upgrade
from tenure.adapters.runs.saq_broker import stop_saq_worker
from tenure.model import RunIntent, RunStatus

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "support"))
from statements import count_statements  # noqa: E402 - the suite's counter, by path

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


async def tenure_runs(db_url: str, broker: Any, items: int, concurrency: int, queue: str,
                      costs: dict[str, float] | None = None) -> float:
    """Runs per second of one case; ``costs`` (when given) receives the statements and the
    client CPU per Run of its admission, publication and hop."""
    async with RunLedger(db_url) as ledger:
        source = f"bench-{uuid.uuid4().hex[:8]}"
        run_ids = []
        with count_statements() as counted:
            admit = publish = 0
            setup_cpu = time.process_time()
            for n in range(items):
                intent = RunIntent(None, source, "bench", frozenset(), {"n": n})
                mark = counted.total
                run_id = (await ledger.admit(intent, workflow=PIN, queue=queue, priority=50)).run.run_id
                admit += counted.since(mark)
                mark = counted.total
                assert await ledger.publish(run_id, 0, broker)
                publish += counted.since(mark)
                run_ids.append(run_id)
            setup_cpu = time.process_time() - setup_cpu
            worker = RunWorker(ledger, broker, workflows, node="bench", concurrency=concurrency, queues=[queue])
            mark, started, cpu = counted.total, time.perf_counter(), time.process_time()
            await worker.start()
            while worker.outcomes["done"] < items:
                await asyncio.sleep(0.005)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            hop = counted.since(mark)
        await worker.stop(30)
        for run_id in run_ids[:: max(1, items // 20)]:  # a sample: every Run really finished
            run = await ledger.get(run_id)
            assert run is not None and run.status is RunStatus.DONE
    if costs is not None:
        costs.update(admit=admit / items, publish=publish / items, hop=hop / items,
                     statements=(admit + publish + hop) / items, setup_cpu_us=setup_cpu / items * 1e6,
                     hop_cpu_us=cpu / items * 1e6, cpu_us=(setup_cpu + cpu) / items * 1e6)
    return items / elapsed


def _costs_text(name: str, costs: dict[str, float]) -> str:
    return (f"  {name}: {costs['statements']:.1f} statements per Run (admit {costs['admit']:.1f}, publish "
            f"{costs['publish']:.1f}, hop {costs['hop']:.1f}); client CPU {costs['cpu_us']:,.0f} us per Run "
            f"(admit and publish {costs['setup_cpu_us']:,.0f}, hop {costs['hop_cpu_us']:,.0f})")


async def measure(db_url: str, items: int, concurrency: int, postgres: bool,
                  costs: dict[str, dict[str, float]]) -> dict[str, float]:
    """One round at one concurrency: items per second of each case (``costs``: the
    statements and CPU per Run of the in-memory and queue cases, by case)."""
    costs.update(memory={}, runs_on_queue={})
    rates = {"memory": await tenure_runs(db_url, InMemoryBroker(), items, concurrency, "runs", costs["memory"])}
    queue = f"hops-{uuid.uuid4().hex[:8]}"
    hops = QueueBroker(db_url, queues=[queue])
    try:
        rates["runs_on_queue"] = await tenure_runs(db_url, hops, items, concurrency, queue, costs["runs_on_queue"])
    finally:
        await hops.close()
    if postgres:
        rates["saq"] = await plain_saq(db_url, items, concurrency)
        queue = f"runs-{uuid.uuid4().hex[:8]}"
        async with SaqBroker(db_url, queues=[queue]) as broker:
            rates["runs_on_saq"] = await tenure_runs(db_url, broker, items, concurrency, queue)
    return rates


async def main(db_url: str, items: int, rounds: int, as_json: bool, concurrencies: tuple[int, ...] = CONCURRENCIES,
               saq: bool = True) -> None:
    await upgrade(db_url)
    postgres = saq and not db_url.startswith("sqlite")
    if not as_json:
        print(f"{items} no-op items per case, one process, this machine")
    for round_number in range(rounds):
        for concurrency in concurrencies:
            costs: dict[str, dict[str, float]] = {}
            rates = await measure(db_url, items, concurrency, postgres, costs)
            if as_json:
                print(json.dumps({"bench": "runs", "round": round_number, "concurrency": concurrency, "items": items,
                                  **{name: round(rate, 1) for name, rate in rates.items()},
                                  "costs": {case: {name: round(value, 2) for name, value in figures.items()}
                                            for case, figures in costs.items()}}), flush=True)
                continue
            line = (f"concurrency {concurrency:>2}: runs, in-memory broker {rates['memory']:8.1f}/s   "
                    f"runs on queue {rates['runs_on_queue']:8.1f}/s")
            if postgres:
                line += (f"   saq {rates['saq']:8.1f}/s   runs on saq {rates['runs_on_saq']:8.1f}/s   "
                         f"ratio {rates['runs_on_saq'] / rates['saq']:5.2f}")
            print(line, flush=True)
            print(_costs_text("in-memory broker", costs["memory"]), flush=True)
            print(_costs_text("QueueBroker", costs["runs_on_queue"]), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("db_url")
    parser.add_argument("items", nargs="?", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="one JSON line per round and concurrency (bench/run.sh)")
    parser.add_argument("--concurrency", type=int, action="append", help="one concurrency (repeatable); default 1, 4, 16")
    parser.add_argument("--no-saq", action="store_true", help="leave the SAQ cases out")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.db_url, arguments.items, arguments.rounds, arguments.json,
                     tuple(arguments.concurrency or CONCURRENCIES), not arguments.no_saq))
