"""A node killed for good has its Runs taken over by another live node (issue 27): node
leases on both databases, and the takeover end to end with a worker process killed
with ``kill -9`` on tenure's owned queue (SQLite, PostgreSQL) and on SAQ."""

from __future__ import annotations

import asyncio
import pathlib
import signal
from typing import Any

import pytest
from node_support import publish_to_a_live_worker, start_node
from polling import until
from run_worker_process import broker_of, registry

from tenure.adapters import InMemoryBroker, RunLedger, RunRuntime, RunWorker
from tenure.kernel.nodes.record import NodeStatus
from tenure.model import BrokerJobState, ConfigValidationError, RunIntent, RunStatus, hop_key


@pytest.fixture
async def ledger(db_url: str) -> Any:
    async with RunLedger(db_url) as made:
        yield made


async def test_a_lease_is_renewed_while_it_holds_and_taken_over_only_once_it_ran_out(ledger: RunLedger) -> None:
    nodes = ledger.nodes
    lease = await nodes.boot("node-a", lease_s=0.5)
    assert lease.epoch == 1 and await nodes.renew(lease, lease_s=0.5)
    row = await nodes.get("node-a")
    assert row is not None and row.status is NodeStatus.LIVE
    assert await nodes.take_over("node-b", row, lease_s=5) is None  # its lease holds
    assert await nodes.take_over("node-a", row, lease_s=5) is None  # never itself

    async def taken() -> Any:
        fresh = await nodes.get("node-a")
        return None if fresh is None else await nodes.take_over("node-b", fresh, lease_s=5)

    takeover = await until(taken)
    assert takeover.epoch == 1 and (await nodes.expired()) == []  # the claim holds: nobody else takes it
    assert not await nodes.renew(lease, lease_s=0.5)  # the incarnation came back: only a boot brings it in
    assert await nodes.finish("node-b", takeover)
    assert (await nodes.get("node-a")).status is NodeStatus.TAKEN_OVER  # type: ignore[union-attr]
    again = await nodes.boot("node-a", lease_s=0.5)
    assert again.epoch == 2 and again.cutoff > lease.cutoff
    with pytest.raises(ConfigValidationError):
        await nodes.boot("node-a", lease_s=0)


async def test_a_process_whose_lease_is_taken_fences_its_hops_and_boots_again(ledger: RunLedger) -> None:
    from tenure.adapters import Workflows

    flows, broker = Workflows(), InMemoryBroker()
    started = asyncio.Event()

    @flows.workflow("endless", "1", on_lost="retry")
    async def endless(ctx: Any) -> None:
        started.set()
        await asyncio.Event().wait()

    worker = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)
    async with RunRuntime(ledger, brokers=[broker], workers=[worker], node="node-a", relay_interval_s=0.1,
                          node_lease_s=1.0) as runtime:
        admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}),
                                       workflow=flows.pin("endless", "1"), queue="runs", priority=50)
        await ledger.publish(admission.run.run_id, 0, broker)
        await asyncio.wait_for(started.wait(), 30)
        first = runtime.lease
        assert first is not None
        await ledger.nodes.boot("node-a", lease_s=1.0)  # another process booted under this name

        async def rebooted() -> bool:
            return runtime.reboots >= 1

        await until(rebooted)
        assert runtime.lease is not None and runtime.lease.epoch >= first.epoch + 2  # the other boot, then its own
        run = await until(lambda: _run_moved(ledger, admission.run.run_id))
        # The fenced hop was this node's orphan of an old incarnation: retried (its workflow allows it).
        assert run.hop_retries >= 1


async def _run_moved(ledger: RunLedger, run_id: str) -> Any:
    run = await ledger.get(run_id)
    return run if run is not None and run.enqueue_seq >= 1 else None


def _quick_flows() -> Any:
    from tenure.adapters import Workflows

    flows = Workflows()

    @flows.workflow("quick", "1")
    async def quick(ctx: Any) -> dict[str, Any]:
        return {"ok": True}

    return flows


async def _runs_to_done(ledger: RunLedger, broker: Any, flows: Any) -> None:
    admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=flows.pin("quick", "1"),
                                   queue="runs", priority=50)
    await ledger.publish(admission.run.run_id, 0, broker)

    async def done() -> bool:
        run = await ledger.get(admission.run.run_id)
        return run is not None and run.status is RunStatus.DONE
    await until(done)


async def test_a_reboot_cut_short_by_a_database_failure_is_finished_and_the_workers_serve_again(
    ledger: RunLedger,
) -> None:
    """Found by the chaos test: a reboot whose reconciliation failed (the server
    restarting) kept the lease it booted, renewed it, and never reopened the workers'
    gate, so the node claimed hops it would never run. Every round now reboots until a
    reboot finished."""
    from tenure.model import ErrorCode, TenureError

    flows, broker = _quick_flows(), InMemoryBroker()
    worker = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)
    async with RunRuntime(ledger, brokers=[broker], workers=[worker], node="node-a", relay_interval_s=0.1,
                          node_lease_s=2.0) as runtime:
        original, failures = ledger.reconcile, [1]

        async def failing_once(*args: Any, **kwargs: Any) -> Any:
            if failures:
                failures.pop()
                raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, "connection_lost")
            return await original(*args, **kwargs)

        ledger.reconcile = failing_once  # type: ignore[method-assign]
        assert runtime.lease is not None
        first = runtime.lease.epoch
        await ledger.nodes.boot("node-a", lease_s=2.0)  # another incarnation: this one's lease is lost
        await until(lambda: _true(runtime.reboots >= 1 and not worker.paused))
        assert not failures and runtime.lease.epoch >= first + 3  # the failed reboot's lease, then a fresh one
        await _runs_to_done(ledger, broker, flows)


async def test_a_reboot_whose_reconciliation_outlasts_the_lease_keeps_the_lease_it_booted(
    ledger: RunLedger,
) -> None:
    """Found by the chaos test: a reconciliation longer than the node lease (a long
    history) let the lease it had just booted run out, so the node rebooted for ever.
    The lease is now renewed beside every reconciliation."""
    flows, broker = _quick_flows(), InMemoryBroker()
    worker = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)
    async with RunRuntime(ledger, brokers=[broker], workers=[worker], node="node-a", relay_interval_s=0.2,
                          node_lease_s=2.0) as runtime:
        original = ledger.reconcile

        async def long(*args: Any, **kwargs: Any) -> Any:
            report = await original(*args, **kwargs)
            await asyncio.sleep(3.0)  # longer than the lease
            return report

        ledger.reconcile = long  # type: ignore[method-assign]
        await ledger.nodes.boot("node-a", lease_s=2.0)
        await until(lambda: _true(runtime.reboots >= 1 and not worker.paused))
        assert runtime.lease is not None
        rebooted = runtime.lease.epoch
        await _runs_to_done(ledger, broker, flows)
        await asyncio.sleep(3 * 2.0)  # three leases: a lost lease would have rebooted by now
        assert (runtime.reboots, runtime.lease.epoch) == (1, rebooted)
        row = await ledger.nodes.get("node-a")
        assert row is not None and row.status is NodeStatus.LIVE and row.epoch == rebooted


async def _true(value: bool) -> bool:
    return value


@pytest.mark.parametrize(("database", "broker"), [("sqlite", "queue"), ("postgresql", "queue"),
                                                   ("postgresql", "saq")])
async def test_a_node_killed_for_good_is_taken_over_by_a_live_node(db_url: str, broker: str,
                                                                   tmp_path: pathlib.Path) -> None:
    process = await start_node("run_worker_process.py", db_url, broker, node="dead-node", lease_s=1.5,
                               log_dir=tmp_path)
    async with RunLedger(db_url) as ledger:
        runs: dict[str, str] = {}
        try:
            publisher = broker_of(broker, db_url)
            if hasattr(publisher, "connect"):
                await publisher.connect()
            try:
                for name in ("hang", "repeatable"):
                    intent = RunIntent(None, "api", "alice", frozenset(), {"flow": name})
                    admission = await ledger.admit(intent, workflow=registry.pin(name, "1"), queue="runs",
                                                   priority=50)
                    runs[name] = admission.run.run_id
                    await publish_to_a_live_worker(ledger, runs[name], publisher)

                async def both_running() -> bool:
                    found = [await ledger.get(run_id) for run_id in runs.values()]
                    return all(run is not None and run.status is RunStatus.RUNNING for run in found)

                await until(both_running)
            finally:
                await publisher.disconnect()
        finally:
            await process.kill()  # SIGKILL, and it never comes back
        live_broker = broker_of(broker, db_url)
        worker = RunWorker(ledger, live_broker, registry, node="live-node", watch_interval_s=0.05)
        async with RunRuntime(ledger, brokers=[live_broker], workers=[worker], node="live-node",
                              relay_interval_s=0.2, node_lease_s=1.5) as runtime:
            assert runtime.startup is not None and runtime.startup.counts["orphans_failed"] == 0  # not its own

            async def finished() -> Any:
                found = {name: await ledger.get(run_id) for name, run_id in runs.items()}
                done = all(run is not None and run.status in (RunStatus.DONE, RunStatus.FAILED)
                           for run in found.values())
                return found if done else None

            found = await until(finished)

            async def taken_over() -> Any:
                # The takeover marks the node after it moved the Runs on: the Runs may end first.
                node = await ledger.nodes.get("dead-node")
                return node if node is not None and node.status is not NodeStatus.TAKING_OVER else None

            dead = await until(taken_over)
            for run_id in runs.values():  # the dead node's broker jobs were fenced, terminally
                assert (await live_broker.probe(hop_key(run_id, 0))).state is not BrokerJobState.ACTIVE
        assert (found["hang"].status, found["hang"].error) == (RunStatus.FAILED, "lost")
        assert (found["repeatable"].status, found["repeatable"].result, found["repeatable"].hop_retries) == (
            RunStatus.DONE, {"finished_by_hop": 1}, 1)
        assert dead is not None and dead.status is NodeStatus.TAKEN_OVER and dead.taker == "live-node"
        assert [node for node, report in runtime.takeovers] == ["dead-node"]
        assert process.returncode == -signal.SIGKILL
