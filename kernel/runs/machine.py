"""The workflow Run machine: every transition of the pair (Run, delivery), as one table.

Theory of operation
-------------------
A Run is admitted once: one transaction creates it QUEUED with delivery 0, HELD while
the caller still retains admission context, else PENDING. A caller publishes a PENDING
delivery to a broker under the hop key ``run:<run_id>:<seq>``; the acknowledgement
moves it to PUBLISHED (never backwards), a failure is counted and leaves it for a
retry under the same key. A worker hop claims exactly that sequence: QUEUED plus a
pending or published delivery become RUNNING plus a CLAIMED delivery in one
transaction, so a stale or duplicate hop finds nothing to claim. The hop then settles
(DONE or FAILED, only with every correlated effect contained), waits for hardware on
the same claim, or parks on an owner of this Run (a consent, a delegated job, a service
attempt, a receive waiting for a message, or a timer), which settles its delivery. Only the Run's current owner, once decided,
resumes it: the Run becomes QUEUED at the next sequence with a new PENDING delivery
marked ``resume``. Cancellation freezes the generation (CANCELLING), and only proof
that the hop is not live and every correlated effect is contained makes it CANCELLED.

Four actors move a Run: the admitting caller (admit, release, fail_held, publish), the
hop that claimed it (claim, hardware waits, park, settle), an owner's decider (resume)
and an operator (begin_cancel, finish_cancel). A Run admitted with a timeout has a
deadline on the database clock (admission time plus timeout, part of its identity); its
owner, the relays (or startup reconciliation), sends ``time_out`` once it passed, which
elects the cancellation as ``begin_cancel`` does and records the reason ``timeout``.
Every command names the sequence it acts for, so nothing an old hop does can touch a
later one. The invariants are in
:mod:`tenure.kernel.runs.record` and :func:`transition_violations` (``specs/runs.md``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from tenure.model import (
    ANSWERED_MESSAGE_STATUSES,
    DECIDED_CONSENT_STATUSES,
    FINISHED_BROKER_STATES,
    LIVE_BROKER_STATES,
    TERMINAL_AGENT_JOB_STATUSES,
    TERMINAL_ATTEMPT_STATES,
    TERMINAL_RUN_STATUSES,
    WAIT_STATUSES,
    BrokerJobState,
    DeliveryState,
    ErrorCode,
    RunStatus,
    WaitKind,
    bounds,
)

from ..core import SAME, Applied, Decision, KeptLater, Machine, MovingField, Refused, Row, SetOnce, TimeGuard
from tenure.model.bounds import MAX_INSTANT_US, MIN_INSTANT_US
from tenure.model.runs import MAX_RUN_TIMEOUT_S, RUN_TIMEOUT_ERROR
from .commands import (
    Ack,
    Admitted,
    Claimed,
    Resumed,
    Rotated,
    RunCommand,
    RunCommandType,
    Settled,
    Swept,
    Ticket,
    TimedOut,
)
from .record import (
    DeliveryRow,
    RunPair,
    RunRow,
    RunStep,
    key_of,
    record_violations,
    replace_delivery,
    replace_run,
    step_of,
)

__all__ = [
    "RunRefusal",
    "OUTCOMES",
    "GUARDS",
    "EFFECTS",
    "TIME_GUARDS",
    "MOVING_FIELDS",
    "MOVING_FIELD_ORDERS",
    "ROWS",
    "RUNS",
    "RESOLVED_OWNER_STATUSES",
    "owner_resolves",
    "owner_decided",
    "consent_sweep",
    "SETTLED_BY",
    "CANCELLED_BY",
    "MAX_RUN_TIMEOUT_US",
    "admitted_timeout_us",
    "transition_violations",
]


class RunRefusal(enum.Enum):
    """Why a command changed nothing. Values are the names the spec table uses."""

    NOT_FOUND = "not_found"
    KEY_REUSED = "key_reused"
    INTENT_CHANGED = "intent_changed"
    ADMISSION_HELD = "admission_held"
    SESSION_BUSY = "session_busy"
    STALE_HOP = "stale_hop"
    NOT_HELD = "not_held"
    NOT_PUBLISHABLE = "not_publishable"
    NOT_SERVED = "not_served"
    NOT_QUEUED = "not_queued"
    NOT_RUNNING = "not_running"
    NOT_IN_HARDWARE_WAIT = "not_in_hardware_wait"
    OWNER_MISMATCH = "owner_mismatch"
    NOT_AN_OWNER_KIND = "not_an_owner_kind"
    NOT_WAITING = "not_waiting"
    NOT_CURRENT_OWNER = "not_current_owner"
    OWNER_UNDECIDED = "owner_undecided"
    CANCELLING = "cancelling"
    CONTAINMENT_UNPROVEN = "containment_unproven"
    HOP_LIVE = "hop_live"
    FINISHED = "finished"
    NOT_CANCELLING = "not_cancelling"
    HOP_UNFINISHED = "hop_unfinished"
    NO_RETRIES_LEFT = "no_retries_left"
    WAKE_INVALID = "wake_invalid"
    TIMER_NOT_DUE = "timer_not_due"
    TIMEOUT_INVALID = "timeout_invalid"
    TIMEOUT_CHANGED = "timeout_changed"
    NO_DEADLINE = "no_deadline"
    DEADLINE_NOT_DUE = "deadline_not_due"


R = RunRefusal
OUTCOMES: dict[RunRefusal, ErrorCode | None] = {
    reason: {
        R.KEY_REUSED: ErrorCode.RUN_ADMISSION_CONFLICT,
        R.INTENT_CHANGED: ErrorCode.RUN_ADMISSION_CONFLICT,
        R.TIMEOUT_CHANGED: ErrorCode.RUN_ADMISSION_CONFLICT,
        R.ADMISSION_HELD: ErrorCode.RUN_ADMISSION_HELD,
        R.SESSION_BUSY: ErrorCode.RUN_SESSION_BUSY,
        R.OWNER_MISMATCH: ErrorCode.RUN_OWNER_MISMATCH,
        R.CONTAINMENT_UNPROVEN: ErrorCode.RUN_CONTAINMENT_UNPROVEN,
        R.HOP_LIVE: ErrorCode.RUN_CONTAINMENT_UNPROVEN,
    }.get(reason)
    for reason in RunRefusal
}
"""What each refusal means to a caller: the error code it raises, or None for a known
negative answer (False, or None where the operation returns a value)."""

RESOLVED_OWNER_STATUSES: dict[WaitKind, frozenset[str]] = {
    WaitKind.CONSENT: frozenset(status.value for status in DECIDED_CONSENT_STATUSES),
    WaitKind.DELEGATE: frozenset(status.value for status in TERMINAL_AGENT_JOB_STATUSES),
    WaitKind.SERVICE: frozenset(state.value for state in TERMINAL_ATTEMPT_STATES),
    WaitKind.MESSAGE: frozenset(status.value for status in ANSWERED_MESSAGE_STATUSES),
}
"""The owner statuses that resume a Run: a verdict (never a cancellation), a terminal
delegated job, a terminal service attempt, a receive's answer (a message, or its
timeout; never a cancellation). A timer has no owner row: its due time on the database
clock resumes it (``timer_not_due``)."""

MAX_RUN_TIMEOUT_US = MAX_RUN_TIMEOUT_S * 1_000_000
"""The longest timeout an admission may carry, in microseconds (366 days)."""


def admitted_timeout_us(run: RunRow) -> int | None:
    """The timeout the Run was admitted with (its deadline less its admission time), or
    None: what a replay under the same key must ask for again."""
    return None if run.deadline_us is None else run.deadline_us - run.created_at_us


SETTLED_BY = "tenure:run-settled"
CANCELLED_BY = "tenure:run-cancelled"
"""``decided_by`` of the pending consents a settlement or a cancellation sweeps."""

_LIVE_HOP = LIVE_BROKER_STATES
_FINISHED_HOP = FINISHED_BROKER_STATES


# --- guards: named predicates over (pair, command, now_us) ------------------------------


def _owner_matches(run: RunRow, owner: Any, kind: Any, owner_id: str) -> bool:
    return (
        owner is not None and owner.kind is kind and owner.owner_id == owner_id
        and owner.run_id == run.run_id
    )


def consent_sweep(reply: object) -> str | None:
    """The ``decided_by`` a Run decision's reply cancels the Run's pending consents with,
    in the same transaction, or None. Every decision that gives the Run terminal truth
    (``Settled``) sweeps them, and so does a cancellation repeated on a CANCELLED Run
    (``Swept``): a consent must never stay pending on a Run that will not resume."""
    return reply.decided_by if isinstance(reply, Settled | Swept) else None


def owner_decided(kind: WaitKind | None, status: str) -> bool:
    """Whether an owner of ``kind`` in ``status`` (its stored value) has decided: the state
    a resume may rest on (a consent's verdict, a job's end, an attempt's end)."""
    return kind is not None and status in RESOLVED_OWNER_STATUSES.get(kind, frozenset())


def owner_resolves(run: RunRow, owner: Any) -> bool:
    """Whether ``owner`` (an :class:`OwnerEvidence` or None) is the Run's persisted owner,
    of this Run, decided and complete: what lets a wait resume (recovery asks the same)."""
    return (
        run.owner_kind is not None and run.owner_id is not None
        and _owner_matches(run, owner, run.owner_kind, run.owner_id)
        # ``get``: a wait of kind HARDWARE has no owner row to resolve it (and no KeyError).
        and owner.status in RESOLVED_OWNER_STATUSES.get(run.owner_kind, frozenset()) and owner.complete
    )


def _owner_resolved(record: RunPair, command: Any) -> bool:
    return owner_resolves(record.run, command.owner)


def _timeout_invalid(command: Any) -> bool:
    # A timeout is a whole number of microseconds, at least one, at most 366 days.
    timeout = command.timeout_us
    return timeout is not None and not (bounds.is_strict_int(timeout) and 1 <= timeout <= MAX_RUN_TIMEOUT_US)


def _wake_invalid(command: Any) -> bool:
    # Exactly a timer wait names a due time, an instant the records can hold.
    wake = command.wake_at_us
    if command.wait is not WaitKind.TIMER:
        return wake is not None
    return not (bounds.is_strict_int(wake) and MIN_INSTANT_US <= wake <= MAX_INSTANT_US)


GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda record, command, now_us: True,
    # admission
    "other_key": lambda record, command, now_us: record.run.idempotency_key != command.run.idempotency_key,
    "intent_differs": lambda record, command, now_us: record.run.intent_digest != command.run.intent_digest,
    "held_without_hold": lambda record, command, now_us: record.current.state is DeliveryState.HELD
    and not command.hold,
    "timeout_invalid": lambda record, command, now_us: _timeout_invalid(command),
    "timed": lambda record, command, now_us: command.timeout_us is not None,
    # the timeout is part of the admitted work: a replay asks for the same one
    "timeout_differs": lambda record, command, now_us: admitted_timeout_us(record.run) != command.timeout_us,
    # the deadline's owner: due at its instant on the database clock, not a microsecond before
    "no_deadline": lambda record, command, now_us: record.run.deadline_us is None,
    "deadline_not_due": lambda record, command, now_us: record.run.deadline_us is not None
    and now_us < record.run.deadline_us,
    "session_busy": lambda record, command, now_us: command.session_busy,
    # the hop a command names
    "seq_differs": lambda record, command, now_us: command.enqueue_seq != record.run.enqueue_seq,
    "not_held": lambda record, command, now_us: record.current.state is not DeliveryState.HELD,
    "unpublishable": lambda record, command, now_us: record.current.state not in (
        DeliveryState.PENDING, DeliveryState.PUBLISHED
    ),
    "not_served": lambda record, command, now_us: command.serves is not None and (
        record.run.workflow_name, record.run.workflow_revision) not in command.serves,
    # owners
    # an owned wait names its owner row, read under the lock; a timer has none to name
    "owner_foreign": lambda record, command, now_us: (
        command.owner is not None if command.wait is WaitKind.TIMER
        else command.wait in RESOLVED_OWNER_STATUSES
        and not _owner_matches(record.run, command.owner, command.wait, command.owner_id)
    ),
    "wake_invalid": lambda record, command, now_us: _wake_invalid(command),
    "waits_for_consent": lambda record, command, now_us: command.wait is WaitKind.CONSENT,
    "waits_for_delegate": lambda record, command, now_us: command.wait is WaitKind.DELEGATE,
    "waits_for_service": lambda record, command, now_us: command.wait is WaitKind.SERVICE,
    "waits_for_timer": lambda record, command, now_us: command.wait is WaitKind.TIMER,
    "waits_for_message": lambda record, command, now_us: command.wait is WaitKind.MESSAGE,
    # a timer is due at its instant (the database clock), not a microsecond before
    "timer_not_due": lambda record, command, now_us: now_us < record.run.wake_at_us,
    "not_current_owner": lambda record, command, now_us: command.owner_id != record.run.owner_id,
    # a claim sent again by the hop that made it (its acknowledgement was lost)
    "claimed_by_claimant": lambda record, command, now_us: command.claimant is not None
    and command.enqueue_seq == record.run.enqueue_seq and record.current.state is DeliveryState.CLAIMED
    and record.current.claimed_by == command.claimant,
    "owner_unresolved": lambda record, command, now_us: not _owner_resolved(record, command),
    # settlement and cancellation
    "containment_unproven": lambda record, command, now_us: not command.containment.proven,
    # a retry carries the lost hop's delegated jobs (the hop that runs again adopts them by
    # their request): only its service attempts must have ended
    "attempts_open": lambda record, command, now_us: command.containment.open_attempts != 0,
    "settles_done": lambda record, command, now_us: command.status is RunStatus.DONE,
    "hop_live": lambda record, command, now_us: command.hop is None or command.hop in _LIVE_HOP,
    # recovery: only a hop the broker finished with (not live, not absent, known) rotates
    "hop_unfinished": lambda record, command, now_us: command.hop not in _FINISHED_HOP,
    "no_retries_left": lambda record, command, now_us: record.run.hop_retries >= record.run.max_hop_retries,
}


# --- effects ----------------------------------------------------------------------------


def _later(record: RunPair, now_us: int) -> int:
    # updated_at never moves backwards, whatever time a caller passes (INV-R9).
    return now_us if now_us > record.run.updated_at_us else record.run.updated_at_us


def _move(
    record: RunPair, now_us: int, reply: Any = None, *, delivery: dict[str, Any] | None = None,
    opened: DeliveryRow | None = None, **run_changes: Any,
) -> Applied[RunPair]:
    """The pair with the Run's and the current delivery's fields changed (and a next
    delivery opened after it)."""
    run = replace_run(record.run, updated_at_us=_later(record, now_us), **run_changes)
    current = record.current if delivery is None else replace_delivery(record.current, **delivery)
    deliveries = (current,) if opened is None else (current, opened)
    return Applied(RunPair(run, deliveries), Ack() if reply is None else reply)


def _settled(now_us: int) -> dict[str, Any]:
    return {"state": DeliveryState.SETTLED, "settled_at_us": now_us}


def _insert(record: Any, command: Any, now_us: int) -> Applied[RunPair]:
    # The kernel sets where the Run stands: only its identity comes from the caller.
    return _inserted(command, now_us, None)


def _insert_timed(record: Any, command: Any, now_us: int) -> Applied[RunPair]:
    # The deadline is on the database clock: the admission's time plus the timeout.
    return _inserted(command, now_us, now_us + command.timeout_us)


def _inserted(command: Any, now_us: int, deadline_us: int | None) -> Applied[RunPair]:
    run = replace_run(
        command.run, status=RunStatus.QUEUED, enqueue_seq=0, started_at_us=None, node=None, owner_kind=None,
        owner_id=None, error=None, created_at_us=now_us, updated_at_us=now_us, wake_at_us=None,
        deadline_us=deadline_us,
    )
    delivery = replace_delivery(
        command.delivery, delivery_id=key_of(run.run_id, 0), run_id=run.run_id, enqueue_seq=0,
        state=DeliveryState.HELD if command.hold else DeliveryState.PENDING, queue=run.queue,
        priority=run.priority, resume=False, publish_attempts=0, last_error=None, claimed_by=None,
        published_at_us=None, claimed_at_us=None, settled_at_us=None, created_at_us=now_us,
    )
    return Applied(RunPair(run, (delivery,)), Admitted(created=True))


def _claim(record: RunPair, command: Any, now_us: int) -> Applied[RunPair]:
    started = record.run.started_at_us if record.run.started_at_us is not None else now_us
    return _move(
        record, now_us, Claimed(record.run.enqueue_seq, record.current.resume),
        delivery={"state": DeliveryState.CLAIMED, "claimed_at_us": now_us,
                  "claimed_by": command.claimant if command.claimant is not None else command.node},
        status=RunStatus.RUNNING, started_at_us=started, node=command.node,
    )


def _park(status: RunStatus) -> Callable[[Any, Any, int], Applied[RunPair]]:
    def effect(record: RunPair, command: Any, now_us: int) -> Applied[RunPair]:
        return _move(record, now_us, delivery=_settled(now_us), status=status, owner_kind=command.wait,
                     owner_id=command.owner_id, wake_at_us=command.wake_at_us)

    return effect


def _resume(record: RunPair, command: Any, now_us: int) -> Applied[RunPair]:
    current = record.current
    seq = record.run.enqueue_seq + 1
    opened = DeliveryRow(
        delivery_id=key_of(record.run.run_id, seq), run_id=record.run.run_id, enqueue_seq=seq,
        state=DeliveryState.PENDING, queue=current.queue, priority=current.priority, resume=True,
        publish_attempts=0, last_error=None, claimed_by=None, published_at_us=None, claimed_at_us=None,
        settled_at_us=None, created_at_us=now_us,
    )
    # The current delivery was settled by the park; a resume opens the next one.
    return _move(record, now_us, Resumed(seq), opened=opened, status=RunStatus.QUEUED, enqueue_seq=seq,
                 owner_kind=None, owner_id=None, wake_at_us=None)


def _rotate(record: RunPair, command: Any, now_us: int) -> Applied[RunPair]:
    # The broker finished with a hop nobody claimed: the same Run goes on at the next
    # sequence, in the mode the stored delivery had (fresh or resume), never guessed
    # from the Run's status, on the same queue and priority.
    current = record.current
    seq = record.run.enqueue_seq + 1
    opened = DeliveryRow(
        delivery_id=key_of(record.run.run_id, seq), run_id=record.run.run_id, enqueue_seq=seq,
        state=DeliveryState.PENDING, queue=current.queue, priority=current.priority, resume=current.resume,
        publish_attempts=0, last_error=None, claimed_by=None, published_at_us=None, claimed_at_us=None,
        settled_at_us=None, created_at_us=now_us,
    )
    return _move(record, now_us, Rotated(seq), delivery=_settled(now_us), opened=opened, enqueue_seq=seq)


def _settle(status: RunStatus) -> Callable[[Any, Any, int], Applied[RunPair]]:
    def effect(record: RunPair, command: Any, now_us: int) -> Applied[RunPair]:
        done = status is RunStatus.DONE
        return _move(record, now_us, Settled(SETTLED_BY), delivery=_settled(now_us), status=status,
                     error=None if done else command.error, result_json=command.result_json if done else None)

    return effect


def _retry_lost(record: RunPair, command: Any, now_us: int) -> Applied[RunPair]:
    # The hop died with its process and its workflow declared hops safe to repeat: the
    # same Run goes on at the next sequence, in the hop's own mode (a resumed hop resumes
    # again from the same checkpoint and owner), and the retry is counted.
    current = record.current
    seq = record.run.enqueue_seq + 1
    opened = DeliveryRow(
        delivery_id=key_of(record.run.run_id, seq), run_id=record.run.run_id, enqueue_seq=seq,
        state=DeliveryState.PENDING, queue=current.queue, priority=current.priority, resume=current.resume,
        publish_attempts=0, last_error=None, claimed_by=None, published_at_us=None, claimed_at_us=None,
        settled_at_us=None, created_at_us=now_us,
    )
    return _move(record, now_us, Rotated(seq), delivery=_settled(now_us), opened=opened, status=RunStatus.QUEUED,
                 enqueue_seq=seq, hop_retries=record.run.hop_retries + 1)


def _unchanged(reply: Callable[[RunPair], Any]) -> Callable[[Any, Any, int], Applied[RunPair]]:
    return lambda record, command, now_us: Applied(record, reply(record))


EFFECTS: dict[str, Callable[[Any, Any, int], Applied[RunPair]]] = {
    "insert": _insert,
    "insert_timed": _insert_timed,
    "replay": _unchanged(lambda record: Admitted(created=False)),
    "release": lambda record, command, now_us: _move(record, now_us, delivery={"state": DeliveryState.PENDING}),
    "fail_held": lambda record, command, now_us: _move(
        record, now_us, delivery=_settled(now_us), status=RunStatus.FAILED, error=command.error
    ),
    "mark_published": lambda record, command, now_us: _move(record, now_us, delivery={
        "state": DeliveryState.PUBLISHED, "publish_attempts": record.current.publish_attempts + 1,
        "last_error": None, "published_at_us": now_us,
    }),
    "note_publish_error": lambda record, command, now_us: _move(record, now_us, delivery={
        "publish_attempts": record.current.publish_attempts + 1, "last_error": command.error,
    }),
    "claim": _claim,
    "enter_hardware_wait": lambda record, command, now_us: _move(record, now_us, status=RunStatus.AWAITING_HARDWARE),
    "leave_hardware_wait": lambda record, command, now_us: _move(record, now_us, status=RunStatus.RUNNING),
    "park_consent": _park(RunStatus.AWAITING_CONSENT),
    "park_delegate": _park(RunStatus.AWAITING_DELEGATE),
    "park_service": _park(RunStatus.AWAITING_SERVICE),
    "park_timer": _park(RunStatus.AWAITING_TIMER),
    "park_message": _park(RunStatus.AWAITING_MESSAGE),
    "resume": _resume,
    "rotate": _rotate,
    "retry_lost": _retry_lost,
    "settle_done": _settle(RunStatus.DONE),
    "settle_failed": _settle(RunStatus.FAILED),
    "begin_cancel": lambda record, command, now_us: _move(
        record, now_us, Ticket(record.run.enqueue_seq, already_cancelled=False), status=RunStatus.CANCELLING
    ),
    "ticket": _unchanged(lambda record: Ticket(record.run.enqueue_seq, already_cancelled=False)),
    "ticket_cancelled": _unchanged(lambda record: Ticket(record.run.enqueue_seq, already_cancelled=True)),
    "finish_cancel": lambda record, command, now_us: _move(
        record, now_us, Settled(CANCELLED_BY),
        delivery=_settled(now_us) if record.current.state is not DeliveryState.SETTLED else None,
        status=RunStatus.CANCELLED,
    ),
    "sweep_again": _unchanged(lambda record: Swept(CANCELLED_BY)),
    "time_out": lambda record, command, now_us: _move(
        record, now_us, TimedOut(record.run.enqueue_seq), status=RunStatus.CANCELLING, error=RUN_TIMEOUT_ERROR,
    ),
    "claim_replay": _unchanged(lambda record: Claimed(record.run.enqueue_seq, record.current.resume)),
}

TIME_GUARDS: dict[str, TimeGuard] = {
    "timer_not_due": TimeGuard("run.wake_at_us"),
    "deadline_not_due": TimeGuard("run.deadline_us"),
}
"""The guards that read the time, as data (every other guard ignores it): a decision
made ahead holds while the time stays on the same side of each one's instant."""

_UPDATED = KeptLater("run.updated_at_us")  # every change moves it, never backwards (``_later``)
_SETTLES = (_UPDATED, "deliveries.0.settled_at_us")
_OPENS = ("deliveries.1.created_at_us",)

MOVING_FIELDS: dict[str, tuple[MovingField, ...]] = {
    "insert": ("run.created_at_us", "run.updated_at_us", "deliveries.0.created_at_us"),
    "insert_timed": ("run.created_at_us", "run.updated_at_us", "run.deadline_us", "deliveries.0.created_at_us"),
    **{effect: (_UPDATED,) for effect in ("release", "note_publish_error", "enter_hardware_wait",
                                         "leave_hardware_wait", "begin_cancel", "time_out")},
    **{effect: _SETTLES for effect in ("fail_held", "park_consent", "park_delegate", "park_service", "park_timer",
                                      "settle_done", "settle_failed")},
    "park_message": _SETTLES,
    "mark_published": (_UPDATED, "deliveries.0.published_at_us"),
    "claim": (_UPDATED, SetOnce("run.started_at_us"), "deliveries.0.claimed_at_us"),
    "resume": (_UPDATED, *_OPENS),
    "rotate": (*_SETTLES, *_OPENS),
    "retry_lost": (*_SETTLES, *_OPENS),
    **{effect: () for effect in ("replay", "ticket", "ticket_cancelled", "sweep_again", "claim_replay")},
}
"""The fields each effect sets from the time (paths into the pair, see
:data:`~tenure.kernel.core.MovingField`); the others keep or set fixed values. Every
command a store decides ahead (:data:`~tenure.kernel.runs.aggregate.DECIDED_AHEAD`,
:data:`~tenure.kernel.runs.aggregate.ADMITTED_AHEAD`) is declared, and every other
effect but ``finish_cancel``, which settles the current delivery only when it is not
settled yet (its decisions ahead are made by instrumenting). The invariants read a
moving field through its bounds (INV-R1), whether it is set (INV-R5, INV-R8) and one
order (:data:`MOVING_FIELD_ORDERS`), so a decision made ahead is checked once, with its
bounds and that order at both edges of its window."""

MOVING_FIELD_ORDERS: tuple[tuple[str, str], ...] = (("run.created_at_us", "run.updated_at_us"),)
"""The one order the invariants read between times that may move with the clock (INV-R9:
time runs forward), ``first <= second`` (:attr:`~tenure.kernel.core.Machine.moving_field_orders`)."""


# --- the table ---------------------------------------------------------------------------

S = RunStep
C = RunCommandType
_ALL = tuple(step for step in RunStep if step is not S.ABSENT)
_NONTERMINAL = (S.QUEUED, S.RUNNING, S.AWAITING_HARDWARE, S.AWAITING_CONSENT, S.AWAITING_DELEGATE,
                S.AWAITING_SERVICE, S.AWAITING_TIMER, S.AWAITING_MESSAGE)
_OWNED_WAITS = (S.AWAITING_CONSENT, S.AWAITING_DELEGATE, S.AWAITING_SERVICE, S.AWAITING_MESSAGE)
_WAITS = (*_OWNED_WAITS, S.AWAITING_TIMER)
_HOPS = (S.RUNNING, S.AWAITING_HARDWARE)
_FINISHED = (S.DONE, S.FAILED)
_TERMINAL = (S.DONE, S.FAILED, S.CANCELLED)
_NOT_QUEUED = tuple(step for step in _ALL if step is not S.QUEUED)
_NOT_RUNNING = tuple(step for step in _ALL if step is not S.RUNNING)
_NOT_HOPS = tuple(step for step in _ALL if step not in _HOPS)

ROWS: tuple[Row, ...] = (
    # One row per spec row of specs/runs.md, in its order: (from, command, guard, to,
    # effect or refusal). SAME is the spec's "same". The first row of a (state, command)
    # pair whose guard holds decides.
    Row((S.ABSENT,), C.ADMIT, "session_busy", SAME, R.SESSION_BUSY),
    Row((S.ABSENT,), C.ADMIT, "timeout_invalid", SAME, R.TIMEOUT_INVALID),
    Row((S.ABSENT,), C.ADMIT, "timed", S.QUEUED, "insert_timed"),
    Row((S.ABSENT,), C.ADMIT, "always", S.QUEUED, "insert"),
    Row(_ALL, C.ADMIT, "other_key", SAME, R.KEY_REUSED),
    Row(_ALL, C.ADMIT, "intent_differs", SAME, R.INTENT_CHANGED),
    Row(_ALL, C.ADMIT, "timeout_differs", SAME, R.TIMEOUT_CHANGED),
    Row(_ALL, C.ADMIT, "held_without_hold", SAME, R.ADMISSION_HELD),
    Row(_ALL, C.ADMIT, "always", SAME, "replay"),

    Row((S.ABSENT,), C.RELEASE, "always", SAME, R.NOT_FOUND),
    Row((S.QUEUED,), C.RELEASE, "seq_differs", SAME, R.STALE_HOP),
    Row((S.QUEUED,), C.RELEASE, "not_held", SAME, R.NOT_HELD),
    Row((S.QUEUED,), C.RELEASE, "always", SAME, "release"),
    Row(_NOT_QUEUED, C.RELEASE, "always", SAME, R.NOT_QUEUED),

    Row((S.ABSENT,), C.FAIL_HELD, "always", SAME, R.NOT_FOUND),
    Row((S.QUEUED,), C.FAIL_HELD, "seq_differs", SAME, R.STALE_HOP),
    Row((S.QUEUED,), C.FAIL_HELD, "not_held", SAME, R.NOT_HELD),
    Row((S.QUEUED,), C.FAIL_HELD, "always", S.FAILED, "fail_held"),
    Row(_NOT_QUEUED, C.FAIL_HELD, "always", SAME, R.NOT_QUEUED),

    Row((S.ABSENT,), C.RECORD_PUBLISHED, "always", SAME, R.NOT_FOUND),
    Row((S.QUEUED,), C.RECORD_PUBLISHED, "seq_differs", SAME, R.STALE_HOP),
    Row((S.QUEUED,), C.RECORD_PUBLISHED, "unpublishable", SAME, R.NOT_PUBLISHABLE),
    Row((S.QUEUED,), C.RECORD_PUBLISHED, "always", SAME, "mark_published"),
    Row(_NOT_QUEUED, C.RECORD_PUBLISHED, "always", SAME, R.NOT_QUEUED),

    Row((S.ABSENT,), C.RECORD_PUBLISH_ERROR, "always", SAME, R.NOT_FOUND),
    Row((S.QUEUED,), C.RECORD_PUBLISH_ERROR, "seq_differs", SAME, R.STALE_HOP),
    Row((S.QUEUED,), C.RECORD_PUBLISH_ERROR, "unpublishable", SAME, R.NOT_PUBLISHABLE),
    Row((S.QUEUED,), C.RECORD_PUBLISH_ERROR, "always", SAME, "note_publish_error"),
    Row(_NOT_QUEUED, C.RECORD_PUBLISH_ERROR, "always", SAME, R.NOT_QUEUED),

    Row((S.ABSENT,), C.CLAIM, "always", SAME, R.NOT_FOUND),
    Row((S.QUEUED,), C.CLAIM, "seq_differs", SAME, R.STALE_HOP),
    Row((S.QUEUED,), C.CLAIM, "unpublishable", SAME, R.NOT_PUBLISHABLE),
    Row((S.QUEUED,), C.CLAIM, "not_served", SAME, R.NOT_SERVED),
    Row((S.QUEUED,), C.CLAIM, "always", S.RUNNING, "claim"),
    Row((S.RUNNING,), C.CLAIM, "claimed_by_claimant", SAME, "claim_replay"),
    Row(_NOT_QUEUED, C.CLAIM, "always", SAME, R.NOT_QUEUED),

    Row((S.ABSENT,), C.ENTER_HARDWARE_WAIT, "always", SAME, R.NOT_FOUND),
    Row((S.RUNNING,), C.ENTER_HARDWARE_WAIT, "seq_differs", SAME, R.STALE_HOP),
    Row((S.RUNNING,), C.ENTER_HARDWARE_WAIT, "always", S.AWAITING_HARDWARE, "enter_hardware_wait"),
    Row(_NOT_RUNNING, C.ENTER_HARDWARE_WAIT, "always", SAME, R.NOT_RUNNING),

    Row((S.ABSENT,), C.LEAVE_HARDWARE_WAIT, "always", SAME, R.NOT_FOUND),
    Row((S.AWAITING_HARDWARE,), C.LEAVE_HARDWARE_WAIT, "seq_differs", SAME, R.STALE_HOP),
    Row((S.AWAITING_HARDWARE,), C.LEAVE_HARDWARE_WAIT, "always", S.RUNNING, "leave_hardware_wait"),
    Row(tuple(step for step in _ALL if step is not S.AWAITING_HARDWARE), C.LEAVE_HARDWARE_WAIT, "always", SAME,
        R.NOT_IN_HARDWARE_WAIT),

    Row((S.ABSENT,), C.PARK, "always", SAME, R.NOT_FOUND),
    Row(_HOPS, C.PARK, "seq_differs", SAME, R.STALE_HOP),
    Row(_HOPS, C.PARK, "owner_foreign", SAME, R.OWNER_MISMATCH),
    Row(_HOPS, C.PARK, "wake_invalid", SAME, R.WAKE_INVALID),
    Row(_HOPS, C.PARK, "waits_for_consent", S.AWAITING_CONSENT, "park_consent"),
    Row(_HOPS, C.PARK, "waits_for_delegate", S.AWAITING_DELEGATE, "park_delegate"),
    Row(_HOPS, C.PARK, "waits_for_service", S.AWAITING_SERVICE, "park_service"),
    Row(_HOPS, C.PARK, "waits_for_timer", S.AWAITING_TIMER, "park_timer"),
    Row(_HOPS, C.PARK, "waits_for_message", S.AWAITING_MESSAGE, "park_message"),
    Row(_HOPS, C.PARK, "always", SAME, R.NOT_AN_OWNER_KIND),
    Row(_NOT_HOPS, C.PARK, "always", SAME, R.NOT_RUNNING),

    Row((S.ABSENT,), C.RESUME, "always", SAME, R.NOT_FOUND),
    Row(_WAITS, C.RESUME, "not_current_owner", SAME, R.NOT_CURRENT_OWNER),
    Row(_OWNED_WAITS, C.RESUME, "owner_unresolved", SAME, R.OWNER_UNDECIDED),
    Row((S.AWAITING_TIMER,), C.RESUME, "timer_not_due", SAME, R.TIMER_NOT_DUE),
    Row(_WAITS, C.RESUME, "always", S.QUEUED, "resume"),
    Row((S.QUEUED, S.RUNNING, S.AWAITING_HARDWARE, S.CANCELLING, *_TERMINAL), C.RESUME, "always", SAME,
        R.NOT_WAITING),

    Row((S.ABSENT,), C.SETTLE, "always", SAME, R.NOT_FOUND),
    Row(_HOPS, C.SETTLE, "seq_differs", SAME, R.STALE_HOP),
    Row(_HOPS, C.SETTLE, "containment_unproven", SAME, R.CONTAINMENT_UNPROVEN),
    Row(_HOPS, C.SETTLE, "settles_done", S.DONE, "settle_done"),
    Row(_HOPS, C.SETTLE, "always", S.FAILED, "settle_failed"),
    Row((S.CANCELLING,), C.SETTLE, "always", SAME, R.CANCELLING),
    Row((S.QUEUED, *_WAITS, *_TERMINAL), C.SETTLE, "always", SAME, R.NOT_RUNNING),

    Row((S.ABSENT,), C.BEGIN_CANCEL, "always", SAME, R.NOT_FOUND),
    Row(_NONTERMINAL, C.BEGIN_CANCEL, "always", S.CANCELLING, "begin_cancel"),
    Row((S.CANCELLING,), C.BEGIN_CANCEL, "always", SAME, "ticket"),
    Row((S.CANCELLED,), C.BEGIN_CANCEL, "always", SAME, "ticket_cancelled"),
    Row(_FINISHED, C.BEGIN_CANCEL, "always", SAME, R.FINISHED),

    Row((S.ABSENT,), C.FINISH_CANCEL, "always", SAME, R.NOT_FOUND),
    Row((S.CANCELLING,), C.FINISH_CANCEL, "seq_differs", SAME, R.STALE_HOP),
    Row((S.CANCELLING,), C.FINISH_CANCEL, "hop_live", SAME, R.HOP_LIVE),
    Row((S.CANCELLING,), C.FINISH_CANCEL, "containment_unproven", SAME, R.CONTAINMENT_UNPROVEN),
    Row((S.CANCELLING,), C.FINISH_CANCEL, "always", S.CANCELLED, "finish_cancel"),
    Row((S.CANCELLED,), C.FINISH_CANCEL, "always", SAME, "sweep_again"),
    Row((*_NONTERMINAL, *_FINISHED), C.FINISH_CANCEL, "always", SAME, R.NOT_CANCELLING),

    Row((S.ABSENT,), C.ROTATE, "always", SAME, R.NOT_FOUND),
    Row((S.QUEUED,), C.ROTATE, "seq_differs", SAME, R.STALE_HOP),
    Row((S.QUEUED,), C.ROTATE, "unpublishable", SAME, R.NOT_PUBLISHABLE),
    Row((S.QUEUED,), C.ROTATE, "hop_unfinished", SAME, R.HOP_UNFINISHED),
    Row((S.QUEUED,), C.ROTATE, "always", SAME, "rotate"),
    Row(_NOT_QUEUED, C.ROTATE, "always", SAME, R.NOT_QUEUED),

    Row((S.ABSENT,), C.RETRY_LOST, "always", SAME, R.NOT_FOUND),
    Row(_HOPS, C.RETRY_LOST, "seq_differs", SAME, R.STALE_HOP),
    Row(_HOPS, C.RETRY_LOST, "hop_live", SAME, R.HOP_LIVE),
    Row(_HOPS, C.RETRY_LOST, "attempts_open", SAME, R.CONTAINMENT_UNPROVEN),
    Row(_HOPS, C.RETRY_LOST, "no_retries_left", SAME, R.NO_RETRIES_LEFT),
    Row(_HOPS, C.RETRY_LOST, "always", S.QUEUED, "retry_lost"),
    Row(_NOT_HOPS, C.RETRY_LOST, "always", SAME, R.NOT_RUNNING),

    Row((S.ABSENT,), C.TIME_OUT, "always", SAME, R.NOT_FOUND),
    Row((*_NONTERMINAL, S.CANCELLING), C.TIME_OUT, "no_deadline", SAME, R.NO_DEADLINE),
    Row((*_NONTERMINAL, S.CANCELLING), C.TIME_OUT, "deadline_not_due", SAME, R.DEADLINE_NOT_DUE),
    Row(_NONTERMINAL, C.TIME_OUT, "always", S.CANCELLING, "time_out"),
    Row((S.CANCELLING,), C.TIME_OUT, "always", SAME, "ticket"),
    Row(_TERMINAL, C.TIME_OUT, "always", SAME, R.FINISHED),
)


# --- transition rules (checked by the contracts and by the tests) -----------------------

_IDENTITY_FIELDS = (
    "run_id", "session_id", "source", "principal", "scopes", "payload_json", "requested_priority",
    "intent_digest", "idempotency_key", "queue", "priority", "workflow_name", "workflow_revision",
    "workflow_digest", "created_at_us", "admitted_node", "max_hop_retries", "retry_of", "deadline_us",
)
_DELIVERY_RANK = {
    DeliveryState.HELD: 0, DeliveryState.PENDING: 1, DeliveryState.PUBLISHED: 2, DeliveryState.CLAIMED: 3,
    DeliveryState.SETTLED: 4,
}


def _contained(command: Any) -> bool:
    # Written independently of the guards on purpose: a rule must not trust the code it checks.
    containment = getattr(command, "containment", None)
    return containment is not None and containment.open_jobs == 0 and containment.open_attempts == 0


def _attempts_ended(command: Any) -> bool:
    containment = getattr(command, "containment", None)
    return containment is not None and containment.open_attempts == 0


def _admission_rules(new: RunPair, command: Any, now_us: int) -> list[str]:
    broken = []
    if new.run.status is not RunStatus.QUEUED or new.run.enqueue_seq != 0 or len(new.deliveries) != 1:
        broken.append("TR-R1")  # admission creates a QUEUED Run with delivery 0 only
    timeout = getattr(command, "timeout_us", None)
    if new.run.deadline_us != (None if timeout is None else now_us + timeout):
        broken.append("TR-R11")  # the deadline is the admission's database time plus its timeout
    if new.current.state is not (DeliveryState.HELD if command.hold else DeliveryState.PENDING):
        broken.append("TR-R1")
    if command.session_busy:
        broken.append("TR-R8")  # the session fence holds
    return broken


def _wait_ended_by_its_owner(record: RunPair, command: Any, now_us: int) -> bool:
    # Written independently of the guards: an owner row of the Run's exact owner, decided
    # and complete; or, for a timer, the database clock at or past its due time.
    run = record.run
    if command.kind is not RunCommandType.RESUME or command.owner_id != run.owner_id:
        return False
    if run.status is RunStatus.AWAITING_TIMER:
        return run.wake_at_us is not None and now_us >= run.wake_at_us
    return command.owner is not None and command.owner.owner_id == run.owner_id and command.owner.complete


def _status_rules(record: RunPair, new: RunPair, command: Any, now_us: int) -> list[str]:
    kind = command.kind
    old_status, new_status = record.run.status, new.run.status
    if old_status is new_status:
        return []
    broken = []
    if old_status in TERMINAL_RUN_STATUSES:
        broken.append("TR-R3")  # terminal truth is absorbing
    if new_status is RunStatus.QUEUED and old_status is not RunStatus.QUEUED and not (
        (kind is RunCommandType.RESUME and old_status in WAIT_STATUSES)
        or (kind is RunCommandType.RETRY_LOST and old_status in (RunStatus.RUNNING, RunStatus.AWAITING_HARDWARE))
    ):
        broken.append("TR-R10")  # a Run queues again only by a resume or a retry of a lost hop
    if new_status is RunStatus.RUNNING and not (
        (kind is RunCommandType.CLAIM and old_status is RunStatus.QUEUED)
        or (kind is RunCommandType.LEAVE_HARDWARE_WAIT and old_status is RunStatus.AWAITING_HARDWARE)
    ):
        broken.append("TR-R4")  # only a claim of the exact hop starts it running
    if old_status in WAIT_STATUSES and not (
        (new_status is RunStatus.QUEUED and _wait_ended_by_its_owner(record, command, now_us))
        or (kind in (RunCommandType.BEGIN_CANCEL, RunCommandType.TIME_OUT) and new_status is RunStatus.CANCELLING)
    ):
        broken.append("TR-R6")  # a wait ends only by its exact, decided owner (a timer: when due), or a cancellation
    if new_status is RunStatus.CANCELLED and not (
        kind is RunCommandType.FINISH_CANCEL and old_status is RunStatus.CANCELLING and _contained(command)
        and command.hop is not None and command.hop not in _LIVE_HOP
    ):
        broken.append("TR-R7")  # CANCELLED only with the hop fenced and every effect contained
    if new.run.result_json is not None and new.run.result_json != record.run.result_json and not (
        kind is RunCommandType.SETTLE and new_status is RunStatus.DONE
    ):
        broken.append("TR-R7")  # a result is kept only by the settlement that makes the Run DONE
    if new_status in (RunStatus.DONE, RunStatus.FAILED) and not (
        (kind is RunCommandType.SETTLE and old_status in (RunStatus.RUNNING, RunStatus.AWAITING_HARDWARE)
         and _contained(command))
        or (kind is RunCommandType.FAIL_HELD and record.current.state is DeliveryState.HELD)
    ):
        broken.append("TR-R7")  # terminal implies contained; never over CANCELLING
    return broken


def transition_violations(record: RunPair | None, command: RunCommand, now_us: int, decision: Decision) -> list[str]:
    """The transition rules (TR-R1 ... TR-R11 in specs/runs.md) a decision breaks."""
    if isinstance(decision, Refused):
        return []
    new = decision.new_record
    if record is None:
        return ["TR-R1"] if new is None else _admission_rules(new, command, now_us)
    if new is None:
        return ["TR-R1"]  # Runs are never deleted
    broken = []
    if any(getattr(new.run, name) != getattr(record.run, name) for name in _IDENTITY_FIELDS):
        broken.append("TR-R1")  # a Run's identity, intent and route never change
    grew = new.run.enqueue_seq - record.run.enqueue_seq
    if grew not in (0, 1) or (grew == 1 and command.kind not in (
            RunCommandType.RESUME, RunCommandType.ROTATE, RunCommandType.RETRY_LOST)):
        broken.append("TR-R2")  # a new hop only by a resume, a rotation or a retry, one at a time
    retried = new.run.hop_retries - record.run.hop_retries
    if retried not in (0, 1) or (retried == 1) != (command.kind is RunCommandType.RETRY_LOST and grew == 1):
        broken.append("TR-R10")  # a retry is counted exactly when a lost hop is retried
    if command.kind is RunCommandType.RETRY_LOST and grew == 1 and not (
        record.run.status in (RunStatus.RUNNING, RunStatus.AWAITING_HARDWARE) and _attempts_ended(command)
        and getattr(command, "hop", None) is not None and getattr(command, "hop", None) not in _LIVE_HOP
        and record.run.hop_retries < record.run.max_hop_retries
        and new.current.resume == record.current.resume and new.current.state is DeliveryState.PENDING
    ):
        broken.append("TR-R10")  # only a fenced hop whose attempts ended, with a retry left, in its own mode
    if command.kind is RunCommandType.ROTATE and grew == 1 and not (
        new.current.resume == record.current.resume and new.current.state is DeliveryState.PENDING
        and new.run.status is RunStatus.QUEUED and getattr(command, "hop", None) in (
            BrokerJobState.COMPLETE, BrokerJobState.FAILED, BrokerJobState.ABORTED)
    ):
        broken.append("TR-R9")  # a rotation keeps the hop's mode, only after the broker finished it
    if new.run.wake_at_us != record.run.wake_at_us and not (
        (command.kind is RunCommandType.PARK and new.run.status is RunStatus.AWAITING_TIMER
         and new.run.wake_at_us == getattr(command, "wake_at_us", None))
        or (command.kind is RunCommandType.RESUME and new.run.wake_at_us is None)
    ):
        broken.append("TR-R6")  # a due time is set by a timer's park, cleared by its resume, never moved
    if record.run.started_at_us is not None and new.run.started_at_us != record.run.started_at_us:
        broken.append("TR-R5")  # the first start is kept across hops
    old_current = record.current
    kept = new.deliveries[0] if new.deliveries[0].enqueue_seq == old_current.enqueue_seq else None
    if kept is None or _DELIVERY_RANK[kept.state] < _DELIVERY_RANK[old_current.state]:
        broken.append("TR-R2")  # a delivery never moves backwards
    if kept is not None and kept.state is DeliveryState.CLAIMED and old_current.state is not DeliveryState.CLAIMED \
            and command.kind is not RunCommandType.CLAIM:
        broken.append("TR-R4")
    broken += _status_rules(record, new, command, now_us)
    broken += _timeout_rules(record, new, command, now_us)
    return broken


_CANCELLED_STATUSES = (RunStatus.CANCELLING, RunStatus.CANCELLED)


def _timeout_rules(record: RunPair, new: RunPair, command: Any, now_us: int) -> list[str]:
    """TR-R11: a Run is cancelled for its deadline only by ``time_out`` at or after it, with
    the reason ``timeout``; an operator's cancel records none; a reason never changes."""
    old, run = record.run, new.run
    if run.status is RunStatus.CANCELLING and old.status is not RunStatus.CANCELLING:
        due = old.deadline_us is not None and now_us >= old.deadline_us
        if not ((command.kind is RunCommandType.BEGIN_CANCEL and run.error == old.error)
                or (command.kind is RunCommandType.TIME_OUT and due and run.error == RUN_TIMEOUT_ERROR)):
            return ["TR-R11"]
    if old.status in _CANCELLED_STATUSES and run.error != old.error:
        return ["TR-R11"]
    return []


RUNS = Machine.define(
    name="runs",
    states=RunStep,
    commands=RunCommandType,
    rows=ROWS,
    guards=GUARDS,
    effects=EFFECTS,
    outcomes=OUTCOMES,
    state_of=step_of,
    record_violations=record_violations,
    transition_violations=transition_violations,
    initial=RunStep.ABSENT,
    time_guards=TIME_GUARDS,
    moving_fields=MOVING_FIELDS,
    invariants_see_moving_fields_by_bounds=True,
    moving_field_orders=MOVING_FIELD_ORDERS,
)
"""The Run machine: ``RUNS.decide(pair, command, now_us)``."""
