"""Runs that always finish (issue 27): the ledger's fence, not the broker's, decides
whether a hop still holds its Run; a hop's outcome settles it in one transaction
(recorded in its checkpoint instead when its settle is refused for unproven containment:
``test_run_settle_outcome.py``), retried through a database outage; a hop whose outcome
was recorded and which died is settled with that outcome at the next start; a workflow that declared its hops safe to repeat
has a lost hop run again; an operator re-admits a Run that failed ``lost``. Every test
runs on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from adapter_support import sqlite_path
from polling import until
from run_support import admit, parked_and_ended, ports, serving, status_of, worker

from tenure.adapters import InMemoryBroker, QueueBroker, RunLedger, Workflows, resume_and_publish
from tenure.adapters.runs.queue_broker import pinned_hop_queue
from tenure.adapters.runs.recovery import run_relays
from tenure.model import (
    BrokerJobState,
    ConfigValidationError,
    ConsentStatus,
    ErrorCode,
    RunStatus,
    TenureError,
    WorkflowPin,
)


@pytest.fixture
async def ledger(db_url: str) -> AsyncIterator[RunLedger]:
    async with RunLedger(db_url) as made:
        yield made


async def reconcile(ledger: RunLedger, broker: Any, node: str = "node-a") -> Any:
    return await ledger.reconcile(ports(ledger, broker), node=node, boot_cutoff=await ledger.database_now())


# --- results ----------------------------------------------------------------------------


async def test_a_workflows_result_is_kept_with_done_and_its_checkpoint_is_gone(ledger: RunLedger) -> None:
    flows, broker = Workflows(), InMemoryBroker()

    @flows.workflow("answer", "1")
    async def answer(ctx: Any) -> dict[str, Any]:
        await ctx.save({"step": 1})
        return {"answer": 42, "of": ctx.payload}

    async with serving(worker(ledger, broker, flows)):
        run_id = await admit(ledger, flows.pin("answer", "1"))
        await ledger.publish(run_id, 0, broker)
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (done.status, done.result, done.error) == (RunStatus.DONE, {"answer": 42, "of": {"n": 1}}, None)
    assert await ledger.checkpoints.load(run_id) is None


async def test_a_result_that_is_not_a_json_object_fails_the_run(ledger: RunLedger) -> None:
    flows, broker = Workflows(), InMemoryBroker()

    @flows.workflow("listy", "1")
    async def listy(ctx: Any) -> list[int]:
        return [1, 2]

    async with serving(worker(ledger, broker, flows)):
        run_id = await admit(ledger, flows.pin("listy", "1"))
        await ledger.publish(run_id, 0, broker)
        failed = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (failed.status, failed.error, failed.result) == (RunStatus.FAILED, "workflow_result_invalid", None)


# --- outcomes survive an outage ------------------------------------------------------------


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
async def test_a_settlement_that_meets_a_busy_database_is_retried_and_the_run_ends_done(db_url: str) -> None:
    """SQLite: another connection holds the write lock past the ledger's busy timeout
    while the hop records and settles its outcome (PostgreSQL: the server restart test in
    tests/processes/test_run_outage.py)."""
    flows, broker = Workflows(), InMemoryBroker()
    finish = asyncio.Event()

    @flows.workflow("answer", "1")
    async def answer(ctx: Any) -> dict[str, Any]:
        await finish.wait()
        return {"answer": 42}

    async with RunLedger(db_url, timeout_seconds=0.3) as ledger:
        runner = worker(ledger, broker, flows)
        async with serving(runner):
            run_id = await admit(ledger, flows.pin("answer", "1"))
            await ledger.publish(run_id, 0, broker)
            await status_of(ledger, run_id, RunStatus.RUNNING)
            holder = sqlite3.connect(sqlite_path(db_url), isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
            try:
                finish.set()
                await until(lambda: _true(runner.persist_retries >= 2))
            finally:
                holder.execute("ROLLBACK")
                holder.close()
            done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
        assert (done.status, done.result) == (RunStatus.DONE, {"answer": 42})
        assert runner.outcomes["done"] == 1


async def test_a_resumed_hop_whose_checkpoint_read_meets_a_database_failure_retries_it_and_ends_done(
    ledger: RunLedger,
) -> None:
    """The hop already holds its Run when it reads its checkpoint: a database failure there
    is retried (had the hop given up, the Run would stay RUNNING on a live node, which no
    relay touches)."""
    flows, broker = Workflows(), InMemoryBroker()

    @flows.workflow("ask", "1")
    async def ask(ctx: Any) -> dict[str, Any]:
        if not ctx.resumed:
            await ctx.request_consent(tool_name="mail.send", tool_call_id="call-1", payload={}, state={"asked": 1})
        return {"granted": ctx.consent.status.value, "state": ctx.state}

    load, failures = ledger.checkpoints.load, []

    async def failing_load(run_id: str) -> Any:
        if len(failures) < 2:
            failures.append(run_id)
            raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, "timeout")
        return await load(run_id)

    runner = worker(ledger, broker, flows)
    async with serving(runner):
        run_id = await admit(ledger, flows.pin("ask", "1"))
        await ledger.publish(run_id, 0, broker)
        parked = await parked_and_ended(ledger, runner, run_id, RunStatus.AWAITING_CONSENT)
        ledger.checkpoints.load = failing_load  # type: ignore[method-assign]
        assert await ledger.consents.decide(parked.owner_id, ConsentStatus.GRANTED, decided_by="ops")
        assert await resume_and_publish(ledger, broker, run_id, owner_id=parked.owner_id) == 1
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (done.status, done.result) == (RunStatus.DONE, {"granted": "granted", "state": {"asked": 1}})
    assert failures == [run_id, run_id] and runner.persist_retries == 2


async def test_a_claim_whose_commit_applied_unacknowledged_is_sent_again_and_answered(ledger: RunLedger) -> None:
    """The hop's claim is written but its acknowledgement is lost (the database failed
    after COMMIT): the worker sends the same claim again with the same claimant token,
    is answered with the claim it made, and runs the hop (had it given up, the Run would
    stay RUNNING on this live node, which no relay touches)."""
    flows, broker = Workflows(), InMemoryBroker()

    @flows.workflow("answer", "1")
    async def answer(ctx: Any) -> dict[str, Any]:
        return {"answer": 42}

    claim, sent = ledger.claim_served, []

    async def unacknowledged(run_id: str, enqueue_seq: int, **more: Any) -> Any:
        sent.append(more["claimant"])
        made = await claim(run_id, enqueue_seq, **more)
        if len(sent) == 1:
            assert made is not None  # written; the answer is what gets lost
            raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, "connection_lost")
        return made

    ledger.claim_served = unacknowledged  # type: ignore[method-assign]
    runner = worker(ledger, broker, flows)
    async with serving(runner):
        run_id = await admit(ledger, flows.pin("answer", "1"))
        await ledger.publish(run_id, 0, broker)
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (done.status, done.result) == (RunStatus.DONE, {"answer": 42})
    assert len(sent) == 2 and sent[0] == sent[1] and runner.outcomes["done"] == 1


async def _true(value: bool) -> bool:
    return value


async def test_a_hop_that_recorded_its_outcome_and_died_is_settled_with_it_at_the_next_start(
    ledger: RunLedger,
) -> None:
    broker = InMemoryBroker()
    pin = WorkflowPin("answer", "1", "sha256:" + "a" * 64)
    done_id, failed_id = await admit(ledger, pin), await admit(ledger, pin)
    for run_id in (done_id, failed_id):
        await ledger.publish(run_id, 0, broker)
        assert await ledger.claim(run_id, 0, node="node-a") is not None
    assert await ledger.checkpoints.record_outcome(done_id, 0, RunStatus.DONE, result_json='{"answer":7}')
    assert await ledger.checkpoints.record_outcome(failed_id, 0, RunStatus.FAILED, error="workflow_error:KeyError")
    # The process died here, before it settled. The next start of the same node:
    report = await reconcile(ledger, broker)
    assert (report.degraded, report.counts["outcomes_settled"], report.counts["orphans_failed"]) == (False, 2, 0)
    done, failed = await ledger.get(done_id), await ledger.get(failed_id)
    assert (done.status, done.result) == (RunStatus.DONE, {"answer": 7})  # type: ignore[union-attr]
    assert (failed.status, failed.error) == (RunStatus.FAILED, "workflow_error:KeyError")  # type: ignore[union-attr]
    assert await ledger.checkpoints.load(done_id) is None and await ledger.checkpoints.load(failed_id) is None


async def test_an_outcome_recorded_by_an_earlier_hop_is_no_evidence_for_the_current_one(ledger: RunLedger) -> None:
    broker = InMemoryBroker()
    run_id = await admit(ledger, WorkflowPin("answer", "1", "sha256:" + "a" * 64))
    await ledger.publish(run_id, 0, broker)
    assert await ledger.claim(run_id, 0, node="node-a") is not None
    assert not await ledger.checkpoints.record_outcome(run_id, 1, RunStatus.DONE)  # not this Run's hop
    report = await reconcile(ledger, broker)
    assert report.counts["orphans_failed"] == 1
    assert (await ledger.get(run_id)).error == "lost"  # type: ignore[union-attr]


# --- the ledger's fence decides, not the broker's lease -------------------------------------


def stalling_flow() -> tuple[Workflows, asyncio.Event, asyncio.Event]:
    """Workflow ``stall``: its hop freezes the whole process for 2 s (a blocking call: no
    heartbeat or touch runs), sets ``thawed``, then waits for ``finish`` and returns."""
    flows = Workflows()
    thawed, finish = asyncio.Event(), asyncio.Event()

    @flows.workflow("stall", "1")
    async def stall(ctx: Any) -> dict[str, Any]:
        time.sleep(2.0)  # frozen: nothing else in this process runs
        thawed.set()
        await finish.wait()
        return {"survived": True}

    return flows, thawed, finish


async def test_a_hop_frozen_past_its_queue_lease_keeps_its_run_and_settles_it(
    db_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """The whole process stalls (a blocking call in the workflow: no heartbeat runs) past
    the queue lease; a claim elsewhere sweeps the lapsed claim (the hop's queue row fails
    with no attempts left); the thawed hop still holds its Run in the ledger and settles it."""
    flows, thawed, finish = stalling_flow()
    hops = QueueBroker(db_url, queues=["runs"], lease_seconds=0.5, heartbeat_seconds=0.1, poll_s=0.01)
    sweeper = QueueBroker(db_url, queues=["runs"], lease_seconds=0.5, heartbeat_seconds=0.1, poll_s=0.01)
    caplog.set_level(logging.WARNING, logger="tenure.runs.queue_broker")
    try:
        async with RunLedger(db_url) as ledger, serving(worker(ledger, hops, flows)):
            run_id = await admit(ledger, flows.pin("stall", "1"))
            await ledger.publish(run_id, 0, hops)
            await asyncio.wait_for(thawed.wait(), 60)
            # A claim elsewhere sweeps the lapsed claim (the queue lets go). Repeated until
            # it has: under load the server may run the last heartbeat sent before the
            # stall late, so the lease may lapse only after the thaw (a hang guard).

            async def swept() -> bool:
                assert await sweeper._ops.claim_owned("sweeper", ["sweep-token"], lambda record: record,
                                                      [pinned_hop_queue(("stall", "1"))]) == []
                return (await hops.probe(f"run:{run_id}:0")).state is BrokerJobState.FAILED

            await until(swept, what="the lapsed hop claim swept")
            await until(lambda: _true(any("claim lapsed" in r.getMessage() for r in caplog.records)))
            finish.set()
            done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
        assert (done.status, done.result) == (RunStatus.DONE, {"survived": True})
    finally:
        await hops.close()
        await sweeper.close()


@pytest.mark.parametrize("database", ["postgresql"])
async def test_a_hop_frozen_past_its_saq_heartbeat_keeps_its_run_and_settles_it(
    db_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SAQ's counterpart: the process stalls past the hop job's SAQ heartbeat, SAQ's sweep
    aborts the job and its worker cancels the job's function; the hop still holds its
    Run in the ledger, so it goes on and settles it (the job stays aborted in SAQ)."""
    from tenure.adapters.runs import saq_broker

    monkeypatch.setattr(saq_broker, "HOP_HEARTBEAT_S", 1)  # read at publish: this hop's job only
    flows, thawed, finish = stalling_flow()
    hops = saq_broker.SaqBroker(db_url, queues=["runs"], abort_wait_s=3.0)
    await hops.connect()
    caplog.set_level(logging.WARNING, logger="tenure.runs.saq_broker")
    try:
        async with RunLedger(db_url) as ledger, serving(worker(ledger, hops, flows)):
            run_id = await admit(ledger, flows.pin("stall", "1"))
            await ledger.publish(run_id, 0, hops)
            await asyncio.wait_for(thawed.wait(), 60)
            assert await hops.queue("runs").sweep(abort=0.5) == [f"run:{run_id}:0"]  # SAQ let go
            await until(lambda: _true(any("aborted" in r.getMessage() for r in caplog.records)))
            assert (await ledger.get(run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]
            finish.set()
            done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
            assert (await hops.probe(f"run:{run_id}:0")).state is BrokerJobState.ABORTED
        assert (done.status, done.result) == (RunStatus.DONE, {"survived": True})
    finally:
        await hops.disconnect()


async def test_a_hop_claimed_from_the_queue_by_a_process_that_died_before_its_run_claim_runs_elsewhere(
    db_url: str,
) -> None:
    """A process claims a hop from the queue and dies before it claims the Run (kill -9
    between the two): the queue still calls the hop active, so the relay keeps the Run
    QUEUED. Nothing else is ever published, so only the lapsed claim itself can wake a
    live worker's claim, which sweeps it (no attempts left: the hop's queue row fails);
    the relay then rotates the delivery and the Run runs on the live worker."""
    flows = Workflows()

    @flows.workflow("quick", "1")
    async def quick(ctx: Any) -> dict[str, Any]:
        return {"ran": True}

    dead = QueueBroker(db_url, queues=["runs"], lease_seconds=0.3, heartbeat_seconds=0.1)
    live = QueueBroker(db_url, queues=["runs"], lease_seconds=5.0, heartbeat_seconds=1.0, poll_s=0.01)
    stop = asyncio.Event()
    try:
        async with RunLedger(db_url) as ledger:
            run_id = await admit(ledger, flows.pin("quick", "1"))
            await ledger.publish(run_id, 0, live)
            assert len(await dead._ops.claim_owned("dead", ["dead-token"], lambda record: record,
                                                      [pinned_hop_queue(("quick", "1"))])) == 1
            relays = asyncio.ensure_future(run_relays(ledger, ports(ledger, live), node="node-a", stop=stop,
                                                      interval_s=0.05))
            try:
                async with serving(worker(ledger, live, flows)):
                    done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
            finally:
                stop.set()
                await relays
        assert (done.status, done.result, done.enqueue_seq) == (RunStatus.DONE, {"ran": True}, 1)
    finally:
        await dead.close()
        await live.close()


# --- lost hops may run again by choice ------------------------------------------------------


async def test_a_lost_hop_of_a_workflow_that_allows_retries_runs_again_then_fails_lost_when_none_is_left(
    ledger: RunLedger,
) -> None:
    flows, broker = Workflows(), InMemoryBroker()
    runs: list[int] = []

    @flows.workflow("repeatable", "1", on_lost="retry", max_hop_retries=2)
    async def repeatable(ctx: Any) -> dict[str, Any]:
        runs.append(ctx.enqueue_seq)
        return {"hop": ctx.enqueue_seq}

    pin = flows.pin("repeatable", "1")
    assert pin.max_hop_retries == 2
    run_id = await admit(ledger, pin)
    await ledger.publish(run_id, 0, broker)
    for seq in (0, 1):  # the hop dies with its process twice
        assert await ledger.claim(run_id, seq, node="node-a") is not None
        report = await reconcile(ledger, broker)
        assert report.counts["hops_retried"] == 1 and not report.degraded
        run = await ledger.get(run_id)
        assert (run.status, run.enqueue_seq, run.hop_retries) == (RunStatus.QUEUED, seq + 1, seq + 1)  # type: ignore[union-attr]
        assert broker.jobs[f"run:{run_id}:{seq + 1}"].state is BrokerJobState.QUEUED  # published again
    assert await ledger.claim(run_id, 2, node="node-a") is not None
    report = await reconcile(ledger, broker)  # no retry left
    assert (report.counts["hops_retried"], report.counts["orphans_failed"]) == (0, 1)
    assert (await ledger.get(run_id)).error == "lost"  # type: ignore[union-attr]


async def test_a_retried_hop_runs_to_done_on_a_worker(ledger: RunLedger) -> None:
    flows, broker = Workflows(), InMemoryBroker()

    @flows.workflow("repeatable", "1", on_lost="retry")
    async def repeatable(ctx: Any) -> dict[str, Any]:
        return {"hop": ctx.enqueue_seq}

    run_id = await admit(ledger, flows.pin("repeatable", "1"))
    await ledger.publish(run_id, 0, broker)
    assert await ledger.claim(run_id, 0, node="node-a") is not None  # then the process died
    assert (await reconcile(ledger, broker)).counts["hops_retried"] == 1
    async with serving(worker(ledger, broker, flows)):
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (done.status, done.result, done.hop_retries) == (RunStatus.DONE, {"hop": 1}, 1)


def test_the_retry_policy_is_checked_where_it_is_declared() -> None:
    flows = Workflows()

    async def flow(ctx: Any) -> None:
        return None

    for bad in ({"on_lost": "maybe"}, {"on_lost": "retry", "max_hop_retries": 0},
                {"on_lost": "retry", "max_hop_retries": 101}, {"on_lost": "fail", "max_hop_retries": 2},
                {"on_lost": "retry", "max_hop_retries": True}):
        with pytest.raises(ConfigValidationError):
            flows.register("f", "1", flow, **bad)  # type: ignore[arg-type]
    assert flows.register("f", "1", flow, on_lost="retry").max_hop_retries == 3
    assert flows.register("g", "1", flow).max_hop_retries == 0


# --- an operator re-admits a lost Run --------------------------------------------------------


async def test_an_operator_readmits_a_lost_run_as_a_new_linked_run_once(ledger: RunLedger) -> None:
    broker = InMemoryBroker()
    pin = WorkflowPin("answer", "1", "sha256:" + "a" * 64)
    run_id = await admit(ledger, pin)
    await ledger.publish(run_id, 0, broker)
    assert await ledger.claim(run_id, 0, node="node-a") is not None
    await reconcile(ledger, broker)  # failed lost
    retried = await ledger.retry(run_id)
    assert retried is not None and retried.created and retried.run.retry_of == run_id
    assert (retried.run.status, retried.run.intent, retried.run.workflow) == (
        RunStatus.QUEUED, (await ledger.get(run_id)).intent, pin)  # type: ignore[union-attr]
    again = await ledger.retry(run_id)
    assert again is not None and not again.created and again.run.run_id == retried.run.run_id
    assert (await ledger.get(run_id)).status is RunStatus.FAILED  # type: ignore[union-attr]  # never revived
    with pytest.raises(ConfigValidationError) as caught:
        await ledger.retry(retried.run.run_id)  # not lost
    assert caught.value.problems == ("run_not_lost",)
    assert await ledger.retry("00000000-0000-0000-0000-000000000000") is None


# --- the step journal ---------------------------------------------------------------------


async def test_a_step_runs_once_per_run_and_a_retried_hop_replays_its_result(ledger: RunLedger) -> None:
    flows, broker = Workflows(), InMemoryBroker()
    calls: list[str] = []

    def charge(amount: int) -> dict[str, Any]:
        calls.append("charge")
        return {"charged": amount}

    async def fetch() -> list[int]:
        calls.append("fetch")
        return [1, 2, 3]

    @flows.workflow("steps", "1", on_lost="retry")
    async def steps(ctx: Any) -> dict[str, Any]:
        charged = await ctx.step("charge", charge, 5)
        fetched = await ctx.step("fetch", fetch)
        if ctx.enqueue_seq == 0:
            await asyncio.Event().wait()  # the first hop dies here, after both steps
        return {"charged": charged, "fetched": fetched}

    run_id = await admit(ledger, flows.pin("steps", "1"))
    await ledger.publish(run_id, 0, broker)
    runner = worker(ledger, broker, flows)
    async with serving(runner):
        # Both steps ran and their results are recorded (a step stopped between its call and
        # its record runs again on the retry, by design): only then does the process stop.
        await until(lambda: _recorded(ledger, run_id, {"charge": {"charged": 5}, "fetch": [1, 2, 3]}))
        assert calls == ["charge", "fetch"]
    assert (await ledger.get(run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]  # its process stopped
    assert (await reconcile(ledger, broker)).counts["hops_retried"] == 1
    async with serving(worker(ledger, broker, flows)):
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (done.status, done.result) == (RunStatus.DONE, {"charged": {"charged": 5}, "fetched": [1, 2, 3]})
    assert calls == ["charge", "fetch"]  # replayed, not run again
    assert await ledger.steps.recorded(run_id) == {"charge": {"charged": 5}, "fetch": [1, 2, 3]}


async def test_a_hop_that_lost_its_run_records_no_step_and_runs_none(ledger: RunLedger) -> None:
    broker = InMemoryBroker()
    run_id = await admit(ledger, WorkflowPin("answer", "1", "sha256:" + "a" * 64))
    await ledger.publish(run_id, 0, broker)
    assert await ledger.claim(run_id, 0, node="node-a") is not None
    assert await ledger.steps.record(run_id, 0, "first", {"n": 1}) == (True, {"n": 1})
    assert await ledger.steps.record(run_id, 0, "first", {"n": 2}) == (True, {"n": 1})  # the first record wins
    assert await ledger.begin_cancel(run_id) is not None  # the hop no longer holds the Run
    assert await ledger.steps.record(run_id, 0, "second", {"n": 3}) == (False, None)
    assert not await ledger.steps.holds(run_id, 0)
    assert await ledger.steps.recorded(run_id) == {"first": {"n": 1}}
    for bad in ({"name": ""}, {"result": (1, 2)}, {"result": float("nan")}):
        arguments: dict[str, Any] = {"name": "x", "result": 1, **bad}
        with pytest.raises(ConfigValidationError):
            await ledger.steps.record(run_id, 0, arguments["name"], arguments["result"])


async def _recorded(ledger: RunLedger, run_id: str, wanted: dict[str, Any]) -> bool:
    return await ledger.steps.recorded(run_id) == wanted
