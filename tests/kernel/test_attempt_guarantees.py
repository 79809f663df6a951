"""Each guarantee of the service-attempt machine, as a plain example a reviewer can read
(and a deliberately broken kernel in kernel_mutants.py must fail)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given

from tenure.conformance.strategies.attempts import attempt_records, attempt_situations
from tenure.kernel.attempts.commands import (
    BeginSubmit,
    ExpireSubmitLease,
    FailureKind,
    LookupKind,
    Prepare,
    Reconcile,
    RecordAccepted,
    RecordAmbiguous,
    RecordCancelled,
    RecordFailed,
    RecordSucceeded,
    ReleaseReservation,
    RequestCancel,
    TransmissionGranted,
)
from tenure.kernel.attempts.machine import ATTEMPTS, OUTCOMES, AttemptRefusal
from tenure.kernel.attempts.record import AttemptRow, record_violations
from tenure.kernel.core import Applied, Refused
from tenure.model import ENVELOPE_TAG, AttemptState, ErrorCode

NOW = 1_800_000_000_000_000
LEASE = 60_000_000


def prepared(**changes: object) -> AttemptRow:
    row = AttemptRow(
        attempt_id="attempt-1", envelope=ENVELOPE_TAG, owner_job_id="owner-1", run_id=None, station_attempt_id=None,
        generation=1, request_digest="sha256:" + "a" * 64, idempotency_key="key-1", binding_json="{}",
        same_key_replay=False, lookup=True, target="provider-a", source_refs=(), working_refs=(),
        destination=None, purpose="render", consent_decision=None, policy_revisions_json="{}", reservation=None,
        spec_digest="sha256:" + "c" * 64, state=AttemptState.PREPARED, provider_job_id=None, transmissions=0,
        transmission_egress=(), denied_egress=(), submit_lease_expires_at_us=None, no_effect_proof_for=None,
        granted_during_earlier_lease=False,
        progress_cursor=None, result_refs=(), diagnostic_refs=(), usage_json=None, cost_json=None, warnings=(),
        cancel_requested=False, evidence=(), reservation_released=False, created_at_us=NOW - 10, updated_at_us=NOW - 10,
    )
    return dataclasses.replace(row, **changes)  # type: ignore[arg-type]


def submit(decision_id: str = "egress-1", *, allowed: bool = True, proof_at: int | None = None) -> BeginSubmit:
    """A grant request; ``proof_at``: the instant of the caller's lookup that found nothing."""
    return BeginSubmit(egress_decision_id=decision_id, egress_allowed=allowed, proof_looked_up_at_us=proof_at,
                       lease_us=LEASE)


def not_found(at: int | None) -> Reconcile:
    """A vouching not-found from a lookup made at ``at``."""
    return Reconcile(lookup=LookupKind.NOT_FOUND, proves_no_effect=True, looked_up_at_us=at)


def rejection(transmission: int | None) -> RecordFailed:
    return RecordFailed(evidence=FailureKind.REJECTED_BEFORE_EFFECT, reason="quota", transmission=transmission)


def applied(decision: object) -> AttemptRow:
    assert isinstance(decision, Applied), decision
    assert isinstance(decision.new_record, AttemptRow)
    assert record_violations(decision.new_record) == []
    return decision.new_record


def refused(decision: object, reason: AttemptRefusal) -> bool:
    return isinstance(decision, Refused) and decision.reason is reason


def submitting(**changes: object) -> AttemptRow:
    return applied(ATTEMPTS.decide(prepared(**changes), submit(), NOW))


# --- prepare ---------------------------------------------------------------------------------


def test_prepare_records_a_prepared_attempt_with_nothing_transmitted() -> None:
    row = applied(ATTEMPTS.decide(None, Prepare(row=prepared(), predecessor_state=None, predecessor_generation=0,
                                       key_held_elsewhere=False, run_closed=False), NOW))
    assert (row.state, row.transmissions, row.created_at_us) == (AttemptState.PREPARED, 0, NOW)


def test_prepare_again_with_the_same_spec_replays_and_a_changed_spec_conflicts() -> None:
    row = prepared()
    same = Prepare(row=row, predecessor_state=None, predecessor_generation=0, key_held_elsewhere=False,
                   run_closed=False)
    assert applied(ATTEMPTS.decide(row, same, NOW)) == row
    changed = dataclasses.replace(same, row=dataclasses.replace(row, spec_digest="sha256:" + "d" * 64))
    assert refused(ATTEMPTS.decide(row, changed, NOW), AttemptRefusal.SPEC_CHANGED)
    assert OUTCOMES[AttemptRefusal.SPEC_CHANGED] is ErrorCode.ATTEMPT_PREPARE_CONFLICT


@pytest.mark.parametrize("predecessor", [AttemptState.PREPARED, AttemptState.SUBMITTING, AttemptState.ACCEPTED,
                                         AttemptState.RUNNING, AttemptState.INDETERMINATE])
def test_a_new_generation_over_an_unresolved_predecessor_is_refused(predecessor: AttemptState) -> None:
    command = Prepare(row=prepared(generation=2, idempotency_key="key-2"), predecessor_state=predecessor,
                      predecessor_generation=1, key_held_elsewhere=False, run_closed=False)
    assert refused(ATTEMPTS.decide(None, command, NOW), AttemptRefusal.PREDECESSOR_UNRESOLVED)
    assert OUTCOMES[AttemptRefusal.PREDECESSOR_UNRESOLVED] is ErrorCode.ATTEMPT_PREDECESSOR_UNRESOLVED


@pytest.mark.parametrize("predecessor", [AttemptState.FAILED, AttemptState.CANCELLED])
def test_a_new_generation_follows_a_failed_or_cancelled_predecessor(predecessor: AttemptState) -> None:
    command = Prepare(row=prepared(generation=2, idempotency_key="key-2"), predecessor_state=predecessor,
                      predecessor_generation=1, key_held_elsewhere=False, run_closed=False)
    assert applied(ATTEMPTS.decide(None, command, NOW)).generation == 2


def test_a_gap_a_succeeded_predecessor_or_a_reused_key_conflict() -> None:
    gap = Prepare(row=prepared(generation=3), predecessor_state=AttemptState.FAILED, predecessor_generation=1,
                  key_held_elsewhere=False, run_closed=False)
    assert refused(ATTEMPTS.decide(None, gap, NOW), AttemptRefusal.GENERATION_GAP)
    after_success = dataclasses.replace(gap, row=prepared(generation=2), predecessor_state=AttemptState.SUCCEEDED)
    assert refused(ATTEMPTS.decide(None, after_success, NOW), AttemptRefusal.PREDECESSOR_SUCCEEDED)
    reused = dataclasses.replace(gap, row=prepared(generation=2), key_held_elsewhere=True)
    assert refused(ATTEMPTS.decide(None, reused, NOW), AttemptRefusal.KEY_REUSED)


def test_a_new_attempt_for_a_run_that_is_not_running_is_refused_as_an_owner_mismatch() -> None:
    # Whatever else holds: the Run's containment check may already have passed.
    fresh = Prepare(row=prepared(run_id="run-1"), predecessor_state=None, predecessor_generation=0,
                    key_held_elsewhere=False, run_closed=True)
    assert refused(ATTEMPTS.decide(None, fresh, NOW), AttemptRefusal.RUN_CLOSED)
    retry = Prepare(row=prepared(run_id="run-1", generation=2, idempotency_key="key-2"),
                    predecessor_state=AttemptState.FAILED, predecessor_generation=1, key_held_elsewhere=False,
                    run_closed=True)
    assert refused(ATTEMPTS.decide(None, retry, NOW), AttemptRefusal.RUN_CLOSED)
    assert OUTCOMES[AttemptRefusal.RUN_CLOSED] is ErrorCode.RUN_OWNER_MISMATCH
    assert applied(ATTEMPTS.decide(None, dataclasses.replace(fresh, run_closed=False), NOW)).run_id == "run-1"


def test_a_replay_of_an_existing_attempt_is_answered_even_once_its_run_is_closed() -> None:
    row = prepared(run_id="run-1")
    again = Prepare(row=row, predecessor_state=None, predecessor_generation=0, key_held_elsewhere=False,
                    run_closed=True)
    decision = ATTEMPTS.decide(row, again, NOW)
    assert applied(decision) == row
    changed = dataclasses.replace(again, row=dataclasses.replace(row, spec_digest="sha256:" + "d" * 64))
    assert refused(ATTEMPTS.decide(row, changed, NOW), AttemptRefusal.SPEC_CHANGED)


# --- transmission ------------------------------------------------------------------------------


def test_begin_submit_moves_prepared_to_submitting_and_grants_one_transmission_under_a_submit_lease() -> None:
    decision = ATTEMPTS.decide(prepared(), submit(), NOW)
    row = applied(decision)
    assert (row.state, row.transmissions, row.transmission_egress) == (AttemptState.SUBMITTING, 1, ("egress-1",))
    assert row.submit_lease_expires_at_us == NOW + LEASE
    assert isinstance(decision.reply, TransmissionGranted) and decision.reply.number == 1  # type: ignore[union-attr]


def test_a_denied_egress_decision_is_recorded_and_leaves_the_attempt_prepared() -> None:
    row = applied(ATTEMPTS.decide(prepared(), submit(allowed=False), NOW))
    assert (row.state, row.transmissions, row.denied_egress) == (AttemptState.PREPARED, 0, ("egress-1",))
    assert refused(ATTEMPTS.decide(row, submit("egress-1"), NOW), AttemptRefusal.EGRESS_REUSED)


def test_a_resubmission_without_proof_is_refused_even_after_the_lease() -> None:
    row = submitting()
    assert refused(ATTEMPTS.decide(row, submit("egress-2"), NOW + 2 * LEASE), AttemptRefusal.RESUBMIT_UNPROVEN)
    indeterminate = applied(ATTEMPTS.decide(row, RecordAmbiguous(reason="timeout"), NOW))
    assert refused(ATTEMPTS.decide(indeterminate, submit("egress-2"), NOW + 2 * LEASE), AttemptRefusal.RESUBMIT_UNPROVEN)
    assert OUTCOMES[AttemptRefusal.RESUBMIT_UNPROVEN] is ErrorCode.ATTEMPT_RESUBMIT_UNPROVEN


def test_a_no_effect_proof_during_the_submit_lease_proves_nothing() -> None:
    row = submitting()
    assert refused(ATTEMPTS.decide(row, not_found(NOW + 1), NOW + 1), AttemptRefusal.SUBMIT_LEASE_LIVE)
    assert refused(ATTEMPTS.decide(row, submit("egress-2", proof_at=NOW + 1), NOW + 1), AttemptRefusal.RESUBMIT_UNPROVEN)


def test_a_not_found_is_judged_at_the_instant_of_its_lookup_not_when_it_is_reported() -> None:
    """Looked up during the lease, reported after it: the transmission may have landed in
    between, so the not-found proves nothing (to reconcile or to begin_submit)."""
    row = submitting()
    late = NOW + 5 * LEASE
    assert refused(ATTEMPTS.decide(row, not_found(NOW + LEASE - 1), late), AttemptRefusal.SUBMIT_LEASE_LIVE)
    assert refused(ATTEMPTS.decide(row, submit("egress-2", proof_at=NOW + LEASE - 1), late), AttemptRefusal.RESUBMIT_UNPROVEN)
    # Looked up once the lease had ended: a proof, however late it is reported.
    assert applied(ATTEMPTS.decide(row, not_found(NOW + LEASE), late)).no_effect_proof_for == 1
    assert applied(ATTEMPTS.decide(row, submit("egress-2", proof_at=NOW + LEASE), late)).transmissions == 2
    # A lookup older than the latest grant is inside that grant's lease too.
    again = applied(ATTEMPTS.decide(applied(ATTEMPTS.decide(row, not_found(NOW + LEASE), late)), submit("egress-2"), late))
    assert refused(ATTEMPTS.decide(again, not_found(late - 1), late + 5 * LEASE), AttemptRefusal.SUBMIT_LEASE_LIVE)


def test_a_not_found_without_its_instant_proves_nothing_and_one_from_the_future_counts_as_now() -> None:
    row = submitting()
    assert refused(ATTEMPTS.decide(row, not_found(None), NOW + 2 * LEASE), AttemptRefusal.NOTHING_PROVEN)
    assert refused(ATTEMPTS.decide(row, submit("egress-2", proof_at=NOW + 9 * LEASE), NOW + 1),
                   AttemptRefusal.RESUBMIT_UNPROVEN)
    assert refused(ATTEMPTS.decide(row, not_found(NOW + 9 * LEASE), NOW + 1), AttemptRefusal.SUBMIT_LEASE_LIVE)


def test_a_recorded_no_effect_proof_allows_exactly_one_resubmission_with_the_same_key() -> None:
    row = applied(ATTEMPTS.decide(submitting(), not_found(NOW + LEASE), NOW + LEASE))
    assert row.no_effect_proof_for == 1
    again = applied(ATTEMPTS.decide(row, submit("egress-2"), NOW + LEASE))
    assert (again.transmissions, again.idempotency_key, again.no_effect_proof_for) == (2, "key-1", None)
    assert refused(ATTEMPTS.decide(again, submit("egress-3"), NOW + 3 * LEASE), AttemptRefusal.RESUBMIT_UNPROVEN)


def test_a_same_key_replay_binding_may_resubmit_without_proof() -> None:
    row = submitting(same_key_replay=True)
    again = applied(ATTEMPTS.decide(row, submit("egress-2"), NOW + 1))
    assert (again.transmissions, again.granted_during_earlier_lease) == (2, True)
    # Granted once every earlier lease has ended: nothing earlier can still land.
    later = applied(ATTEMPTS.decide(row, submit("egress-2"), NOW + LEASE))
    assert (later.transmissions, later.granted_during_earlier_lease) == (2, False)


def test_a_cancel_request_stops_resubmission() -> None:
    row = applied(ATTEMPTS.decide(submitting(same_key_replay=True), RequestCancel(), NOW))
    assert refused(ATTEMPTS.decide(row, submit("egress-2"), NOW), AttemptRefusal.CANCEL_REQUESTED)


# --- never a fabricated failure --------------------------------------------------------------


@pytest.mark.parametrize("state", [AttemptState.SUBMITTING, AttemptState.ACCEPTED, AttemptState.RUNNING])
def test_an_ambiguous_outcome_becomes_indeterminate_never_failed(state: AttemptState) -> None:
    row = submitting()
    if state is not AttemptState.SUBMITTING:
        row = dataclasses.replace(row, state=state, provider_job_id="job-a")
    after = applied(ATTEMPTS.decide(row, RecordAmbiguous(reason="timeout"), NOW))
    assert after.state is AttemptState.INDETERMINATE


def test_the_submit_lease_ending_without_an_answer_is_indeterminate_never_failed() -> None:
    row = submitting()
    assert refused(ATTEMPTS.decide(row, ExpireSubmitLease(), NOW + LEASE - 1), AttemptRefusal.SUBMIT_LEASE_LIVE)
    assert applied(ATTEMPTS.decide(row, ExpireSubmitLease(), NOW + LEASE)).state is AttemptState.INDETERMINATE


def test_failed_needs_evidence_of_the_right_kind() -> None:
    row = submitting()
    assert refused(ATTEMPTS.decide(row, RecordFailed(evidence=FailureKind.PROVIDER_FAILED, reason="x"), NOW),
                   AttemptRefusal.EVIDENCE_INSUFFICIENT)
    assert applied(ATTEMPTS.decide(row, rejection(1), NOW)).state is AttemptState.FAILED
    accepted = applied(ATTEMPTS.decide(row, RecordAccepted(provider_job_id="job-a"), NOW))
    assert refused(ATTEMPTS.decide(accepted, rejection(1), NOW),
                   AttemptRefusal.EVIDENCE_INSUFFICIENT)


def test_a_rejection_fails_the_attempt_only_when_it_answers_the_latest_transmission() -> None:
    """A sender paused past its lease hears transmission 1 rejected; meanwhile transmission
    2 was granted on a no-effect proof and may land: the late rejection fails nothing."""
    proven = applied(ATTEMPTS.decide(submitting(), not_found(NOW + LEASE), NOW + LEASE))
    second = applied(ATTEMPTS.decide(proven, submit("egress-2"), NOW + LEASE))
    assert refused(ATTEMPTS.decide(second, rejection(1), NOW + LEASE + 1), AttemptRefusal.STALE_TRANSMISSION)
    assert refused(ATTEMPTS.decide(second, rejection(None), NOW + LEASE + 1), AttemptRefusal.STALE_TRANSMISSION)
    assert refused(ATTEMPTS.decide(second, rejection(3), NOW + LEASE + 1), AttemptRefusal.STALE_TRANSMISSION)
    assert applied(ATTEMPTS.decide(second, rejection(2), NOW + LEASE + 1)).state is AttemptState.FAILED
    assert OUTCOMES[AttemptRefusal.STALE_TRANSMISSION] is None


def test_a_rejection_beside_an_earlier_transmission_still_in_flight_fails_nothing() -> None:
    """Two senders on a same-key-replay binding: the second is granted while the first's
    lease is live and is turned away (quota); the first may still land, so the attempt
    stays submitting. A transmission granted after every earlier lease ended fails it."""
    first = submitting(same_key_replay=True)
    beside = applied(ATTEMPTS.decide(first, submit("egress-2"), NOW + 1))
    assert refused(ATTEMPTS.decide(beside, rejection(2), NOW + 2), AttemptRefusal.EARLIER_IN_FLIGHT)
    # Still refused after the first lease ended: the first may have landed after the rejection.
    assert refused(ATTEMPTS.decide(beside, rejection(2), NOW + 3 * LEASE), AttemptRefusal.EARLIER_IN_FLIGHT)
    ended = applied(ATTEMPTS.decide(beside, ExpireSubmitLease(), NOW + 3 * LEASE))
    third = applied(ATTEMPTS.decide(ended, submit("egress-3"), NOW + 3 * LEASE))
    assert third.granted_during_earlier_lease is False
    assert applied(ATTEMPTS.decide(third, rejection(3), NOW + 3 * LEASE + 1)).state is AttemptState.FAILED
    assert OUTCOMES[AttemptRefusal.EARLIER_IN_FLIGHT] is None


@given(situation=attempt_situations())
def test_no_decision_ever_fails_an_attempt_without_evidence(situation: tuple[object, object, int]) -> None:
    record, command, now = situation
    decision = ATTEMPTS.decide(record, command, now)  # type: ignore[arg-type]
    if isinstance(decision, Applied) and decision.new_record is not None and record is not None:
        if decision.new_record.state is AttemptState.FAILED and record.state is not AttemptState.FAILED:  # type: ignore[attr-defined]
            assert isinstance(command, (RecordFailed, Reconcile))


def test_indeterminate_is_left_only_by_an_observation_or_a_proven_resubmission() -> None:
    row = applied(ATTEMPTS.decide(submitting(), RecordAmbiguous(reason="timeout"), NOW))
    assert refused(ATTEMPTS.decide(row, ExpireSubmitLease(), NOW + 10 * LEASE), AttemptRefusal.ALREADY_APPLIED)
    seen = Reconcile(lookup=LookupKind.FOUND, provider_job_id="job-a", found_state=AttemptState.SUCCEEDED,
                     result_refs=("ref-1",))
    done = applied(ATTEMPTS.decide(row, seen, NOW))
    assert (done.state, done.provider_job_id, done.result_refs) == (AttemptState.SUCCEEDED, "job-a", ("ref-1",))


# --- identity --------------------------------------------------------------------------------


def test_the_provider_identity_is_recorded_once_and_a_second_one_conflicts() -> None:
    accepted = applied(ATTEMPTS.decide(submitting(), RecordAccepted(provider_job_id="job-a"), NOW))
    assert refused(ATTEMPTS.decide(accepted, RecordAccepted(provider_job_id="job-b"), NOW), AttemptRefusal.IDENTITY_CONFLICT)
    lying = Reconcile(lookup=LookupKind.FOUND, provider_job_id="job-b", found_state=AttemptState.SUCCEEDED)
    assert refused(ATTEMPTS.decide(accepted, lying, NOW), AttemptRefusal.IDENTITY_CONFLICT)
    assert OUTCOMES[AttemptRefusal.IDENTITY_CONFLICT] is ErrorCode.ATTEMPT_IDENTITY_CONFLICT
    assert refused(ATTEMPTS.decide(accepted, RecordAccepted(provider_job_id="job-a"), NOW), AttemptRefusal.ALREADY_APPLIED)


def test_success_needs_a_known_identity() -> None:
    row = submitting()
    assert refused(ATTEMPTS.decide(row, RecordSucceeded(result_refs=("r",), diagnostic_refs=(), usage_json=None,
                                                cost_json=None), NOW), AttemptRefusal.IDENTITY_UNKNOWN)


# --- cancellation and reservations -----------------------------------------------------------


def test_a_prepared_attempt_cancels_at_once_and_a_transmitted_one_only_on_containment_evidence() -> None:
    assert applied(ATTEMPTS.decide(prepared(), RequestCancel(), NOW)).state is AttemptState.CANCELLED
    requested = applied(ATTEMPTS.decide(submitting(), RequestCancel(), NOW))
    assert (requested.state, requested.cancel_requested) == (AttemptState.SUBMITTING, True)
    contained = applied(ATTEMPTS.decide(requested, RecordCancelled(provider_job_id="job-a"), NOW))
    assert (contained.state, contained.provider_job_id) == (AttemptState.CANCELLED, "job-a")


def test_the_reservation_is_released_only_after_terminal_containment_never_while_indeterminate() -> None:
    row = submitting(reservation="gpu-0")
    assert refused(ATTEMPTS.decide(row, ReleaseReservation(), NOW), AttemptRefusal.NOT_FINISHED)
    indeterminate = applied(ATTEMPTS.decide(row, RecordAmbiguous(reason="crash"), NOW))
    assert refused(ATTEMPTS.decide(indeterminate, ReleaseReservation(), NOW), AttemptRefusal.CONTAINMENT_UNPROVEN)
    failed = applied(ATTEMPTS.decide(row, rejection(1), NOW))
    assert applied(ATTEMPTS.decide(failed, ReleaseReservation(), NOW)).reservation_released is True


@given(record=attempt_records())
def test_generated_attempts_keep_every_invariant(record: AttemptRow | None) -> None:
    assert record is None or record_violations(record) == []


def test_terminal_attempts_never_move() -> None:
    for state in (AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELLED):
        row = prepared(state=state, transmissions=1, transmission_egress=("egress-1",), provider_job_id="job-a",
                       submit_lease_expires_at_us=NOW, result_refs=("r",) if state is AttemptState.SUCCEEDED else ())
        for command in (RecordAmbiguous(reason="x"), RequestCancel(), submit("egress-9"),
                        RecordAccepted(provider_job_id="job-a"), ExpireSubmitLease()):
            assert isinstance(ATTEMPTS.decide(row, command, NOW), Refused), (state, command)
