"""What a hop that runs again sees (issue 47, item 3): a plain checkpoint save keeps the
owner the Run resumed from, so a resumed hop that saved (``ctx.save``, or
``ctx.wait_for_hardware``, which saves first) and died runs again as a resume of the
same decided owner, from the state it saved last, instead of being failed
``checkpoint_invalid`` without running; a retried fresh hop starts from the state its
lost try saved. Every test runs on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from run_support import status_of

from tenure.adapters import InMemoryBroker, RunLedger, RunWorker, Workflows
from tenure.adapters.runs.recovery import RecoveryPorts
from tenure.model import ConsentStatus, RunIntent, RunStatus, WaitKind


@pytest.fixture
async def ledger(db_url: str) -> AsyncIterator[RunLedger]:
    async with RunLedger(db_url) as made:
        yield made


def flows_seen(on_lost: str = "retry") -> Workflows:
    """Workflow ``seen``: returns what its hop sees."""
    flows = Workflows()

    @flows.workflow("seen", "1", on_lost=on_lost)
    async def seen(ctx: Any) -> dict[str, Any]:
        return {"seq": ctx.enqueue_seq, "resumed": ctx.resumed, "state": ctx.state, "timer": ctx.timer,
                "consent": None if ctx.consent is None else ctx.consent.status.value}

    return flows


async def reconcile(ledger: RunLedger, broker: Any) -> Any:
    ports = RecoveryPorts(broker=broker, checkpoint_owner=ledger.checkpoints.owner,
                          delete_checkpoint=ledger.checkpoints.delete, checkpoint_outcome=ledger.checkpoints.outcome)
    return await ledger.reconcile(ports, node="node-a", boot_cutoff=await ledger.database_now())


async def run_to_the_end(ledger: RunLedger, broker: Any, flows: Workflows, run_id: str) -> Any:
    runner = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)
    await runner.start()
    try:
        return await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    finally:
        await runner.stop(10)


async def claimed(ledger: RunLedger, broker: Any, flows: Workflows) -> str:
    admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=flows.pin("seen", "1"),
                                   queue="runs", priority=50)
    run_id = admission.run.run_id
    await ledger.publish(run_id, 0, broker)
    assert await ledger.claim(run_id, 0, node="node-a") is not None
    return run_id


async def test_a_retried_resumed_hop_that_saved_a_checkpoint_runs_again_from_its_timer_and_saved_state(
    ledger: RunLedger,
) -> None:
    """The issue's repro: hop 0 sleeps, hop 1 resumes from the timer, saves, dies."""
    flows, broker = flows_seen(), InMemoryBroker()
    run_id = await claimed(ledger, broker, flows)
    assert await ledger.park_timer(run_id, 0, name="nap", state={"slept": 1}, delay_s=0)
    assert await ledger.resume(run_id, owner_id="nap") == 1
    await ledger.publish(run_id, 1, broker)
    assert await ledger.claim(run_id, 1, node="node-a") is not None
    assert await ledger.checkpoints.save(run_id, 1, state={"slept": 1, "progress": 2})
    saved = await ledger.checkpoints.load(run_id)
    assert saved is not None and (saved.owner_kind, saved.owner_id, saved.enqueue_seq) == (WaitKind.TIMER, "nap", 1)
    # The process died here. The next start:
    report = await reconcile(ledger, broker)
    assert (report.degraded, report.counts["hops_retried"]) == (False, 1)
    done = await run_to_the_end(ledger, broker, flows, run_id)
    assert (done.status, done.error) == (RunStatus.DONE, None)
    assert done.result == {"seq": 2, "resumed": True, "state": {"slept": 1, "progress": 2}, "timer": "nap",
                           "consent": None}


async def test_a_resumed_hop_that_waited_for_hardware_and_died_runs_again_from_its_timer(ledger: RunLedger) -> None:
    flows, broker = flows_seen(), InMemoryBroker()
    run_id = await claimed(ledger, broker, flows)
    assert await ledger.park_timer(run_id, 0, name="nap", delay_s=0)
    assert await ledger.resume(run_id, owner_id="nap") == 1
    await ledger.publish(run_id, 1, broker)
    assert await ledger.claim(run_id, 1, node="node-a") is not None
    # ctx.wait_for_hardware: a plain save, then AWAITING_HARDWARE; the process dies waiting.
    assert await ledger.checkpoints.save(run_id, 1, state={"gpu": "wanted"})
    assert await ledger.enter_hardware_wait(run_id, 1)
    report = await reconcile(ledger, broker)
    assert (report.degraded, report.counts["hops_retried"]) == (False, 1)
    done = await run_to_the_end(ledger, broker, flows, run_id)
    assert (done.status, done.result) == (RunStatus.DONE, {
        "seq": 2, "resumed": True, "state": {"gpu": "wanted"}, "timer": "nap", "consent": None})


@pytest.mark.parametrize("on_lost", ["retry", "fail"])
async def test_a_resumed_hop_of_a_consent_that_saved_and_died_resumes_again_with_the_same_verdict(
    ledger: RunLedger, on_lost: str,
) -> None:
    """The checkpoint still binds the Run's latest consent, so recovery re-parks the Run on
    it (as for a resumed hop that saved nothing) and the next hop resumes with the same
    verdict, from the state saved last; no retry is spent."""
    flows, broker = flows_seen(on_lost), InMemoryBroker()
    run_id = await claimed(ledger, broker, flows)
    consent = await ledger.consents.create(run_id, tool_name="mail.send", tool_call_id="call-1", payload={})
    assert await ledger.checkpoints.save(run_id, 0, state={"asked": 1}, owner_kind=WaitKind.CONSENT,
                                         owner_id=consent.consent_id)
    assert await ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent.consent_id)
    assert await ledger.consents.decide(consent.consent_id, ConsentStatus.GRANTED, decided_by="ops")
    assert await ledger.resume(run_id, owner_id=consent.consent_id) == 1
    await ledger.publish(run_id, 1, broker)
    assert await ledger.claim(run_id, 1, node="node-a") is not None
    assert await ledger.checkpoints.save(run_id, 1, state={"asked": 1, "sent": 0})
    report = await reconcile(ledger, broker)
    assert (report.degraded, report.counts["orphans_parked"], report.counts["orphans_failed"]) == (False, 1, 0)
    assert report.counts["resumed"] == 1  # the verdict was already in
    done = await run_to_the_end(ledger, broker, flows, run_id)
    assert (done.status, done.hop_retries) == (RunStatus.DONE, 0)
    assert done.result == {"seq": 2, "resumed": True, "state": {"asked": 1, "sent": 0}, "timer": None,
                           "consent": "granted"}


async def test_a_retried_fresh_hop_starts_from_the_state_its_lost_try_saved(ledger: RunLedger) -> None:
    flows, broker = flows_seen(), InMemoryBroker()
    run_id = await claimed(ledger, broker, flows)
    assert await ledger.checkpoints.save(run_id, 0, state={"progress": 1})
    report = await reconcile(ledger, broker)
    assert (report.degraded, report.counts["hops_retried"]) == (False, 1)
    done = await run_to_the_end(ledger, broker, flows, run_id)
    assert (done.status, done.result) == (RunStatus.DONE, {
        "seq": 1, "resumed": False, "state": {"progress": 1}, "timer": None, "consent": None})


async def test_a_park_replaces_the_owner_a_plain_save_kept(ledger: RunLedger) -> None:
    flows, broker = flows_seen(), InMemoryBroker()
    run_id = await claimed(ledger, broker, flows)
    assert await ledger.park_timer(run_id, 0, name="nap", delay_s=0)
    assert await ledger.resume(run_id, owner_id="nap") == 1
    await ledger.publish(run_id, 1, broker)
    assert await ledger.claim(run_id, 1, node="node-a") is not None
    assert await ledger.checkpoints.save(run_id, 1, state={"n": 1})
    consent = await ledger.consents.create(run_id, tool_name="mail.send", tool_call_id="call-2", payload={})
    assert await ledger.checkpoints.save(run_id, 1, state={"n": 2}, owner_kind=WaitKind.CONSENT,
                                         owner_id=consent.consent_id)
    saved = await ledger.checkpoints.load(run_id)
    assert saved is not None and (saved.owner_kind, saved.owner_id, saved.state) == (
        WaitKind.CONSENT, consent.consent_id, {"n": 2})
