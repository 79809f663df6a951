"""A database failure inside a workflow's own call (``ctx.step``, ``ctx.request_consent``,
``ctx.sleep``) is retried until the database answers: it never reaches the workflow as
its own error, so a Run is never failed ``workflow_error`` because its database was
briefly unavailable (issue 47, item 13). SQLite: another connection holds the write lock
past the ledger's busy timeout; both databases: injected failures, including a park
whose COMMIT applied but whose answer was lost. The PostgreSQL server restart is in
tests/processes/test_run_outage.py."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from adapter_support import sqlite_path
from polling import until
from run_support import status_of

from tenure.adapters import InMemoryBroker, RunLedger, RunWorker, Workflows
from tenure.model import ErrorCode, RunIntent, RunStatus, TenureError

CALLS = ("step", "request_consent", "sleep")
ENDS = {"step": RunStatus.DONE, "request_consent": RunStatus.AWAITING_CONSENT, "sleep": RunStatus.AWAITING_TIMER}


@pytest.fixture
async def ledger(db_url: str) -> AsyncIterator[RunLedger]:
    async with RunLedger(db_url) as made:
        yield made


def calling(call: str, gate: asyncio.Event) -> Workflows:
    """Workflow ``calls``: waits for ``gate``, then makes the one context call ``call``."""
    flows = Workflows()

    @flows.workflow("calls", "1")
    async def calls(ctx: Any) -> dict[str, Any]:
        await gate.wait()
        if call == "step":
            return {"value": await ctx.step("count", lambda: 5)}
        if call == "request_consent":
            await ctx.request_consent(tool_name="mail.send", tool_call_id="call-1", payload={}, state={"n": 1})
        await ctx.sleep(3600, state={"n": 1})
        raise AssertionError("parked")

    return flows


async def started(ledger: RunLedger, flows: Workflows, broker: Any) -> tuple[RunWorker, str]:
    runner = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)
    await runner.start()
    admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=flows.pin("calls", "1"),
                                   queue="runs", priority=50)
    run_id = admission.run.run_id
    await ledger.publish(run_id, 0, broker)
    await status_of(ledger, run_id, RunStatus.RUNNING)
    return runner, run_id


def check_end(run: Any, call: str) -> None:
    assert run.status is ENDS[call], (run.status, run.error)
    if call == "step":
        assert run.result == {"value": 5}


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
@pytest.mark.parametrize("call", CALLS)
async def test_a_context_call_that_meets_a_busy_database_is_retried_and_the_run_goes_on(db_url: str, call: str) -> None:
    gate, broker = asyncio.Event(), InMemoryBroker()
    flows = calling(call, gate)
    async with RunLedger(db_url, timeout_seconds=0.3) as ledger:
        runner, run_id = await started(ledger, flows, broker)
        try:
            holder = sqlite3.connect(sqlite_path(db_url), isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
            try:
                gate.set()
                await until(lambda: runner.persist_retries >= 2, what="the call to meet the busy file")
            finally:
                holder.execute("ROLLBACK")
                holder.close()
            run = await status_of(ledger, run_id, ENDS[call], RunStatus.FAILED)
        finally:
            await runner.stop(10)
    check_end(run, call)


def failing(method: Callable[..., Any], failures: int, *, after: bool = False) -> Callable[..., Any]:
    """``method`` failing its first ``failures`` calls with a database failure, before
    doing anything (or, ``after``, once it applied: the answer is what gets lost)."""
    failed: list[int] = []

    async def call(*args: Any, **kwargs: Any) -> Any:
        if len(failed) < failures and not after:
            failed.append(1)
            raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, "connection_refused")
        answer = await method(*args, **kwargs)
        if len(failed) < failures:
            failed.append(1)
            raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, "connection_lost")
        return answer

    return call


@pytest.mark.parametrize("call", CALLS)
async def test_a_context_call_whose_ledger_writes_fail_is_retried_and_the_run_goes_on(
    ledger: RunLedger, call: str,
) -> None:
    gate, broker = asyncio.Event(), InMemoryBroker()
    runner, run_id = await started(ledger, calling(call, gate), broker)
    try:
        if call == "step":
            steps = ledger.steps
            steps.recorded = failing(steps.recorded, 2)  # type: ignore[method-assign]
            steps.record = failing(steps.record, 2)  # type: ignore[method-assign]
        elif call == "request_consent":
            ledger.consents.create = failing(ledger.consents.create, 2)  # type: ignore[method-assign]
            ledger.checkpoints.save = failing(ledger.checkpoints.save, 1)  # type: ignore[method-assign]
            ledger.park = failing(ledger.park, 1)  # type: ignore[method-assign]
        else:
            ledger.park_timer = failing(ledger.park_timer, 2)  # type: ignore[method-assign]
        gate.set()
        run = await status_of(ledger, run_id, ENDS[call], RunStatus.FAILED)
        await until(lambda: runner.running_hops == 0, what="the hop to end")
    finally:
        await runner.stop(10)
    check_end(run, call)
    assert runner.persist_retries >= 2 and runner.outcomes["lost"] == 0


@pytest.mark.parametrize("call", ["request_consent", "sleep"])
async def test_a_park_whose_commit_applied_but_whose_answer_was_lost_ends_the_hop_parked(
    ledger: RunLedger, call: str,
) -> None:
    """The retry of the park is refused (the Run is parked already): the Run read back
    shows this hop's park, so the hop ends ``parked``, not ``lost``."""
    gate, broker = asyncio.Event(), InMemoryBroker()
    runner, run_id = await started(ledger, calling(call, gate), broker)
    try:
        if call == "request_consent":
            ledger.park = failing(ledger.park, 1, after=True)  # type: ignore[method-assign]
        else:
            ledger.park_timer = failing(ledger.park_timer, 1, after=True)  # type: ignore[method-assign]
        gate.set()
        run = await status_of(ledger, run_id, ENDS[call], RunStatus.FAILED)
        await until(lambda: runner.running_hops == 0, what="the hop to end")
    finally:
        await runner.stop(10)
    check_end(run, call)
    assert (runner.outcomes["parked"], runner.outcomes["lost"], runner.persist_retries) == (1, 0, 1)
