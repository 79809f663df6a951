"""The delegated jobs table, ``tenure_agent_jobs`` (schema step ``runs_v1``): one row per job a
Run delegated to an agent runtime, keyed by an ID derived from its request ID. CHECK
constraints tie a stored result to a terminal status."""

from __future__ import annotations

import functools

from sqlalchemy import DateTime, String, Text

from tenure.kernel.agent_jobs.machine import AGENT_JOBS
from tenure.kernel.agent_jobs.record import AgentJobRow
from tenure.model import AgentJobStatus

from ..core.tables import Binding, Codec, IndexSpec, MachineTables, Step, TableSpec, column, one_of

__all__ = ["AGENT_JOBS_TABLE", "AGENT_JOBS_BINDING", "MACHINE_TABLES"]

C = Codec
_STEP = Step("runs_v1", 3)
"""The Run machine's first step, which creates the owners' tables with the Runs'."""
_INSTANT = DateTime(timezone=True)
_column = functools.partial(column, step=_STEP)


_OPEN_JOB = "status IN ('queued', 'admitted', 'preparing', 'running')"

AGENT_JOBS_TABLE = TableSpec(
    "tenure_agent_jobs",
    (
        _column("job_id", C.TEXT, String(36), mutable=False, primary_key=True),
        _column("request_id", C.TEXT, String(128), mutable=False),
        _column("run_id", C.TEXT, String(36), mutable=False),
        _column("runtime", C.TEXT, String(128), mutable=False),
        _column("profile", C.TEXT, String(128), mutable=False),
        _column("request_json", C.TEXT, Text(), mutable=False),
        _column("status", C.ENUM, String(32), mutable=True, choices=AgentJobStatus),
        _column("result_json", C.OPTIONAL_TEXT, Text(), mutable=True),
        _column("runtime_job_id", C.OPTIONAL_TEXT, String(128), mutable=True),
        _column("created_at", C.INSTANT, _INSTANT, mutable=False, field="created_at_us"),
        _column("updated_at", C.INSTANT, _INSTANT, mutable=True, field="updated_at_us"),
    ),
    indexes=(
        IndexSpec("ux_tenure_agent_jobs_request", ("request_id",), unique=True, step=_STEP),
        IndexSpec("ix_tenure_agent_jobs_run", ("run_id", "status"), step=_STEP),
    ),
    created_by=_STEP,
    checks=(
        ("ck_tenure_agent_jobs_status", one_of("status", AgentJobStatus)),
        ("ck_tenure_agent_jobs_result", f"({_OPEN_JOB} AND result_json IS NULL) OR "
                                        f"(NOT {_OPEN_JOB} AND result_json IS NOT NULL)"),
    ),
)

AGENT_JOBS_BINDING = Binding("agent_jobs", AGENT_JOBS, AGENT_JOBS_TABLE, AgentJobRow, {}, "job_id")

MACHINE_TABLES = MachineTables(machine=AGENT_JOBS, tables=(AGENT_JOBS_TABLE,), bindings=(AGENT_JOBS_BINDING,))
"""The delegated-job machine's table (removed with runs_v1, whose guard keeps every Run)."""
