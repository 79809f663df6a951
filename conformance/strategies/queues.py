"""Hypothesis strategies for queue records and commands.

Values come from small pools with near misses (case, trailing space, a neighbouring
generation, an instant one microsecond either side of ``NOW``) so that equal and
almost-equal values meet often: that is where fences and guards can go wrong.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tenure.kernel.queue.commands import (
    AcknowledgeCancelOwned,
    CancelAdmin,
    ClaimFence,
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
    QueueCommandType,
    ReadStateOwned,
    RecoverOwned,
    ReleaseKeyForLegacy,
    ReleaseKeyForOwned,
    ReleaseOwned,
    RequestCancel,
    RetryFailed,
    SetPidLegacy,
    SetPidOwned,
    SubmitLegacy,
    SubmitOwned,
)
from tenure.kernel.queue.record import QueueRow, QueueStep
from tenure.model import JobStatus, QueueKind, bounds
from tenure.model.states import TERMINAL_STATUSES

from .pools import BOOLEANS, integers, maybe, optional, sampled

__all__ = [
    "NOW", "JOB_IDS", "RUN_IDS", "OWNERS", "TOKENS", "QUEUE_NAMES", "TASK_NAMES", "records", "fences",
    "submissions", "queue_names_for", "commands", "situations",
]

NOW = 1_800_000_000_000_000
"""A database time in 2027, in microseconds."""

JOB_IDS = ["job-1", "job-2", "JOB-1", "job-1 "]
RUN_IDS = ["run-1", "run-2"]
OWNERS = ["worker-a", "worker-b", "Worker-A", "worker-a "]
TOKENS = ["token-1", "token-2", "TOKEN-1", "token-1 "]
SUBMISSIONS = ["sub-1", "sub-2", "SUB-1"]
FINGERPRINTS = ["v1:aaaa", "v1:bbbb"]
KEYS = ["key-1", "key-2"]
ACTIVE_KEYS = ["streaming:orders@1", "streaming:orders@2"]
QUEUE_NAMES = ["emails", "reports", "Emails"]
TASK_NAMES = ["send_welcome", "billing.invoice"]
PRIORITIES = [0, 1, 50, 100]
GENERATIONS = [1, 2, 3, bounds.INT64_MAX - 1, bounds.INT64_MAX]

instants = st.one_of(
    st.integers(NOW - 3, NOW + 3),
    st.integers(NOW - 10**12, NOW + 10**12),
)
small_attempts = st.integers(1, 4) | st.just(bounds.INT32_MAX)

PAYLOADS: dict[QueueKind, tuple[str | None, ...]] = {
    QueueKind.VALIDATION: ("orders", "1", '{"data_source":"s","options":null}',
                           '{"fires_at":null,"job_id":null,"max_attempts":null}'),
    QueueKind.PIPELINE: ('{"concept_scheme":null,"config":{},"fail_fast":true,"variables":null}', None),
    QueueKind.STREAMING: ("orders", "1", '{"force":false,"variables":null}', None),
    QueueKind.TASK: ('{"user_id":1}', '{"retry_base_ms":0,"retry_jitter":false,"retry_max_ms":0}', None),
}
"""A stored payload per queue (the kernel treats it as opaque identity)."""


@st.composite
def records(
    draw: st.DrawFn,
    state: QueueStep | None = None,
    queue: QueueKind | None = None,
) -> QueueRow | None:
    """A record keeping every invariant (INV-Q1 ... INV-Q10), or None for ``absent``."""
    if state is None:
        state = draw(sampled(QueueStep))
    if state is QueueStep.ABSENT:
        return None
    status = JobStatus(state.value)
    queue = queue or draw(sampled(QueueKind))
    claimed = status is JobStatus.CLAIMED
    streaming = queue is QueueKind.STREAMING
    task = queue is QueueKind.TASK
    max_attempts = draw(small_attempts)
    if status is JobStatus.PENDING:
        attempts = draw(integers(0, min(max_attempts - 1, 5)))
    elif claimed:
        attempts = draw(integers(1, min(max_attempts, 5)) | st.just(max_attempts))
    else:
        attempts = draw(integers(0, min(max_attempts, 5)))
    generation = draw(st.just(attempts) | sampled([0, *GENERATIONS]))
    has_owner = claimed or draw(BOOLEANS)
    owner_id = draw(sampled(OWNERS)) if has_owner else None
    claim_token = draw(sampled(TOKENS) | st.none()) if has_owner else None
    if claim_token is not None:
        # A token means an owned claim since the migration; without one, an owner at
        # generation 0 is a legacy claim from before it.
        generation = max(generation, 1)
    owned = draw(BOOLEANS)
    return QueueRow(
        queue=queue,
        job_id=draw(sampled(JOB_IDS)),
        run_id=draw(sampled(RUN_IDS)) if queue is QueueKind.PIPELINE else None,
        status=status,
        attempts=attempts,
        max_attempts=max_attempts,
        generation=generation,
        owner_id=owner_id,
        claim_token=claim_token,
        claimed_at_us=draw(instants) if claimed else draw(st.none() | instants),
        lease_expires_at_us=draw(instants) if claimed else None,
        fires_at_us=draw(instants),
        created_at_us=draw(instants),
        completed_at_us=draw(instants) if status in TERMINAL_STATUSES else None,
        cancel_requested=draw(BOOLEANS) if claimed and streaming else False,
        pid=draw(optional(integers(1, 5))) if claimed and streaming else None,
        fence_required=owned,
        submission_id=draw(sampled(SUBMISSIONS)) if owned else None,
        fingerprint=draw(sampled(FINGERPRINTS)) if owned else None,
        idempotency_key=None if streaming or task else draw(optional(sampled(KEYS))),
        active_key=draw(optional(sampled(ACTIVE_KEYS))) if streaming else None,
        dlq_record_id=None if streaming else draw(maybe("dlq-1")),
        error_message=draw(maybe("boom")),
        result_json=draw(maybe('{"rows":3}')),
        payload=PAYLOADS[queue],
        queue_name=draw(sampled(QUEUE_NAMES)) if task else None,
        task_name=draw(sampled(TASK_NAMES)) if task else None,
        priority=draw(sampled(PRIORITIES)) if task else 0,
        progress_json=draw(maybe('{"done":1}')) if task else None,
    )


@st.composite
def fences(draw: st.DrawFn, record: QueueRow | None) -> ClaimFence:
    """The record's exact fence, or one that differs in exactly one part, or a random one."""
    exact = (
        record is not None
        and record.owner_id is not None
        and record.claim_token is not None
        and record.generation >= 1
    )
    if exact and draw(integers(0, 2)) > 0:
        assert record is not None and record.owner_id is not None and record.claim_token is not None
        parts: dict[str, Any] = {
            "queue": record.queue,
            "job_id": record.job_id,
            "owner_id": record.owner_id,
            "generation": record.generation,
            "claim_token": record.claim_token,
        }
        # Half the time the exact fence (so writes can apply), else one part changed.
        change = None if draw(BOOLEANS) else draw(
            sampled(["queue", "job_id", "owner_id", "generation", "claim_token"])
        )
        if change == "queue":
            parts["queue"] = draw(sampled([q for q in QueueKind if q is not record.queue]))
        elif change == "job_id":
            parts["job_id"] = draw(sampled([j for j in JOB_IDS if j != record.job_id]))
        elif change == "owner_id":
            parts["owner_id"] = draw(sampled([o for o in OWNERS if o != record.owner_id]))
        elif change == "generation":
            older_or_newer = [g for g in (record.generation - 1, record.generation + 1) if 1 <= g <= bounds.INT64_MAX]
            parts["generation"] = draw(sampled(older_or_newer))
        elif change == "claim_token":
            parts["claim_token"] = draw(sampled([t for t in TOKENS if t != record.claim_token]))
        return ClaimFence(**parts)
    return ClaimFence(
        queue=draw(sampled(QueueKind)),
        job_id=draw(sampled(JOB_IDS)),
        owner_id=draw(sampled(OWNERS)),
        generation=draw(sampled(GENERATIONS)),
        claim_token=draw(sampled(TOKENS)),
    )


leases = st.integers(1, 5) | st.just(300_000_000)
backoff = st.tuples(st.integers(0, 3), st.integers(3, 10))


@st.composite
def submissions(draw: st.DrawFn, record: QueueRow | None, owned: bool) -> SubmitOwned | SubmitLegacy:
    queue = record.queue if record is not None and draw(BOOLEANS) else draw(sampled(QueueKind))
    streaming = queue is QueueKind.STREAMING
    fires_at_us = draw(st.none() | instants)
    fields: dict[str, Any] = dict(
        queue=queue,
        job_id=draw(sampled(JOB_IDS)),
        run_id=draw(sampled(RUN_IDS)) if queue is QueueKind.PIPELINE else None,
        fires_at_us=fires_at_us,
        delay_us=draw(sampled([0, 1, 60_000_000])) if fires_at_us is None else 0,
        max_attempts=draw(small_attempts),
        idempotency_key=None if streaming or queue is QueueKind.TASK else draw(optional(sampled(KEYS))),
        active_key=draw(sampled(ACTIVE_KEYS)) if streaming else None,
        payload=PAYLOADS[queue],
        queue_name=draw(sampled(QUEUE_NAMES)) if queue is QueueKind.TASK else None,
        task_name=draw(sampled(TASK_NAMES)) if queue is QueueKind.TASK else None,
        priority=draw(sampled(PRIORITIES)) if queue is QueueKind.TASK else 0,
    )
    if not owned:
        return SubmitLegacy(**fields)
    if record is not None and record.submission_id is not None and draw(BOOLEANS):
        assert record.fingerprint is not None, "an owned submission stores its submission ID and its fingerprint"
        submission_id, fingerprint = record.submission_id, draw(
            st.just(record.fingerprint) | sampled(FINGERPRINTS)
        )
    else:
        submission_id = draw(sampled(SUBMISSIONS))
        fingerprint = draw(sampled(FINGERPRINTS))
    return SubmitOwned(submission_id=submission_id, fingerprint=fingerprint, **fields)


def queue_names_for(record: QueueRow | None) -> st.SearchStrategy[tuple[str, ...] | None]:
    """Any queue, the record's own queue among others, or only other queues."""
    others = st.lists(sampled(QUEUE_NAMES), min_size=1, max_size=2, unique=True).map(tuple)
    if record is None or record.queue_name is None:
        return st.none() | others
    own = record.queue_name
    return st.none() | others | st.just((own,)) | others.map(lambda names: (*names, own) if own not in names else names)


def _owner_for(draw: st.DrawFn, record: QueueRow | None) -> str:
    if record is not None and record.owner_id is not None and draw(BOOLEANS):
        return record.owner_id
    return draw(sampled(OWNERS))


def _token_for(draw: st.DrawFn, record: QueueRow | None) -> str:
    if record is not None and record.claim_token is not None and draw(BOOLEANS):
        return record.claim_token
    return draw(sampled(TOKENS))


@st.composite
def commands(draw: st.DrawFn, kind: QueueCommandType, record: QueueRow | None) -> object:
    """A well-formed command of ``kind``, often aimed at ``record``."""
    if kind is QueueCommandType.SUBMIT_OWNED:
        return draw(submissions(record, owned=True))
    if kind is QueueCommandType.SUBMIT_LEGACY:
        return draw(submissions(record, owned=False))
    if kind is QueueCommandType.RELEASE_KEY_FOR_OWNED:
        return ReleaseKeyForOwned(force=draw(BOOLEANS))
    if kind is QueueCommandType.RELEASE_KEY_FOR_LEGACY:
        return ReleaseKeyForLegacy()
    if kind is QueueCommandType.CLAIM_OWNED:
        return ClaimOwned(
            owner_id=_owner_for(draw, record),
            claim_token=draw(sampled(TOKENS)),
            nonce_already_stored=draw(BOOLEANS),
            lease_us=draw(leases),
            queue_names=draw(queue_names_for(record)),
        )
    if kind is QueueCommandType.CLAIM_LEGACY:
        return ClaimLegacy(owner_id=_owner_for(draw, record), lease_us=draw(leases),
                           queue_names=draw(queue_names_for(record)))
    if kind is QueueCommandType.RECOVER_OWNED:
        return RecoverOwned(owner_id=_owner_for(draw, record), claim_token=_token_for(draw, record))
    if kind is QueueCommandType.EXPIRE_LEASE:
        return ExpireLease()
    if kind is QueueCommandType.HEARTBEAT_OWNED:
        return HeartbeatOwned(fence=draw(fences(record)), lease_us=draw(leases))
    if kind is QueueCommandType.COMPLETE_OWNED:
        return CompleteOwned(fence=draw(fences(record)), result_json=draw(maybe('{"ok":1}')))
    if kind in (QueueCommandType.FAIL_OWNED, QueueCommandType.FAIL_LEGACY):
        base, ceiling = draw(backoff)
        failure: dict[str, Any] = dict(
            error_message="worker error",
            retry=draw(BOOLEANS),
            dlq_record_id=None if record is not None and record.queue is QueueKind.STREAMING else draw(maybe("dlq-9")),
            backoff_base_ms=base,
            backoff_max_ms=ceiling,
            jitter_per_mille=draw(sampled([0, 1, 499, 500])),
        )
        if kind is QueueCommandType.FAIL_LEGACY:
            return FailLegacy(**failure)
        return FailOwned(fence=draw(fences(record)), **failure)
    if kind is QueueCommandType.SET_PID_OWNED:
        return SetPidOwned(fence=draw(fences(record)), pid=draw(integers(1, 5)))
    if kind is QueueCommandType.PROGRESS_OWNED:
        return ProgressOwned(fence=draw(fences(record)), progress_json=draw(sampled(['{"done":2}', "null"])))
    if kind is QueueCommandType.READ_STATE_OWNED:
        return ReadStateOwned(fence=draw(fences(record)))
    if kind is QueueCommandType.ACKNOWLEDGE_CANCEL_OWNED:
        return AcknowledgeCancelOwned(fence=draw(fences(record)))
    if kind is QueueCommandType.RELEASE_OWNED:
        return ReleaseOwned(fence=draw(fences(record)), delay_us=draw(sampled([0, 0, 1, 1_000_000])))
    if kind is QueueCommandType.REQUEST_CANCEL:
        return RequestCancel()
    if kind is QueueCommandType.CANCEL_ADMIN:
        return CancelAdmin()
    if kind is QueueCommandType.RETRY_FAILED:
        return RetryFailed()
    if kind is QueueCommandType.HEARTBEAT_LEGACY:
        return HeartbeatLegacy(owner_id=_owner_for(draw, record), lease_us=draw(leases))
    if kind is QueueCommandType.COMPLETE_LEGACY:
        return CompleteLegacy(result_json=draw(maybe('{"ok":1}')))
    if kind is QueueCommandType.SET_PID_LEGACY:
        return SetPidLegacy(pid=draw(integers(1, 5)))
    if kind is QueueCommandType.DELETE_LEGACY:
        return DeleteLegacy()
    if kind is QueueCommandType.PURGE_FINISHED:
        return PurgeFinished(older_than_us=draw(instants))
    raise AssertionError(f"no strategy for {kind}")


now_values = st.integers(NOW - 3, NOW + 3) | instants


@st.composite
def situations(
    draw: st.DrawFn, state: QueueStep | None = None, kind: QueueCommandType | None = None
) -> tuple[QueueRow | None, object, int]:
    """A (record, command, now) triple; all three generated together so they often meet."""
    record = draw(records(state))
    kind = kind or draw(sampled(QueueCommandType))
    command = draw(commands(kind, record))
    return record, command, draw(_now_near(record))


def _now_near(record: QueueRow | None) -> st.SearchStrategy[int]:
    """Database times at the record's boundaries (one microsecond either side), or anywhere."""
    anchors = [NOW]
    if record is not None:
        anchors += [record.fires_at_us]
        if record.lease_expires_at_us is not None:
            anchors += [record.lease_expires_at_us] * 2
    return sampled(anchors).flatmap(lambda at: st.integers(at - 1, at + 1)) | now_values
