"""The public vocabulary of service job attempts (``ServiceJobAttempt@1``).

An attempt is the durable envelope around one call to an external provider or executor
(a paid API, an image or speech engine, a local GPU process): it is written before the
first transmission, so that whatever happens to the caller afterwards (a timeout, a
crash, a lost acknowledgement) can be reconciled from what was recorded, and so that no
failure is ever fabricated and no effect repeated without proof.

Requests are strict frozen pydantic models (construction raises
``ConfigValidationError`` naming our fields and problems, never echoing the input);
observations and evidence are small frozen dataclasses checked on construction. Nothing
live (a client, a handle, a stream) can enter a record: refs are strings, digests are
``sha256:`` plus 64 lowercase hex digits, and the rest is finite JSON.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import PlainValidator
from pydantic_core import PydanticCustomError

from . import bounds
from .errors import ConfigValidationError
from .json_values import text_problem
from .validation import IdentityText, PositiveInt32, StrictBool, StrictModel

__all__ = [
    "ENVELOPE_TAG",
    "AttemptState",
    "UNRESOLVED_STATES",
    "TERMINAL_ATTEMPT_STATES",
    "CapabilityBinding",
    "ToolBinding",
    "ProviderGuarantees",
    "EgressDecision",
    "AttemptSpec",
    "AttemptRecord",
    "Transmission",
    "Found",
    "NotFound",
    "LookupFailed",
    "RejectedBeforeEffect",
    "ProviderFailed",
    "CancelConfirmed",
    "AttemptPage",
    "ReconcileReport",
    "MAX_REFS",
    "MAX_REASON_CHARS",
    "check_refs",
    "check_reason",
]

ENVELOPE_TAG = "ServiceJobAttempt@1"

MAX_REFS = 256
"""The most refs (source, working, result, diagnostic) or warnings one list holds."""

MAX_REASON_CHARS = 1024
"""The longest reason, warning or progress cursor text."""


class AttemptState(enum.Enum):
    """Where one attempt stands. Values are the stored column values."""

    PREPARED = "prepared"
    SUBMITTING = "submitting"
    ACCEPTED = "accepted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INDETERMINATE = "indeterminate"


UNRESOLVED_STATES = frozenset(
    {AttemptState.SUBMITTING, AttemptState.ACCEPTED, AttemptState.RUNNING, AttemptState.INDETERMINATE}
)
"""Transmitted and not yet settled: what reconciliation pages over."""

TERMINAL_ATTEMPT_STATES = frozenset({AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELLED})

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _refuse(problem: str) -> PydanticCustomError:
    return PydanticCustomError(problem, problem.replace("_", " "))


def _check_digest(value: object) -> str:
    if type(value) is not str or not _DIGEST.fullmatch(value):
        raise _refuse("sha256_digest_required")
    return value


def _check_refs(value: object) -> tuple[str, ...]:
    if not isinstance(value, (tuple, list)) or type(value) not in (tuple, list):
        raise _refuse("list_of_refs_required")
    if len(value) > MAX_REFS:
        raise _refuse("list_too_long")
    items: list[str] = []
    for item in value:
        if not bounds.is_identity(item) or text_problem(item) is not None:
            raise _refuse("ref_required")
        items.append(item)
    return tuple(items)


def _check_revisions(value: object) -> dict[str, str]:
    if type(value) is not dict:
        raise _refuse("string_map_required")
    if len(value) > MAX_REFS:
        raise _refuse("map_too_large")
    for key, item in value.items():
        if not bounds.is_identity(key) or not bounds.is_identity(item) or text_problem(key) or text_problem(item):
            raise _refuse("identity_values_required")
    return dict(value)


Digest = Annotated[str, PlainValidator(_check_digest)]
Refs = Annotated[tuple[str, ...], PlainValidator(_check_refs)]
Revisions = Annotated[dict[str, str], PlainValidator(_check_revisions)]


class CapabilityBinding(StrictModel):
    """A capability-backed execution: interface, immutable profile, operation, driver and
    dialect revisions."""

    kind: Literal["capability"] = "capability"
    interface: IdentityText
    profile_revision: IdentityText
    profile_digest: Digest
    operation: IdentityText
    driver_revision: IdentityText
    dialect_revision: IdentityText


class ToolBinding(StrictModel):
    """A direct-tool execution: implementation and resolution lock, tool profile and
    executor profile."""

    kind: Literal["tool"] = "tool"
    implementation: IdentityText
    resolution_lock: IdentityText
    tool_profile: IdentityText
    executor_profile: IdentityText


class ProviderGuarantees(StrictModel):
    """What the provider's binding proves: ``same_key_replay`` (a repeated transmission
    under the same key returns the original job and rejects changed content, atomically
    on the server) and ``lookup`` (the job can be found by its idempotency key)."""

    same_key_replay: StrictBool
    lookup: StrictBool


class EgressDecision(StrictModel):
    """The policy's decision for one physical transmission (fresh for each)."""

    decision_id: IdentityText
    allowed: StrictBool
    policy_revision: IdentityText


class AttemptSpec(StrictModel):
    """Everything an attempt records before its first transmission.

    ``(owner_job_id, generation)`` names the attempt: ``prepare`` of the same spec returns
    the same attempt ID, a changed spec conflicts. A retry is a new generation with a new
    ``idempotency_key``, allowed once its predecessor failed or was cancelled.
    """

    owner_job_id: IdentityText
    run_id: IdentityText | None
    station_attempt_id: IdentityText | None
    generation: PositiveInt32
    request_digest: Digest
    idempotency_key: IdentityText
    binding: CapabilityBinding | ToolBinding
    guarantees: ProviderGuarantees
    target: IdentityText
    source_refs: Refs = ()
    working_refs: Refs = ()
    destination: IdentityText | None = None
    purpose: IdentityText
    consent_decision: IdentityText | None = None
    policy_revisions: Revisions = {}
    reservation: IdentityText | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRecord:
    """One attempt as stored: its spec's fields and where it stands."""

    attempt_id: str
    envelope: str
    owner_job_id: str
    run_id: str | None
    station_attempt_id: str | None
    generation: int
    request_digest: str
    idempotency_key: str
    binding: CapabilityBinding | ToolBinding
    guarantees: ProviderGuarantees
    target: str
    source_refs: tuple[str, ...]
    working_refs: tuple[str, ...]
    destination: str | None
    purpose: str
    consent_decision: str | None
    policy_revisions: Mapping[str, str]
    reservation: str | None
    state: AttemptState
    provider_job_id: str | None
    transmissions: int
    """How many physical transmissions were granted (each under a fresh egress decision)."""
    progress_cursor: str | None
    result_refs: tuple[str, ...]
    diagnostic_refs: tuple[str, ...]
    usage: Any
    cost: Any
    warnings: tuple[str, ...]
    cancel_requested: bool
    evidence: tuple[str, ...]
    """What settled or moved the attempt, oldest first (reconciliation evidence)."""
    reservation_released: bool
    created_at_us: int
    updated_at_us: int


@dataclasses.dataclass(frozen=True, slots=True)
class Transmission:
    """Permission for one physical transmission: send exactly this, under this key."""

    attempt_id: str
    idempotency_key: str
    number: int
    request_digest: str
    target: str
    egress_decision_id: str


def _check_text(value: object, field: str, max_chars: int = bounds.MAX_IDENTITY_CHARS) -> None:
    if not bounds.is_bounded_text(value, max_chars) or text_problem(value) is not None:  # type: ignore[arg-type]
        raise ConfigValidationError(f"invalid_{field}", fields=(field,), problems=("text_required",))


@dataclasses.dataclass(frozen=True, slots=True)
class Found:
    """A lookup or poll found the provider's job: its identity and state (``accepted``,
    ``running``, ``succeeded``, ``failed`` or ``cancelled``) and, once succeeded, its
    result refs."""

    provider_job_id: str
    state: AttemptState
    result_refs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_text(self.provider_job_id, "provider_job_id")
        if type(self.state) is not AttemptState or self.state in (
            AttemptState.PREPARED, AttemptState.SUBMITTING, AttemptState.INDETERMINATE
        ):
            raise ConfigValidationError("invalid_found", fields=("state",), problems=("provider_state_required",))
        object.__setattr__(self, "result_refs", _refs_or_refuse(self.result_refs, "result_refs"))


@dataclasses.dataclass(frozen=True, slots=True)
class NotFound:
    """A lookup found no job under the key. ``proves_no_effect``: the provider vouches
    that nothing was or will be done under it (a strongly consistent lookup)."""

    proves_no_effect: bool

    def __post_init__(self) -> None:
        if type(self.proves_no_effect) is not bool:
            raise ConfigValidationError("invalid_not_found", fields=("proves_no_effect",), problems=("boolean_required",))


@dataclasses.dataclass(frozen=True, slots=True)
class LookupFailed:
    """The lookup itself failed: nothing was learned."""

    reason: str

    def __post_init__(self) -> None:
        _check_text(self.reason, "reason", MAX_REASON_CHARS)


class RejectedBeforeEffect(Exception):
    """A definite rejection before any effect (raised by a driver; the same object is the
    evidence ``record_failed`` takes). Anything else a driver raises is ambiguous."""

    def __init__(self, reason: str) -> None:
        _check_text(reason, "reason", MAX_REASON_CHARS)
        super().__init__("rejected before any effect")
        self.reason = reason

    def __repr__(self) -> str:
        return "RejectedBeforeEffect()"


@dataclasses.dataclass(frozen=True, slots=True)
class ProviderFailed:
    """The provider reported that the accepted job failed."""

    reason: str

    def __post_init__(self) -> None:
        _check_text(self.reason, "reason", MAX_REASON_CHARS)


@dataclasses.dataclass(frozen=True, slots=True)
class CancelConfirmed:
    """The provider confirmed this job stopped: containment evidence."""

    provider_job_id: str

    def __post_init__(self) -> None:
        _check_text(self.provider_job_id, "provider_job_id")


@dataclasses.dataclass(frozen=True, slots=True)
class AttemptPage:
    items: tuple[AttemptRecord, ...]
    next_cursor: str | None
    """Pass as ``after`` for the next page; None on the last."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReconcileReport:
    moved: int
    """Attempts whose state changed."""
    unresolved: int
    """Attempts still unresolved after reconciliation (INDETERMINATE among them)."""
    failed_lookups: int
    """Lookups, polls or cancellations that failed or ran out of time."""


def _refs_or_refuse(value: object, field: str) -> tuple[str, ...]:
    try:
        return _check_refs(value)
    except PydanticCustomError as error:
        problem = error.type
    raise ConfigValidationError(f"invalid_{field}", fields=(field,), problems=(problem,))


def check_refs(value: object, field: str) -> tuple[str, ...]:
    """Refs as the ledger accepts them (ConfigValidationError otherwise)."""
    return _refs_or_refuse(value, field)


def check_reason(value: object, field: str = "reason") -> str:
    _check_text(value, field, MAX_REASON_CHARS)
    return value  # type: ignore[return-value]

