"""Run hops on SAQ's PostgreSQL queue: the Broker port over ``saq.queue.postgres``.

Install with the extra ``tenure[saq]`` (SAQ with psycopg 3 and its pool). One
``SaqBroker`` owns one autocommit connection pool and one SAQ queue per configured
queue name; ``connect`` opens the pool and lets SAQ create or migrate its tables
(``saq_jobs`` and friends), ``disconnect`` closes them again.

What SAQ holds under a hop key (``run:<run_id>:<seq>``) is a job of the function
:data:`HOP_FUNCTION` with the keyword arguments ``run_id`` and ``enqueue_seq`` and
nothing else: a worker rebuilds every other fact from the ledger. Each job is enqueued
with the seed's settings: ``retries=0`` (one attempt; a new attempt is a new sequence,
decided by the ledger), ``timeout=0`` (no generic wall clock), a 120-second heartbeat
that the live hop refreshes every 30 seconds, and the wire priority (``100 - priority``,
SAQ dequeues lower values first). Finished jobs are kept for :data:`HOP_TTL_S` so that
recovery sees a finished hop and rotates it; after that SAQ deletes the row and a probe
says ``absent`` (recovery then republishes under the same key, which the claim fence
makes harmless).

Two SAQ behaviours shape this adapter. SAQ re-queues an existing key whose job
finished (complete, failed, aborted), so ``publish`` first looks the key up and treats
any stored job as already held: the port promises that publishing a held key changes
nothing. (A job that finishes between that lookup and the enqueue is re-queued by SAQ;
its delivery is then a stale hop whose claim the ledger refuses.) And SAQ aborts an
active job by marking it ``aborting`` for its worker to notice (about once a second):
``abort`` waits up to ``abort_wait_s`` for the job to stop being live and answers
whether it did; ``aborting`` counts as live. A publish cancelled while its enqueue is in
flight fences that exact key (abort, re-probe, up to three times) before the
cancellation propagates, so no job is left that nobody recorded; if it cannot,
:class:`BrokerFenceFailed` surfaces instead. Startup recovery fences a hop that
provably belongs to a dead process with ``abort(key, terminal=True)``, which finishes
the job as aborted at once (SAQ's sweep would only after the heartbeat ran out).

``serve`` stops its SAQ workers itself rather than through ``Worker.stop``, whose single
cancellation an idle worker can absorb (the stop then never returns) and which warns of
a missed grace period on every stop (see :func:`stop_saq_worker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tenure.model import BrokerJobState, bounds, parse_hop_key
from tenure.model.validation import refuse

from .broker import BrokerProbe, PerformHop

__all__ = ["SaqBroker", "BrokerFenceFailed", "stop_saq_worker", "PUBLISH_FENCE_TRIES", "HOP_FUNCTION", "HOP_HEARTBEAT_S", "HOP_TOUCH_EVERY_S", "HOP_TTL_S", "state_of"]

log = logging.getLogger("tenure.runs.saq_broker")

HOP_FUNCTION = "tenure_run_hop"
"""The SAQ function name every hop job is enqueued under."""

HOP_HEARTBEAT_S = 120
"""SAQ's heartbeat for a hop job: a job not touched for this long is swept (aborted)."""

HOP_TOUCH_EVERY_S = 30
"""How often a live hop refreshes its job's ``touched`` time."""

HOP_TTL_S = 86_400
"""How long SAQ keeps a finished hop job (seconds), so recovery can see it finished."""

ENQUEUE_SETTLE_S = 10.0
"""How long a cancelled publish lets its in-flight enqueue finish before cancelling it."""

PUBLISH_FENCE_TRIES = 3
"""Aborts (each re-probed) a cancelled publish makes before it reports the fence failed."""

STOP_SETTLE_S = 5.0
"""How long a stopping worker lets jobs whose hop already ended finish their SAQ bookkeeping."""

STOP_RECANCEL_S = 0.05
"""How often a stopping worker cancels again a SAQ task holding no job that still runs."""


class BrokerFenceFailed(Exception):
    """A cancelled publish could not prove its job stopped after three aborts: the job may
    still run, fenced by the ledger's claim (a stale or duplicate hop is skipped), and
    explicit cancellation or startup recovery retries the abort."""


async def _shielded(fence: Any) -> None:
    """Run ``fence`` to its end even if the caller is cancelled meanwhile (then re-cancel)."""
    task = asyncio.ensure_future(fence)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError()
    task.result()

_STATES = {
    "new": BrokerJobState.QUEUED,
    "queued": BrokerJobState.QUEUED,
    "active": BrokerJobState.ACTIVE,
    "aborting": BrokerJobState.ACTIVE,  # still running until its worker notices
    "complete": BrokerJobState.COMPLETE,
    "failed": BrokerJobState.FAILED,
    "aborted": BrokerJobState.ABORTED,
}
_LIVE = frozenset({"new", "queued", "active", "aborting"})



def state_of(status: object) -> BrokerJobState | None:
    """The port's state for a SAQ status (None: a status this adapter does not know)."""
    value = getattr(status, "value", status)
    return _STATES.get(value) if type(value) is str else None


def _status(job: Any) -> str:
    value = getattr(job.status, "value", job.status)
    return str(value)


def _instant_ms(value: object) -> dt.datetime | None:
    if not bounds.is_strict_int(value) or value <= 0:  # type: ignore[operator]
        return None
    return dt.datetime.fromtimestamp(value / 1000, dt.timezone.utc)  # type: ignore[operator]


class SaqBroker:
    """The Broker port on SAQ's PostgreSQL queues ``queues`` at ``dsn``."""

    concurrent_calls = True
    """Calls for several keys may run at once (see :class:`~tenure.adapters.runs.broker.Broker`)."""

    def __init__(self, dsn: str, *, queues: Sequence[str], min_size: int = 1, max_size: int = 8,
                 abort_wait_s: float = 5.0) -> None:
        if type(dsn) is not str or not dsn.startswith(("postgresql://", "postgres://")):
            raise refuse("dsn", "postgresql_url_required")
        if "pooler=transaction" in dsn.partition("?")[2].split("&"):
            # SAQ takes session-level advisory locks and LISTENs: a pooler in transaction
            # mode breaks both, so it is refused here rather than failing later.
            raise refuse("dsn", "saq_needs_session_pooling")
        if isinstance(queues, str) or not queues or not all(bounds.is_bounded_text(q, 200) for q in queues) \
                or len(set(queues)) != len(queues):
            raise refuse("queues", "distinct_queue_names_required")
        if not (bounds.is_strict_int(min_size) and bounds.is_strict_int(max_size) and 1 <= min_size <= max_size <= 100):
            raise refuse("pool_size", "integer_out_of_range")
        if type(abort_wait_s) not in (int, float) or not 0 <= abort_wait_s <= 300:
            raise refuse("abort_wait_s", "number_out_of_range")
        self._dsn = dsn
        self._names = tuple(queues)
        self._sizes = (min_size, max_size)
        self._abort_wait_s = float(abort_wait_s)
        self._pool: Any = None
        self._queues: dict[str, Any] = {}
        self._served_here: set[str] = set()
        """The keys of the hops this process's SAQ workers run now."""
        self._aborted_here: set[str] = set()
        """Those of them this broker's own :meth:`abort` aborted: SAQ's cancellation stops them."""

    # --- lifecycle -----------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the pool and connect every queue (SAQ creates or migrates its tables)."""
        if self._queues:
            return
        try:
            from psycopg_pool import AsyncConnectionPool
            from saq.queue.postgres import PostgresQueue
        except ImportError:
            raise refuse("broker", "saq_extra_required") from None
        min_size, max_size = self._sizes
        pool = AsyncConnectionPool(self._dsn, kwargs={"autocommit": True}, min_size=min_size, max_size=max_size,
                                   open=False)
        await pool.open()
        queues: dict[str, Any] = {}
        try:
            for name in self._names:
                queue = PostgresQueue(pool=pool, name=name, min_size=min_size, max_size=max_size)
                await queue.connect()
                queues[name] = queue
        except BaseException:
            # A partial owner is never leaked: the pool goes with the failed connect.
            await pool.close()
            raise
        self._pool, self._queues = pool, queues

    async def disconnect(self) -> None:
        """Disconnect every queue (in reverse order, attempting each) and close the pool;
        re-raise the first failure after all were attempted."""
        queues, pool = list(self._queues.values()), self._pool
        self._queues, self._pool = {}, None
        failures: list[BaseException] = []
        for queue in reversed(queues):
            try:
                await queue.disconnect()
            except Exception as error:  # noqa: BLE001 - every queue is attempted
                failures.append(error)
        if pool is not None:
            try:
                await pool.close()
            except Exception as error:  # noqa: BLE001
                failures.append(error)
        if failures:
            raise failures[0]

    async def __aenter__(self) -> SaqBroker:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.disconnect()

    def queue(self, name: str) -> Any:
        """The connected SAQ queue ``name`` (for a SAQ worker)."""
        if name not in self._queues:
            raise refuse("queue", "queue_not_configured")
        return self._queues[name]

    # --- the port --------------------------------------------------------------------------

    async def publish(self, key: str, *, queue: str, wire_priority: int) -> None:
        run_id, enqueue_seq = parse_hop_key(key)
        if not bounds.is_strict_int(wire_priority) or not 0 <= wire_priority <= 100:
            raise refuse("wire_priority", "integer_out_of_range")
        target = self.queue(queue)
        if await self._find(key) is not None:
            return  # held already (queued, live or finished): publishing again changes nothing
        enqueue = asyncio.ensure_future(target.enqueue(
            HOP_FUNCTION, key=key, priority=wire_priority, retries=0, timeout=0, heartbeat=HOP_HEARTBEAT_S,
            ttl=HOP_TTL_S, run_id=run_id, enqueue_seq=enqueue_seq,
        ))
        try:
            await asyncio.shield(enqueue)
        except asyncio.CancelledError:
            # The caller went away while the enqueue was in flight: SAQ may hold the job
            # with nobody to record it. Fence that exact key before the cancellation
            # propagates (the fence itself is shielded from it).
            await _shielded(self._fence_unacknowledged(enqueue, key))
            raise

    async def _fence_unacknowledged(self, enqueue: asyncio.Future[Any], key: str) -> None:
        """Let the enqueue end (cancelling it after ENQUEUE_SETTLE_S), then abort the key,
        re-probing, up to three times."""
        done, _ = await asyncio.wait([enqueue], timeout=ENQUEUE_SETTLE_S)
        if not done:
            enqueue.cancel()
            await asyncio.wait([enqueue])
        for _ in range(PUBLISH_FENCE_TRIES):
            try:
                if await self.abort(key) and (await self.probe(key)).state not in (
                        BrokerJobState.QUEUED, BrokerJobState.ACTIVE):
                    return
            except Exception:  # noqa: BLE001 - tried again; the last failure surfaces below
                pass
        raise BrokerFenceFailed()

    async def probe(self, key: str) -> BrokerProbe:
        job = await self._find(key)
        if job is None:
            return BrokerProbe(BrokerJobState.ABSENT)
        state = state_of(job.status)
        if state is None:
            raise LookupError("unknown SAQ status")  # the broker cannot say: recovery reports it
        started = _instant_ms(job.started) if state is BrokerJobState.ACTIVE else None
        return BrokerProbe(state, started, queue=job.queue.name, wire_priority=job.priority)

    async def abort(self, key: str, *, terminal: bool = False) -> bool:
        job = await self._find(key)
        if job is None or _status(job) not in _LIVE:
            return True
        if key in self._served_here:
            self._aborted_here.add(key)
        if terminal:
            # Startup's authority over a dead process's hop: nobody will acknowledge an
            # abort, so the job is finished aborted here (SAQ's own sweep would, minutes later).
            from saq.job import Status

            await job.queue.finish(job, Status.ABORTED, error="fenced by tenure: the hop's process is gone")
        else:
            await _abort_live(job, "fenced by tenure")
        deadline = asyncio.get_running_loop().time() + self._abort_wait_s
        while True:
            job = await self._find(key)
            if job is None or _status(job) not in _LIVE:
                return True
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.2)

    # --- delivery ------------------------------------------------------------------------

    async def serve(self, queues: frozenset[str], perform: PerformHop, *, concurrency: int,
                    stopping: asyncio.Event) -> None:
        """Run one SAQ worker per queue in this event loop, each handing the hops it
        dequeues to ``perform`` with the job's ``update`` as the touch, until
        ``stopping`` is set; then stop every worker with :func:`stop_saq_worker` (a hop
        still running is cancelled and its job re-queued, which the ledger's claim then
        refuses as stale). A hop whose job :meth:`abort` aborted here is cancelled; a
        job SAQ aborts by itself (its sweep found the heartbeat missed) or another
        process aborted is logged, and its hop goes on as long as the Run ledger assigns
        it the Run (the worker's watch decides); the job itself ends aborted in SAQ.
        SAQ's workers install no signal handlers here: the process's owner keeps those.
        The stop runs to its end even if this task is cancelled meanwhile (the
        cancellation then propagates)."""
        from saq import Worker

        holding: dict[asyncio.Task[Any], Any] = {}
        closing = asyncio.Event()
        """Set before the SAQ workers are stopped: their cancellations then stop the hops."""

        async def hop(ctx: Any, *, run_id: str, enqueue_seq: int) -> str:
            # The hop runs in a task of its own: SAQ cancels this one when its job is
            # aborted. An abort this broker sent stops the hop; one SAQ made by itself
            # (its sweep after a missed heartbeat) or another process sent does not,
            # since only the Run ledger says whether the hop still holds its Run: the
            # worker's watch stops the hop when it does not (an operator's cancel, a
            # newer sequence). The worker's own stop and fence cancel the hop's task.
            job = ctx["job"]
            running = asyncio.ensure_future(perform(run_id, enqueue_seq, job.update))
            self._served_here.add(job.key)
            try:
                while True:
                    try:
                        return await asyncio.shield(running)
                    except asyncio.CancelledError:
                        if closing.is_set() or job.key in self._aborted_here or running.done():
                            running.cancel()
                            await asyncio.wait({running})
                            raise
                        current = asyncio.current_task()
                        if current is not None:
                            current.uncancel()
                        log.warning("a hop's SAQ job was aborted elsewhere (swept, or fenced by another "
                                    "process); the Run ledger decides whether it goes on")
            finally:
                self._served_here.discard(job.key)
                self._aborted_here.discard(job.key)

        # SAQ runs these in the process task that dequeued the job, around the job's hop.
        async def took(ctx: Any) -> None:
            task = asyncio.current_task()
            if task is not None:
                holding[task] = ctx["job"]

        async def released(ctx: Any) -> None:
            task = asyncio.current_task()
            if task is not None:
                holding.pop(task, None)

        workers = []
        for name in sorted(queues):
            worker: Any = Worker(self.queue(name), functions=[(HOP_FUNCTION, hop)], concurrency=concurrency,
                                 before_process=took, after_process=released)
            worker.SIGNALS = []
            workers.append(worker)
        launchers = [asyncio.ensure_future(worker.start()) for worker in workers]
        try:
            await stopping.wait()
        finally:
            closing.set()
            await _shielded(_stop_workers(workers, launchers, holding))

    async def _find(self, key: str) -> Any:
        """The job under ``key`` in any configured queue, fresh from the database."""
        for queue in self._queues.values():
            job = await queue.job(key)
            if job is not None:
                return job
        if not self._queues:
            raise refuse("broker", "not_connected")
        return None


async def _abort_live(job: Any, error: str) -> None:
    """SAQ's ``PostgresQueue.abort``, made atomic: the job's status is read under a row
    lock and the job marked in the same transaction, and only while it is live (queued:
    finished aborted at once; active: marked aborting for its worker). SAQ's own abort reads
    the status on an autocommit connection, so its lock ends with that statement, and marks
    any job that is not queued aborting: a job that completed between the two (its hop
    ended as it was aborted, more likely on a loaded machine) was marked aborting with no
    worker left to acknowledge it, and stayed live until SAQ's sweep two minutes later."""
    from saq.job import Status

    queue = job.queue
    async with queue.pool.connection() as connection, connection.transaction():
        status = await queue.get_job_status(job.key, for_update=True, connection=connection)
        if status == Status.QUEUED:
            await queue.finish(job, Status.ABORTED, error=error, connection=connection)
        elif status == Status.ACTIVE:
            await queue.update(job, status=Status.ABORTING, error=error, connection=connection)


async def _stop_workers(workers: Sequence[Any], launchers: Sequence[asyncio.Future[None]],
                        holding: dict[asyncio.Task[Any], Any]) -> None:
    """Stop every SAQ worker (each attempted) and wait for its ``start`` to return."""
    for worker, launcher in zip(workers, launchers):
        if not worker.tasks and not launcher.done():
            # start() has not run its first step (it reaches its wait in one step and
            # adds its upkeep tasks on the way): cancelled now, it never starts.
            launcher.cancel()
        with contextlib.suppress(Exception):
            await stop_saq_worker(worker, holding)
    await asyncio.gather(*launchers, return_exceptions=True)


async def stop_saq_worker(worker: Any, holding: Mapping[asyncio.Task[Any], Any] | None = None) -> None:
    """Stop a SAQ ``Worker`` whose ``start`` runs in this event loop, without
    ``Worker.stop``'s own handling of its tasks. ``holding``: the job each process task
    holds, by task (kept by ``before_process`` and ``after_process`` hooks); without it
    every task counts as holding none.

    ``Worker.stop`` cancels its tasks once, through ``wait_for(gather(...), grace)``. With
    no grace period that always logs "did not finish within the shutdown grace period"
    (the upkeep loops are asleep), and on Python 3.11 ``wait_for`` with a timeout of 0
    cancels the gather and then waits for it with no limit. A process task idle in
    ``PostgresQueue.dequeue`` can absorb that one cancellation: its listen loop's
    ``wait_for(queue.get(), 1.0)`` returns a notification that arrived in the same step
    instead of raising (bpo-42130), and the loop then waits for notifications as long as
    the queue is connected; the stop never returns.

    So the worker's tasks are taken from it and its event is set: no new process task,
    and ``start`` returns through ``Worker.stop``, which finds nothing left to wait for.
    Tasks holding no job (idle in ``dequeue``, or upkeep loops) are cancelled, again
    every :data:`STOP_RECANCEL_S` while they run on. A task holding a job whose hop
    already ended is left to record the job's end in SAQ (cancelled, it would leave the
    job active although its Run settled) for up to :data:`STOP_SETTLE_S`; one whose hop
    still runs is cancelled once, as SAQ would (SAQ then cancels the hop, waits for it
    and re-queues the job).
    """
    holding = holding if holding is not None else {}
    tasks: set[asyncio.Task[Any]] = set(worker.tasks)
    worker.tasks.clear()
    worker.event.set()
    loop = asyncio.get_running_loop()
    settle_until = loop.time() + STOP_SETTLE_S
    cancelled: set[asyncio.Task[Any]] = set()
    while tasks:
        for task in tasks:
            job = holding.get(task)
            if job is None:
                task.cancel()
                continue
            context = worker.job_task_contexts.get(job)
            recording = context is not None and context["task"].done() and loop.time() < settle_until
            if task not in cancelled and not recording:
                task.cancel()
                cancelled.add(task)
        _, tasks = await asyncio.wait(tasks, timeout=STOP_RECANCEL_S)
    await worker.stop()
