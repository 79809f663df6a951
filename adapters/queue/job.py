"""One claim in flight, as a handler and the worker see it.

:class:`JobContext` is what a handler may know and do about its claim (never its
token); :class:`FailJob` is how it fails its job on purpose; :class:`ClaimInFlight` is
the worker's own record of the claim: its handler task, its local lease deadline (armed
from the send time of the last successful claim or heartbeat) and its fate. What happens
to a claim between its start and its written outcome is the
:class:`~tenure.adapters.queue.runner.JobRunner`'s; the rules are in
:mod:`tenure.adapters.queue.worker`'s docstring.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from tenure.model import ConfigValidationError, QueueClaimFence, QueueKind, check_pid

from .sources import StreamingJobSource, TaskSource

if TYPE_CHECKING:
    from ..core.observers import JobObserver
    from .sources import JobSource

__all__ = ["FailJob", "JobContext", "Handler", "ClaimInFlight", "ClaimRunner", "LOST_DEADLINE", "LOST_HEARTBEAT", "LOST_PROGRESS",
           "LOST_STATE", "LOST_RENEWAL", "LOST_UNRETURNED", "CANCELLED_BY_REQUEST"]

LOST_DEADLINE = "its lease deadline passed with no renewal answered (a stalled database or connection)"
LOST_HEARTBEAT = "a heartbeat was refused (the job was cancelled, or its lease ended and it was taken over)"
LOST_PROGRESS = "a progress report was refused (the job was cancelled, or its lease ended and it was taken over)"
LOST_STATE = "its owned state shows no live claim (the job was cancelled, or its lease ended and it was taken over)"
LOST_RENEWAL = "its claim answered after its lease deadline and the renewal was refused (the lease ended during the stall)"
LOST_UNRETURNED = "its claim answered late, could not be renewed in time and could not be given back"
CANCELLED_BY_REQUEST = "it was cancelled (tenure jobs cancel, the console or the API)"
"""Why a claim was lost: the reason a lease-loss log line gives (a cancel is logged and
counted as a cancel instead: :data:`CANCELLED_BY_REQUEST`)."""


class FailJob(Exception):
    """Raise from a handler to fail the job with this message and an explicit ``retry``
    (default False: finished as failed), and for validation and pipeline jobs an optional
    DLQ correlation ID."""

    def __init__(self, message: str, *, retry: bool = False, dlq_record_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry = retry
        self.dlq_record_id = dlq_record_id



class JobContext:
    """What a handler may know and do about its claim (never its claim token).

    ``queue``, ``job_id``, ``attempt``, ``owner_id`` and ``generation`` are the fence's
    public parts and the claim's attempt number. ``lease_lost`` is set when the claim
    may no longer be this worker's (the handler is cancelled at the same moment).
    ``cancel_requested`` is set for a streaming launch whose owned state shows a cancel
    request (never set on the other queues). For a task, ``task_name`` and
    ``queue_name`` name it, and :meth:`progress` records a progress report.
    """

    __slots__ = ("_job", "queue", "job_id", "attempt", "owner_id", "generation", "lease_lost", "cancel_requested",
                 "task_name", "queue_name")

    def __init__(self, job: ClaimInFlight) -> None:
        fence = job.fence
        self._job = job
        self.queue: QueueKind = fence.queue
        self.job_id: str = fence.job_id
        self.attempt: int = job.claimed.attempt
        self.owner_id: str = fence.owner_id
        self.generation: int = fence.generation
        self.lease_lost = asyncio.Event()
        self.cancel_requested = asyncio.Event()
        task = fence.queue is QueueKind.TASK
        self.task_name: str | None = job.claimed.job.task_name if task else None
        self.queue_name: str | None = job.claimed.job.queue_name if task else None

    async def progress(self, report: dict[str, Any]) -> bool:
        """Tasks: record ``report`` (a JSON object of at most 64 KiB) as this task's
        progress, with the fence. False: the claim is no longer live (``lease_lost`` is
        set and the handler cancelled)."""
        return await self._job.progress(report)

    async def heartbeat_now(self) -> bool:
        """Renew this claim now. False: the claim is no longer live (``lease_lost`` is
        set and the handler cancelled). A database failure raises ``TenureError``
        (the claim's deadline stays as it was)."""
        return await self._job.heartbeat_now()

    async def set_pid(self, pid: int) -> bool:
        """Streaming launches: record the launched process's PID with the fence. False:
        refused (a cancel request stands, then ``cancel_requested`` is set; or the claim
        is no longer live, then ``lease_lost`` is set)."""
        return await self._job.set_pid(pid)

    def __repr__(self) -> str:
        return f"JobContext(queue={self.queue.value!r}, attempt={self.attempt}, generation={self.generation})"


Handler = Callable[[Any, JobContext], Awaitable[Any]]
"""A handler: ``await handler(claimed, context)``."""


class ClaimRunner(Protocol):
    """What a claim in flight asks of the runner that holds it
    (:class:`~tenure.adapters.queue.runner.JobRunner` is one; a protocol, so this room
    does not import the runner's, which imports it)."""

    source: JobSource[Any]

    def arrived_late(self, sent_at: float) -> bool:
        """Whether a claim sent at ``sent_at`` (the loop's clock) arrived past its lease."""

    def lease_lost(self, job: ClaimInFlight) -> None:
        """``job``'s lease is lost: stop its handler and report it."""

    async def observe_streaming(self, job: ClaimInFlight) -> None:
        """Read a streaming claim's owned state (a cancel request, a lost claim)."""


class ClaimInFlight:
    """One claim in flight: its handler task, its lease deadline and its fate."""

    def __init__(self, runner: ClaimRunner, claimed: Any, sent_at: float) -> None:
        fence = claimed.claim_fence
        assert type(fence) is QueueClaimFence  # owned claims always carry one
        self.runner = runner
        self.claimed = claimed
        self.fence: QueueClaimFence = fence
        self.context = JobContext(self)
        self.task: asyncio.Task[None] | None = None
        self.handler: asyncio.Task[Any] | None = None
        self.lost = False
        self.holds_slot = True
        """Its handler counts against the worker's concurrency (until it ends)."""
        self.ended = False
        """Its task finished: nothing about it changes any more."""
        self.settling = False
        """Its outcome is being written: a heartbeat answered False may be that write."""
        self.observed: JobObserver | None = None
        """Its observer, when the worker has one (``metrics``)."""
        self.answered = False
        """A fenced write of its outcome was answered (applied or refused)."""
        self.loss_counted = False
        self.loss_reason = LOST_DEADLINE
        self.shown_error: BaseException | None = None
        """The handler's exception as logs and observers see it
        (:func:`~tenure.adapters.core.failure_text.loggable_exception`)."""
        self._timer: asyncio.TimerHandle | None = None
        self.confirming = runner.arrived_late(sent_at)
        """Its claim answered too late to start the handler: a renewal decides first."""
        if not self.confirming:
            self.renewed(sent_at)

    def renewed(self, sent_at: float) -> None:
        """A claim or heartbeat sent at ``sent_at`` (loop time) succeeded: the database's
        lease runs at least until ``sent_at`` + lease."""
        if self.lost or self.ended:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(sent_at + self.runner.source.config.lease_seconds, self.lose, LOST_DEADLINE)

    def lose(self, reason: str) -> None:
        """The lease may have ended: never write, stop the handler at once. Counted and
        logged now, or, while its outcome is being written, once that write is known not
        to have been answered (an answer counts as what it says)."""
        if self.lost or self.ended:
            return
        self.lost = True
        self.loss_reason = reason
        self.context.lease_lost.set()
        self.stop_timer()
        if self.handler is not None and not self.handler.done():
            self.handler.cancel()
        if not self.settling:
            self.runner.lease_lost(self)

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def heartbeat_now(self) -> bool:
        if self.lost:
            return False
        sent = asyncio.get_running_loop().time()
        renewed = await self.runner.source.heartbeat_owned(self.fence)
        if renewed:
            self.renewed(sent)
        else:
            self.lose(LOST_HEARTBEAT)
        return renewed

    async def progress(self, report: dict[str, Any]) -> bool:
        source = self.runner.source
        if not isinstance(source, TaskSource):
            raise ConfigValidationError("invalid_queue", fields=("queue",), problems=("tasks_only",))
        if self.lost:
            return False
        if await source.progress_owned(self.fence, report):
            return True
        self.lose(LOST_PROGRESS)
        return False

    async def set_pid(self, pid: int) -> bool:
        source = self.runner.source
        if not isinstance(source, StreamingJobSource):
            raise ConfigValidationError("invalid_queue", fields=("queue",), problems=("streaming_only",))
        checked = check_pid(pid)
        if self.lost:
            return False
        if await source.set_pid_owned(self.fence, checked):
            return True
        await self.runner.observe_streaming(self)
        return False
