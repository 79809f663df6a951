"""Hypothesis strategies for consents and their commands (see attempts.py).

Records keep INV-C1 ... INV-C3: a pending consent has no decision, a decided one its
principal and a time no earlier than its creation, a preauthorized one was granted at
creation; any of them may carry a deadline (``expires_at_us``, before or after its
creation). Commands carry every verdict (the three real ones and the two that are not
verdicts), from a principal or from the deadline owner, a creation for a Run that is or
is not RUNNING, with or without a preauthorization, and the sweep of a settled or
cancelled Run; the time is often at a deadline's edge.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tenure.kernel.consents.commands import CancelPending, ConsentCommandType, CreateConsent, DecideConsent
from tenure.kernel.consents.machine import DEADLINE_OWNER, PREAUTHORIZED_BY
from tenure.kernel.consents.record import MAX_DEADLINE_US, ConsentRow, ConsentStep
from tenure.kernel.runs.machine import CANCELLED_BY, SETTLED_BY
from tenure.model import ConsentStatus

from .pools import BOOLEANS, integers, maybe, optional, sampled

__all__ = ["NOW", "consent_row", "consent_records", "consent_commands", "consent_situations"]

NOW = 1_800_000_000_000_000
DECIDERS = ["alice", "deadline-keeper", DEADLINE_OWNER]

instants = st.integers(NOW - 3, NOW + 3) | st.integers(NOW - 10**12, NOW + 10**12)


def consent_row(**changes: Any) -> ConsentRow:
    """A pending consent of run-1, with ``changes`` applied."""
    fields: dict[str, Any] = dict(
        consent_id="consent-1", run_id="run-1", tool_name="shell", tool_call_id="call-1",
        payload_json='{"command":"ls"}', status=ConsentStatus.PENDING, decided_by=None, decided_at_us=None,
        preauthorized_by=None, created_at_us=NOW - 100,
    )
    fields.update(changes)
    return ConsentRow(**fields)


@st.composite
def consent_records(draw: st.DrawFn, step: ConsentStep | None = None) -> ConsentRow | None:
    """A consent keeping every invariant (INV-C1 ... INV-C3), or None for ``absent``."""
    if step is None:
        step = draw(sampled(ConsentStep))
    if step is ConsentStep.ABSENT:
        return None
    status = ConsentStatus(step.value)
    created = draw(instants)
    expires = draw(st.none() | st.integers(-3, 3).map(lambda offset: created + offset) | instants)
    if status is ConsentStatus.PENDING:
        return consent_row(created_at_us=created, expires_at_us=expires)
    if status is ConsentStatus.GRANTED and draw(BOOLEANS):
        return consent_row(status=status, decided_by=PREAUTHORIZED_BY, decided_at_us=created,
                           preauthorized_by="policy-7", created_at_us=created, expires_at_us=expires)
    decided_by = draw(sampled([SETTLED_BY, CANCELLED_BY])) if status is ConsentStatus.CANCELLED else (
        draw(sampled(DECIDERS)))
    return consent_row(status=status, decided_by=decided_by, decided_at_us=created + draw(integers(0, 10)),
                       created_at_us=created, expires_at_us=expires)


@st.composite
def consent_commands(draw: st.DrawFn, kind: ConsentCommandType, record: ConsentRow | None) -> object:
    if kind is ConsentCommandType.CREATE:
        preauthorized = draw(maybe("policy-7"))
        return CreateConsent(row=consent_row(preauthorized_by=preauthorized, created_at_us=0),
                             run_running=draw(BOOLEANS),
                             expires_in_us=draw(optional(integers(1, MAX_DEADLINE_US))))
    if kind is ConsentCommandType.DECIDE:
        # Expiry half the time: the deadline owner's rule is about nothing else.
        verdict = draw(st.just(ConsentStatus.EXPIRED) | sampled(ConsentStatus))
        return DecideConsent(verdict=verdict, decided_by=draw(sampled(DECIDERS)))
    return CancelPending(decided_by=draw(sampled([SETTLED_BY, CANCELLED_BY])))


@st.composite
def consent_situations(
    draw: st.DrawFn, step: ConsentStep | None = None, kind: ConsentCommandType | None = None
) -> tuple[ConsentRow | None, object, int]:
    record = draw(consent_records(step))
    command = draw(consent_commands(kind or draw(sampled(ConsentCommandType)), record))
    edge = draw(integers(0, 2))
    if record is not None and edge == 0:
        now = record.created_at_us + draw(integers(-1, 1))  # a verdict is never dated before creation
    elif record is not None and record.expires_at_us is not None and edge == 1:
        now = record.expires_at_us + draw(integers(-1, 1))  # the deadline owner's expiry is due only from it
    else:
        now = draw(instants)
    return record, command, now
