"""Leaving a RunRuntime (what ``tenure runs worker`` does on SIGTERM) keeps the outcome of
a workflow that already returned (issue 47, item 2): the hop's outcome write is not
cancelled with the hops still running user code; the runtime waits for it, within its
shutdown deadline, and the Run ends DONE with its result. The next start of the node
finds nothing to repair: the Run is neither failed ``lost`` nor run a second time. Every
test runs on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from polling import until
from run_support import parked_and_ended

from tenure.adapters import InMemoryBroker, RunLedger, RunRuntime, RunWorker, Workflows, resume_and_publish
from tenure.model import ConsentStatus, ErrorCode, RunIntent, RunStatus, TenureError


@pytest.fixture
async def ledger(db_url: str) -> AsyncIterator[RunLedger]:
    async with RunLedger(db_url) as made:
        yield made


def runtime(ledger: RunLedger, broker: Any, runner: RunWorker, **options: Any) -> RunRuntime:
    return RunRuntime(ledger, brokers=[broker], workers=[runner], node="node-a", relay_interval_s=0.1,
                      node_lease_s=5, require_clean=False, **options)


async def admit(ledger: RunLedger, flows: Workflows, name: str) -> str:
    admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=flows.pin(name, "1"),
                                   queue="runs", priority=50)
    return admission.run.run_id


def stop_while_recording(ledger: RunLedger, runner: RunWorker, *, failures: int = 0) -> asyncio.Event:
    """Hold the hop's outcome write (its settle with the outcome, one transaction) until
    the worker is stopping (so the stop meets the write in flight: a deterministic hook,
    not a sleep), failing its first ``failures`` tries with a database failure; returns
    the event set when the write began."""
    record, recording = ledger.engine.settle, asyncio.Event()
    failed: list[int] = []

    async def held(*args: Any, **kwargs: Any) -> bool:
        recording.set()
        await until(lambda: runner.stopping, what="the worker to stop")
        if len(failed) < failures:
            failed.append(1)
            raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, "connection_refused")
        return await record(*args, **kwargs)

    ledger.engine.settle = held  # type: ignore[method-assign]
    return recording


@pytest.mark.parametrize("failures", [0, 2])
async def test_a_workflow_that_returned_as_the_runtime_stops_ends_done_and_the_next_start_repairs_nothing(
    ledger: RunLedger, failures: int,
) -> None:
    flows, broker, calls = Workflows(), InMemoryBroker(), []

    @flows.workflow("answer", "1")
    async def answer(ctx: Any) -> dict[str, Any]:
        calls.append(ctx.enqueue_seq)
        return {"answer": 42}

    runner = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)
    recording = stop_while_recording(ledger, runner, failures=failures)
    async with runtime(ledger, broker, runner):
        run_id = await admit(ledger, flows, "answer")
        await ledger.publish(run_id, 0, broker)
        await asyncio.wait_for(recording.wait(), 60)  # the workflow returned; its outcome is being written
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.result) == (RunStatus.DONE, {"answer": 42})
    assert runner.outcomes["done"] == 1 and runner.persist_retries == failures
    async with runtime(ledger, broker, RunWorker(ledger, broker, flows, node="node-a")) as again:
        assert again.startup is not None
        counts = again.startup.counts
        assert (counts["orphans_failed"], counts["orphans_parked"], counts["hops_retried"]) == (0, 0, 0)
    assert calls == [0] and (await ledger.get(run_id)).status is RunStatus.DONE  # type: ignore[union-attr]


async def test_a_resumed_hop_that_returned_as_the_runtime_stops_is_not_parked_on_its_consent_and_run_again(
    ledger: RunLedger,
) -> None:
    flows, broker, calls = Workflows(), InMemoryBroker(), []

    @flows.workflow("ask", "1")
    async def ask(ctx: Any) -> dict[str, Any]:
        calls.append(ctx.enqueue_seq)
        if not ctx.resumed:
            await ctx.request_consent(tool_name="mail.send", tool_call_id="call-1", payload={}, state={"n": 1})
        return {"granted": ctx.consent.status.value}

    runner = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)
    async with runtime(ledger, broker, runner):
        run_id = await admit(ledger, flows, "ask")
        await ledger.publish(run_id, 0, broker)
        parked = await parked_and_ended(ledger, runner, run_id, RunStatus.AWAITING_CONSENT)
        recording = stop_while_recording(ledger, runner)
        assert await ledger.consents.decide(parked.owner_id, ConsentStatus.GRANTED, decided_by="ops")
        await resume_and_publish(ledger, broker, run_id, owner_id=parked.owner_id)
        await asyncio.wait_for(recording.wait(), 60)
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.result) == (RunStatus.DONE, {"granted": "granted"})
    second = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)
    async with runtime(ledger, broker, second) as again:
        assert again.startup is not None
        counts = again.startup.counts
        assert (counts["orphans_failed"], counts["orphans_parked"], counts["resumed"]) == (0, 0, 0)
    assert calls == [0, 1] and second.outcomes["skipped"] == 0


async def test_a_stop_that_meets_a_workflow_the_moment_it_returned_still_writes_its_outcome(
    ledger: RunLedger,
) -> None:
    """The stop cancels the hop in the same step its workflow returned, before the hop
    saw it (the workflow starts the stop as its last act: the stop's first step runs
    before the hop's wait learns that the workflow ended)."""
    flows, broker = Workflows(), InMemoryBroker()
    stops: list[asyncio.Future[None]] = []
    runner = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)

    @flows.workflow("last", "1")
    async def last(ctx: Any) -> dict[str, Any]:
        stops.append(asyncio.ensure_future(runner.stop(30)))
        return {"answer": 7}

    await runner.start()
    run_id = await admit(ledger, flows, "last")
    await ledger.publish(run_id, 0, broker)
    await until(lambda: stops, what="the workflow to run")
    await asyncio.wait_for(stops[0], 60)
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.result) == (RunStatus.DONE, {"answer": 7})
    assert runner.outcomes["done"] == 1


async def test_a_workflow_still_running_when_the_runtime_stops_is_cancelled_and_left_to_recovery(
    ledger: RunLedger,
) -> None:
    flows, broker, started = Workflows(), InMemoryBroker(), asyncio.Event()

    @flows.workflow("endless", "1")
    async def endless(ctx: Any) -> None:
        started.set()
        await asyncio.Event().wait()

    runner = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)
    async with runtime(ledger, broker, runner):
        run_id = await admit(ledger, flows, "endless")
        await ledger.publish(run_id, 0, broker)
        await asyncio.wait_for(started.wait(), 60)
    assert (await ledger.get(run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]
    async with runtime(ledger, broker, RunWorker(ledger, broker, flows, node="node-a")) as again:
        assert again.startup is not None and again.startup.counts["orphans_failed"] == 1
    assert (await ledger.get(run_id)).error == "lost"  # type: ignore[union-attr]
