"""How fast recovery goes through Runs: one startup reconciliation, then relay rounds.

    python bench/recovery.py DB_URL [RUNS] [--json] [--profile]

Migrates ``DB_URL`` (a SQLite file URL or a PostgreSQL DSN; use a throwaway database),
then stores ``RUNS`` Runs (default 2,000) as a dead process of ``node-a`` leaves them, a
quarter each: hops claimed before the boot (no snapshot: failed ``lost``), deliveries
the broker lost (republished), waits whose consent was decided meanwhile (resumed and
published), and deliveries the broker still holds (marked nothing). It times
``reconcile`` over all of them, then relay rounds (``page_size`` 32) over the queued
Runs the reconciliation left (twice as many calls as pages: revisits alternate with
forward pages), visiting up to ``VISIT_CONCURRENCY`` Runs of a page at once (the
in-memory broker allows it; ``RecoveryPorts``' default visits one at a time). Prints one
line per pass: Runs visited, seconds, Runs per second, this process's CPU per Run and the
SQL statements sent per Run (each one round trip on PostgreSQL; counted by
``tests/support/statements.py``). The broker is in memory, so the figures are the
ledger's and the database's cost alone.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import pathlib
import sys
import time
import uuid

from tenure.adapters import InMemoryBroker, RecoveryPorts, RunLedger, upgrade
from tenure.adapters.runs import recovery
from tenure.model import ConsentStatus, RunIntent, WaitKind, WorkflowPin, hop_key

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "support"))
from statements import StatementCount, count_statements  # noqa: E402 - the suite's counter, by path

PIN = WorkflowPin("bench", "1", "sha256:" + "b" * 64)


async def populate(ledger: RunLedger, broker: InMemoryBroker, runs: int) -> None:
    source = f"bench-{uuid.uuid4().hex[:8]}"
    intent = RunIntent(session_id=None, source=source, principal="bench", scopes=frozenset(), payload={},
                       requested_priority=None)
    for n in range(runs):
        run_id = (await ledger.admit(intent, workflow=PIN, queue="bench", priority=50,
                                     idempotency_key=f"run-{n}")).run.run_id
        assert await ledger.publish(run_id, 0, broker)
        kind = n % 4
        if kind == 0:  # an orphaned hop
            assert await ledger.claim(run_id, 0, node="node-a") is not None
        elif kind == 1:  # a publication the broker lost
            del broker.jobs[hop_key(run_id, 0)]
        elif kind == 2:  # parked on a consent decided while the process was dead
            assert await ledger.claim(run_id, 0, node="node-a") is not None
            consent = await ledger.consents.create(run_id, tool_name="t", tool_call_id=f"c-{n}", payload={})
            assert await ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent.consent_id)
            assert await ledger.consents.decide(consent.consent_id, ConsentStatus.GRANTED, decided_by="bench")


def count_visits() -> list[int]:
    """Count the Runs recovery visits from now on (a one-element counter)."""
    counter = [0]
    visit = recovery._Visits.visit

    async def counted(self: recovery._Visits, run_id: str, entry: recovery.PageEntry | None = None) -> bool:
        counter[0] += 1
        return await visit(self, run_id, entry)

    recovery._Visits.visit = counted  # type: ignore[method-assign]
    return counter


AS_JSON = "--json" in sys.argv
"""One JSON line per pass instead of text (bench/run.sh)."""

PROFILE = "--profile" in sys.argv
"""After each pass, the statements it sent, most frequent first (what a figure is made of)."""


def profile(counted: StatementCount, runs: int) -> None:
    if PROFILE and not AS_JSON:
        for text, times in counted.profile().most_common(12):
            print(f"    {times / runs:6.2f}/Run  {text}", flush=True)


def line(label: str, runs: int, seconds: float, cpu_seconds: float, statements: int) -> None:
    if AS_JSON:
        print(json.dumps({"bench": "recovery", "pass": label.split(" ")[0], "runs": runs, "seconds": round(seconds, 3),
                          "runs_per_second": round(runs / seconds, 1),
                          "cpu_us_per_run": round(cpu_seconds / runs * 1e6, 1),
                          "statements_per_run": round(statements / runs, 2)}), flush=True)
        return
    print(f"{label:<34} {runs:>7} Runs  {seconds:8.2f} s  {runs / seconds:9.0f} Runs/s  "
          f"client cpu {cpu_seconds / runs * 1e6:7.0f} us/Run  {statements / runs:6.2f} statements/Run", flush=True)


async def main(db_url: str, runs: int) -> None:
    await upgrade(db_url)
    broker = InMemoryBroker()
    async with RunLedger(db_url) as ledger:
        await populate(ledger, broker, runs)
        ports = RecoveryPorts(broker, concurrency=recovery.VISIT_CONCURRENCY)  # the in-memory broker allows it
        await asyncio.sleep(0.01)
        cutoff = dt.datetime.now(dt.timezone.utc)
        with count_statements() as counted:
            started, cpu = time.perf_counter(), time.process_time()
            report = await ledger.reconcile(ports, node="node-a", boot_cutoff=cutoff)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        line("reconcile (every Run)", runs, elapsed, cpu, counted.total)
        profile(counted, runs)
        if not AS_JSON:
            print(f"  counts: {dict((name, count) for name, count in report.counts.items() if count)}", flush=True)
        # Every queued Run is kept (the broker holds its job), so every page is also
        # queued for revisits: relay calls alternate revisits and forward pages, each a
        # full page of deliveries (the wait kinds are empty now).
        queued = runs - runs // 4  # the orphans failed; everything else is queued now
        calls = 2 * -(-queued // 32)
        visits = count_visits()
        with count_statements() as counted:
            cursor, started, cpu = None, time.perf_counter(), time.process_time()
            for _ in range(calls):
                cursor = (await ledger.relay(ports, cursor=cursor)).cursor
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        line("relay calls (32-Run pages)", visits[0], elapsed, cpu, counted.total)
        profile(counted, visits[0])
        if not AS_JSON:
            print(f"  {calls} relay calls, {elapsed / calls * 1000:.1f} ms each", flush=True)


if __name__ == "__main__":
    positional = [argument for argument in sys.argv[1:] if argument not in ("--json", "--profile")]
    asyncio.run(main(positional[0], int(positional[1]) if len(positional) > 1 else 2000))
