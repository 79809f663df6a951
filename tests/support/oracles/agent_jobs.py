"""The machine under test for the delegated job (``specs/agent_jobs.md``): its guard glossary written
again, independently of the kernel, and what the shared table, oracle, property and
mutant tests need of it (``tests/support/machines.py`` reads ``UNDER_TEST``)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from machines import MachineUnderTest
from tenure.conformance.strategies.agent_jobs import job_situations
from tenure.kernel import AGENT_JOBS
from tenure.kernel.agent_jobs.commands import AgentJobCommandType
from tenure.kernel.agent_jobs.record import AgentJobStep

# --- the delegated-job machine's guards, from specs/agent_jobs.md's glossary ----------------

_JOB_STEPS = ["queued", "admitted", "preparing", "running"]


def _next_job_step(status: str) -> str | None:
    position = _JOB_STEPS.index(status) if status in _JOB_STEPS else len(_JOB_STEPS)
    return _JOB_STEPS[position + 1] if position + 1 < len(_JOB_STEPS) else None


def _result(name: str) -> Callable[[Any, Any, int], bool]:
    return lambda r, c, n: c.status.value == name


AGENT_JOB_ORACLE_GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda r, c, n: True,
    "run_not_running": lambda r, c, n: c.run_running is False,
    "request_differs": lambda r, c, n: any(
        getattr(r, field) != getattr(c.row, field) for field in ("run_id", "runtime", "profile", "request_json")
    ),
    "identity_differs": lambda r, c, n: r.runtime_job_id is not None and c.runtime_job_id is not None
    and r.runtime_job_id != c.runtime_job_id,
    "same_status": lambda r, c, n: c.status == r.status,
    "next_status": lambda r, c, n: _next_job_step(r.status.value) == c.status.value,
    "result_succeeded": _result("succeeded"),
    "result_failed": _result("failed"),
    "result_cancelled": _result("cancelled"),
    "result_timed_out": _result("timed_out"),
    "result_lost": _result("lost"),
}


def _job_state(record: Any) -> enum.Enum:
    return AgentJobStep.ABSENT if record is None else AgentJobStep(record.status.value)


UNDER_TEST = MachineUnderTest(
    name="agent_jobs",
    machine=AGENT_JOBS,
    situations=lambda state=None, kind=None: job_situations(state, kind),
    terminal=frozenset({AgentJobStep.SUCCEEDED, AgentJobStep.FAILED, AgentJobStep.CANCELLED,
                        AgentJobStep.TIMED_OUT, AgentJobStep.LOST}),
    live=frozenset({AgentJobStep.QUEUED, AgentJobStep.ADMITTED, AgentJobStep.PREPARING, AgentJobStep.RUNNING}),
    # LOST is terminal for adoption, not proof that anything stopped: only the
    # runtime's containment returning records LOST -> CANCELLED.
    terminal_exit_allowed=lambda state, command, rule: state is AgentJobStep.LOST
    and command is AgentJobCommandType.RECORD_CANCELLED and rule.target is AgentJobStep.CANCELLED,
    state_of_record=_job_state,
    oracle_guards=AGENT_JOB_ORACLE_GUARDS,
)
