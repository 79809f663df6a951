"""The Run worker and lifespan end to end: hops delivered by a broker (in memory on both
databases, SAQ on a real PostgreSQL), claimed in the ledger, run by a registered
workflow, parked on an owner, resumed by its verdict and settled; duplicate and stale
deliveries skipped; priority order; relay recovery of a failed publish; cancellation
of a running hop with an acknowledged and with a failed abort; the lifespan's startup
and shutdown order."""

from __future__ import annotations

import asyncio
import logging
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
from polling import until
from run_support import parked_and_ended, result_of, status_of

from tenure.adapters import (
    InMemoryBroker,
    QueueBroker,
    RunLedger,
    RunRuntime,
    RunWorker,
    SaqBroker,
    ShutdownIncomplete,
    StartupDegraded,
    Workflows,
    resume_and_publish,
)
from tenure.adapters.runs.broker import BrokerUnavailable
from tenure.model import (
    AgentJobStatus,
    BrokerJobState,
    ConfigValidationError,
    ConsentStatus,
    DeliveryState,
    ErrorCode,
    RunIntent,
    RunStatus,
    TenureError,
    WorkflowPin,
    hop_key,
)

pytestmark = pytest.mark.parametrize(
    ("database", "broker_kind"),
    [("sqlite", "memory"), ("sqlite", "queue"), ("postgresql", "memory"), ("postgresql", "queue"),
     ("postgresql", "saq")])

WATCH_S = 0.05


@dataclasses.dataclass
class Faulty:
    """A broker (and hop source) in front of another, refusing the next ``fail_publishes``
    publishes and answering the next ``fail_aborts`` aborts False without aborting."""

    inner: Any
    fail_publishes: int = 0
    fail_aborts: int = 0

    async def publish(self, key: str, *, queue: str, wire_priority: int) -> None:
        if self.fail_publishes > 0:
            self.fail_publishes -= 1
            raise BrokerUnavailable("publish refused")
        await self.inner.publish(key, queue=queue, wire_priority=wire_priority)

    async def probe(self, key: str) -> Any:
        return await self.inner.probe(key)

    async def abort(self, key: str, *, terminal: bool = False) -> bool:
        if self.fail_aborts > 0:
            self.fail_aborts -= 1
            return False
        return bool(await self.inner.abort(key, terminal=terminal))

    async def serve(self, *args: Any, **kwargs: Any) -> None:
        await self.inner.serve(*args, **kwargs)

    async def connect(self) -> None:
        if hasattr(self.inner, "connect"):
            await self.inner.connect()

    async def disconnect(self) -> None:
        if hasattr(self.inner, "disconnect"):
            await self.inner.disconnect()


@pytest.fixture
async def ledger(db_url: str) -> AsyncIterator[RunLedger]:
    async with RunLedger(db_url) as made:
        yield made


@pytest.fixture
async def broker(broker_kind: str, db_url: str) -> AsyncIterator[Faulty]:
    if broker_kind == "memory":
        yield Faulty(InMemoryBroker())
        return
    if broker_kind == "queue":
        hops = QueueBroker(db_url, queues=["runs"], lease_seconds=1.0, heartbeat_seconds=0.2, poll_s=0.01)
        try:
            yield Faulty(hops)
        finally:
            await hops.close()
        return
    made = SaqBroker(db_url, queues=["runs"], abort_wait_s=3.0)
    await made.connect()
    try:
        yield Faulty(made)
    finally:
        await made.disconnect()


async def admit(ledger: RunLedger, pin: WorkflowPin, payload: Any = None, *, priority: int = 50) -> str:
    admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), payload if payload is not None else {}),
                                   workflow=pin, queue="runs", priority=priority)
    return admission.run.run_id


def worker(ledger: RunLedger, broker: Any, flows: Workflows, **more: Any) -> RunWorker:
    return RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=WATCH_S, **more)


def noop_flows() -> Workflows:
    """A registry with one workflow, ``noop`` revision 1, that returns at once."""
    flows = Workflows()

    @flows.workflow("noop", "1")
    async def noop(ctx: Any) -> None:
        return None

    return flows


# --- the two-hop workflow ----------------------------------------------------------------


def consent_flow(seen: list[Any]) -> tuple[Workflows, WorkflowPin]:
    flows = Workflows()

    @flows.workflow("send-report", "1")
    async def send_report(ctx: Any) -> None:
        if not ctx.resumed:
            seen.append(("first", ctx.enqueue_seq))
            await ctx.request_consent(tool_name="email", tool_call_id="call-1", payload={"to": ctx.payload["to"]},
                                      state={"drafted": True})
        seen.append(("resumed", ctx.enqueue_seq, ctx.state, ctx.consent.status))
        if ctx.consent.status is not ConsentStatus.GRANTED:
            raise PermissionError()

    return flows, flows.pin("send-report", "1")


async def test_a_run_parks_on_consent_and_its_resumed_hop_finishes_it(ledger: RunLedger, broker: Faulty) -> None:
    seen: list[Any] = []
    flows, pin = consent_flow(seen)
    runner = worker(ledger, broker, flows)
    await runner.start()
    try:
        run_id = await admit(ledger, pin, {"to": "ops"})
        assert await ledger.publish(run_id, 0, broker)
        parked = await parked_and_ended(ledger, runner, run_id, RunStatus.AWAITING_CONSENT)
        checkpoint = await ledger.checkpoints.load(run_id)
        assert checkpoint is not None and (checkpoint.owner_id, checkpoint.state) == (parked.owner_id, {"drafted": True})
        assert await resume_and_publish(ledger, broker, run_id, owner_id=parked.owner_id) is None  # not decided yet
        assert await ledger.consents.decide(parked.owner_id, ConsentStatus.GRANTED, decided_by="bob")
        assert await resume_and_publish(ledger, broker, run_id, owner_id=parked.owner_id) == 1
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
        assert done.status is RunStatus.DONE
        assert seen == [("first", 0), ("resumed", 1, {"drafted": True}, ConsentStatus.GRANTED)]
        # The worker deletes the terminal Run's snapshot just after its settle.
        await until(lambda: _true(runner.outcomes["done"] == 1))
        assert await ledger.checkpoints.load(run_id) is None
        assert (await until(lambda: broker.probe(hop_key(run_id, 1)))).state in (
            BrokerJobState.ACTIVE, BrokerJobState.COMPLETE)
        assert (runner.outcomes["parked"], runner.outcomes["done"]) == (1, 1)
    finally:
        await runner.stop(5)


async def test_a_hop_whose_park_commits_before_it_hears_back_is_counted_parked_not_lost(
    ledger: RunLedger, broker: Faulty, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The park commits, then its answer is slow to come back (a loaded machine): the
    worker's watch reads the Run as AWAITING_CONSENT meanwhile. That Run was parked by
    this very hop, so the hop must not be cancelled as lost (it was, once, under load)."""
    seen: list[Any] = []
    flows, pin = consent_flow(seen)
    original = RunLedger.park
    committed = asyncio.Event()

    async def park_then_stall(self: RunLedger, *args: Any, **kwargs: Any) -> bool:
        parked = await original(self, *args, **kwargs)
        committed.set()
        await asyncio.sleep(WATCH_S * 10)  # several watch rounds see the parked Run
        return parked

    monkeypatch.setattr(RunLedger, "park", park_then_stall)
    runner = worker(ledger, broker, flows)
    await runner.start()
    try:
        run_id = await admit(ledger, pin, {"to": "ops"})
        assert await ledger.publish(run_id, 0, broker)
        await asyncio.wait_for(committed.wait(), 60)
        await status_of(ledger, run_id, RunStatus.AWAITING_CONSENT)
        await until(lambda: _true(runner.outcomes["parked"] + runner.outcomes["lost"] == 1))
        assert (runner.outcomes["parked"], runner.outcomes["lost"]) == (1, 0)
    finally:
        await runner.stop(5)


async def test_a_watch_read_under_way_while_the_hop_parks_does_not_count_the_hop_lost(
    ledger: RunLedger, broker: Faulty, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch checked that the hop had not parked and began to read the Run; the hop
    parked (its commit) before that read's answer came back (a loaded machine: found by
    ``TENURE_TEST_STRESS=1``). The read shows the Run parked by this very hop, which is
    no lost hop. Deterministic: the watch's read is held until the park committed."""
    from tenure.adapters.runs.checkpoints import Checkpoints

    flows, pin = consent_flow([])
    hold_next_read, reading, committed, answered = [False], asyncio.Event(), asyncio.Event(), asyncio.Event()
    original_save, original_park, original_get = Checkpoints.save, RunLedger.park, RunLedger.get

    async def save_then_wait_for_a_read(self: Checkpoints, *args: Any, **kwargs: Any) -> bool:
        saved = await original_save(self, *args, **kwargs)
        if kwargs.get("owner_kind") is not None:  # the park's checkpoint: the park comes next
            hold_next_read[0] = True
            await asyncio.wait_for(reading.wait(), 60)  # the watch is inside a read, the hop not parked yet
        return saved

    async def held_get(self: RunLedger, run_id: str) -> Any:
        task = asyncio.current_task()
        watching = task is not None and task.get_coro().__qualname__ == "RunWorker._watch"  # type: ignore[union-attr]
        if hold_next_read[0] and watching:
            hold_next_read[0] = False
            reading.set()
            await asyncio.wait_for(committed.wait(), 60)  # the answer comes back after the park's commit
            run = await original_get(self, run_id)
            answered.set()
            return run
        return await original_get(self, run_id)

    async def park_and_say_so(self: RunLedger, *args: Any, **kwargs: Any) -> bool:
        parked = await original_park(self, *args, **kwargs)
        committed.set()
        await asyncio.wait_for(answered.wait(), 60)
        await asyncio.sleep(WATCH_S * 10)  # the park's own answer comes back later still
        return parked

    monkeypatch.setattr(Checkpoints, "save", save_then_wait_for_a_read)
    monkeypatch.setattr(RunLedger, "get", held_get)
    monkeypatch.setattr(RunLedger, "park", park_and_say_so)
    runner = worker(ledger, broker, flows)
    await runner.start()
    try:
        run_id = await admit(ledger, pin, {"to": "ops"})
        assert await ledger.publish(run_id, 0, broker)
        await status_of(ledger, run_id, RunStatus.AWAITING_CONSENT)
        await until(lambda: _true(runner.outcomes["parked"] + runner.outcomes["lost"] == 1))
        assert (runner.outcomes["parked"], runner.outcomes["lost"]) == (1, 0)
    finally:
        await runner.stop(5)


async def test_a_denied_consent_fails_the_run_with_the_exception_type_only(ledger: RunLedger, broker: Faulty) -> None:
    flows, pin = consent_flow([])
    runner = worker(ledger, broker, flows)
    await runner.start()
    try:
        run_id = await admit(ledger, pin, {"to": "ops"})
        await ledger.publish(run_id, 0, broker)
        parked = await status_of(ledger, run_id, RunStatus.AWAITING_CONSENT)
        await ledger.consents.decide(parked.owner_id, ConsentStatus.DENIED, decided_by="bob")
        await resume_and_publish(ledger, broker, run_id, owner_id=parked.owner_id)
        failed = await status_of(ledger, run_id, RunStatus.FAILED)
        assert failed.error == "workflow_error:PermissionError"
    finally:
        await runner.stop(5)


async def test_duplicate_and_stale_deliveries_are_skipped(ledger: RunLedger, broker: Faulty) -> None:
    calls: list[int] = []
    flows = Workflows()

    @flows.workflow("count", "1")
    async def count(ctx: Any) -> None:
        calls.append(ctx.enqueue_seq)

    run_id = await admit(ledger, flows.pin("count", "1"))
    runner = worker(ledger, broker, flows)
    assert await runner.perform(run_id, 1) == "skipped"  # a sequence that was never published
    assert await runner.perform(run_id, 0) == "done"
    assert await runner.perform(run_id, 0) == "skipped"  # the same hop delivered twice
    assert calls == [0] and runner.outcomes["skipped"] == 2


async def test_a_changed_workflow_fails_the_run_and_an_unserved_version_is_left_for_a_worker_that_serves_it(
    ledger: RunLedger, broker: Faulty,
) -> None:
    flows = Workflows()

    @flows.workflow("count", "1")
    async def count(ctx: Any) -> None:
        raise AssertionError("must not run")

    # Same name and version, other code: the work changed under its version (fails closed).
    changed = await admit(ledger, WorkflowPin("count", "1", "sha256:" + "0" * 64))
    runner = worker(ledger, broker, flows)
    assert await runner.perform(changed, 0) == "failed"
    assert (await ledger.get(changed)).error == "workflow_unavailable"  # type: ignore[union-attr]
    # A name or version this worker does not serve (a rolling deploy): not claimed, nothing spent.
    for pin in (WorkflowPin("other", "1", "sha256:" + "0" * 64), WorkflowPin("count", "2", "sha256:" + "0" * 64)):
        unserved = await admit(ledger, pin)
        before = await ledger.get(unserved)
        assert await runner.perform(unserved, 0) == "unserved"
        after = await ledger.get(unserved)
        assert after == before and after is not None and after.status is RunStatus.QUEUED
        others = Workflows()
        others.register(pin.name, pin.revision, _returns_done, digest=pin.digest)
        assert await worker(ledger, broker, others).perform(unserved, 0) == "done"
        assert (await ledger.get(unserved)).status is RunStatus.DONE  # type: ignore[union-attr]
    assert runner.outcomes["unserved"] == 2 and runner.outcomes["failed"] == 1


async def _returns_done(ctx: Any) -> None:
    return None


async def test_the_broker_delivers_higher_priorities_first(ledger: RunLedger, broker: Faulty) -> None:
    order: list[int] = []
    flows = Workflows()

    @flows.workflow("note", "1")
    async def note(ctx: Any) -> None:
        order.append(ctx.payload["priority"])

    pin = flows.pin("note", "1")
    run_ids = []
    for priority in (10, 90, 50):
        run_id = await admit(ledger, pin, {"priority": priority}, priority=priority)
        await ledger.publish(run_id, 0, broker)
        run_ids.append(run_id)
    runner = worker(ledger, broker, flows, concurrency=1)
    await runner.start()
    try:
        for run_id in run_ids:
            await status_of(ledger, run_id, RunStatus.DONE)
    finally:
        await runner.stop(5)
    assert order == [90, 50, 10]


async def test_a_paused_claim_gate_holds_delivered_hops_until_resumed(ledger: RunLedger, broker: Faulty) -> None:
    flows = noop_flows()

    runner = worker(ledger, broker, flows)
    runner.pause()
    await runner.start()
    try:
        run_id = await admit(ledger, flows.pin("noop", "1"))
        await ledger.publish(run_id, 0, broker)
        await until(lambda: _active(broker, run_id))
        await asyncio.sleep(0.3)
        assert (await ledger.get(run_id)).status is RunStatus.QUEUED  # type: ignore[union-attr]
        runner.resume()
        await status_of(ledger, run_id, RunStatus.DONE)
    finally:
        await runner.stop(5)


async def _active(broker: Faulty, run_id: str) -> bool:
    return (await broker.probe(hop_key(run_id, 0))).state is BrokerJobState.ACTIVE


async def test_a_failed_publish_is_recovered_by_the_relay_under_the_same_key(ledger: RunLedger, broker: Faulty) -> None:
    flows = noop_flows()

    run_id = await admit(ledger, flows.pin("noop", "1"))
    broker.fail_publishes = 1
    with pytest.raises(TenureError) as caught:
        await ledger.publish(run_id, 0, broker)
    assert caught.value.code is ErrorCode.RUN_BROKER_FAILED
    assert (await broker.probe(hop_key(run_id, 0))).state is BrokerJobState.ABSENT
    runtime = RunRuntime(ledger, brokers=[broker], workers=[worker(ledger, broker, flows)], node="node-a",
                         relay_interval_s=0.05, shutdown_deadline_s=10)
    async with runtime:
        await status_of(ledger, run_id, RunStatus.DONE)
    delivery = await ledger.get_delivery(run_id, 0)
    assert delivery is not None and delivery.state is DeliveryState.SETTLED and delivery.publish_attempts >= 2


# --- cancellation ------------------------------------------------------------------------------


def blocking_flow(started: asyncio.Event, cancelled: list[bool]) -> tuple[Workflows, WorkflowPin]:
    flows = Workflows()

    @flows.workflow("block", "1")
    async def block(ctx: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    return flows, flows.pin("block", "1")


async def test_cancelling_a_running_hop_aborts_it_and_reaches_cancelled(ledger: RunLedger, broker: Faulty) -> None:
    started, cancelled = asyncio.Event(), []  # type: ignore[var-annotated]
    flows, pin = blocking_flow(started, cancelled)
    runner = worker(ledger, broker, flows)
    await runner.start()
    try:
        run_id = await admit(ledger, pin)
        await ledger.publish(run_id, 0, broker)
        await asyncio.wait_for(started.wait(), 60)
        ticket = await ledger.begin_cancel(run_id)
        assert ticket is not None and ticket.enqueue_seq == 0
        assert await until(lambda: _finish(ledger, run_id, broker))
        assert (await ledger.get(run_id)).status is RunStatus.CANCELLED  # type: ignore[union-attr]
        assert cancelled == [True]
        assert (await broker.probe(hop_key(run_id, 0))).state not in (BrokerJobState.QUEUED, BrokerJobState.ACTIVE)
        assert runner.outcomes["done"] == runner.outcomes["failed"] == 0
        # An operator's cancel is never counted as a lost hop.
        assert await until(lambda: _true(runner.outcomes["cancelled"] == 1))
        assert runner.outcomes["lost"] == 0
    finally:
        await runner.stop(5)


async def _finish(ledger: RunLedger, run_id: str, broker: Any) -> bool:
    try:
        return await ledger.finish_cancel(run_id, 0, broker)
    except TenureError as error:
        assert error.code is ErrorCode.RUN_CONTAINMENT_UNPROVEN
        return False


async def test_a_failed_abort_leaves_the_run_cancelling_until_a_later_fence(ledger: RunLedger, broker: Faulty) -> None:
    started, cancelled = asyncio.Event(), []  # type: ignore[var-annotated]
    flows, pin = blocking_flow(started, cancelled)
    runner = worker(ledger, broker, flows)
    await runner.start()
    try:
        run_id = await admit(ledger, pin)
        await ledger.publish(run_id, 0, broker)
        await asyncio.wait_for(started.wait(), 60)
        assert await ledger.begin_cancel(run_id) is not None
        broker.fail_aborts = 1
        first = await _finish(ledger, run_id, broker)
        # The hop itself saw CANCELLING and stopped its workflow without settling.
        await until(lambda: _true(bool(cancelled)))
        if not first:
            assert (await ledger.get(run_id)).status is RunStatus.CANCELLING  # type: ignore[union-attr]
        assert await until(lambda: _finish(ledger, run_id, broker)) or first
        assert (await ledger.get(run_id)).status is RunStatus.CANCELLED  # type: ignore[union-attr]
        assert runner.outcomes["failed"] == 0
    finally:
        await runner.stop(5)


async def _true(value: bool) -> bool:
    return value


# --- the other waits ---------------------------------------------------------------------------


async def test_a_delegated_job_parks_the_run_and_its_adopted_result_resumes_it(ledger: RunLedger, broker: Faulty) -> None:
    seen: list[Any] = []
    flows = Workflows()

    @flows.workflow("delegate", "1")
    async def delegate(ctx: Any) -> None:
        if not ctx.resumed:
            await ctx.delegate(request_id=f"req-{ctx.run_id}", runtime="agents", profile="small",
                               request={"task": "summarise"}, state={"asked": 1})
        seen.append((ctx.job.status, ctx.state))

    runner = worker(ledger, broker, flows)
    await runner.start()
    try:
        run_id = await admit(ledger, flows.pin("delegate", "1"))
        await ledger.publish(run_id, 0, broker)
        parked = await parked_and_ended(ledger, runner, run_id, RunStatus.AWAITING_DELEGATE)
        assert await ledger.jobs.adopt_result(parked.owner_id, result_of(parked.owner_id, AgentJobStatus.SUCCEEDED))
        assert await resume_and_publish(ledger, broker, run_id, owner_id=parked.owner_id) == 1
        await status_of(ledger, run_id, RunStatus.DONE)
        assert seen == [(AgentJobStatus.SUCCEEDED, {"asked": 1})]
    finally:
        await runner.stop(5)


async def test_a_hardware_wait_returns_to_running_in_the_same_hop(ledger: RunLedger, broker: Faulty) -> None:
    polls: list[str] = []
    flows = Workflows()

    @flows.workflow("gpu", "1")
    async def gpu(ctx: Any) -> None:
        async def ready() -> bool:
            polls.append((await ledger.get(ctx.run_id)).status.value)  # type: ignore[union-attr]
            return len(polls) >= 3
        assert await ctx.wait_for_hardware(ready, state={"phase": "load"}, poll_s=0.01)
        polls.append((await ledger.get(ctx.run_id)).status.value)  # type: ignore[union-attr]

    runner = worker(ledger, broker, flows)
    run_id = await admit(ledger, flows.pin("gpu", "1"))
    assert await runner.perform(run_id, 0) == "done"
    assert polls == ["awaiting_hardware"] * 3 + ["running"]


# --- the lifespan ------------------------------------------------------------------------------


async def test_shutdown_with_a_stuck_workflow_raises_and_leaves_the_brokers_connected(
    ledger: RunLedger, broker: Faulty,
) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    flows = Workflows()

    @flows.workflow("stuck", "1")
    async def stuck(ctx: Any) -> None:
        started.set()
        while not release.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue  # ignores cancellation: a stuck hop

    runner = worker(ledger, broker, flows)
    runtime = RunRuntime(ledger, brokers=[broker], workers=[runner], node="node-a", shutdown_deadline_s=0.5)
    disconnected: list[bool] = []
    original = broker.disconnect

    async def tracked() -> None:
        disconnected.append(True)
        await original()

    broker.disconnect = tracked  # type: ignore[method-assign]
    try:
        with pytest.raises(ShutdownIncomplete) as caught:
            async with runtime:
                run_id = await admit(ledger, flows.pin("stuck", "1"))
                await ledger.publish(run_id, 0, broker)
                await asyncio.wait_for(started.wait(), 60)
        assert caught.value.live_tasks >= 1 and disconnected == []
        assert runner.running_hops == 1
        assert (await broker.probe(hop_key(run_id, 0))).state is BrokerJobState.ACTIVE  # still connected, still live
    finally:
        release.set()
    await runner.stop(5)  # once the workflow ends, the stop is proved
    assert runner.running_hops == 0


async def test_startup_reconciles_before_workers_start_and_a_degraded_start_is_refused_on_postgresql(
    ledger: RunLedger, broker: Faulty, database: str,
) -> None:
    flows = noop_flows()

    run_id = await admit(ledger, flows.pin("noop", "1"))
    await ledger.publish(run_id, 0, broker)
    # A hop claimed by this node before the boot: an orphan startup fails as lost.
    assert await ledger.claim(run_id, 0, node="node-a") is not None
    stranded = await admit(ledger, flows.pin("noop", "1"))
    await ledger.publish(stranded, 0, broker)
    runner = worker(ledger, broker, flows)
    async with RunRuntime(ledger, brokers=[broker], workers=[runner], node="node-a", shutdown_deadline_s=10) as runtime:
        assert runtime.startup is not None and not runtime.startup.degraded
        assert runtime.startup.counts["orphans_failed"] == 1
        await status_of(ledger, stranded, RunStatus.DONE)
    assert (await ledger.get(run_id)).status is RunStatus.FAILED  # type: ignore[union-attr]
    # A queue nobody serves makes recovery degraded: refused on PostgreSQL, reported on SQLite.
    other = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=flows.pin("noop", "1"),
                               queue="elsewhere", priority=50)
    await ledger.publish(other.run.run_id, 0, InMemoryBroker())
    runtime = RunRuntime(ledger, brokers=[broker], workers=[worker(ledger, broker, flows)], node="node-a",
                         shutdown_deadline_s=10)
    if database == "postgresql":
        with pytest.raises(StartupDegraded) as caught:
            async with runtime:
                raise AssertionError("must not start")
        assert caught.value.report.degraded
    else:
        async with runtime:
            assert runtime.startup is not None and runtime.startup.degraded


async def test_a_reconciliation_that_left_an_orphan_unproven_is_repeated_until_it_is_complete(
    ledger: RunLedger, broker: Faulty,
) -> None:
    """A boot's reconciliation meets an orphan (a hop this node claimed before the boot)
    whose fence fails, so it is left RUNNING and the pass is degraded. The relays never
    visit a hop: unless the lease keeper reconciles again, the Run would stay RUNNING on
    this live node until its next boot. Once the broker answers, the repeat fails it
    ``lost``."""
    flows = noop_flows()
    run_id = await admit(ledger, flows.pin("noop", "1"))
    await ledger.publish(run_id, 0, broker)
    assert await ledger.claim(run_id, 0, node="node-a") is not None  # claimed before the boot
    broker.fail_aborts = 10**6  # every fence of the orphan's job fails: it stays live
    runtime = RunRuntime(ledger, brokers=[broker], workers=[worker(ledger, broker, flows)], node="node-a",
                         shutdown_deadline_s=10, require_clean=False, relay_interval_s=0.05, node_lease_s=5)
    async with runtime:
        assert runtime.startup is not None and runtime.startup.unproven
        assert (await ledger.get(run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]
        broker.fail_aborts = 0
        failed = await status_of(ledger, run_id, RunStatus.FAILED)
        assert failed.error == "lost" and runtime.reboots == 0


async def test_bad_configuration_is_refused(ledger: RunLedger, broker: Faulty) -> None:
    flows = Workflows()
    with pytest.raises(ConfigValidationError):
        flows.register("x", "1", lambda ctx: None)  # type: ignore[arg-type,return-value]

    async def fn(ctx: Any) -> None:
        return None

    flows.register("x", "1", fn)
    with pytest.raises(ConfigValidationError):
        flows.register("x", "1", fn)
    with pytest.raises(ConfigValidationError):
        flows.pin("x", "2")
    for bad in ({"node": ""}, {"concurrency": 0}, {"queues": "runs"}, {"watch_interval_s": 0}):
        with pytest.raises(ConfigValidationError):
            RunWorker(ledger, broker, flows, **{"node": "n", **bad})  # type: ignore[arg-type]
    with pytest.raises(ConfigValidationError):
        RunRuntime(ledger, brokers=[], workers=[], node="n")
    with pytest.raises(ConfigValidationError):
        await RunWorker(ledger, _NoSource(), flows, node="n").start()  # type: ignore[arg-type]


class _NoSource:
    async def publish(self, key: str, *, queue: str, wire_priority: int) -> None: ...
    async def probe(self, key: str) -> Any: ...
    async def abort(self, key: str, *, terminal: bool = False) -> bool: return True


async def test_a_service_call_parks_the_run_runs_the_attempt_and_the_terminal_attempt_resumes_it(
    ledger: RunLedger, broker: Faulty,
) -> None:
    from attempt_fakes import FakeProvider, spec

    from tenure.adapters import AttemptRunner
    from tenure.model import AttemptState

    provider = FakeProvider("replay")
    attempts = AttemptRunner(ledger.attempts, provider, poll_interval_s=0)
    seen: list[Any] = []
    statuses: list[RunStatus] = []
    flows = Workflows()

    @flows.workflow("render", "1")
    async def render(ctx: Any) -> None:
        if not ctx.resumed:
            await ctx.call_service(attempts, spec(owner=f"render-{ctx.run_id}", run_id=ctx.run_id),
                                   state={"asked": "thumbnail"})
        seen.append((ctx.attempt.state, ctx.state))

    runner = worker(ledger, broker, flows)
    original = provider.poll

    async def poll(provider_job_id: str) -> Any:
        statuses.append((await ledger.get(run_id)).status)  # type: ignore[union-attr]
        return await original(provider_job_id)

    provider.poll = poll  # type: ignore[method-assign]
    await runner.start()
    try:
        run_id = await admit(ledger, flows.pin("render", "1"))
        await ledger.publish(run_id, 0, broker)
        await status_of(ledger, run_id, RunStatus.DONE)
        assert seen == [(AttemptState.SUCCEEDED, {"asked": "thumbnail"})]
        assert statuses and set(statuses) == {RunStatus.AWAITING_SERVICE}  # the attempt ran while parked
        assert sum(provider.effects.values()) == 1
    finally:
        await runner.stop(5)


async def test_a_service_call_for_another_run_is_refused(ledger: RunLedger, broker: Faulty) -> None:
    from attempt_fakes import FakeProvider, spec

    from tenure.adapters import AttemptRunner

    attempts = AttemptRunner(ledger.attempts, FakeProvider("replay"), poll_interval_s=0)
    flows = Workflows()
    refused: list[str] = []

    @flows.workflow("render", "1")
    async def render(ctx: Any) -> None:
        try:
            await ctx.call_service(attempts, spec(run_id="another-run"), state={})
        except ConfigValidationError as error:
            refused.append(error.problems[0])
            raise

    run_id = await admit(ledger, flows.pin("render", "1"))
    assert await worker(ledger, broker, flows).perform(run_id, 0) == "failed"
    assert refused == ["attempt_of_this_run_required"]
    assert (await ledger.get(run_id)).error == (  # type: ignore[union-attr]
        "workflow_error:ConfigValidationError: config: invalid_workflow: spec (attempt_of_this_run_required)")



# --- failures you can debug ----------------------------------------------------------------

def raising_flow(message: str) -> tuple[Workflows, WorkflowPin]:
    flows = Workflows()

    @flows.workflow("explode", "1")
    async def explode(ctx: Any) -> None:
        raise ValueError(message)

    return flows, flows.pin("explode", "1")


async def test_a_raising_workflow_stores_its_exception_type_and_cleaned_message_and_logs_an_error(
    ledger: RunLedger, broker: Faulty, caplog: pytest.LogCaptureFixture
) -> None:
    flows, pin = raising_flow("row <7> missing\x00\x1b[31m" + "x" * 5000)
    run_id = await admit(ledger, pin)
    with caplog.at_level("INFO", logger="tenure.runs.worker"):
        assert await worker(ledger, broker, flows).perform(run_id, 0) == "failed"
    error = (await ledger.get(run_id)).error  # type: ignore[union-attr]
    assert error is not None and error.startswith("workflow_error:ValueError: row <7> missing\ufffd\ufffd[31mxxx")
    assert len(error.encode()) <= 2048 and error.endswith("\u2026")  # bounded, the cut marked
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.exc_info is not None and record.exc_info[0].__name__ == "ValueError"  # the traceback is logged
    logged = logging.Formatter().format(record)
    assert "in explode" in logged and "ValueError: row <7> missing\ufffd\ufffd[31mxxx" in logged  # frames, cleaned text
    assert "\x00" not in logged and "\x1b" not in logged and "x" * 2100 not in logged  # as bounded as stored
    fields = {name: getattr(record, name) for name in ("run_id", "workflow", "seq", "node", "outcome")}
    assert fields == {"run_id": run_id, "workflow": "explode", "seq": 0, "node": "node-a", "outcome": "failed"}
    assert run_id in record.getMessage() and "explode" in record.getMessage()


async def test_store_error_text_false_keeps_only_the_exception_type_in_the_store_and_the_log(
    ledger: RunLedger, broker: Faulty, caplog: pytest.LogCaptureFixture
) -> None:
    flows, pin = raising_flow("card 4111-1111-1111-1111 declined")
    run_id = await admit(ledger, pin)
    with caplog.at_level("INFO", logger="tenure.runs.worker"):
        assert await worker(ledger, broker, flows, store_error_text=False).perform(run_id, 0) == "failed"
    assert (await ledger.get(run_id)).error == "workflow_error:ValueError"  # type: ignore[union-attr]
    # What must not be stored is not logged either; the frames stay to debug with.
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    logged = logging.Formatter().format(record)
    assert "in explode" in logged and "4111" not in logged


async def test_store_error_text_must_be_a_bool(ledger: RunLedger, broker: Faulty) -> None:
    with pytest.raises(ConfigValidationError) as refused:
        worker(ledger, broker, noop_flows(), store_error_text="no")
    assert refused.value.fields == ("store_error_text",)
