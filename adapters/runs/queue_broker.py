"""Run hops on tenure's own task queue: the Broker port with no broker service at all.

``QueueBroker(db_url, *, queues)`` keeps each hop as a task in ``tenure_tasks`` (schema
step ``tasks_v1``), in a task queue of its own (:data:`HOP_QUEUE`, or its workflow pin's:
see Versions), driven by the same queue kernel and store code as every task: a hop is an owned submission of the task
:data:`HOP_TASK` whose submission ID is the hop key (so publishing a held key is an
exact replay and changes nothing, in any status), claimed with a fresh claim token,
renewed by heartbeats, finished by its fence. Their own task queues keep hops away from
the application's task workers, which serve theirs.

Priority: tasks are claimed by priority (higher first), then due time, then job ID
(time-ordered), so a hop's task priority is ``100 - wire_priority``: a higher Run
priority is always claimed first, and equal priorities in publication order.

A hop's task queue holds every Run queue of a database: the Run queue rides in the task's
arguments (``{"key": ..., "queue": ...}``) and a worker of this broker serves all of
``queues`` (its ``RunWorker.queues`` must be the same set).

Publishing with the ledger: on PostgreSQL, a ledger on the same database and schema
submits a hop and records its publication in one statement (the
:class:`~tenure.adapters.runs.broker.JoinedPublisher` capability: :meth:`QueueBroker.hop_insertion`
gives the hop's submission as the queue kernel decides it; ``RunLedger.publish`` writes it
beside ``RECORD_PUBLISHED``, both or neither); whatever that statement does not write goes
through :meth:`QueueBroker.publish` as before.

Waking: on PostgreSQL every serving loop listening on the task table's channel is woken
by the submit itself (a task that becomes pending notifies it in its own transaction);
where nobody listens (SQLite, a lost listener) a publish wakes this process's serving
loop at once; the poll (``poll_s``) is the fallback. A listener whose connection was
lost wakes its loop, which opens another one (logged once per loss) and claims once
before it waits again. A loop claims only when a hop may be due (one of those wakes, or
its last claim filled every free slot), so a hop that ends frees its slot without a
claim that would find nothing; where a claim is one statement (PostgreSQL) it claims
without looking first, and where it is a transaction (SQLite) it looks first without a
lock.

Hops of earlier versions: they lived in ``tenure_run_hops`` (a table of the validation
queue's shape, step ``runs_v3``). A serving loop adopts them (when it starts, then once
per lease): a queued hop is published here under its key and priority and its old row
cancelled, in one transaction that locks the old row first (a process of an earlier
version that claims it meanwhile keeps it); a claimed hop stays where it is, and its process finishes it
there by its fence; a claimed hop whose lease ran out is settled there by the kernel's
sweep (with one attempt, ``failed``), so its probe tells recovery what happened.
``probe`` and ``abort`` read the old table for a key this table does not hold.

Versions: a Run's hop is published into its workflow pin's own task queue
(:func:`pinned_hop_queue`: the ``(name, version)`` the ledger hands over through the
:class:`~tenure.adapters.runs.broker.PinnedPublisher` port), and a serving loop claims
from the queues of the pins its worker serves (``RunWorker`` passes them) beside
:data:`HOP_QUEUE`, so a worker never takes a Run of a version it does not serve: a rolling
deploy leaves the new version's hops to the new workers however many old ones poll, and
a Run whose version nobody serves waits untouched. (A claim over several queues keeps
the task index's order without its queue column; the hops of a version nobody serves
are passed over by every claim until one does.) A hop published without a pin (by an
earlier version, or adopted from ``tenure_run_hops``) reaches every worker; one whose
worker does not serve its Run (``unserved``: the ledger refused the claim and left the
Run as it was) is given back, its attempt returned, due again after
:func:`hand_back_delay_us` (0.5 s doubling per claim of it, at most 30 s), for a worker
that serves it. A pinned publication of a key an earlier version published without a
pin replays that hop as it was.

Abort: a pending hop is cancelled at once. A hop this process serves is cancelled and
waited for (``abort_wait_s``), then its job cancelled. A hop another process serves has
its job cancelled, which voids that claim; that process's worker stops the hop once the
Run ledger shows the hop lost its Run (a cancellation makes it CANCELLING first), never
on the queue's word alone. Nothing there acknowledges it to this process, so such a hop counts
as live (probe ``active``, abort False) until one full lease has passed since the cancel;
``terminal=True`` (startup recovery, for a hop of a dead process) counts it stopped at
once. A hop that raised, was cancelled or was stopped with the worker is finished
``failed`` (the ledger's claim fence makes every later delivery of it stale).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import hashlib
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tenure.kernel.core import Condition, Finder, Param
from tenure.kernel.queue import finders as queue_finders
from tenure.kernel.queue.commands import CancelAdmin, ExpireLease
from tenure.kernel.queue.machine import QueueRefusal
from tenure.kernel.queue.record import QueueRow
from tenure.model import (
    BrokerJobState,
    JobStatus,
    QueueClaimFence,
    QueueKind,
    TaskJob,
    TenureError,
    WorkerConfig,
    bounds,
    load_json,
    parse_hop_key,
)
from tenure.model.fingerprint import SubmissionSnapshot, snapshot_submission
from tenure.model.validation import micros_to_datetime, refuse

from ..core.engine import Insertion
from ..core.outages import OutageLog
from ..core.store import Listener, Transaction
from ..queue.operations import QueueOperations
from ..queue.sources import time_ordered_id
from ..queue.table import HOPS_BINDING, TASKS_BINDING
from ..wiring.dialects import open_store
from .broker import UNSERVED_OUTCOME, BrokerProbe, PerformHop, stop_served_hop

__all__ = ["QueueBroker", "HOP_QUEUE", "HOP_TASK", "HOP_CONTRACT", "PRIORITY_EPOCH", "pinned_hop_queue"]

log = logging.getLogger("tenure.runs.queue_broker")

HOP_QUEUE = "tenure_run_hops"
"""The task queue of the hops published without a workflow pin (by a caller that passed
none, by an earlier version, or adopted from ``tenure_run_hops``): every worker takes them."""


def pinned_hop_queue(workflow: tuple[str, str]) -> str:
    """The task queue of the hops of Runs pinned to ``workflow`` ``(name, version)``:
    :data:`HOP_QUEUE` and 24 hex digits of the pair's SHA-256 (an identifier of 40
    characters, whatever the name). Only a worker that serves the pair claims from it; a
    collision of digests (2**-96 for a pair of pins) would only bring back the hand-back."""
    name, version = workflow
    digest = hashlib.sha256(f"{len(name)}:{name}{version}".encode()).hexdigest()[:24]
    return f"{HOP_QUEUE}_{digest}"

HOP_TASK = "tenure.run_hop"
"""The task name of every hop (its arguments: the hop key and the Run queue)."""

HOP_CONTRACT = HOP_TASK
"""The ``contract_name`` hops had in ``tenure_run_hops`` (earlier versions)."""

PRIORITY_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
"""Earlier versions' hops were due at this instant plus their wire priority in seconds."""

_BY_KEY = Finder("hop_by_key", ((Condition("submission_id", "=", Param("key")),),), order=("job_id",), lock="none")
_OF_HOPS = Condition("queue_name", "in", Param("queues"))
_DUE = Finder("hop_due", ((*queue_finders.eligible.any_of[0], _OF_HOPS), (*queue_finders.expired.any_of[0], _OF_HOPS)),
              order=("fires_at_us", "job_id"), lock="none")
"""The hop tasks (of the task queues ``:queues``) a claim would take or settle first, read without locking: pending hops
that are due, and claims whose lease ran out (their process died between its queue claim
and its Run claim; only a claim sweeps them, and the relay keeps their Run QUEUED while
the queue still calls them active). An idle worker looks before it claims, so polling an
empty queue takes no write lock (SQLite has one for the file)."""

_LEGACY_IN_FLIGHT = Finder("legacy_hops_in_flight", (
    (Condition("status", "=", JobStatus.PENDING),),
    (Condition("status", "=", JobStatus.CLAIMED), Condition("lease_expires_at_us", "<=", Param("now"))),
), order=("job_id",), lock="none")
"""Hops an earlier version left in ``tenure_run_hops`` that need this process: queued
ones (to adopt) and claims whose lease ran out (to settle)."""

ADOPT_BATCH = 200
"""Old hops adopted per round."""

_STATES = {
    JobStatus.PENDING: BrokerJobState.QUEUED,
    JobStatus.CLAIMED: BrokerJobState.ACTIVE,
    JobStatus.COMPLETED: BrokerJobState.COMPLETE,
    JobStatus.FAILED: BrokerJobState.FAILED,
    JobStatus.CANCELLED: BrokerJobState.ABORTED,
}


def _hop_submission(key: str, queue: str, wire_priority: int,
                    workflow: tuple[str, str] | None = None) -> SubmissionSnapshot:
    """A hop's task as an owned submission under its key (the same on every replay), in
    its pin's task queue (:func:`pinned_hop_queue`; :data:`HOP_QUEUE` without one)."""
    task_queue = HOP_QUEUE if workflow is None else pinned_hop_queue(workflow)
    job = TaskJob(task_queue, HOP_TASK, {"key": key, "queue": queue}, priority=100 - wire_priority,
                  retry_base_ms=0, retry_max_ms=0, retry_jitter=False, max_attempts=1)
    return snapshot_submission(QueueKind.TASK, job, key)


def _is_pin(workflow: object) -> bool:
    """A ``(name, version)`` pair of non-empty text (a Run's pin)."""
    return type(workflow) is tuple and len(workflow) == 2 and all(bounds.is_bounded_text(part, 100)
                                                                  for part in workflow)


def _pin(workflow: object) -> tuple[str, str]:
    """``workflow`` checked (:func:`_is_pin`), else refused (``ConfigValidationError``)."""
    if not _is_pin(workflow):
        raise refuse("workflow", "workflow_name_version_pair_required")
    return workflow  # type: ignore[return-value]


HAND_BACK_FIRST_S = 0.5
HAND_BACK_MAX_S = 30.0
"""A hop published without a pin and handed back (``unserved``) is due again after 0.5 s,
doubling with each claim of it to at most 30 s. (Such a hop goes to whichever worker
claims first when it is due: a worker that serves it wins each time with its share of
the polling workers.)"""


def hand_back_delay_us(generation: int) -> int:
    """The delay of a hop handed back after its ``generation``-th claim."""
    doublings = min(max(generation - 1, 0), 16)
    return round(min(HAND_BACK_MAX_S, HAND_BACK_FIRST_S * 2.0 ** doublings) * 1_000_000)


SERVE_BACKOFF_MAX_S = 2.0
"""The longest pause of a serving loop after database failures in a row."""


async def _wait_any(stopping: asyncio.Event, wake: asyncio.Event | None, timeout: float) -> None:
    """Wait until ``stopping`` (or ``wake``) is set, or ``timeout`` passed."""
    waits = {asyncio.ensure_future(stopping.wait())}
    if wake is not None:
        waits.add(asyncio.ensure_future(wake.wait()))
    _, pending = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    for waiting in pending:
        waiting.cancel()


class _Listening:
    """A serving loop's notification listener (PostgreSQL; SQLite has none): opened at
    the start, and opened again whenever its connection was lost (the server or a proxy
    cut it, or its own check found it silent), so a long ``poll_s`` is only ever the
    fallback. A loss is logged once, the reconnect once it succeeds."""

    def __init__(self, operations: QueueOperations, announce: Callable[[], None]) -> None:
        self._operations = operations
        self._announce = announce
        self._listener: Listener | None = None
        self._listens = True
        """False once the store answered that it has no notifications (SQLite)."""
        self._lost = False

    async def ensure(self) -> bool:
        """Open the listener if it is not live; True when a lost one was just replaced
        (the caller claims once more: announcements made meanwhile were not heard)."""
        if not self._listens or (self._listener is not None and self._listener.alive):
            return False
        if self._listener is not None and not self._lost:
            self._lost = True
            log.warning("the hop queue's notification listener lost its connection; reconnecting")
        try:
            listener = await self._operations.store.listen(TASKS_BINDING, self._announce)
        except TenureError:
            return False  # the database is away: the poll goes on, and the next idle round tries again
        if listener is None:
            self._listens = False
            return False
        old, self._listener = self._listener, listener
        if old is None:
            return False
        self._lost = False
        log.info("the hop queue's notification listener listens again")
        with contextlib.suppress(Exception):
            await old.close()
        return True

    @property
    def hears(self) -> bool:
        """True while a live listener hears every hop that becomes pending."""
        return self._listener is not None and self._listener.alive

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(Exception):
                await listener.close()


class QueueBroker:
    """The Broker port (and hop source) on the owned queue in ``db_url``'s database."""

    concurrent_calls = True
    """Calls for several keys may run at once (see :class:`~tenure.adapters.runs.broker.Broker`)."""

    def __init__(self, db_url: str, *, queues: Sequence[str], lease_seconds: float = 120.0,
                 heartbeat_seconds: float = 30.0, poll_s: float = 0.05, abort_wait_s: float = 5.0) -> None:
        if isinstance(queues, str) or not queues or not all(bounds.is_bounded_text(q, 50) for q in queues) \
                or len(set(queues)) != len(queues):
            raise refuse("queues", "distinct_queue_names_required")
        for name, value, top in (("poll_s", poll_s, 60), ("abort_wait_s", abort_wait_s, 300)):
            if type(value) not in (int, float) or not 0 < value <= top:
                raise refuse(name, "number_out_of_range")
        config = WorkerConfig(db_url, lease_seconds=lease_seconds, heartbeat_seconds=heartbeat_seconds,
                              max_attempts=1)
        self._queues = frozenset(queues)
        self._config = config
        self._poll_s = float(poll_s)
        self._abort_wait_s = float(abort_wait_s)
        store = open_store(db_url, timeout_seconds=config.timeout_seconds, schema=config.db_schema)
        self._ops = QueueOperations(store, QueueKind.TASK, config, new_job_id=time_ordered_id)
        self._legacy = QueueOperations(store, QueueKind.VALIDATION, config, binding=HOPS_BINDING)
        """The hops table of earlier versions (adopted, read and cancelled; never claimed)."""
        self._owner = f"tenure-hops:{os.getpid()}:{secrets.token_hex(4)}"
        self._wake: asyncio.Event | None = None
        """Set to wake this process's serving loop at once (a hop ended, or may be due)."""
        self._maybe_due = True
        """Whether a claim could find a hop (see :meth:`_serve_round`): set by an
        announcement, a publish of this process nobody announces, a claim that filled every
        free slot, the fallback poll and a failed round; cleared just before a claim."""
        self._listening: _Listening | None = None
        self._serves: Callable[[], Iterable[tuple[str, str]]] | None = None
        """The pins the serving loop claims the hops of (see :meth:`serve`)."""
        self._task_queues: tuple[tuple[tuple[str, str], ...], list[str]] = ((), [HOP_QUEUE])
        """The pins last served, and the task queues they claim from (kept: a claim round
        every poll would otherwise hash every pin)."""
        self._served: dict[str, asyncio.Task[Any]] = {}
        self._fenced_terminally: set[str] = set()
        """Keys this process fenced with startup's authority: stopped, whoever claimed them."""

    async def close(self) -> None:
        await self._ops.store.close()

    async def disconnect(self) -> None:
        """Close the broker's connections (the lifespan's disconnect)."""
        await self.close()

    # --- the port --------------------------------------------------------------------------

    async def publish(self, key: str, *, queue: str, wire_priority: int) -> None:
        await self._submit(key, queue, wire_priority)

    async def publish_pinned(self, key: str, *, queue: str, wire_priority: int, workflow: tuple[str, str]) -> None:
        """:meth:`publish`, into the pin's task queue (:func:`pinned_hop_queue`), so no
        worker of another version ever claims it. A key an earlier version already
        published without a pin (its submission differs only in the task queue: the queue
        kernel refuses it as ``fingerprint_mismatch``) is replayed as it was published,
        and its workers hand it back as before."""
        await self._submit(key, queue, wire_priority, _pin(workflow))

    async def _submit(self, key: str, queue: str, wire_priority: int, pin: tuple[str, str] | None = None) -> None:
        """Check the hop's queue and priority, submit its task (in ``pin``'s task queue,
        or as published unpinned where an earlier version did) and announce it."""
        if queue not in self._queues:
            raise refuse("queue", "queue_not_configured")
        if not bounds.is_strict_int(wire_priority) or not 0 <= wire_priority <= 100:
            raise refuse("wire_priority", "integer_out_of_range")
        try:
            await self._ops.submit_owned(_hop_submission(key, queue, wire_priority, pin))
        except TenureError as error:
            if pin is None or error.reason != QueueRefusal.FINGERPRINT_MISMATCH.value:
                raise
            await self._ops.submit_owned(_hop_submission(key, queue, wire_priority))
        if self._listening is None or not self._listening.hears:
            self._announce()  # a live listener hears the submit's own announcement instead

    def hop_insertion(self, key: str, *, queue: str, wire_priority: int, store: object,
                      workflow: tuple[str, str] | None = None) -> Insertion | None:
        """See :class:`~tenure.adapters.runs.broker.JoinedPublisher`: this broker's
        submission of the hop where ``store`` writes to this broker's own tables (the same
        database and schema, a store with decided-ahead statements: PostgreSQL), in the
        pin's task queue when ``workflow`` names one."""
        ahead = getattr(store, "ahead", None)
        if ahead is None or not ahead.same_database(self._ops.store) or queue not in self._queues \
                or not bounds.is_strict_int(wire_priority) or not 0 <= wire_priority <= 100:
            return None
        if workflow is not None and not _is_pin(workflow):
            return None  # publish_pinned refuses it
        return self._ops.owned_insertion(_hop_submission(key, queue, wire_priority, workflow))

    def hop_inserted(self, key: str) -> None:
        if self._listening is None or not self._listening.hears:
            self._announce()  # a live listener hears the statement's own announcement instead

    def _announce(self) -> None:
        """A hop may be due: the serving loop claims in its next round, at once."""
        self._maybe_due = True
        if self._wake is not None:
            self._wake.set()

    async def _row(self, key: str) -> tuple[QueueRow | None, int]:
        """The hop's row (this table's, else an earlier version's), and the clock."""
        async def body(tx: Transaction) -> tuple[QueueRow | None, int]:
            rows = await tx.find(TASKS_BINDING, _BY_KEY, {"key": key}, 1)
            if not rows:
                rows = await tx.find(HOPS_BINDING, _BY_KEY, {"key": key}, 1)
            return (rows[0] if rows else None), await tx.now_us()

        result: tuple[QueueRow | None, int] = await self._ops.store.run(body, write=False)
        return result

    @staticmethod
    def _queue_and_wire(row: QueueRow) -> tuple[str, int]:
        """The Run queue and wire priority a hop row was published with."""
        if row.queue is QueueKind.TASK:
            args = load_json(row.payload[0]) if row.payload[0] is not None else {}
            return str(args.get("queue")), 100 - row.priority
        epoch_us = int(PRIORITY_EPOCH.timestamp() * 1_000_000)
        return str(row.payload[1]), int((row.fires_at_us - epoch_us) // 1_000_000)

    def _ops_for(self, row: QueueRow) -> QueueOperations:
        return self._ops if row.queue is QueueKind.TASK else self._legacy

    def _still_running_elsewhere(self, row: QueueRow, now_us: int) -> bool:
        """A cancelled hop that was claimed by another process within the last lease."""
        return (row.status is JobStatus.CANCELLED and row.claim_token is not None and row.owner_id != self._owner
                and row.submission_id not in self._fenced_terminally
                and row.completed_at_us is not None and now_us < row.completed_at_us + self._config.lease_us)

    async def probe(self, key: str) -> BrokerProbe:
        row, now = await self._row(key)
        if row is None:
            return BrokerProbe(BrokerJobState.ABSENT)
        state = BrokerJobState.ACTIVE if self._still_running_elsewhere(row, now) else _STATES[row.status]
        started = micros_to_datetime(row.claimed_at_us) if state is BrokerJobState.ACTIVE else None
        queue, wire = self._queue_and_wire(row)
        return BrokerProbe(state, started, queue=queue, wire_priority=wire)

    async def abort(self, key: str, *, terminal: bool = False) -> bool:
        if not await stop_served_hop(self._served.get(key), self._abort_wait_s):
            return False
        for _ in range(3):  # a claim may win the race with a pending hop's cancel: look again
            row, now = await self._row(key)
            if row is None:
                return True
            if row.status in (JobStatus.PENDING, JobStatus.CLAIMED):
                if await self._ops_for(row).cancel_admin(row.job_id):
                    row, now = await self._row(key)
                continue
            break
        if row is None or row.status in (JobStatus.PENDING, JobStatus.CLAIMED):
            return False
        if terminal:
            self._fenced_terminally.add(key)
        return not self._still_running_elsewhere(row, now)

    # --- delivery ------------------------------------------------------------------------

    async def serve(self, queues: frozenset[str], perform: PerformHop, *, concurrency: int,
                    stopping: asyncio.Event, serves: Callable[[], Iterable[tuple[str, str]]] | None = None) -> None:
        """Claim hops (up to ``concurrency`` at once), run each through ``perform``,
        heartbeat the running ones every ``heartbeat_seconds`` and finish each by its
        fence. A refused heartbeat (the claim lapsed or was cancelled) is logged and
        nothing more: the Run ledger's fence decides whether the hop still holds its Run
        (the worker's watch stops it when it does not), so a hop that stalled past its
        queue lease but still holds its Run finishes and settles it.

        ``serves`` (the :class:`~tenure.adapters.runs.broker.PinnedPublisher` port): the
        workflow pins whose hops this loop claims, asked before each claim; hops published
        without a pin are claimed whatever it says (None: only those)."""
        if frozenset(queues) != self._queues:
            raise refuse("queues", "a_queue_broker_worker_serves_all_its_queues")
        self._serves = serves
        self._claimed_queues()  # pins that are not (name, version) pairs are refused here, not met as an outage
        fences: dict[str, QueueClaimFence] = {}
        lapsed: set[str] = set()
        wake = asyncio.Event()
        self._wake = wake
        self._maybe_due = True
        heartbeat_every = float(self._config.heartbeat_seconds)
        last_beat = time.monotonic()
        adopt_every = float(self._config.lease_seconds)
        last_adoption: float | None = None
        failures = 0
        outage = OutageLog(log, "the hop queue's database")
        listening = self._listening = _Listening(self._ops, self._announce)
        await listening.ensure()
        try:
            while not stopping.is_set():
                try:
                    if last_adoption is None or time.monotonic() - last_adoption >= adopt_every:
                        last_adoption = time.monotonic()
                        try:
                            if await self._adopt_legacy_hops():
                                self._maybe_due = True
                        except TenureError as error:  # tried again after a lease; serving goes on
                            log.warning("adopting an earlier version's hops failed (%s); trying again later",
                                        error.reason)
                    claimed = await self._serve_round(perform, concurrency, fences, lapsed, wake)
                    if self._served and time.monotonic() - last_beat >= heartbeat_every:
                        last_beat = time.monotonic()
                        await self._heartbeat(fences, lapsed)
                    failures = 0
                    outage.answered()
                except TenureError as error:
                    # The database failed this round (an outage, a busy SQLite file): the
                    # hops already running go on, and serving resumes after a backoff.
                    failures += 1
                    self._maybe_due = True  # the round's claim may not have run
                    outage.failed("serving hops", error.code.value, error.reason)
                    claimed = []
                    await _wait_any(stopping, None, min(SERVE_BACKOFF_MAX_S, self._poll_s * 2 ** failures))
                    continue
                if not claimed:
                    if await listening.ensure():
                        self._maybe_due = True
                        continue  # listening again: what was announced while nobody listened was not heard
                    # Idle or full: wait for a hop to end, an announcement, the stop, or the poll interval.
                    await _wait_any(stopping, wake, self._poll_s)
                    if not wake.is_set():
                        self._maybe_due = True  # the fallback poll
                    wake.clear()
        finally:
            self._wake = None
            self._listening = None
            await listening.close()
            running = list(self._served.items())
            for _, task in running:
                task.cancel()
            if running:
                await asyncio.wait([task for _, task in running])
            for key, task in running:
                self._served.pop(key, None)
                with contextlib.suppress(Exception):
                    await self._finish(fences.pop(key), task)

    async def _serve_round(self, perform: PerformHop, concurrency: int, fences: dict[str, QueueClaimFence],
                           lapsed: set[str], wake: asyncio.Event) -> list[QueueRow]:
        """Finish the hops that ended (a finish that fails is retried next round), then
        claim up to the free slots and start each claimed hop.

        A round claims only while a hop may be due (``_maybe_due``): a claim that took
        fewer hops than it asked for left none due, and every hop that becomes due after
        it is announced (the task table's notification, or this process's publish where
        nobody listens) or met by the fallback poll; so a hop that ends frees its slot
        without a claim that would find nothing. The flag is cleared before the claim: an
        announcement that arrives while it runs sets it again. Where a claim is one
        statement (a decided-ahead store), it claims without looking first."""
        for key, task in list(self._served.items()):
            if task.done():
                await self._finish(fences[key], task)
                del self._served[key]
                del fences[key]
                lapsed.discard(key)
        free = concurrency - len(self._served)
        claimed: list[QueueRow] = []
        if free > 0 and self._maybe_due:
            self._maybe_due = False
            if self._ops.store.ahead is not None or await self._any_due():
                tokens = [secrets.token_hex(16) for _ in range(free)]
                set_aside = self._ops.unreadable_failed
                claimed = await self._ops.claim_owned(self._owner, tokens, lambda record: record, self._claimed_queues())
                # A claim that filled every free slot, or set rows aside, may have left more
                # due. Set, never cleared here: an announcement heard while the claim ran stays.
                if len(claimed) == free or self._ops.unreadable_failed != set_aside:
                    self._maybe_due = True
        for record in claimed:
            hop = str(record.submission_id)  # the hop key
            run_id, seq = parse_hop_key(hop)
            fences[hop] = QueueClaimFence(QueueKind.TASK, record.job_id, self._owner,
                                          record.generation, str(record.claim_token))
            task = asyncio.ensure_future(perform(run_id, seq, None))
            task.add_done_callback(lambda _: wake.set())  # finish it and claim again at once
            self._served[hop] = task
        return claimed

    def _claimed_queues(self) -> list[str]:
        """The task queues a claim takes hops from: the unpinned hops' and those of the
        pins the loop serves now."""
        pins = () if self._serves is None else tuple(sorted(set(self._serves())))
        if pins != self._task_queues[0]:
            # A pair that is not a pin is refused (at the start of serve; a registry's pins
            # are checked when registered, so later rounds do not meet one).
            self._task_queues = (pins, [HOP_QUEUE, *(pinned_hop_queue(_pin(pin)) for pin in pins)])
        return self._task_queues[1]

    async def _heartbeat(self, fences: dict[str, QueueClaimFence], lapsed: set[str]) -> None:
        keys = [key for key in fences if key in self._served and not self._served[key].done()]
        answers = await self._ops.heartbeat_owned([fences[key] for key in keys])
        for key, alive in zip(keys, answers, strict=True):
            if not alive and key not in lapsed:
                # The queue no longer counts this claim (its lease lapsed while the process
                # stalled, or another process cancelled the job). The ledger, not the
                # queue, says whether the hop still holds its Run: the worker's watch stops
                # the hop when it does not, and a hop that does settles it.
                lapsed.add(key)
                log.warning("hop %s: its queue claim lapsed; the Run ledger decides whether it goes on", key,
                            extra={"hop": key})

    async def _any_due(self) -> bool:
        """Whether a claim would find a hop (read, never locked: where a claim is a
        transaction, as on SQLite, an idle poll takes no write lock)."""
        async def body(tx: Transaction) -> bool:
            return bool(await tx.find(TASKS_BINDING, _DUE, {"now": await tx.now_us(), "queues": queues}, 1))

        queues = self._claimed_queues()

        due: bool = await self._ops.store.run(body, write=False)
        return due

    async def _finish(self, fence: QueueClaimFence, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is not None:
            await self._ops.fail_owned(fence, "hop_did_not_return", retry=False, dlq_record_id=None)
        elif task.result() == UNSERVED_OUTCOME:
            # Not ours to run (a Run of a version this worker does not serve): given back
            # with its attempt returned, due after a backoff that grows with each claim of
            # it, so workers of the other version do not keep taking it from the one that
            # serves it. Refused (the lease ran out meanwhile): a claim's sweep ends it and
            # the relay rotates the Run, as for any hop nobody claimed.
            await self._ops.release_owned([fence], delay_us=hand_back_delay_us(fence.generation))
        else:
            await self._ops.complete_owned([(fence, None)])

    async def _adopt_legacy_hops(self) -> int:
        """Adopt what an earlier version left in ``tenure_run_hops`` (see the module
        docstring); how many rows it looked at."""
        async def body(tx: Transaction) -> list[QueueRow]:
            return await tx.find(HOPS_BINDING, _LEGACY_IN_FLIGHT, {"now": await tx.now_us()}, ADOPT_BATCH)

        rows: list[QueueRow] = await self._legacy.store.run(body, write=False)
        for row in rows:
            if row.status is JobStatus.PENDING:
                await self._legacy.store.run(functools.partial(self._adopt, row=row), write=True)
            else:  # a claim of an earlier version whose lease ran out: the kernel settles it
                await self._legacy.engine.on_keys(HOPS_BINDING, [(row.job_id, ExpireLease())], queue_finders.by_keys)
        if rows:
            log.info("adopted or settled %d hops of an earlier version (tenure_run_hops)", len(rows))
        return len(rows)

    async def _adopt(self, tx: Transaction, *, row: QueueRow) -> bool:
        """In one transaction: lock the old row, and only while it is still queued
        publish its hop here (unless this table holds its key already) and cancel it there
        (a process of an earlier version that claimed it meanwhile keeps it; an abort that
        cancelled it first wins)."""
        locked = await tx.locked(HOPS_BINDING, queue_finders.by_keys, {"keys": [row.job_id]})
        current = locked[0] if locked else None
        if current is None or current.status is not JobStatus.PENDING:
            return False
        key = str(current.submission_id)
        if not await tx.find(TASKS_BINDING, _BY_KEY, {"key": key}, 1):
            # A key already here (a relay of this version published it, pinned, before
            # the old row was adopted) is that hop: only the old row is cancelled. (Its
            # unpinned submission would differ from the pinned one and be refused.)
            queue, wire = self._queue_and_wire(current)
            await self._ops.submit_many_in(tx, [_hop_submission(key, queue, min(100, max(0, wire)))])
        await self._legacy.engine.decide_one(tx, HOPS_BINDING, current, CancelAdmin())
        return True
