"""The recovery table: total, the same as specs/recovery.md both ways, and every verdict
keeps the recovery rules (REC-1 ... REC-13) over generated situations."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import paths
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure.conformance.strategies.pools import BOOLEANS, integers, optional, sampled
from tenure.conformance.strategies.runs import NODES, NOW, base_run, delivery_for
from tenure.kernel.recovery import table
from tenure.kernel.recovery.table import Action, Case, Pass, Probe, Reason, Situation, decide, verdict_violations
from tenure.kernel.runs.commands import Containment, OwnerEvidence
from tenure.model import BrokerJobState, DeliveryState, RunStatus, WaitKind

SPEC = paths.ROOT / "specs" / "recovery.md"


def _spec_rows() -> list[tuple[str, str, str, str]]:
    rows = []
    for line in SPEC.read_text().splitlines():
        cells = [cell.strip().replace("`", "") for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and line.startswith("| `"):
            rows.append(tuple(cells))
    return rows  # type: ignore[return-value]


def _kernel_rows() -> list[tuple[str, str, str, str]]:
    return [
        (case.value, ", ".join(phase.value for phase in phases), rule.guard,
         rule.action.value + (f" {rule.reason.value}" if rule.reason else ""))
        for case, phases, rules in table.ROWS for rule in rules
    ]


def test_the_spec_rules_are_the_kernel_rules_in_the_same_order() -> None:
    assert _spec_rows() == _kernel_rows()


def test_every_case_and_pass_has_rules_ending_in_always_and_every_guard_is_named() -> None:
    for case in Case:
        for phase in Pass:
            rules = table.TABLE[(case, phase)]
            assert rules and rules[-1].guard == "always", (case, phase)
    used = {rule.guard for rules in table.TABLE.values() for rule in rules}
    assert used == set(table.GUARDS)
    spec = SPEC.read_text()
    for guard in table.GUARDS:
        assert re.search(rf"`{guard}`", spec), guard
    for rule_name in ("REC-1", "REC-2", "REC-3", "REC-4", "REC-5", "REC-6", "REC-7", "REC-8", "REC-9", "REC-10", "REC-11", "REC-12"):
        assert f"**{rule_name}**" in spec


CUTOFF = NOW
STALE = 240_000_000


def _probes(queue: str, priority: int) -> st.SearchStrategy[Probe | None]:
    return _built(("probe", queue, priority), lambda: st.none() | st.builds(
        Probe, optional(sampled(BrokerJobState)),
        optional(sampled([CUTOFF - STALE - 10, CUTOFF - 10, CUTOFF + 10])),
        optional(sampled([queue, "elsewhere"])), optional(sampled([100 - priority, 3]))))


def _owners(run_id: str) -> st.SearchStrategy[OwnerEvidence | None]:
    return _built(("owner", run_id), lambda: st.none() | st.builds(
        OwnerEvidence, sampled(WaitKind), sampled(["owner-1", "x"]), sampled([run_id, "run-2"]),
        sampled(["granted", "pending", "succeeded", "cancelled"]), BOOLEANS))


def _outcomes(seq: int) -> st.SearchStrategy[tuple[RunStatus, int] | None]:
    return _built(("outcome", seq), lambda: st.none() | st.tuples(
        sampled([RunStatus.DONE, RunStatus.FAILED, RunStatus.RUNNING]), sampled([seq, seq + 1, max(0, seq - 1)])))


_BUILT: dict[tuple[object, ...], st.SearchStrategy[Any]] = {}


def _built(key: tuple[object, ...], build: Callable[[], st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """A strategy that depends on drawn values, built once per value (see
    conformance/strategies/pools.py: building it in every draw cost a third of the CPU)."""
    if key not in _BUILT:
        _BUILT[key] = build()
    return _BUILT[key]


_LATEST_OWNERS = st.none() | st.tuples(sampled([WaitKind.CONSENT, WaitKind.DELEGATE, WaitKind.SERVICE]),
                                       sampled(["owner-1", "owner-2"]))
_CHECKPOINT_OWNERS = optional(sampled(["owner-1", "owner-2"]))
_NOW_VALUES = optional(sampled([NOW - 1, NOW, NOW + 1]))


@st.composite
def situations(draw: st.DrawFn) -> Situation:
    status = draw(sampled(RunStatus))
    seq = draw(integers(0, 2))
    node = draw(sampled(NODES))
    run = base_run(status=status, enqueue_seq=seq, started_at_us=NOW - 500 if seq or status is not RunStatus.QUEUED
                   else None, node=node if seq or status is not RunStatus.QUEUED else None,
                   admitted_node=draw(sampled([None, *NODES])))
    allowed = draw(sampled([0, 0, 1, 2]))
    run = dataclasses.replace(run, max_hop_retries=allowed, hop_retries=draw(integers(0, allowed)))
    if status in (RunStatus.AWAITING_CONSENT, RunStatus.AWAITING_DELEGATE, RunStatus.AWAITING_SERVICE):
        kind = {RunStatus.AWAITING_CONSENT: WaitKind.CONSENT, RunStatus.AWAITING_DELEGATE: WaitKind.DELEGATE,
                RunStatus.AWAITING_SERVICE: WaitKind.SERVICE}[status]
        run = dataclasses.replace(run, owner_kind=kind, owner_id="owner-1")
    if status is RunStatus.AWAITING_TIMER:
        run = dataclasses.replace(run, owner_kind=WaitKind.TIMER, owner_id="sleep:0", wake_at_us=NOW)
    state = draw(sampled(DeliveryState))
    delivery = None if draw(integers(0, 15)) == 0 else delivery_for(
        run, state, claimed_by=draw(sampled(NODES)) if state is DeliveryState.CLAIMED else None,
        claimed_at_us=draw(sampled([CUTOFF - 10, CUTOFF + 10])) if state is DeliveryState.CLAIMED else None,
        created_at_us=draw(sampled([CUTOFF - 10, CUTOFF + 10])),
        queue=draw(sampled([run.queue, run.queue, "elsewhere"])))
    phase = draw(sampled(Pass))
    probe = draw(_probes(run.queue, run.priority))
    latest = draw(_LATEST_OWNERS)
    owner = draw(_owners(run.run_id))
    return Situation(
        phase=phase, run=run, delivery=delivery, node=node if phase is Pass.RECONCILE else None,
        cutoff_us=CUTOFF if phase is Pass.RECONCILE else None, stale_after_us=STALE, queue_known=draw(BOOLEANS),
        probe=probe, fenced=draw(BOOLEANS), checkpoint_asked=draw(BOOLEANS),
        checkpoint_owner=draw(_CHECKPOINT_OWNERS), latest_owner=latest, owner=owner,
        containment=Containment(draw(integers(0, 1)), draw(integers(0, 1))), contained=draw(BOOLEANS),
        observed=draw(BOOLEANS),
        outcome=draw(_outcomes(seq)),
        now_us=draw(_NOW_VALUES),
    )


@settings(max_examples=3000, deadline=None)
@given(situations())
def test_every_verdict_keeps_the_recovery_rules(situation: Situation) -> None:
    verdict = decide(situation)
    assert verdict_violations(situation, verdict) == []
    assert (verdict.action is Action.REPORT) == (verdict.reason is not None)


def test_a_timer_wait_resumes_exactly_once_its_due_time_is_reached() -> None:
    run = base_run(status=RunStatus.AWAITING_TIMER, started_at_us=NOW - 500, node=NODES[0],
                   owner_kind=WaitKind.TIMER, owner_id="sleep:0", wake_at_us=NOW)
    delivery = delivery_for(run, DeliveryState.SETTLED, was_claimed=True)
    for phase in Pass:
        waiting = Situation(phase=phase, run=run, delivery=delivery, node=NODES[0] if phase is Pass.RECONCILE
                            else None, cutoff_us=CUTOFF if phase is Pass.RECONCILE else None,
                            stale_after_us=STALE, queue_known=True)
        assert decide(waiting).action is Action.KEEP  # the clock was not read: nothing is due
        assert decide(dataclasses.replace(waiting, now_us=NOW - 1)).action is Action.KEEP
        assert decide(dataclasses.replace(waiting, now_us=NOW)).action is Action.RESUME
        assert decide(dataclasses.replace(waiting, now_us=NOW + 10**9)).action is Action.RESUME


def _orphan(**changes: object) -> Situation:
    run = base_run(status=RunStatus.RUNNING, started_at_us=CUTOFF - 100, node=NODES[0])
    # Claimed by a hop's claimant token: the Run's node says whose hop it is.
    delivery = delivery_for(run, DeliveryState.CLAIMED, claimed_by="hop-token-1", claimed_at_us=CUTOFF - 50)
    fields: dict[str, object] = dict(phase=Pass.RECONCILE, run=run, delivery=delivery, node=NODES[0],
                                     cutoff_us=CUTOFF, stale_after_us=STALE, queue_known=True)
    fields.update(changes)
    return Situation(**fields)  # type: ignore[arg-type]


def test_an_orphan_is_fenced_then_reparked_on_exact_checkpoint_evidence_else_contained_then_failed_lost() -> None:
    assert decide(_orphan()) == table.Verdict(Action.FENCE, f"run:{_orphan().run.run_id}:0", terminal=True)
    fenced = _orphan(fenced=True, probe=Probe(BrokerJobState.ABORTED))
    assert decide(dataclasses.replace(fenced, fenced=True, probe=Probe(BrokerJobState.ACTIVE, 1))).reason \
        is Reason.ORPHAN_UNFENCED
    assert decide(fenced).action is Action.ASK_CHECKPOINT
    asked = dataclasses.replace(fenced, checkpoint_asked=True, checkpoint_owner="c-1",
                                latest_owner=(WaitKind.CONSENT, "c-1"))
    verdict = decide(asked)
    assert verdict.action is Action.REPARK and verdict.owner == (WaitKind.CONSENT, "c-1")
    other = dataclasses.replace(asked, latest_owner=(WaitKind.CONSENT, "c-2"))
    assert decide(other).action is Action.FAIL_LOST
    opened = dataclasses.replace(other, containment=Containment(1, 0))
    assert decide(opened).action is Action.CONTAIN
    assert decide(dataclasses.replace(opened, contained=True)).reason is Reason.CONTAINMENT_UNPROVEN


def test_another_nodes_hop_and_this_boots_hop_are_left_and_a_relay_never_fails_held() -> None:
    assert decide(_orphan(node=NODES[1])).action is Action.LEAVE
    late = _orphan()
    late = dataclasses.replace(late, delivery=dataclasses.replace(late.delivery, claimed_at_us=CUTOFF + 1))
    assert decide(late).action is Action.LEAVE
    run = base_run()
    held = delivery_for(run, DeliveryState.HELD, created_at_us=CUTOFF - 1)
    reconcile = _orphan(run=run, delivery=held)
    assert decide(reconcile).action is Action.FAIL_HELD
    assert decide(dataclasses.replace(reconcile, phase=Pass.RELAY, node=None, cutoff_us=None)).action is Action.KEEP
    foreign = dataclasses.replace(reconcile, run=dataclasses.replace(run, admitted_node=NODES[1]))
    assert decide(foreign).action is Action.KEEP


def test_a_queued_hop_is_published_republished_rotated_or_fenced_by_what_the_broker_says() -> None:
    run = base_run()
    pending = _orphan(run=run, delivery=delivery_for(run, DeliveryState.PENDING))
    published = dataclasses.replace(pending, delivery=delivery_for(run, DeliveryState.PUBLISHED))
    assert decide(pending).action is Action.PROBE
    key = f"run:{run.run_id}:0"
    assert decide(dataclasses.replace(pending, probe=Probe(BrokerJobState.ABSENT))) == table.Verdict(Action.PUBLISH, key)
    assert decide(dataclasses.replace(published, probe=Probe(BrokerJobState.ABSENT))) == table.Verdict(Action.REPUBLISH, key)
    assert decide(dataclasses.replace(published, probe=Probe(BrokerJobState.COMPLETE))).action is Action.ROTATE
    assert decide(dataclasses.replace(pending, probe=Probe(BrokerJobState.QUEUED))).action is Action.MARK_PUBLISHED
    stale = Probe(BrokerJobState.ACTIVE, CUTOFF - STALE - 1)
    assert decide(dataclasses.replace(published, probe=stale)).action is Action.FENCE
    assert decide(dataclasses.replace(published, probe=Probe(BrokerJobState.ACTIVE, CUTOFF - 1))).action is Action.KEEP
    assert decide(dataclasses.replace(published, probe=Probe(BrokerJobState.ACTIVE))).reason is Reason.START_TIME_UNKNOWN
    assert decide(dataclasses.replace(published, queue_known=False)).reason is Reason.QUEUE_UNKNOWN
    assert decide(dataclasses.replace(published, probe=Probe(None))).reason is Reason.BROKER_UNPROBEABLE
    relay = dataclasses.replace(published, phase=Pass.RELAY, node=None, cutoff_us=None, probe=stale)
    assert decide(relay).action is Action.KEEP
    assert decide(dataclasses.replace(published, probe=stale)).terminal  # a dead process's broker job


def test_only_a_dead_processs_hop_is_fenced_terminally() -> None:
    mine = _orphan()
    cancelling = dataclasses.replace(mine, run=dataclasses.replace(mine.run, status=RunStatus.CANCELLING))
    assert decide(cancelling) == table.Verdict(Action.FENCE, f"run:{mine.run.run_id}:0", terminal=True)
    for live in (dataclasses.replace(cancelling, node=NODES[1]),  # another node's hop
                 dataclasses.replace(cancelling, delivery=dataclasses.replace(mine.delivery, claimed_at_us=CUTOFF + 1))):
        verdict = decide(live)
        assert verdict.action is Action.FENCE and not verdict.terminal
    assert verdict_violations(live, dataclasses.replace(verdict, terminal=True)) == ["REC-9"]


def test_a_dead_hop_that_recorded_its_outcome_is_settled_with_it_after_fence_and_containment() -> None:
    fenced = _orphan(fenced=True, probe=Probe(BrokerJobState.ABORTED), checkpoint_asked=True,
                     checkpoint_owner="c-1", latest_owner=(WaitKind.CONSENT, "c-1"),
                     outcome=(RunStatus.DONE, 0))
    assert decide(fenced).action is Action.SETTLE_RECORDED  # before the re-park: the workflow finished
    opened = dataclasses.replace(fenced, containment=Containment(0, 1))
    assert decide(opened).action is Action.CONTAIN
    assert decide(dataclasses.replace(opened, contained=True)).reason is Reason.CONTAINMENT_UNPROVEN
    older = dataclasses.replace(fenced, outcome=(RunStatus.DONE, 1))  # another hop's outcome
    assert decide(older).action is Action.REPARK
    live = dataclasses.replace(fenced, probe=Probe(BrokerJobState.ACTIVE, 1))
    assert decide(live).reason is Reason.ORPHAN_UNFENCED
    assert verdict_violations(older, table.Verdict(Action.SETTLE_RECORDED)) == ["REC-10"]
    assert verdict_violations(fenced, table.Verdict(Action.FAIL_LOST)) == ["REC-10"]
    relay = dataclasses.replace(fenced, phase=Pass.RELAY, node=None, cutoff_us=None)
    assert decide(relay).action is Action.LEAVE


def test_a_lost_hop_of_a_workflow_that_allows_retries_runs_again_until_none_is_left() -> None:
    run = dataclasses.replace(_orphan().run, max_hop_retries=2, hop_retries=1)
    fenced = _orphan(run=run, fenced=True, probe=Probe(BrokerJobState.ABORTED), checkpoint_asked=True)
    assert decide(fenced).action is Action.RETRY_LOST
    spent = dataclasses.replace(fenced, run=dataclasses.replace(run, hop_retries=2))
    assert decide(spent).action is Action.FAIL_LOST
    assert verdict_violations(spent, table.Verdict(Action.RETRY_LOST)) == ["REC-11"]
    assert verdict_violations(fenced, table.Verdict(Action.FAIL_LOST)) == ["REC-11"]
    # An open delegated job is carried into the hop that runs again (REC-13): never cancelled first.
    with_job = dataclasses.replace(fenced, containment=Containment(1, 0))
    assert decide(with_job).action is Action.RETRY_LOST
    assert verdict_violations(with_job, table.Verdict(Action.CONTAIN)) == ["REC-13"]
    # An open service attempt is stopped first (only the attempts), and until it ended the
    # Run is reported, not retried.
    with_attempt = dataclasses.replace(fenced, containment=Containment(1, 1))
    assert decide(with_attempt).action is Action.CONTAIN_ATTEMPTS
    assert verdict_violations(with_attempt, table.Verdict(Action.RETRY_LOST)) == ["REC-6"]
    still_open = dataclasses.replace(with_attempt, contained=True)
    assert decide(still_open) == table.Verdict(Action.REPORT, reason=table.Reason.CONTAINMENT_UNPROVEN)
    assert decide(dataclasses.replace(still_open, containment=Containment(1, 0))).action is Action.RETRY_LOST
    # Without a retry left, everything is contained before the Run fails lost.
    spent_open = dataclasses.replace(with_job, run=dataclasses.replace(run, hop_retries=2))
    assert decide(spent_open).action is Action.CONTAIN
    assert verdict_violations(spent_open, table.Verdict(Action.CONTAIN_ATTEMPTS)) == ["REC-13"]
    unfenced = dataclasses.replace(fenced, fenced=False)
    assert "REC-4" in verdict_violations(unfenced, table.Verdict(Action.RETRY_LOST))


# --- the admitting node, stored by the ledger (what reconcile's held rule reads) ----------


async def test_an_admission_records_its_node_and_a_replay_keeps_the_stored_one(db_url: str) -> None:
    import pytest

    from tenure.adapters import RunLedger
    from tenure.model import ConfigValidationError, RunIntent, WorkflowPin

    intent = RunIntent("session-1", "api", "alice", frozenset(), {"prompt": "hi"}, None)
    pin = WorkflowPin("answer", "r1", "sha256:workflow")
    async with RunLedger(db_url) as ledger:
        first = await ledger.admit(intent, workflow=pin, queue="runs", priority=50, idempotency_key="k", hold=True,
                                   node="node-a")
        again = await ledger.admit(intent, workflow=pin, queue="runs", priority=50, idempotency_key="k", hold=True,
                                   node="node-b")
        plain = await ledger.admit(intent, workflow=pin, queue="runs", priority=50)
        assert first.created and not again.created
        assert first.run.admitted_node == "node-a" and again.run.admitted_node == "node-a"
        stored = await ledger.get(first.run.run_id)
        assert stored is not None and stored.admitted_node == "node-a"
        assert plain.run.admitted_node is None
        with pytest.raises(ConfigValidationError):
            await ledger.admit(intent, workflow=pin, queue="runs", priority=50, node="")  # type: ignore[arg-type]
