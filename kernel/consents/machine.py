"""The consent machine: every transition of one consent, as one table.

Theory of operation
-------------------
A consent is created by the hop of a RUNNING Run, before that hop parks the Run on it:
pending, or granted at once when a preauthorization covers the call. The first verdict
wins (a compare-and-set from pending); later verdicts change nothing. ``expired`` is a
verdict like the others, sent by whoever owns the deadline: the kernel never derives it
from a clock. A consent created with a deadline (``expires_at_us``) has tenure's relays
as its deadline owner, :data:`DEADLINE_OWNER`: their ``expired`` is accepted only once
the database time has reached the deadline (``not_due`` before, and always for a
consent without one), so a relay with a fast clock or a stale page cannot expire a
consent early; any other principal may still send ``expired`` as before. When the Run
reaches terminal truth, its pending consents are cancelled in the same transaction; a
cancelled consent never resumes a Run. Actors: the Run's hop (create), a principal or a
deadline owner (decide), the Run ledger (cancel_pending). Invariants:
:mod:`tenure.kernel.consents.record` and :func:`transition_violations`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from tenure.model import ConsentStatus, ErrorCode

from ..core import SAME, Applied, Decision, Machine, Refused, Row
from .commands import Ack, ConsentCommand, ConsentCommandType, DecideConsent
from .record import ConsentRow, ConsentStep, record_violations, step_of

__all__ = ["ConsentRefusal", "OUTCOMES", "GUARDS", "EFFECTS", "ROWS", "CONSENTS", "transition_violations", "PREAUTHORIZED_BY", "DEADLINE_OWNER"]

PREAUTHORIZED_BY = "tenure:preauthorized"
"""``decided_by`` of a consent a preauthorization granted at creation."""

DEADLINE_OWNER = "tenure:deadline"
"""``decided_by`` of the relays that apply consent deadlines: its ``expired`` is accepted
only once the consent's ``expires_at_us`` has come."""


class ConsentRefusal(enum.Enum):
    NOT_FOUND = "not_found"
    RUN_NOT_RUNNING = "run_not_running"
    ALREADY_EXISTS = "already_exists"
    ALREADY_DECIDED = "already_decided"
    NOT_DUE = "not_due"


OUTCOMES: dict[ConsentRefusal, ErrorCode | None] = {
    ConsentRefusal.NOT_FOUND: None,
    ConsentRefusal.RUN_NOT_RUNNING: ErrorCode.RUN_OWNER_MISMATCH,
    ConsentRefusal.ALREADY_EXISTS: None,
    ConsentRefusal.ALREADY_DECIDED: None,
    ConsentRefusal.NOT_DUE: None,
}


def _deadline_not_due(record: Any, command: Any, now_us: int) -> bool:
    """The deadline owner sends anything but an ``expired`` its consent's deadline allows now."""
    if command.decided_by != DEADLINE_OWNER:
        return False
    if command.verdict is not ConsentStatus.EXPIRED or record.expires_at_us is None:
        return True
    return bool(now_us < record.expires_at_us)

GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda record, command, now_us: True,
    "run_not_running": lambda record, command, now_us: not command.run_running,
    "preauthorized": lambda record, command, now_us: command.row.preauthorized_by is not None,
    "verdict_granted": lambda record, command, now_us: command.verdict is ConsentStatus.GRANTED,
    "verdict_denied": lambda record, command, now_us: command.verdict is ConsentStatus.DENIED,
    "verdict_expired": lambda record, command, now_us: command.verdict is ConsentStatus.EXPIRED,
    "deadline_not_due": _deadline_not_due,
}


def _create(status: ConsentStatus) -> Callable[[Any, Any, int], Applied[ConsentRow]]:
    def effect(record: Any, command: Any, now_us: int) -> Applied[ConsentRow]:
        granted = status is ConsentStatus.GRANTED
        deadline = None if command.expires_in_us is None else now_us + command.expires_in_us
        row = dataclasses.replace(
            command.row, status=status, decided_by=PREAUTHORIZED_BY if granted else None,
            decided_at_us=now_us if granted else None, created_at_us=now_us,
            preauthorized_by=command.row.preauthorized_by if granted else None, expires_at_us=deadline,
        )
        return Applied(row, Ack())

    return effect


def _decide(status: ConsentStatus) -> Callable[[Any, Any, int], Applied[ConsentRow]]:
    def effect(record: ConsentRow, command: Any, now_us: int) -> Applied[ConsentRow]:
        # A decision is never dated before the consent existed (INV-C2).
        at = now_us if now_us > record.created_at_us else record.created_at_us
        return Applied(dataclasses.replace(record, status=status, decided_by=command.decided_by, decided_at_us=at),
                       Ack())

    return effect


EFFECTS: dict[str, Callable[[Any, Any, int], Applied[ConsentRow]]] = {
    "create_pending": _create(ConsentStatus.PENDING),
    "create_granted": _create(ConsentStatus.GRANTED),
    "grant": _decide(ConsentStatus.GRANTED),
    "deny": _decide(ConsentStatus.DENIED),
    "expire": _decide(ConsentStatus.EXPIRED),
    "cancel": _decide(ConsentStatus.CANCELLED),
}

S = ConsentStep
C = ConsentCommandType
R = ConsentRefusal
_PRESENT = (S.PENDING, S.GRANTED, S.DENIED, S.EXPIRED, S.CANCELLED)
_DECIDED = (S.GRANTED, S.DENIED, S.EXPIRED, S.CANCELLED)

ROWS: tuple[Row, ...] = (
    Row((S.ABSENT,), C.CREATE, "run_not_running", SAME, R.RUN_NOT_RUNNING),
    Row((S.ABSENT,), C.CREATE, "preauthorized", S.GRANTED, "create_granted"),
    Row((S.ABSENT,), C.CREATE, "always", S.PENDING, "create_pending"),
    Row(_PRESENT, C.CREATE, "always", SAME, R.ALREADY_EXISTS),

    Row((S.ABSENT,), C.DECIDE, "always", SAME, R.NOT_FOUND),
    Row((S.PENDING,), C.DECIDE, "deadline_not_due", SAME, R.NOT_DUE),
    Row((S.PENDING,), C.DECIDE, "verdict_granted", S.GRANTED, "grant"),
    Row((S.PENDING,), C.DECIDE, "verdict_denied", S.DENIED, "deny"),
    Row((S.PENDING,), C.DECIDE, "verdict_expired", S.EXPIRED, "expire"),
    Row((S.PENDING,), C.DECIDE, "always", SAME, R.ALREADY_DECIDED),
    Row(_DECIDED, C.DECIDE, "always", SAME, R.ALREADY_DECIDED),

    Row((S.ABSENT,), C.CANCEL_PENDING, "always", SAME, R.NOT_FOUND),
    Row((S.PENDING,), C.CANCEL_PENDING, "always", S.CANCELLED, "cancel"),
    Row(_DECIDED, C.CANCEL_PENDING, "always", SAME, R.ALREADY_DECIDED),
)


def transition_violations(record: ConsentRow | None, command: ConsentCommand, now_us: int,
                          decision: Decision) -> list[str]:
    """The transition rules (TR-C1 ... TR-C4 in specs/consent.md) a decision breaks."""
    if isinstance(decision, Refused):
        return []
    new = decision.new_record
    if record is None:
        if new is None or command.kind is not ConsentCommandType.CREATE or not command.run_running:  # type: ignore[union-attr]
            return ["TR-C1"]  # a consent is born only for a RUNNING Run
        return []
    broken = []
    if new is None or (new.consent_id, new.run_id, new.tool_name, new.tool_call_id, new.payload_json,
                       new.created_at_us, new.expires_at_us) != (
            record.consent_id, record.run_id, record.tool_name, record.tool_call_id, record.payload_json,
            record.created_at_us, record.expires_at_us):
        broken.append("TR-C1")  # identity (the deadline too) never changes; consents are never deleted
    elif record.status is not ConsentStatus.PENDING and new != record:
        broken.append("TR-C2")  # the first verdict wins
    elif new.status is ConsentStatus.CANCELLED and command.kind is not ConsentCommandType.CANCEL_PENDING:
        broken.append("TR-C3")  # only the Run's terminal truth cancels a consent
    elif new != record and _early_deadline_verdict(record, command, now_us):
        broken.append("TR-C4")  # the deadline owner only expires, and only once the deadline has come
    return broken


def _early_deadline_verdict(record: ConsentRow, command: ConsentCommand, now_us: int) -> bool:
    """A verdict of the deadline owner that is not an ``expired`` at or after the deadline."""
    if not isinstance(command, DecideConsent) or command.decided_by != DEADLINE_OWNER:
        return False
    due = record.expires_at_us is not None and now_us >= record.expires_at_us
    return not (command.verdict is ConsentStatus.EXPIRED and due)


CONSENTS = Machine.define(
    name="consent",
    states=ConsentStep,
    commands=ConsentCommandType,
    rows=ROWS,
    guards=GUARDS,
    effects=EFFECTS,
    outcomes=OUTCOMES,
    state_of=step_of,
    record_violations=record_violations,
    transition_violations=transition_violations,
    initial=ConsentStep.ABSENT,
)
"""The consent machine: ``CONSENTS.decide(record, command, now_us)``."""
