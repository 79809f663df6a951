"""SaqBroker on a real PostgreSQL with SAQ: the Broker port's contract (idempotent publish
by key, probes mapped onto the port's states with start time, queue and priority, exact
aborts), SAQ's priority order, and the Run ledger and recovery working through it."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Any

import pytest
from adapter_support import raw
from run_support import Runs
from saq.job import Status

from tenure.adapters import RecoveryPorts, RunLedger
from tenure.adapters.runs import saq_broker
from tenure.adapters.runs.saq_broker import HOP_FUNCTION, HOP_HEARTBEAT_S, SaqBroker, state_of
from tenure.model import (
    BrokerJobState,
    ConfigValidationError,
    DeliveryState,
    ErrorCode,
    RunStatus,
    TenureError,
    hop_key,
)

pytestmark = pytest.mark.parametrize("database", ["postgresql"])


def key() -> str:
    return hop_key(str(uuid.uuid4()), 0)


@pytest.fixture
async def broker(db_url: str) -> Any:
    async with SaqBroker(db_url, queues=["runs", "gpu"], abort_wait_s=0.5) as made:
        yield made


async def test_publish_is_idempotent_by_key_and_never_resurrects_a_finished_hop(broker: SaqBroker) -> None:
    hop = key()
    await broker.publish(hop, queue="runs", wire_priority=50)
    await broker.publish(hop, queue="runs", wire_priority=50)
    probe = await broker.probe(hop)
    assert (probe.state, probe.queue, probe.wire_priority, probe.started_at) == (BrokerJobState.QUEUED, "runs", 50, None)
    job = await broker.queue("runs").job(hop)
    assert (job.function, job.retries, job.timeout, job.heartbeat) == (HOP_FUNCTION, 0, 0, HOP_HEARTBEAT_S)
    assert job.kwargs == {"run_id": hop.split(":")[1], "enqueue_seq": 0}
    await broker.queue("runs").finish(job, Status.COMPLETE)
    await asyncio.sleep(1.1)  # SAQ would re-queue a finished key enqueued in a later second
    await broker.publish(hop, queue="runs", wire_priority=50)
    assert (await broker.probe(hop)).state is BrokerJobState.COMPLETE
    assert (await broker.probe(key())).state is BrokerJobState.ABSENT


async def test_saq_dequeues_the_lowest_wire_priority_first_and_probes_report_its_start(broker: SaqBroker) -> None:
    hops = {priority: key() for priority in (50, 10, 90)}
    for priority, hop in hops.items():
        await broker.publish(hop, queue="runs", wire_priority=priority)
    queue = broker.queue("runs")
    taken = [(await queue.dequeue(timeout=60)).key for _ in hops]
    assert taken == [hops[10], hops[50], hops[90]]
    probe = await broker.probe(hops[10])
    assert probe.state is BrokerJobState.ACTIVE and probe.started_at is not None
    assert abs((dt.datetime.now(dt.timezone.utc) - probe.started_at).total_seconds()) < 60


async def test_abort_stops_a_queued_job_at_once_and_answers_false_while_an_active_one_runs_on(
    broker: SaqBroker,
) -> None:
    queued, active = key(), key()
    await broker.publish(queued, queue="gpu", wire_priority=1)
    assert await broker.abort(queued) is True
    assert (await broker.probe(queued)).state is BrokerJobState.ABORTED
    await broker.publish(active, queue="runs", wire_priority=1)
    assert (await broker.queue("runs").dequeue(timeout=60)).key == active
    # Nobody runs the job's worker loop here, so nothing acknowledges the abort: it stays
    # aborting, which the port reports as live.
    assert await broker.abort(active) is False
    assert (await broker.probe(active)).state is BrokerJobState.ACTIVE
    assert await broker.abort(key()) is True  # nothing held: nothing live
    # A dead process's hop: startup's terminal fence finishes it without an acknowledgement.
    assert await broker.abort(active, terminal=True) is True
    assert (await broker.probe(active)).state is BrokerJobState.ABORTED
    assert [state_of(status) for status in Status] == [
        BrokerJobState.QUEUED, BrokerJobState.QUEUED, BrokerJobState.ACTIVE, BrokerJobState.ACTIVE,
        BrokerJobState.ABORTED, BrokerJobState.FAILED, BrokerJobState.COMPLETE,
    ]


async def test_an_abort_that_meets_a_job_finished_since_it_was_read_leaves_it_finished(broker: SaqBroker) -> None:
    """The race a loaded machine widens: the abort reads the job active, its hop ends and
    SAQ finishes the job, then the abort marks it. SAQ's own abort marked it aborting, with
    no worker left to acknowledge: live for two minutes (until SAQ's sweep), so a Run's
    cancellation could not prove its hop stopped. tenure's marks only a job still live."""
    hop = key()
    await broker.publish(hop, queue="runs", wire_priority=1)
    queue = broker.queue("runs")
    assert (await queue.dequeue(timeout=60)).key == hop
    stale = await queue.job(hop)  # read while active
    assert stale.status == Status.ACTIVE
    await queue.finish(await queue.job(hop), Status.COMPLETE)  # the hop ended meanwhile
    await saq_broker._abort_live(stale, "fenced by tenure")  # noqa: SLF001
    assert (await broker.probe(hop)).state is BrokerJobState.COMPLETE
    # Through the port: a job read live and finished before the mark answers True.
    other = key()
    await broker.publish(other, queue="runs", wire_priority=1)
    assert (await queue.dequeue(timeout=60)).key == other
    found, read = broker._find, []  # noqa: SLF001

    async def stale_first(hop_key: str) -> Any:
        job = await found(hop_key)
        if not read:
            read.append(job)
            await queue.finish(await queue.job(hop_key), Status.COMPLETE)
        return job

    broker._find = stale_first  # type: ignore[method-assign]  # noqa: SLF001
    assert await broker.abort(other) is True
    assert (await broker.probe(other)).state is BrokerJobState.COMPLETE


async def test_the_ledger_publishes_through_saq_and_recovery_repairs_what_saq_lost_or_finished(
    db_url: str, broker: SaqBroker,
) -> None:
    async with RunLedger(db_url) as ledger:
        runs = Runs(ledger, db_url)
        lost = (await runs.admit("lost", queue="runs")).run.run_id
        assert await ledger.publish(lost, 0, broker)
        finished = (await runs.admit("finished", queue="runs", priority=70)).run.run_id
        assert await ledger.publish(finished, 0, broker)
        assert (await broker.probe(hop_key(finished, 0))).wire_priority == 30
        raw(db_url, "DELETE FROM saq_jobs WHERE key = ?", (hop_key(lost, 0),))
        job = await broker.queue("runs").job(hop_key(finished, 0))
        await broker.queue("runs").finish(job, Status.FAILED, error="worker gave up")
        elsewhere = (await runs.admit("elsewhere", queue="cpu")).run.run_id
        with pytest.raises(TenureError) as caught:
            await ledger.publish(elsewhere, 0, broker)  # a queue this broker does not serve
        assert caught.value.code is ErrorCode.RUN_BROKER_FAILED
        report = await ledger.reconcile(RecoveryPorts(broker, known_queues=frozenset({"runs", "gpu"})),
                                        node="node-a", boot_cutoff=dt.datetime.now(dt.timezone.utc))
        assert {(issue.run_id, issue.reason) for issue in report.issues} == {(elsewhere, "queue_unknown")}
        assert {name: n for name, n in report.counts.items() if n} == {"republished": 1, "rotated": 1,
                                                                     "published": 1}
        assert (await broker.probe(hop_key(lost, 0))).state is BrokerJobState.QUEUED
        assert (await ledger.get(finished)).enqueue_seq == 1  # type: ignore[union-attr]
        rotated = await broker.probe(hop_key(finished, 1))
        assert (rotated.state, rotated.wire_priority) == (BrokerJobState.QUEUED, 30)
        delivery = await ledger.get_delivery(finished, 1)
        assert delivery is not None and delivery.state is DeliveryState.PUBLISHED
        assert (await ledger.get(lost)).status is RunStatus.QUEUED  # type: ignore[union-attr]


@pytest.mark.parametrize("arguments", [
    ("sqlite:///x.db", {"queues": ["runs"]}),
    ("postgresql://h/db", {"queues": []}),
    ("postgresql://h/db", {"queues": "runs"}),
    ("postgresql://h/db", {"queues": ["runs", "runs"]}),
    ("postgresql://h/db", {"queues": ["runs"], "min_size": 0}),
    ("postgresql://h/db", {"queues": ["runs"], "abort_wait_s": -1}),
])
def test_a_saq_broker_refuses_bad_settings(arguments: tuple[str, dict[str, Any]], database: str) -> None:
    dsn, options = arguments
    with pytest.raises(ConfigValidationError):
        SaqBroker(dsn, **options)


def test_a_saq_broker_behind_a_transaction_pooler_is_refused_with_its_reason(database: str) -> None:
    """SAQ needs session-level advisory locks and LISTEN: PgBouncer's transaction mode
    (tenure's ``pooler=transaction``) is refused before anything connects."""
    with pytest.raises(ConfigValidationError) as refused:
        SaqBroker("postgresql://app@pgbouncer:6432/db?sslmode=disable&pooler=transaction", queues=["runs"])
    assert refused.value.problems == ("saq_needs_session_pooling",)


async def test_a_bad_key_or_priority_is_refused_before_saq_is_asked(broker: SaqBroker) -> None:
    for hop, priority in (("job-7", 5), (key(), 101), (key(), True)):
        with pytest.raises(ConfigValidationError):
            await broker.publish(hop, queue="runs", wire_priority=priority)  # type: ignore[arg-type]


async def test_reconcile_fences_this_nodes_dead_hop_terminally_and_another_nodes_only_by_asking(
    db_url: str, broker: SaqBroker,
) -> None:
    async with RunLedger(db_url) as ledger:
        runs = Runs(ledger, db_url)
        hops = {}
        for name, node in (("orphan", "node-a"), ("elsewhere", "node-b")):
            run_id = (await runs.admit(name, queue="runs")).run.run_id
            assert await ledger.publish(run_id, 0, broker)
            assert (await broker.queue("runs").dequeue(timeout=60)).key == hop_key(run_id, 0)  # a worker took it
            assert await ledger.claim(run_id, 0, node=node) is not None
            hops[name] = run_id
        assert await ledger.begin_cancel(hops["elsewhere"]) is not None  # node-b's hop is still live
        await asyncio.sleep(0.01)
        report = await ledger.reconcile(RecoveryPorts(broker), node="node-a",
                                        boot_cutoff=dt.datetime.now(dt.timezone.utc))
        orphan = await ledger.get(hops["orphan"])
        assert orphan is not None and (orphan.status, orphan.error) == (RunStatus.FAILED, "lost")
        assert (await broker.probe(hop_key(hops["orphan"], 0))).state is BrokerJobState.ABORTED
        # The other node's worker is asked to stop (aborting), and nobody here pretends it did.
        elsewhere = await ledger.get(hops["elsewhere"])
        assert elsewhere is not None and elsewhere.status is RunStatus.CANCELLING
        assert (await broker.queue("runs").job(hop_key(hops["elsewhere"], 0))).status is Status.ABORTING
        assert {(issue.run_id, issue.reason) for issue in report.issues} == {(hops["elsewhere"], "containment_unproven")}
        assert report.counts["orphans_failed"] == 1


async def cancelled_mid_publish(broker: SaqBroker, monkeypatch: pytest.MonkeyPatch) -> tuple[str, asyncio.Task[None]]:
    """Publish a hop whose enqueue stores the job but never answers (a lost
    acknowledgement), and cancel the publish once the job is stored: the hop key and the
    cancelled publish, still to be awaited."""
    monkeypatch.setattr(saq_broker, "ENQUEUE_SETTLE_S", 0.2)
    queue = broker.queue("runs")
    real_enqueue = queue.enqueue
    stored = asyncio.Event()

    async def acknowledgement_lost(*args: Any, **kwargs: Any) -> Any:
        await real_enqueue(*args, **kwargs)
        stored.set()
        await asyncio.sleep(3600)  # the answer never arrives

    monkeypatch.setattr(queue, "enqueue", acknowledgement_lost)
    hop = key()
    publishing = asyncio.create_task(broker.publish(hop, queue="runs", wire_priority=50))
    await asyncio.wait_for(stored.wait(), 60)
    publishing.cancel()
    return hop, publishing


async def test_a_publish_cancelled_in_flight_fences_its_exact_job_before_the_cancellation_propagates(
    broker: SaqBroker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    hop, publishing = await cancelled_mid_publish(broker, monkeypatch)
    with pytest.raises(asyncio.CancelledError):
        await publishing
    assert (await broker.probe(hop)).state is BrokerJobState.ABORTED  # nobody recorded it: fenced


async def test_a_cancelled_publish_whose_fence_keeps_failing_says_so_after_three_aborts(
    broker: SaqBroker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    aborts: list[str] = []

    async def refused(hop: str, *, terminal: bool = False) -> bool:
        aborts.append(hop)
        return False

    monkeypatch.setattr(broker, "abort", refused)
    hop, publishing = await cancelled_mid_publish(broker, monkeypatch)
    with pytest.raises(saq_broker.BrokerFenceFailed):
        await publishing
    assert aborts == [hop] * saq_broker.PUBLISH_FENCE_TRIES
    assert (await broker.probe(hop)).state is BrokerJobState.QUEUED  # not misreported as contained


async def test_a_running_hop_refreshes_its_saq_heartbeat(broker: SaqBroker, db_url: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tenure.adapters import RunWorker, Workflows
    from tenure.adapters.runs import worker as run_worker
    from tenure.model import RunIntent

    monkeypatch.setattr(run_worker, "TOUCH_EVERY_S", 0.1)
    touched: list[int] = []
    flows = Workflows()

    @flows.workflow("slow", "1")
    async def slow(ctx: Any) -> None:
        for _ in range(8):
            job = await broker.queue("runs").job(hop_key(ctx.run_id, 0))
            touched.append(job.touched)
            await asyncio.sleep(0.1)

    async with RunLedger(db_url) as ledger:
        admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=flows.pin("slow", "1"),
                                       queue="runs", priority=50)
        assert await ledger.publish(admission.run.run_id, 0, broker)
        runner = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)
        await runner.start()
        try:
            for _ in range(300):
                if runner.outcomes["done"]:
                    break
                await asyncio.sleep(0.02)
        finally:
            await runner.stop(5)
    assert runner.outcomes["done"] == 1
    assert len(set(touched)) >= 3  # SAQ's touched time moved while the hop ran
