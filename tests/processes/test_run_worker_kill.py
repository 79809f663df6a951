"""``kill -9`` of a Run worker process (on SAQ, and on tenure's owned queue on both
databases) in the middle of two hops, then a new process for the same node: its
lifespan's startup reconciliation fences both dead broker jobs terminally, fails the uncheckpointed-owner hop as lost, re-parks the hop whose checkpoint
binds the Run's latest consent (the crash window between checkpoint and park), and its
worker then finishes the re-parked Run once the consent is decided."""

from __future__ import annotations

import pathlib
import signal

import pytest
from node_support import publish_to_a_live_worker, start_node
from polling import until
from run_worker_process import NODE, NODE_LEASE_S, broker_of, registry

from tenure.adapters import RunLedger, RunRuntime, RunWorker, resume_and_publish
from tenure.model import BrokerJobState, ConsentStatus, RunIntent, RunStatus, WaitKind, hop_key

pytestmark = pytest.mark.parametrize(("database", "broker"), [("postgresql", "saq"), ("postgresql", "queue"),
                                                               ("sqlite", "queue")])

async def test_a_killed_worker_is_fenced_and_its_runs_failed_or_reparked_by_the_next_process(
    db_url: str, broker: str, tmp_path: pathlib.Path,
) -> None:
    kind = broker
    process = await start_node("run_worker_process.py", db_url, kind, node=NODE, lease_s=NODE_LEASE_S,
                               log_dir=tmp_path)
    async with RunLedger(db_url) as ledger:
        try:
            runs = {}
            publisher = broker_of(kind, db_url)
            if hasattr(publisher, "connect"):
                await publisher.connect()
            try:
                for name in ("hang", "pre-park"):
                    intent = RunIntent(None, "api", "alice", frozenset(), {"flow": name})
                    admission = await ledger.admit(intent, workflow=registry.pin(name, "1"), queue="runs", priority=50)
                    runs[name] = admission.run.run_id
                    await publish_to_a_live_worker(ledger, runs[name], publisher)

                async def both_mid_hop() -> bool:
                    hung = await ledger.checkpoints.load(runs["hang"])
                    asked = await ledger.checkpoints.load(runs["pre-park"])
                    return hung is not None and asked is not None and asked.owner_id is not None

                await until(both_mid_hop)
                for run_id in runs.values():
                    assert (await publisher.probe(hop_key(run_id, 0))).state is BrokerJobState.ACTIVE
            finally:
                await publisher.disconnect()
        finally:
            await process.kill()  # SIGKILL: no shutdown, no abort, nothing settled
        assert process.returncode == -signal.SIGKILL
        for run_id in runs.values():
            assert (await ledger.get(run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]

        broker = broker_of(kind, db_url)
        worker = RunWorker(ledger, broker, registry, node=NODE, watch_interval_s=0.1)
        async with RunRuntime(ledger, brokers=[broker], workers=[worker], node=NODE, relay_interval_s=0.1) as runtime:
            report = runtime.startup
            assert report is not None and not report.degraded, report
            assert (report.counts["orphans_failed"], report.counts["orphans_parked"]) == (1, 1), dict(report.counts)
            for run_id in runs.values():  # both dead SAQ jobs finished by the terminal fence
                assert (await broker.probe(hop_key(run_id, 0))).state is BrokerJobState.ABORTED
            failed = await ledger.get(runs["hang"])
            assert failed is not None and failed.status is RunStatus.FAILED and failed.error == "lost"
            parked = await ledger.get(runs["pre-park"])
            assert parked is not None and parked.status is RunStatus.AWAITING_CONSENT
            assert parked.owner_kind is WaitKind.CONSENT
            assert parked.owner_id == (await ledger.checkpoints.load(runs["pre-park"])).owner_id  # type: ignore[union-attr]
            assert await ledger.consents.decide(parked.owner_id, ConsentStatus.GRANTED, decided_by="bob")
            await resume_and_publish(ledger, broker, runs["pre-park"], owner_id=parked.owner_id)

            async def done() -> bool:
                run = await ledger.get(runs["pre-park"])
                return run is not None and run.status is RunStatus.DONE and worker.outcomes["done"] == 1

            await until(done)
