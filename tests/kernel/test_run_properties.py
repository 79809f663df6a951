"""The Run, consent and delegated-job kernels: properties of every decision over generated
situations, and each guarantee of specs/runs.md, specs/consent.md and specs/agent_jobs.md
as a plain example a reviewer can read. The mutants of these machines in
kernel_mutants.py must make this file fail."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure.conformance.strategies.agent_jobs import job_row, job_situations, result_for
from tenure.conformance.strategies.consents import consent_records, consent_row, consent_situations
from tenure.conformance.strategies.runs import RUN_ID, base_run, delivery_for, run_commands, run_situations
from tenure.kernel.agent_jobs.commands import (
    AdoptResult,
    AdvanceJob,
    AgentJobCommandType,
    RecordCancelled,
    SubmitJob,
    Submitted,
)
from tenure.kernel.agent_jobs.machine import AGENT_JOBS, AgentJobRefusal
from tenure.kernel.agent_jobs.record import AgentJobRow
from tenure.kernel.consents.commands import CancelPending, ConsentCommandType, CreateConsent, DecideConsent
from tenure.kernel.consents.machine import CONSENTS, DEADLINE_OWNER, PREAUTHORIZED_BY, ConsentRefusal
from tenure.kernel.consents.record import ConsentRow, ConsentStep
from tenure.kernel.core import Applied, Decision, Machine, Refused, decide
from tenure.kernel.runs import finders
from tenure.kernel.runs.commands import (
    Admit,
    Admitted,
    BeginCancel,
    Claim,
    Claimed,
    Containment,
    EnterHardwareWait,
    FailHeld,
    FinishCancel,
    LeaveHardwareWait,
    OwnerEvidence,
    Park,
    RecordPublished,
    RecordPublishError,
    Release,
    Resume,
    Resumed,
    RunCommandType,
    Settle,
    Settled,
    Swept,
    Ticket,
    TimedOut,
    TimeOut,
)
from tenure.kernel.runs.machine import CANCELLED_BY, OUTCOMES, RUNS, SETTLED_BY, RunRefusal
from tenure.kernel.runs.record import RunPair, RunRow, key_of
from tenure.model import (
    AgentJobStatus,
    AttemptState,
    BrokerJobState,
    ConsentStatus,
    DeliveryState,
    ErrorCode,
    RunStatus,
    WaitKind,
)

NOW = 1_800_000_000_000_000
CONTAINED = Containment(open_jobs=0, open_attempts=0)

MACHINES: dict[str, tuple[Machine, Any, list[Any]]] = {
    "runs": (RUNS, run_situations, list(RunCommandType)),
    "consent": (CONSENTS, consent_situations, list(ConsentCommandType)),
    "agent_jobs": (AGENT_JOBS, job_situations, list(AgentJobCommandType)),
}
CASES = [(name, kind) for name, (_, _, kinds) in MACHINES.items() for kind in kinds]


# --- properties of every decision -----------------------------------------------------------


@pytest.mark.parametrize(("name", "kind"), CASES, ids=lambda value: getattr(value, "value", value))
@settings(max_examples=60)
@given(data=st.data())
def test_every_decision_from_a_valid_situation_keeps_the_invariants_and_the_transition_rules(
    name: str, kind: Any, data: st.DataObject
) -> None:
    machine, situations, _ = MACHINES[name]
    record, command, now = data.draw(situations(None, kind))
    assert record is None or machine.record_violations(record) == []
    decision = decide(machine, record, command, now)
    assert machine.transition_violations(record, command, now, decision) == []
    if isinstance(decision, Applied):
        assert decision.new_record is not None, "nothing of these machines is ever deleted"
        assert machine.record_violations(decision.new_record) == []
        if name == "runs" and hasattr(command, "enqueue_seq") and decision.new_record != record:
            # Written here, not only in the kernel's rules: a command naming a hop changes
            # only that hop, so nothing an old hop does can touch a later one.
            assert command.enqueue_seq == record.run.enqueue_seq
    else:
        assert decision.reason in machine.outcomes


def _as_stored(pair: RunPair) -> RunPair:
    """What the next command meets after the ledger wrote a decided pair: the Run and
    its current delivery."""
    return RunPair(pair.run, (pair.current,))


@settings(max_examples=150)
@given(data=st.data())
def test_a_run_driven_by_any_command_sequence_keeps_its_invariants_at_every_step(data: st.DataObject) -> None:
    record: RunPair | None = None
    now = NOW
    for _ in range(data.draw(st.integers(1, 14), label="steps")):
        kind = data.draw(st.sampled_from(RunCommandType), label="kind")
        command = data.draw(run_commands(kind, record), label="command")
        now += data.draw(st.integers(-2, 1_000), label="elapsed")
        decision = decide(RUNS, record, command, now)
        assert RUNS.transition_violations(record, command, now, decision) == []
        if isinstance(decision, Applied):
            assert isinstance(decision.new_record, RunPair)
            assert RUNS.record_violations(decision.new_record) == []
            record = _as_stored(decision.new_record)


# --- helpers for the examples ---------------------------------------------------------------


def applied(decision: Decision) -> Any:
    assert isinstance(decision, Applied), decision
    assert decision.new_record is not None
    return decision.new_record


def refused(decision: Decision, reason: Any) -> bool:
    return isinstance(decision, Refused) and decision.reason is reason


def admit(run: RunRow | None = None, *, hold: bool = False, session_busy: bool = False,
          timeout_us: int | None = None) -> Admit:
    row = run if run is not None else base_run(created_at_us=0, updated_at_us=0)
    return Admit(run=row, delivery=delivery_for(row, DeliveryState.PENDING, created_at_us=0), hold=hold,
                 session_busy=session_busy, timeout_us=timeout_us)


def admitted(*, hold: bool = False, timeout_us: int | None = None) -> RunPair:
    return applied(decide(RUNS, None, admit(hold=hold, timeout_us=timeout_us), NOW - 50))


def claimed(seq: int = 0, timeout_us: int | None = None) -> RunPair:
    pair = admitted(timeout_us=timeout_us)
    for _ in range(seq):
        pair = resumed(parked(pair))
    return applied(decide(RUNS, pair, Claim(enqueue_seq=pair.run.enqueue_seq, node="node-a"), NOW))


def consent_of(run: RunPair, status: str = "granted", *, complete: bool = True, run_id: str | None = None,
               owner_id: str = "consent-1") -> OwnerEvidence:
    return OwnerEvidence(WaitKind.CONSENT, owner_id, run.run.run_id if run_id is None else run_id, status, complete)


def parked(pair: RunPair | None = None) -> RunPair:
    pair = claimed() if pair is None else pair
    if pair.run.status is RunStatus.QUEUED:
        pair = applied(decide(RUNS, pair, Claim(enqueue_seq=pair.run.enqueue_seq, node="node-a"), NOW))
    park = Park(enqueue_seq=pair.run.enqueue_seq, wait=WaitKind.CONSENT, owner_id="consent-1",
                owner=consent_of(pair, "pending", complete=False))
    return _as_stored(applied(decide(RUNS, pair, park, NOW)))


def resumed(pair: RunPair) -> RunPair:
    return _as_stored(applied(decide(RUNS, pair, Resume(owner_id="consent-1", owner=consent_of(pair)), NOW)))


def cancelling(pair: RunPair | None = None) -> RunPair:
    return applied(decide(RUNS, claimed() if pair is None else pair, BeginCancel(), NOW))


# --- admission ------------------------------------------------------------------------------


def test_admission_creates_a_queued_run_with_delivery_zero_held_only_while_the_caller_holds_context() -> None:
    for hold, state in ((False, DeliveryState.PENDING), (True, DeliveryState.HELD)):
        decision = decide(RUNS, None, admit(hold=hold), NOW)
        pair = applied(decision)
        assert (pair.run.status, pair.run.enqueue_seq, pair.current.state) == (RunStatus.QUEUED, 0, state)
        assert (pair.current.delivery_id, pair.current.resume, pair.current.publish_attempts) == (
            key_of(RUN_ID, 0), False, 0)
        assert pair.run.created_at_us == pair.run.updated_at_us == NOW
        assert decision.reply == Admitted(created=True)  # type: ignore[union-attr]


def test_a_replay_answers_the_stored_run_and_keeps_its_route_when_the_router_now_chooses_another() -> None:
    stored = applied(decide(RUNS, claimed(), EnterHardwareWait(enqueue_seq=0), NOW))
    rerouted = base_run(queue="runs-fast", priority=90, created_at_us=0, updated_at_us=0)
    decision = decide(RUNS, stored, admit(rerouted), NOW + 5)
    assert applied(decision) == stored
    assert decision.reply == Admitted(created=False)  # type: ignore[union-attr]


def test_a_replay_with_another_key_or_another_intent_conflicts() -> None:
    stored = admitted()
    other_key = decide(RUNS, stored, admit(base_run(idempotency_key="key-2")), NOW)
    other_intent = decide(RUNS, stored, admit(base_run(intent_digest="sha256:" + "e" * 64)), NOW)
    assert refused(other_key, RunRefusal.KEY_REUSED) and refused(other_intent, RunRefusal.INTENT_CHANGED)
    assert OUTCOMES[RunRefusal.KEY_REUSED] is OUTCOMES[RunRefusal.INTENT_CHANGED] is ErrorCode.RUN_ADMISSION_CONFLICT


def test_a_replay_of_a_held_admission_without_admission_context_fails_loudly() -> None:
    held = admitted(hold=True)
    assert refused(decide(RUNS, held, admit(hold=False), NOW), RunRefusal.ADMISSION_HELD)
    assert OUTCOMES[RunRefusal.ADMISSION_HELD] is ErrorCode.RUN_ADMISSION_HELD
    assert applied(decide(RUNS, held, admit(hold=True), NOW)) == held


def test_the_session_fence_refuses_a_second_nonterminal_run_but_not_a_replay() -> None:
    assert refused(decide(RUNS, None, admit(session_busy=True), NOW), RunRefusal.SESSION_BUSY)
    assert OUTCOMES[RunRefusal.SESSION_BUSY] is ErrorCode.RUN_SESSION_BUSY
    stored = admitted()
    assert applied(decide(RUNS, stored, admit(session_busy=True), NOW)) == stored


def test_a_held_admission_is_released_or_failed_only_for_its_exact_sequence() -> None:
    held = admitted(hold=True)
    assert refused(decide(RUNS, held, Release(enqueue_seq=1), NOW), RunRefusal.STALE_HOP)
    assert applied(decide(RUNS, held, Release(enqueue_seq=0), NOW)).current.state is DeliveryState.PENDING
    failed = applied(decide(RUNS, held, FailHeld(enqueue_seq=0, error="retention_failed"), NOW))
    assert (failed.run.status, failed.run.error, failed.current.state) == (
        RunStatus.FAILED, "retention_failed", DeliveryState.SETTLED)
    released = applied(decide(RUNS, held, Release(enqueue_seq=0), NOW))
    assert refused(decide(RUNS, released, FailHeld(enqueue_seq=0, error="late"), NOW), RunRefusal.NOT_HELD)


# --- publication and claims -----------------------------------------------------------------


def test_a_held_delivery_can_be_neither_published_nor_claimed() -> None:
    held = admitted(hold=True)
    assert refused(decide(RUNS, held, RecordPublished(enqueue_seq=0), NOW), RunRefusal.NOT_PUBLISHABLE)
    assert refused(decide(RUNS, held, Claim(enqueue_seq=0, node="node-a"), NOW), RunRefusal.NOT_PUBLISHABLE)


def test_publish_attempts_count_every_recorded_call_and_an_acknowledgement_clears_the_error() -> None:
    pair = admitted()
    pair = applied(decide(RUNS, pair, RecordPublishError(enqueue_seq=0, error="publish_failed:Timeout"), NOW))
    assert (pair.current.state, pair.current.publish_attempts, pair.current.last_error) == (
        DeliveryState.PENDING, 1, "publish_failed:Timeout")
    pair = applied(decide(RUNS, pair, RecordPublished(enqueue_seq=0), NOW + 1))
    assert (pair.current.state, pair.current.publish_attempts, pair.current.last_error) == (
        DeliveryState.PUBLISHED, 2, None)
    pair = applied(decide(RUNS, pair, RecordPublished(enqueue_seq=0), NOW + 2))
    assert (pair.current.state, pair.current.publish_attempts) == (DeliveryState.PUBLISHED, 3)


def test_an_acknowledgement_that_arrives_after_the_hop_was_claimed_changes_nothing() -> None:
    pair = claimed()
    assert refused(decide(RUNS, pair, RecordPublished(enqueue_seq=0), NOW + 1), RunRefusal.NOT_QUEUED)
    assert refused(decide(RUNS, pair, RecordPublishError(enqueue_seq=0, error="late"), NOW + 1),
                   RunRefusal.NOT_QUEUED)
    assert OUTCOMES[RunRefusal.NOT_QUEUED] is None


@pytest.mark.parametrize("seq", [1, 2])
def test_a_claim_for_another_sequence_is_refused_as_a_stale_hop_and_changes_nothing(seq: int) -> None:
    pair = resumed(parked())  # queued at sequence 1
    stale = pair.run.enqueue_seq - 1 if seq == 1 else pair.run.enqueue_seq + 1
    assert refused(decide(RUNS, pair, Claim(enqueue_seq=stale, node="node-b"), NOW), RunRefusal.STALE_HOP)
    fresh = admitted()
    assert refused(decide(RUNS, fresh, Claim(enqueue_seq=seq, node="node-b"), NOW), RunRefusal.STALE_HOP)


def test_a_claim_by_a_worker_that_does_not_serve_the_runs_version_changes_nothing() -> None:
    """A rolling deploy: a worker names the (name, version) pairs it serves; a Run pinned
    to another version is left exactly as it was (no hop spent, nothing recorded), and a
    worker serving it, or one that names nothing, claims it."""
    for pair in (admitted(), resumed(parked(claimed()))):
        run = pair.run
        pin = (run.workflow_name, run.workflow_revision)
        for others in ((), ((run.workflow_name, run.workflow_revision + "-next"),), (("other", run.workflow_revision),)):
            command = Claim(enqueue_seq=run.enqueue_seq, node="node-b", serves=others)
            decision = decide(RUNS, pair, command, NOW)
            assert refused(decision, RunRefusal.NOT_SERVED)
        assert OUTCOMES[RunRefusal.NOT_SERVED] is None
        for serves in ((pin,), (("other", "1"), pin), None):
            taken = applied(decide(RUNS, pair, Claim(enqueue_seq=run.enqueue_seq, node="node-b", serves=serves), NOW))
            assert (taken.run.status, taken.current.state) == (RunStatus.RUNNING, DeliveryState.CLAIMED)
    # The sequence is checked first: a stale hop of an unserved Run is stale, as any.
    assert refused(decide(RUNS, admitted(), Claim(enqueue_seq=1, node="node-b", serves=()), NOW), RunRefusal.STALE_HOP)


def test_a_duplicate_claim_of_the_same_hop_finds_nothing_to_claim() -> None:
    pair = claimed()
    assert refused(decide(RUNS, pair, Claim(enqueue_seq=0, node="node-b"), NOW + 1), RunRefusal.NOT_QUEUED)


def test_a_claim_sent_again_by_its_claimant_is_answered_with_the_claim_it_made_and_nobody_else_is() -> None:
    """A claim whose COMMIT applied but went unacknowledged is sent again with the same
    claimant token: it gets the claim it made, unchanged; another claimant, a claim
    without a token, the same token for another sequence, or a Run no longer running
    (hardware wait, parked, cancelling) get nothing."""
    pair = admitted()
    first = decide(RUNS, pair, Claim(enqueue_seq=0, node="node-a", claimant="hop-1"), NOW)
    held = applied(first)
    assert (held.current.claimed_by, held.run.node) == ("hop-1", "node-a")
    again = decide(RUNS, held, Claim(enqueue_seq=0, node="node-a", claimant="hop-1"), NOW + 5)
    assert applied(again) == held and again.reply == first.reply == Claimed(enqueue_seq=0, resume=False)  # type: ignore[union-attr]
    for other in (Claim(enqueue_seq=0, node="node-a", claimant="hop-2"), Claim(enqueue_seq=0, node="node-a"),
                  Claim(enqueue_seq=0, node="node-b", claimant="node-a")):
        assert refused(decide(RUNS, held, other, NOW + 5), RunRefusal.NOT_QUEUED)
    hardware = applied(decide(RUNS, held, EnterHardwareWait(enqueue_seq=0), NOW + 5))
    for moved in (hardware, parked(held), cancelling(held)):
        assert refused(decide(RUNS, moved, Claim(enqueue_seq=0, node="node-a", claimant="hop-1"), NOW + 9),
                       RunRefusal.NOT_QUEUED)
    later = applied(decide(RUNS, resumed(parked(held)), Claim(enqueue_seq=1, node="node-a", claimant="hop-3"), NOW))
    assert refused(decide(RUNS, later, Claim(enqueue_seq=0, node="node-a", claimant="hop-3"), NOW + 9),
                   RunRefusal.NOT_QUEUED)


def test_a_claim_keeps_the_first_start_across_hops_and_takes_resume_from_the_delivery() -> None:
    first = claimed()
    decision = decide(RUNS, first, Claim(enqueue_seq=0, node="node-a"), NOW)
    assert refused(decision, RunRefusal.NOT_QUEUED)
    again = resumed(parked(first))
    decision = decide(RUNS, again, Claim(enqueue_seq=1, node="node-b"), NOW + 1_000)
    second = applied(decision)
    assert decision.reply == Claimed(enqueue_seq=1, resume=True)  # type: ignore[union-attr]
    assert (second.run.started_at_us, second.run.node) == (first.run.started_at_us, "node-b")
    assert (second.current.state, second.current.claimed_by) == (DeliveryState.CLAIMED, "node-b")


# --- hardware waits, parks and resumes --------------------------------------------------------


def test_a_hardware_wait_keeps_the_claim_and_comes_back_to_running() -> None:
    waiting = applied(decide(RUNS, claimed(), EnterHardwareWait(enqueue_seq=0), NOW))
    assert (waiting.run.status, waiting.current.state) == (RunStatus.AWAITING_HARDWARE, DeliveryState.CLAIMED)
    assert applied(decide(RUNS, waiting, LeaveHardwareWait(enqueue_seq=0), NOW)).run.status is RunStatus.RUNNING
    done = applied(decide(RUNS, waiting, Settle(enqueue_seq=0, status=RunStatus.DONE, error=None,
                                               containment=CONTAINED), NOW))
    assert done.run.status is RunStatus.DONE


def test_park_with_kind_hardware_is_refused_use_enter_hardware_wait() -> None:
    park = Park(enqueue_seq=0, wait=WaitKind.HARDWARE, owner_id="gpu-0", owner=None)
    assert refused(decide(RUNS, claimed(), park, NOW), RunRefusal.NOT_AN_OWNER_KIND)


@pytest.mark.parametrize("evidence", ["missing", "other_run", "other_kind", "other_id"])
def test_park_needs_the_owner_row_of_this_run_of_the_kind_named(evidence: str) -> None:
    pair = claimed()
    owner = {
        "missing": None,
        "other_run": consent_of(pair, run_id="run-2"),
        "other_kind": OwnerEvidence(WaitKind.DELEGATE, "consent-1", RUN_ID, "queued", False),
        "other_id": consent_of(pair, owner_id="consent-2"),
    }[evidence]
    park = Park(enqueue_seq=0, wait=WaitKind.CONSENT, owner_id="consent-1", owner=owner)
    assert refused(decide(RUNS, pair, park, NOW), RunRefusal.OWNER_MISMATCH)
    assert OUTCOMES[RunRefusal.OWNER_MISMATCH] is ErrorCode.RUN_OWNER_MISMATCH


@pytest.mark.parametrize(("kind", "status"), [(WaitKind.CONSENT, RunStatus.AWAITING_CONSENT),
                                              (WaitKind.DELEGATE, RunStatus.AWAITING_DELEGATE),
                                              (WaitKind.SERVICE, RunStatus.AWAITING_SERVICE),
                                              (WaitKind.MESSAGE, RunStatus.AWAITING_MESSAGE)])
def test_park_on_an_owner_of_this_run_settles_the_delivery_and_records_the_owner(kind: WaitKind,
                                                                                   status: RunStatus) -> None:
    owner = OwnerEvidence(kind, "owner-1", RUN_ID, "pending", False)
    pair = applied(decide(RUNS, claimed(), Park(enqueue_seq=0, wait=kind, owner_id="owner-1", owner=owner), NOW))
    assert (pair.run.status, pair.run.owner_kind, pair.run.owner_id) == (status, kind, "owner-1")
    assert pair.current.state is DeliveryState.SETTLED


def test_resume_opens_the_next_sequence_with_a_pending_resume_delivery() -> None:
    waiting = parked()
    decision = decide(RUNS, waiting, Resume(owner_id="consent-1", owner=consent_of(waiting, "denied")), NOW)
    pair = applied(decision)
    assert decision.reply == Resumed(enqueue_seq=1)  # type: ignore[union-attr]
    assert (pair.run.status, pair.run.enqueue_seq, pair.run.owner_id) == (RunStatus.QUEUED, 1, None)
    assert [(d.enqueue_seq, d.state, d.resume) for d in pair.deliveries] == [
        (0, DeliveryState.SETTLED, False), (1, DeliveryState.PENDING, True)]
    assert pair.current.delivery_id == key_of(RUN_ID, 1)


def test_a_timer_parks_with_its_due_time_and_only_the_database_clock_at_that_time_resumes_it() -> None:
    due = NOW + 5_000_000
    park = Park(enqueue_seq=0, wait=WaitKind.TIMER, owner_id="sleep:0", owner=None, wake_at_us=due)
    sleeping = applied(decide(RUNS, claimed(), park, NOW))
    assert (sleeping.run.status, sleeping.run.owner_kind, sleeping.run.owner_id, sleeping.run.wake_at_us) == (
        RunStatus.AWAITING_TIMER, WaitKind.TIMER, "sleep:0", due)
    assert sleeping.current.state is DeliveryState.SETTLED
    stored = RunPair(sleeping.run, (sleeping.current,))
    for early in (NOW, due - 1):
        assert refused(decide(RUNS, stored, Resume(owner_id="sleep:0", owner=None), early), RunRefusal.TIMER_NOT_DUE)
    assert refused(decide(RUNS, stored, Resume(owner_id="sleep:1", owner=None), due), RunRefusal.NOT_CURRENT_OWNER)
    for due_or_later in (due, due + 10**9):
        decision = decide(RUNS, stored, Resume(owner_id="sleep:0", owner=None), due_or_later)
        woke = applied(decision)
        assert decision.reply == Resumed(enqueue_seq=1)  # type: ignore[union-attr]
        assert (woke.run.status, woke.run.owner_kind, woke.run.wake_at_us) == (RunStatus.QUEUED, None, None)
        assert RUNS.record_violations(RunPair(woke.run, (woke.current,))) == []
    assert OUTCOMES[RunRefusal.TIMER_NOT_DUE] is None


@pytest.mark.parametrize("wake", [None, 2**62, -(2**62), True, 1.5])
def test_a_timer_park_without_a_due_time_a_record_can_hold_is_refused(wake: Any) -> None:
    park = Park(enqueue_seq=0, wait=WaitKind.TIMER, owner_id="sleep:0", owner=None, wake_at_us=wake)
    assert refused(decide(RUNS, claimed(), park, NOW), RunRefusal.WAKE_INVALID)


def test_another_park_naming_a_due_time_is_refused() -> None:
    owner = OwnerEvidence(WaitKind.CONSENT, "owner-1", RUN_ID, "pending", False)
    park = Park(enqueue_seq=0, wait=WaitKind.CONSENT, owner_id="owner-1", owner=owner, wake_at_us=NOW)
    assert refused(decide(RUNS, claimed(), park, NOW), RunRefusal.WAKE_INVALID)


RESUME_REFUSALS = {
    "another owner": (Resume(owner_id="consent-2", owner=None), RunRefusal.NOT_CURRENT_OWNER),
    "the owner row missing": (Resume(owner_id="consent-1", owner=None), RunRefusal.OWNER_UNDECIDED),
    "a pending consent": (Resume(owner_id="consent-1", owner=OwnerEvidence(
        WaitKind.CONSENT, "consent-1", RUN_ID, "pending", False)), RunRefusal.OWNER_UNDECIDED),
    "a cancelled consent": (Resume(owner_id="consent-1", owner=OwnerEvidence(
        WaitKind.CONSENT, "consent-1", RUN_ID, "cancelled", True)), RunRefusal.OWNER_UNDECIDED),
    "a verdict without its principal": (Resume(owner_id="consent-1", owner=OwnerEvidence(
        WaitKind.CONSENT, "consent-1", RUN_ID, "granted", False)), RunRefusal.OWNER_UNDECIDED),
    "a decided consent of another run": (Resume(owner_id="consent-1", owner=OwnerEvidence(
        WaitKind.CONSENT, "consent-1", "run-2", "granted", True)), RunRefusal.OWNER_UNDECIDED),
    "a decided owner of another kind": (Resume(owner_id="consent-1", owner=OwnerEvidence(
        WaitKind.DELEGATE, "consent-1", RUN_ID, "succeeded", True)), RunRefusal.OWNER_UNDECIDED),
}


@pytest.mark.parametrize("case", sorted(RESUME_REFUSALS))
def test_resume_from_anyone_but_the_current_decided_owner_changes_nothing(case: str) -> None:
    command, reason = RESUME_REFUSALS[case]
    assert refused(decide(RUNS, parked(), command, NOW), reason)
    assert OUTCOMES[reason] is None


def test_a_delegated_wait_resumes_only_on_a_terminal_job_with_a_valid_result_lost_included() -> None:
    pair = claimed()
    park = Park(enqueue_seq=0, wait=WaitKind.DELEGATE, owner_id="job-1",
                owner=OwnerEvidence(WaitKind.DELEGATE, "job-1", RUN_ID, "running", False))
    waiting = applied(decide(RUNS, pair, park, NOW))
    running = Resume(owner_id="job-1", owner=OwnerEvidence(WaitKind.DELEGATE, "job-1", RUN_ID, "running", False))
    assert refused(decide(RUNS, waiting, running, NOW), RunRefusal.OWNER_UNDECIDED)
    lost = Resume(owner_id="job-1", owner=OwnerEvidence(WaitKind.DELEGATE, "job-1", RUN_ID, "lost", True))
    assert applied(decide(RUNS, waiting, lost, NOW)).run.status is RunStatus.QUEUED


def test_resume_of_a_run_that_is_not_waiting_changes_nothing() -> None:
    for pair in (admitted(), claimed(), cancelling(parked())):
        command = Resume(owner_id="consent-1", owner=consent_of(pair))
        assert refused(decide(RUNS, pair, command, NOW), RunRefusal.NOT_WAITING)


# --- settlement and cancellation ------------------------------------------------------------


def settle(seq: int = 0, status: RunStatus = RunStatus.DONE, containment: Containment = CONTAINED) -> Settle:
    return Settle(enqueue_seq=seq, status=status, error="boom" if status is RunStatus.FAILED else None,
                  containment=containment)


def test_settle_needs_the_claimed_sequence_and_proven_containment() -> None:
    pair = claimed()
    assert refused(decide(RUNS, pair, settle(seq=1), NOW), RunRefusal.STALE_HOP)
    for open_effects in (Containment(open_jobs=1, open_attempts=0), Containment(open_jobs=0, open_attempts=1)):
        assert refused(decide(RUNS, pair, settle(containment=open_effects), NOW), RunRefusal.CONTAINMENT_UNPROVEN)
    assert OUTCOMES[RunRefusal.CONTAINMENT_UNPROVEN] is ErrorCode.RUN_CONTAINMENT_UNPROVEN
    decision = decide(RUNS, pair, settle(status=RunStatus.FAILED), NOW)
    failed = applied(decision)
    assert (failed.run.status, failed.run.error, failed.current.state) == (
        RunStatus.FAILED, "boom", DeliveryState.SETTLED)
    assert decision.reply == Settled(SETTLED_BY)  # type: ignore[union-attr]


def test_a_done_settlement_keeps_its_result_and_a_failed_one_keeps_none() -> None:
    pair = claimed()
    done = applied(decide(RUNS, pair, dataclasses.replace(settle(), result_json='{"answer":42}'), NOW))
    assert (done.run.status, done.run.result_json) == (RunStatus.DONE, '{"answer":42}')
    failed = applied(decide(RUNS, pair, settle(status=RunStatus.FAILED), NOW))
    assert (failed.run.status, failed.run.result_json) == (RunStatus.FAILED, None)


def test_a_lost_hop_is_retried_only_fenced_with_its_attempts_ended_and_a_retry_left() -> None:
    from tenure.kernel.runs.commands import RetryLost

    pair = claimed()
    allowed = RunPair(dataclasses.replace(pair.run, max_hop_retries=1), pair.deliveries)
    retry = RetryLost(enqueue_seq=0, hop=BrokerJobState.ABORTED, containment=Containment(0, 0))
    assert refused(decide(RUNS, pair, retry, NOW), RunRefusal.NO_RETRIES_LEFT)  # the default allows none
    assert refused(decide(RUNS, allowed, dataclasses.replace(retry, hop=BrokerJobState.ACTIVE), NOW),
                   RunRefusal.HOP_LIVE)
    assert refused(decide(RUNS, allowed, dataclasses.replace(retry, containment=Containment(0, 1)), NOW),
                   RunRefusal.CONTAINMENT_UNPROVEN)
    # an open delegated job is carried into the next hop, which adopts it by its request
    carried = applied(decide(RUNS, allowed, dataclasses.replace(retry, containment=Containment(1, 0)), NOW))
    assert (carried.run.status, carried.run.enqueue_seq) == (RunStatus.QUEUED, 1)
    again = applied(decide(RUNS, allowed, retry, NOW))
    assert (again.run.status, again.run.enqueue_seq, again.run.hop_retries, again.current.state) == (
        RunStatus.QUEUED, 1, 1, DeliveryState.PENDING)
    spent = RunPair(again.run, (again.current,))
    assert refused(decide(RUNS, spent, dataclasses.replace(retry, enqueue_seq=1), NOW), RunRefusal.NOT_RUNNING)


def test_an_old_hop_cannot_settle_a_later_one() -> None:
    later = claimed(seq=1)
    assert later.run.enqueue_seq == 1
    assert refused(decide(RUNS, later, settle(seq=0), NOW), RunRefusal.STALE_HOP)


@pytest.mark.parametrize("status", [RunStatus.DONE, RunStatus.FAILED])
def test_a_hop_cannot_settle_a_run_being_cancelled(status: RunStatus) -> None:
    pair = cancelling()
    assert refused(decide(RUNS, pair, settle(status=status), NOW), RunRefusal.CANCELLING)
    assert OUTCOMES[RunRefusal.CANCELLING] is None


def test_begin_cancel_freezes_the_sequence_and_nothing_can_claim_or_resume_it() -> None:
    queued = applied(decide(RUNS, admitted(), RecordPublished(enqueue_seq=0), NOW))
    frozen = applied(decide(RUNS, queued, BeginCancel(), NOW))
    assert (frozen.run.status, frozen.current.state) == (RunStatus.CANCELLING, DeliveryState.PUBLISHED)
    assert refused(decide(RUNS, frozen, Claim(enqueue_seq=0, node="node-a"), NOW), RunRefusal.NOT_QUEUED)
    waiting = cancelling(parked())
    assert refused(decide(RUNS, waiting, Resume(owner_id="consent-1", owner=consent_of(waiting)), NOW),
                   RunRefusal.NOT_WAITING)


def test_begin_cancel_of_a_cancelling_or_cancelled_run_returns_a_ticket_without_change() -> None:
    pair = cancelling()
    decision = decide(RUNS, pair, BeginCancel(), NOW + 5)
    assert applied(decision) == pair and decision.reply == Ticket(0, already_cancelled=False)  # type: ignore[union-attr]
    done = applied(decide(RUNS, pair, FinishCancel(enqueue_seq=0, hop=BrokerJobState.ABORTED,
                                                   containment=CONTAINED), NOW))
    decision = decide(RUNS, done, BeginCancel(), NOW + 5)
    assert applied(decision) == done and decision.reply == Ticket(0, already_cancelled=True)  # type: ignore[union-attr]


def test_begin_cancel_of_a_finished_run_answers_none_finishing_won() -> None:
    finished = applied(decide(RUNS, claimed(), settle(), NOW))
    assert refused(decide(RUNS, finished, BeginCancel(), NOW), RunRefusal.FINISHED)
    assert OUTCOMES[RunRefusal.FINISHED] is None


@pytest.mark.parametrize("hop", [None, BrokerJobState.QUEUED, BrokerJobState.ACTIVE])
def test_finish_cancel_while_the_hop_may_be_live_is_refused(hop: BrokerJobState | None) -> None:
    command = FinishCancel(enqueue_seq=0, hop=hop, containment=CONTAINED)
    assert refused(decide(RUNS, cancelling(), command, NOW), RunRefusal.HOP_LIVE)
    assert OUTCOMES[RunRefusal.HOP_LIVE] is ErrorCode.RUN_CONTAINMENT_UNPROVEN


@pytest.mark.parametrize("open_effects", [Containment(open_jobs=1, open_attempts=0),
                                          Containment(open_jobs=0, open_attempts=2)])
def test_finish_cancel_without_proven_containment_leaves_the_run_cancelling(open_effects: Containment) -> None:
    command = FinishCancel(enqueue_seq=0, hop=BrokerJobState.ABORTED, containment=open_effects)
    assert refused(decide(RUNS, cancelling(), command, NOW), RunRefusal.CONTAINMENT_UNPROVEN)


@pytest.mark.parametrize("hop", [BrokerJobState.ABSENT, BrokerJobState.COMPLETE, BrokerJobState.FAILED,
                                 BrokerJobState.ABORTED])
def test_finish_cancel_with_the_hop_fenced_and_everything_contained_cancels_and_sweeps(
    hop: BrokerJobState,
) -> None:
    pair = cancelling()
    assert refused(decide(RUNS, pair, FinishCancel(enqueue_seq=1, hop=hop, containment=CONTAINED), NOW),
                   RunRefusal.STALE_HOP)
    decision = decide(RUNS, pair, FinishCancel(enqueue_seq=0, hop=hop, containment=CONTAINED), NOW)
    cancelled = applied(decision)
    assert (cancelled.run.status, cancelled.current.state) == (RunStatus.CANCELLED, DeliveryState.SETTLED)
    assert decision.reply == Settled(CANCELLED_BY)  # type: ignore[union-attr]
    again = decide(RUNS, cancelled, FinishCancel(enqueue_seq=0, hop=hop, containment=CONTAINED), NOW + 1)
    assert applied(again) == cancelled and again.reply == Swept(CANCELLED_BY)  # type: ignore[union-attr]


def test_a_cancelled_wait_keeps_its_settled_delivery_and_its_last_owner() -> None:
    waiting = cancelling(parked())
    cancelled = applied(decide(RUNS, waiting, FinishCancel(enqueue_seq=0, hop=BrokerJobState.COMPLETE,
                                                           containment=CONTAINED), NOW))
    assert cancelled.current == waiting.current
    assert (cancelled.run.owner_kind, cancelled.run.owner_id) == (WaitKind.CONSENT, "consent-1")


def test_settlement_and_cancellation_name_who_sweeps_the_pending_consents() -> None:
    assert (SETTLED_BY, CANCELLED_BY) == ("tenure:run-settled", "tenure:run-cancelled")
    sweep = CancelPending(decided_by=SETTLED_BY)
    swept = applied(decide(CONSENTS, consent_row(), sweep, NOW))
    assert (swept.status, swept.decided_by) == (ConsentStatus.CANCELLED, SETTLED_BY)


def test_a_prepared_service_attempt_and_a_lost_delegated_job_keep_containment_unproven() -> None:
    # Containment is counted by the ledger's finders: their open states, as data.
    assert AttemptState.PREPARED in finders.OPEN_ATTEMPT_STATES
    assert AgentJobStatus.LOST in finders.OPEN_JOB_STATUSES
    assert not {AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELLED} & set(
        finders.OPEN_ATTEMPT_STATES)
    assert set(finders.OPEN_JOB_STATUSES) == {AgentJobStatus.QUEUED, AgentJobStatus.ADMITTED,
                                              AgentJobStatus.PREPARING, AgentJobStatus.RUNNING, AgentJobStatus.LOST}


# --- timeouts -------------------------------------------------------------------------------

TIMEOUT_US = 5_000_000
DEADLINE = NOW - 50 + TIMEOUT_US
"""The deadline of a Run admitted at ``NOW - 50`` (see :func:`admitted`) with ``TIMEOUT_US``."""


def test_an_admission_with_a_timeout_gets_its_deadline_from_the_database_clock() -> None:
    pair = admitted(timeout_us=TIMEOUT_US)
    assert (pair.run.created_at_us, pair.run.deadline_us) == (NOW - 50, DEADLINE)
    assert admitted().run.deadline_us is None
    for bad in (0, -1, 366 * 86_400_000_000 + 1, True, 1.5):
        assert refused(decide(RUNS, None, admit(timeout_us=bad), NOW), RunRefusal.TIMEOUT_INVALID)  # type: ignore[arg-type]
    assert applied(decide(RUNS, None, admit(timeout_us=366 * 86_400_000_000), NOW)).run.deadline_us == (
        NOW + 366 * 86_400_000_000)


def test_a_replay_must_ask_for_the_timeout_the_run_was_admitted_with() -> None:
    timed, untimed = admitted(timeout_us=TIMEOUT_US), admitted()
    same = decide(RUNS, timed, admit(timeout_us=TIMEOUT_US), NOW + 10**9)
    assert applied(same) == timed and same.reply == Admitted(created=False)  # type: ignore[union-attr]
    for other in (TIMEOUT_US + 1, TIMEOUT_US - 1, None):
        assert refused(decide(RUNS, timed, admit(timeout_us=other), NOW), RunRefusal.TIMEOUT_CHANGED)
    assert refused(decide(RUNS, untimed, admit(timeout_us=TIMEOUT_US), NOW), RunRefusal.TIMEOUT_CHANGED)
    assert applied(decide(RUNS, untimed, admit(), NOW)) == untimed
    assert OUTCOMES[RunRefusal.TIMEOUT_CHANGED] is ErrorCode.RUN_ADMISSION_CONFLICT


def test_a_run_times_out_at_its_deadline_on_the_database_clock_and_not_a_microsecond_before() -> None:
    for pair in (admitted(timeout_us=TIMEOUT_US), claimed(timeout_us=TIMEOUT_US),
                 parked(claimed(timeout_us=TIMEOUT_US))):
        for early in (NOW, DEADLINE - 1):
            assert refused(decide(RUNS, pair, TimeOut(), early), RunRefusal.DEADLINE_NOT_DUE)
        for due in (DEADLINE, DEADLINE + 10**9):
            decision = decide(RUNS, pair, TimeOut(), due)
            out = applied(decision)
            assert decision.reply == TimedOut(pair.run.enqueue_seq)  # type: ignore[union-attr]
            assert (out.run.status, out.run.error, out.run.enqueue_seq, out.current) == (
                RunStatus.CANCELLING, "timeout", pair.run.enqueue_seq, pair.current)
    assert OUTCOMES[RunRefusal.DEADLINE_NOT_DUE] is None


def test_a_run_without_a_deadline_never_times_out_and_a_finished_one_is_left_as_it_is() -> None:
    assert refused(decide(RUNS, claimed(), TimeOut(), NOW + 10**12), RunRefusal.NO_DEADLINE)
    assert refused(decide(RUNS, None, TimeOut(), NOW), RunRefusal.NOT_FOUND)
    done = applied(decide(RUNS, claimed(timeout_us=TIMEOUT_US), settle(), NOW))
    assert refused(decide(RUNS, done, TimeOut(), DEADLINE + 1), RunRefusal.FINISHED)
    failed = applied(decide(RUNS, claimed(timeout_us=TIMEOUT_US), settle(status=RunStatus.FAILED), NOW))
    assert refused(decide(RUNS, failed, TimeOut(), DEADLINE + 1), RunRefusal.FINISHED)


def test_a_timed_out_run_finishes_its_cancellation_as_an_operators_and_keeps_its_reason() -> None:
    out = applied(decide(RUNS, claimed(timeout_us=TIMEOUT_US), TimeOut(), DEADLINE))
    assert refused(decide(RUNS, out, settle(), DEADLINE), RunRefusal.CANCELLING)  # the hop's late settle
    again = decide(RUNS, out, TimeOut(), DEADLINE + 5)
    assert applied(again) == out and again.reply == Ticket(0, already_cancelled=False)  # type: ignore[union-attr]
    assert refused(decide(RUNS, out, FinishCancel(enqueue_seq=0, hop=BrokerJobState.ACTIVE, containment=CONTAINED),
                          DEADLINE), RunRefusal.HOP_LIVE)
    cancelled = applied(decide(RUNS, out, FinishCancel(enqueue_seq=0, hop=BrokerJobState.ABORTED,
                                                       containment=CONTAINED), DEADLINE))
    assert (cancelled.run.status, cancelled.run.error) == (RunStatus.CANCELLED, "timeout")
    assert refused(decide(RUNS, cancelled, TimeOut(), DEADLINE + 5), RunRefusal.FINISHED)


def test_an_operators_cancel_keeps_no_reason_and_a_later_timeout_does_not_add_one() -> None:
    operator = cancelling(claimed(timeout_us=TIMEOUT_US))
    assert (operator.run.status, operator.run.error) == (RunStatus.CANCELLING, None)
    ticket = decide(RUNS, operator, TimeOut(), DEADLINE)
    assert applied(ticket) == operator and ticket.reply == Ticket(0, already_cancelled=False)  # type: ignore[union-attr]
    assert refused(decide(RUNS, operator, TimeOut(), DEADLINE - 1), RunRefusal.DEADLINE_NOT_DUE)


@settings(max_examples=300)
@given(data=st.data())
def test_time_out_applies_exactly_to_an_open_run_whose_deadline_passed(data: st.DataObject) -> None:
    record, command, now = data.draw(run_situations(kind=RunCommandType.TIME_OUT))
    decision = decide(RUNS, record, command, now)
    due = record is not None and record.run.deadline_us is not None and now >= record.run.deadline_us
    open_run = record is not None and record.run.status not in (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED)
    assert isinstance(decision, Applied) == (due and open_run)
    if isinstance(decision, Applied):
        assert record is not None
        new = applied(decision)
        assert new.run.status is RunStatus.CANCELLING and new.current == record.current
        expected_reason = record.run.error if record.run.status is RunStatus.CANCELLING else "timeout"
        assert new.run.error == expected_reason


# --- consents -------------------------------------------------------------------------------


def test_a_consent_is_created_only_for_a_running_run() -> None:
    create = CreateConsent(row=consent_row(created_at_us=0), run_running=False)
    assert refused(decide(CONSENTS, None, create, NOW), ConsentRefusal.RUN_NOT_RUNNING)
    assert CONSENTS.outcomes[ConsentRefusal.RUN_NOT_RUNNING] is ErrorCode.RUN_OWNER_MISMATCH
    row = applied(decide(CONSENTS, None, dataclasses.replace(create, run_running=True), NOW))
    assert (row.status, row.decided_by, row.created_at_us) == (ConsentStatus.PENDING, None, NOW)


def test_a_preauthorized_consent_is_granted_at_creation() -> None:
    create = CreateConsent(row=consent_row(preauthorized_by="policy-7", created_at_us=0), run_running=True)
    row: ConsentRow = applied(decide(CONSENTS, None, create, NOW))
    assert (row.status, row.decided_by, row.decided_at_us, row.created_at_us, row.preauthorized_by) == (
        ConsentStatus.GRANTED, PREAUTHORIZED_BY, NOW, NOW, "policy-7")


@pytest.mark.parametrize("first", [ConsentStatus.GRANTED, ConsentStatus.DENIED, ConsentStatus.EXPIRED])
@pytest.mark.parametrize("second", [ConsentStatus.GRANTED, ConsentStatus.DENIED, ConsentStatus.EXPIRED])
def test_the_first_verdict_wins_and_a_later_one_changes_nothing(first: ConsentStatus, second: ConsentStatus) -> None:
    decided: ConsentRow = applied(decide(CONSENTS, consent_row(), DecideConsent(verdict=first, decided_by="alice"),
                                         NOW))
    assert (decided.status, decided.decided_by, decided.decided_at_us) == (first, "alice", NOW)
    later = decide(CONSENTS, decided, DecideConsent(verdict=second, decided_by="bob"), NOW + 1)
    assert refused(later, ConsentRefusal.ALREADY_DECIDED)


def test_only_the_runs_terminal_truth_cancels_a_pending_consent_and_a_verdict_that_won_stands() -> None:
    pending = consent_row()
    assert refused(decide(CONSENTS, pending, DecideConsent(verdict=ConsentStatus.CANCELLED, decided_by="alice"),
                          NOW), ConsentRefusal.ALREADY_DECIDED)
    granted = applied(decide(CONSENTS, pending, DecideConsent(verdict=ConsentStatus.GRANTED, decided_by="alice"),
                             NOW))
    assert refused(decide(CONSENTS, granted, CancelPending(decided_by=CANCELLED_BY), NOW),
                   ConsentRefusal.ALREADY_DECIDED)


def test_a_verdict_is_never_dated_before_the_consent_was_created() -> None:
    row = applied(decide(CONSENTS, consent_row(created_at_us=NOW),
                         DecideConsent(verdict=ConsentStatus.EXPIRED, decided_by="deadline-keeper"), NOW - 10))
    assert row.decided_at_us == NOW


def test_a_consent_created_with_a_deadline_keeps_it_counted_from_its_creation() -> None:
    create = CreateConsent(row=consent_row(created_at_us=0), run_running=True, expires_in_us=5_000_000)
    row: ConsentRow = applied(decide(CONSENTS, None, create, NOW))
    assert (row.status, row.created_at_us, row.expires_at_us) == (ConsentStatus.PENDING, NOW, NOW + 5_000_000)
    without = applied(decide(CONSENTS, None, dataclasses.replace(create, expires_in_us=None), NOW))
    assert without.expires_at_us is None


EXPIRE = DecideConsent(verdict=ConsentStatus.EXPIRED, decided_by=DEADLINE_OWNER)


def test_the_deadline_owner_expires_a_pending_consent_only_once_its_deadline_has_come() -> None:
    deadline = NOW + 5_000_000
    pending = consent_row(expires_at_us=deadline)
    for early in (deadline - 1, deadline - 1_000_000, pending.created_at_us):
        assert refused(decide(CONSENTS, pending, EXPIRE, early), ConsentRefusal.NOT_DUE)
    assert CONSENTS.outcomes[ConsentRefusal.NOT_DUE] is None  # the ledger answers False
    for due in (deadline, deadline + 1):
        row: ConsentRow = applied(decide(CONSENTS, pending, EXPIRE, due))
        assert (row.status, row.decided_by, row.decided_at_us, row.expires_at_us) == (
            ConsentStatus.EXPIRED, DEADLINE_OWNER, due, deadline)


@settings(max_examples=300)
@given(record=consent_records(ConsentStep.PENDING) | consent_records(),
       offset=st.integers(-1_500_000, 1_500_000) | st.integers(-2, 2),
       verdict=st.just(ConsentStatus.EXPIRED) | st.sampled_from(ConsentStatus))
def test_the_deadline_owners_verdict_applies_exactly_to_a_pending_consent_whose_deadline_came(
    record: ConsentRow | None, offset: int, verdict: ConsentStatus,
) -> None:
    deadline = None if record is None else record.expires_at_us
    now = (deadline if deadline is not None else NOW) + offset
    decision = decide(CONSENTS, record, DecideConsent(verdict=verdict, decided_by=DEADLINE_OWNER), now)
    due = deadline is not None and now >= deadline
    pending = record is not None and record.status is ConsentStatus.PENDING
    assert isinstance(decision, Applied) == (pending and due and verdict is ConsentStatus.EXPIRED)
    if pending and not isinstance(decision, Applied):
        assert decision.reason is ConsentRefusal.NOT_DUE  # type: ignore[union-attr]


def test_the_deadline_owner_never_expires_a_consent_without_a_deadline_and_sends_no_other_verdict() -> None:
    assert refused(decide(CONSENTS, consent_row(), EXPIRE, NOW + 10**12), ConsentRefusal.NOT_DUE)
    pending = consent_row(expires_at_us=NOW)
    for verdict in (ConsentStatus.GRANTED, ConsentStatus.DENIED):
        sent = DecideConsent(verdict=verdict, decided_by=DEADLINE_OWNER)
        assert refused(decide(CONSENTS, pending, sent, NOW + 1), ConsentRefusal.NOT_DUE)


def test_a_verdict_before_the_deadline_stands_and_other_principals_may_expire_at_any_time() -> None:
    deadline = NOW + 5_000_000
    pending = consent_row(expires_at_us=deadline)
    granted = applied(decide(CONSENTS, pending, DecideConsent(verdict=ConsentStatus.GRANTED, decided_by="alice"),
                             deadline - 1))
    assert refused(decide(CONSENTS, granted, EXPIRE, deadline + 1), ConsentRefusal.ALREADY_DECIDED)
    early = applied(decide(CONSENTS, pending, DecideConsent(verdict=ConsentStatus.EXPIRED, decided_by="bob"), NOW))
    assert (early.status, early.decided_by) == (ConsentStatus.EXPIRED, "bob")


# --- delegated jobs -------------------------------------------------------------------------


def adopt(status: AgentJobStatus) -> AdoptResult:
    return AdoptResult(status=status, result_json=result_for(status))


def test_a_job_is_submitted_once_per_request_only_for_a_running_run() -> None:
    submit = SubmitJob(row=job_row(created_at_us=0, updated_at_us=0), run_running=False)
    assert refused(decide(AGENT_JOBS, None, submit, NOW), AgentJobRefusal.RUN_NOT_RUNNING)
    assert AGENT_JOBS.outcomes[AgentJobRefusal.RUN_NOT_RUNNING] is ErrorCode.RUN_OWNER_MISMATCH
    decision = decide(AGENT_JOBS, None, dataclasses.replace(submit, run_running=True), NOW)
    job: AgentJobRow = applied(decision)
    assert (job.status, job.created_at_us, decision.reply) == (AgentJobStatus.QUEUED, NOW, Submitted(replayed=False))
    replay = decide(AGENT_JOBS, job, submit, NOW + 1)
    assert applied(replay) == job and replay.reply == Submitted(replayed=True)  # type: ignore[union-attr]
    changed = dataclasses.replace(submit, row=job_row(request_json='{"task":"other"}'))
    assert refused(decide(AGENT_JOBS, job, changed, NOW), AgentJobRefusal.REQUEST_CHANGED)
    assert AGENT_JOBS.outcomes[AgentJobRefusal.REQUEST_CHANGED] is ErrorCode.JOB_REQUEST_CONFLICT


def test_advance_moves_one_step_at_a_time_and_records_the_runtime_identity_once() -> None:
    job = job_row()
    assert refused(decide(AGENT_JOBS, job, AdvanceJob(status=AgentJobStatus.RUNNING, runtime_job_id=None), NOW),
                   AgentJobRefusal.NOT_NEXT)
    job = applied(decide(AGENT_JOBS, job, AdvanceJob(status=AgentJobStatus.ADMITTED, runtime_job_id="rt-1"), NOW))
    assert (job.status, job.runtime_job_id) == (AgentJobStatus.ADMITTED, "rt-1")
    assert refused(decide(AGENT_JOBS, job, AdvanceJob(status=AgentJobStatus.PREPARING, runtime_job_id="rt-2"), NOW),
                   AgentJobRefusal.IDENTITY_CONFLICT)
    assert refused(decide(AGENT_JOBS, job, AdvanceJob(status=AgentJobStatus.ADMITTED, runtime_job_id=None), NOW),
                   AgentJobRefusal.ALREADY_APPLIED)
    job = applied(decide(AGENT_JOBS, job, AdvanceJob(status=AgentJobStatus.PREPARING, runtime_job_id=None), NOW))
    assert (job.status, job.runtime_job_id) == (AgentJobStatus.PREPARING, "rt-1")


@pytest.mark.parametrize("first", [AgentJobStatus.SUCCEEDED, AgentJobStatus.FAILED, AgentJobStatus.CANCELLED,
                                   AgentJobStatus.TIMED_OUT, AgentJobStatus.LOST])
@pytest.mark.parametrize("second", [AgentJobStatus.SUCCEEDED, AgentJobStatus.FAILED, AgentJobStatus.CANCELLED])
def test_a_result_is_adopted_once(first: AgentJobStatus, second: AgentJobStatus) -> None:
    running = job_row(status=AgentJobStatus.RUNNING, runtime_job_id="rt-1")
    ended: AgentJobRow = applied(decide(AGENT_JOBS, running, adopt(first), NOW))
    assert (ended.status, ended.result_json) == (first, result_for(first))
    assert refused(decide(AGENT_JOBS, ended, adopt(second), NOW + 1), AgentJobRefusal.ALREADY_FINISHED)


def test_lost_ends_only_when_the_runtimes_containment_returned() -> None:
    lost = applied(decide(AGENT_JOBS, job_row(status=AgentJobStatus.RUNNING), adopt(AgentJobStatus.LOST), NOW))
    contained = RecordCancelled(result_json=result_for(AgentJobStatus.CANCELLED, contained=True))
    cancelled = applied(decide(AGENT_JOBS, lost, contained, NOW + 1))
    assert (cancelled.status, cancelled.result_json) == (AgentJobStatus.CANCELLED, contained.result_json)
    finished = applied(decide(AGENT_JOBS, job_row(status=AgentJobStatus.RUNNING), adopt(AgentJobStatus.SUCCEEDED),
                              NOW))
    assert refused(decide(AGENT_JOBS, finished, contained, NOW), AgentJobRefusal.ALREADY_FINISHED)


def test_containment_of_an_open_job_cancels_it_before_any_result() -> None:
    contained = RecordCancelled(result_json=result_for(AgentJobStatus.CANCELLED, contained=True))
    cancelled = applied(decide(AGENT_JOBS, job_row(status=AgentJobStatus.PREPARING), contained, NOW))
    assert cancelled.status is AgentJobStatus.CANCELLED
    assert refused(decide(AGENT_JOBS, cancelled, adopt(AgentJobStatus.SUCCEEDED), NOW),
                   AgentJobRefusal.ALREADY_FINISHED)



def test_a_rotation_keeps_the_resume_mode_of_the_hop_it_replaces() -> None:
    from tenure.conformance.strategies.runs import base_run, delivery_for
    from tenure.kernel.core import Applied as Done
    from tenure.kernel.runs.commands import Rotate
    from tenure.kernel.runs.machine import RUNS
    from tenure.kernel.runs.record import RunPair as Pair
    from tenure.model import BrokerJobState as Hop
    from tenure.model import DeliveryState as State
    from tenure.model import RunStatus as Status

    for seq in (0, 1):
        run = base_run(status=Status.QUEUED, enqueue_seq=seq, started_at_us=1 if seq else None,
                       node="node-a" if seq else None)
        pair = Pair(run, (delivery_for(run, State.PUBLISHED),))
        decision = RUNS.decide(pair, Rotate(enqueue_seq=seq, hop=Hop.ABORTED), run.updated_at_us + 1)
        assert isinstance(decision, Done)
        opened = decision.new_record.current
        assert (opened.enqueue_seq, opened.resume, opened.state) == (seq + 1, seq > 0, State.PENDING)
