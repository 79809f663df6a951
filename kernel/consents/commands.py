"""Consent commands and replies: what a caller may ask of the machine, and what an applied command answers."""

from __future__ import annotations

import dataclasses
import enum
from typing import ClassVar

from tenure.model import ConsentStatus

from .record import ConsentRow

__all__ = ["Ack", "CancelPending", "ConsentCommand", "ConsentCommandType", "CreateConsent", "DecideConsent"]


class ConsentCommandType(enum.Enum):
    CREATE = "create"
    DECIDE = "decide"
    CANCEL_PENDING = "cancel_pending"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CreateConsent:
    kind: ClassVar[ConsentCommandType] = ConsentCommandType.CREATE
    row: ConsentRow
    run_running: bool
    """Observed under the Run's lock: the Run exists and is RUNNING (its hop creates owners)."""
    expires_in_us: int | None = None
    """The deadline, counted from the creation time (1 .. MAX_DEADLINE_US), or None."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DecideConsent:
    kind: ClassVar[ConsentCommandType] = ConsentCommandType.DECIDE
    verdict: ConsentStatus
    """GRANTED, DENIED or EXPIRED."""
    decided_by: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CancelPending:
    """The Run reached terminal truth (sent in the Run's own transaction)."""

    kind: ClassVar[ConsentCommandType] = ConsentCommandType.CANCEL_PENDING
    decided_by: str


ConsentCommand = CreateConsent | DecideConsent | CancelPending


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    """The exact change applied."""
