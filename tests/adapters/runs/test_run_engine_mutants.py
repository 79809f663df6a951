"""Broken Run engines the suite must catch, on every database.

Each breakage changes one thing the Run engine (``tenure.adapters.runs.engine``) or the
kernel's aggregate declaration (``tenure.kernel.runs.aggregate``) holds: a part of the
aggregate left out of the compare-and-set (the Run, or its delivery), a declared
follow-up lost (the checkpoint delete, the consent sweep or the receive sweep after a settle, the outcome a
settle refused for unproven containment records, the checkpoint
a timer's park binds, the publication of a resumed hop), or a declaration naming the wrong evidence (a settle that does not
count containment, a park that reads the Run's owner instead of the one it names, a
resume that reads no owner). Each scenario below holds on the engine as built and must
fail with its breakage applied (an assertion, or the error the broken path raises)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from run_support import Runs, broken, ledger, runs, runs_db, unique  # noqa: F401 (fixtures)

from tenure.adapters.runs import engine as engine_module
from tenure.adapters.runs.checkpoints import RecordedOutcome
from tenure.adapters.runs.ledger import resume_and_publish
from tenure.adapters.runs.table import DELIVERIES_BINDING, RUNS_BINDING
from tenure.kernel.runs import aggregate
from tenure.kernel.runs.aggregate import Evidence, FollowUp
from tenure.kernel.runs.commands import RunCommandType, Settled
from tenure.kernel.runs.machine import RunRefusal
from tenure.model import ConsentStatus, DeliveryState, ErrorCode, MessageStatus, RunStatus, TenureError, WaitKind, hop_key

C = RunCommandType
E = Evidence
F = FollowUp


# --- scenarios: what the engine as built does ------------------------------------------------


async def claim_writes_the_run_and_its_delivery(runs: Runs) -> None:
    run_id = await runs.published(unique("claim"))
    assert await runs.ledger.claim(run_id, 0, node="node-a") is not None
    run = await runs.ledger.get(run_id)
    delivery = await runs.ledger.get_delivery(run_id, 0)
    assert run is not None and run.status is RunStatus.RUNNING
    assert delivery is not None and delivery.state is DeliveryState.CLAIMED


async def settle_deletes_the_checkpoint(runs: Runs) -> None:
    run_id = await runs.running(unique("checkpoint"))
    assert await runs.ledger.checkpoints.save(run_id, 0, state={"step": 1})
    assert await runs.ledger.settle(run_id, 0, RunStatus.DONE, result={"ok": True})
    assert await runs.ledger.checkpoints.load(run_id) is None


async def settle_sweeps_pending_consents(runs: Runs) -> None:
    run_id = await runs.running(unique("sweep"))
    consent = await runs.ledger.consents.create(run_id, tool_name="shell", tool_call_id="call-1", payload={})
    assert await runs.ledger.settle(run_id, 0, RunStatus.FAILED, error="gave up")
    stored = await runs.ledger.consents.get(consent.consent_id)
    assert stored is not None and stored.status is ConsentStatus.CANCELLED


async def settle_sweeps_waiting_receives(runs: Runs) -> None:
    run_id = await runs.running(unique("receives"))
    waiting = await runs.ledger.messages.receive(run_id, 0, "go", key="@1")
    assert await runs.ledger.settle(run_id, 0, RunStatus.DONE)
    stored = await runs.ledger.messages.get(waiting.slot_id)
    assert stored is not None and stored.status is MessageStatus.CANCELLED


async def an_uncontained_settle_records_its_outcome(runs: Runs) -> None:
    run_id = await runs.running(unique("uncontained"))
    await runs.job(run_id)
    outcome = RecordedOutcome(0, RunStatus.DONE, '{"ok":true}', None)
    with pytest.raises(TenureError) as refused:
        await runs.ledger.engine.settle(run_id, outcome, record=True)
    assert refused.value.code is ErrorCode.RUN_CONTAINMENT_UNPROVEN
    assert await runs.ledger.checkpoints.outcome(run_id) == outcome


async def a_timer_park_binds_its_checkpoint(runs: Runs) -> None:
    run_id = await runs.running(unique("timer"))
    assert await runs.ledger.park_timer(run_id, 0, name="nap", state={"step": 2}, delay_s=3600)
    checkpoint = await runs.ledger.checkpoints.load(run_id)
    assert checkpoint is not None and (checkpoint.owner_kind, checkpoint.owner_id) == (WaitKind.TIMER, "nap")
    assert checkpoint.state == {"step": 2}


async def a_contained_settle_applies(runs: Runs) -> None:
    run_id = await runs.running(unique("contained"))
    assert await runs.ledger.settle(run_id, 0, RunStatus.DONE)


async def a_park_on_its_own_consent_applies_and_its_verdict_resumes_it(runs: Runs) -> None:
    run_id = await runs.running(unique("park"))
    consent = await runs.ledger.consents.create(run_id, tool_name="shell", tool_call_id="call-1", payload={})
    assert await runs.ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent.consent_id)
    assert await runs.ledger.consents.decide(consent.consent_id, ConsentStatus.GRANTED, decided_by="alice")
    assert await runs.ledger.resume(run_id, owner_id=consent.consent_id) == 1


async def a_resume_and_publish_publishes_the_resumed_hop(runs: Runs) -> None:
    run_id = await runs.running(unique("publish"))
    consent = await runs.ledger.consents.create(run_id, tool_name="shell", tool_call_id="call-1", payload={})
    assert await runs.ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent.consent_id)
    assert await runs.ledger.consents.decide(consent.consent_id, ConsentStatus.GRANTED, decided_by="alice")
    assert await resume_and_publish(runs.ledger, runs.broker, run_id, owner_id=consent.consent_id) == 1
    assert hop_key(run_id, 1) in runs.broker.jobs


Scenario = Callable[[Runs], Awaitable[None]]


# --- breakages ----------------------------------------------------------------------------------


def _only_the_run(pair: Any) -> list[tuple[Any, Any]]:
    return [(RUNS_BINDING, pair.run)]


def _only_the_deliveries(pair: Any) -> list[tuple[Any, Any]]:
    return [(DELIVERIES_BINDING, delivery) for delivery in pair.deliveries]


def _follow_ups(command: RunCommandType, replies: dict[Any, tuple[FollowUp, ...]]) -> Callable[[pytest.MonkeyPatch], None]:
    return lambda patch: patch.setitem(aggregate.FOLLOW_UPS, command, replies)


def _reads(command: RunCommandType, reads: tuple[Evidence, ...]) -> Callable[[pytest.MonkeyPatch], None]:
    return lambda patch: patch.setitem(aggregate.READS, command, reads)


BREAKAGES: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], Scenario]] = {
    # (a) a part of the aggregate not compared-and-set
    "the_cas_skips_the_delivery": (lambda patch: patch.setattr(engine_module, "_parts", _only_the_run),
                                   claim_writes_the_run_and_its_delivery),
    "the_cas_skips_the_run": (lambda patch: patch.setattr(engine_module, "_parts", _only_the_deliveries),
                              claim_writes_the_run_and_its_delivery),
    # (b) a follow-up lost
    "a_settle_loses_its_checkpoint_delete": (_follow_ups(C.SETTLE, {Settled: (F.SWEEP_CONSENTS,)}),
                                             settle_deletes_the_checkpoint),
    "a_settle_loses_its_consent_sweep": (_follow_ups(C.SETTLE, {Settled: (F.DELETE_CHECKPOINT,)}),
                                         settle_sweeps_pending_consents),
    "a_settle_loses_its_receive_sweep": (_follow_ups(C.SETTLE, {Settled: (F.SWEEP_CONSENTS, F.DELETE_CHECKPOINT),
                                                             RunRefusal.CONTAINMENT_UNPROVEN: (F.RECORD_OUTCOME,)}),
                                         settle_sweeps_waiting_receives),
    "a_refused_settle_loses_its_outcome_record": (_follow_ups(C.SETTLE, {Settled: (F.SWEEP_CONSENTS, F.DELETE_CHECKPOINT)}),
                                                  an_uncontained_settle_records_its_outcome),
    "a_timer_park_loses_its_checkpoint": (_follow_ups(C.PARK, {}), a_timer_park_binds_its_checkpoint),
    "a_resume_loses_its_publication": (_follow_ups(C.RESUME, {}), a_resume_and_publish_publishes_the_resumed_hop),
    # (c) a declaration naming the wrong evidence
    "a_settle_does_not_count_containment": (_reads(C.SETTLE, (E.PAIR,)),
                                                            a_contained_settle_applies),
    "a_park_reads_the_run_owner_instead_of_the_named_one": (_reads(C.PARK, (E.PAIR, E.RUN_OWNER, E.CLOCK)),
                                                            a_park_on_its_own_consent_applies_and_its_verdict_resumes_it),
    "a_resume_reads_no_owner": (_reads(C.RESUME, (E.PAIR,)),
                                                            a_park_on_its_own_consent_applies_and_its_verdict_resumes_it),
}


@pytest.mark.parametrize("name", sorted(BREAKAGES))
async def test_each_scenario_holds_on_the_run_engine_as_built(runs: Runs, name: str) -> None:
    await BREAKAGES[name][1](runs)


@pytest.mark.parametrize("name", sorted(BREAKAGES))
async def test_each_broken_run_engine_is_caught_by_its_scenario(runs: Runs, name: str) -> None:
    breakage, scenario = BREAKAGES[name]
    with broken(breakage), pytest.raises((AssertionError, TenureError)):
        await scenario(runs)
