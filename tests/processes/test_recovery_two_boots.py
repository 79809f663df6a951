"""Two boots on PostgreSQL: a process admits, publishes and claims Runs, parks some on
consent and is killed with ``kill -9``; consents are decided while it is dead, its broker
loses one publication and holds one job a broker worker took but never claimed; a second
process reconciles with a new cutoff, relays, and its worker finishes everything.

The broker is a table in the same database (``table_broker``), so it outlives the killed
process as a real broker would; the workflow's snapshots (checkpoints) live beside it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import pathlib
import signal
import subprocess
import sys
import uuid
import pytest

from table_broker import TableBroker
import paths
from tenure.adapters import RecoveryPorts, RunLedger
from tenure.model import ConsentStatus, RunStatus, hop_key

pytestmark = pytest.mark.parametrize("database", ["postgresql"])

TESTS = paths.SUPPORT  # the helper scripts and modules
NODE = "node-a"


def first_boot(db_url: str, source: str) -> dict[str, list[str]]:
    """Run the first boot until it is ready, then ``kill -9`` it; its Runs by category."""
    process = subprocess.Popen(
        [sys.executable, "-P", str(TESTS / "recovery_first_boot.py"), db_url, source],
        env={**os.environ, "PYTHONPATH": str(TESTS)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        made = json.loads(process.stdout.readline())
        assert process.stdout.readline() == b"ready\n"
    except Exception:
        process.kill()
        raise AssertionError(process.stderr.read().decode() if process.stderr else "no output") from None
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL
    return made  # type: ignore[no-any-return]


async def drain(ledger: RunLedger, broker: TableBroker, ports: RecoveryPorts) -> dict[str, int]:
    """The second boot's worker: take each hop the broker hands out, claim it in the
    ledger (a stale hop is skipped), settle it DONE; relay between rounds. The number
    of hops each Run executed."""
    executed: dict[str, int] = {}
    cursor = None
    for _ in range(100):
        key = await broker.take("agents")
        if key is None:  # dry: one relay round may open more (resumed waits)
            report = await ledger.relay(ports, cursor=cursor)
            assert not report.degraded, report.issues
            cursor = report.cursor
            key = await broker.take("agents")
            if key is None:
                return executed
        _, run_id, seq = key.split(":")
        claim = await ledger.claim(run_id, int(seq), node="node-b")
        if claim is not None:
            executed[run_id] = executed.get(run_id, 0) + 1
            assert await ledger.settle(run_id, int(seq), RunStatus.DONE)
        await broker.finish(key)
    raise AssertionError("the broker never ran dry")


async def test_a_killed_process_is_recovered_by_the_next_boot_and_everything_finishes(db_url: str) -> None:
    source = f"boot-{uuid.uuid4().hex[:8]}"
    made = await asyncio.to_thread(first_boot, db_url, source)
    everything = [run_id for runs in made.values() for run_id in runs]
    async with RunLedger(db_url) as ledger, TableBroker(db_url) as broker:
        # While the first process is dead: operators decide the parked consents, the
        # broker loses a publication, and the job a broker worker took looks stale.
        for run_id in made["parked"]:
            run = await ledger.get(run_id)
            assert run is not None and run.status is RunStatus.AWAITING_CONSENT and run.owner_id is not None
            assert await ledger.consents.decide(run.owner_id, ConsentStatus.GRANTED, decided_by="bob")
        [lost] = made["lost_publication"]
        await broker.forget(hop_key(lost, 0))
        [stale] = made["stale_active"]
        await broker.started_long_ago(hop_key(stale, 0), 600)
        await asyncio.sleep(0.01)
        cutoff = dt.datetime.now(dt.timezone.utc)
        ports = RecoveryPorts(broker, checkpoint_owner=broker.checkpoint_owner)
        report = await ledger.reconcile(ports, node=NODE, boot_cutoff=cutoff)
        assert not report.degraded, report.issues
        per = len(made["orphan"])
        assert dict(report.counts) == {
            "published": per + per + 1,  # the unpublished, the resumed, the rotated
            "republished": 1, "rotated": 1, "held_failed": 0, "orphans_parked": per, "orphans_failed": per,
            "resumed": per, "cancels_finished": 0, "outcomes_settled": 0, "hops_retried": 0, "timed_out": 0,
        }
        for run_id in made["orphan"]:
            run = await ledger.get(run_id)
            assert run is not None and (run.status, run.error) == (RunStatus.FAILED, "lost")
            assert (await broker.probe(hop_key(run_id, 0))).state.value == "aborted"  # the old hop is fenced
        for run_id in made["orphan_checkpointed"]:
            run = await ledger.get(run_id)
            assert run is not None and run.status is RunStatus.AWAITING_CONSENT
            assert run.owner_id == await broker.checkpoint_owner(run_id)
            assert await ledger.consents.decide(run.owner_id, ConsentStatus.GRANTED, decided_by="carol")
        executed = await drain(ledger, broker, ports)
        finished = {run_id: await ledger.get(run_id) for run_id in everything}
    for run_id, run in finished.items():
        assert run is not None
        if run_id in made["orphan"]:
            assert run.status is RunStatus.FAILED and run_id not in executed
        else:
            assert run.status is RunStatus.DONE, (run_id, run.status)
            assert executed[run_id] == 1  # exactly one hop of the second boot ran it
    assert len(everything) == 5 * per + 2
