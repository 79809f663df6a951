"""Each guarantee of the owned queue, as a plain example a reviewer can read."""

from __future__ import annotations

import dataclasses

import pytest

from tenure.kernel import QUEUE, Applied, Refused
from tenure.kernel.queue.commands import (
    Ack,
    AcknowledgeCancelOwned,
    CancelAdmin,
    ClaimFence,
    ClaimGranted,
    ClaimLegacy,
    ClaimOwned,
    CompleteLegacy,
    CompleteOwned,
    DeleteLegacy,
    ExpireLease,
    FailLegacy,
    FailOwned,
    HeartbeatLegacy,
    HeartbeatOwned,
    ProgressOwned,
    PurgeFinished,
    ReadStateOwned,
    RecoverOwned,
    ReleaseKeyForLegacy,
    ReleaseKeyForOwned,
    ReleaseOwned,
    RequestCancel,
    RetryFailed,
    SetPidLegacy,
    SetPidOwned,
    StreamingStateReply,
    SubmitLegacy,
    SubmitOwned,
    Submitted,
)
from tenure.kernel.queue.machine import OUTCOMES, QueueRefusal, backoff_delay_us, claim_identity_problem
from tenure.kernel.queue.record import QueueRow, record_violations
from tenure.model import ErrorCode, JobStatus, QueueClaimFence, QueueKind, bounds

NOW = 1_800_000_000_000_000
LEASE = 30_000_000


def pending(queue: QueueKind = QueueKind.VALIDATION, **changes: object) -> QueueRow:
    """An owned submission waiting to be claimed."""
    record = QueueRow(
        queue=queue,
        job_id="job-1",
        run_id="run-1" if queue is QueueKind.PIPELINE else None,
        status=JobStatus.PENDING,
        attempts=0,
        max_attempts=3,
        generation=0,
        owner_id=None,
        claim_token=None,
        claimed_at_us=None,
        lease_expires_at_us=None,
        fires_at_us=NOW - 1,
        created_at_us=NOW - 10,
        completed_at_us=None,
        cancel_requested=False,
        pid=None,
        fence_required=True,
        submission_id="sub-1",
        fingerprint="v1:aaaa",
        idempotency_key=None,
        active_key="streaming:orders@1" if queue is QueueKind.STREAMING else None,
        dlq_record_id=None,
        error_message=None,
        result_json=None,
        payload=("c", "1", "{}", None),
        queue_name="emails" if queue is QueueKind.TASK else None,
        task_name="send_welcome" if queue is QueueKind.TASK else None,
    )
    record = dataclasses.replace(record, **changes)  # type: ignore[arg-type]
    assert record_violations(record) == []
    return record


def claimed(queue: QueueKind = QueueKind.VALIDATION, **changes: object) -> QueueRow:
    """An owned, live claim by worker-a with token-1 at generation 1."""
    base = pending(queue)
    record = dataclasses.replace(
        base,
        status=JobStatus.CLAIMED,
        attempts=1,
        generation=1,
        owner_id="worker-a",
        claim_token="token-1",
        claimed_at_us=NOW - 5,
        lease_expires_at_us=NOW + LEASE,
    )
    record = dataclasses.replace(record, **changes)  # type: ignore[arg-type]
    assert record_violations(record) == []
    return record


def fence_of(record: QueueRow, **changes: object) -> ClaimFence:
    assert record.owner_id is not None and record.claim_token is not None
    parts = dict(
        queue=record.queue,
        job_id=record.job_id,
        owner_id=record.owner_id,
        generation=record.generation,
        claim_token=record.claim_token,
    )
    parts.update(changes)
    return ClaimFence(**parts)  # type: ignore[arg-type]


def complete(fence: ClaimFence) -> CompleteOwned:
    return CompleteOwned(fence=fence, result_json='{"rows":3}')


def fail(fence: ClaimFence, *, retry: bool) -> FailOwned:
    return FailOwned(
        fence=fence, error_message="boom", retry=retry, dlq_record_id="dlq-1",
        backoff_base_ms=1000, backoff_max_ms=300_000,
    )


def refused(decision: object, reason: QueueRefusal) -> bool:
    return isinstance(decision, Refused) and decision.reason is reason


# --- Fenced writes -------------------------------------------------------------------


def test_complete_with_the_exact_live_fence_applies_and_stores_the_result() -> None:
    record = claimed()
    decision = QUEUE.decide(record, complete(fence_of(record)), NOW)
    assert isinstance(decision, Applied) and decision.reply == Ack()
    assert decision.new_record is not None
    assert decision.new_record.status is JobStatus.COMPLETED
    assert decision.new_record.result_json == '{"rows":3}'
    assert decision.new_record.lease_expires_at_us is None


@pytest.mark.parametrize(
    "change",
    [
        {"owner_id": "worker-b"},
        {"owner_id": "Worker-A"},
        {"owner_id": "worker-a "},
        {"claim_token": "TOKEN-1"},
        {"claim_token": "token-1 "},
        {"job_id": "JOB-1"},
        {"queue": QueueKind.PIPELINE},
        {"generation": 2},
    ],
    ids=["other-owner", "owner-case", "owner-padding", "token-case", "token-padding", "job-case", "queue", "newer-generation"],
)
def test_complete_with_any_fence_part_changed_is_refused_as_stale(change: dict[str, object]) -> None:
    record = claimed()
    assert refused(QUEUE.decide(record, complete(fence_of(record, **change)), NOW), QueueRefusal.STALE_FENCE)


def test_complete_with_an_older_generation_and_the_same_token_is_refused() -> None:
    # A token can legitimately come back after a legacy claim cleared it; only the
    # generation then tells the incarnations apart.
    record = claimed(generation=5, attempts=1)
    assert refused(QUEUE.decide(record, complete(fence_of(record, generation=4)), NOW), QueueRefusal.STALE_FENCE)


def test_a_fence_whose_generation_is_a_bool_never_matches() -> None:
    record = claimed()
    assert refused(QUEUE.decide(record, complete(fence_of(record, generation=True)), NOW), QueueRefusal.STALE_FENCE)


def test_the_kernel_fence_carries_the_public_fence_parts_unchanged() -> None:
    public = QueueClaimFence(QueueKind.STREAMING, "job-1", "worker-a", 7, "token-1")
    assert ClaimFence.of(public) == ClaimFence(
        queue=QueueKind.STREAMING, job_id="job-1", owner_id="worker-a", generation=7, claim_token="token-1"
    )


def test_the_fence_constructor_refuses_a_bool_generation() -> None:
    from tenure.model import ConfigValidationError

    with pytest.raises(ConfigValidationError):
        QueueClaimFence(QueueKind.VALIDATION, "job-1", "worker-a", True, "token-1")  # type: ignore[arg-type]


def test_complete_when_the_lease_ends_exactly_now_is_refused() -> None:
    record = claimed(lease_expires_at_us=NOW)
    assert refused(QUEUE.decide(record, complete(fence_of(record)), NOW), QueueRefusal.LEASE_EXPIRED)


def test_complete_one_microsecond_before_the_lease_ends_applies() -> None:
    record = claimed(lease_expires_at_us=NOW + 1)
    assert isinstance(QUEUE.decide(record, complete(fence_of(record)), NOW), Applied)


def test_a_repeated_completion_returns_false() -> None:
    record = claimed()
    first = QUEUE.decide(record, complete(fence_of(record)), NOW)
    assert isinstance(first, Applied) and first.new_record is not None
    assert refused(QUEUE.decide(first.new_record, complete(fence_of(record)), NOW), QueueRefusal.NOT_CLAIMED)


def test_a_row_claimed_by_a_legacy_worker_matches_no_fence() -> None:
    record = claimed(claim_token=None)
    forged = ClaimFence(queue=QueueKind.VALIDATION, job_id="job-1", owner_id="worker-a", generation=1, claim_token="token-1")
    assert refused(QUEUE.decide(record, complete(forged), NOW), QueueRefusal.STALE_FENCE)


def test_heartbeat_renews_the_lease_from_database_time() -> None:
    record = claimed()
    decision = QUEUE.decide(record, HeartbeatOwned(fence=fence_of(record), lease_us=LEASE), NOW + 7)
    assert isinstance(decision, Applied) and decision.new_record is not None
    assert decision.new_record.lease_expires_at_us == NOW + 7 + LEASE


def test_fail_with_retry_waits_the_configured_backoff_and_keeps_the_error() -> None:
    record = claimed(attempts=2, generation=2)
    decision = QUEUE.decide(record, fail(fence_of(record), retry=True), NOW)
    assert isinstance(decision, Applied) and decision.new_record is not None
    assert decision.new_record.status is JobStatus.PENDING
    assert decision.new_record.fires_at_us == NOW + min(300_000, 1000 * 2**2) * 1000
    assert decision.new_record.error_message == "boom"


def test_fail_without_attempts_left_is_terminal_and_keeps_the_dlq_id_as_correlation() -> None:
    record = claimed(attempts=3, generation=3)
    decision = QUEUE.decide(record, fail(fence_of(record), retry=True), NOW)
    assert isinstance(decision, Applied) and decision.new_record is not None
    assert decision.new_record.status is JobStatus.FAILED
    assert decision.new_record.dlq_record_id == "dlq-1"


def test_backoff_doubles_per_attempt_up_to_its_maximum() -> None:
    assert [backoff_delay_us(n, 1000, 300_000) // 1000 for n in range(0, 10)] == [
        1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000, 300000,
    ]
    assert backoff_delay_us(10**9, 1000, 300_000) == 300_000_000
    assert backoff_delay_us(-3, 1000, 300_000) == 1_000_000


# --- Streaming cancellation ----------------------------------------------------------


def test_a_cancel_requested_stream_cannot_complete_fail_or_change_its_pid() -> None:
    record = claimed(QueueKind.STREAMING, cancel_requested=True, pid=42)
    fence = fence_of(record)
    for command in (
        complete(fence),
        FailOwned(fence=fence, error_message="x", retry=False, dlq_record_id=None, backoff_base_ms=0, backoff_max_ms=0),
        SetPidOwned(fence=fence, pid=43),
    ):
        assert refused(QUEUE.decide(record, command, NOW), QueueRefusal.CANCEL_REQUESTED)


def test_a_cancel_requested_stream_can_still_heartbeat_and_read_its_state() -> None:
    record = claimed(QueueKind.STREAMING, cancel_requested=True, pid=42)
    assert isinstance(QUEUE.decide(record, HeartbeatOwned(fence=fence_of(record), lease_us=LEASE), NOW), Applied)
    state = QUEUE.decide(record, ReadStateOwned(fence=fence_of(record)), NOW)
    assert isinstance(state, Applied) and state.reply == StreamingStateReply(True, 42)


def test_cancel_acknowledgement_needs_a_request_and_then_cancels_clears_and_releases_the_key() -> None:
    record = claimed(QueueKind.STREAMING, pid=42)
    assert refused(QUEUE.decide(record, AcknowledgeCancelOwned(fence=fence_of(record)), NOW), QueueRefusal.NO_CANCEL_REQUEST)
    requested = QUEUE.decide(record, RequestCancel(), NOW)
    assert isinstance(requested, Applied) and requested.new_record is not None
    acked = QUEUE.decide(requested.new_record, AcknowledgeCancelOwned(fence=fence_of(record)), NOW)
    assert isinstance(acked, Applied) and acked.new_record is not None
    new = acked.new_record
    assert (new.status, new.lease_expires_at_us, new.pid, new.active_key) == (JobStatus.CANCELLED, None, None, None)


def test_an_expired_cancel_requested_stream_becomes_cancelled_never_executable_again() -> None:
    record = claimed(QueueKind.STREAMING, cancel_requested=True, lease_expires_at_us=NOW)
    decision = QUEUE.decide(record, ExpireLease(), NOW)
    assert isinstance(decision, Applied) and decision.new_record is not None
    assert decision.new_record.status is JobStatus.CANCELLED


def test_request_cancel_ends_a_pending_stream_at_once_and_refuses_a_finished_one() -> None:
    decision = QUEUE.decide(pending(QueueKind.STREAMING), RequestCancel(), NOW)
    assert isinstance(decision, Applied) and decision.new_record is not None
    assert decision.new_record.status is JobStatus.CANCELLED
    assert refused(QUEUE.decide(decision.new_record, RequestCancel(), NOW), QueueRefusal.ALREADY_FINISHED)


# --- Giving a claim back --------------------------------------------------------------


def test_a_release_gives_the_claim_back_pending_in_its_place_with_its_attempt_returned() -> None:
    record = claimed(QueueKind.STREAMING, attempts=2, fires_at_us=NOW - 7)
    decision = QUEUE.decide(record, ReleaseOwned(fence=fence_of(record)), NOW)
    assert isinstance(decision, Applied) and decision.reply == Ack() and decision.new_record is not None
    new = decision.new_record
    assert (new.status, new.attempts, new.fires_at_us, new.generation) == (JobStatus.PENDING, 1, NOW - 7, 1)
    assert (new.lease_expires_at_us, new.owner_id, new.claim_token) == (None, "worker-a", "token-1")
    assert new.active_key == record.active_key  # still the config's live launch
    # The released fence is void, and the next claim takes the job at the next generation.
    assert refused(QUEUE.decide(new, ReleaseOwned(fence=fence_of(record)), NOW), QueueRefusal.NOT_CLAIMED)
    assert refused(QUEUE.decide(new, complete(fence_of(record)), NOW), QueueRefusal.NOT_CLAIMED)
    again = QUEUE.decide(new, ClaimOwned(owner_id="worker-b", claim_token="token-2", nonce_already_stored=False,
                                   lease_us=LEASE), NOW)
    assert isinstance(again, Applied) and again.new_record is not None
    assert (again.new_record.generation, again.new_record.attempts) == (2, 2)


@pytest.mark.parametrize("delay_us", [1, 1_000_000])
def test_a_release_with_a_delay_is_due_that_long_after_now_with_its_attempt_returned(delay_us: int) -> None:
    # A worker that cannot run the job (a Run hop of a version it does not serve) gives
    # it back for another one: not due again at once, so it does not take it back itself.
    record = claimed(QueueKind.TASK, attempts=1, fires_at_us=NOW - 7)
    decision = QUEUE.decide(record, ReleaseOwned(fence=fence_of(record), delay_us=delay_us), NOW)
    assert isinstance(decision, Applied) and decision.reply == Ack() and decision.new_record is not None
    new = decision.new_record
    assert (new.status, new.attempts, new.fires_at_us, new.generation) == (JobStatus.PENDING, 0, NOW + delay_us, 1)
    claim = ClaimOwned(owner_id="worker-b", claim_token="token-2", nonce_already_stored=False, lease_us=LEASE)
    assert refused(QUEUE.decide(new, claim, NOW + delay_us - 1), QueueRefusal.NOT_ELIGIBLE)
    assert isinstance(QUEUE.decide(new, claim, NOW + delay_us), Applied)
    # The fence is checked first, as for any release.
    assert refused(QUEUE.decide(record, ReleaseOwned(fence=fence_of(record, generation=2), delay_us=delay_us), NOW),
                   QueueRefusal.STALE_FENCE)


def test_releasing_every_claim_never_spends_the_attempt_budget() -> None:
    record = pending(max_attempts=1)
    for n in range(5):
        claim = ClaimOwned(owner_id="worker-a", claim_token=f"token-{n}", nonce_already_stored=False, lease_us=LEASE)
        taken = QUEUE.decide(record, claim, NOW)
        assert isinstance(taken, Applied) and taken.new_record is not None
        released = QUEUE.decide(taken.new_record, ReleaseOwned(fence=fence_of(taken.new_record)), NOW)
        assert isinstance(released, Applied) and released.new_record is not None
        record = released.new_record
        assert (record.status, record.attempts, record.generation) == (JobStatus.PENDING, 0, n + 1)


@pytest.mark.parametrize("change", [{"owner_id": "worker-b"}, {"generation": 2}, {"claim_token": "token-2"}])
def test_a_release_with_any_fence_part_changed_is_refused_as_stale(change: dict[str, object]) -> None:
    record = claimed()
    assert refused(QUEUE.decide(record, ReleaseOwned(fence=fence_of(record, **change)), NOW), QueueRefusal.STALE_FENCE)


def test_a_release_after_the_lease_or_under_a_cancel_request_is_refused() -> None:
    expired = claimed(lease_expires_at_us=NOW)
    assert refused(QUEUE.decide(expired, ReleaseOwned(fence=fence_of(expired)), NOW), QueueRefusal.LEASE_EXPIRED)
    stopping = claimed(QueueKind.STREAMING, cancel_requested=True)
    assert refused(QUEUE.decide(stopping, ReleaseOwned(fence=fence_of(stopping)), NOW), QueueRefusal.CANCEL_REQUESTED)


def test_a_launch_whose_process_started_is_not_released() -> None:
    # Its process may still run: a second launcher must not start another at once.
    running = claimed(QueueKind.STREAMING, pid=42)
    assert refused(QUEUE.decide(running, ReleaseOwned(fence=fence_of(running)), NOW), QueueRefusal.OPERATION_INELIGIBLE)
    not_started = claimed(QueueKind.STREAMING)
    assert isinstance(QUEUE.decide(not_started, ReleaseOwned(fence=fence_of(not_started)), NOW), Applied)


# --- An operator's retry of a failed job ------------------------------------------------


def failed(queue: QueueKind = QueueKind.VALIDATION, **changes: object) -> QueueRow:
    """A job whose every attempt failed (its last claim's identity kept)."""
    record = dataclasses.replace(
        claimed(queue), status=JobStatus.FAILED, attempts=3, generation=3, lease_expires_at_us=None,
        completed_at_us=NOW - 2, error_message="boom", active_key=None,
        dlq_record_id=None if queue is QueueKind.STREAMING else "dlq-1",
    )
    record = dataclasses.replace(record, **changes)  # type: ignore[arg-type]
    assert record_violations(record) == []
    return record


def test_a_retried_failed_job_is_pending_at_once_with_a_fresh_budget_and_its_last_error() -> None:
    record = failed()
    decision = QUEUE.decide(record, RetryFailed(), NOW)
    assert isinstance(decision, Applied) and decision.reply == Ack() and decision.new_record is not None
    new = decision.new_record
    assert (new.status, new.attempts, new.fires_at_us, new.completed_at_us) == (JobStatus.PENDING, 0, NOW, None)
    assert (new.error_message, new.dlq_record_id, new.generation) == ("boom", None, 3)
    assert (new.submission_id, new.fingerprint, new.job_id) == (record.submission_id, record.fingerprint, record.job_id)
    again = QUEUE.decide(new, ClaimOwned(owner_id="worker-b", claim_token="token-9", nonce_already_stored=False,
                                   lease_us=LEASE), NOW)
    assert isinstance(again, Applied) and again.new_record is not None
    assert (again.new_record.attempts, again.new_record.generation) == (1, 4)


def test_only_a_failed_job_is_retried() -> None:
    assert refused(QUEUE.decide(None, RetryFailed(), NOW), QueueRefusal.NOT_FOUND)
    assert refused(QUEUE.decide(pending(), RetryFailed(), NOW), QueueRefusal.NOT_FINISHED)
    assert refused(QUEUE.decide(claimed(), RetryFailed(), NOW), QueueRefusal.NOT_FINISHED)
    done = dataclasses.replace(failed(), status=JobStatus.COMPLETED, error_message=None, dlq_record_id=None,
                               result_json="{}")
    assert refused(QUEUE.decide(done, RetryFailed(), NOW), QueueRefusal.NOT_FAILED)
    stopped = dataclasses.replace(failed(), status=JobStatus.CANCELLED, error_message=None, dlq_record_id=None)
    assert refused(QUEUE.decide(stopped, RetryFailed(), NOW), QueueRefusal.NOT_FAILED)
    # A failed launch's active key is gone (another launch may hold it): a forced rerun instead.
    assert refused(QUEUE.decide(failed(QueueKind.STREAMING), RetryFailed(), NOW), QueueRefusal.OPERATION_INELIGIBLE)


# --- Lease expiry --------------------------------------------------------------------


def test_an_expired_claim_with_attempts_left_returns_to_pending() -> None:
    record = claimed(lease_expires_at_us=NOW - 1)
    decision = QUEUE.decide(record, ExpireLease(), NOW)
    assert isinstance(decision, Applied) and decision.new_record is not None
    assert decision.new_record.status is JobStatus.PENDING


def test_an_expired_claim_without_attempts_left_fails() -> None:
    record = claimed(attempts=3, generation=3, lease_expires_at_us=NOW)
    decision = QUEUE.decide(record, ExpireLease(), NOW)
    assert isinstance(decision, Applied) and decision.new_record is not None
    assert decision.new_record.status is JobStatus.FAILED


def test_a_live_lease_is_not_expired() -> None:
    assert refused(QUEUE.decide(claimed(lease_expires_at_us=NOW + 1), ExpireLease(), NOW), QueueRefusal.LEASE_STILL_LIVE)


# --- Claims and recovery -------------------------------------------------------------


def claim(token: str = "token-9", *, stored: bool = False) -> ClaimOwned:
    return ClaimOwned(owner_id="worker-b", claim_token=token, nonce_already_stored=stored, lease_us=LEASE)


def test_a_claim_with_a_stored_nonce_is_a_conflict_even_when_nothing_is_eligible() -> None:
    assert refused(QUEUE.decide(pending(), claim(stored=True), NOW), QueueRefusal.NONCE_REUSED)
    assert refused(QUEUE.decide(None, claim(stored=True), NOW), QueueRefusal.NONCE_REUSED)
    assert OUTCOMES[QueueRefusal.NONCE_REUSED] is ErrorCode.QUEUE_CLAIM_CONFLICT


def test_a_claim_at_the_last_generation_is_refused_instead_of_overflowing() -> None:
    record = pending(generation=bounds.INT64_MAX, owner_id="worker-a")
    assert refused(QUEUE.decide(record, claim(), NOW), QueueRefusal.GENERATION_EXHAUSTED)
    assert OUTCOMES[QueueRefusal.GENERATION_EXHAUSTED] is ErrorCode.QUEUE_CLAIM_CONFLICT


def test_the_generation_advances_on_every_claim_independently_of_attempts() -> None:
    record = pending(generation=7, attempts=0, owner_id="worker-a")
    decision = QUEUE.decide(record, claim(), NOW)
    assert isinstance(decision, Applied) and decision.new_record is not None
    assert (decision.new_record.generation, decision.new_record.attempts) == (8, 1)


def test_a_job_that_is_not_yet_due_is_not_claimed() -> None:
    assert refused(QUEUE.decide(pending(fires_at_us=NOW + 1), claim(), NOW), QueueRefusal.NOT_ELIGIBLE)
    assert isinstance(QUEUE.decide(pending(fires_at_us=NOW), claim(), NOW), Applied)


def test_a_legacy_claim_never_takes_a_protected_submission() -> None:
    command = ClaimLegacy(owner_id="worker-b", lease_us=LEASE)
    assert refused(QUEUE.decide(pending(), command, NOW), QueueRefusal.NOT_ELIGIBLE)
    legacy = pending(fence_required=False, submission_id=None, fingerprint=None)
    decision = QUEUE.decide(legacy, command, NOW)
    assert isinstance(decision, Applied) and decision.new_record is not None
    assert decision.new_record.claim_token is None


def test_an_owned_claim_of_a_legacy_row_protects_the_claim_but_does_not_make_it_a_submission() -> None:
    legacy = pending(fence_required=False, submission_id=None, fingerprint=None)
    decision = QUEUE.decide(legacy, claim(), NOW)
    assert isinstance(decision, Applied) and decision.new_record is not None
    new = decision.new_record
    assert new.claim_token == "token-9" and not new.fence_required and new.submission_id is None
    assert refused(QUEUE.decide(new, CompleteLegacy(result_json=None), NOW), QueueRefusal.OWNED_INCARNATION)


def test_recovery_returns_the_live_claim_and_changes_nothing() -> None:
    record = claimed()
    decision = QUEUE.decide(record, RecoverOwned(owner_id="worker-a", claim_token="token-1"), NOW)
    assert isinstance(decision, Applied) and decision.reply == ClaimGranted()
    assert decision.new_record == record


@pytest.mark.parametrize(
    ("record_changes", "owner"),
    [({}, "worker-b"), ({"lease_expires_at_us": NOW}, "worker-a")],
    ids=["other-owner", "expired"],
)
def test_recovery_of_another_owner_or_an_expired_claim_observes_nothing(record_changes: dict[str, object], owner: str) -> None:
    record = claimed(**record_changes)
    assert refused(QUEUE.decide(record, RecoverOwned(owner_id=owner, claim_token="token-1"), NOW), QueueRefusal.NO_LIVE_CLAIM)


def test_claim_identity_read_back_must_be_exact() -> None:
    expected = claimed()
    assert claim_identity_problem(expected, "worker-a", "token-1", 1) is None
    for owner, token, generation in [
        ("worker-a ", "token-1", 1),
        ("WORKER-A", "token-1", 1),
        ("worker-a", "token-1 ", 1),
        ("worker-a", "token-1", 2),
        ("worker-a", "token-1", True),
        ("worker-a", "token-1", "1"),
        (None, "token-1", 1),
    ]:
        assert claim_identity_problem(expected, owner, token, generation) == "claim_identity_changed"


# --- Submission ----------------------------------------------------------------------


def submit_owned(**changes: object) -> SubmitOwned:
    fields: dict[str, object] = dict(
        queue=QueueKind.VALIDATION, submission_id="sub-1", fingerprint="v1:aaaa", job_id="job-new",
        run_id=None, fires_at_us=None, max_attempts=3, idempotency_key=None, active_key=None,
        payload=("c", "1", "{}", None),
    )
    fields.update(changes)
    return SubmitOwned(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("status", list(JobStatus), ids=lambda s: s.value)
def test_an_exact_replay_returns_the_original_id_in_every_status(status: JobStatus) -> None:
    record = claimed() if status is JobStatus.CLAIMED else pending()
    if status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED):
        record = dataclasses.replace(record, status=status, completed_at_us=NOW)
    decision = QUEUE.decide(record, submit_owned(), NOW)
    assert isinstance(decision, Applied)
    assert decision.reply == Submitted("job-1", None, replayed=True)
    assert decision.new_record == record


def test_changed_content_under_the_same_submission_id_conflicts() -> None:
    decision = QUEUE.decide(pending(), submit_owned(fingerprint="v1:bbbb"), NOW)
    assert refused(decision, QueueRefusal.FINGERPRINT_MISMATCH)
    assert OUTCOMES[QueueRefusal.FINGERPRINT_MISMATCH] is ErrorCode.QUEUE_SUBMISSION_CONFLICT


def test_a_legacy_row_is_never_promoted_by_an_owned_submission() -> None:
    legacy = pending(fence_required=False, submission_id=None, fingerprint=None, idempotency_key="key-1")
    decision = QUEUE.decide(legacy, submit_owned(idempotency_key="key-1"), NOW)
    assert refused(decision, QueueRefusal.LEGACY_ROW_COLLISION)


def test_another_submission_with_the_same_job_id_conflicts() -> None:
    assert refused(QUEUE.decide(pending(submission_id="sub-2"), submit_owned(), NOW), QueueRefusal.IDENTITY_COLLISION)


def test_a_new_owned_submission_is_protected_with_generation_zero_and_no_token() -> None:
    decision = QUEUE.decide(None, submit_owned(), NOW)
    assert isinstance(decision, Applied) and decision.new_record is not None
    new = decision.new_record
    assert (new.fence_required, new.generation, new.claim_token, new.fires_at_us) == (True, 0, None, NOW)


def test_a_legacy_submission_returns_an_unprotected_row_holding_its_key_but_refuses_a_protected_one() -> None:
    command = SubmitLegacy(
        queue=QueueKind.VALIDATION, job_id="job-9", run_id=None, fires_at_us=None,
        max_attempts=3, idempotency_key="key-1", active_key=None, payload=("c", "1", "{}", None),
    )
    legacy = pending(fence_required=False, submission_id=None, fingerprint=None, idempotency_key="key-1")
    decision = QUEUE.decide(legacy, command, NOW)
    assert isinstance(decision, Applied) and decision.reply == Submitted("job-1", None, replayed=True)
    assert refused(QUEUE.decide(pending(idempotency_key="key-1"), command, NOW), QueueRefusal.PROTECTED_KEY_COLLISION)


# --- Forced streaming rerun ----------------------------------------------------------


def test_a_forced_rerun_cancels_an_active_owned_predecessor_and_releases_its_key() -> None:
    for predecessor in (pending(QueueKind.STREAMING), claimed(QueueKind.STREAMING, pid=7)):
        decision = QUEUE.decide(predecessor, ReleaseKeyForOwned(force=True), NOW)
        assert isinstance(decision, Applied) and decision.new_record is not None
        assert (decision.new_record.status, decision.new_record.active_key) == (JobStatus.CANCELLED, None)


def test_an_unforced_owned_submission_conflicts_with_an_active_owned_predecessor() -> None:
    assert refused(QUEUE.decide(claimed(QueueKind.STREAMING), ReleaseKeyForOwned(force=False), NOW), QueueRefusal.ACTIVE_KEY_HELD)


def test_a_legacy_predecessor_refuses_an_owned_rerun() -> None:
    legacy = pending(QueueKind.STREAMING, fence_required=False, submission_id=None, fingerprint=None)
    assert refused(QUEUE.decide(legacy, ReleaseKeyForOwned(force=True), NOW), QueueRefusal.LEGACY_PREDECESSOR)


def test_a_legacy_force_cannot_cancel_protected_or_owned_work() -> None:
    assert refused(QUEUE.decide(pending(QueueKind.STREAMING), ReleaseKeyForLegacy(), NOW), QueueRefusal.PROTECTED_PREDECESSOR)
    owned_claim_of_legacy_row = claimed(
        QueueKind.STREAMING, fence_required=False, submission_id=None, fingerprint=None
    )
    assert refused(QUEUE.decide(owned_claim_of_legacy_row, ReleaseKeyForLegacy(), NOW), QueueRefusal.PROTECTED_PREDECESSOR)


def test_a_terminal_owned_predecessor_still_holding_a_key_releases_it_without_force() -> None:
    old = dataclasses.replace(pending(QueueKind.STREAMING), status=JobStatus.FAILED, completed_at_us=NOW - 1)
    decision = QUEUE.decide(old, ReleaseKeyForOwned(force=False), NOW)
    assert isinstance(decision, Applied) and decision.new_record is not None
    assert (decision.new_record.status, decision.new_record.active_key) == (JobStatus.FAILED, None)


# --- Legacy coexistence --------------------------------------------------------------


LEGACY_WRITES = [
    HeartbeatLegacy(owner_id="worker-a", lease_us=LEASE),
    CompleteLegacy(result_json=None),
    FailLegacy(error_message="x", retry=True, dlq_record_id=None, backoff_base_ms=0, backoff_max_ms=0),
    SetPidLegacy(pid=9),
]


@pytest.mark.parametrize("command", LEGACY_WRITES, ids=lambda c: c.kind.value)
def test_legacy_writes_never_change_a_protected_submission(command: object) -> None:
    record = claimed(QueueKind.STREAMING, claim_token=None)
    assert refused(QUEUE.decide(record, command, NOW), QueueRefusal.PROTECTED_ROW)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", LEGACY_WRITES, ids=lambda c: c.kind.value)
def test_legacy_writes_never_change_a_currently_owned_incarnation(command: object) -> None:
    record = claimed(QueueKind.STREAMING, fence_required=False, submission_id=None, fingerprint=None)
    assert refused(QUEUE.decide(record, command, NOW), QueueRefusal.OWNED_INCARNATION)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", LEGACY_WRITES, ids=lambda c: c.kind.value)
def test_legacy_writes_still_work_on_legacy_claims(command: object) -> None:
    record = claimed(QueueKind.STREAMING, fence_required=False, submission_id=None, fingerprint=None, claim_token=None)
    assert isinstance(QUEUE.decide(record, command, NOW), Applied)  # type: ignore[arg-type]


def test_delete_and_retention_skip_protected_rows() -> None:
    finished = dataclasses.replace(pending(), status=JobStatus.COMPLETED, completed_at_us=NOW - 100)
    assert refused(QUEUE.decide(finished, DeleteLegacy(), NOW), QueueRefusal.PROTECTED_ROW)
    assert refused(QUEUE.decide(finished, PurgeFinished(older_than_us=NOW), NOW), QueueRefusal.PROTECTED_ROW)
    legacy = dataclasses.replace(finished, fence_required=False, submission_id=None, fingerprint=None)
    assert QUEUE.decide(legacy, PurgeFinished(older_than_us=NOW), NOW) == Applied(None, Ack())
    assert refused(QUEUE.decide(legacy, PurgeFinished(older_than_us=NOW - 100), NOW), QueueRefusal.RETAINED)


def test_administrative_cancel_voids_a_live_owned_fence_but_keeps_the_submission_identity() -> None:
    record = claimed()
    decision = QUEUE.decide(record, CancelAdmin(), NOW)
    assert isinstance(decision, Applied) and decision.new_record is not None
    cancelled = decision.new_record
    assert (cancelled.status, cancelled.submission_id, cancelled.fingerprint) == (JobStatus.CANCELLED, "sub-1", "v1:aaaa")
    assert refused(QUEUE.decide(cancelled, complete(fence_of(record)), NOW), QueueRefusal.NOT_CLAIMED)


def test_every_refusal_has_an_outcome_and_only_submission_and_claim_conflicts_raise() -> None:
    assert set(OUTCOMES) == set(QueueRefusal)
    raising = {reason for reason, outcome in OUTCOMES.items() if outcome is not None}
    assert {QueueRefusal.NONCE_REUSED, QueueRefusal.GENERATION_EXHAUSTED, QueueRefusal.FINGERPRINT_MISMATCH} <= raising
    assert QueueRefusal.STALE_FENCE not in raising and QueueRefusal.LEASE_EXPIRED not in raising


# --- tasks (issue 30): the queue a claim serves, progress, and a retry's jitter ----------------


def task(**changes: object) -> QueueRow:
    """A pending task of the queue ``emails`` at priority 50."""
    return pending(QueueKind.TASK, queue_name="emails", priority=50, **changes)


def test_a_task_claim_takes_only_a_task_of_a_queue_it_serves() -> None:
    record = task()
    serving = ClaimOwned(owner_id="w", claim_token="t", nonce_already_stored=False, lease_us=LEASE,
                         queue_names=("reports", "emails"))
    decision = QUEUE.decide(record, serving, NOW)
    assert isinstance(decision, Applied) and decision.new_record.status is JobStatus.CLAIMED
    for claim in (dataclasses.replace(serving, queue_names=("reports",)),
                  dataclasses.replace(serving, queue_names=("Emails",)),
                  ClaimLegacy(owner_id="w", lease_us=LEASE, queue_names=("reports",))):
        refused = QUEUE.decide(dataclasses.replace(record, fence_required=False), claim, NOW)
        assert isinstance(refused, Refused) and refused.reason is QueueRefusal.NOT_ELIGIBLE


def test_progress_is_recorded_only_on_the_exact_live_claim_of_a_task() -> None:
    record = claimed(QueueKind.TASK, queue_name="emails", priority=50)
    decision = QUEUE.decide(record, ProgressOwned(fence=fence_of(record), progress_json='{"done":3}'), NOW)
    assert isinstance(decision, Applied) and decision.new_record == dataclasses.replace(record, progress_json='{"done":3}')
    stale = QUEUE.decide(record, ProgressOwned(fence=fence_of(record, generation=2), progress_json="{}"), NOW)
    assert isinstance(stale, Refused) and stale.reason is QueueRefusal.STALE_FENCE
    late = QUEUE.decide(record, ProgressOwned(fence=fence_of(record), progress_json="{}"), NOW + LEASE)
    assert isinstance(late, Refused) and late.reason is QueueRefusal.LEASE_EXPIRED
    job = claimed()
    ineligible = QUEUE.decide(job, ProgressOwned(fence=fence_of(job), progress_json="{}"), NOW)
    assert isinstance(ineligible, Refused) and ineligible.reason is QueueRefusal.OPERATION_INELIGIBLE


@pytest.mark.parametrize("jitter", [0, 1, 250, 499, 500])
def test_a_jittered_retry_waits_between_half_the_backoff_and_all_of_it(jitter: int) -> None:
    record = claimed(QueueKind.TASK, queue_name="emails", priority=50, attempts=2)
    command = FailOwned(fence=fence_of(record), error_message="boom", retry=True, dlq_record_id=None,
                        backoff_base_ms=1000, backoff_max_ms=60_000, jitter_per_mille=jitter)
    decision = QUEUE.decide(record, command, NOW)
    assert isinstance(decision, Applied) and decision.new_record.status is JobStatus.PENDING
    delay = backoff_delay_us(2, 1000, 60_000)
    waited = decision.new_record.fires_at_us - NOW
    assert delay // 2 <= waited <= delay
    assert waited == delay - delay * jitter // 1000
