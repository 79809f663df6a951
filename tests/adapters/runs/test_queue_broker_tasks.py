"""QueueBroker on ``tenure_tasks``: hops are tasks of their own queue, ordered by the Run's
priority, replay-safe under their key, and a database holding an earlier version's hops
in ``tenure_run_hops`` keeps working: queued hops are adopted and run, a hop claimed by
an earlier process is finished by that process's fence, and one whose lease ran out is
settled, on both databases."""

from __future__ import annotations

import asyncio
import logging
import datetime as dt
from typing import Any

import pytest

from adapter_support import raw, stored_instant
from polling import until
from run_support import admit, serving, status_of, worker

from tenure.adapters import QueueBroker, RunLedger, Workflows
from tenure.adapters.queue.operations import QueueOperations
from tenure.adapters.queue.sources import time_ordered_id
from tenure.adapters.queue.table import HOPS_BINDING
from tenure.adapters.runs.broker import UNSERVED_OUTCOME
from tenure.adapters.runs.queue_broker import HOP_CONTRACT, HOP_QUEUE, HOP_TASK, PRIORITY_EPOCH, pinned_hop_queue
from tenure.adapters.wiring.dialects import open_store
from tenure.model import (
    BrokerJobState,
    ConfigValidationError,
    JobStatus,
    QueueClaimFence,
    QueueKind,
    RunStatus,
    ValidationJob,
    WorkerConfig,
    hop_key,
    snapshot_submission,
)

RUN_A, RUN_B, RUN_C, RUN_D = ("a" * 32, "b" * 32, "c" * 32, "d" * 32)


def legacy_operations(db_url: str, lease_seconds: float) -> QueueOperations:
    """What an earlier version's QueueBroker wrote with: the validation queue's shape in
    ``tenure_run_hops``."""
    config = WorkerConfig(db_url, lease_seconds=lease_seconds, heartbeat_seconds=lease_seconds / 5, max_attempts=1)
    return QueueOperations(open_store(db_url, timeout_seconds=10), QueueKind.VALIDATION, config,
                           new_job_id=time_ordered_id, binding=HOPS_BINDING)


def legacy_leases_run_out(db_url: str) -> None:
    """Every claim in ``tenure_run_hops`` ran out an hour ago (the process that held them died)."""
    hour_ago_us = int((dt.datetime.now(dt.timezone.utc).timestamp() - 3600) * 1_000_000)
    raw(db_url, "UPDATE tenure_run_hops SET lease_expires_at = ? WHERE lease_expires_at IS NOT NULL",
        (stored_instant(db_url, hour_ago_us),))


async def legacy_publish(ops: QueueOperations, key: str, queue: str, wire_priority: int) -> None:
    job = ValidationJob(HOP_CONTRACT, queue, key, fires_at=PRIORITY_EPOCH + dt.timedelta(seconds=wire_priority),
                        max_attempts=1)
    await ops.submit_owned(snapshot_submission(QueueKind.VALIDATION, job, key))


async def serve_until(broker: QueueBroker, ran: list[tuple[str, int]], count: int, *, outcome: str = "done",
                      serves: list[tuple[str, str]] | None = None) -> None:
    stopping = asyncio.Event()

    async def perform(run_id: str, seq: int, _: Any) -> str:
        ran.append((run_id, seq))
        return outcome

    serving = asyncio.create_task(broker.serve(frozenset({"runs"}), perform, concurrency=1, stopping=stopping,
                                               serves=None if serves is None else lambda: serves))
    try:
        await until(lambda: _at_least(ran, count))
    finally:
        stopping.set()
        await serving


async def _at_least(ran: list[Any], count: int) -> bool:
    return len(ran) >= count


async def test_hops_are_tasks_of_their_own_queue_claimed_by_run_priority(db_url: str) -> None:
    broker = QueueBroker(db_url, queues=["runs"], lease_seconds=1.0, heartbeat_seconds=0.2, poll_s=0.01)
    try:
        await broker.publish(hop_key(RUN_A, 0), queue="runs", wire_priority=80)  # a low Run priority
        await broker.publish(hop_key(RUN_B, 0), queue="runs", wire_priority=10)  # a high one
        await broker.publish(hop_key(RUN_B, 0), queue="runs", wire_priority=10)  # a replay: nothing changes
        probe = await broker.probe(hop_key(RUN_A, 0))
        assert (probe.state, probe.queue, probe.wire_priority) == (BrokerJobState.QUEUED, "runs", 80)
        tasks = await broker._ops.list(None, 10)  # noqa: SLF001
        assert [(t.queue_name, t.task_name, t.priority) for t in tasks] == [(HOP_QUEUE, HOP_TASK, 20),
                                                                            (HOP_QUEUE, HOP_TASK, 90)]
        ran: list[tuple[str, int]] = []
        await serve_until(broker, ran, 2)
        assert ran == [(RUN_B, 0), (RUN_A, 0)]
        assert (await broker.probe(hop_key(RUN_B, 0))).state is BrokerJobState.COMPLETE
    finally:
        await broker.close()


async def test_a_pinned_hop_waits_in_its_pins_queue_for_a_loop_that_serves_the_pin(db_url: str) -> None:
    """A hop published with its Run's pin is claimed only by a loop that serves the pin
    (a loop serving another takes the hops published after it); a hop published without
    one by any loop; a pinned replay of a key an earlier version published without a pin
    answers that hop as it is."""
    broker = QueueBroker(db_url, queues=["runs"], lease_seconds=60.0, heartbeat_seconds=10.0, poll_s=0.01)
    v1, v2 = ("bill", "1"), ("bill", "2")
    try:
        await broker.publish_pinned(hop_key(RUN_A, 0), queue="runs", wire_priority=50, workflow=v2)
        await broker.publish(hop_key(RUN_B, 0), queue="runs", wire_priority=50)  # no pin (an earlier version)
        await broker.publish_pinned(hop_key(RUN_C, 0), queue="runs", wire_priority=50, workflow=v1)
        await broker.publish_pinned(hop_key(RUN_A, 0), queue="runs", wire_priority=50, workflow=v2)  # a replay
        await broker.publish_pinned(hop_key(RUN_B, 0), queue="runs", wire_priority=50, workflow=v2)  # its first form
        tasks = {t.submission_id: t for t in await broker._ops.list(None, 10)}  # noqa: SLF001
        assert {key: (t.queue_name, t.task_name) for key, t in tasks.items()} == {
            hop_key(RUN_A, 0): (pinned_hop_queue(v2), HOP_TASK), hop_key(RUN_B, 0): (HOP_QUEUE, HOP_TASK),
            hop_key(RUN_C, 0): (pinned_hop_queue(v1), HOP_TASK)}
        assert len({HOP_QUEUE, pinned_hop_queue(v1), pinned_hop_queue(v2), pinned_hop_queue(("bill1", ""))}) == 4
        ran: list[tuple[str, int]] = []
        await serve_until(broker, ran, 2, serves=[v1, ("audit", "1")])
        assert ran == [(RUN_B, 0), (RUN_C, 0)]  # RUN_A was due first
        probe = await broker.probe(hop_key(RUN_A, 0))
        assert probe.state is BrokerJobState.QUEUED and (await broker._ops.list(JobStatus.PENDING, 10))[0].generation == 0  # noqa: SLF001
        await serve_until(broker, ran, 3, serves=[v2])
        assert ran[2:] == [(RUN_A, 0)]
        for bad in (("bill",), ("bill", ""), ["bill", "2"], ("bill", 2), ("b" * 101, "1")):
            with pytest.raises(ConfigValidationError) as refused:
                await broker.publish_pinned(hop_key(RUN_D, 0), queue="runs", wire_priority=50, workflow=bad)  # type: ignore[arg-type]
            assert refused.value.fields == ("workflow",)
        assert await broker.probe(hop_key(RUN_D, 0)) == await broker.probe(hop_key("e" * 32, 0))  # nothing written
    finally:
        await broker.close()


async def test_an_earlier_versions_queued_hop_whose_key_was_published_pinned_here_is_adopted_as_that_hop(
    db_url: str,
) -> None:
    """An old row still queued in ``tenure_run_hops`` whose key a relay of this version
    already published here, pinned: adopting it cancels the old row and keeps the pinned
    hop (its unpinned submission would be refused as a different one, and would stop every
    adoption after it); a loop serving the pin runs it once."""
    legacy = legacy_operations(db_url, 3600.0)
    broker = QueueBroker(db_url, queues=["runs"], lease_seconds=60.0, heartbeat_seconds=10.0, poll_s=0.01)
    try:
        await legacy_publish(legacy, hop_key(RUN_A, 0), "runs", 50)
        await legacy_publish(legacy, hop_key(RUN_B, 0), "runs", 50)
        await broker.publish_pinned(hop_key(RUN_A, 0), queue="runs", wire_priority=50, workflow=("bill", "2"))
        assert await broker._adopt_legacy_hops() == 2  # noqa: SLF001
        assert {row.submission_id: row.status for row in await legacy.list(None, 10)} == {
            hop_key(RUN_A, 0): JobStatus.CANCELLED, hop_key(RUN_B, 0): JobStatus.CANCELLED}
        tasks = {t.submission_id: t.queue_name for t in await broker._ops.list(None, 10)}  # noqa: SLF001
        assert tasks == {hop_key(RUN_A, 0): pinned_hop_queue(("bill", "2")), hop_key(RUN_B, 0): HOP_QUEUE}
        ran: list[tuple[str, int]] = []
        await serve_until(broker, ran, 2, serves=[("bill", "2")])
        assert sorted(ran) == [(RUN_A, 0), (RUN_B, 0)]
    finally:
        await broker.close()


async def test_a_loop_told_to_serve_something_that_is_not_a_pin_is_refused_before_it_serves(db_url: str) -> None:
    broker = QueueBroker(db_url, queues=["runs"], lease_seconds=60.0, heartbeat_seconds=10.0, poll_s=0.01)
    try:
        for bad in ([("bill",)], [("bill", "")], [("bill", 2)]):
            with pytest.raises(ConfigValidationError) as refused:
                await broker.serve(frozenset({"runs"}), _never, concurrency=1, stopping=asyncio.Event(),
                                   serves=lambda bad=bad: bad)  # type: ignore[misc]
            assert refused.value.fields == ("workflow",)
    finally:
        await broker.close()


async def _never(run_id: str, seq: int, _: Any) -> str:
    raise AssertionError("nothing is served")


async def test_a_hop_published_without_a_pin_is_handed_back_by_a_worker_that_does_not_serve_its_run(
    db_url: str,
) -> None:
    """A hop an earlier version published without its Run's pin reaches every worker: one
    that does not serve the Run's pin hands it back with its attempt returned (twice, the
    Run untouched), and a worker that serves it runs it."""
    old_flows, new_flows = Workflows(), Workflows()

    @old_flows.workflow("bill", "1")
    async def bill_v1(ctx: Any) -> dict[str, Any]:
        raise AssertionError("a version 1 worker must not run a version 2 Run")

    @new_flows.workflow("bill", "2")
    async def bill_v2(ctx: Any) -> dict[str, Any]:
        return {"version": 2}

    broker = QueueBroker(db_url, queues=["runs"], lease_seconds=60.0, heartbeat_seconds=10.0, poll_s=0.01)
    try:
        async with RunLedger(db_url) as ledger:
            run_id = await admit(ledger, new_flows.pin("bill", "2"))
            queued = await ledger.get(run_id)
            await broker.publish(hop_key(run_id, 0), queue="runs", wire_priority=50)
            async with serving(worker(ledger, broker, old_flows)) as old:
                await until(lambda: _true(old.outcomes["unserved"] >= 2), what="two hand-backs")
            assert await ledger.get(run_id) == queued
            (row,) = await broker._ops.list(None, 10)  # noqa: SLF001
            assert (row.queue_name, row.status, row.attempts, row.generation >= 2) == (HOP_QUEUE, JobStatus.PENDING,
                                                                                      0, True)
            async with serving(worker(ledger, broker, new_flows)):
                done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
            assert (done.status, done.result) == (RunStatus.DONE, {"version": 2})
            assert old.outcomes["done"] == 0 and old.outcomes["failed"] == 0
    finally:
        await broker.close()


async def _true(value: bool) -> bool:
    return value


async def test_an_earlier_versions_hops_keep_working(db_url: str) -> None:
    # An hour's lease, moved back below: the claims must still be live when probed (a
    # lease of a second could run out first on a loaded machine).
    legacy = legacy_operations(db_url, 3600.0)
    broker = QueueBroker(db_url, queues=["runs"], lease_seconds=1.0, heartbeat_seconds=0.2, poll_s=0.01)
    try:
        # An earlier version left two queued hops and two claimed by a process that died
        # (their lease runs out below).
        for run_id, wire in ((RUN_A, 70), (RUN_B, 5), (RUN_C, 50), (RUN_D, 50)):
            await legacy_publish(legacy, hop_key(run_id, 0), "runs", wire)
        claims = await legacy.claim_owned("old-process", ["t-1", "t-2"], lambda record: record)
        assert sorted(c.submission_id for c in claims) == sorted([hop_key(RUN_B, 0), hop_key(RUN_C, 0)])
        # The new broker reads them where they are before adopting anything.
        probe = await broker.probe(hop_key(RUN_A, 0))
        assert (probe.state, probe.queue, probe.wire_priority) == (BrokerJobState.QUEUED, "runs", 70)
        assert (await broker.probe(hop_key(RUN_B, 0))).state is BrokerJobState.ACTIVE
        legacy_leases_run_out(db_url)  # the dead process's leases run out
        ran: list[tuple[str, int]] = []
        await serve_until(broker, ran, 2)
        # The queued hops were adopted and ran here, in Run priority order (RUN_D, then RUN_A).
        assert ran == [(RUN_D, 0), (RUN_A, 0)]
        for run_id in (RUN_A, RUN_D):
            assert (await broker.probe(hop_key(run_id, 0))).state is BrokerJobState.COMPLETE
        old_rows = {row.submission_id: row for row in await legacy.list(None, 10)}
        assert old_rows[hop_key(RUN_A, 0)].status is JobStatus.CANCELLED  # moved, not run twice
        # The expired claims were settled where they were (one attempt: failed), so recovery
        # reads what happened to them.
        for run_id in (RUN_B, RUN_C):
            assert old_rows[hop_key(run_id, 0)].status is JobStatus.FAILED
            assert (await broker.probe(hop_key(run_id, 0))).state is BrokerJobState.FAILED
        # Publishing an adopted key again is an exact replay.
        await broker.publish(hop_key(RUN_A, 0), queue="runs", wire_priority=70)
        assert (await broker.probe(hop_key(RUN_A, 0))).state is BrokerJobState.COMPLETE
    finally:
        await broker.close()
        await legacy.store.close()


async def test_a_hop_an_earlier_process_holds_is_finished_by_its_fence(db_url: str) -> None:
    legacy = legacy_operations(db_url, 30.0)
    broker = QueueBroker(db_url, queues=["runs"], lease_seconds=30.0, heartbeat_seconds=5.0, poll_s=0.01)
    try:
        await legacy_publish(legacy, hop_key(RUN_A, 0), "runs", 50)
        await broker.publish(hop_key(RUN_B, 0), queue="runs", wire_priority=50)
        (claimed,) = await legacy.claim_owned("old-process", ["t-1"], lambda record: record)
        ran: list[tuple[str, int]] = []
        await serve_until(broker, ran, 1)
        assert ran == [(RUN_B, 0)]  # the held hop is not adopted
        assert (await broker.probe(hop_key(RUN_A, 0))).state is BrokerJobState.ACTIVE
        fence = QueueClaimFence(QueueKind.VALIDATION, claimed.job_id, "old-process", claimed.generation, "t-1")
        assert await legacy.complete_owned([(fence, None)]) == [True]
        assert (await broker.probe(hop_key(RUN_A, 0))).state is BrokerJobState.COMPLETE
    finally:
        await broker.close()
        await legacy.store.close()


async def _listening_backends(db_url: str) -> list[int]:
    import asyncpg

    connection = await asyncpg.connect(db_url)
    try:
        rows = await connection.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                      "AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()")
        return [row["pid"] for row in rows]
    finally:
        await connection.close()


async def _terminate(db_url: str, pid: int) -> None:
    import asyncpg

    connection = await asyncpg.connect(db_url)
    try:
        assert await connection.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await connection.close()


@pytest.mark.parametrize("database", ["postgresql"])
async def test_a_serving_loop_whose_listen_connection_was_cut_listens_again_logs_it_and_hears_new_hops(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The fallback poll is a minute, the longest allowed: the new listener must exist
    # without the loop having to wake by itself, and the hop is published by another
    # broker (another process's publish wakes this loop only through the listener).
    broker = QueueBroker(db_url, queues=["runs"], lease_seconds=600.0, heartbeat_seconds=60.0, poll_s=60)
    publisher = QueueBroker(db_url, queues=["runs"], lease_seconds=600.0, heartbeat_seconds=60.0, poll_s=60)
    stopping = asyncio.Event()
    ran: list[tuple[str, int]] = []

    async def perform(run_id: str, seq: int, _: Any) -> None:
        ran.append((run_id, seq))

    async def listening_on_another_connection() -> list[int]:
        return [pid for pid in await _listening_backends(db_url) if pid != first]

    async def hop_ran() -> bool:
        return bool(ran)

    try:
        with caplog.at_level(logging.INFO, logger="tenure.runs.queue_broker"):
            serving = asyncio.create_task(broker.serve(frozenset({"runs"}), perform, concurrency=1,
                                                       stopping=stopping))
            [first] = await until(lambda: _listening_backends(db_url), 60)
            await _terminate(db_url, first)
            await until(listening_on_another_connection, 60)
            await publisher.publish(hop_key(RUN_A, 0), queue="runs", wire_priority=10)
            # Well inside the minute's poll: only the listener can have woken the loop.
            await until(hop_ran, 30)
        assert ran == [(RUN_A, 0)]
        lines = [record.getMessage() for record in caplog.records]
        assert any("lost its connection" in line for line in lines)
        assert any("listens again" in line for line in lines)
    finally:
        stopping.set()
        await serving
        await broker.close()
        await publisher.close()


async def test_a_hop_published_while_a_claim_runs_is_claimed_without_waiting_for_the_poll(db_url: str) -> None:
    # A poll longer than the hang guard below: only the announcement can start the second hop.
    broker = QueueBroker(db_url, queues=["runs"], lease_seconds=3600, heartbeat_seconds=600, poll_s=60)
    claim_owned = broker._ops.claim_owned  # noqa: SLF001
    calls = 0

    async def claim_then_publish(*args: Any, **kwargs: Any) -> Any:
        # The first claim took what was due; a hop published before it returns is
        # announced while it runs, and must not be forgotten when it returns.
        nonlocal calls
        calls += 1
        claimed = await claim_owned(*args, **kwargs)
        if calls == 1:
            await broker.publish(hop_key(RUN_B, 0), queue="runs", wire_priority=50)
        return claimed

    broker._ops.claim_owned = claim_then_publish  # type: ignore[method-assign]  # noqa: SLF001
    stopping = asyncio.Event()
    ran: list[tuple[str, int]] = []

    async def perform(run_id: str, seq: int, _: Any) -> None:
        ran.append((run_id, seq))

    try:
        await broker.publish(hop_key(RUN_A, 0), queue="runs", wire_priority=50)
        serving = asyncio.create_task(broker.serve(frozenset({"runs"}), perform, concurrency=2, stopping=stopping))
        try:
            await until(lambda: _at_least(ran, 2), timeout_s=30, what="the second hop ran before the poll")
        finally:
            stopping.set()
            await serving
        assert ran == [(RUN_A, 0), (RUN_B, 0)]
    finally:
        await broker.close()
