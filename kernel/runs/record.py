"""The Run record: one Run row and its deliveries, as the pair every Run command meets.

A :class:`RunPair` is the Run and its current delivery (the one at the Run's
``enqueue_seq``). A decision that opens the next hop (a resume) returns the pair with
two deliveries: the current one, now settled, and the new one after it; the ledger
writes both and the next command meets only the new one. Instants are integer
microseconds on the database clock.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Protocol

from tenure.model import (
    TERMINAL_RUN_STATUSES,
    WAIT_STATUSES,
    DeliveryState,
    RunStatus,
    WaitKind,
    bounds,
)
from tenure.model.runs import (
    MAX_ERROR_CHARS,
    MAX_HOP_RETRIES,
    MAX_QUEUE_CHARS,
    MAX_RUN_TEXT_CHARS,
    MAX_SCOPES,
    RUN_TIMEOUT_ERROR,
)

from ..core import replaced


__all__ = [
    "RunRow",
    "DeliveryRow",
    "RunPair",
    "RunStep",
    "step_of",
    "replace_run",
    "replace_delivery",
    "record_violations",
    "key_of",
    "WAIT_FOR_KIND",
    "HOP_STATUSES",
    "operator_cancelled",
    "RunState",
    "hop_holds",
    "opens_owners",
    "is_terminal",
    "cancel_frozen_at",
]


class RunStep(enum.Enum):
    """The state a Run command meets: the Run's status, or ``absent`` before admission."""

    ABSENT = "absent"
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_HARDWARE = "awaiting_hardware"
    AWAITING_CONSENT = "awaiting_consent"
    AWAITING_DELEGATE = "awaiting_delegate"
    AWAITING_SERVICE = "awaiting_service"
    AWAITING_TIMER = "awaiting_timer"
    AWAITING_MESSAGE = "awaiting_message"
    CANCELLING = "cancelling"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


WAIT_FOR_KIND = {
    WaitKind.CONSENT: RunStatus.AWAITING_CONSENT,
    WaitKind.DELEGATE: RunStatus.AWAITING_DELEGATE,
    WaitKind.SERVICE: RunStatus.AWAITING_SERVICE,
    WaitKind.TIMER: RunStatus.AWAITING_TIMER,
    WaitKind.MESSAGE: RunStatus.AWAITING_MESSAGE,
}
"""The wait status each owner kind parks a Run in."""

HOP_STATUSES = frozenset({RunStatus.RUNNING, RunStatus.AWAITING_HARDWARE})
"""Statuses in which a claimed hop is executing (its delivery stays CLAIMED)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunRow:
    """One Run. Identity (fixed at admission): the intent's fields (``scopes`` sorted,
    ``payload_json`` canonical), ``intent_digest`` (what a replay compares),
    ``idempotency_key``, the route (``queue``, doctrine ``priority``) and the workflow pin.
    ``enqueue_seq`` names the current hop; ``node`` the node of the latest claim;
    ``owner_kind``/``owner_id`` the owner of the current (or last) wait;
    ``admitted_node`` the node that admitted it (recovery fails only its own node's
    unreleased HELD admissions; None: every node's, as in one process). ``result_json``
    is a DONE Run's result (canonical JSON, or None); ``max_hop_retries`` how many times
    recovery may run a lost hop again instead of failing the Run (admitted with its
    workflow's policy; 0: never), ``hop_retries`` how many times it did; ``retry_of``
    the Run (failed ``lost``) an operator re-admitted this one for; ``wake_at_us`` the
    due time of a timer wait (the timer's owner is the database clock), kept with the
    timer as its owner is. ``deadline_us`` is when the Run times out: set once, at
    admission, to the database time plus the admitted timeout (None: no deadline), and
    never changed (part of its identity); a Run cancelled because it passed keeps the
    reason ``timeout`` as its ``error``."""

    run_id: str
    status: RunStatus
    session_id: str | None
    source: str
    principal: str
    scopes: tuple[str, ...]
    payload_json: str
    requested_priority: int | None
    intent_digest: str
    idempotency_key: str | None
    queue: str
    priority: int
    workflow_name: str
    workflow_revision: str
    workflow_digest: str
    enqueue_seq: int
    started_at_us: int | None
    node: str | None
    owner_kind: WaitKind | None
    owner_id: str | None
    error: str | None
    created_at_us: int
    updated_at_us: int
    admitted_node: str | None = None
    result_json: str | None = None
    max_hop_retries: int = 0
    hop_retries: int = 0
    retry_of: str | None = None
    wake_at_us: int | None = None
    deadline_us: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryRow:
    """One hop's delivery; ``delivery_id`` is its hop key ``run:<run_id>:<seq>``."""

    delivery_id: str
    run_id: str
    enqueue_seq: int
    state: DeliveryState
    queue: str
    priority: int
    resume: bool
    publish_attempts: int
    last_error: str | None
    claimed_by: str | None
    published_at_us: int | None
    claimed_at_us: int | None
    settled_at_us: int | None
    created_at_us: int


@dataclasses.dataclass(frozen=True, slots=True)
class RunPair:
    """A Run and its deliveries from the current one on (one when stored; two when a
    decision opened the next hop)."""

    run: RunRow
    deliveries: tuple[DeliveryRow, ...]

    @property
    def current(self) -> DeliveryRow:
        return self.deliveries[-1]


def key_of(run_id: str, enqueue_seq: int) -> str:
    """A delivery's key (the hop key, spelled here without the model's checks)."""
    return f"run:{run_id}:{enqueue_seq}"


_STEP_OF_STATUS = {status: RunStep(status.value) for status in RunStatus}


def step_of(record: RunPair | None) -> RunStep:
    """The table key for a pair: its Run's status, or ABSENT."""
    if record is None:
        return RunStep.ABSENT
    return _STEP_OF_STATUS[record.run.status]


def replace_run(record: RunRow, **changes: object) -> RunRow:
    """``dataclasses.replace`` for the decision's hot path (see :func:`tenure.kernel.core.replaced`,
    as the queue's ``replace_fields``); a field the row does not have is a programmer's error."""
    assert changes.keys() <= _RUN_FIELDS, sorted(changes.keys() - _RUN_FIELDS)
    return replaced(record, changes)


def replace_delivery(record: DeliveryRow, **changes: object) -> DeliveryRow:
    """:func:`replace_run` for a delivery."""
    assert changes.keys() <= _DELIVERY_FIELDS, sorted(changes.keys() - _DELIVERY_FIELDS)
    return replaced(record, changes)


_RUN_FIELDS = frozenset(field.name for field in dataclasses.fields(RunRow))
_DELIVERY_FIELDS = frozenset(field.name for field in dataclasses.fields(DeliveryRow))


# --- invariants ------------------------------------------------------------------------

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _text(value: object, max_chars: int = MAX_RUN_TEXT_CHARS) -> bool:
    return bounds.is_bounded_text(value, max_chars)


def _optional_text(value: object, max_chars: int = MAX_RUN_TEXT_CHARS) -> bool:
    return value is None or _text(value, max_chars)


_instant = bounds.is_instant


def _optional_instant(value: object) -> bool:
    return value is None or _instant(value)


def _priority(value: object) -> bool:
    return bounds.is_strict_int(value) and 0 <= value <= 100  # type: ignore[operator]


def _seq(value: object) -> bool:
    return bounds.is_strict_int(value) and 0 <= value <= bounds.INT32_MAX  # type: ignore[operator]


def _run_types(run: RunRow) -> list[str]:
    checks = {
        "run_id": _text(run.run_id, 36),
        "status": type(run.status) is RunStatus,
        "session_id": _optional_text(run.session_id),
        "source": _text(run.source, 64),
        "principal": _text(run.principal, bounds.MAX_IDENTITY_CHARS),
        "scopes": type(run.scopes) is tuple and len(run.scopes) <= MAX_SCOPES
        and all(_text(scope) for scope in run.scopes) and list(run.scopes) == sorted(set(run.scopes)),
        "payload_json": type(run.payload_json) is str,
        "requested_priority": run.requested_priority is None or _priority(run.requested_priority),
        "intent_digest": type(run.intent_digest) is str and _DIGEST.fullmatch(run.intent_digest) is not None,
        "idempotency_key": _optional_text(run.idempotency_key, bounds.MAX_IDENTITY_CHARS),
        "queue": _text(run.queue, MAX_QUEUE_CHARS),
        "priority": _priority(run.priority),
        "workflow": _text(run.workflow_name, 100) and _text(run.workflow_revision, 64)
        and _text(run.workflow_digest, bounds.MAX_IDENTITY_CHARS),
        "enqueue_seq": _seq(run.enqueue_seq),
        "started_at_us": _optional_instant(run.started_at_us),
        "node": _optional_text(run.node),
        "admitted_node": _optional_text(run.admitted_node),
        "owner": (run.owner_kind is None or type(run.owner_kind) is WaitKind) and _optional_text(run.owner_id)
        and (run.owner_kind is None) == (run.owner_id is None),
        "error": _optional_text(run.error, MAX_ERROR_CHARS),
        "created_at_us": _instant(run.created_at_us),
        "updated_at_us": _instant(run.updated_at_us),
        "result_json": run.result_json is None or type(run.result_json) is str,
        "hop_retries": bounds.is_strict_int(run.max_hop_retries) and bounds.is_strict_int(run.hop_retries)
        and 0 <= run.hop_retries <= run.max_hop_retries <= MAX_HOP_RETRIES,
        "retry_of": _optional_text(run.retry_of, 36),
        "wake_at_us": _optional_instant(run.wake_at_us),
        "deadline_us": _optional_instant(run.deadline_us),
    }
    return [f"INV-R1.run.{name}" for name, ok in checks.items() if not ok]


def _delivery_types(delivery: DeliveryRow) -> list[str]:
    checks = {
        "delivery_id": type(delivery.delivery_id) is str,
        "run_id": _text(delivery.run_id, 36),
        "enqueue_seq": _seq(delivery.enqueue_seq),
        "state": type(delivery.state) is DeliveryState,
        "queue": _text(delivery.queue, MAX_QUEUE_CHARS),
        "priority": _priority(delivery.priority),
        "resume": type(delivery.resume) is bool,
        "publish_attempts": bounds.is_strict_int(delivery.publish_attempts)
        and 0 <= delivery.publish_attempts <= bounds.INT32_MAX,
        "last_error": _optional_text(delivery.last_error, MAX_ERROR_CHARS),
        "claimed_by": _optional_text(delivery.claimed_by),
        "instants": _optional_instant(delivery.published_at_us) and _optional_instant(delivery.claimed_at_us)
        and _optional_instant(delivery.settled_at_us) and _instant(delivery.created_at_us),
    }
    return [f"INV-R1.delivery.{name}" for name, ok in checks.items() if not ok]


_DELIVERY_FOR_STATUS: dict[RunStatus, frozenset[DeliveryState]] = {
    RunStatus.QUEUED: frozenset({DeliveryState.HELD, DeliveryState.PENDING, DeliveryState.PUBLISHED}),
    RunStatus.RUNNING: frozenset({DeliveryState.CLAIMED}),
    RunStatus.AWAITING_HARDWARE: frozenset({DeliveryState.CLAIMED}),
    RunStatus.AWAITING_CONSENT: frozenset({DeliveryState.SETTLED}),
    RunStatus.AWAITING_DELEGATE: frozenset({DeliveryState.SETTLED}),
    RunStatus.AWAITING_SERVICE: frozenset({DeliveryState.SETTLED}),
    RunStatus.AWAITING_TIMER: frozenset({DeliveryState.SETTLED}),
    RunStatus.AWAITING_MESSAGE: frozenset({DeliveryState.SETTLED}),
    RunStatus.CANCELLING: frozenset(DeliveryState),
    RunStatus.DONE: frozenset({DeliveryState.SETTLED}),
    RunStatus.FAILED: frozenset({DeliveryState.SETTLED}),
    RunStatus.CANCELLED: frozenset({DeliveryState.SETTLED}),
}
"""INV-R3: the current delivery's states each Run status allows."""


def _delivery_rules(delivery: DeliveryRow) -> dict[str, bool]:
    state = delivery.state
    return {
        # INV-R7: a delivery's key is its hop key; the first hop is fresh.
        "INV-R7": delivery.delivery_id == key_of(delivery.run_id, delivery.enqueue_seq)
        and (delivery.enqueue_seq > 0 or delivery.resume is False),
        # INV-R8: each state's evidence is recorded: a published delivery has its time;
        # a claimed one its node and time; a settled one its time.
        "INV-R8": (state is not DeliveryState.PUBLISHED or delivery.published_at_us is not None)
        and (state is not DeliveryState.CLAIMED or (delivery.claimed_by is not None
                                                    and delivery.claimed_at_us is not None))
        and (state is not DeliveryState.SETTLED) == (delivery.settled_at_us is None)
        and (delivery.claimed_by is None) == (delivery.claimed_at_us is None),
    }


def record_violations(record: RunPair) -> list[str]:
    """The invariants (``INV-R1`` ... ``INV-R9`` in specs/runs.md) this pair breaks."""
    if type(record) is not RunPair or type(record.deliveries) is not tuple or not 1 <= len(record.deliveries) <= 2:
        return ["INV-R2"]
    run = record.run
    broken = _run_types(run)
    for delivery in record.deliveries:
        broken += _delivery_types(delivery)
    if broken:
        return broken
    current = record.current
    status = run.status
    rules = {
        # INV-R2: the deliveries belong to this Run, end at its sequence, follow one
        # another, and only the last may be unsettled (at most one unsettled per Run).
        "INV-R2": all(delivery.run_id == run.run_id for delivery in record.deliveries)
        and current.enqueue_seq == run.enqueue_seq
        and all(earlier.enqueue_seq + 1 == later.enqueue_seq and earlier.state is DeliveryState.SETTLED
                for earlier, later in zip(record.deliveries, record.deliveries[1:])),
        # INV-R3: the Run's status and its current delivery's state agree.
        "INV-R3": current.state in _DELIVERY_FOR_STATUS[status],
        # INV-R4: a wait has an owner of its kind; a queued or executing Run has none;
        # exactly a timer owner carries a due time.
        "INV-R4": (status not in WAIT_STATUSES or (run.owner_kind is not None
                                                   and WAIT_FOR_KIND.get(run.owner_kind) is status))
        and (status not in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.AWAITING_HARDWARE)
             or run.owner_kind is None)
        and (run.wake_at_us is not None) == (run.owner_kind is WaitKind.TIMER),
        # INV-R5: a Run that ever ran records its first start and the node of its latest
        # claim; a resumed hop exists only after a first claim (a rotated fresh hop may
        # follow hops nobody claimed).
        "INV-R5": (status not in (HOP_STATUSES | WAIT_STATUSES) or (run.started_at_us is not None
                                                                    and run.node is not None))
        and (not current.resume or run.started_at_us is not None)
        and (run.started_at_us is None) == (run.node is None),
        # INV-R6: a failed Run says why; a done one carries no error; only a done one
        # carries a result.
        "INV-R6": (status is not RunStatus.FAILED or run.error is not None)
        and (status is not RunStatus.DONE or run.error is None)
        and (status is RunStatus.DONE or run.result_json is None),
        # INV-R9: the deliveries carry the Run's route; time runs forward.
        "INV-R9": all(delivery.queue == run.queue and delivery.priority == run.priority
                      for delivery in record.deliveries)
        and run.created_at_us <= run.updated_at_us
        and (run.requested_priority is None or run.requested_priority == run.priority),
        # INV-R10: a cancellation's reason is none (an operator's) or the deadline's,
        # and only a Run with a deadline times out.
        "INV-R10": status not in (RunStatus.CANCELLING, RunStatus.CANCELLED) or run.error is None
        or (run.error == RUN_TIMEOUT_ERROR and run.deadline_us is not None),
    }
    for delivery in record.deliveries:
        for name, ok in _delivery_rules(delivery).items():
            rules[name] = rules.get(name, True) and ok
    if status in TERMINAL_RUN_STATUSES and current.state is not DeliveryState.SETTLED:
        rules["INV-R3"] = False
    return [name for name, ok in rules.items() if not ok]


# --- What a Run's row, as read, allows: the rules adapters ask instead of comparing states. ---


class RunState(Protocol):
    """What the rules below read of a Run: its stored row or its public record."""

    @property
    def status(self) -> RunStatus: ...

    @property
    def enqueue_seq(self) -> int: ...


def hop_holds(run: RunState, enqueue_seq: int) -> bool:
    """Whether the hop ``enqueue_seq`` holds its Run: RUNNING or AWAITING_HARDWARE at that
    sequence. A checkpoint, a step's result and a finished hop's outcome are written only
    then, and a hop that no longer holds its Run stops."""
    return run.status in HOP_STATUSES and run.enqueue_seq == enqueue_seq


def operator_cancelled(run: RunState) -> bool:
    """Whether an operator's cancel took the Run (CANCELLING or CANCELLED): a hop that
    stops because of it was cancelled, not lost."""
    return run.status in (RunStatus.CANCELLING, RunStatus.CANCELLED)


def opens_owners(run: RunState) -> bool:
    """Whether the Run may open an owner (a consent, a delegated job, a service attempt):
    only while a hop runs it. Any other Run's new owner would never be waited for."""
    return run.status is RunStatus.RUNNING


def is_terminal(run: RunState) -> bool:
    """Whether the Run ended (DONE, FAILED or CANCELLED): its checkpoint may go."""
    return run.status in TERMINAL_RUN_STATUSES


def cancel_frozen_at(run: RunState, enqueue_seq: int) -> bool:
    """Whether a cancellation froze the Run at hop ``enqueue_seq`` (CANCELLING there):
    nothing can claim that hop any more, so it alone may be fenced at the broker before
    the cancellation finishes."""
    return run.status is RunStatus.CANCELLING and run.enqueue_seq == enqueue_seq
