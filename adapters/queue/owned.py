"""The owned capabilities of the job sources, as runtime-checkable protocols.

Each protocol lists exactly the owned methods its source offers, so that code written
against the capability (a worker runtime, a test double, another implementation) can be
typed and checked without naming a concrete class. ``isinstance`` checks the methods'
presence only (a Python protocol cannot check signatures): the validation and pipeline
protocols list the same methods, so a source satisfies both; tell them apart by the
source's ``queue``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from tenure.model import (
    ClaimedJob,
    ClaimedPipelineJob,
    ClaimedStreamingJob,
    OwnedStreamingState,
    QueueClaimFence,
    QueueKind,
)

__all__ = ["OwnedValidationJobSource", "OwnedPipelineJobSource", "OwnedStreamingJobSource"]


Claimed = TypeVar("Claimed")


class _OwnedJobSource(Protocol[Claimed]):
    """The owned methods every source offers, claims typed by its envelope."""

    queue: QueueKind

    def submit_owned(self, job: Any, *, submission_id: str) -> Awaitable[str]: ...

    async def claim_next_owned(self, worker_id: str, *, claim_token: str) -> Claimed | None: ...

    async def claim_batch_owned(self, worker_id: str, *, claim_tokens: Sequence[str]) -> list[Claimed]: ...

    async def recover_owned_claim(self, worker_id: str, *, claim_token: str) -> Claimed | None: ...

    async def heartbeat_owned(self, fence: QueueClaimFence) -> bool: ...

    async def heartbeat_many_owned(self, fences: Sequence[QueueClaimFence]) -> list[bool]: ...

    async def complete_owned(self, fence: QueueClaimFence, result: Any = None) -> bool: ...

    async def complete_many_owned(self, items: Sequence[tuple[QueueClaimFence, Any]]) -> list[bool]: ...

    async def release_owned(self, fence: QueueClaimFence, *, delay_s: float = 0) -> bool: ...

    async def release_many_owned(self, fences: Sequence[QueueClaimFence], *, delay_s: float = 0) -> list[bool]: ...

    async def close(self) -> None: ...


@runtime_checkable
class OwnedValidationJobSource(_OwnedJobSource[ClaimedJob], Protocol):
    """Owned submission, fenced claims and fenced writes on the validation queue."""

    async def fail_owned(
        self, fence: QueueClaimFence, error: str, *, retry: bool, dlq_record_id: str | None = None
    ) -> bool: ...


@runtime_checkable
class OwnedPipelineJobSource(_OwnedJobSource[ClaimedPipelineJob], Protocol):
    """The same owned capabilities on the pipeline queue (``submit_owned`` answers the
    run ID; claims carry ``run_id``; fences carry the job ID)."""

    async def fail_owned(
        self, fence: QueueClaimFence, error: str, *, retry: bool, dlq_record_id: str | None = None
    ) -> bool: ...


@runtime_checkable
class OwnedStreamingJobSource(_OwnedJobSource[ClaimedStreamingJob], Protocol):
    """Owned launches on the streaming queue, with the streaming calls: the launched
    process's PID, the cancel-request snapshot, the cancel acknowledgement, and the
    administrative cancel request (failures carry no DLQ correlation)."""

    async def fail_owned(self, fence: QueueClaimFence, error: str, *, retry: bool) -> bool: ...

    async def set_pid_owned(self, fence: QueueClaimFence, pid: int) -> bool: ...

    async def get_owned_state(self, fence: QueueClaimFence) -> OwnedStreamingState | None: ...

    async def acknowledge_cancel_owned(self, fence: QueueClaimFence) -> bool: ...

    async def request_cancel(self, job_id: str) -> bool: ...
