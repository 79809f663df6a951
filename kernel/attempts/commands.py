"""Commands of the service-attempt machine, and the replies an applied command returns.

A command carries what the kernel needs besides the record and the database time: the
caller's inputs (evidence, an egress decision, a lookup result), policy (the submit
lease) and observations the adapter made under the same locks (the owner job's latest
other attempt, whether another attempt holds the idempotency key, whether the Run the
attempt names is recorded and no longer RUNNING). Evidence and lookup results are plain
values here: the ledger turns the public ones into these.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import ClassVar

from tenure.model import AttemptState

from .record import AttemptRow

__all__ = [
    "AttemptCommandType",
    "Prepare",
    "BeginSubmit",
    "RecordAccepted",
    "RecordRunning",
    "RecordProgress",
    "RecordSucceeded",
    "RecordFailed",
    "RecordAmbiguous",
    "RequestCancel",
    "RecordCancelled",
    "Reconcile",
    "ExpireSubmitLease",
    "ReleaseReservation",
    "AttemptCommand",
    "FailureKind",
    "LookupKind",
    "Prepared",
    "TransmissionGranted",
    "EgressDenied",
    "Ack",
    "AttemptReply",
]


class AttemptCommandType(enum.Enum):
    """Every command of the attempt machine; values are the names the spec table uses."""

    PREPARE = "prepare"
    BEGIN_SUBMIT = "begin_submit"
    RECORD_ACCEPTED = "record_accepted"
    RECORD_RUNNING = "record_running"
    RECORD_PROGRESS = "record_progress"
    RECORD_SUCCEEDED = "record_succeeded"
    RECORD_FAILED = "record_failed"
    RECORD_AMBIGUOUS = "record_ambiguous"
    REQUEST_CANCEL = "request_cancel"
    RECORD_CANCELLED = "record_cancelled"
    RECONCILE = "reconcile"
    EXPIRE_SUBMIT_LEASE = "expire_submit_lease"
    RELEASE_RESERVATION = "release_reservation"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Prepare:
    """Record an attempt before its first transmission, or answer its replay. Met with
    the row of this attempt ID (or none)."""

    kind: ClassVar[AttemptCommandType] = AttemptCommandType.PREPARE
    row: AttemptRow
    """The attempt as it would be stored (PREPARED, created now)."""
    predecessor_state: AttemptState | None
    """Observed under the lock: the state of the owner job's attempt of the highest other
    generation, or None when it has none."""
    predecessor_generation: int
    """That attempt's generation (0 when there is none)."""
    key_held_elsewhere: bool
    """Observed under the lock: another attempt already holds this idempotency key."""
    run_closed: bool
    """Observed under the Run's lock: the attempt names a Run that exists in this
    database and is not RUNNING. An attempt without a Run, or naming none of this
    database's Runs (attempts are also used without Runs), is never closed."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BeginSubmit:
    """Grant the next physical transmission, or refuse it."""

    kind: ClassVar[AttemptCommandType] = AttemptCommandType.BEGIN_SUBMIT
    egress_decision_id: str
    egress_allowed: bool
    proof_looked_up_at_us: int | None
    """The caller's proof that the latest transmission had no effect: a lookup that found
    nothing and vouches for it (``NotFound(proves_no_effect=True)``), given as the
    database instant read just before that lookup was sent; None when there is none. It
    proves something only when that instant is past the submit lease: a lookup made while
    a transmission may still reach the provider says nothing about it, however late its
    answer reaches the kernel."""
    lease_us: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecordAccepted:
    kind: ClassVar[AttemptCommandType] = AttemptCommandType.RECORD_ACCEPTED
    provider_job_id: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecordRunning:
    kind: ClassVar[AttemptCommandType] = AttemptCommandType.RECORD_RUNNING


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecordProgress:
    kind: ClassVar[AttemptCommandType] = AttemptCommandType.RECORD_PROGRESS
    cursor: str
    usage_json: str | None
    cost_json: str | None
    warnings: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecordSucceeded:
    kind: ClassVar[AttemptCommandType] = AttemptCommandType.RECORD_SUCCEEDED
    result_refs: tuple[str, ...]
    diagnostic_refs: tuple[str, ...]
    usage_json: str | None
    cost_json: str | None


class FailureKind(enum.Enum):
    """Evidence of a failure: rejected before any effect, or reported by the provider."""

    REJECTED_BEFORE_EFFECT = "rejected_before_effect"
    PROVIDER_FAILED = "provider_failed"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecordFailed:
    kind: ClassVar[AttemptCommandType] = AttemptCommandType.RECORD_FAILED
    evidence: FailureKind
    reason: str
    transmission: int | None = None
    """The number of the transmission a rejection answers (``TransmissionGranted.number``).
    A rejection fails the attempt only when it answers the latest transmission, and only
    when no earlier one may still reach the provider; a report that names none, or an
    earlier one, proves nothing about the attempt. A provider-reported failure is of the
    provider's job, whichever transmission made it, and names none."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecordAmbiguous:
    """A timeout, disconnect, crash or malformed acknowledgement after transmission."""

    kind: ClassVar[AttemptCommandType] = AttemptCommandType.RECORD_AMBIGUOUS
    reason: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RequestCancel:
    kind: ClassVar[AttemptCommandType] = AttemptCommandType.REQUEST_CANCEL


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecordCancelled:
    """Containment evidence: the provider confirmed this job stopped."""

    kind: ClassVar[AttemptCommandType] = AttemptCommandType.RECORD_CANCELLED
    provider_job_id: str


class LookupKind(enum.Enum):
    FOUND = "found"
    NOT_FOUND = "not_found"
    FAILED = "lookup_failed"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Reconcile:
    """What a lookup (or a poll) of the same provider and idempotency key saw."""

    kind: ClassVar[AttemptCommandType] = AttemptCommandType.RECONCILE
    lookup: LookupKind
    provider_job_id: str | None = None
    found_state: AttemptState | None = None
    result_refs: tuple[str, ...] = ()
    proves_no_effect: bool = False
    looked_up_at_us: int | None = None
    """For a not-found: the database instant read just before the lookup was sent. The
    not-found is judged against the submit lease at that instant (the one it speaks for),
    not at the instant its ``reconcile`` is decided; one without it proves nothing."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExpireSubmitLease:
    """The sender's window ended without an acknowledgement (recovery, when no lookup can
    say more): the outcome is now explicitly ambiguous."""

    kind: ClassVar[AttemptCommandType] = AttemptCommandType.EXPIRE_SUBMIT_LEASE


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseReservation:
    kind: ClassVar[AttemptCommandType] = AttemptCommandType.RELEASE_RESERVATION


AttemptCommand = (
    Prepare | BeginSubmit | RecordAccepted | RecordRunning | RecordProgress | RecordSucceeded | RecordFailed
    | RecordAmbiguous | RequestCancel | RecordCancelled | Reconcile | ExpireSubmitLease | ReleaseReservation
)


@dataclasses.dataclass(frozen=True, slots=True)
class Prepared:
    attempt_id: str
    replayed: bool


@dataclasses.dataclass(frozen=True, slots=True)
class TransmissionGranted:
    number: int
    egress_decision_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class EgressDenied:
    """The policy refused this transmission: recorded, nothing sent."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    """The exact mutation applied (the caller sees True)."""


AttemptReply = Prepared | TransmissionGranted | EgressDenied | Ack
