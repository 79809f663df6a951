"""Commands of the Run machine, the evidence they carry, and the replies they return.

A command carries the caller's inputs (the hop's sequence, a node, an owner) and what
the ledger observed under the Run's lock in the same transaction: the owner row a park
or a resume names (:class:`OwnerEvidence`), the correlated delegated jobs and service
attempts still open (:class:`Containment`), whether another nonterminal Run holds the
session, and, for ``finish_cancel``, what the broker said of the frozen hop. The kernel
decides from these values; the ledger only reads them.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import ClassVar

from tenure.model import BrokerJobState, RunStatus, WaitKind

from .record import DeliveryRow, RunRow

__all__ = [
    "RunCommandType",
    "OwnerEvidence",
    "Containment",
    "Admit",
    "Release",
    "FailHeld",
    "RecordPublished",
    "RecordPublishError",
    "Claim",
    "EnterHardwareWait",
    "LeaveHardwareWait",
    "Park",
    "Resume",
    "Settle",
    "BeginCancel",
    "FinishCancel",
    "Rotate",
    "RetryLost",
    "TimeOut",
    "RunCommand",
    "Admitted",
    "Claimed",
    "Resumed",
    "Rotated",
    "Settled",
    "Ticket",
    "Swept",
    "TimedOut",
    "Ack",
    "RunReply",
]


class RunCommandType(enum.Enum):
    """Every command of the Run machine; values are the names the spec table uses."""

    ADMIT = "admit"
    RELEASE = "release"
    FAIL_HELD = "fail_held"
    RECORD_PUBLISHED = "record_published"
    RECORD_PUBLISH_ERROR = "record_publish_error"
    CLAIM = "claim"
    ENTER_HARDWARE_WAIT = "enter_hardware_wait"
    LEAVE_HARDWARE_WAIT = "leave_hardware_wait"
    PARK = "park"
    RESUME = "resume"
    SETTLE = "settle"
    BEGIN_CANCEL = "begin_cancel"
    FINISH_CANCEL = "finish_cancel"
    ROTATE = "rotate"
    RETRY_LOST = "retry_lost"
    TIME_OUT = "time_out"


@dataclasses.dataclass(frozen=True, slots=True)
class OwnerEvidence:
    """An owner row as read under the Run's lock: its kind and ID, the Run it belongs
    to, its status (the owner table's value) and ``complete``: a consent's decision has
    its principal and time; a delegated job's result is shape-valid for that job and
    status; always True for a service attempt."""

    kind: WaitKind
    owner_id: str
    run_id: str | None
    status: str
    complete: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Containment:
    """The Run's correlated effects still open, counted under its lock: delegated jobs
    that are nonterminal or LOST, and service attempts that are not terminal."""

    open_jobs: int
    open_attempts: int

    @property
    def proven(self) -> bool:
        return self.open_jobs == 0 and self.open_attempts == 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Admit:
    """Create a QUEUED Run with delivery 0, or answer a replay. ``run`` and ``delivery``
    are the rows as they would be stored (their times are set by the kernel)."""

    kind: ClassVar[RunCommandType] = RunCommandType.ADMIT
    run: RunRow
    delivery: DeliveryRow
    hold: bool
    session_busy: bool
    """Observed under the session lock: the fence is asked for and another nonterminal
    Run holds the session."""
    timeout_us: int | None = None
    """How long the Run may take, in microseconds of database time: its deadline is the
    admission's time plus this (None: no deadline). Part of the admitted work: a replay
    under the same key must ask for the same timeout."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Release:
    kind: ClassVar[RunCommandType] = RunCommandType.RELEASE
    enqueue_seq: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FailHeld:
    kind: ClassVar[RunCommandType] = RunCommandType.FAIL_HELD
    enqueue_seq: int
    error: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecordPublished:
    """The broker acknowledged the hop's publication."""

    kind: ClassVar[RunCommandType] = RunCommandType.RECORD_PUBLISHED
    enqueue_seq: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecordPublishError:
    """A publish call failed (or its acknowledgement was lost)."""

    kind: ClassVar[RunCommandType] = RunCommandType.RECORD_PUBLISH_ERROR
    enqueue_seq: int
    error: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    kind: ClassVar[RunCommandType] = RunCommandType.CLAIM
    enqueue_seq: int
    node: str
    claimant: str | None = None
    """The claiming hop's own token (drawn once per hop attempt), recorded as the
    delivery's ``claimed_by``; the same claim sent again (its first COMMIT applied but
    went unacknowledged) is answered with the claim it made. None: ``claimed_by`` is the
    node, and nothing answers a repeat."""
    serves: tuple[tuple[str, str], ...] | None = None
    """The workflows the claiming worker serves, as ``(name, version)`` pairs: a Run
    pinned to any other is refused ``not_served`` and left exactly as it was (its hop
    goes back to the broker for a worker that serves it). None: any workflow (the
    worker checks the pin after its claim)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EnterHardwareWait:
    kind: ClassVar[RunCommandType] = RunCommandType.ENTER_HARDWARE_WAIT
    enqueue_seq: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LeaveHardwareWait:
    kind: ClassVar[RunCommandType] = RunCommandType.LEAVE_HARDWARE_WAIT
    enqueue_seq: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Park:
    kind: ClassVar[RunCommandType] = RunCommandType.PARK
    enqueue_seq: int
    wait: WaitKind
    owner_id: str
    owner: OwnerEvidence | None
    """The owner row of that kind and ID, or None when there is none (always for a timer)."""
    wake_at_us: int | None = None
    """A timer wait's due time on the database clock; None for every other wait."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Resume:
    kind: ClassVar[RunCommandType] = RunCommandType.RESUME
    owner_id: str
    owner: OwnerEvidence | None
    """The Run's persisted owner row, re-read in the same transaction (None: missing)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Settle:
    kind: ClassVar[RunCommandType] = RunCommandType.SETTLE
    enqueue_seq: int
    status: RunStatus
    """DONE or FAILED."""
    error: str | None
    containment: Containment
    result_json: str | None = None
    """A DONE Run's result (canonical JSON text), kept with it."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BeginCancel:
    kind: ClassVar[RunCommandType] = RunCommandType.BEGIN_CANCEL


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FinishCancel:
    kind: ClassVar[RunCommandType] = RunCommandType.FINISH_CANCEL
    enqueue_seq: int
    hop: BrokerJobState | None
    """The broker's answer for the frozen hop after any abort (None: it could not say)."""
    containment: Containment


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Rotate:
    """Recovery: the broker finished with the QUEUED hop ``enqueue_seq`` without it ever
    being claimed (a worker died before its claim, or the hop was aborted); open the
    next hop with the same resume mode. ``hop`` is what the broker said of the old key."""

    kind: ClassVar[RunCommandType] = RunCommandType.ROTATE
    enqueue_seq: int
    hop: BrokerJobState | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetryLost:
    """Recovery: the hop ``enqueue_seq`` died with its process (fenced, ``hop`` is what the
    broker said after the fence) and its workflow declared hops safe to repeat: open the
    next hop in the same resume mode instead of failing the Run ``lost``, counting the
    retry. Needs the lost hop's service attempts ended and a retry left; its delegated
    jobs are carried into the hop that runs again, whose replay adopts each by its
    request (the same request answers the same job)."""

    kind: ClassVar[RunCommandType] = RunCommandType.RETRY_LOST
    enqueue_seq: int
    hop: BrokerJobState | None
    containment: Containment


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TimeOut:
    """The deadline's owner (a relay, or startup reconciliation) elects the cancellation of
    a Run whose deadline passed on the database clock, recording the reason ``timeout``;
    ``finish_cancel`` then ends it exactly as an operator's cancellation."""

    kind: ClassVar[RunCommandType] = RunCommandType.TIME_OUT


RunCommand = (
    Admit | Release | FailHeld | RecordPublished | RecordPublishError | Claim | EnterHardwareWait
    | LeaveHardwareWait | Park | Resume | Settle | BeginCancel | FinishCancel | Rotate | RetryLost | TimeOut
)


@dataclasses.dataclass(frozen=True, slots=True)
class Admitted:
    created: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Claimed:
    enqueue_seq: int
    resume: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Resumed:
    enqueue_seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class Settled:
    """The Run reached terminal truth: pending consents are cancelled in the same
    transaction (``decided_by`` names why)."""

    decided_by: str


@dataclasses.dataclass(frozen=True, slots=True)
class Ticket:
    enqueue_seq: int
    already_cancelled: bool


@dataclasses.dataclass(frozen=True, slots=True)
class TimedOut:
    """The deadline's owner elected the cancellation now: the Run is CANCELLING at
    ``enqueue_seq`` with the reason ``timeout`` (finish it as a ticket's). A Run already
    CANCELLING answers a :class:`Ticket`."""

    enqueue_seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class Swept:
    """An already CANCELLED Run: nothing changes but its pending consents are swept again."""

    decided_by: str


@dataclasses.dataclass(frozen=True, slots=True)
class Rotated:
    """The next hop was opened (publish it)."""

    enqueue_seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    """The exact change applied."""


RunReply = Admitted | Claimed | Resumed | Rotated | Settled | Ticket | Swept | TimedOut | Ack
