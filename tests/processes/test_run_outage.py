"""A PostgreSQL server that stops while a hop records and settles its outcome: the hop
retries through the outage, and the Run ends DONE with its result once the server is
back (issue 27), whether its broker keeps its jobs in memory, in tenure's own queue or
in SAQ (both on the server that stopped: their heartbeats fail too). The SQLite
counterpart (a busy file) is in tests/adapters/runs/test_run_liveness.py. A workflow
blocked in one of its own context calls across a server stop goes on too (issue 47,
item 13; SQLite: tests/adapters/runs/test_run_context_outages.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from adapter_support import pg_ctl, private_pg_server
from polling import until
from run_worker_process import broker_of

from tenure.adapters import InMemoryBroker, RunLedger, RunWorker, Workflows, upgrade
from tenure.model import RunIntent, RunStatus, TenureError

pytestmark = pytest.mark.slow


@pytest.fixture
def server() -> Iterator[dict[str, str]]:
    with private_pg_server() as made:
        yield made


@pytest.mark.parametrize("broker_kind", ["memory", "queue", "saq"])
async def test_a_settlement_across_a_server_stop_is_retried_and_the_run_ends_done(
    server: dict[str, str], broker_kind: str,
) -> None:
    db_url = server["TEST_PG_DSN"]
    await upgrade(db_url)
    flows = Workflows()
    broker: Any = InMemoryBroker() if broker_kind == "memory" else broker_of(broker_kind, db_url)
    if hasattr(broker, "connect"):
        await broker.connect()
    finish = asyncio.Event()

    @flows.workflow("answer", "1")
    async def answer(ctx: Any) -> dict[str, Any]:
        await finish.wait()
        return {"answer": 42}

    async with RunLedger(db_url, timeout_seconds=2) as ledger:
        runner = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)
        await runner.start()
        try:
            admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}),
                                           workflow=flows.pin("answer", "1"), queue="runs", priority=50)
            run_id = admission.run.run_id
            await ledger.publish(run_id, 0, broker)
            for _ in range(600):  # hang guard: the hop claims within a minute
                run = await ledger.get(run_id)
                if run is not None and run.status is RunStatus.RUNNING:
                    break
                await asyncio.sleep(0.1)
            assert run is not None and run.status is RunStatus.RUNNING
            pg_ctl(server, "stop")
            try:
                finish.set()
                await until(lambda: runner.persist_retries >= 2)
            finally:
                pg_ctl(server, "start")
            await until(lambda: runner.outcomes["done"] == 1 or runner.outcomes["lost"] == 1)
            run = await ledger.get(run_id)
        finally:
            await runner.stop(10)
            if hasattr(broker, "disconnect"):
                await broker.disconnect()
    assert run is not None and (run.status, run.result) == (RunStatus.DONE, {"answer": 42})
    assert runner.outcomes["done"] == 1


def context_calls(call: str, gate: asyncio.Event) -> Workflows:
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


CALL_ENDS = {"step": RunStatus.DONE, "request_consent": RunStatus.AWAITING_CONSENT, "sleep": RunStatus.AWAITING_TIMER}


@pytest.mark.parametrize("call", sorted(CALL_ENDS))
async def test_a_context_call_across_a_server_stop_is_retried_and_the_run_goes_on(
    server: dict[str, str], call: str,
) -> None:
    """Issue 47, item 13: a workflow blocked in ``ctx.step``, ``ctx.request_consent`` or
    ``ctx.sleep`` while the server restarts is not failed ``workflow_error``: the call is
    retried until the server answers again, and the Run goes on."""
    db_url = server["TEST_PG_DSN"]
    await upgrade(db_url)
    gate, broker = asyncio.Event(), InMemoryBroker()
    flows = context_calls(call, gate)
    async with RunLedger(db_url, timeout_seconds=2) as ledger:
        runner = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)
        await runner.start()
        try:
            admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}),
                                           workflow=flows.pin("calls", "1"), queue="runs", priority=50)
            run_id = admission.run.run_id
            await ledger.publish(run_id, 0, broker)

            async def status(*wanted: RunStatus) -> Any:
                run = await ledger.get(run_id)
                return run if run is not None and run.status in wanted else None

            await until(lambda: status(RunStatus.RUNNING), what="the hop to claim its Run")
            pg_ctl(server, "stop")
            try:
                gate.set()
                await until(lambda: runner.persist_retries >= 2, 60, what="the call to meet the stopped server")
            finally:
                pg_ctl(server, "start")
            run = await until(lambda: status(CALL_ENDS[call], RunStatus.FAILED), tolerate=(TenureError,),
                              what="the Run to go on")
            await until(lambda: runner.running_hops == 0, what="the hop to end")
        finally:
            await runner.stop(10)
    assert run.status is CALL_ENDS[call], (run.status, run.error)
    if call == "step":
        assert run.result == {"value": 5}
    assert runner.outcomes["failed"] == 0 and runner.outcomes["lost"] == 0
