"""The broker port Runs are delivered through, and an in-memory broker for tests and demos.

A broker holds one job per hop key (``run:<run_id>:<seq>``). The Run ledger needs three
things of it: ``publish`` a hop (idempotent by key: publishing a key it already holds
changes nothing; any failure raises), ``probe`` what it knows of a key, and ``abort`` a
live job (True once the job is not live any more). A broker is never trusted with a
Run's state: a worker receives only the run ID and sequence, and the ledger's claim
decides whether that hop may run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from tenure.model import LIVE_BROKER_STATES, BrokerJobState, parse_hop_key

from ..core.engine import Insertion

__all__ = ["Broker", "BrokerProbe", "BrokerJobState", "InMemoryBroker", "BrokerUnavailable", "LIVE_STATES",
           "fence_hop", "probe_or_none", "HopSource", "PerformHop", "Touch", "JoinedPublisher", "PinnedPublisher", "UNSERVED_OUTCOME"]

LIVE_STATES = LIVE_BROKER_STATES
"""A job in these states may still start or is executing (the model's set)."""


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerProbe:
    """What a broker says of one key; ``started_at`` is set for an active job when the
    broker knows when it started; ``queue`` and ``wire_priority`` are what the broker
    holds the job under, when it says (recovery reports a job held under another queue
    or priority than its delivery's as a mismatch)."""

    state: BrokerJobState
    started_at: dt.datetime | None = None
    queue: str | None = None
    wire_priority: int | None = None


@runtime_checkable
class Broker(Protocol):
    async def publish(self, key: str, *, queue: str, wire_priority: int) -> None:
        """Enqueue the hop ``key`` on ``queue`` (lower ``wire_priority`` first); raise on
        any failure, including a lost acknowledgement."""

    async def probe(self, key: str) -> BrokerProbe:
        """The job's state (``absent`` when the broker holds no job under the key)."""

    async def abort(self, key: str, *, terminal: bool = False) -> bool:
        """Abort the job if it is live; True when it is not live any more. With
        ``terminal`` (startup recovery, only for a hop proven to belong to a dead
        process) finish it as aborted without waiting for its worker to acknowledge."""

    # A broker may also declare ``concurrent_calls = True`` (a class attribute): its
    # methods accept calls for several keys at once, so the runtime's recovery visits
    # several Runs of a page at once (RecoveryPorts.concurrency).


@runtime_checkable
class JoinedPublisher(Protocol):
    """A broker that keeps its hops in the Run ledger's own database (tenure's own queue,
    :class:`~tenure.adapters.runs.queue_broker.QueueBroker`) may offer this: the ledger
    then submits a hop and records its publication in one statement where it can
    (``RunLedger.publish``); any other broker is published to as the port says."""

    def hop_insertion(self, key: str, *, queue: str, wire_priority: int, store: object,
                      workflow: tuple[str, str] | None = None) -> Insertion | None:
        """The hop ``key``'s submission as a row one statement of ``store`` (the ledger's)
        may insert beside the ledger's write, or None (``store`` does not reach this
        broker's tables, or :meth:`Broker.publish` would refuse the arguments): the
        ledger then publishes it the ordinary way. ``workflow``: the Run's pin, as for
        :meth:`PinnedPublisher.publish_pinned`."""

    def hop_inserted(self, key: str) -> None:
        """Told after a statement of the ledger inserted the hop: what ``publish`` does
        after its submit (wake this process's serving loop where nobody listens)."""


@runtime_checkable
class PinnedPublisher(Protocol):
    """A broker that keeps each hop under its Run's workflow pin, so that only a worker
    serving that pin ever takes it (tenure's own queue,
    :class:`~tenure.adapters.runs.queue_broker.QueueBroker`). ``RunLedger.publish``
    hands such a broker the Run's ``(name, version)``, and ``RunWorker`` the pins it
    serves; any other broker delivers every hop to every worker, and a worker that does
    not serve the Run's pin hands it back (``unserved``)."""

    async def publish_pinned(self, key: str, *, queue: str, wire_priority: int, workflow: tuple[str, str]) -> None:
        """:meth:`Broker.publish`, for a Run pinned to ``workflow`` ``(name, version)``."""

    async def serve(self, queues: frozenset[str], perform: PerformHop, *, concurrency: int,
                    stopping: asyncio.Event,
                    serves: Callable[[], Iterable[tuple[str, str]]] | None = None) -> None:
        """:meth:`HopSource.serve`, taking only the hops published without a pin and those
        of the pins ``serves()`` names (asked again before every claim)."""


Touch = Callable[[], Awaitable[None]]
"""Refreshes the broker's liveness of one running hop (SAQ's ``touched``)."""

PerformHop = Callable[[str, int, "Touch | None"], Awaitable[str]]
"""A worker's handler of one delivered hop: ``(run_id, enqueue_seq, touch)`` -> outcome."""

UNSERVED_OUTCOME = "unserved"
"""The outcome of a hop its worker did not claim because it does not serve the Run's
workflow name and version (the ledger left the Run as it was). The hop must reach a worker
that serves it: :class:`~tenure.adapters.runs.queue_broker.QueueBroker` gives its task
back, due again after a backoff (its attempt returned, so nothing is spent); a broker
that finishes the job instead (the in-memory one, SAQ) leaves it to the relay, which
rotates the Run to its next sequence and publishes that (one delivery row per round)."""


@runtime_checkable
class HopSource(Protocol):
    async def serve(self, queues: frozenset[str], perform: PerformHop, *, concurrency: int,
                    stopping: asyncio.Event) -> None:
        """Hand each hop of ``queues`` to ``perform`` (at most ``concurrency`` at once per
        queue) until ``stopping`` is set; then cancel the hops still running and return.
        A running hop whose job this broker object's ``abort`` aborted is cancelled
        (that is the abort's acknowledgement); a job aborted otherwise (SAQ's sweep,
        another process) leaves its hop to the worker's watch, which stops it once the
        Run ledger says it lost its Run. The run ID and sequence are all a broker passes on."""


async def stop_served_hop(hop: asyncio.Task[Any] | None, wait_s: float) -> bool:
    """Cancel a hop this process serves and wait up to ``wait_s`` for its task to end
    (its cancellation is the abort's acknowledgement); True when no such hop is running
    any more."""
    if hop is None or hop.done():
        return True
    hop.cancel()
    await asyncio.wait({hop}, timeout=wait_s)
    return hop.done()


async def probe_or_none(broker: Broker, key: str) -> BrokerProbe | None:
    """What the broker says of ``key``, or None when it could not say (any failure: an
    unreachable broker proves nothing)."""
    try:
        return await broker.probe(key)
    except Exception:  # noqa: BLE001 - nothing learned (a cancellation still propagates)
        return None


async def fence_hop(broker: Broker, key: str, *, terminal: bool = False) -> BrokerProbe | None:
    """What the broker says of ``key`` after aborting its job if it was live (terminally
    with ``terminal``), probed again; None when the broker could not say. A failed abort
    is judged by the probe after it."""
    probe = await probe_or_none(broker, key)
    if probe is None or probe.state not in LIVE_STATES:
        return probe
    try:
        await (broker.abort(key, terminal=True) if terminal else broker.abort(key))
    except Exception:  # noqa: BLE001 - the probe below says whether the job stopped
        pass
    return await probe_or_none(broker, key)


class BrokerUnavailable(Exception):
    """The in-memory broker's injected failure (a real broker raises its own)."""


@dataclasses.dataclass
class _Job:
    queue: str
    wire_priority: int
    state: BrokerJobState
    started_at: dt.datetime | None = None
    order: int = 0


class InMemoryBroker:
    """A broker in one process's memory, with injectable faults.

    ``fail_publishes``: the next N publish calls raise before storing anything;
    ``lose_acknowledgements``: the next N store the job and then raise (the broker has
    it, the caller cannot know); ``fail_aborts``: the next N aborts leave the job live
    and answer False; ``fail_probes``: the next N probes raise. ``take(queue)`` hands the
    next queued job to a worker (highest priority, then oldest) and marks it active;
    ``finish(key)`` completes an active one.
    """

    concurrent_calls = True
    """Calls for several keys may run at once (see :class:`~tenure.adapters.runs.broker.Broker`)."""

    def __init__(self) -> None:
        self.jobs: dict[str, _Job] = {}
        self.fail_publishes = 0
        self.lose_acknowledgements = 0
        self.fail_aborts = 0
        self.fail_probes = 0
        self.publish_calls = 0
        self.abort_wait_s = 5.0
        self._order = 0
        self._served: dict[str, asyncio.Task[str]] = {}

    async def publish(self, key: str, *, queue: str, wire_priority: int) -> None:
        self.publish_calls += 1
        if self.fail_publishes > 0:
            self.fail_publishes -= 1
            raise BrokerUnavailable("publish refused")
        if key not in self.jobs:
            self._order += 1
            self.jobs[key] = _Job(queue, wire_priority, BrokerJobState.QUEUED, order=self._order)
        if self.lose_acknowledgements > 0:
            self.lose_acknowledgements -= 1
            raise BrokerUnavailable("acknowledgement lost")

    async def probe(self, key: str) -> BrokerProbe:
        if self.fail_probes > 0:
            self.fail_probes -= 1
            raise BrokerUnavailable("probe failed")
        job = self.jobs.get(key)
        if job is None:
            return BrokerProbe(BrokerJobState.ABSENT)
        return BrokerProbe(job.state, job.started_at if job.state is BrokerJobState.ACTIVE else None,
                           queue=job.queue, wire_priority=job.wire_priority)

    async def abort(self, key: str, *, terminal: bool = False) -> bool:
        # A job nobody runs here stops at once (``terminal`` changes nothing); a job
        # whose hop :meth:`serve` runs stops once that hop's task ended (its cancellation
        # is the acknowledgement), waited for up to ``abort_wait_s``. An injected failure
        # leaves the job live either way.
        job = self.jobs.get(key)
        if job is None or job.state not in LIVE_STATES:
            return True
        if self.fail_aborts > 0:
            self.fail_aborts -= 1
            return False
        if not await stop_served_hop(self._served.get(key), self.abort_wait_s):
            return False
        job.state = BrokerJobState.ABORTED
        return True

    async def serve(self, queues: frozenset[str], perform: PerformHop, *, concurrency: int,
                    stopping: asyncio.Event, poll_s: float = 0.005) -> None:
        """Deliver this broker's queued jobs to ``perform`` in :meth:`take` order, marking
        each complete (or failed when ``perform`` raised) when it returns; a job aborted
        while its hop runs has that hop cancelled, as a real broker's worker would."""
        running = self._served
        try:
            while not stopping.is_set():
                for key, task in list(running.items()):
                    if task.done():
                        del running[key]
                        if self.jobs[key].state is BrokerJobState.ACTIVE:
                            failed = task.cancelled() or task.exception() is not None
                            self.finish(key, failed=failed)
                started = False
                for queue in sorted(queues):
                    while sum(1 for k in running if self.jobs[k].queue == queue) < concurrency:
                        taken = self.take(queue)
                        if taken is None:
                            break
                        run_id, seq = parse_hop_key(taken)
                        running[taken] = asyncio.ensure_future(perform(run_id, seq, None))
                        started = True
                if not started:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stopping.wait(), poll_s)
        finally:
            for task in running.values():
                task.cancel()
            if running:
                await asyncio.wait(running.values())

    def take(self, queue: str) -> str | None:
        """The next queued job of ``queue`` (now active), or None."""
        queued = [(job.wire_priority, job.order, key) for key, job in self.jobs.items()
                  if job.queue == queue and job.state is BrokerJobState.QUEUED]
        if not queued:
            return None
        _, _, key = min(queued)
        job = self.jobs[key]
        job.state = BrokerJobState.ACTIVE
        job.started_at = dt.datetime.now(dt.timezone.utc)
        return key

    def finish(self, key: str, *, failed: bool = False) -> None:
        job = self.jobs[key]
        job.state = BrokerJobState.FAILED if failed else BrokerJobState.COMPLETE
