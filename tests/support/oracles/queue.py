"""The machine under test for the owned queue (``specs/queue.md``): its guard glossary written
again, independently of the kernel, and what the shared table, oracle, property and
mutant tests need of it (``tests/support/machines.py`` reads ``UNDER_TEST``)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from machines import INT64_MAX, MachineUnderTest
from tenure.conformance.strategies.queues import situations as queue_situations
from tenure.kernel import QUEUE
from tenure.kernel.queue.commands import QueueCommandType
from tenure.kernel.queue.record import QueueStep
from tenure.model import JobStatus, QueueKind

# --- the queue's guards, from specs/queue.md's glossary --------------------------------------


def _lease_live(record: Any, now: int) -> bool:
    return record.lease_expires_at_us is not None and now < record.lease_expires_at_us


def _fence_mismatch(record: Any, fence: Any, now: int) -> bool:
    same_strings = all(
        isinstance(mine, str) and mine == theirs
        for mine, theirs in (
            (fence.job_id, record.job_id),
            (fence.owner_id, record.owner_id),
            (fence.claim_token, record.claim_token),
        )
    )
    same_generation = type(fence.generation) is int and fence.generation == record.generation
    return not (same_strings and same_generation and fence.queue == record.queue)


def _dedupe_key(record: Any) -> Any:
    return record.active_key if record.queue == QueueKind.STREAMING else record.idempotency_key


def _requested_key(record: Any, command: Any) -> Any:
    return command.active_key if record.queue == QueueKind.STREAMING else command.idempotency_key


QUEUE_ORACLE_GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda r, c, n: True,
    "protection_inconsistent": lambda r, c, n: not (
        (r.submission_id is None) == (r.fingerprint is None) == (not r.fence_required)
    ),
    "legacy_row": lambda r, c, n: r.fence_required is False,
    "other_submission": lambda r, c, n: r.submission_id != c.submission_id,
    "fingerprint_differs": lambda r, c, n: r.fingerprint != c.fingerprint,
    "protected": lambda r, c, n: r.fence_required is True,
    "protected_or_owned": lambda r, c, n: r.fence_required is True
    or (r.status == JobStatus.CLAIMED and r.claim_token is not None),
    "key_differs": lambda r, c, n: _requested_key(r, c) is None or _dedupe_key(r) != _requested_key(r, c),
    "not_forced": lambda r, c, n: c.force is False,
    "delayed": lambda r, c, n: not c.delay_us <= 0,
    "nonce_stored": lambda r, c, n: c.nonce_already_stored is True,
    "other_queue": lambda r, c, n: not (c.queue_names is None or any(r.queue_name == q for q in c.queue_names)),
    "not_due": lambda r, c, n: n < r.fires_at_us,
    "attempts_exhausted": lambda r, c, n: not r.attempts < r.max_attempts,
    "generation_exhausted": lambda r, c, n: r.generation == INT64_MAX or r.generation > INT64_MAX,
    "owner_differs": lambda r, c, n: not (r.owner_id is not None and r.owner_id == c.owner_id),
    "token_differs": lambda r, c, n: not (r.claim_token is not None and r.claim_token == c.claim_token),
    "lease_live": lambda r, c, n: _lease_live(r, n),
    "lease_not_live": lambda r, c, n: not _lease_live(r, n),
    "fence_mismatch": lambda r, c, n: _fence_mismatch(r, c.fence, n),
    "cancel_requested": lambda r, c, n: r.cancel_requested is True,
    "no_cancel_request": lambda r, c, n: r.cancel_requested is False,
    "pid_recorded": lambda r, c, n: not (r.pid is None),
    "retry_allowed": lambda r, c, n: c.retry is True and r.attempts < r.max_attempts,
    "streaming": lambda r, c, n: r.queue == QueueKind.STREAMING,
    "not_streaming": lambda r, c, n: r.queue != QueueKind.STREAMING,
    "not_task": lambda r, c, n: r.queue != QueueKind.TASK,
    "finished_after_cutoff": lambda r, c, n: r.completed_at_us is None or not r.completed_at_us < c.older_than_us,
}


def _queue_state(record: Any) -> enum.Enum:
    return QueueStep.ABSENT if record is None else QueueStep(record.status.value)


UNDER_TEST = MachineUnderTest(
    name="queue",
    machine=QUEUE,
    situations=lambda state=None, kind=None: queue_situations(state, kind),
    terminal=frozenset({QueueStep.COMPLETED, QueueStep.FAILED, QueueStep.CANCELLED}),
    live=frozenset({QueueStep.PENDING, QueueStep.CLAIMED}),
    terminal_exit_allowed=lambda state, command, rule: (
        rule.target is QueueStep.ABSENT
        and command in (QueueCommandType.DELETE_LEGACY, QueueCommandType.PURGE_FINISHED)
    ) or (  # TR-Q4's one exception: an operator's retry of a failed job
        state is QueueStep.FAILED and command is QueueCommandType.RETRY_FAILED and rule.target is QueueStep.PENDING
    ),
    state_of_record=_queue_state,
    oracle_guards=QUEUE_ORACLE_GUARDS,
)
