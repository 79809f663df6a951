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
  decide whether the job comes back; :class:`~tenure.adapters.queue.job.FailJob` chooses ``retry`` (and a DLQ
  correlation ID) explicitly; a result that cannot be stored (not JSON, too large, not
  an object for pycharter's queues) fails the job at once, never retried, since its
  handler did its work (``InvalidResult: ...``). ``SystemExit`` (``sys.exit()`` in a handler),
  ``KeyboardInterrupt`` and a ``CancelledError`` the handler raised itself (not the
  worker's cancellation) fail that attempt like any exception, and the worker goes on (asyncio would
  otherwise let the first two stop the event loop, and every other job with it; stop a
  worker with ``stop``, or SIGTERM/SIGINT to ``tenure worker``, never from a handler);
- once written, a failure is logged at ERROR with the job ID, queue, attempt, whether
  it was retried or failed, the text stored for it, and the handler's traceback as
  :func:`~tenure.adapters.core.failure_text.loggable_exception` shows it: its frames and chain, each message cleaned and cut
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
  is tried again up to :data:`~tenure.adapters.queue.runner.LATE_CLAIM_RENEWALS` times, then the claim is given back
  (``release_many_owned``: pending at once, its attempt returned);
- a cancel reaches a running handler within about a second: while claims are held, a
  cancel watch reads them every ``cancel_watch_s`` (one read by primary key), and a claim
  cancelled meanwhile (``tenure jobs cancel``, the console, the API) has its handler
  cancelled and nothing written, logged at INFO with the job ID and counted in
  ``stats.cancelled``, not as a lease loss (a poll on every database: it needs no
  LISTEN connection, so it works the same through PgBouncer, and costs one indexed read
  per second per worker that holds claims; a cancel that the heartbeat meets first is a
  lease loss, as before);
- streaming launches: ``context.cancel_requested`` is set when the owned state shows a
  cancel request (read by the cancel watch and every heartbeat round); the handler is expected to stop
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

The worker's rooms: this module is the loop (claims, the listener, heartbeats,
shutdown); :mod:`~tenure.adapters.queue.job` the claim in flight and what a handler
sees of it; :mod:`~tenure.adapters.queue.runner` a claim's life from its start to its
written outcome; :mod:`~tenure.adapters.queue.batcher` the batched writes;
:mod:`~tenure.adapters.core.failure_text` a failure's stored and logged text. All of
them log on this module's logger, ``tenure.adapters.queue.worker``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import os
import socket
import uuid
from collections.abc import Awaitable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from tenure.model import ConfigValidationError, ErrorCode, TenureError, bounds
from tenure.model.validation import is_queue_name, refuse

from ..core.store import Listener
from .job import CANCELLED_BY_REQUEST, LOST_HEARTBEAT, ClaimInFlight, Handler, JobContext
from .presence import REPORT_EVERY_S
from .runner import JobRunner, WorkerStats
from .sources import (
    MAX_BATCH,
    JobSource,
    PipelineJobSource,
    StreamingJobSource,
    TaskSource,
    ValidationJobSource,
)

if TYPE_CHECKING:
    from ..core.observers import WorkerObserver

__all__ = ["Worker", "CANCEL_WAIT_S", "MAX_CONCURRENCY", "MAX_QUEUES", "MAX_IDLE_WAIT_S", "MAX_GRACE_S"]

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

MAX_QUEUES = 100
"""The most task queues one Worker serves."""

CANCEL_WATCH_S = 1.0
"""How often a worker holding claims reads whether any was cancelled (one read by primary
key of its claims in flight): a cancel reaches its handler within about this long,
instead of at the next heartbeat (``heartbeat_seconds``, 60 s by default)."""

MAX_IDLE_WAIT_S = 3600.0
MAX_GRACE_S = 86_400.0


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


def _served_queues(source: JobSource[Any], queues: object) -> list[str] | None:
    """The task queues a worker of ``source`` serves (duplicates dropped), or None for
    the other queues, which take no ``queues``."""
    if not isinstance(source, TaskSource):
        if queues is not None:
            raise refuse("queues", "tasks_only")
        return None
    if isinstance(queues, str) or not isinstance(queues, (list, tuple)) or not queues \
            or not all(is_queue_name(name) for name in queues) or len(queues) > MAX_QUEUES:
        raise refuse("queues", "queue_names_required")
    return list(dict.fromkeys(queues))


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
    - ``cancel_watch_s``: how often the cancel watch reads the claims in flight (default
      :data:`CANCEL_WATCH_S`; only while a claim is held);
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

    task_names: tuple[str, ...] = ()
    """The task names this worker's app registers (a TaskWorker's), recorded with it."""

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
        cancel_watch_s: float = CANCEL_WATCH_S,
    ) -> None:
        if not isinstance(source, (ValidationJobSource, PipelineJobSource, StreamingJobSource, TaskSource)):
            raise refuse("source", "job_source_required")
        self.queues: list[str] | None = _served_queues(source, queues)
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
        self.cancel_watch_s = _seconds(cancel_watch_s, "cancel_watch_s", minimum=0.0, maximum=MAX_IDLE_WAIT_S,
                                       inclusive=False)
        if type(store_error_text) is not bool:
            raise refuse("store_error_text", "bool_required")
        self.store_error_text = store_error_text
        if metrics is not None and not all(callable(getattr(metrics, name, None)) for name in _OBSERVER_HOOKS):
            raise refuse("metrics", "worker_observer_required")
        self.metrics = metrics
        self.stats = WorkerStats()
        self._runner = JobRunner(source, handler, worker_id=worker_id, store_error_text=store_error_text,
                                 metrics=metrics, stats=self.stats)
        """Runs each claim from its start to its written outcome; holds the claims."""
        self._presence = source.presence(worker_id, queues=self.queues or [source.queue.value],
                                         tasks=self.task_names, concurrency=self.concurrency)
        """This worker's record of itself (``tenure workers``)."""
        self._ran = False
        self._given_back = 0
        """Claims the shutdown gave back (``release_many_owned`` answered True)."""
        self._wake = asyncio.Event()
        self._listener: Listener | None = None
        self._listens = True
        """False once the store answered that it has no notifications (SQLite)."""
        self._listener_lost = False
        """The listener's connection was lost and not yet reopened (logged once per loss)."""

    @property
    def in_flight(self) -> int:
        """Claims held right now (handlers running or outcomes being written)."""
        return len(self._runner.jobs)

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
        await self._presence_call(self._presence.started())
        helpers = [asyncio.create_task(self._heartbeats()), asyncio.create_task(self._runner.completions.run()),
                   asyncio.create_task(self._runner.renewals.run()), asyncio.create_task(self._watch_cancels()),
                   asyncio.create_task(self._report_presence())]
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
        tasks = [job.task for job in self._runner.jobs.values() if job.task is not None]
        if tasks and grace > 0:
            log.info("stopping: waiting up to %.1f s for %d handlers", grace, len(tasks))
            await asyncio.wait(tasks, timeout=grace)
        cancelled = [job for job in self._runner.jobs.values() if job.task is not None and not job.task.done()]
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
        await self._presence_call(self._presence.stopped())
        if stuck:
            raise TenureError(ErrorCode.WORKER_SHUTDOWN_INCOMPLETE, "handler_ignored_cancellation")
        log.info("worker stopped")

    async def _give_back(self, jobs: Sequence[ClaimInFlight]) -> None:
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
            free = self.concurrency - self._runner.running
            if free <= 0:
                self._runner.slot_freed.clear()
                await self._wait_for(stop, [self._runner.slot_freed], None)
                continue
            self._wake.clear()
            self._runner.slot_freed.clear()
            settled_before = self._runner.settled
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
                if not self._runner.jobs and self._runner.settled == settled_before:
                    return
                if not self._runner.jobs:
                    continue
                await self._wait_for(stop, [self._runner.slot_freed], None)  # an ending job may send a retry back
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
            self._runner.failed_call("listen", error)
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
            self._runner.failed_call("claim", error)
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
                    self._runner.failed_call("recover", error)
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
        self._runner.outage.answered()
        for record, sent_at in claimed:
            self._runner.start(record, sent_at)
        return len(claimed)


    # --- heartbeats and the streaming state --------------------------------------------

    async def _heartbeats(self) -> None:
        interval = self.source.config.heartbeat_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                if await self._heartbeat_round():  # an idle round asks nothing: it proves nothing
                    self._runner.outage.answered()
            except ConfigValidationError:
                log.error("heartbeats stopped: the source refused the call (closed?)")
                return
            except TenureError as error:
                self._runner.failed_call("heartbeat", error)

    async def _report_presence(self) -> None:
        """Every :data:`~tenure.adapters.queue.presence.REPORT_EVERY_S`: this worker is
        alive, with its claims in flight (``tenure workers``)."""
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            await self._presence_call(self._presence.seen(self.in_flight))

    async def _presence_call(self, call: Awaitable[None]) -> None:
        """A write of this worker's own record: a diagnostic, so a failure is counted and
        logged once per outage, never raised (claims are fenced by their own leases)."""
        try:
            await call
        except ConfigValidationError:
            raise
        except TenureError as error:
            self._runner.failed_call("presence", error)

    async def _watch_cancels(self) -> None:
        """Every ``cancel_watch_s`` while claims are held: one read of the claims in flight,
        and each that was cancelled meanwhile has its handler cancelled, nothing written
        for it (logged and counted as a cancel, not a lease loss). A streaming launch's
        cancel is a request its handler sees (``cancel_requested``), read the same way.
        A failed read is counted and tried again at the next round; the heartbeat and
        the fenced writes stay the guarantee, the watch only makes a cancel prompt."""
        while True:
            await asyncio.sleep(self.cancel_watch_s)
            jobs = [job for job in self._runner.jobs.values()
                    if not job.lost and not job.ended and not job.settling and not job.confirming]
            if not jobs:
                continue
            try:
                if isinstance(self.source, StreamingJobSource):
                    for job in jobs:
                        if not job.lost and not job.settling:  # it may have ended meanwhile
                            await self._runner.observe_streaming(job)
                    continue
                cancelled = await self.source.cancelled_claims([job.fence for job in jobs])
            except ConfigValidationError:
                log.error("the cancel watch stopped: the source refused the call (closed?)")
                return
            except TenureError as error:
                self._runner.failed_call("cancel watch", error)
                continue
            for job in jobs:
                if job.fence in cancelled and not job.settling:
                    job.lose(CANCELLED_BY_REQUEST)

    async def _heartbeat_round(self) -> bool:
        """Renew every live claim; whether the database was asked (and answered)."""
        # A claim being confirmed is renewed by its own renewal (it has no deadline yet).
        jobs = [job for job in self._runner.jobs.values() if not job.lost and not job.confirming]
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
                    await self._runner.observe_streaming(job)
        return bool(jobs)

