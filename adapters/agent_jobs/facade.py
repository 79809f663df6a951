"""Delegated jobs on a Run ledger's database (the agent job machine,
``specs/agent_jobs.md``): ``RunLedger.jobs``.

A RUNNING Run delegates work to an agent runtime once per request ID (the job's ID is
derived from it, so a replay meets the stored job); the runtime's progress, its one
result and a containment proven by the runtime are each one kernel decision with the
engine's compare-and-set. A Run waiting on a job resumes through the Run ledger
(``RunLedger.resume``), never from here.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from tenure.kernel.agent_jobs import finders as job_finders
from tenure.kernel.agent_jobs.commands import AdoptResult, AdvanceJob, RecordCancelled, SubmitJob
from tenure.kernel.agent_jobs.record import AgentJobRow, result_problem
from tenure.kernel.core import Applied
from tenure.kernel.runs import finders
from tenure.kernel.runs.record import opens_owners
from tenure.model import (
    TERMINAL_AGENT_JOB_STATUSES,
    AgentJobRecord,
    AgentJobStatus,
    canonical_json,
)
from tenure.model.runs import check_run_id, check_text
from tenure.model.validation import micros_to_datetime, refuse

from ..core.engine import raise_if_conflict
from ..core.failures import persistence_failed
from ..core.facade import Transactions, json_text, parsed_json
from ..core.store import Transaction
from ..runs.table import RUNS_BINDING
from .table import AGENT_JOBS_BINDING

__all__ = ["AgentJobs", "AGENT_JOB_NAMESPACE", "job_id_for", "cancelled_result", "public_job"]

AGENT_JOB_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "tenure:agent-job")


def job_id_for(request_id: str) -> str:
    """The job ID a delegated job with ``request_id`` gets."""
    return str(uuid.uuid5(AGENT_JOB_NAMESPACE, request_id))


def cancelled_result(job_id: str) -> str:
    """The result ``record_cancelled`` stores: containment returned."""
    return canonical_json({"job_id": job_id, "status": AgentJobStatus.CANCELLED.value, "contained": True})



def public_job(row: AgentJobRow) -> AgentJobRecord:
    return AgentJobRecord(
        job_id=row.job_id, request_id=row.request_id, run_id=row.run_id, runtime=row.runtime, profile=row.profile,
        status=row.status, request=parsed_json(row.request_json), result=parsed_json(row.result_json),
        runtime_job_id=row.runtime_job_id, created_at=micros_to_datetime(row.created_at_us),
        updated_at=micros_to_datetime(row.updated_at_us),
    )


class AgentJobs:
    """The delegated jobs of one Run ledger's database, on the ledger's connections."""

    def __init__(self, transactions: Transactions) -> None:
        self._tx = transactions

    async def submit(self, run_id: str, *, request_id: str, runtime: str, profile: str, request: Any) -> AgentJobRecord:
        """Record a delegated job of a RUNNING Run, once per ``request_id``: the same request
        again returns the stored job; changed content raises JOB_REQUEST_CONFLICT; a Run
        that is missing or not RUNNING raises RUN_OWNER_MISMATCH."""
        key = check_run_id(run_id)
        request_key = check_text(request_id, "request_id")
        job_id = job_id_for(request_key)
        row = AgentJobRow(
            job_id=job_id, request_id=request_key, run_id=key, runtime=check_text(runtime, "runtime"),
            profile=check_text(profile, "profile"), request_json=json_text(request, "request"),
            status=AgentJobStatus.QUEUED, result_json=None, runtime_job_id=None, created_at_us=0, updated_at_us=0,
        )
        engine = self._tx.engine

        async def body(tx: Transaction) -> AgentJobRow:
            await tx.lock_name(f"tenure:agent-job:{job_id}")
            runs = await tx.locked(RUNS_BINDING, finders.runs_opening_owners, {"keys": [key]})
            running = bool(runs) and opens_owners(runs[0])
            jobs = await tx.locked(AGENT_JOBS_BINDING, job_finders.jobs_by_keys, {"keys": [job_id]})
            met = jobs[0] if jobs else None
            decision = await engine.decide_one(tx, AGENT_JOBS_BINDING, met, SubmitJob(row=row, run_running=running))
            raise_if_conflict(AGENT_JOBS_BINDING, decision)
            if not isinstance(decision, Applied) or not isinstance(decision.new_record, AgentJobRow):
                raise persistence_failed("invariant_broken")
            return decision.new_record

        return public_job(await self._tx.run(body))

    async def _command(self, job_id: object, command: Any) -> bool:
        key = check_text(job_id, "job_id", 36)
        async with self._tx.errors():
            decisions = await self._tx.engine.on_keys(AGENT_JOBS_BINDING, [(key, command)], job_finders.jobs_by_keys,
                                                      raise_conflicts=True)
        return isinstance(decisions[0], Applied)

    async def advance(self, job_id: str, status: AgentJobStatus, *, runtime_job_id: str | None = None) -> bool:
        """Move an open job one step on (ADMITTED, PREPARING, RUNNING), recording the
        runtime's job identity once (a different one raises JOB_REQUEST_CONFLICT)."""
        if status not in (AgentJobStatus.ADMITTED, AgentJobStatus.PREPARING, AgentJobStatus.RUNNING):
            raise refuse("status", "open_status_required")
        identity = None if runtime_job_id is None else check_text(runtime_job_id, "runtime_job_id")
        return await self._command(job_id, AdvanceJob(status=status, runtime_job_id=identity))

    async def adopt_result(self, job_id: str, result: Any) -> bool:
        """Adopt a job's one result: a JSON object whose ``job_id`` is this job and whose
        ``status`` is terminal (succeeded carries no ``error``; failed, timed_out and
        lost carry one). False when the job already ended. An ambiguous start (the
        runtime may have begun) is adopted ``lost``, never ``failed``."""
        key = check_text(job_id, "job_id", 36)
        text = json_text(result, "result")
        # Compared only as text: a status of any other JSON type (a list, an object) is
        # not hashable and is simply not a terminal status.
        terminal = {member.value: member for member in TERMINAL_AGENT_JOB_STATUSES}
        stated = result.get("status") if type(result) is dict else None
        status = terminal.get(stated) if type(stated) is str else None
        if type(result) is not dict:
            problem: str | None = "json_object_required"
        else:
            problem = "result_status_mismatch" if status is None else result_problem(result, key, status)
        if problem is not None:
            raise refuse("result", problem)
        return await self._command(key, AdoptResult(status=status, result_json=text))  # type: ignore[arg-type]

    async def record_cancelled(self, job_id: str) -> bool:
        """Record CANCELLED for an open or LOST job, after the runtime's containment
        operation returned (never before: LOST is not evidence that anything stopped)."""
        key = check_text(job_id, "job_id", 36)
        return await self._command(key, RecordCancelled(result_json=cancelled_result(key)))

    async def get(self, job_id: str) -> AgentJobRecord | None:
        key = check_text(job_id, "job_id", 36)

        async def body(tx: Transaction) -> list[AgentJobRow]:
            return await tx.read(AGENT_JOBS_BINDING, [key])

        found = await self._tx.run(body, write=False)
        return public_job(found[0]) if found else None

    async def list(self, run_id: str) -> Sequence[AgentJobRecord]:
        """Every delegated job of a Run that is open or LOST (what blocks its containment)."""
        key = check_run_id(run_id)

        async def body(tx: Transaction) -> list[AgentJobRow]:
            return await tx.find(AGENT_JOBS_BINDING, finders.open_jobs_of_run, {"run_id": key})

        return tuple(public_job(row) for row in await self._tx.run(body, write=False))
