"""Typed entry points to the delegated-job kernel's ``decide``, one per command, carrying
its contract (checked by CrossHair: ``.ci/crosshair_kernel.py check --analysis_kind=PEP316
--per_condition_timeout=...``; see :mod:`tenure.kernel.queue.contracts` for why one per
command).

The shared postcondition is the list of transition rules (TR-J1 ... TR-J3 in
``specs/agent_jobs.md``); each command adds the guarantee it is for: a job is created
only for a RUNNING Run and a replay never changes it, an advance moves one step of an
open job, a result is adopted only by an open job, and only containment ends a LOST one.
"""

from __future__ import annotations

# Names used only inside the pre/post lines below: CrossHair evaluates those lines in
# this module's namespace (tests/kernel/test_contracts.py fails if one goes missing).
from tenure.model import TERMINAL_AGENT_JOB_STATUSES, AgentJobStatus  # noqa: F401
from tenure.model.bounds import MIN_INSTANT_US  # noqa: F401

from ..core import Decision, Refused  # noqa: F401
from ..queue.commands import MAX_NOW_US  # noqa: F401
from .commands import AdoptResult, AdvanceJob, RecordCancelled, SubmitJob
from .machine import NEXT_STATUS, AGENT_JOBS, transition_violations  # noqa: F401
from .record import AgentJobRow

__all__ = ["decide_submit_job", "decide_advance_job", "decide_adopt_result", "decide_record_cancelled"]


def decide_submit_job(record: AgentJobRow | None, command: SubmitJob, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (command.run_running if record is None else __return__.new_record == record)
    """
    return AGENT_JOBS.decide(record, command, now_us)


def decide_advance_job(record: AgentJobRow | None, command: AdvanceJob, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or NEXT_STATUS.get(record.status) is __return__.new_record.status
    """
    return AGENT_JOBS.decide(record, command, now_us)


def decide_adopt_result(record: AgentJobRow | None, command: AdoptResult, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (record.status not in TERMINAL_AGENT_JOB_STATUSES and __return__.new_record.status is command.status)
    """
    return AGENT_JOBS.decide(record, command, now_us)


def decide_record_cancelled(record: AgentJobRow | None, command: RecordCancelled, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (__return__.new_record.status is AgentJobStatus.CANCELLED and (record.status is AgentJobStatus.LOST or record.status not in TERMINAL_AGENT_JOB_STATUSES))
    """
    return AGENT_JOBS.decide(record, command, now_us)
