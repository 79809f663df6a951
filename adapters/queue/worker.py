"""Fenced workers: a runtime that carries a claim's fence from the claim to the write.

``Worker(source, handler)`` claims owned jobs with fresh nonces, runs
``await handler(claimed, context)`` for each, renews every claim in flight in one
batched heartbeat, and writes the handler's outcome with the exact fence of its claim:

- the handler's return value (a JSON object, any JSON value for tasks, or None) is the result of
  ``complete_owned``; completions that finish together go out as one
  ``complete_many_owned`` call (its answers are exactly the single calls');
- an exception becomes ``fail_owned`` with ``retry=True`` and the text
  ``"<ExceptionType>: <message>"`` (control characters and what cannot be stored
  replaced, cut to 2 KiB or ``WorkerConfig.max_payload_bytes`` if smaller; the type
  alone with ``store_error_text=False``), so the kernel's backoff and attempt budget
  decide whether the job comes back; :class:`FailJob` chooses ``retry`` (and a DLQ
  correlation ID) explicitly; a result that cannot be stored (not JSON, too large, not
  an object for pycharter's queues) fails the job at once, never retried, since its
  handler did its work (``InvalidResult: ...``). ``SystemExit`` (``sys.exit()`` in a handler),
  ``KeyboardInterrupt`` and a ``CancelledError`` the handler raised itself (not the
  worker's cancellation) fail that attempt like any exception, and the worker goes on (asyncio would
  otherwise let the first two stop the event loop, and every other job with it; stop a
  worker with ``stop``, or SIGTERM/SIGINT to ``tenure worker``, never from a handler);
- once written, a failure is logged at ERROR with the job ID, queue, attempt, whether
  it was retried or failed, the text stored for it, and the handler's traceback as
  :func:`loggable_exception` shows it: its frames and chain, each message cleaned and cut
  as stored, none with ``store_error_text=False`` (a message never reaches a log line,
  or a metrics observer, whole);
- a claim whose lease may have ended is never written: a heartbeat answered ``False``
  (by the batch or by ``context.heartbeat_now()``) or the local lease deadline (the
  moment the last successful claim or heartbeat was *sent*, plus the lease: never
  later than the database's own expiry) sets ``context.lease_lost`` and cancels the
  handler at once; its claim is left to expire (or was already taken over), and any
  late write would be refused by the fence anyway. Every such loss is logged at
  WARNING with the job ID, queue (and task), attempt and the reason;
- a claim answered late (less than ``min(heartbeat_seconds, lease_seconds / 2)`` of its
  local lease left, or none: a lock wait or a stall held it up, while the database
  started its lease when the claim finally ran) does not start its handler: a fenced
  renewal goes out at once and the database decides. Renewed and answered in time, the
  deadline is armed from the renewal's send time and the handler runs; refused, the
  loss is logged and counted; answered late again (the stall goes on) or failed, it
  is tried again up to :data:`LATE_CLAIM_RENEWALS` times, then the claim is given back
  (``release_many_owned``: pending at once, its attempt returned);
- streaming launches: ``context.cancel_requested`` is set when the owned state shows a
  cancel request (read with every heartbeat round); the handler is expected to stop
  its process; when it ends, the worker reads the state once more and acknowledges
  the cancel (``acknowledge_cancel_owned``) instead of completing or failing.

A write that fails for a database reason (``TenureError``) is repeated while the lease
may still be live (heartbeats continue meanwhile). When it is refused after an attempt
whose commit went unacknowledged, the job is read back: the same generation in the
status the write would have left shows that the earlier attempt applied.

A claim whose commit went unacknowledged is recovered by ``recover_owned_claim`` with
the same nonce (up to three tries; a claim that cannot be recovered expires by its
lease and is taken by another worker).

Waiting for work: on PostgreSQL an idle worker LISTENs on its table's channel, which
every submission (owned or legacy) and every failure sent back to pending notifies in
its own transaction; ``idle_wait_s`` is then only the fallback poll for what announces
nothing (a retry's backoff coming due, an expired lease). A listener whose connection
ends (cut by the server or the network, or found silent by its periodic check) wakes
the worker at once: the loss is logged at WARNING, a new listener is opened (logged at
INFO once it listens), and the worker claims once more before it waits, since what was
announced meanwhile went unheard. On SQLite the worker polls, backing off from 50 ms to
``idle_wait_s``. Setting ``stop`` wakes an idle wait at once.

Shutdown (``stop`` set, or ``run`` cancelled): claiming stops; in-flight handlers get
``shutdown_grace_s`` to finish and be written (heartbeats continue); the rest are
cancelled, and once their handlers have ended their claims are given back in one fenced
``release_many_owned`` (pending again at once, the attempt returned: another worker
takes them without waiting out the lease); no task of the worker outlives ``run``. A
handler that ignores its cancellation for :data:`CANCEL_WAIT_S` is not given back (it
may still be working) and makes ``run`` raise ``WORKER_SHUTDOWN_INCOMPLETE`` (after the
heartbeats stopped: its claim expires).
Cancelling ``run`` itself skips the grace period.

A Worker runs once (``run`` or ``run_until_idle``) and never closes its source.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import math
import os
import random
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tenure.model import (
    ConfigValidationError,
    ErrorCode,
    JobStatus,
    QueueClaimFence,
    QueueKind,
    TenureError,
    bounds,
    check_pid,
)
from tenure.model.validation import is_queue_name, refuse

from ..core.outages import OutageLog
from ..core.store import Listener
if TYPE_CHECKING:
    from ..core.observers import JobObserver, WorkerObserver
from .sources import (
    MAX_BATCH,
    JobSource,
    PipelineJobSource,
    StreamingJobSource,
    TaskSource,
    ValidationJobSource,
)

__all__ = ["Worker", "JobContext", "WorkerStats", "FailJob", "CANCEL_WAIT_S", "MAX_CONCURRENCY"]

log = logging.getLogger("tenure.adapters.queue.worker")

MAX_CONCURRENCY = 1000
"""The most handlers one Worker runs at once."""

CANCEL_WAIT_S = 5.0
"""How long shutdown waits for cancelled handlers to end before it reports them."""

FIRST_POLL_S = 0.05
"""The first idle poll (SQLite, or PostgreSQL without a live listener); it doubles up to
``idle_wait_s`` while nothing is claimable."""

MAX_PARALLEL_CLAIMS = 4
"""Claim calls a worker keeps under way at once when several slots are free (each of
at most ``batch_size`` jobs): claims are round trips, and one at a time would cap a
worker at one claim per round trip whatever its concurrency."""

RECOVERY_TRIES = 3
"""Tries of ``recover_owned_claim`` per nonce after an unacknowledged claim."""

MAX_WRITE_BACKOFF_S = 1.0
"""The longest pause between repeats of a fenced write that failed for a database reason."""

LATE_CLAIM_RENEWALS = 3
"""Renewals tried for a claim whose answer arrived late (see ``Worker._arrived_late``)
before it is given back: each renewal that answers late again (the database is still
stalled) is tried once more."""

LOST_DEADLINE = "its lease deadline passed with no renewal answered (a stalled database or connection)"
LOST_HEARTBEAT = "a heartbeat was refused (the job was cancelled, or its lease ended and it was taken over)"
LOST_PROGRESS = "a progress report was refused (the job was cancelled, or its lease ended and it was taken over)"
LOST_STATE = "its owned state shows no live claim (the job was cancelled, or its lease ended and it was taken over)"
LOST_RENEWAL = "its claim answered after its lease deadline and the renewal was refused (the lease ended during the stall)"
LOST_UNRETURNED = "its claim answered late, could not be renewed in time and could not be given back"
"""Why a claim was lost: the reason a lease-loss log line gives."""

MAX_QUEUES = 100
"""The most task queues one Worker serves."""

MAX_IDLE_WAIT_S = 3600.0
MAX_GRACE_S = 86_400.0

Claimed = TypeVar("Claimed")
Handler = Callable[[Any, "JobContext"], Awaitable[Any]]


class FailJob(Exception):
    """Raise from a handler to fail the job with this message and an explicit ``retry``
    (default False: finished as failed), and for validation and pipeline jobs an optional
    DLQ correlation ID."""

    def __init__(self, message: str, *, retry: bool = False, dlq_record_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry = retry
        self.dlq_record_id = dlq_record_id


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

    def __init__(self, job: _Job) -> None:
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


class _Job:
    """One claim in flight: its handler task, its lease deadline and its fate."""

    def __init__(self, worker: Worker, claimed: Any, sent_at: float) -> None:
        fence = claimed.claim_fence
        assert type(fence) is QueueClaimFence  # owned claims always carry one
        self.worker = worker
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
        """The handler's exception as logs and observers see it (:func:`loggable_exception`)."""
        self._timer: asyncio.TimerHandle | None = None
        self.confirming = worker._arrived_late(sent_at)
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
        self._timer = loop.call_at(sent_at + self.worker.source.config.lease_seconds, self.lose, LOST_DEADLINE)

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
            self.worker._lease_lost(self)

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def heartbeat_now(self) -> bool:
        if self.lost:
            return False
        sent = asyncio.get_running_loop().time()
        renewed = await self.worker.source.heartbeat_owned(self.fence)
        if renewed:
            self.renewed(sent)
        else:
            self.lose(LOST_HEARTBEAT)
        return renewed

    async def progress(self, report: dict[str, Any]) -> bool:
        source = self.worker.source
        if not isinstance(source, TaskSource):
            raise ConfigValidationError("invalid_queue", fields=("queue",), problems=("tasks_only",))
        if self.lost:
            return False
        if await source.progress_owned(self.fence, report):
            return True
        self.lose(LOST_PROGRESS)
        return False

    async def set_pid(self, pid: int) -> bool:
        source = self.worker.source
        if not isinstance(source, StreamingJobSource):
            raise ConfigValidationError("invalid_queue", fields=("queue",), problems=("streaming_only",))
        checked = check_pid(pid)
        if self.lost:
            return False
        if await source.set_pid_owned(self.fence, checked):
            return True
        await self.worker.observe_streaming(self)
        return False


class _Batcher(Generic[Claimed]):
    """Writes submitted while a batch call is under way go out together in the next one.
    Runs as one task of the worker; each item's future receives its own answer, or the
    batch call's failure."""

    def __init__(self, call_many: Callable[[list[Any]], Awaitable[list[Any]]]) -> None:
        self._call_many = call_many
        self._waiting: list[tuple[Any, asyncio.Future[Any]]] = []
        self._ready = asyncio.Event()

    def submit(self, item: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self._ready.set()
        return future

    async def run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._waiting:
                batch = [(item, future) for item, future in self._waiting[:MAX_BATCH] if not future.done()]
                del self._waiting[:MAX_BATCH]
                if not batch:
                    continue
                try:
                    answers = await self._call_many([item for item, _ in batch])
                except Exception as error:  # noqa: BLE001 - handed to every caller of this batch
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for (_, future), answer in zip(batch, answers, strict=True):
                    if not future.done():
                        future.set_result(answer)


def _is_async_callable(handler: object) -> bool:
    target = handler
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target):
        return True
    call = getattr(type(target), "__call__", None)
    return call is not None and inspect.iscoroutinefunction(call)



def _seconds(value: object, field: str, *, minimum: float, maximum: float, inclusive: bool) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        raise refuse(field, "finite_number_required")
    number = float(value)  # type: ignore[arg-type]
    if number > maximum or number < minimum or (not inclusive and number == minimum):
        raise refuse(field, "number_out_of_range")
    return number


def _count(value: object, field: str, maximum: int) -> int:
    if not bounds.is_strict_int(value) or not 1 <= value <= maximum:  # type: ignore[operator]
        raise refuse(field, "integer_out_of_range")
    return value  # type: ignore[return-value]


MAX_ERROR_BYTES = 2048
"""The most UTF-8 bytes of a failure's stored text (less when the source's
``max_payload_bytes`` is smaller)."""

_CONTROL = {code: "\ufffd" for code in (*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), *range(0x7F, 0xA0))}
"""Control characters a stored error must not carry (tab and line breaks stay: a
message may span lines); each becomes U+FFFD."""


def error_text(text: str, max_bytes: int) -> str:
    """``text`` as a storable error: control characters (except tab and line breaks) and
    unencodable code points replaced, cut to ``max_bytes`` UTF-8 bytes (at most
    :data:`MAX_ERROR_BYTES`) on a character boundary (marked with an ellipsis)."""
    max_bytes = min(max_bytes, MAX_ERROR_BYTES)
    # Every character is at least one byte once cleaned, so what lies past the first
    # max_bytes + 1 characters is cut anyway: never clean megabytes to keep two KiB.
    cleaned = text[: max_bytes + 1].translate(_CONTROL).encode("utf-8", "replace")
    if len(cleaned) <= max_bytes:
        return cleaned.decode("utf-8")
    ellipsis = "\u2026".encode()
    return cleaned[: max(0, max_bytes - len(ellipsis))].decode("utf-8", "ignore") + ellipsis.decode()


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the failure
        return "(the exception's message could not be read)"


def exception_text(error: BaseException, max_bytes: int, *, with_message: bool = True) -> str:
    """``"<ExceptionType>: <message>"`` (the type alone when the message is empty, or
    when ``with_message`` is False)."""
    if not with_message:
        return error_text(type(error).__name__, max_bytes)
    message = _message(error)
    return error_text(f"{type(error).__name__}: {message}" if message else type(error).__name__, max_bytes)


MAX_LOGGED_CHAIN = 8
"""The most exceptions of a chain (``__cause__``, ``__context__``) a logged traceback shows."""


def loggable_exception(error: BaseException, max_bytes: int, *, with_message: bool = True) -> BaseException:
    """A stand-in for ``error`` that a log line or a trace may carry: its type's name,
    its traceback's frames and its chain (causes and contexts, up to
    :data:`MAX_LOGGED_CHAIN`, each likewise), but each message cleaned and cut as a
    stored error text is (:func:`error_text`), or left out with ``with_message=False``,
    and no notes. So a handler's message reaches no output whole: a 10 MB message, an
    escape sequence or a NUL is logged as it is stored, and a message that must not be
    stored is not logged either (the frames, files and lines stay to debug with)."""
    copies: dict[int, BaseException] = {}

    def copy(original: BaseException, depth: int) -> BaseException:
        known = copies.get(id(original))
        if known is not None:
            return known
        kind = type(original)
        # A class of the same name, module and qualified name prints as the original
        # type does; the original class cannot be built safely (any constructor).
        stand_in_type: type[Exception] = type(kind.__name__, (Exception,), {"__module__": kind.__module__,
                                                                            "__qualname__": kind.__qualname__})
        message = _message(original) if with_message else ""
        stand_in = stand_in_type(error_text(message, max_bytes)) if message else stand_in_type()
        copies[id(original)] = stand_in
        stand_in.__traceback__ = original.__traceback__
        if depth < MAX_LOGGED_CHAIN:
            if original.__cause__ is not None:
                stand_in.__cause__ = copy(original.__cause__, depth + 1)
            if original.__context__ is not None:
                stand_in.__context__ = copy(original.__context__, depth + 1)
        stand_in.__suppress_context__ = original.__suppress_context__
        return stand_in

    return copy(error, 0)


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


_OBSERVER_HOOKS = ("claim_started", "claim_ended", "job_claimed", "call_failed")


class Worker:
    """Runs ``handler`` for owned jobs of ``source`` with the fence carried end to end
    (see the module docstring for every rule).

    - ``worker_id``: the owner recorded on every claim (default: host, PID and a random
      suffix, so two processes never share one);
    - ``concurrency``: handlers running at once at most (1..1000); a claim whose handler
      has ended no longer counts while its outcome is written, so the next claim
      overlaps that write;
    - ``batch_size``: the most jobs one claim call asks for (1..1000), and never more
      than the free slots. Claims start at one job and double while they come back full
      (a backlog is drained in batches), back to one when a claim comes back short (a
      trickle of jobs is spread over the workers instead of batched into one);
    - ``idle_wait_s``: the longest idle wait between claim attempts (SQLite: the polling
      bound; PostgreSQL: the fallback poll behind LISTEN/NOTIFY);
    - ``shutdown_grace_s``: how long in-flight handlers may run after ``stop``;
    - ``store_error_text``: whether a failure stores the exception's message with its
      type (default) or its type alone, for deployments whose messages may carry data
      that must not be stored. What is logged (and handed to ``metrics``) follows: the
      stored text, and a traceback whose messages are cleaned and cut as stored, or
      left out (its frames, files and lines stay);
    - ``metrics``: an observer of claims, handlers and writes (a
      :class:`~tenure.adapters.core.observers.WorkerObserver`, such as
      :class:`tenure.apps.metrics.Instruments`); None (default): nothing is
      observed, at the cost of one ``is None`` check per event.

    A non-async handler is refused here (an object with an async ``__call__`` and a
    ``functools.partial`` of an async function are accepted).
    """

    def __init__(
        self,
        source: JobSource[Any],
        handler: Handler,
        *,
        worker_id: str | None = None,
        concurrency: int = 8,
        batch_size: int = 1,
        idle_wait_s: float = 5.0,
        shutdown_grace_s: float = 30,
        store_error_text: bool = True,
        queues: Sequence[str] | None = None,
        metrics: WorkerObserver[JobContext] | None = None,
    ) -> None:
        if not isinstance(source, (ValidationJobSource, PipelineJobSource, StreamingJobSource, TaskSource)):
            raise refuse("source", "job_source_required")
        if isinstance(source, TaskSource):
            if isinstance(queues, str) or not isinstance(queues, (list, tuple)) or not queues \
                    or not all(is_queue_name(name) for name in queues) or len(queues) > MAX_QUEUES:
                raise refuse("queues", "queue_names_required")
            self.queues: list[str] | None = list(dict.fromkeys(queues))
        elif queues is not None:
            raise refuse("queues", "tasks_only")
        else:
            self.queues = None
        if not _is_async_callable(handler):
            raise refuse("handler", "async_callable_required")
        if worker_id is None:
            worker_id = f"{socket.gethostname()[:64]}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        elif type(worker_id) is not str or not bounds.is_identity(worker_id):
            raise refuse("worker_id", "identity_required")
        self.source = source
        self.handler = handler
        self.worker_id: str = worker_id
        self.concurrency = _count(concurrency, "concurrency", MAX_CONCURRENCY)
        self.batch_size = _count(batch_size, "batch_size", MAX_BATCH)
        self._claim_size = 1
        """Jobs the next claim call asks for: 1 at first, doubled while claims come back
        full (up to ``batch_size``), back to 1 when one comes back short."""
        self.idle_wait_s = _seconds(idle_wait_s, "idle_wait_s", minimum=0.0, maximum=MAX_IDLE_WAIT_S, inclusive=False)
        self.shutdown_grace_s = _seconds(shutdown_grace_s, "shutdown_grace_s", minimum=0.0, maximum=MAX_GRACE_S,
                                         inclusive=True)
        if type(store_error_text) is not bool:
            raise refuse("store_error_text", "bool_required")
        self.store_error_text = store_error_text
        if metrics is not None and not all(callable(getattr(metrics, name, None)) for name in _OBSERVER_HOOKS):
            raise refuse("metrics", "worker_observer_required")
        self.metrics = metrics
        self.stats = WorkerStats()
        self._outage = OutageLog(log, "the database", fields={"worker_id": self.worker_id})
        # Keyed by the claim, not the job ID: the same job claimed again (sent back, then
        # claimed by this worker before its first attempt's write returned) is another
        # entry, which the first attempt's end must not remove.
        self._jobs: dict[QueueClaimFence, _Job] = {}
        """Claims held: handlers running, or outcomes being written."""
        self._running = 0
        self._settled = 0  # jobs whose outcome write ended; idle detection compares it
        """Handlers running (what ``concurrency`` bounds)."""
        self._ran = False
        self._given_back = 0
        """Claims the shutdown gave back (``release_many_owned`` answered True)."""
        self._slot_freed = asyncio.Event()
        self._wake = asyncio.Event()
        self._listener: Listener | None = None
        self._listens = True
        """False once the store answered that it has no notifications (SQLite)."""
        self._listener_lost = False
        """The listener's connection was lost and not yet reopened (logged once per loss)."""
        self._completions: _Batcher[Any] = _Batcher(self._complete_many)
        self._renewals: _Batcher[Any] = _Batcher(self._renew_many)
        lease = source.config.lease_seconds
        self._late_margin_s = min(source.config.heartbeat_seconds, lease / 2)
        """A claim or renewal answered with less than this left of its local lease is
        late: the next heartbeat round might come after its deadline."""

    @property
    def in_flight(self) -> int:
        """Claims held right now (handlers running or outcomes being written)."""
        return len(self._jobs)

    @property
    def listening(self) -> bool:
        """Whether idle waits are woken by notifications (PostgreSQL with a live listener)."""
        return self._listener is not None and self._listener.alive

    # --- running ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> WorkerStats:
        """Claim and run jobs until ``stop`` is set (or this task is cancelled), then
        shut down gracefully (see the module docstring). Returns the stats."""
        return await self._run(stop if stop is not None else asyncio.Event(), until_idle=False)

    async def run_until_idle(self, stop: asyncio.Event | None = None) -> WorkerStats:
        """Run until nothing is claimable now and nothing is in flight (a retry whose
        backoff has not passed, or a job whose ``fires_at`` is later, is not claimable
        now), or until ``stop`` is set."""
        return await self._run(stop if stop is not None else asyncio.Event(), until_idle=True)

    async def _run(self, stop: asyncio.Event, *, until_idle: bool) -> WorkerStats:
        if type(stop) is not asyncio.Event:
            raise refuse("stop", "asyncio_event_required")
        if self._ran:
            raise refuse("worker", "already_ran")
        self._ran = True
        log.info("worker started on the %s queue%s (concurrency %d, batch %d)",
                 self.source.queue.value, "" if self.queues is None else f"s {', '.join(self.queues)}",
                 self.concurrency, self.batch_size)
        await self._ensure_listener()
        helpers = [asyncio.create_task(self._heartbeats()), asyncio.create_task(self._completions.run()),
                   asyncio.create_task(self._renewals.run())]
        grace = self.shutdown_grace_s
        try:
            await self._claim_loop(stop, until_idle)
        except asyncio.CancelledError:
            grace = 0.0
            raise
        finally:
            await self._shut_down(grace, helpers)
        return self.stats

    async def _shut_down(self, grace: float, helpers: Sequence[asyncio.Task[None]]) -> None:
        tasks = [job.task for job in self._jobs.values() if job.task is not None]
        if tasks and grace > 0:
            log.info("stopping: waiting up to %.1f s for %d handlers", grace, len(tasks))
            await asyncio.wait(tasks, timeout=grace)
        cancelled = [job for job in self._jobs.values() if job.task is not None and not job.task.done()]
        for job in cancelled:
            assert job.task is not None
            job.task.cancel()
        stuck: set[asyncio.Task[None]] = set()
        try:
            if cancelled:
                log.info("stopping: cancelled %d handlers", len(cancelled))
                _, stuck = await asyncio.wait([job.task for job in cancelled if job.task is not None],
                                              timeout=CANCEL_WAIT_S)
            # Given back: only a claim whose handler ended before its outcome was being
            # written. A handler that ignores its cancellation may still be doing the job's
            # work, and a write under way may have applied (a release would then throw a
            # finished job's work away): those claims are left to expire.
            await self._give_back([job for job in cancelled
                                   if job.task not in stuck and not job.lost and not job.settling])
            # A claim already lost is counted as a lease loss, not again here.
            self.stats.abandoned += sum(1 for job in cancelled if not job.lost) - self._given_back
        finally:
            for helper in helpers:
                helper.cancel()
            await asyncio.wait(helpers)
        for helper in helpers:
            if not helper.cancelled() and helper.exception() is not None:
                log.error("a worker task failed: %s", type(helper.exception()).__name__)
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                await listener.close()
            except (Exception, asyncio.CancelledError):  # noqa: BLE001 - the connection was terminated instead
                pass
        if stuck:
            raise TenureError(ErrorCode.WORKER_SHUTDOWN_INCOMPLETE, "handler_ignored_cancellation")
        log.info("worker stopped")

    async def _give_back(self, jobs: Sequence[_Job]) -> None:
        """Release the claims of handlers stopped at shutdown (one fenced batch): pending
        again at once with their attempt returned, instead of waiting out a lease. A
        release refused (the lease ran out, the claim was taken over, a cancel request
        stands) or failed leaves the claim to expire, as before releases existed."""
        if not jobs:
            return
        fences = [job.fence for job in jobs]
        answers: list[bool] = []
        try:
            for start in range(0, len(fences), MAX_BATCH):  # settling jobs may outnumber the slots
                answers += await self.source.release_many_owned(fences[start:start + MAX_BATCH])
        except (ConfigValidationError, TenureError) as error:
            log.warning("stopping: could not give back %d claims (%s); they are left to expire",
                        len(jobs) - len(answers), getattr(error, "reason", type(error).__name__))
        self._given_back = sum(1 for applied in answers if applied)
        self.stats.released += self._given_back
        for job, applied in zip(jobs, answers):  # answers stop short where a batch failed
            if applied and job.observed is not None:
                job.observed.released()
        log.info("stopping: gave back %d of %d claims; the rest are left to expire", self._given_back, len(jobs))

    async def _claim_loop(self, stop: asyncio.Event, until_idle: bool) -> None:
        poll = FIRST_POLL_S
        while not stop.is_set():
            free = self.concurrency - self._running
            if free <= 0:
                self._slot_freed.clear()
                await self._wait_for(stop, [self._slot_freed], None)
                continue
            self._wake.clear()
            self._slot_freed.clear()
            settled_before = self._settled
            unreadable_before = self.source.operations.unreadable_failed
            # Up to MAX_PARALLEL_CLAIMS claim calls at once, each of the current claim size.
            size = self._claim_size
            sizes = [min(size, free - start) for start in range(0, free, size)][:MAX_PARALLEL_CLAIMS]
            answers = await asyncio.gather(*(self._claim_and_start(size) for size in sizes))
            met_unreadable = self.source.operations.unreadable_failed - unreadable_before
            self.stats.unreadable += met_unreadable
            if None in answers:  # the database failed: pause, then try again
                await self._wait_for(stop, [], poll)
                poll = min(poll * 2, self.idle_wait_s)
                continue
            if sum(answers) == sum(sizes):  # type: ignore[arg-type]
                # Every claim came back full: a backlog. Claim more per round trip.
                self._claim_size = min(size * 2, self.batch_size)
                poll = FIRST_POLL_S
                continue
            # A claim came back short: a trickle, spread over the workers one job at a time.
            self._claim_size = 1
            if met_unreadable:
                continue  # it met jobs it could not read (set aside or failed): more may wait
            # Nothing more is claimable now.
            if until_idle:
                # A job that settled while the claim was under way may have sent a retry
                # back after the claim's snapshot: claim once more before calling it idle.
                if not self._jobs and self._settled == settled_before:
                    return
                if not self._jobs:
                    continue
                await self._wait_for(stop, [self._slot_freed], None)  # an ending job may send a retry back
                continue
            if await self._ensure_listener():
                continue  # listening again: what was announced while nobody listened was not heard
            if self.listening:
                await self._wait_for(stop, [self._wake], self.idle_wait_s)
                poll = FIRST_POLL_S
            else:
                woke = await self._wait_for(stop, [self._wake], poll)
                poll = FIRST_POLL_S if woke else min(poll * 2, self.idle_wait_s)

    @staticmethod
    async def _wait_for(stop: asyncio.Event, events: Iterable[asyncio.Event], timeout: float | None) -> bool:
        """Wait until ``stop`` or any of ``events`` is set, or ``timeout`` passed. True
        when an event (not the timeout) ended the wait."""
        waiters = [asyncio.ensure_future(event.wait()) for event in (stop, *events)]
        try:
            done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        return bool(done)

    async def _ensure_listener(self) -> bool:
        """Open (or reopen, after its connection was lost) the notification listener.
        True when a lost listener was just replaced: the caller claims once more before
        it waits, since announcements made while nobody listened were lost.

        A listener's connection that ends (the server or a proxy cut it, or the
        listener's own periodic check found it silent) wakes the worker (``wake`` is
        called), so a loss is noticed at once, not at the next fallback poll; it is
        logged once per loss, and the reconnect once it succeeds."""
        if not self._listens or self.listening:
            return False
        if self._listener is not None and not self._listener_lost:
            self._listener_lost = True
            log.warning("the notification listener's connection was lost; reconnecting (polling every %.1f s "
                        "at most meanwhile)", self.idle_wait_s, extra={"worker_id": self.worker_id})
        source_engine = self.source.operations
        try:
            listener = await source_engine.store.listen(source_engine.binding, self._wake.set)
        except ConfigValidationError:
            raise
        except TenureError as error:
            self._failed_call("listen", error)
            return False
        if listener is None:
            self._listens = False
            return False
        old, self._listener = self._listener, listener
        if old is None:
            return False
        self._listener_lost = False
        log.info("listening for new work again", extra={"worker_id": self.worker_id})
        try:
            await old.close()
        except (Exception, asyncio.CancelledError):  # noqa: BLE001 - already lost
            pass
        return True

    # --- claims ----------------------------------------------------------------------

    async def _claim(self, want: int) -> list[tuple[Any, float]] | None:
        """Up to ``want`` claims with fresh nonces, each with the loop time its claim was
        sent; None when the database failed and nothing is known to be claimed."""
        tokens = [uuid.uuid4().hex for _ in range(want)]
        sent = asyncio.get_running_loop().time()
        try:
            claimed: list[Any]
            served: dict[str, Any] = {} if self.queues is None else {"queues": self.queues}
            if want == 1:
                one = await self.source.claim_next_owned(self.worker_id, claim_token=tokens[0], **served)
                claimed = [] if one is None else [one]
            else:
                claimed = list(await self.source.claim_batch_owned(self.worker_id, claim_tokens=tokens, **served))
        except ConfigValidationError:
            raise
        except TenureError as error:
            self._failed_call("claim", error)
            if error.reason != "commit_unacknowledged":
                return None  # nothing was committed (or a nonce clashed): claim again
            recovered = await self._recover(tokens)
            return [(record, sent) for record in recovered]
        return [(record, sent) for record in claimed]

    async def _recover(self, tokens: Sequence[str]) -> list[Any]:
        recovered = []
        for token in tokens:
            for attempt in range(RECOVERY_TRIES):
                try:
                    found = await self.source.recover_owned_claim(self.worker_id, claim_token=token)
                except ConfigValidationError:
                    raise
                except TenureError as error:
                    self._failed_call("recover", error)
                    await asyncio.sleep(FIRST_POLL_S * 2**attempt)
                    continue
                if found is not None:
                    recovered.append(found)
                break
        return recovered

    async def _claim_and_start(self, want: int) -> int | None:
        """Claim up to ``want`` jobs and start their handlers; how many (None: failed)."""
        metrics = self.metrics
        if metrics is None:
            claimed = await self._claim(want)
        else:
            token = metrics.claim_started(want)
            claimed = None
            try:
                claimed = await self._claim(want)
            finally:
                metrics.claim_ended(token, None if claimed is None else len(claimed))
        if claimed is None:
            return None
        self._outage.answered()
        for record, sent_at in claimed:
            self._start(record, sent_at)
        return len(claimed)

    def _start(self, claimed: Any, sent_at: float) -> None:
        job = _Job(self, claimed, sent_at)
        if self.metrics is not None:
            job.observed = self.metrics.job_claimed(claimed, job.context)
        self._jobs[job.fence] = job
        self._running += 1
        self.stats.claimed += 1
        job.task = asyncio.create_task(self._execute(job))

    def _handler_ended(self, job: _Job) -> None:
        """The job's handler no longer runs: its slot is free while its outcome is
        written (so the next claim overlaps that write)."""
        if job.holds_slot:
            job.holds_slot = False
            self._running -= 1
            self._slot_freed.set()

    # --- one job ---------------------------------------------------------------------

    async def _execute(self, job: _Job) -> None:
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
                self._lease_lost(job)  # lost while its outcome was being written, and never answered
            job.ended = True
            job.stop_timer()
            self._jobs.pop(job.fence, None)
            self._settled += 1
            self._slot_freed.set()
            if job.observed is not None:
                job.observed.finished()

    def _arrived_late(self, sent_at: float) -> bool:
        """Whether an answer to a claim or renewal sent at ``sent_at`` (loop time) arrives
        with less than ``min(heartbeat_seconds, lease_seconds / 2)`` of its local lease
        left (or none): the database may still hold the claim (its lease started when
        the statement ran, after any lock wait), but the local deadline, armed from the
        send time to stay safe, may pass before the next heartbeat round renews it."""
        deadline = sent_at + self.source.config.lease_seconds
        return asyncio.get_running_loop().time() > deadline - self._late_margin_s

    async def _confirm(self, job: _Job) -> bool:
        """A claim that answered late: let the database decide before the handler runs.
        A fenced renewal is sent at once; renewed and answered in time, the deadline is
        armed from the renewal's send time and the handler runs (True). Refused, the lease
        ended during the stall: the loss is logged and counted. Renewed but late again
        (the stall goes on), or failed for a database reason, it is tried again, up to
        :data:`LATE_CLAIM_RENEWALS` times; then the claim is given back (pending at once,
        its attempt returned) rather than left to expire with its attempt spent."""
        delay = FIRST_POLL_S
        for _ in range(LATE_CLAIM_RENEWALS):
            sent = asyncio.get_running_loop().time()
            try:
                renewed = await self._renewals.submit(job.fence)
            except ConfigValidationError:
                raise
            except TenureError as error:
                self._failed_call("heartbeat", error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_WRITE_BACKOFF_S)
                continue
            self._outage.answered()
            if not renewed:
                job.lose(LOST_RENEWAL)
                return False
            if not self._arrived_late(sent):
                job.confirming = False
                job.renewed(sent)
                log.info("job %s (%s, attempt %d): its claim answered after its lease deadline; renewed, it runs",
                         job.context.job_id, self._where(job), job.context.attempt,
                         extra=self._fields(job, "late claim renewed"))
                return True
        await self._give_back_late(job)
        return False

    async def _give_back_late(self, job: _Job) -> None:
        context = job.context
        try:
            [given_back] = await self.source.release_many_owned([job.fence])
        except ConfigValidationError:
            raise
        except TenureError as error:
            self._failed_call("release", error)
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

    def _lease_lost(self, job: _Job) -> None:
        """Count and log a lost claim, once: nothing is written for it."""
        if job.loss_counted:
            return
        job.loss_counted = True
        self.stats.lease_losses += 1
        if job.observed is not None:
            job.observed.lease_lost()
        context = job.context
        log.warning("job %s (%s, attempt %d) lease lost: %s; nothing is written for it", context.job_id,
                    self._where(job), context.attempt, job.loss_reason, extra=self._fields(job, "lease lost"))

    def _fields(self, job: _Job, outcome: str) -> dict[str, Any]:
        """The ``extra`` fields of a line about ``job``."""
        context = job.context
        fields: dict[str, Any] = {"job_id": context.job_id, "queue": context.queue_name or context.queue.value,
                                  "attempt": context.attempt, "generation": context.generation,
                                  "worker_id": self.worker_id, "outcome": outcome}
        if context.task_name is not None:
            fields["task"] = context.task_name
        return fields

    @staticmethod
    def _where(job: _Job) -> str:
        context = job.context
        if context.task_name is not None:
            return f"task {context.task_name} on queue {context.queue_name}"
        return f"{context.queue.value} queue"

    async def _guarded(self, job: _Job) -> Any:
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

    async def _handle(self, job: _Job) -> _Outcome | None:
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

    async def _settle(self, job: _Job, outcome: _Outcome) -> None:
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
                return await source.fail_owned_status(fence, error_text(outcome.error, source.config.max_payload_bytes),
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

    def _log_failure(self, job: _Job, outcome: _Outcome, status: JobStatus | None) -> None:
        """One line per failed attempt, once its write answered: what became of the job
        (retried, failed, or not this worker's any more) with its IDs, the text stored for
        it (cleaned and cut; the type alone with ``store_error_text=False``), and the
        handler's traceback as :func:`loggable_exception` shows it (an explicit
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

    def _log_refused(self, job: _Job, what: str) -> None:
        """A fenced write of ``what`` was refused: the claim was no longer this worker's."""
        context = job.context
        log.warning("job %s (%s, attempt %d): %s was refused by its fence (the claim was no longer this "
                    "worker's: cancelled, or its lease ended and it was taken over)", context.job_id,
                    self._where(job), context.attempt, what, extra=self._fields(job, "stale write refused"))

    async def _acknowledge(self, job: _Job) -> None:
        source = self.source
        assert isinstance(source, StreamingJobSource)

        async def acknowledge() -> JobStatus | None:
            return JobStatus.CANCELLED if await source.acknowledge_cancel_owned(job.fence) else None

        status = await self._fenced(job, acknowledge, {JobStatus.CANCELLED})
        if status is None and job.answered:
            self._log_refused(job, "its cancel acknowledgement")
        self._count(job, status)

    def _count(self, job: _Job, status: JobStatus | None) -> None:
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
        applied = await self._completions.submit((fence, result))
        return JobStatus.COMPLETED if applied else None

    async def _complete_many(self, items: list[tuple[QueueClaimFence, Any]]) -> list[bool]:
        return await self.source.complete_many_owned(items)

    async def _renew_many(self, fences: list[QueueClaimFence]) -> list[bool]:
        return await self.source.heartbeat_many_owned(fences)

    async def _fenced(
        self, job: _Job, write: Callable[[], Awaitable[JobStatus | None]], settled: set[JobStatus]
    ) -> JobStatus | None:
        """``write`` until it answers, repeating database failures while the lease may
        be live. None: refused, or never answered before the lease ran out (then
        ``job.lost``). A refusal after an unacknowledged attempt is checked against the
        stored row: that attempt may have been the one that applied."""
        delay = FIRST_POLL_S
        uncertain = False
        while not job.lost:
            try:
                status = await write()
            except ConfigValidationError:
                raise
            except TenureError as error:
                self._failed_call("write", error)
                uncertain = uncertain or error.reason == "commit_unacknowledged"
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_WRITE_BACKOFF_S)
                continue
            self._outage.answered()
            job.answered = True
            if status is None and uncertain:
                return await self._applied_earlier(job, settled)
            return status
        return None

    async def _applied_earlier(self, job: _Job, settled: set[JobStatus]) -> JobStatus | None:
        try:
            info = await self.source.get_job(job.fence.job_id)
        except ConfigValidationError:
            raise
        except TenureError as error:
            self._failed_call("read", error)
            return None
        if info is not None and info.generation == job.fence.generation and info.status in settled:
            return info.status
        return None

    # --- heartbeats and the streaming state --------------------------------------------

    async def _heartbeats(self) -> None:
        interval = self.source.config.heartbeat_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                if await self._heartbeat_round():  # an idle round asks nothing: it proves nothing
                    self._outage.answered()
            except ConfigValidationError:
                log.error("heartbeats stopped: the source refused the call (closed?)")
                return
            except TenureError as error:
                self._failed_call("heartbeat", error)

    async def _heartbeat_round(self) -> bool:
        """Renew every live claim; whether the database was asked (and answered)."""
        # A claim being confirmed is renewed by its own renewal (it has no deadline yet).
        jobs = [job for job in self._jobs.values() if not job.lost and not job.confirming]
        for start in range(0, len(jobs), MAX_BATCH):
            chunk = jobs[start:start + MAX_BATCH]
            sent = asyncio.get_running_loop().time()
            answers = await self.source.heartbeat_many_owned([job.fence for job in chunk])
            for job, renewed in zip(chunk, answers, strict=True):
                if renewed:
                    job.renewed(sent)
                elif not job.settling:  # a settling job's own write may have ended the claim
                    job.lose(LOST_HEARTBEAT)
        if isinstance(self.source, StreamingJobSource):
            for job in jobs:
                if not job.lost and not job.settling:
                    await self.observe_streaming(job)
        return bool(jobs)

    async def observe_streaming(self, job: _Job) -> None:
        """Read a streaming claim's owned state: a cancel request sets
        ``cancel_requested``; no live claim any more loses the lease."""
        source = self.source
        assert isinstance(source, StreamingJobSource)
        try:
            state = await source.get_owned_state(job.fence)
        except ConfigValidationError:
            raise
        except TenureError as error:
            self._failed_call("state", error)  # unknown: nothing changes; the next round reads again
            return
        if state is None:
            job.lose(LOST_STATE)
        elif state.cancel_requested:
            job.context.cancel_requested.set()

    def _failed_call(self, call: str, error: TenureError) -> None:
        """Counted each time; logged once per change of the outage's state (see
        :class:`~tenure.adapters.core.outages.OutageLog`), not once per call."""
        self.stats.persistence_failures += 1
        self._outage.failed(call, error.code.value, error.reason)
        if self.metrics is not None:
            self.metrics.call_failed(call)
