"""A claim's life in the worker, from its start to its written outcome.

:class:`JobRunner` runs each claim of one :class:`~tenure.adapters.queue.worker.Worker`:
it confirms a claim answered late, runs the handler (its ``SystemExit``,
``KeyboardInterrupt`` or own ``CancelledError`` made a failure of its attempt), turns
what the handler returned or raised into an outcome, writes that outcome with the
claim's fence (repeating database failures while the lease may be live), and counts
and logs what became of it. What the claims share lives here too: the source, the
handler, the stats, the outage log, the batchers of completions and renewals, and the
claims held. The rules are in :mod:`tenure.adapters.queue.worker`'s docstring; every
line is logged on the worker's logger, ``tenure.adapters.queue.worker``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tenure.model import ConfigValidationError, JobStatus, QueueClaimFence, QueueKind, TenureError

from ..core.failure_text import error_bytes, exception_text, loggable_exception
from ..core.text import clean_text
from ..core.outages import OutageLog
from .batcher import Batcher
from .job import CANCELLED_BY_REQUEST, LOST_RENEWAL, LOST_STATE, LOST_UNRETURNED, ClaimInFlight, FailJob, Handler, JobContext
from .sources import JobSource, StreamingJobSource

if TYPE_CHECKING:
    from ..core.observers import WorkerObserver

__all__ = ["JobRunner", "WorkerStats", "LATE_CLAIM_RENEWALS", "MAX_WRITE_BACKOFF_S",
           "FIRST_WRITE_BACKOFF_S"]

log = logging.getLogger("tenure.adapters.queue.worker")

FIRST_WRITE_BACKOFF_S = 0.05
"""The first pause before a fenced write (or a late claim's renewal) that failed for a
database reason is repeated; it doubles up to :data:`MAX_WRITE_BACKOFF_S`."""

MAX_WRITE_BACKOFF_S = 1.0
"""The longest pause between repeats of a fenced write that failed for a database reason."""

LATE_CLAIM_RENEWALS = 3
"""Renewals tried for a claim whose answer arrived late (see ``Worker._arrived_late``)
before it is given back: each renewal that answers late again (the database is still
stalled) is tried once more."""


@dataclasses.dataclass
class WorkerStats:
    """What a Worker did so far (counts; updated as it runs)."""

    claimed: int = 0
    """Claims taken (including claims recovered after an unacknowledged commit)."""
    completed: int = 0
    """Jobs completed by this worker's fenced write."""
    failed: int = 0
    """Jobs this worker finished as failed (no retry left, or ``retry=False``)."""
    retried: int = 0
    """Failures the kernel sent back to pending for another attempt."""
    cancels_acknowledged: int = 0
    """Streaming launches stopped on a cancel request and acknowledged."""
    stale_writes_refused: int = 0
    """Fenced writes of an outcome answered False: the claim was no longer this worker's
    (also when the answer arrived after the local lease deadline)."""
    cancelled: int = 0
    """Claims cancelled while their handlers ran (``tenure jobs cancel``, the console, the
    API), found by the cancel watch: the handler cancelled, nothing written, logged at
    INFO with the job ID. Not counted as lease losses."""
    lease_losses: int = 0
    """Claims this worker lost while it held them, with nothing written: the handler
    cancelled (or never started, for a late claim whose renewal was refused), or the
    outcome's write never answered before the local deadline. Each is logged at WARNING.
    A write that did answer counts as its answer instead (completed, ..., or a stale
    write refused)."""
    released: int = 0
    """Claims given back (``release_owned``): pending again at once, their attempt
    returned. Those whose handlers were stopped at shutdown, and late claims that could
    not be renewed in time."""
    abandoned: int = 0
    """Claims whose handlers were stopped at shutdown and that could not be given back
    (the handler ignored its cancellation, or the release was refused or failed): left to
    expire."""
    persistence_failures: int = 0
    """Calls that raised a database failure (each was repeated, recovered or left to expire)."""
    unreadable: int = 0
    """Jobs this worker's claims met but could not read (written outside tenure): set aside
    or failed, never handed to the handler (each also logged with its job ID; workers
    sharing one source count what any of their claims met meanwhile)."""


class _HandlerRaised(Exception):
    """Carries a handler's ``SystemExit``, ``KeyboardInterrupt`` or own ``CancelledError``
    out of its task as an ordinary failure: asyncio re-raises the first two out of the
    event loop, which would stop the worker (and every other job with it), and the last
    would look like the worker's own cancellation. (Any other ``BaseException``, such as
    ``GeneratorExit``, already ends the task as its exception.)"""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(type(raised).__name__)
        self.raised = raised


@dataclasses.dataclass(frozen=True, slots=True)
class _Outcome:
    """What a finished handler asks to write."""

    kind: str  # "complete" | "fail"
    result: Any = None
    error: str = ""
    retry: bool = True
    dlq_record_id: str | None = None
    raised: BaseException | None = None
    """The handler's exception (logged with its traceback once the outcome is written)."""


class JobRunner:
    """Runs the claims of one Worker, each from its start to its written outcome, and
    holds what they share (see the module docstring)."""

    def __init__(self, source: JobSource[Any], handler: Handler, *, worker_id: str, store_error_text: bool,
                 metrics: WorkerObserver[JobContext] | None, stats: WorkerStats) -> None:
        self.source = source
        self.handler = handler
        self.worker_id = worker_id
        self.store_error_text = store_error_text
        self.metrics = metrics
        self.stats = stats
        self.outage = OutageLog(log, "the database", fields={"worker_id": worker_id})
        # Keyed by the claim, not the job ID: the same job claimed again (sent back, then
        # claimed by this worker before its first attempt's write returned) is another
        # entry, which the first attempt's end must not remove.
        self.jobs: dict[QueueClaimFence, ClaimInFlight] = {}
        """Claims held: handlers running, or outcomes being written."""
        self.running = 0
        """Handlers running (what the worker's ``concurrency`` bounds)."""
        self.settled = 0
        """Jobs whose outcome write ended (idle detection compares it)."""
        self.slot_freed = asyncio.Event()
        """Set when a handler ends or a claim ends: a slot may be free."""
        self.completions = Batcher(self._complete_many)
        self.renewals = Batcher(self._renew_many)
        lease = source.config.lease_seconds
        self._late_margin_s = min(source.config.heartbeat_seconds, lease / 2)
        """A claim or renewal answered with less than this left of its local lease is
        late: the next heartbeat round might come after its deadline."""

    def start(self, claimed: Any, sent_at: float) -> None:
        """Hold a claim answered at ``sent_at`` (loop time) and start its task."""
        job = ClaimInFlight(self, claimed, sent_at)
        if self.metrics is not None:
            job.observed = self.metrics.job_claimed(claimed, job.context)
        self.jobs[job.fence] = job
        self.running += 1
        self.stats.claimed += 1
        job.task = asyncio.create_task(self._execute(job))

    def _handler_ended(self, job: ClaimInFlight) -> None:
        """The job's handler no longer runs: its slot is free while its outcome is
        written (so the next claim overlaps that write)."""
        if job.holds_slot:
            job.holds_slot = False
            self.running -= 1
            self.slot_freed.set()

    async def _execute(self, job: ClaimInFlight) -> None:
        try:
            try:
                outcome = await self._handle(job) if not job.confirming or await self._confirm(job) else None
            finally:
                self._handler_ended(job)
            if outcome is not None and not job.lost:
                job.settling = True
                if job.observed is not None:
                    job.observed.settle_started()
                await self._settle(job, outcome)
        except ConfigValidationError as error:  # the source was closed under the worker
            log.error("a job's write was refused: %s; its claim is left to expire", error.reason)
        except Exception:  # noqa: BLE001 - a defect must not kill the worker; the claim expires
            log.exception("a job ended with an unexpected error; its claim is left to expire")
        finally:
            if job.lost and not job.answered:
                self.lease_lost(job)  # lost while its outcome was being written, and never answered
            job.ended = True
            job.stop_timer()
            self.jobs.pop(job.fence, None)
            self.settled += 1
            self.slot_freed.set()
            if job.observed is not None:
                job.observed.finished()

    def arrived_late(self, sent_at: float) -> bool:
        """Whether an answer to a claim or renewal sent at ``sent_at`` (loop time) arrives
        with less than ``min(heartbeat_seconds, lease_seconds / 2)`` of its local lease
        left (or none): the database may still hold the claim (its lease started when
        the statement ran, after any lock wait), but the local deadline, armed from the
        send time to stay safe, may pass before the next heartbeat round renews it."""
        deadline = sent_at + self.source.config.lease_seconds
        return asyncio.get_running_loop().time() > deadline - self._late_margin_s

    async def _confirm(self, job: ClaimInFlight) -> bool:
        """A claim that answered late: let the database decide before the handler runs.
        A fenced renewal is sent at once; renewed and answered in time, the deadline is
        armed from the renewal's send time and the handler runs (True). Refused, the lease
        ended during the stall: the loss is logged and counted. Renewed but late again
        (the stall goes on), or failed for a database reason, it is tried again, up to
        :data:`LATE_CLAIM_RENEWALS` times; then the claim is given back (pending at once,
        its attempt returned) rather than left to expire with its attempt spent."""
        delay = FIRST_WRITE_BACKOFF_S
        for _ in range(LATE_CLAIM_RENEWALS):
            sent = asyncio.get_running_loop().time()
            try:
                renewed = await self.renewals.submit(job.fence)
            except ConfigValidationError:
                raise
            except TenureError as error:
                self.failed_call("heartbeat", error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_WRITE_BACKOFF_S)
                continue
            self.outage.answered()
            if not renewed:
                job.lose(LOST_RENEWAL)
                return False
            if not self.arrived_late(sent):
                job.confirming = False
                job.renewed(sent)
                log.info("job %s (%s, attempt %d): its claim answered after its lease deadline; renewed, it runs",
                         job.context.job_id, self._where(job), job.context.attempt,
                         extra=self._fields(job, "late claim renewed"))
                return True
        await self._give_back_late(job)
        return False

    async def _give_back_late(self, job: ClaimInFlight) -> None:
        context = job.context
        try:
            [given_back] = await self.source.release_many_owned([job.fence])
        except ConfigValidationError:
            raise
        except TenureError as error:
            self.failed_call("release", error)
            given_back = False
        if not given_back:
            job.lose(LOST_UNRETURNED)
            return
        job.ended = True  # nothing more happens to it: no timer, no heartbeat
        self.stats.released += 1
        if job.observed is not None:
            job.observed.released()
        log.warning("job %s (%s, attempt %d): its claim answered late and could not be renewed in time; "
                    "given back (pending again, its attempt returned)", context.job_id, self._where(job),
                    context.attempt, extra=self._fields(job, "given back"))

    def lease_lost(self, job: ClaimInFlight) -> None:
        """Count and log a lost claim, once: nothing is written for it."""
        if job.loss_counted:
            return
        job.loss_counted = True
        context = job.context
        if job.loss_reason is CANCELLED_BY_REQUEST:
            self.stats.cancelled += 1
            log.info("job %s (%s, attempt %d) cancelled while it ran: its handler is cancelled; nothing is written "
                     "for it", context.job_id, self._where(job), context.attempt, extra=self._fields(job, "cancelled"))
            return
        self.stats.lease_losses += 1
        if job.observed is not None:
            job.observed.lease_lost()
        log.warning("job %s (%s, attempt %d) lease lost: %s; nothing is written for it", context.job_id,
                    self._where(job), context.attempt, job.loss_reason, extra=self._fields(job, "lease lost"))

    def _fields(self, job: ClaimInFlight, outcome: str) -> dict[str, Any]:
        """The ``extra`` fields of a line about ``job``."""
        context = job.context
        fields: dict[str, Any] = {"job_id": context.job_id, "queue": context.queue_name or context.queue.value,
                                  "attempt": context.attempt, "generation": context.generation,
                                  "worker_id": self.worker_id, "outcome": outcome}
        if context.task_name is not None:
            fields["task"] = context.task_name
        return fields

    @staticmethod
    def _where(job: ClaimInFlight) -> str:
        context = job.context
        if context.task_name is not None:
            return f"task {context.task_name} on queue {context.queue_name}"
        return f"{context.queue.value} queue"

    async def _guarded(self, job: ClaimInFlight) -> Any:
        """The handler, with its ``SystemExit``, ``KeyboardInterrupt`` or own
        ``CancelledError`` made a failure of its attempt (see :class:`_HandlerRaised`);
        the worker's own cancellation (of this task: the lease was lost, or the worker
        stops) passes as it is."""
        try:
            return await self.handler(job.claimed, job.context)
        except asyncio.CancelledError as error:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            raise _HandlerRaised(error) from None
        except (SystemExit, KeyboardInterrupt) as error:
            raise _HandlerRaised(error) from None

    async def _handle(self, job: ClaimInFlight) -> _Outcome | None:
        """Run the handler; its outcome, or None when it was cancelled (lease lost)."""
        observed = job.observed
        if observed is None:
            handler = asyncio.ensure_future(self._guarded(job))
        else:
            handler = observed.run_handler(lambda: asyncio.ensure_future(self._guarded(job)))
        job.handler = handler
        try:
            await asyncio.wait([handler])
        except asyncio.CancelledError:  # shutdown: the handler goes with this task
            handler.cancel()
            await asyncio.wait([handler])
            if observed is not None:
                observed.handler_ended("cancelled", None)
            raise
        outcome = self._outcome(handler)
        if outcome is not None and outcome.raised is not None:
            job.shown_error = loggable_exception(outcome.raised, self.source.config.max_payload_bytes,
                                                 with_message=self.store_error_text)
        if observed is not None:
            observed.handler_ended("cancelled" if outcome is None else outcome.kind, job.shown_error)
        return outcome

    def _outcome(self, handler: asyncio.Future[Any]) -> _Outcome | None:
        """What the ended ``handler`` asks to write (None: it was cancelled)."""
        if handler.cancelled():
            return None
        max_bytes = self.source.config.max_payload_bytes
        error = handler.exception()
        if isinstance(error, _HandlerRaised):
            error = error.raised  # SystemExit, KeyboardInterrupt...: this attempt's failure like any other
        if error is None:
            result = handler.result()
            try:
                self.source.result_text(result)
            except ConfigValidationError as invalid:
                # A programming error, not a transient one: the handler did its work, so
                # a retry would only repeat its side effects. The job fails at once.
                problem = invalid.problems[0] if invalid.problems else invalid.reason
                text = f"InvalidResult: the handler's result cannot be stored ({problem})"
                return _Outcome("fail", error=text if self.store_error_text else "InvalidResult", retry=False)
            return _Outcome("complete", result=result)
        text = exception_text(error, max_bytes, with_message=self.store_error_text)
        if isinstance(error, FailJob):
            return _Outcome("fail", error=text, retry=error.retry is True, dlq_record_id=error.dlq_record_id,
                            raised=error)
        return _Outcome("fail", error=text, raised=error)

    async def _settle(self, job: ClaimInFlight, outcome: _Outcome) -> None:
        source = self.source
        fence = job.fence
        streaming = isinstance(source, StreamingJobSource)
        if streaming:
            await self.observe_streaming(job)
            if job.lost:
                return
            if job.context.cancel_requested.is_set():
                await self._acknowledge(job)
                return
        if outcome.kind == "complete":
            status = await self._fenced(job, lambda: self._complete(fence, outcome.result), {JobStatus.COMPLETED})
        else:
            dlq: dict[str, Any] = {} if streaming else {"dlq_record_id": outcome.dlq_record_id}
            if fence.queue is QueueKind.TASK:
                # The task's own retry policy, snapshotted when it was deferred; the
                # jitter is drawn here (the kernel draws nothing).
                task = job.claimed.job
                dlq.update(policy=(task.retry_base_ms, task.retry_max_ms, task.retry_jitter),
                           jitter_per_mille=random.randint(0, 500) if task.retry_jitter else 0)

            async def fail() -> JobStatus | None:
                return await source.fail_owned_status(fence, clean_text(outcome.error, error_bytes(source.config.max_payload_bytes)),
                                                       retry=outcome.retry, **dlq)

            status = await self._fenced(job, fail, {JobStatus.FAILED, JobStatus.PENDING})
        if status is None and streaming and not job.lost:
            await self.observe_streaming(job)  # refused: perhaps a cancel request arrived meanwhile
            if job.context.cancel_requested.is_set() and not job.lost:
                if outcome.kind == "fail":
                    self._log_failure(job, outcome, JobStatus.CANCELLED)
                await self._acknowledge(job)
                return
        if outcome.kind == "fail":
            self._log_failure(job, outcome, status)
        elif status is None and job.answered:
            self._log_refused(job, "its result")
        self._count(job, status)

    def _log_failure(self, job: ClaimInFlight, outcome: _Outcome, status: JobStatus | None) -> None:
        """One line per failed attempt, once its write answered: what became of the job
        (retried, failed, or not this worker's any more) with its IDs, the text stored for
        it (cleaned and cut; the type alone with ``store_error_text=False``), and the
        handler's traceback as :func:`~tenure.adapters.core.failure_text.loggable_exception` shows it (an explicit
        ``FailJob`` is a decision, logged without one)."""
        context = job.context
        if status is JobStatus.PENDING:
            fate = "retried"
        elif status is JobStatus.FAILED:
            fate = "failed"
        elif status is JobStatus.CANCELLED:
            fate = "stopped on a cancel request (acknowledged next)"
        elif job.answered:
            fate = "not written (the claim was no longer this worker's)"
        else:
            fate = "not written (its lease may have ended before the write was answered)"
        fields = self._fields(job, fate)
        where = self._where(job)
        raised = outcome.raised
        if raised is None:  # the result could not be stored
            log.error("job %s (%s, attempt %d) %s: its handler's result cannot be stored", context.job_id,
                      where, context.attempt, fate, extra=fields)
        elif isinstance(raised, FailJob):
            log.warning("job %s (%s, attempt %d) %s by %s", context.job_id, where,
                        context.attempt, fate, outcome.error, extra=fields)
        else:
            log.error("job %s (%s, attempt %d) %s: its handler raised %s", context.job_id, where,
                      context.attempt, fate, outcome.error, exc_info=job.shown_error, extra=fields)

    def _log_refused(self, job: ClaimInFlight, what: str) -> None:
        """A fenced write of ``what`` was refused: the claim was no longer this worker's."""
        context = job.context
        log.warning("job %s (%s, attempt %d): %s was refused by its fence (the claim was no longer this "
                    "worker's: cancelled, or its lease ended and it was taken over)", context.job_id,
                    self._where(job), context.attempt, what, extra=self._fields(job, "stale write refused"))

    async def _acknowledge(self, job: ClaimInFlight) -> None:
        source = self.source
        assert isinstance(source, StreamingJobSource)

        async def acknowledge() -> JobStatus | None:
            return JobStatus.CANCELLED if await source.acknowledge_cancel_owned(job.fence) else None

        status = await self._fenced(job, acknowledge, {JobStatus.CANCELLED})
        if status is None and job.answered:
            self._log_refused(job, "its cancel acknowledgement")
        self._count(job, status)

    def _count(self, job: ClaimInFlight, status: JobStatus | None) -> None:
        """Count a written outcome by its answer, including one that answered after the
        local deadline (refused: a stale write, applied: what it applied)."""
        if not job.answered:
            return  # never answered: counted as a lease loss
        stats = self.stats
        if status is None:
            stats.stale_writes_refused += 1
            result = "stale_write_refused"
        elif status is JobStatus.COMPLETED:
            stats.completed += 1
            result = "completed"
        elif status is JobStatus.PENDING:
            stats.retried += 1
            result = "retried"
        elif status is JobStatus.FAILED:
            stats.failed += 1
            result = "failed"
        elif status is JobStatus.CANCELLED:
            stats.cancels_acknowledged += 1
            result = "cancel_acknowledged"
        else:
            return
        if job.observed is not None:
            job.observed.settled(result)

    async def _complete(self, fence: QueueClaimFence, result: Any) -> JobStatus | None:
        applied = await self.completions.submit((fence, result))
        return JobStatus.COMPLETED if applied else None

    async def _complete_many(self, items: list[tuple[QueueClaimFence, Any]]) -> list[bool]:
        return await self.source.complete_many_owned(items)

    async def _renew_many(self, fences: list[QueueClaimFence]) -> list[bool]:
        return await self.source.heartbeat_many_owned(fences)

    async def _fenced(
        self, job: ClaimInFlight, write: Callable[[], Awaitable[JobStatus | None]], settled: set[JobStatus]
    ) -> JobStatus | None:
        """``write`` until it answers, repeating database failures while the lease may
        be live. None: refused, or never answered before the lease ran out (then
        ``job.lost``). A refusal after an unacknowledged attempt is checked against the
        stored row: that attempt may have been the one that applied."""
        delay = FIRST_WRITE_BACKOFF_S
        uncertain = False
        while not job.lost:
            try:
                status = await write()
            except ConfigValidationError:
                raise
            except TenureError as error:
                self.failed_call("write", error)
                uncertain = uncertain or error.reason == "commit_unacknowledged"
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_WRITE_BACKOFF_S)
                continue
            self.outage.answered()
            job.answered = True
            if status is None and uncertain:
                return await self._applied_earlier(job, settled)
            return status
        return None

    async def _applied_earlier(self, job: ClaimInFlight, settled: set[JobStatus]) -> JobStatus | None:
        try:
            info = await self.source.get_job(job.fence.job_id)
        except ConfigValidationError:
            raise
        except TenureError as error:
            self.failed_call("read", error)
            return None
        if info is not None and info.generation == job.fence.generation and info.status in settled:
            return info.status
        return None

    async def observe_streaming(self, job: ClaimInFlight) -> None:
        """Read a streaming claim's owned state: a cancel request sets
        ``cancel_requested``; no live claim any more loses the lease."""
        source = self.source
        assert isinstance(source, StreamingJobSource)
        try:
            state = await source.get_owned_state(job.fence)
        except ConfigValidationError:
            raise
        except TenureError as error:
            self.failed_call("state", error)  # unknown: nothing changes; the next round reads again
            return
        if state is None:
            job.lose(LOST_STATE)
        elif state.cancel_requested:
            job.context.cancel_requested.set()

    def failed_call(self, call: str, error: TenureError) -> None:
        """Counted each time; logged once per change of the outage's state (see
        :class:`~tenure.adapters.core.outages.OutageLog`), not once per call."""
        self.stats.persistence_failures += 1
        self.outage.failed(call, error.code.value, error.reason)
        if self.metrics is not None:
            self.metrics.call_failed(call)
