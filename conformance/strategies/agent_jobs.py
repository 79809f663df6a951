"""Hypothesis strategies for delegated jobs and their commands (see attempts.py).

Records keep INV-J1 ... INV-J3: an open job has no result, a finished one a result for
itself and its status (an error exactly where its status needs or allows one). Commands
come from small pools with near misses: the same request or one changed in one field,
every status as an advance or a result (results are always shape-valid: the ledger
refuses any other before the kernel sees it), the runtime identity the job holds or
another.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from tenure.kernel.agent_jobs.commands import AdoptResult, AdvanceJob, AgentJobCommandType, RecordCancelled, SubmitJob
from tenure.kernel.agent_jobs.record import ERROR_REQUIRED, AgentJobRow, AgentJobStep
from tenure.model import TERMINAL_AGENT_JOB_STATUSES, AgentJobStatus

from .pools import BOOLEANS, integers, optional, sampled

__all__ = ["NOW", "JOB_ID", "job_row", "result_for", "job_records", "job_commands", "job_situations"]

NOW = 1_800_000_000_000_000
JOB_ID = "job-1"
RUNTIME_IDS = ["rt-1", "rt-2"]

instants = st.integers(NOW - 3, NOW + 3) | st.integers(NOW - 10**12, NOW + 10**12)


def job_row(**changes: Any) -> AgentJobRow:
    """A queued job of run-1, with ``changes`` applied."""
    fields: dict[str, Any] = dict(
        job_id=JOB_ID, request_id="request-1", run_id="run-1", runtime="reference", profile="default",
        request_json='{"task":"summarize"}', status=AgentJobStatus.QUEUED, result_json=None, runtime_job_id=None,
        created_at_us=NOW - 100, updated_at_us=NOW - 100,
    )
    fields.update(changes)
    return AgentJobRow(**fields)


def result_for(status: AgentJobStatus, job_id: str = JOB_ID, *, contained: bool = False) -> str:
    """A shape-valid result of ``job_id`` ending ``status``."""
    result: dict[str, object] = {"job_id": job_id, "status": status.value}
    if status in ERROR_REQUIRED:
        result["error"] = "runtime said no" if status is not AgentJobStatus.LOST else "start was ambiguous"
    if contained:
        result["contained"] = True
    return json.dumps(result, sort_keys=True, separators=(",", ":"))


@st.composite
def job_records(draw: st.DrawFn, step: AgentJobStep | None = None) -> AgentJobRow | None:
    """A job keeping every invariant (INV-J1 ... INV-J3), or None for ``absent``."""
    if step is None:
        step = draw(sampled(AgentJobStep))
    if step is AgentJobStep.ABSENT:
        return None
    status = AgentJobStatus(step.value)
    created = draw(instants)
    runtime_job_id = None if status is AgentJobStatus.QUEUED else draw(optional(sampled(RUNTIME_IDS)))
    result = None
    if status in TERMINAL_AGENT_JOB_STATUSES:
        result = result_for(status, contained=status is AgentJobStatus.CANCELLED and draw(BOOLEANS))
    return job_row(status=status, result_json=result, runtime_job_id=runtime_job_id, created_at_us=created,
                   updated_at_us=created + draw(integers(0, 10)))


@st.composite
def job_commands(draw: st.DrawFn, kind: AgentJobCommandType, record: AgentJobRow | None) -> object:
    C = AgentJobCommandType
    if kind is C.SUBMIT:
        change = draw(sampled(["same", "same", "request_json", "profile", "runtime", "run_id"]))
        changed = {} if change == "same" else {change: {"request_json": '{"task":"translate"}', "profile": "large",
                                                         "runtime": "other", "run_id": "run-2"}[change]}
        return SubmitJob(row=job_row(created_at_us=0, updated_at_us=0, **changed), run_running=draw(BOOLEANS))
    if kind is C.ADVANCE:
        return AdvanceJob(status=draw(sampled(AgentJobStatus)),
                          runtime_job_id=draw(optional(sampled(RUNTIME_IDS))))
    if kind is C.ADOPT_RESULT:
        status = draw(sampled(AgentJobStatus))
        return AdoptResult(status=status, result_json=result_for(status))
    return RecordCancelled(result_json=result_for(AgentJobStatus.CANCELLED, contained=True))


@st.composite
def job_situations(
    draw: st.DrawFn, step: AgentJobStep | None = None, kind: AgentJobCommandType | None = None
) -> tuple[AgentJobRow | None, object, int]:
    record = draw(job_records(step))
    command = draw(job_commands(kind or draw(sampled(AgentJobCommandType)), record))
    if record is not None and draw(BOOLEANS):
        now = record.updated_at_us + draw(integers(-1, 1))
    else:
        now = draw(instants)
    return record, command, now
