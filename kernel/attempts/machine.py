"""The service-attempt machine (``ServiceJobAttempt@1``): every transition, as one table.

Theory of operation
-------------------
An attempt is written ``prepared`` before anything is sent: that state proves no
transmission started. ``begin_submit`` compare-and-sets it to ``submitting`` before any
driver is called and grants exactly one transmission under the attempt's idempotency
key, a fresh egress decision and a submit lease (how long the sender may still be
transmitting). What comes back moves it on: an acknowledgement with the provider's job
identity (``accepted``), progress (``running``), a result (``succeeded``), evidence of a
failure (``failed``: a rejection before any effect while submitting, or a failure the
provider reported for an accepted job), proof of containment (``cancelled``). Anything
uncertain after transmission (a timeout, a disconnect, a crash, a malformed or lost
acknowledgement) stays ``submitting`` or becomes ``indeterminate``: never ``failed``.

``indeterminate`` is not terminal and never times out. It leaves only through an
observation (reconciliation looks up the same provider and key and moves only on what it
saw) or a proven resubmission. A resubmission is legal only with proof that the last
transmission had no effect (a lookup that vouches for it, outside the submit lease), or
on a binding whose provider replays the same key atomically. The provider's job identity
is recorded once and never changes: a second, different one is a conflict.

An attempt that names a Run recorded in the same database is prepared only while that
Run is ``running`` (observed under the Run's lock, which the Run ledger's settlement and
cancellation also take before they count the Run's open attempts): so no attempt lands
behind a containment check that already passed.

Three actors move an attempt: its runner (submit, acknowledgements, polls), a
reconciler after a crash (lookups, the submit lease's end), and the owner (cancel,
reservation release). The invariants (``specs/attempts.md``): the record invariants of
:mod:`tenure.kernel.attempts.record`, and the transition rules of
:func:`transition_violations`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from tenure.model import TERMINAL_ATTEMPT_STATES, AttemptState, ErrorCode

from ..core import SAME, Applied, Decision, Machine, Refused, Row
from .commands import (
    Ack,
    AttemptCommand,
    AttemptCommandType,
    EgressDenied,
    FailureKind,
    LookupKind,
    Prepared,
    TransmissionGranted,
)
from .record import MAX_EVIDENCE, AttemptRow, AttemptStep, record_violations, replace_fields, step_of

__all__ = [
    "AttemptRefusal",
    "OUTCOMES",
    "GUARDS",
    "EFFECTS",
    "ROWS",
    "ATTEMPTS",
    "transition_violations",
]


class AttemptRefusal(enum.Enum):
    """Why a command changed nothing. Values are the names the spec table uses."""

    SPEC_CHANGED = "spec_changed"
    KEY_REUSED = "key_reused"
    GENERATION_GAP = "generation_gap"
    PREDECESSOR_SUCCEEDED = "predecessor_succeeded"
    PREDECESSOR_UNRESOLVED = "predecessor_unresolved"
    IDENTITY_CONFLICT = "identity_conflict"
    RESUBMIT_UNPROVEN = "resubmit_unproven"
    EGRESS_REUSED = "egress_reused"
    NOT_FOUND = "not_found"
    STALE_TRANSMISSION = "stale_transmission"
    EARLIER_IN_FLIGHT = "earlier_in_flight"
    NOT_SUBMITTED = "not_submitted"
    ALREADY_SUBMITTED = "already_submitted"
    ALREADY_FINISHED = "already_finished"
    ALREADY_APPLIED = "already_applied"
    IDENTITY_UNKNOWN = "identity_unknown"
    NOT_ACCEPTED = "not_accepted"
    EVIDENCE_INSUFFICIENT = "evidence_insufficient"
    CANCEL_REQUESTED = "cancel_requested"
    LOOKUP_FAILED = "lookup_failed"
    SUBMIT_LEASE_LIVE = "submit_lease_live"
    NOTHING_PROVEN = "nothing_proven"
    NOTHING_NEW = "nothing_new"
    NOT_SUBMITTING = "not_submitting"
    NO_RESERVATION = "no_reservation"
    CONTAINMENT_UNPROVEN = "containment_unproven"
    NOT_FINISHED = "not_finished"
    RUN_CLOSED = "run_closed"


R = AttemptRefusal
OUTCOMES: dict[AttemptRefusal, ErrorCode | None] = {
    reason: {
        R.SPEC_CHANGED: ErrorCode.ATTEMPT_PREPARE_CONFLICT,
        R.KEY_REUSED: ErrorCode.ATTEMPT_PREPARE_CONFLICT,
        R.GENERATION_GAP: ErrorCode.ATTEMPT_PREPARE_CONFLICT,
        R.PREDECESSOR_SUCCEEDED: ErrorCode.ATTEMPT_PREPARE_CONFLICT,
        R.PREDECESSOR_UNRESOLVED: ErrorCode.ATTEMPT_PREDECESSOR_UNRESOLVED,
        R.IDENTITY_CONFLICT: ErrorCode.ATTEMPT_IDENTITY_CONFLICT,
        R.RESUBMIT_UNPROVEN: ErrorCode.ATTEMPT_RESUBMIT_UNPROVEN,
        R.EGRESS_REUSED: ErrorCode.ATTEMPT_RESUBMIT_UNPROVEN,
        R.RUN_CLOSED: ErrorCode.RUN_OWNER_MISMATCH,
    }.get(reason)
    for reason in AttemptRefusal
}
"""What each refusal means to a caller: the error code it raises, or None for a known
negative answer (False, or None where the operation returns a value)."""


# --- guards: named predicates over (record, command, now_us) ----------------------------

_RANK = {
    AttemptState.PREPARED: 0, AttemptState.SUBMITTING: 1, AttemptState.INDETERMINATE: 1,
    AttemptState.ACCEPTED: 2, AttemptState.RUNNING: 3, AttemptState.SUCCEEDED: 4,
    AttemptState.FAILED: 4, AttemptState.CANCELLED: 4,
}


def _submit_lease_live(record: AttemptRow, now_us: int) -> bool:
    return record.submit_lease_expires_at_us is not None and record.submit_lease_expires_at_us > now_us


def _looked_up_at(instant: int | None, now_us: int) -> int:
    """When a lookup was made, for judging it against the submit lease: the instant the
    caller read before sending it, never later than now (a lookup cannot come from the
    future; an instant ahead of the database clock is taken as now)."""
    return now_us if instant is None or instant > now_us else instant


def _resubmission_proven(record: AttemptRow, command: Any, now_us: int) -> bool:
    return (
        record.same_key_replay
        or record.no_effect_proof_for == record.transmissions
        or (command.proof_looked_up_at_us is not None
            and not _submit_lease_live(record, _looked_up_at(command.proof_looked_up_at_us, now_us)))
    )


def _rejection(command: Any) -> bool:
    return command.evidence is FailureKind.REJECTED_BEFORE_EFFECT


def _found(state: AttemptState) -> Callable[[Any, Any, int], bool]:
    return lambda record, command, now_us: command.lookup is LookupKind.FOUND and command.found_state is state


GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda record, command, now_us: True,
    # prepare
    "run_closed": lambda record, command, now_us: command.run_closed,
    "spec_differs": lambda record, command, now_us: record.spec_digest != command.row.spec_digest,
    "key_held_elsewhere": lambda record, command, now_us: command.key_held_elsewhere,
    "generation_gap": lambda record, command, now_us: command.row.generation != command.predecessor_generation + 1,
    "predecessor_succeeded": lambda record, command, now_us: command.predecessor_state is AttemptState.SUCCEEDED,
    "predecessor_unresolved": lambda record, command, now_us: command.predecessor_state not in (
        None, AttemptState.FAILED, AttemptState.CANCELLED
    ),
    # transmission
    "egress_reused": lambda record, command, now_us: command.egress_decision_id in record.transmission_egress
    or command.egress_decision_id in record.denied_egress,
    "egress_denied": lambda record, command, now_us: not command.egress_allowed,
    "cancel_requested": lambda record, command, now_us: record.cancel_requested,
    "resubmit_unproven": lambda record, command, now_us: not _resubmission_proven(record, command, now_us),
    # identity
    "identity_differs": lambda record, command, now_us: record.provider_job_id is not None
    and command.provider_job_id is not None and record.provider_job_id != command.provider_job_id,
    "identity_unknown": lambda record, command, now_us: record.provider_job_id is None,
    # evidence
    "rejection_not_of_the_latest": lambda record, command, now_us: _rejection(command)
    and command.transmission != record.transmissions,
    "rejection_beside_an_earlier_transmission": lambda record, command, now_us: _rejection(command)
    and record.granted_during_earlier_lease,
    "rejected_before_effect": lambda record, command, now_us: _rejection(command),
    "provider_failed": lambda record, command, now_us: command.evidence is FailureKind.PROVIDER_FAILED,
    # observations
    "lookup_failed": lambda record, command, now_us: command.lookup is LookupKind.FAILED,
    "not_found": lambda record, command, now_us: command.lookup is LookupKind.NOT_FOUND,
    "not_found_during_submit_lease": lambda record, command, now_us: command.lookup is LookupKind.NOT_FOUND
    and _submit_lease_live(record, _looked_up_at(command.looked_up_at_us, now_us)),
    "not_found_unproven": lambda record, command, now_us: command.lookup is LookupKind.NOT_FOUND
    and (not command.proves_no_effect or command.looked_up_at_us is None),
    "proof_recorded": lambda record, command, now_us: command.lookup is LookupKind.NOT_FOUND
    and record.no_effect_proof_for == record.transmissions,
    "found_not_ahead": lambda record, command, now_us: command.lookup is LookupKind.FOUND
    and command.found_state is not None and _RANK[command.found_state] <= _RANK[record.state],
    "found_accepted": _found(AttemptState.ACCEPTED),
    "found_running": _found(AttemptState.RUNNING),
    "found_succeeded": _found(AttemptState.SUCCEEDED),
    "found_failed": _found(AttemptState.FAILED),
    "found_cancelled": _found(AttemptState.CANCELLED),
    "submit_lease_live": lambda record, command, now_us: _submit_lease_live(record, now_us),
    # reservation
    "no_reservation": lambda record, command, now_us: record.reservation is None,
    "already_released": lambda record, command, now_us: record.reservation_released,
}


# --- effects: named pure functions producing the new record and the reply ---------------


def _evidence(record: AttemptRow, entry: str) -> tuple[str, ...]:
    """The evidence with one more entry (the most recent MAX_EVIDENCE are kept)."""
    return (*record.evidence, entry)[-MAX_EVIDENCE:]


def _move(record: AttemptRow, now_us: int, reply: Any = None, **changes: Any) -> Applied[AttemptRow]:
    # updated_at never moves backwards, whatever time a caller passes (INV-A9).
    updated = now_us if now_us > record.updated_at_us else record.updated_at_us
    return Applied(replace_fields(record, updated_at_us=updated, **changes), Ack() if reply is None else reply)


def _insert(record: Any, command: Any, now_us: int) -> Applied[AttemptRow]:
    # The kernel sets every field of where the attempt stands: only the spec comes from
    # the caller.
    row = replace_fields(
        command.row, state=AttemptState.PREPARED, provider_job_id=None, transmissions=0, transmission_egress=(),
        denied_egress=(), submit_lease_expires_at_us=None, no_effect_proof_for=None,
        granted_during_earlier_lease=False, progress_cursor=None,
        result_refs=(), diagnostic_refs=(), usage_json=None, cost_json=None, warnings=(), cancel_requested=False,
        evidence=(), reservation_released=False, created_at_us=now_us, updated_at_us=now_us,
    )
    return Applied(row, Prepared(row.attempt_id, replayed=False))


def _transmit(record: AttemptRow, command: Any, now_us: int) -> Applied[AttemptRow]:
    number = record.transmissions + 1
    return _move(
        record, now_us, TransmissionGranted(number, command.egress_decision_id),
        state=AttemptState.SUBMITTING,
        transmissions=number,
        transmission_egress=(*record.transmission_egress, command.egress_decision_id),
        submit_lease_expires_at_us=now_us + command.lease_us,
        no_effect_proof_for=None,
        # An earlier transmission whose lease is still live may yet reach the provider.
        granted_during_earlier_lease=_submit_lease_live(record, now_us),
    )


def _observe(state: AttemptState) -> Callable[[Any, Any, int], Applied[AttemptRow]]:
    def effect(record: AttemptRow, command: Any, now_us: int) -> Applied[AttemptRow]:
        changes: dict[str, Any] = {"state": state, "provider_job_id": command.provider_job_id,
                                   "evidence": _evidence(record, f"found:{state.value}"),
                                   "no_effect_proof_for": None}
        if state is AttemptState.SUCCEEDED:
            changes["result_refs"] = command.result_refs
        return _move(record, now_us, **changes)

    return effect


def _keep_or(value: Any, kept: Any) -> Any:
    return kept if value is None else value


EFFECTS: dict[str, Callable[[Any, Any, int], Applied[AttemptRow]]] = {
    "insert": _insert,
    "replay": lambda record, command, now_us: Applied(record, Prepared(record.attempt_id, replayed=True)),
    "record_egress_denial": lambda record, command, now_us: _move(
        record, now_us, EgressDenied(), denied_egress=(*record.denied_egress, command.egress_decision_id)
    ),
    "transmit": _transmit,
    "accept": lambda record, command, now_us: _move(
        record, now_us, state=AttemptState.ACCEPTED, provider_job_id=command.provider_job_id, no_effect_proof_for=None
    ),
    "run": lambda record, command, now_us: _move(record, now_us, state=AttemptState.RUNNING, no_effect_proof_for=None),
    "progress": lambda record, command, now_us: _move(
        record, now_us,
        progress_cursor=command.cursor,
        usage_json=_keep_or(command.usage_json, record.usage_json),
        cost_json=_keep_or(command.cost_json, record.cost_json),
        warnings=(*record.warnings, *command.warnings)[-256:],
    ),
    "succeed": lambda record, command, now_us: _move(
        record, now_us,
        state=AttemptState.SUCCEEDED,
        result_refs=command.result_refs,
        diagnostic_refs=command.diagnostic_refs,
        usage_json=_keep_or(command.usage_json, record.usage_json),
        cost_json=_keep_or(command.cost_json, record.cost_json),
        no_effect_proof_for=None,
    ),
    "fail": lambda record, command, now_us: _move(
        record, now_us, state=AttemptState.FAILED, no_effect_proof_for=None,
        evidence=_evidence(record, f"{command.evidence.value}:{command.reason}"),
    ),
    "make_indeterminate": lambda record, command, now_us: _move(
        record, now_us, state=AttemptState.INDETERMINATE, evidence=_evidence(record, f"ambiguous:{command.reason}")
    ),
    "cancel_unsent": lambda record, command, now_us: _move(
        record, now_us, state=AttemptState.CANCELLED, evidence=_evidence(record, "cancelled_before_transmission")
    ),
    "request_cancel": lambda record, command, now_us: _move(record, now_us, cancel_requested=True),
    "contain": lambda record, command, now_us: _move(
        record, now_us, state=AttemptState.CANCELLED, provider_job_id=command.provider_job_id,
        no_effect_proof_for=None, evidence=_evidence(record, "cancel_confirmed"),
    ),
    "record_no_effect": lambda record, command, now_us: _move(
        record, now_us, no_effect_proof_for=record.transmissions,
        evidence=_evidence(record, f"not_found:no_effect:{record.transmissions}"),
    ),
    "observe_accepted": _observe(AttemptState.ACCEPTED),
    "observe_running": _observe(AttemptState.RUNNING),
    "observe_succeeded": _observe(AttemptState.SUCCEEDED),
    "observe_failed": _observe(AttemptState.FAILED),
    "observe_cancelled": _observe(AttemptState.CANCELLED),
    "expire_submit_lease": lambda record, command, now_us: _move(
        record, now_us, state=AttemptState.INDETERMINATE, evidence=_evidence(record, "submit_lease_expired")
    ),
    "release": lambda record, command, now_us: _move(record, now_us, reservation_released=True),
}


# --- the table ---------------------------------------------------------------------------

S = AttemptStep
C = AttemptCommandType
_PRESENT = (S.PREPARED, S.SUBMITTING, S.ACCEPTED, S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.INDETERMINATE)
_TERMINAL = (S.SUCCEEDED, S.FAILED, S.CANCELLED)
_RESENDABLE = (S.SUBMITTING, S.INDETERMINATE)
_IN_FLIGHT = (S.SUBMITTING, S.ACCEPTED, S.RUNNING, S.INDETERMINATE)
_ACKNOWLEDGED = (S.ACCEPTED, S.RUNNING)

ROWS: tuple[Row, ...] = (
    # One row per spec row of specs/attempts.md, in its order: (from, command, guard, to,
    # effect or refusal). SAME is the spec's "same". The first row of a (state, command)
    # pair whose guard holds decides.
    Row((S.ABSENT,), C.PREPARE, "run_closed", SAME, R.RUN_CLOSED),
    Row((S.ABSENT,), C.PREPARE, "key_held_elsewhere", SAME, R.KEY_REUSED),
    Row((S.ABSENT,), C.PREPARE, "generation_gap", SAME, R.GENERATION_GAP),
    Row((S.ABSENT,), C.PREPARE, "predecessor_succeeded", SAME, R.PREDECESSOR_SUCCEEDED),
    Row((S.ABSENT,), C.PREPARE, "predecessor_unresolved", SAME, R.PREDECESSOR_UNRESOLVED),
    Row((S.ABSENT,), C.PREPARE, "always", S.PREPARED, "insert"),
    Row(_PRESENT, C.PREPARE, "spec_differs", SAME, R.SPEC_CHANGED),
    Row(_PRESENT, C.PREPARE, "always", SAME, "replay"),

    Row((S.ABSENT,), C.BEGIN_SUBMIT, "always", SAME, R.NOT_FOUND),
    Row((S.PREPARED,), C.BEGIN_SUBMIT, "egress_reused", SAME, R.EGRESS_REUSED),
    Row((S.PREPARED,), C.BEGIN_SUBMIT, "egress_denied", SAME, "record_egress_denial"),
    Row((S.PREPARED,), C.BEGIN_SUBMIT, "always", S.SUBMITTING, "transmit"),
    Row(_RESENDABLE, C.BEGIN_SUBMIT, "cancel_requested", SAME, R.CANCEL_REQUESTED),
    Row(_RESENDABLE, C.BEGIN_SUBMIT, "egress_reused", SAME, R.EGRESS_REUSED),
    Row(_RESENDABLE, C.BEGIN_SUBMIT, "resubmit_unproven", SAME, R.RESUBMIT_UNPROVEN),
    Row(_RESENDABLE, C.BEGIN_SUBMIT, "egress_denied", SAME, "record_egress_denial"),
    Row(_RESENDABLE, C.BEGIN_SUBMIT, "always", S.SUBMITTING, "transmit"),
    Row(_ACKNOWLEDGED, C.BEGIN_SUBMIT, "always", SAME, R.ALREADY_SUBMITTED),
    Row(_TERMINAL, C.BEGIN_SUBMIT, "always", SAME, R.ALREADY_FINISHED),

    Row((S.ABSENT,), C.RECORD_ACCEPTED, "always", SAME, R.NOT_FOUND),
    Row((S.PREPARED,), C.RECORD_ACCEPTED, "always", SAME, R.NOT_SUBMITTED),
    Row(_RESENDABLE, C.RECORD_ACCEPTED, "identity_differs", SAME, R.IDENTITY_CONFLICT),
    Row(_RESENDABLE, C.RECORD_ACCEPTED, "always", S.ACCEPTED, "accept"),
    Row(_ACKNOWLEDGED, C.RECORD_ACCEPTED, "identity_differs", SAME, R.IDENTITY_CONFLICT),
    Row(_ACKNOWLEDGED, C.RECORD_ACCEPTED, "always", SAME, R.ALREADY_APPLIED),
    Row(_TERMINAL, C.RECORD_ACCEPTED, "identity_differs", SAME, R.IDENTITY_CONFLICT),
    Row(_TERMINAL, C.RECORD_ACCEPTED, "always", SAME, R.ALREADY_FINISHED),

    Row((S.ABSENT,), C.RECORD_RUNNING, "always", SAME, R.NOT_FOUND),
    Row((S.PREPARED,), C.RECORD_RUNNING, "always", SAME, R.NOT_SUBMITTED),
    Row(_RESENDABLE, C.RECORD_RUNNING, "identity_unknown", SAME, R.IDENTITY_UNKNOWN),
    Row(_RESENDABLE, C.RECORD_RUNNING, "always", S.RUNNING, "run"),
    Row((S.ACCEPTED,), C.RECORD_RUNNING, "always", S.RUNNING, "run"),
    Row((S.RUNNING,), C.RECORD_RUNNING, "always", SAME, R.ALREADY_APPLIED),
    Row(_TERMINAL, C.RECORD_RUNNING, "always", SAME, R.ALREADY_FINISHED),

    Row((S.ABSENT,), C.RECORD_PROGRESS, "always", SAME, R.NOT_FOUND),
    Row((S.PREPARED, *_RESENDABLE), C.RECORD_PROGRESS, "always", SAME, R.NOT_ACCEPTED),
    Row(_ACKNOWLEDGED, C.RECORD_PROGRESS, "always", SAME, "progress"),
    Row(_TERMINAL, C.RECORD_PROGRESS, "always", SAME, R.ALREADY_FINISHED),

    Row((S.ABSENT,), C.RECORD_SUCCEEDED, "always", SAME, R.NOT_FOUND),
    Row((S.PREPARED,), C.RECORD_SUCCEEDED, "always", SAME, R.NOT_SUBMITTED),
    Row(_RESENDABLE, C.RECORD_SUCCEEDED, "identity_unknown", SAME, R.IDENTITY_UNKNOWN),
    Row(_RESENDABLE, C.RECORD_SUCCEEDED, "always", S.SUCCEEDED, "succeed"),
    Row(_ACKNOWLEDGED, C.RECORD_SUCCEEDED, "always", S.SUCCEEDED, "succeed"),
    Row(_TERMINAL, C.RECORD_SUCCEEDED, "always", SAME, R.ALREADY_FINISHED),

    Row((S.ABSENT,), C.RECORD_FAILED, "always", SAME, R.NOT_FOUND),
    Row((S.PREPARED,), C.RECORD_FAILED, "always", SAME, R.NOT_SUBMITTED),
    Row((S.SUBMITTING,), C.RECORD_FAILED, "rejection_not_of_the_latest", SAME, R.STALE_TRANSMISSION),
    Row((S.SUBMITTING,), C.RECORD_FAILED, "rejection_beside_an_earlier_transmission", SAME, R.EARLIER_IN_FLIGHT),
    Row((S.SUBMITTING,), C.RECORD_FAILED, "rejected_before_effect", S.FAILED, "fail"),
    Row((S.SUBMITTING,), C.RECORD_FAILED, "always", SAME, R.EVIDENCE_INSUFFICIENT),
    Row((*_ACKNOWLEDGED, S.INDETERMINATE), C.RECORD_FAILED, "provider_failed", S.FAILED, "fail"),
    Row((*_ACKNOWLEDGED, S.INDETERMINATE), C.RECORD_FAILED, "always", SAME, R.EVIDENCE_INSUFFICIENT),
    Row(_TERMINAL, C.RECORD_FAILED, "always", SAME, R.ALREADY_FINISHED),

    Row((S.ABSENT,), C.RECORD_AMBIGUOUS, "always", SAME, R.NOT_FOUND),
    Row((S.PREPARED,), C.RECORD_AMBIGUOUS, "always", SAME, R.NOT_SUBMITTED),
    Row((S.SUBMITTING, *_ACKNOWLEDGED), C.RECORD_AMBIGUOUS, "always", S.INDETERMINATE, "make_indeterminate"),
    Row((S.INDETERMINATE,), C.RECORD_AMBIGUOUS, "always", SAME, R.ALREADY_APPLIED),
    Row(_TERMINAL, C.RECORD_AMBIGUOUS, "always", SAME, R.ALREADY_FINISHED),

    Row((S.ABSENT,), C.REQUEST_CANCEL, "always", SAME, R.NOT_FOUND),
    Row((S.PREPARED,), C.REQUEST_CANCEL, "always", S.CANCELLED, "cancel_unsent"),
    Row(_IN_FLIGHT, C.REQUEST_CANCEL, "cancel_requested", SAME, R.ALREADY_APPLIED),
    Row(_IN_FLIGHT, C.REQUEST_CANCEL, "always", SAME, "request_cancel"),
    Row(_TERMINAL, C.REQUEST_CANCEL, "always", SAME, R.ALREADY_FINISHED),

    Row((S.ABSENT,), C.RECORD_CANCELLED, "always", SAME, R.NOT_FOUND),
    Row((S.PREPARED,), C.RECORD_CANCELLED, "always", SAME, R.NOT_SUBMITTED),
    Row(_IN_FLIGHT, C.RECORD_CANCELLED, "identity_differs", SAME, R.IDENTITY_CONFLICT),
    Row(_IN_FLIGHT, C.RECORD_CANCELLED, "always", S.CANCELLED, "contain"),
    Row(_TERMINAL, C.RECORD_CANCELLED, "identity_differs", SAME, R.IDENTITY_CONFLICT),
    Row(_TERMINAL, C.RECORD_CANCELLED, "always", SAME, R.ALREADY_FINISHED),

    Row((S.ABSENT,), C.RECONCILE, "always", SAME, R.NOT_FOUND),
    Row((S.PREPARED,), C.RECONCILE, "always", SAME, R.NOT_SUBMITTED),
    Row(_RESENDABLE, C.RECONCILE, "lookup_failed", SAME, R.LOOKUP_FAILED),
    Row(_RESENDABLE, C.RECONCILE, "not_found_during_submit_lease", SAME, R.SUBMIT_LEASE_LIVE),
    Row(_RESENDABLE, C.RECONCILE, "not_found_unproven", SAME, R.NOTHING_PROVEN),
    Row(_RESENDABLE, C.RECONCILE, "proof_recorded", SAME, R.ALREADY_APPLIED),
    Row(_RESENDABLE, C.RECONCILE, "not_found", SAME, "record_no_effect"),
    Row(_RESENDABLE, C.RECONCILE, "identity_differs", SAME, R.IDENTITY_CONFLICT),
    Row(_RESENDABLE, C.RECONCILE, "found_accepted", S.ACCEPTED, "observe_accepted"),
    Row(_RESENDABLE, C.RECONCILE, "found_running", S.RUNNING, "observe_running"),
    Row(_RESENDABLE, C.RECONCILE, "found_succeeded", S.SUCCEEDED, "observe_succeeded"),
    Row(_RESENDABLE, C.RECONCILE, "found_failed", S.FAILED, "observe_failed"),
    Row(_RESENDABLE, C.RECONCILE, "found_cancelled", S.CANCELLED, "observe_cancelled"),
    Row(_RESENDABLE, C.RECONCILE, "always", SAME, R.NOTHING_NEW),
    Row(_ACKNOWLEDGED, C.RECONCILE, "lookup_failed", SAME, R.LOOKUP_FAILED),
    Row(_ACKNOWLEDGED, C.RECONCILE, "not_found", SAME, R.NOTHING_PROVEN),
    Row(_ACKNOWLEDGED, C.RECONCILE, "identity_differs", SAME, R.IDENTITY_CONFLICT),
    Row(_ACKNOWLEDGED, C.RECONCILE, "found_not_ahead", SAME, R.NOTHING_NEW),
    Row((S.ACCEPTED,), C.RECONCILE, "found_running", S.RUNNING, "observe_running"),
    Row(_ACKNOWLEDGED, C.RECONCILE, "found_succeeded", S.SUCCEEDED, "observe_succeeded"),
    Row(_ACKNOWLEDGED, C.RECONCILE, "found_failed", S.FAILED, "observe_failed"),
    Row(_ACKNOWLEDGED, C.RECONCILE, "found_cancelled", S.CANCELLED, "observe_cancelled"),
    Row(_ACKNOWLEDGED, C.RECONCILE, "always", SAME, R.NOTHING_NEW),
    Row(_TERMINAL, C.RECONCILE, "always", SAME, R.ALREADY_FINISHED),

    Row((S.ABSENT,), C.EXPIRE_SUBMIT_LEASE, "always", SAME, R.NOT_FOUND),
    Row((S.PREPARED,), C.EXPIRE_SUBMIT_LEASE, "always", SAME, R.NOT_SUBMITTED),
    Row((S.SUBMITTING,), C.EXPIRE_SUBMIT_LEASE, "submit_lease_live", SAME, R.SUBMIT_LEASE_LIVE),
    Row((S.SUBMITTING,), C.EXPIRE_SUBMIT_LEASE, "always", S.INDETERMINATE, "expire_submit_lease"),
    Row((S.INDETERMINATE,), C.EXPIRE_SUBMIT_LEASE, "always", SAME, R.ALREADY_APPLIED),
    Row(_ACKNOWLEDGED, C.EXPIRE_SUBMIT_LEASE, "always", SAME, R.NOT_SUBMITTING),
    Row(_TERMINAL, C.EXPIRE_SUBMIT_LEASE, "always", SAME, R.ALREADY_FINISHED),

    Row((S.ABSENT,), C.RELEASE_RESERVATION, "always", SAME, R.NOT_FOUND),
    Row((S.PREPARED, S.SUBMITTING, *_ACKNOWLEDGED), C.RELEASE_RESERVATION, "always", SAME, R.NOT_FINISHED),
    Row((S.INDETERMINATE,), C.RELEASE_RESERVATION, "always", SAME, R.CONTAINMENT_UNPROVEN),
    Row(_TERMINAL, C.RELEASE_RESERVATION, "no_reservation", SAME, R.NO_RESERVATION),
    Row(_TERMINAL, C.RELEASE_RESERVATION, "already_released", SAME, R.ALREADY_APPLIED),
    Row(_TERMINAL, C.RELEASE_RESERVATION, "always", SAME, "release"),
)


# --- transition rules (checked by the contracts and by the tests) -----------------------

_IDENTITY_FIELDS = (
    "attempt_id", "envelope", "owner_job_id", "run_id", "station_attempt_id", "generation", "request_digest",
    "idempotency_key", "binding_json", "same_key_replay", "lookup", "target", "source_refs", "working_refs",
    "destination", "purpose", "consent_decision", "policy_revisions_json", "reservation", "spec_digest",
    "created_at_us",
)
_LEAVES_INDETERMINATE = frozenset({
    AttemptCommandType.RECONCILE, AttemptCommandType.RECORD_ACCEPTED, AttemptCommandType.RECORD_RUNNING,
    AttemptCommandType.RECORD_SUCCEEDED, AttemptCommandType.RECORD_FAILED, AttemptCommandType.RECORD_CANCELLED,
    AttemptCommandType.BEGIN_SUBMIT,
})


def _lookup_past_lease(record: AttemptRow, looked_up_at_us: int | None, now_us: int) -> bool:
    # Written independently of the guards on purpose: a rule must not trust the code it checks.
    if looked_up_at_us is None:
        return False
    lease = record.submit_lease_expires_at_us
    return lease is None or min(looked_up_at_us, now_us) >= lease


def _proven_resubmission(record: AttemptRow, command: Any, now_us: int) -> bool:
    return bool(
        record.same_key_replay
        or (record.no_effect_proof_for is not None and record.no_effect_proof_for == record.transmissions)
        or _lookup_past_lease(record, command.proof_looked_up_at_us, now_us)
    )


def transition_violations(
    record: AttemptRow | None, command: AttemptCommand, now_us: int, decision: Decision
) -> list[str]:
    """The transition rules (TR-A1 ... TR-A10 in specs/attempts.md) a decision breaks."""
    if isinstance(decision, Refused):
        return []
    new = decision.new_record
    kind = command.kind
    broken: list[str] = []
    if record is None:
        if new is not None and (new.state is not AttemptState.PREPARED or new.transmissions != 0):
            broken.append("TR-A3")  # an attempt is born prepared, with nothing transmitted
        if new is not None and not (
            command.predecessor_state in (None, AttemptState.FAILED, AttemptState.CANCELLED)  # type: ignore[union-attr]
            and new.generation == command.predecessor_generation + 1  # type: ignore[union-attr]
            and not command.key_held_elsewhere  # type: ignore[union-attr]
        ):
            broken.append("TR-A9")  # a new generation only over a resolved predecessor, with a new key
        if new is not None and command.run_closed:  # type: ignore[union-attr]
            broken.append("TR-A10")  # a new attempt only while its Run, if recorded, is RUNNING
        return broken
    if new is None:
        return ["TR-A1"]  # attempts are never deleted
    if any(getattr(new, name) != getattr(record, name) for name in _IDENTITY_FIELDS):
        broken.append("TR-A1")  # the spec and the attempt's identity never change
    if record.provider_job_id is not None and new.provider_job_id != record.provider_job_id:
        broken.append("TR-A2")  # the provider's job identity is recorded once
    grew = new.transmissions - record.transmissions
    if grew not in (0, 1) or (grew == 1 and not (
        kind is AttemptCommandType.BEGIN_SUBMIT
        and command.egress_allowed  # type: ignore[union-attr]
        and command.egress_decision_id not in record.transmission_egress  # type: ignore[union-attr]
        and command.egress_decision_id not in record.denied_egress  # type: ignore[union-attr]
        and (record.state is AttemptState.PREPARED or _proven_resubmission(record, command, now_us))
        and not record.cancel_requested
    )):
        broken.append("TR-A3")  # one transmission per grant, fresh egress, repeats only when proven
    if new.state is AttemptState.FAILED and record.state is not AttemptState.FAILED and not (
        (kind is AttemptCommandType.RECORD_FAILED and (
            # a rejection of the latest transmission, with no earlier one still able to land
            (command.evidence is FailureKind.REJECTED_BEFORE_EFFECT and record.state is AttemptState.SUBMITTING  # type: ignore[union-attr]
             and command.transmission == record.transmissions  # type: ignore[union-attr]
             and not record.granted_during_earlier_lease)
            or (command.evidence is FailureKind.PROVIDER_FAILED and record.state in (  # type: ignore[union-attr]
                AttemptState.ACCEPTED, AttemptState.RUNNING, AttemptState.INDETERMINATE))
        ))
        or (kind is AttemptCommandType.RECONCILE and command.found_state is AttemptState.FAILED)  # type: ignore[union-attr]
    ):
        broken.append("TR-A4")  # never a fabricated failure
    if new.state is AttemptState.CANCELLED and record.state is not AttemptState.CANCELLED and not (
        (kind is AttemptCommandType.REQUEST_CANCEL and record.state is AttemptState.PREPARED)
        or kind is AttemptCommandType.RECORD_CANCELLED
        or (kind is AttemptCommandType.RECONCILE and command.found_state is AttemptState.CANCELLED)  # type: ignore[union-attr]
    ):
        broken.append("TR-A5")  # cancelled means contained, never merely requested
    if record.state in TERMINAL_ATTEMPT_STATES and new.state is not record.state:
        broken.append("TR-A6")  # terminal is absorbing
    if new.reservation_released and not record.reservation_released and new.state not in TERMINAL_ATTEMPT_STATES:
        broken.append("TR-A7")  # the reservation outlives every unresolved effect
    if record.state is AttemptState.INDETERMINATE and new.state is not AttemptState.INDETERMINATE and (
        kind not in _LEAVES_INDETERMINATE
    ):
        broken.append("TR-A8")  # indeterminate leaves only by observation or proven resubmission
    if kind is AttemptCommandType.RECONCILE and command.lookup is LookupKind.NOT_FOUND and (  # type: ignore[union-attr]
        not _lookup_past_lease(record, command.looked_up_at_us, now_us)  # type: ignore[union-attr]
    ):
        broken.append("TR-A9")  # a not-found looked up during the submit lease proves nothing
    return broken


ATTEMPTS = Machine.define(
    name="attempts",
    states=AttemptStep,
    commands=AttemptCommandType,
    rows=ROWS,
    guards=GUARDS,
    effects=EFFECTS,
    outcomes=OUTCOMES,
    state_of=step_of,
    record_violations=record_violations,
    transition_violations=transition_violations,
    initial=AttemptStep.ABSENT,
)
"""The service-attempt machine: ``ATTEMPTS.decide(record, command, now_us)`` (see
:mod:`tenure.kernel.attempts.contracts` for the contract CrossHair checks)."""
