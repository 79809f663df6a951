"""A Run worker process for the kill -9 test: ``python run_worker_process.py DB_URL BROKER``
(``saq`` or ``queue``) runs a :class:`RunRuntime` as node ``node-a`` (``TENURE_TEST_NODE``
names another, ``TENURE_TEST_NODE_LEASE_S`` sets its lease) until it is killed (tests start it
with ``node_support.start_node``; ``serve_node`` is the lifespan every node script runs). Its
registry (imported by the test for the second boot) has two workflows whose first hop never finishes:
``hang`` saves a plain checkpoint and waits; ``pre-park`` creates a consent and saves the
checkpoint naming it, then waits where its park would be (the seed's crash window between
checkpoint and park). A resumed ``pre-park`` hop finishes."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any

from tenure.adapters import QueueBroker, RecoveryPorts, RunLedger, RunRuntime, RunWorker, SaqBroker, Workflows
from tenure.adapters.runs.recovery import VISIT_CONCURRENCY
from tenure.model import ConsentStatus, WaitKind

NODE = os.environ.get("TENURE_TEST_NODE", "node-a")
NODE_LEASE_S = float(os.environ.get("TENURE_TEST_NODE_LEASE_S", "30"))
registry = Workflows()


@registry.workflow("repeatable", "1", on_lost="retry", max_hop_retries=2)
async def repeatable(ctx: Any) -> dict[str, Any]:
    """Safe to repeat: its first hop never finishes; a hop run again finishes."""
    if ctx.enqueue_seq == 0:
        await asyncio.Event().wait()
    return {"finished_by_hop": ctx.enqueue_seq}


@registry.workflow("hang", "1")
async def hang(ctx: Any) -> None:
    await ctx.save({"step": "working"})
    await asyncio.Event().wait()


@registry.workflow("pre-park", "1")
async def pre_park(ctx: Any) -> None:
    if ctx.resumed:
        assert ctx.consent.status is ConsentStatus.GRANTED and ctx.state == {"step": "asked"}
        return
    consent = await ctx._ledger.consents.create(ctx.run_id, tool_name="send", tool_call_id="call-1", payload={})
    assert await ctx._ledger.checkpoints.save(ctx.run_id, ctx.enqueue_seq, state={"step": "asked"},
                                              owner_kind=WaitKind.CONSENT, owner_id=consent.consent_id)
    await asyncio.Event().wait()  # killed here: after checkpoint and consent, before the park


def broker_of(kind: str, db_url: str, **options: Any) -> Any:
    """The hop broker of ``kind``; ``options`` go to :class:`QueueBroker` (its queue lease)."""
    return SaqBroker(db_url, queues=["runs"]) if kind == "saq" else QueueBroker(db_url, queues=["runs"], **options)


async def serve_node(db_url: str, kind: str, workflows: Workflows, *, node: str = NODE,
                     lease_s: float = NODE_LEASE_S, relay_interval_s: float = 0.2,
                     broker_options: dict[str, Any] | None = None,
                     prepare: Callable[[RunLedger], None] | None = None, contain_job: Any = None) -> None:
    """Run ``workflows`` as ``node`` until the process is killed: print ``ready`` once the
    runtime started (its startup reconciliation done). ``prepare`` sees the ledger first.
    ``contain_job``: recovery's containment of a delegated job (an App's child Runs:
    ``App.contain_child``, as an AppWorker wires it); the runtime's default ports otherwise."""
    async with RunLedger(db_url) as ledger:
        if prepare is not None:
            prepare(ledger)
        broker = broker_of(kind, db_url, **(broker_options or {}))
        worker = RunWorker(ledger, broker, workflows, node=node, watch_interval_s=0.1)
        ports = None if contain_job is None else RecoveryPorts(
            broker=broker, checkpoint_owner=ledger.checkpoints.owner, delete_checkpoint=ledger.checkpoints.delete,
            checkpoint_outcome=ledger.checkpoints.outcome, contain_job=contain_job, concurrency=VISIT_CONCURRENCY)
        async with RunRuntime(ledger, brokers=[broker], workers=[worker], node=node, ports=ports,
                              relay_interval_s=relay_interval_s, node_lease_s=lease_s):
            print("ready", flush=True)
            await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve_node(sys.argv[1], sys.argv[2], registry))
