"""How many SQL statements a Run and its recovery send, counted (never timed) on every
database: each figure is an upper bound, so a change that sends more fails here
(``tests/support/statements.py`` counts; ``bench/runs.py`` and ``bench/recovery.py`` report
the same figures beside their times).

The bounds are the counts measured when they were pinned (issue 49): a change that lowers
a count may lower its bound; one that raises it says why in its commit.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from polling import until
from run_support import Runs
from statements import StatementCount, count_statements

from tenure.adapters import InMemoryBroker, QueueBroker, RecoveryPorts, RunLedger, RunWorker, Workflows
from tenure.model import ConsentStatus, RunIntent, WaitKind, hop_key

workflows = Workflows()


@workflows.workflow("noop", "1")
async def noop(ctx: Any) -> None:
    return None


PIN = workflows.pin("noop", "1")

SINGLE_HOP_BOUNDS = {"postgresql": {"admit": 1, "publish": 1, "hop": 2}, "sqlite": {"admit": 6, "publish": 9, "hop": 13}}
"""A single-hop no-op Run on the in-memory broker (the ledger's own statements): its
admission, its publication, and its hop (claim; the settle with its outcome: on
PostgreSQL one statement decided ahead, ``COUNTED_AHEAD``, that locks the pair, counts
its evidence after the locks and writes the pair with its checkpoint delete; on SQLite
one transaction). The hop was 5 on PostgreSQL while the settle took a transaction of its
own (BEGIN, the pair locked with its counted evidence, the pair written with its
checkpoint delete and the counts verified, COMMIT), and 15 on PostgreSQL and 20 on
SQLite while the outcome was recorded in a transaction of its own before the settle,
whose evidence, consents and checkpoint took a statement each. The publication was 2
on PostgreSQL while it read the pair before asking the kernel whether to send (it now
asks on the pair its admission remembered)."""

QUEUE_BROKER_BOUNDS = {"postgresql": 6, "sqlite": 48}
"""A single-hop no-op Run end to end on tenure's own queue (:class:`QueueBroker`, a worker
of two slots, alone on its queue), from its admission until its hop task is complete: the
ledger's statements above (on PostgreSQL: admit 1, publish 1, claim 1, settle 1; the hop
task's submit is inserted by the publication's statement, ``JoinedPublisher``), plus the
hop task's claim (one statement, woken by the publication's announcement) and its
complete. Measured with the hop starting once its publication is recorded (on PostgreSQL
the task becomes claimable only with the publication, in one statement; on SQLite the
task is submitted before the ledger records the publication, and a hop claimed in between
sends one or two statements more).

7 on PostgreSQL while the hop task's submit was a statement of its own before the record.
8 while a publication read the pair before sending; 11 while the settle took a transaction
of its own (four statements).
17 to 20 on PostgreSQL and 52 to 60 on SQLite (varying with the serving loop's wakes)
before the loop claimed only when a hop may be due (an announcement, a publish of this
process nobody announces, a claim that filled every free slot, the fallback poll) instead
of after every wake, and claimed without looking first where a claim is one statement
anyway (PostgreSQL)."""

RECONCILE_BOUNDS = {"postgresql": 69, "sqlite": 134}
"""Startup reconciliation of the eight Runs :func:`dead_node` leaves (two each: an orphaned
hop failed ``lost``, a lost publication republished, a decided consent resumed and
published, a held publication kept); 81 on PostgreSQL and 159 on SQLite before recovery read
by the page (each orphan's fence costs one read of its Run: a fence is decided on the Run as
stored when it is sent, not as its page read it). SQLite's 133 became 134 with issue 50's
messages: recovery asks whether a receive is the orphaned hop's Run's latest owner (a hop
that died between its receive and its park is re-parked on it), one read of the Run's
message slots on SQLite (PostgreSQL's count did not change)."""


def database_of(db_url: str) -> str:
    return "sqlite" if db_url.startswith("sqlite") else "postgresql"


@pytest.fixture
async def runs(db_url: str) -> Any:
    async with RunLedger(db_url) as ledger:
        yield Runs(ledger, db_url)


async def single_hop(ledger: RunLedger, worker: RunWorker, counted: StatementCount, n: int) -> dict[str, int]:
    mark = counted.total
    intent = RunIntent(None, f"statements-{n}", "bench", frozenset(), {"n": n})
    run_id = (await ledger.admit(intent, workflow=PIN, queue="runs", priority=50)).run.run_id
    admit, mark = counted.since(mark), counted.total
    assert await ledger.publish(run_id, 0, worker.broker)
    publish, mark = counted.since(mark), counted.total
    assert await worker.perform(run_id, 0) == "done"
    return {"admit": admit, "publish": publish, "hop": counted.since(mark)}


async def test_a_single_hop_run_sends_no_more_statements_than_when_pinned(db_url: str) -> None:
    async with RunLedger(db_url) as ledger:
        # A long watch interval: the no-op workflow ends before any watch re-reads the Run.
        worker = RunWorker(ledger, InMemoryBroker(), workflows, node="n", concurrency=1, watch_interval_s=60)
        with count_statements() as counted:
            await single_hop(ledger, worker, counted, 0)  # warm: statements prepared, tables met once
            measured = [await single_hop(ledger, worker, counted, n) for n in (1, 2)]
    assert measured[0] == measured[1], "a Run's statements are a count, the same for every Run"
    bounds = SINGLE_HOP_BOUNDS[database_of(db_url)]
    assert all(measured[0][step] <= bounds[step] for step in bounds), (measured[0], bounds)


async def test_a_single_hop_run_is_decided_ahead_from_the_machine_declarations_alone(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Run machine declares its time guards and moving fields: every decision a
    single-hop Run makes ahead (admission, publication, claim) reads its window from
    them (``decide_windowed``), never by instrumenting every comparison
    (``decide_ahead``, the reference, which costs client CPU), and still in as few
    statements as pinned."""
    from tenure.adapters.core.engine import deciders

    instrumented: list[object] = []
    reference = deciders.decide_ahead

    def counted_reference(machine: Any, record: Any, command: Any, now_us: int, **options: Any) -> Any:
        instrumented.append(command.kind)
        return reference(machine, record, command, now_us, **options)

    monkeypatch.setattr(deciders, "decide_ahead", counted_reference)
    async with RunLedger(db_url) as ledger:
        worker = RunWorker(ledger, InMemoryBroker(), workflows, node="n", concurrency=1, watch_interval_s=60)
        with count_statements() as counted:
            await single_hop(ledger, worker, counted, 0)
            measured = await single_hop(ledger, worker, counted, 1)
    assert instrumented == []
    bounds = SINGLE_HOP_BOUNDS[database_of(db_url)]
    assert all(measured[step] <= bounds[step] for step in bounds), (measured, bounds)


async def test_a_single_hop_run_on_tenures_own_queue_sends_no_more_statements_than_when_pinned(db_url: str) -> None:
    # Leases, heartbeats and polls far longer than the test: nothing but the Runs sends.
    broker = QueueBroker(db_url, queues=["runs"], lease_seconds=3600, heartbeat_seconds=600, poll_s=60)
    async with RunLedger(db_url) as ledger:
        worker = RunWorker(ledger, broker, workflows, node="n", concurrency=2, queues=["runs"], watch_interval_s=60)
        published = asyncio.Event()
        perform = worker.perform

        async def after_the_publication(run_id: str, seq: int, touch: Any = None) -> str:
            await published.wait()  # the common case: see QUEUE_BROKER_BOUNDS
            return await perform(run_id, seq, touch)

        worker.perform = after_the_publication  # type: ignore[method-assign, assignment]
        await worker.start()
        try:
            with count_statements() as counted:
                measured = [await end_to_end(ledger, worker, published, counted, n) for n in range(4)][2:]  # two warm
        finally:
            await worker.stop(30)
            await broker.close()
    assert measured[0] == measured[1], (measured, counted.profile(counted.total - measured[1]))
    bound = QUEUE_BROKER_BOUNDS[database_of(db_url)]
    assert measured[0] <= bound, (measured, bound, counted.profile(counted.total - measured[1]))


async def end_to_end(ledger: RunLedger, worker: RunWorker, published: asyncio.Event, counted: StatementCount,
                     n: int) -> int:
    """The statements of one Run from its admission until its hop task is complete."""
    mark = counted.total
    intent = RunIntent(None, f"queue-statements-{n}", "bench", frozenset(), {"n": n})
    run_id = (await ledger.admit(intent, workflow=PIN, queue="runs", priority=50)).run.run_id
    published.clear()
    assert await ledger.publish(run_id, 0, worker.broker)
    published.set()
    broker = worker.broker
    assert isinstance(broker, QueueBroker)
    # The hop is finished once the worker counted it and the serving loop completed its task.
    await until(lambda: worker.outcomes["done"] == n + 1 and not broker._served, what="the hop finished")  # noqa: SLF001
    # A connection the pool opens meanwhile (two of these steps overlapped) is checked
    # once for a pooler: the pool's growth, not the Run's.
    return sum(not text.startswith("SELECT 1 WHERE pg_backend_pid()") for text in counted.texts[mark:])


async def dead_node(runs: Runs, count: int) -> None:
    """``count`` Runs as a dead ``node-a`` leaves them, a quarter of each kind (see
    :data:`RECONCILE_BOUNDS`)."""
    ledger, broker = runs.ledger, runs.broker
    for n in range(count):
        kind = n % 4
        if kind in (0, 2):
            run_id = await runs.running(f"run-{n}")
        else:
            run_id = await runs.published(f"run-{n}")
        if kind == 1:
            del broker.jobs[hop_key(run_id, 0)]
        elif kind == 2:
            consent_id = await runs.consent(run_id)
            assert await ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent_id)
            assert await ledger.consents.decide(consent_id, ConsentStatus.GRANTED, decided_by="bob")


async def test_startup_reconciliation_sends_no_more_statements_per_run_than_when_pinned(runs: Runs) -> None:
    await dead_node(runs, 8)
    await asyncio.sleep(0.002)  # a boot cutoff strictly after every claim above (as test_recovery.py's boot)
    cutoff = dt.datetime.now(dt.timezone.utc)
    await asyncio.sleep(0.002)
    with count_statements() as counted:
        report = await runs.ledger.reconcile(RecoveryPorts(runs.broker), node="node-a", boot_cutoff=cutoff)
    assert {name: count for name, count in report.counts.items() if count} == {
        "orphans_failed": 2, "republished": 2, "resumed": 2, "published": 2}
    bound = RECONCILE_BOUNDS[database_of(runs.db_url)]
    assert counted.total <= bound, (counted.total, bound, counted.profile())


async def kept_runs(runs: Runs, start: int, count: int) -> None:
    """Runs every pass keeps or leaves without a write: published (the broker holds the
    hop), waiting on a pending consent, and running on another node with a consent of
    their own (a hop's evidence: containment and the latest owner)."""
    for n in range(start, start + count):
        await runs.published(f"queued-{n}")
        run_id = await runs.running(f"waiting-{n}")
        assert await runs.ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=await runs.consent(run_id))
        await runs.consent(await runs.running(f"elsewhere-{n}", node="node-b"))


async def statements_of_passes(runs: Runs) -> tuple[int, int]:
    """The statements of one reconciliation by ``node-a`` and one relay round, every Run
    in one page of each status group."""
    ports = RecoveryPorts(runs.broker)
    cutoff = dt.datetime.now(dt.timezone.utc)
    with count_statements() as counted:
        reconciled = await runs.ledger.reconcile(ports, node="node-a", boot_cutoff=cutoff, page_size=100)
        mark = counted.total
        relayed = await runs.ledger.relay(ports, page_size=100)
    assert not reconciled.degraded and not relayed.degraded
    assert not any(reconciled.counts.values()) and not any(relayed.counts.values()), "nothing was written"
    return mark, counted.since(mark)


async def test_a_page_of_runs_is_read_in_as_many_statements_for_two_runs_as_for_twenty(runs: Runs) -> None:
    await kept_runs(runs, 0, 2)
    with_two = await statements_of_passes(runs)
    await kept_runs(runs, 2, 18)
    with_twenty = await statements_of_passes(runs)
    assert with_two == with_twenty, "statements per page, not per Run"
