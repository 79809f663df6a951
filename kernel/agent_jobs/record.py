"""The delegated-job record, its invariants, and the commands of its machine.

An AgentJob is work a Run delegated to a runtime, submitted once per request ID. It
advances queued -> admitted -> preparing -> running, and ends when a result is adopted
(succeeded, failed, cancelled, timed_out, lost) or when the runtime's containment of a
lost or unfinished job returned (cancelled). A result is a JSON object whose ``job_id``
and ``status`` equal the row's; succeeded carries no ``error``, failed, timed_out and
lost carry one. Instants are integer microseconds on the database clock.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from tenure.model import TERMINAL_AGENT_JOB_STATUSES, AgentJobStatus, bounds
from tenure.model.json_values import load_json
from tenure.model.runs import MAX_ERROR_CHARS, MAX_RUN_TEXT_CHARS

__all__ = [
    "AgentJobRow",
    "AgentJobStep",
    "step_of",
    "record_violations",
    "result_problem",
    "job_complete",
    "ERROR_REQUIRED",
]

ERROR_REQUIRED = frozenset({AgentJobStatus.FAILED, AgentJobStatus.TIMED_OUT, AgentJobStatus.LOST})
"""Terminal statuses whose result must say what went wrong."""


class AgentJobStep(enum.Enum):
    ABSENT = "absent"
    QUEUED = "queued"
    ADMITTED = "admitted"
    PREPARING = "preparing"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    LOST = "lost"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AgentJobRow:
    job_id: str
    request_id: str
    run_id: str
    runtime: str
    profile: str
    request_json: str
    status: AgentJobStatus
    result_json: str | None
    runtime_job_id: str | None
    created_at_us: int
    updated_at_us: int


_STEP_OF_STATUS = {status: AgentJobStep(status.value) for status in AgentJobStatus}


def step_of(record: AgentJobRow | None) -> AgentJobStep:
    return AgentJobStep.ABSENT if record is None else _STEP_OF_STATUS[record.status]


def job_complete(row: AgentJobRow) -> bool:
    """Whether a job ended with a result the machine accepts as its end (the evidence a
    Run waiting on it is resumed by): a terminal status and a valid stored result."""
    if row.status not in TERMINAL_AGENT_JOB_STATUSES or row.result_json is None:
        return False
    try:
        result = load_json(row.result_json)
    except ValueError:  # JsonProblem: not JSON, or nested deeper than tenure reads
        return False
    return result_problem(result, row.job_id, row.status) is None


def result_problem(result: Any, job_id: str, status: AgentJobStatus) -> str | None:
    """Why ``result`` is not a valid result of job ``job_id`` ending ``status``, or None."""
    if type(result) is not dict:
        return "json_object_required"
    if result.get("job_id") != job_id:
        return "result_job_mismatch"
    if result.get("status") != status.value or status not in TERMINAL_AGENT_JOB_STATUSES:
        return "result_status_mismatch"
    error = result.get("error")
    if status is AgentJobStatus.SUCCEEDED and error is not None:
        return "result_error_unexpected"
    if status in ERROR_REQUIRED and not bounds.is_bounded_text(error, MAX_ERROR_CHARS):
        return "result_error_required"
    if error is not None and not bounds.is_bounded_text(error, MAX_ERROR_CHARS):
        return "result_error_required"
    return None


def _text(value: object, max_chars: int = MAX_RUN_TEXT_CHARS) -> bool:
    return bounds.is_bounded_text(value, max_chars)


_instant = bounds.is_instant


def _stored_result_problem(record: AgentJobRow) -> str | None:
    if record.result_json is None:
        return "result_missing"
    try:
        result = load_json(record.result_json)
    except ValueError:
        return "result_unreadable"
    return result_problem(result, record.job_id, record.status)


def record_violations(record: AgentJobRow) -> list[str]:
    """The invariants (``INV-J1`` ... ``INV-J3`` in specs/agent_jobs.md) this row breaks."""
    types = {
        "job_id": _text(record.job_id, 36),
        "request_id": _text(record.request_id),
        "run_id": _text(record.run_id, 36),
        "runtime": _text(record.runtime),
        "profile": _text(record.profile),
        "request_json": type(record.request_json) is str,
        "status": type(record.status) is AgentJobStatus,
        "result_json": record.result_json is None or type(record.result_json) is str,
        "runtime_job_id": record.runtime_job_id is None or _text(record.runtime_job_id),
        "instants": _instant(record.created_at_us) and _instant(record.updated_at_us),
    }
    broken = [f"INV-J1.{name}" for name, ok in types.items() if not ok]
    if broken:
        return broken
    terminal = record.status in TERMINAL_AGENT_JOB_STATUSES
    rules = {
        # INV-J2: a terminal job has a shape-valid result for itself; an open one none.
        "INV-J2": (_stored_result_problem(record) is None) if terminal else record.result_json is None,
        # INV-J3: time runs forward.
        "INV-J3": record.created_at_us <= record.updated_at_us,
    }
    return [name for name, ok in rules.items() if not ok]


