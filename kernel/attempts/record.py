"""The service-attempt record and the invariants every stored attempt keeps.

A record is one row of the attempts table, as plain values: the spec's fields (the
binding and the policy revisions as canonical JSON text, refs as tuples of strings),
what has happened to the attempt, and when. Instants are integer microseconds on the
database clock. The kernel never stores anything but records it has checked; the
engine checks every decided record before writing it.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Protocol

from tenure.model import ENVELOPE_TAG, TERMINAL_ATTEMPT_STATES, AttemptState, bounds
from tenure.model.attempts import MAX_REASON_CHARS, MAX_REFS

from ..core import replaced

__all__ = [
    "is_terminal",
    "AttemptRow",
    "AttemptStep",
    "step_of",
    "replace_fields",
    "record_violations",
    "is_valid_record",
    "MAX_EVIDENCE",
    "SUBMITTED_STATES",
]

MAX_EVIDENCE = MAX_REFS
"""Evidence entries kept per attempt (the most recent ones)."""

SUBMITTED_STATES = frozenset(
    {AttemptState.SUBMITTING, AttemptState.ACCEPTED, AttemptState.RUNNING, AttemptState.INDETERMINATE}
)


class AttemptStep(enum.Enum):
    """The state a command meets: the attempt's state, or ``absent`` before ``prepare``."""

    ABSENT = "absent"
    PREPARED = "prepared"
    SUBMITTING = "submitting"
    ACCEPTED = "accepted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INDETERMINATE = "indeterminate"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRow:
    """One attempt.

    Identity (fixed at ``prepare``): the spec's fields, ``attempt_id``, ``envelope``,
    ``spec_digest`` (the canonical spec's digest: what a repeated ``prepare`` compares) and
    ``created_at_us``.

    Transmission: ``transmissions`` counts granted physical transmissions, each under the
    egress decision listed at its position in ``transmission_egress``; ``denied_egress``
    lists decisions that refused one. ``submit_lease_expires_at_us`` bounds the latest
    transmission's sender; ``no_effect_proof_for`` names the transmission a lookup proved
    had no effect; ``granted_during_earlier_lease`` says the latest transmission was granted
    while an earlier one's submit lease was still live (only a same-key-replay binding
    allows that), so the earlier one may reach the provider after the latest is answered
    and a rejection of the latest proves nothing about the attempt. ``provider_job_id`` is
    set once and never changes.
    """

    attempt_id: str
    envelope: str
    owner_job_id: str
    run_id: str | None
    station_attempt_id: str | None
    generation: int
    request_digest: str
    idempotency_key: str
    binding_json: str
    same_key_replay: bool
    lookup: bool
    target: str
    source_refs: tuple[str, ...]
    working_refs: tuple[str, ...]
    destination: str | None
    purpose: str
    consent_decision: str | None
    policy_revisions_json: str
    reservation: str | None
    spec_digest: str
    state: AttemptState
    provider_job_id: str | None
    transmissions: int
    transmission_egress: tuple[str, ...]
    denied_egress: tuple[str, ...]
    submit_lease_expires_at_us: int | None
    no_effect_proof_for: int | None
    granted_during_earlier_lease: bool
    progress_cursor: str | None
    result_refs: tuple[str, ...]
    diagnostic_refs: tuple[str, ...]
    usage_json: str | None
    cost_json: str | None
    warnings: tuple[str, ...]
    cancel_requested: bool
    evidence: tuple[str, ...]
    reservation_released: bool
    created_at_us: int
    updated_at_us: int


_STEP_OF_STATE = {state: AttemptStep(state.value) for state in AttemptState}


def step_of(record: AttemptRow | None) -> AttemptStep:
    """The table key for a record: its state, or ABSENT."""
    if record is None:
        return AttemptStep.ABSENT
    return _STEP_OF_STATE[record.state]


def replace_fields(record: AttemptRow, **changes: object) -> AttemptRow:
    """``dataclasses.replace`` without its per-call introspection (see :func:`tenure.kernel.core.replaced`)."""
    return replaced(record, changes)


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _text(value: object, max_chars: int = bounds.MAX_IDENTITY_CHARS) -> bool:
    return bounds.is_bounded_text(value, max_chars)


def _optional_text(value: object, max_chars: int = bounds.MAX_IDENTITY_CHARS) -> bool:
    return value is None or _text(value, max_chars)


def _texts(value: object, max_items: int = MAX_REFS, max_chars: int = bounds.MAX_IDENTITY_CHARS) -> bool:
    return type(value) is tuple and len(value) <= max_items and all(_text(item, max_chars) for item in value)


_instant = bounds.is_instant


def _digest(value: object) -> bool:
    return type(value) is str and _DIGEST.fullmatch(value) is not None


def _types_and_bounds(record: AttemptRow) -> list[str]:
    """INV-A1: every field has its type and bound."""
    checks = {
        "attempt_id": _text(record.attempt_id),
        "owner_job_id": _text(record.owner_job_id),
        "run_id": _optional_text(record.run_id),
        "station_attempt_id": _optional_text(record.station_attempt_id),
        "generation": bounds.is_strict_int(record.generation) and 1 <= record.generation <= bounds.INT32_MAX,
        "request_digest": _digest(record.request_digest),
        "idempotency_key": _text(record.idempotency_key),
        "binding_json": type(record.binding_json) is str,
        "guarantees": type(record.same_key_replay) is bool and type(record.lookup) is bool,
        "target": _text(record.target),
        "source_refs": _texts(record.source_refs),
        "working_refs": _texts(record.working_refs),
        "destination": _optional_text(record.destination),
        "purpose": _text(record.purpose),
        "consent_decision": _optional_text(record.consent_decision),
        "policy_revisions_json": type(record.policy_revisions_json) is str,
        "reservation": _optional_text(record.reservation),
        "spec_digest": _digest(record.spec_digest),
        "state": type(record.state) is AttemptState,
        "provider_job_id": _optional_text(record.provider_job_id),
        "transmissions": bounds.is_strict_int(record.transmissions) and 0 <= record.transmissions <= bounds.INT32_MAX,
        "transmission_egress": _texts(record.transmission_egress, bounds.INT32_MAX),
        "denied_egress": _texts(record.denied_egress, bounds.INT32_MAX),
        "submit_lease_expires_at_us": record.submit_lease_expires_at_us is None
        or _instant(record.submit_lease_expires_at_us),
        "no_effect_proof_for": record.no_effect_proof_for is None or bounds.is_strict_int(record.no_effect_proof_for),
        "granted_during_earlier_lease": type(record.granted_during_earlier_lease) is bool,
        "progress_cursor": _optional_text(record.progress_cursor, MAX_REASON_CHARS),
        "result_refs": _texts(record.result_refs),
        "diagnostic_refs": _texts(record.diagnostic_refs),
        "usage_json": record.usage_json is None or type(record.usage_json) is str,
        "cost_json": record.cost_json is None or type(record.cost_json) is str,
        "warnings": _texts(record.warnings, MAX_REFS, MAX_REASON_CHARS),
        "cancel_requested": type(record.cancel_requested) is bool,
        "evidence": _texts(record.evidence, MAX_EVIDENCE, 2 * MAX_REASON_CHARS),
        "reservation_released": type(record.reservation_released) is bool,
        "created_at_us": _instant(record.created_at_us),
        "updated_at_us": _instant(record.updated_at_us),
    }
    return [f"INV-A1.{name}" for name, ok in checks.items() if not ok]


def record_violations(record: AttemptRow) -> list[str]:
    """The invariants (``INV-A1`` ... ``INV-A10`` in specs/attempts.md) this record breaks."""
    broken = _types_and_bounds(record)
    if broken:
        return broken
    state = record.state
    rules = {
        # INV-A2: PREPARED proves no transmission started; every other state but a
        # cancellation before any transmission has at least one.
        "INV-A2": (record.transmissions == 0) == (
            state is AttemptState.PREPARED or (state is AttemptState.CANCELLED and record.transmissions == 0)
        ),
        # INV-A3: each granted transmission has its own egress decision, all distinct.
        "INV-A3": len(record.transmission_egress) == record.transmissions
        and len(set(record.transmission_egress) | set(record.denied_egress))
        == len(record.transmission_egress) + len(record.denied_egress),
        # INV-A4: accepted, running and succeeded attempts know the provider's job identity.
        "INV-A4": record.provider_job_id is not None
        or state not in (AttemptState.ACCEPTED, AttemptState.RUNNING, AttemptState.SUCCEEDED),
        # INV-A5: a no-effect proof covers the latest transmission of an attempt still in
        # SUBMITTING or INDETERMINATE; a submit lease exists once transmitted.
        "INV-A5": (record.no_effect_proof_for is None or (
            record.no_effect_proof_for == record.transmissions
            and state in (AttemptState.SUBMITTING, AttemptState.INDETERMINATE)
        )) and ((record.submit_lease_expires_at_us is None) == (record.transmissions == 0)),
        # INV-A6: a reservation is released only after terminal containment.
        "INV-A6": not record.reservation_released
        or (record.reservation is not None and state in TERMINAL_ATTEMPT_STATES),
        # INV-A7: the envelope tag.
        "INV-A7": record.envelope == ENVELOPE_TAG,
        # INV-A8: result refs belong to a succeeded attempt only.
        "INV-A8": not record.result_refs or state is AttemptState.SUCCEEDED,
        # INV-A9: a prepared attempt has no cancel request (cancelling it cancels it at
        # once), and time runs forward.
        "INV-A9": not (state is AttemptState.PREPARED and record.cancel_requested)
        and record.created_at_us <= record.updated_at_us,
        # INV-A10: only a same-key-replay binding grants a transmission while an earlier
        # one may still be in flight (elsewhere a resubmission needs the earlier one's
        # lease over), and only a second or later transmission has an earlier one.
        "INV-A10": not record.granted_during_earlier_lease
        or (record.same_key_replay and record.transmissions >= 2),
    }
    return [name for name, ok in rules.items() if not ok]


def is_valid_record(record: AttemptRow) -> bool:
    return not record_violations(record)


class _HasAttemptState(Protocol):
    @property
    def state(self) -> AttemptState: ...


def is_terminal(attempt: _HasAttemptState) -> bool:
    """Whether an attempt (its stored row or its public record) reached a terminal state:
    nothing will move it again, so a Run waiting on it may resume and a cancel is proven."""
    return attempt.state in TERMINAL_ATTEMPT_STATES
