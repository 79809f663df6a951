"""The consent record, its invariants, and the commands and replies of its machine.

A consent asks a principal to allow one tool call of one Run. It is created pending (or
granted at once by a preauthorization), and the first verdict wins: granted, denied or
expired (expiry is a verdict someone sends, never derived from a clock; a consent
may carry a deadline, ``expires_at_us``, which only lets the deadline owner send that
verdict once it has come). A pending consent is cancelled when its Run reaches terminal
truth. Instants are integer microseconds on the database clock.
"""

from __future__ import annotations

import dataclasses
import enum

from tenure.model import ConsentStatus, bounds
from tenure.model.runs import MAX_RUN_TEXT_CHARS

__all__ = [
    "ConsentRow",
    "ConsentStep",
    "step_of",
    "record_violations",
    "MAX_DEADLINE_US",
]

MAX_DEADLINE_US = 30 * 24 * 3600 * 1_000_000
"""The longest deadline a consent may be created with: 30 days."""


class ConsentStep(enum.Enum):
    ABSENT = "absent"
    PENDING = "pending"
    GRANTED = "granted"
    DENIED = "denied"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsentRow:
    consent_id: str
    run_id: str
    tool_name: str
    tool_call_id: str
    payload_json: str
    status: ConsentStatus
    decided_by: str | None
    decided_at_us: int | None
    preauthorized_by: str | None
    created_at_us: int
    expires_at_us: int | None = None
    """The deadline the deadline owner applies (``expired`` once due), or None: no
    deadline. Set at creation and never changed."""


_STEP_OF_STATUS = {status: ConsentStep(status.value) for status in ConsentStatus}


def step_of(record: ConsentRow | None) -> ConsentStep:
    return ConsentStep.ABSENT if record is None else _STEP_OF_STATUS[record.status]


def _text(value: object, max_chars: int = MAX_RUN_TEXT_CHARS) -> bool:
    return bounds.is_bounded_text(value, max_chars)


_instant = bounds.is_instant


def record_violations(record: ConsentRow) -> list[str]:
    """The invariants (``INV-C1`` ... ``INV-C3`` in specs/consent.md) this row breaks."""
    types = {
        "consent_id": _text(record.consent_id, 36),
        "run_id": _text(record.run_id, 36),
        "tool_name": _text(record.tool_name),
        "tool_call_id": _text(record.tool_call_id),
        "payload_json": type(record.payload_json) is str,
        "status": type(record.status) is ConsentStatus,
        "decided_by": record.decided_by is None or _text(record.decided_by, bounds.MAX_IDENTITY_CHARS),
        "decided_at_us": record.decided_at_us is None or _instant(record.decided_at_us),
        "preauthorized_by": record.preauthorized_by is None or _text(record.preauthorized_by),
        "created_at_us": _instant(record.created_at_us),
        "expires_at_us": record.expires_at_us is None or _instant(record.expires_at_us),
    }
    broken = [f"INV-C1.{name}" for name, ok in types.items() if not ok]
    if broken:
        return broken
    pending = record.status is ConsentStatus.PENDING
    rules = {
        # INV-C2: pending has no decision; every other status has its principal and time.
        "INV-C2": (record.decided_by is None and record.decided_at_us is None) == pending
        and (record.decided_by is None) == (record.decided_at_us is None),
        # INV-C3: a preauthorized consent was granted by that preauthorization at creation.
        "INV-C3": record.preauthorized_by is None or (
            record.status is ConsentStatus.GRANTED and record.decided_at_us == record.created_at_us
        ),
    }
    if record.decided_at_us is not None and record.decided_at_us < record.created_at_us:
        rules["INV-C2"] = False
    return [name for name, ok in rules.items() if not ok]


