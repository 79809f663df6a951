"""The delegated-job (AgentJob) machine: every transition of one job, as one table.

Theory of operation
-------------------
The hop of a RUNNING Run submits a job once per request ID: a repeated submit with the
same content answers the stored job, changed content conflicts. The coordinator moves
it along queued -> admitted -> preparing -> running (one step at a time, recording the
runtime's job identity once) and adopts one result, which ends it. A start whose outcome
is ambiguous (the runtime may have begun) is adopted LOST, never FAILED. LOST is
terminal for adoption but not evidence that anything stopped: only the runtime's
containment returning records LOST -> CANCELLED (or cancels a job still open). A Run
may settle only when none of its jobs is open or LOST. Invariants:
:mod:`tenure.kernel.agent_jobs.record` and :func:`transition_violations`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from tenure.model import TERMINAL_AGENT_JOB_STATUSES, AgentJobStatus, ErrorCode

from ..core import SAME, Applied, Decision, Machine, Refused, Row
from .commands import Ack, AgentJobCommand, AgentJobCommandType, Submitted
from .record import AgentJobRow, AgentJobStep, record_violations, step_of

__all__ = ["AgentJobRefusal", "OUTCOMES", "GUARDS", "EFFECTS", "ROWS", "AGENT_JOBS", "transition_violations", "NEXT_STATUS"]


class AgentJobRefusal(enum.Enum):
    NOT_FOUND = "not_found"
    RUN_NOT_RUNNING = "run_not_running"
    REQUEST_CHANGED = "request_changed"
    IDENTITY_CONFLICT = "identity_conflict"
    ALREADY_APPLIED = "already_applied"
    NOT_NEXT = "not_next"
    ALREADY_FINISHED = "already_finished"


R = AgentJobRefusal
OUTCOMES: dict[AgentJobRefusal, ErrorCode | None] = {
    reason: {
        R.RUN_NOT_RUNNING: ErrorCode.RUN_OWNER_MISMATCH,
        R.REQUEST_CHANGED: ErrorCode.JOB_REQUEST_CONFLICT,
        R.IDENTITY_CONFLICT: ErrorCode.JOB_REQUEST_CONFLICT,
    }.get(reason)
    for reason in AgentJobRefusal
}

NEXT_STATUS = {
    AgentJobStatus.QUEUED: AgentJobStatus.ADMITTED,
    AgentJobStatus.ADMITTED: AgentJobStatus.PREPARING,
    AgentJobStatus.PREPARING: AgentJobStatus.RUNNING,
}
"""The one status ``advance`` may move each open status to."""


def _result_is(status: AgentJobStatus) -> Callable[[Any, Any, int], bool]:
    return lambda record, command, now_us: command.status is status


GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda record, command, now_us: True,
    "run_not_running": lambda record, command, now_us: not command.run_running,
    "request_differs": lambda record, command, now_us: (
        record.run_id, record.runtime, record.profile, record.request_json
    ) != (command.row.run_id, command.row.runtime, command.row.profile, command.row.request_json),
    "identity_differs": lambda record, command, now_us: record.runtime_job_id is not None
    and command.runtime_job_id is not None and record.runtime_job_id != command.runtime_job_id,
    "same_status": lambda record, command, now_us: command.status is record.status,
    "next_status": lambda record, command, now_us: NEXT_STATUS.get(record.status) is command.status,
    "result_succeeded": _result_is(AgentJobStatus.SUCCEEDED),
    "result_failed": _result_is(AgentJobStatus.FAILED),
    "result_cancelled": _result_is(AgentJobStatus.CANCELLED),
    "result_timed_out": _result_is(AgentJobStatus.TIMED_OUT),
    "result_lost": _result_is(AgentJobStatus.LOST),
}


def _later(record: AgentJobRow, now_us: int) -> int:
    return now_us if now_us > record.updated_at_us else record.updated_at_us


def _insert(record: Any, command: Any, now_us: int) -> Applied[AgentJobRow]:
    row = dataclasses.replace(command.row, status=AgentJobStatus.QUEUED, result_json=None, runtime_job_id=None,
                              created_at_us=now_us, updated_at_us=now_us)
    return Applied(row, Submitted(replayed=False))


def _advance(record: AgentJobRow, command: Any, now_us: int) -> Applied[AgentJobRow]:
    identity = record.runtime_job_id if record.runtime_job_id is not None else command.runtime_job_id
    return Applied(dataclasses.replace(record, status=command.status, runtime_job_id=identity,
                                       updated_at_us=_later(record, now_us)), Ack())


def _adopt(status: AgentJobStatus) -> Callable[[Any, Any, int], Applied[AgentJobRow]]:
    def effect(record: AgentJobRow, command: Any, now_us: int) -> Applied[AgentJobRow]:
        return Applied(dataclasses.replace(record, status=status, result_json=command.result_json,
                                           updated_at_us=_later(record, now_us)), Ack())

    return effect


EFFECTS: dict[str, Callable[[Any, Any, int], Applied[AgentJobRow]]] = {
    "insert": _insert,
    "replay": lambda record, command, now_us: Applied(record, Submitted(replayed=True)),
    "advance": _advance,
    "adopt_succeeded": _adopt(AgentJobStatus.SUCCEEDED),
    "adopt_failed": _adopt(AgentJobStatus.FAILED),
    "adopt_cancelled": _adopt(AgentJobStatus.CANCELLED),
    "adopt_timed_out": _adopt(AgentJobStatus.TIMED_OUT),
    "adopt_lost": _adopt(AgentJobStatus.LOST),
    "contain": _adopt(AgentJobStatus.CANCELLED),
}

S = AgentJobStep
C = AgentJobCommandType
_OPEN = (S.QUEUED, S.ADMITTED, S.PREPARING, S.RUNNING)
_PRESENT = (*_OPEN, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT, S.LOST)
_FINISHED = (S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT, S.LOST)

ROWS: tuple[Row, ...] = (
    Row((S.ABSENT,), C.SUBMIT, "run_not_running", SAME, R.RUN_NOT_RUNNING),
    Row((S.ABSENT,), C.SUBMIT, "always", S.QUEUED, "insert"),
    Row(_PRESENT, C.SUBMIT, "request_differs", SAME, R.REQUEST_CHANGED),
    Row(_PRESENT, C.SUBMIT, "always", SAME, "replay"),

    Row((S.ABSENT,), C.ADVANCE, "always", SAME, R.NOT_FOUND),
    Row(_OPEN, C.ADVANCE, "identity_differs", SAME, R.IDENTITY_CONFLICT),
    Row(_OPEN, C.ADVANCE, "same_status", SAME, R.ALREADY_APPLIED),
    Row((S.QUEUED,), C.ADVANCE, "next_status", S.ADMITTED, "advance"),
    Row((S.ADMITTED,), C.ADVANCE, "next_status", S.PREPARING, "advance"),
    Row((S.PREPARING,), C.ADVANCE, "next_status", S.RUNNING, "advance"),
    Row(_OPEN, C.ADVANCE, "always", SAME, R.NOT_NEXT),
    Row(_FINISHED, C.ADVANCE, "always", SAME, R.ALREADY_FINISHED),

    Row((S.ABSENT,), C.ADOPT_RESULT, "always", SAME, R.NOT_FOUND),
    Row(_OPEN, C.ADOPT_RESULT, "result_succeeded", S.SUCCEEDED, "adopt_succeeded"),
    Row(_OPEN, C.ADOPT_RESULT, "result_failed", S.FAILED, "adopt_failed"),
    Row(_OPEN, C.ADOPT_RESULT, "result_cancelled", S.CANCELLED, "adopt_cancelled"),
    Row(_OPEN, C.ADOPT_RESULT, "result_timed_out", S.TIMED_OUT, "adopt_timed_out"),
    Row(_OPEN, C.ADOPT_RESULT, "result_lost", S.LOST, "adopt_lost"),
    Row(_OPEN, C.ADOPT_RESULT, "always", SAME, R.NOT_NEXT),
    Row(_FINISHED, C.ADOPT_RESULT, "always", SAME, R.ALREADY_FINISHED),

    Row((S.ABSENT,), C.RECORD_CANCELLED, "always", SAME, R.NOT_FOUND),
    Row((*_OPEN, S.LOST), C.RECORD_CANCELLED, "always", S.CANCELLED, "contain"),
    Row((S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT), C.RECORD_CANCELLED, "always", SAME, R.ALREADY_FINISHED),
)


def transition_violations(record: AgentJobRow | None, command: AgentJobCommand, now_us: int,
                          decision: Decision) -> list[str]:
    """The transition rules (TR-J1 ... TR-J3 in specs/agent_jobs.md) a decision breaks."""
    if isinstance(decision, Refused):
        return []
    new = decision.new_record
    if record is None:
        ok = new is not None and command.kind is AgentJobCommandType.SUBMIT and command.run_running  # type: ignore[union-attr]
        return [] if ok else ["TR-J1"]  # a job is born only for a RUNNING Run
    if new is None or (new.job_id, new.request_id, new.run_id, new.runtime, new.profile, new.request_json) != (
        record.job_id, record.request_id, record.run_id, record.runtime, record.profile, record.request_json
    ):
        return ["TR-J1"]  # identity and request never change; jobs are never deleted
    broken = []
    if record.status in TERMINAL_AGENT_JOB_STATUSES and new != record and not (
        record.status is AgentJobStatus.LOST and new.status is AgentJobStatus.CANCELLED
        and command.kind is AgentJobCommandType.RECORD_CANCELLED
    ):
        broken.append("TR-J2")  # a result is adopted once; only containment ends LOST
    if record.runtime_job_id is not None and new.runtime_job_id != record.runtime_job_id:
        broken.append("TR-J3")  # the runtime's job identity is recorded once
    return broken


AGENT_JOBS = Machine.define(
    name="agent_jobs",
    states=AgentJobStep,
    commands=AgentJobCommandType,
    rows=ROWS,
    guards=GUARDS,
    effects=EFFECTS,
    outcomes=OUTCOMES,
    state_of=step_of,
    record_violations=record_violations,
    transition_violations=transition_violations,
    initial=AgentJobStep.ABSENT,
)
"""The delegated-job machine: ``AGENT_JOBS.decide(record, command, now_us)``."""
