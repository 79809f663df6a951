"""The claim fence a worker carries, and the streaming state snapshot it may read.

A fence names one incarnation of one claim: queue, job ID, owner, generation and the
caller's claim token. Every owned write compares all five, exactly, against the locked
row. The fence is a correlation value, not a grant: holding one proves nothing until the
database agrees that it is still the current, live claim.
"""

from __future__ import annotations

import dataclasses

from . import bounds
from .errors import ConfigValidationError
from .json_values import text_problem
from .states import QueueKind

__all__ = ["QueueClaimFence", "OwnedStreamingState", "check_pid"]


def _text_field_problem(value: object, max_chars: int) -> str | None:
    if type(value) is not str:
        return "string_required"
    if not value:
        return "string_empty"
    if len(value) > max_chars:
        return "string_too_long"
    return text_problem(value)


@dataclasses.dataclass(frozen=True, slots=True)
class QueueClaimFence:
    """The exact identity of one live claim. Carry it unchanged; the token never prints."""

    queue: QueueKind
    job_id: str
    owner_id: str
    generation: int
    claim_token: str = dataclasses.field(repr=False)

    def __post_init__(self) -> None:
        fields: list[str] = []
        problems: list[str] = []

        def note(field: str, problem: str | None) -> None:
            if problem is not None:
                fields.append(field)
                problems.append(problem)

        note("queue", None if type(self.queue) is QueueKind else "queue_kind_required")
        note("job_id", _text_field_problem(self.job_id, bounds.MAX_JOB_ID_CHARS))
        note("owner_id", _text_field_problem(self.owner_id, bounds.MAX_IDENTITY_CHARS))
        if not bounds.is_strict_int(self.generation):
            note("generation", "integer_required")
        elif not 1 <= self.generation <= bounds.INT64_MAX:
            note("generation", "integer_out_of_range")
        note("claim_token", _text_field_problem(self.claim_token, bounds.MAX_IDENTITY_CHARS))
        if fields:
            raise ConfigValidationError(
                "invalid_queue_claim_fence", fields=tuple(fields), problems=tuple(problems)
            )

    def __str__(self) -> str:
        return repr(self)


@dataclasses.dataclass(frozen=True, slots=True)
class OwnedStreamingState:
    """A snapshot of a live streaming claim. Not authority for any later action."""

    cancel_requested: bool
    pid: int | None


def check_pid(pid: object) -> int:
    """A streaming PID: a strict int in 1..2**31-1, else ConfigValidationError."""
    if not bounds.is_strict_int(pid):
        raise ConfigValidationError("invalid_pid", fields=("pid",), problems=("integer_required",))
    if not 1 <= pid <= bounds.INT32_MAX:  # type: ignore[operator]
        raise ConfigValidationError("invalid_pid", fields=("pid",), problems=("integer_out_of_range",))
    return pid  # type: ignore[return-value]
