"""Hypothesis strategies for attempt records and commands (see queues.py).

Values come from small pools with near misses (the egress decision the record already
used, the provider identity it already holds or another, a database time one
microsecond either side of the submit lease) so that equal and almost-equal values meet.
"""

from __future__ import annotations

import hashlib

from hypothesis import strategies as st

from tenure.kernel.attempts.commands import (
    AttemptCommandType,
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
    RecordProgress,
    RecordRunning,
    RecordSucceeded,
    ReleaseReservation,
    RequestCancel,
)
from tenure.kernel.attempts.record import AttemptRow, AttemptStep
from tenure.model import ENVELOPE_TAG, TERMINAL_ATTEMPT_STATES, AttemptState

from .pools import BOOLEANS, integers, maybe, optional, sampled

__all__ = ["NOW", "attempt_records", "attempt_commands", "attempt_situations"]

NOW = 1_800_000_000_000_000
EGRESS = ["egress-1", "egress-2", "egress-3"]
PROVIDER_IDS = ["job-a", "job-b"]
DIGESTS = ["sha256:" + hashlib.sha256(name.encode()).hexdigest() for name in ("spec-1", "spec-2")]

instants = st.integers(NOW - 3, NOW + 3) | st.integers(NOW - 10**12, NOW + 10**12)

_STATE_OF_STEP = {step: AttemptState(step.value) for step in AttemptStep if step is not AttemptStep.ABSENT}


@st.composite
def attempt_records(draw: st.DrawFn, step: AttemptStep | None = None) -> AttemptRow | None:
    """An attempt keeping every invariant (INV-A1 ... INV-A10), or None for ``absent``."""
    if step is None:
        step = draw(sampled(AttemptStep))
    if step is AttemptStep.ABSENT:
        return None
    state = _STATE_OF_STEP[step]
    generation = draw(integers(1, 3))
    cancelled_unsent = state is AttemptState.CANCELLED and draw(BOOLEANS)
    transmissions = 0 if state is AttemptState.PREPARED or cancelled_unsent else draw(integers(1, 3))
    egress = tuple(draw(st.permutations(EGRESS))[: min(transmissions, len(EGRESS))])
    transmissions = len(egress)
    if state not in (AttemptState.PREPARED, AttemptState.CANCELLED) and transmissions == 0:
        transmissions, egress = 1, (EGRESS[0],)
    denied = tuple(draw(st.lists(sampled([f"denied-{n}" for n in range(3)]), max_size=2, unique=True)))
    needs_identity = state in (AttemptState.ACCEPTED, AttemptState.RUNNING, AttemptState.SUCCEEDED)
    identity = draw(sampled(PROVIDER_IDS)) if needs_identity or (
        transmissions and draw(BOOLEANS)
    ) else None
    proof = transmissions if (
        state in (AttemptState.SUBMITTING, AttemptState.INDETERMINATE) and draw(BOOLEANS)
    ) else None
    created = draw(instants)
    reservation = draw(maybe("gpu-0"))
    replay = draw(BOOLEANS)
    return AttemptRow(
        attempt_id="attempt-1", envelope=ENVELOPE_TAG, owner_job_id="owner-1", run_id=None,
        station_attempt_id=None, generation=generation,
        request_digest=DIGESTS[0], idempotency_key=f"key-{generation}", binding_json='{"kind":"capability"}',
        same_key_replay=replay, lookup=draw(BOOLEANS), target="provider-a", source_refs=(),
        working_refs=(), destination=None, purpose="thumbnail", consent_decision=None, policy_revisions_json="{}",
        reservation=reservation, spec_digest=DIGESTS[0], state=state, provider_job_id=identity,
        transmissions=transmissions, transmission_egress=egress, denied_egress=denied,
        submit_lease_expires_at_us=draw(instants) if transmissions else None, no_effect_proof_for=proof,
        granted_during_earlier_lease=replay and transmissions >= 2 and draw(BOOLEANS),
        progress_cursor=None, result_refs=("ref-1",) if state is AttemptState.SUCCEEDED else (),
        diagnostic_refs=(), usage_json=None, cost_json=None, warnings=(),
        cancel_requested=state is not AttemptState.PREPARED and draw(BOOLEANS), evidence=(),
        reservation_released=reservation is not None and state in TERMINAL_ATTEMPT_STATES and draw(BOOLEANS),
        created_at_us=created, updated_at_us=created + draw(integers(0, 10)),
    )


def _lookup_instants(record: AttemptRow | None) -> st.SearchStrategy[int | None]:
    """When a lookup was made: none given, any instant, or one beside the submit lease's end."""
    near: st.SearchStrategy[int] = st.nothing()
    if record is not None and record.submit_lease_expires_at_us is not None:
        lease = record.submit_lease_expires_at_us
        near = st.integers(lease - 2, lease + 1)
    return st.none() | instants | near


@st.composite
def attempt_commands(draw: st.DrawFn, kind: AttemptCommandType, record: AttemptRow | None) -> object:
    C = AttemptCommandType
    if kind is C.PREPARE:
        base = record if record is not None else draw(attempt_records(AttemptStep.PREPARED))
        assert base is not None
        row = base if draw(BOOLEANS) else AttemptRow(**{
            **{name: getattr(base, name) for name in AttemptRow.__dataclass_fields__},
            "spec_digest": draw(sampled(DIGESTS)), "generation": draw(integers(1, 3)),
        })
        predecessor = draw(optional(sampled(AttemptState)))
        return Prepare(row=row, predecessor_state=predecessor,
                       predecessor_generation=0 if predecessor is None else draw(integers(0, 3)),
                       key_held_elsewhere=draw(BOOLEANS), run_closed=draw(BOOLEANS))
    if kind is C.BEGIN_SUBMIT:
        pool = [*EGRESS, "egress-fresh", "denied-0"]
        return BeginSubmit(egress_decision_id=draw(sampled(pool)), egress_allowed=draw(BOOLEANS),
                           proof_looked_up_at_us=draw(_lookup_instants(record)), lease_us=draw(integers(1, 5) | st.just(60_000_000)))
    if kind is C.RECORD_ACCEPTED:
        return RecordAccepted(provider_job_id=draw(sampled(PROVIDER_IDS)))
    if kind is C.RECORD_RUNNING:
        return RecordRunning()
    if kind is C.RECORD_PROGRESS:
        return RecordProgress(cursor="50%", usage_json=draw(maybe('{"tokens":3}')), cost_json=None,
                              warnings=draw(sampled([(), ("slow",)])))
    if kind is C.RECORD_SUCCEEDED:
        return RecordSucceeded(result_refs=("ref-9",), diagnostic_refs=(), usage_json=None, cost_json=None)
    if kind is C.RECORD_FAILED:
        latest = 0 if record is None else record.transmissions
        return RecordFailed(evidence=draw(sampled(FailureKind)), reason="boom",
                            transmission=draw(maybe(latest) | st.integers(0, 4)))
    if kind is C.RECORD_AMBIGUOUS:
        return RecordAmbiguous(reason="timeout")
    if kind is C.REQUEST_CANCEL:
        return RequestCancel()
    if kind is C.RECORD_CANCELLED:
        return RecordCancelled(provider_job_id=draw(sampled(PROVIDER_IDS)))
    if kind is C.RECONCILE:
        lookup = draw(sampled(LookupKind))
        if lookup is LookupKind.FOUND:
            return Reconcile(lookup=lookup, provider_job_id=draw(sampled(PROVIDER_IDS)),
                             found_state=draw(sampled([
                                 AttemptState.ACCEPTED, AttemptState.RUNNING, AttemptState.SUCCEEDED,
                                 AttemptState.FAILED, AttemptState.CANCELLED])),
                             result_refs=("ref-found",))
        return Reconcile(lookup=lookup, proves_no_effect=draw(BOOLEANS),
                         looked_up_at_us=draw(_lookup_instants(record)))
    if kind is C.EXPIRE_SUBMIT_LEASE:
        return ExpireSubmitLease()
    return ReleaseReservation()


@st.composite
def attempt_situations(
    draw: st.DrawFn, step: AttemptStep | None = None, kind: AttemptCommandType | None = None
) -> tuple[AttemptRow | None, object, int]:
    record = draw(attempt_records(step))
    command = draw(attempt_commands(kind or draw(sampled(AttemptCommandType)), record))
    if record is not None and record.submit_lease_expires_at_us is not None and draw(BOOLEANS):
        now = record.submit_lease_expires_at_us + draw(integers(-1, 1))
    else:
        now = draw(instants)
    return record, command, now
