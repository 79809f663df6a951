"""The vocabulary of workflow Runs: what a caller admits, what the ledger answers.

A Run is the canonical record of one workflow execution. It is admitted once (with an
optional scoped idempotency key), handed to a broker through a delivery outbox (one
delivery per hop, named by :func:`hop_key`), claimed by exactly one worker hop, parked
while it waits for an owner (a consent, a delegated AgentJob, a service attempt) or for
hardware, resumed only by its exact owner, and settled or cancelled with proven
containment. The machines themselves are in :mod:`tenure.kernel.runs`; the ledger is
:class:`tenure.adapters.RunLedger`.

Everything here is a frozen value checked on construction: invalid input raises
``ConfigValidationError`` naming our field, never echoing the value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import re
from typing import Any

from . import bounds
from .errors import ConfigValidationError
from .json_values import json_problem, text_problem
from .validation import refuse

__all__ = [
    "check_run_id",
    "check_seq",
    "RunStatus",
    "DeliveryState",
    "WaitKind",
    "ConsentStatus",
    "AgentJobStatus",
    "BrokerJobState",
    "LIVE_BROKER_STATES",
    "FINISHED_BROKER_STATES",
    "TERMINAL_RUN_STATUSES",
    "WAIT_STATUSES",
    "TERMINAL_AGENT_JOB_STATUSES",
    "DECIDED_CONSENT_STATUSES",
    "MessageStatus",
    "ANSWERED_MESSAGE_STATUSES",
    "MessageRecord",
    "ReceiveAnswer",
    "check_topic",
    "MAX_TOPIC_CHARS",
    "MAX_MESSAGE_ID_CHARS",
    "RunIntent",
    "WorkflowPin",
    "RunRecord",
    "DeliveryRecord",
    "Admission",
    "RunClaim",
    "CancelTicket",
    "ConsentRecord",
    "AgentJobRecord",
    "RunPage",
    "hop_key",
    "broker_priority",
    "check_priority",
    "MAX_RUN_TEXT_CHARS",
    "MAX_RUN_DOCUMENT_BYTES",
    "MAX_ERROR_CHARS",
    "MAX_SCOPES",
    "MAX_HOP_RETRIES",
    "MAX_QUEUE_CHARS",
    "MAX_RUN_TIMEOUT_S",
    "RUN_TIMEOUT_ERROR",
]

MAX_RUN_TEXT_CHARS = 128
"""Identifiers of Runs and their owners (session, source, queue, node, tool, runtime,
profile, request ID): at most 128 characters, taken exactly as given."""
MAX_QUEUE_CHARS = 50
MAX_RUN_DOCUMENT_BYTES = 1024 * 1024
"""A payload, a request or a result: at most 1 MiB of canonical UTF-8 JSON."""
MAX_ERROR_CHARS = 16 * 1024
MAX_SCOPES = 256
MAX_HOP_RETRIES = 100
"""How many times a workflow may let recovery run a lost hop again (``on_lost="retry"``)."""
MAX_RUN_TIMEOUT_S = 366 * 86_400
"""The longest timeout a Run may be admitted with (``RunLedger.admit(..., timeout_s=...)``)."""
RUN_TIMEOUT_ERROR = "timeout"
"""The reason a Run cancelled because its deadline passed keeps as its ``error``
(CANCELLING, then CANCELLED): an operator's cancel keeps none."""


class RunStatus(enum.Enum):
    """Where a Run stands. Values are the stored column values."""

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


TERMINAL_RUN_STATUSES = frozenset({RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED})
WAIT_STATUSES = frozenset({RunStatus.AWAITING_CONSENT, RunStatus.AWAITING_DELEGATE, RunStatus.AWAITING_SERVICE,
                           RunStatus.AWAITING_TIMER, RunStatus.AWAITING_MESSAGE})
"""The waits an owner ends (hardware waits are left by the same hop); a timer's owner is
its due time on the database clock."""


class DeliveryState(enum.Enum):
    """Where one hop's delivery stands (the outbox row the broker job mirrors)."""

    HELD = "held"
    PENDING = "pending"
    PUBLISHED = "published"
    CLAIMED = "claimed"
    SETTLED = "settled"


class WaitKind(enum.Enum):
    """What a parked Run waits for: the owner kinds of ``park`` and hardware."""

    HARDWARE = "hardware"
    CONSENT = "consent"
    DELEGATE = "delegate"
    SERVICE = "service"
    TIMER = "timer"
    MESSAGE = "message"
    """A receive of a message (``RunContext.receive``): the Run waits for a message of
    one topic, or for the receive's timeout."""


class ConsentStatus(enum.Enum):
    PENDING = "pending"
    GRANTED = "granted"
    DENIED = "denied"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


DECIDED_CONSENT_STATUSES = frozenset({ConsentStatus.GRANTED, ConsentStatus.DENIED, ConsentStatus.EXPIRED})
"""Verdicts that resume a Run (a cancelled consent never does)."""


class MessageStatus(enum.Enum):
    """Where one message slot of a Run stands (the message machine, ``specs/messages.md``):
    a slot holds a message, a receive waiting for one, or both."""

    SENT = "sent"
    """A message no receive took yet."""
    PENDING = "pending"
    """A receive waiting for a message of its topic (until its timeout, if it has one)."""
    RECEIVED = "received"
    """A message delivered to a receive: the receive's answer."""
    TIMED_OUT = "timed_out"
    """A receive whose timeout passed before any message came: the receive's answer."""
    CANCELLED = "cancelled"
    """A pending receive whose Run reached terminal truth: it never answers."""


ANSWERED_MESSAGE_STATUSES = frozenset({MessageStatus.RECEIVED, MessageStatus.TIMED_OUT})
"""A receive's answers: they resume a Run waiting on the receive (a cancelled receive never does)."""

MAX_TOPIC_CHARS = 64
"""A message topic: 1 to 64 characters of ``A-Z a-z 0-9 _ . : / -``, starting with a letter or a digit."""
MAX_MESSAGE_ID_CHARS = 128
"""A message ID (the sender's replay key within its Run)."""

_TOPIC = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,63}")


def check_topic(value: object) -> str:
    """A message topic (:data:`MAX_TOPIC_CHARS`): an identifier-like text, refused ``topic_required``."""
    if type(value) is not str or _TOPIC.fullmatch(value) is None:
        raise refuse("topic", "topic_required")
    return value


class AgentJobStatus(enum.Enum):
    QUEUED = "queued"
    ADMITTED = "admitted"
    PREPARING = "preparing"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    LOST = "lost"


TERMINAL_AGENT_JOB_STATUSES = frozenset({
    AgentJobStatus.SUCCEEDED, AgentJobStatus.FAILED, AgentJobStatus.CANCELLED, AgentJobStatus.TIMED_OUT,
    AgentJobStatus.LOST,
})


class BrokerJobState(enum.Enum):
    """What a broker says of one hop key (see ``tenure.adapters.Broker.probe``)."""

    ABSENT = "absent"
    QUEUED = "queued"
    ACTIVE = "active"
    COMPLETE = "complete"
    FAILED = "failed"
    ABORTED = "aborted"


LIVE_BROKER_STATES = frozenset({BrokerJobState.QUEUED, BrokerJobState.ACTIVE})
"""A job in these states may still start or is executing."""

FINISHED_BROKER_STATES = frozenset({BrokerJobState.COMPLETE, BrokerJobState.FAILED, BrokerJobState.ABORTED})
"""The broker is done with a job in these states (``absent`` is not finished: it holds nothing)."""



def check_text(value: object, field: str, max_chars: int = MAX_RUN_TEXT_CHARS) -> str:
    """A nonempty string of at most ``max_chars`` characters that can be stored exactly."""
    if not bounds.is_bounded_text(value, max_chars):
        raise refuse(field, "text_required")
    if text_problem(value) is not None:  # type: ignore[arg-type]
        raise refuse(field, "text_not_storable")
    return value  # type: ignore[return-value]


def check_run_id(value: object) -> str:
    """A Run ID as every Run operation takes it (a nonempty text of at most 36 characters)."""
    return check_text(value, "run_id", 36)


def check_seq(value: object) -> int:
    """A hop's sequence: an ``int`` (never a bool) from 0 to 2**31 - 1."""
    if not bounds.is_strict_int(value) or not 0 <= value <= bounds.INT32_MAX:  # type: ignore[operator]
        raise refuse("enqueue_seq", "integer_out_of_range")
    return value  # type: ignore[return-value]


def check_priority(value: object, field: str = "priority") -> int:
    """Doctrine priority: an ``int`` (never a bool) from 0 to 100, higher first."""
    if not bounds.is_strict_int(value) or not 0 <= value <= 100:  # type: ignore[operator]
        raise refuse(field, "priority_out_of_range")
    return value  # type: ignore[return-value]


def check_document(value: object, field: str) -> Any:
    """A finite built-in JSON value (its size is checked where it is stored)."""
    problem = json_problem(value)
    if problem is not None:
        raise refuse(field, problem)
    return value


def hop_key(run_id: str, enqueue_seq: int) -> str:
    """The broker key of one hop: ``run:<run_id>:<enqueue_seq>``."""
    check_text(run_id, "run_id")
    if not bounds.is_strict_int(enqueue_seq) or not 0 <= enqueue_seq <= bounds.INT32_MAX:
        raise refuse("enqueue_seq", "integer_out_of_range")
    return f"run:{run_id}:{enqueue_seq}"


def parse_hop_key(key: object) -> tuple[str, int]:
    """The Run ID and sequence a broker key names: the exact inverse of :func:`hop_key`
    (any text ``hop_key`` would not make, such as a sequence with a leading zero, is
    refused ``hop_key_required``)."""
    if type(key) is str and key.startswith("run:"):
        run_id, _, seq = key.removeprefix("run:").rpartition(":")
        if seq.isascii() and seq.isdigit() and len(seq) <= len(str(bounds.INT32_MAX)):
            with contextlib.suppress(ConfigValidationError):
                if hop_key(run_id, int(seq)) == key:
                    return run_id, int(seq)
    raise refuse("key", "hop_key_required")


def broker_priority(priority: int) -> int:
    """The priority a broker that dequeues lower values first receives: ``100 - p``."""
    return 100 - check_priority(priority)


@dataclasses.dataclass(frozen=True, slots=True)
class RunIntent:
    """What a caller asks a Run to do: every field is part of an idempotent replay's
    comparison. ``scopes`` is a frozenset of scope names; ``payload`` any finite JSON
    value; ``requested_priority`` overrides the router's priority when set."""

    session_id: str | None
    source: str
    principal: str
    scopes: frozenset[str]
    payload: Any
    requested_priority: int | None = None

    def __post_init__(self) -> None:
        if self.session_id is not None:
            check_text(self.session_id, "session_id")
        check_text(self.source, "source", 64)
        check_text(self.principal, "principal", bounds.MAX_IDENTITY_CHARS)
        if type(self.scopes) is not frozenset or len(self.scopes) > MAX_SCOPES:
            raise refuse("scopes", "frozenset_required")
        for scope in self.scopes:
            check_text(scope, "scopes")
        check_document(self.payload, "payload")
        if self.requested_priority is not None:
            check_priority(self.requested_priority, "requested_priority")


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowPin:
    """The exact workflow a Run runs: registered name, revision and content digest."""

    name: str
    revision: str
    digest: str
    max_hop_retries: int = 0
    """How many times recovery may run a hop lost with its process again instead of
    failing the Run ``lost`` (the workflow's ``on_lost="retry"`` policy; 0: never)."""

    def __post_init__(self) -> None:
        check_text(self.name, "workflow_name", 100)
        check_text(self.revision, "workflow_revision", 64)
        check_text(self.digest, "workflow_digest")
        if not bounds.is_strict_int(self.max_hop_retries) or not 0 <= self.max_hop_retries <= MAX_HOP_RETRIES:
            raise refuse("max_hop_retries", "integer_out_of_range")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """A Run as stored. ``node`` is the node of the latest claim (``admitted_node`` the
    node that admitted it); ``owner_kind`` and
    ``owner_id`` the owner of the current (or, once cancelling or finished, the last)
    wait."""

    run_id: str
    status: RunStatus
    session_id: str | None
    source: str
    principal: str
    scopes: frozenset[str]
    payload: Any
    requested_priority: int | None
    queue: str
    priority: int
    workflow: WorkflowPin
    idempotency_key: str | None
    enqueue_seq: int
    started_at: dt.datetime | None
    node: str | None
    owner_kind: WaitKind | None
    owner_id: str | None
    error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    admitted_node: str | None = None
    """The node that admitted the Run (``admit(..., node=...)``; None: any node)."""
    result: Any = None
    """A DONE Run's result: the JSON object its workflow returned (None: it returned None)."""
    hop_retries: int = 0
    """How many lost hops recovery ran again (at most ``workflow.max_hop_retries``)."""
    retry_of: str | None = None
    """The Run (failed ``lost``) an operator re-admitted this one for (``RunLedger.retry``)."""
    wake_at: dt.datetime | None = None
    """When a timer wait is due (database clock); kept with the timer as its owner is."""
    deadline: dt.datetime | None = None
    """When the Run times out (database clock): its admission time plus the timeout it was
    admitted with (``admit(..., timeout_s=...)``); None: no deadline. A Run not finished
    by then is cancelled with the reason ``timeout`` (:attr:`timed_out`)."""

    @property
    def timed_out(self) -> bool:
        """Whether the Run was cancelled because its deadline passed: CANCELLING or
        CANCELLED with the reason :data:`RUN_TIMEOUT_ERROR` as its ``error`` (an
        operator's cancel leaves ``error`` None)."""
        return self.status in (RunStatus.CANCELLING, RunStatus.CANCELLED) and self.error == RUN_TIMEOUT_ERROR

    @property
    def intent(self) -> RunIntent:
        return RunIntent(self.session_id, self.source, self.principal, self.scopes, self.payload,
                         self.requested_priority)


@dataclasses.dataclass(frozen=True, slots=True)
class DeliveryRecord:
    """One hop's delivery. ``publish_attempts`` counts every publish call recorded."""

    run_id: str
    enqueue_seq: int
    state: DeliveryState
    queue: str
    priority: int
    resume: bool
    publish_attempts: int

    @property
    def key(self) -> str:
        return hop_key(self.run_id, self.enqueue_seq)


@dataclasses.dataclass(frozen=True, slots=True)
class Admission:
    """The admitted Run and its current delivery; ``created`` is True for exactly one
    admission of a Run (replays answer False). Publish when the delivery is PENDING."""

    run: RunRecord
    delivery: DeliveryRecord
    created: bool


@dataclasses.dataclass(frozen=True, slots=True)
class RunClaim:
    """A won claim: the hop to execute. ``resume`` and ``workflow`` come from the ledger,
    never from the broker's arguments."""

    run: RunRecord
    enqueue_seq: int
    resume: bool
    workflow: WorkflowPin


@dataclasses.dataclass(frozen=True, slots=True)
class CancelTicket:
    """The frozen generation a cancellation must contain before ``finish_cancel``;
    ``already_cancelled``: the Run was CANCELLED already (repeat the sweep)."""

    run_id: str
    enqueue_seq: int
    already_cancelled: bool


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsentRecord:
    consent_id: str
    run_id: str
    tool_name: str
    tool_call_id: str
    payload: Any
    status: ConsentStatus
    decided_by: str | None
    decided_at: dt.datetime | None
    preauthorized_by: str | None
    created_at: dt.datetime
    expires_at: dt.datetime | None = None
    """The deadline tenure's relays apply (``expired`` once it passed), or None."""

    @property
    def verdict(self) -> bool | None:
        """True when granted; False when denied, expired or cancelled; None while pending."""
        if self.status is ConsentStatus.PENDING:
            return None
        return self.status is ConsentStatus.GRANTED


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MessageRecord:
    """One message slot of a Run as stored: a message (``message_id``, ``message``,
    ``sequence``, ``sent_at``: set once a message is in the slot), a receive
    (``receive_key``, ``expires_at``: set once a receive holds it), or both once the
    message was delivered (``received``). ``sequence`` numbers the Run's messages of
    one topic from 1, in the order they were sent; ``decided_at`` is when the receive
    got its answer (or was cancelled) and ``decided_by`` who gave it when no message
    did (``tenure:deadline`` for a timeout, the Run's sweep for a cancellation)."""

    slot_id: str
    run_id: str
    topic: str
    status: MessageStatus
    message_id: str | None
    message: Any
    sequence: int | None
    sent_at: dt.datetime | None
    receive_key: str | None
    expires_at: dt.datetime | None
    created_at: dt.datetime
    decided_at: dt.datetime | None
    decided_by: str | None

    @property
    def answer(self) -> ReceiveAnswer | None:
        """The receive's answer (None: no receive holds the slot, or it has none yet)."""
        if self.status not in ANSWERED_MESSAGE_STATUSES or self.receive_key is None:
            return None
        received = self.status is MessageStatus.RECEIVED
        return ReceiveAnswer(
            status=self.status, topic=self.topic, key=self.receive_key, receive_id=self.slot_id,
            message=self.message if received else None, message_id=self.message_id if received else None,
            sequence=self.sequence if received else None,
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReceiveAnswer:
    """What a receive answers (``RunContext.receive``, ``RunContext.receive_answer``):
    ``status`` is RECEIVED (``message``, ``message_id`` and ``sequence`` are the
    delivered message's) or TIMED_OUT (all three None: no message came before the
    timeout). ``topic`` and ``key`` are the receive's own; ``receive_id`` is the slot the
    Run waited on (its owner ID). A replayed receive (the same ``key``) answers the same."""

    status: MessageStatus
    topic: str
    key: str
    receive_id: str
    message: Any = None
    message_id: str | None = None
    sequence: int | None = None

    @property
    def received(self) -> bool:
        return self.status is MessageStatus.RECEIVED

    @property
    def timed_out(self) -> bool:
        return self.status is MessageStatus.TIMED_OUT


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AgentJobRecord:
    job_id: str
    request_id: str
    run_id: str
    runtime: str
    profile: str
    status: AgentJobStatus
    request: Any
    result: Any
    runtime_job_id: str | None
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class RunPage:
    """One page of Runs, oldest created first; pass ``next_cursor`` as ``after``."""

    items: tuple[RunRecord, ...]
    next_cursor: str | None
