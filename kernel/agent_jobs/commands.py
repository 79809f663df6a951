"""Delegated-job commands and replies: what a caller may ask of the machine, and what an applied command answers."""

from __future__ import annotations

import dataclasses
import enum
from typing import ClassVar

from tenure.model import AgentJobStatus

from .record import AgentJobRow

__all__ = ["Ack", "AdoptResult", "AdvanceJob", "AgentJobCommand",
           "AgentJobCommandType", "RecordCancelled", "SubmitJob", "Submitted"]


class AgentJobCommandType(enum.Enum):
    SUBMIT = "submit"
    ADVANCE = "advance"
    ADOPT_RESULT = "adopt_result"
    RECORD_CANCELLED = "record_cancelled"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SubmitJob:
    kind: ClassVar[AgentJobCommandType] = AgentJobCommandType.SUBMIT
    row: AgentJobRow
    run_running: bool
    """Observed under the Run's lock: the Run exists and is RUNNING."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AdvanceJob:
    kind: ClassVar[AgentJobCommandType] = AgentJobCommandType.ADVANCE
    status: AgentJobStatus
    """ADMITTED, PREPARING or RUNNING."""
    runtime_job_id: str | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AdoptResult:
    kind: ClassVar[AgentJobCommandType] = AgentJobCommandType.ADOPT_RESULT
    status: AgentJobStatus
    """The result's terminal status (checked against the result at the ledger)."""
    result_json: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecordCancelled:
    """The runtime's containment of this job returned."""

    kind: ClassVar[AgentJobCommandType] = AgentJobCommandType.RECORD_CANCELLED
    result_json: str
    """The synthetic cancelled result the ledger wrote for this job."""


AgentJobCommand = SubmitJob | AdvanceJob | AdoptResult | RecordCancelled


@dataclasses.dataclass(frozen=True, slots=True)
class Submitted:
    replayed: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    """The exact change applied."""
