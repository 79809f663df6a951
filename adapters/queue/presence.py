"""Where the workers are: ``tenure_workers`` (schema step ``workers_v1``), one row per
worker process, written by the worker itself (``tenure workers`` and
``JobSource.workers()`` read it).

A :class:`~tenure.adapters.queue.worker.Worker` records itself when it starts (its ID,
host, PID, the queues and task names it serves, its concurrency and how often it
reports), reports every :data:`REPORT_EVERY_S` while it runs (the database time it was
last seen, its claims in flight) and records when it stopped. A worker whose last report
is older than :data:`MISSING_AFTER_REPORTS` reports' time is *missing* (killed,
frozen, cut off); one that recorded its stop is *stopped*. Rows of workers stopped or
missing for more than :data:`FORGET_AFTER_S` are deleted when a worker starts.

Chosen where the issue was silent: a row is a diagnostic, never evidence anything waits
on (claims are fenced by their own leases, whatever this table says), so a failure to
record is logged once per outage by the worker and never stops it; the table needs no
retirement guard; times are the database's clock, so hosts with skewed clocks agree.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import socket
from collections.abc import Sequence
from typing import Any

from tenure.kernel.core import Condition, Finder, Param
from tenure.model import TenureError, canonical_json

from ..core.store import Store, Transaction
from ..core.tables import json_column
from .table import WORKERS_BINDING, WorkerRow

__all__ = ["WorkerPresence", "WorkerView", "Presence", "REPORT_EVERY_S", "MISSING_AFTER_REPORTS", "FORGET_AFTER_S"]

REPORT_EVERY_S = 10.0
"""How often a running worker reports that it is alive (and its claims in flight)."""

MISSING_AFTER_REPORTS = 3
"""A worker not seen for this many of its reports' time is missing."""

FORGET_AFTER_S = 7 * 86_400.0
"""Rows of workers stopped or missing for longer are deleted when a worker starts."""

LIST_LIMIT = 1000

_EVERY_ROW = Finder("workers", ((Condition("worker_id", "not_null"),),), order=("worker_id",), lock="none")
_SEEN_BEFORE = Finder("workers_seen_before", ((Condition("last_seen_at_us", "<", Param("cutoff")),),),
                      order=("last_seen_at_us", "worker_id"), lock="none")


class Presence(enum.Enum):
    LIVE = "live"
    MISSING = "missing"
    STOPPED = "stopped"


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker as ``tenure workers`` shows it."""

    worker_id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    tasks: tuple[str, ...]
    concurrency: int
    in_flight: int
    presence: Presence
    started_at_us: int
    last_seen_at_us: int
    stopped_at_us: int | None
    seen_ago_s: float
    """Seconds between its last report and the database time of the reading."""


def _names(text: str) -> tuple[str, ...]:
    try:
        value: Any = json_column(text)
    except TenureError:
        return ()
    return tuple(name for name in value if type(name) is str) if type(value) is list else ()


def presence_of(row: WorkerRow, now_us: int) -> Presence:
    """Stopped when it recorded its stop; missing when not seen for three reports' time."""
    if row.stopped_at_us is not None:
        return Presence.STOPPED
    if now_us - row.last_seen_at_us > MISSING_AFTER_REPORTS * row.report_every_ms * 1000:
        return Presence.MISSING
    return Presence.LIVE


class WorkerPresence:
    """A worker's record of itself, on its source's store."""

    def __init__(self, store: Store, *, worker_id: str, queues: Sequence[str], tasks: Sequence[str],
                 concurrency: int, report_every_s: float = REPORT_EVERY_S) -> None:
        self._store = store
        self.worker_id = worker_id
        self._queues = canonical_json(sorted(set(queues)))
        self._tasks = canonical_json(sorted(set(tasks)))
        self._concurrency = concurrency
        self._every_ms = max(1, round(report_every_s * 1000))

    async def started(self) -> None:
        """Record this worker (replacing a row of the same ID) and forget long-gone ones."""
        async def body(tx: Transaction) -> None:
            now = await tx.now_us()
            row = WorkerRow(worker_id=self.worker_id, host=socket.gethostname()[:255], pid=os.getpid(),
                            queues_json=self._queues, tasks_json=self._tasks, concurrency=self._concurrency,
                            report_every_ms=self._every_ms, started_at_us=now, last_seen_at_us=now, in_flight=0)
            stored: list[WorkerRow] = await tx.read(WORKERS_BINDING, [self.worker_id])
            if stored:
                await tx.delete(WORKERS_BINDING, stored[0])
            await tx.insert(WORKERS_BINDING, row)
            gone = await tx.find(WORKERS_BINDING, _SEEN_BEFORE, {"cutoff": now - round(FORGET_AFTER_S * 1e6)},
                                 LIST_LIMIT)
            for old in gone:
                await tx.delete(WORKERS_BINDING, old)

        await self._store.run(body, write=True)

    async def seen(self, in_flight: int) -> None:
        """Report that this worker is alive, with its claims in flight."""
        await self._update(lambda row, now: dataclasses.replace(row, last_seen_at_us=now, in_flight=in_flight))

    async def stopped(self) -> None:
        """Record that this worker stopped (nothing in flight any more)."""
        await self._update(lambda row, now: dataclasses.replace(row, last_seen_at_us=now, in_flight=0,
                                                                stopped_at_us=now))

    async def _update(self, change: Any) -> None:
        async def body(tx: Transaction) -> None:
            now = await tx.now_us()
            stored: list[WorkerRow] = await tx.read(WORKERS_BINDING, [self.worker_id])
            if stored:
                await tx.update_many(WORKERS_BINDING, [(stored[0], change(stored[0], now))], read_back=False)

        await self._store.run(body, write=True)


async def list_workers(store: Store) -> list[WorkerView]:
    """Every recorded worker, live first, then missing, then stopped (each by ID)."""
    async def body(tx: Transaction) -> tuple[int, list[WorkerRow]]:
        rows: list[WorkerRow] = await tx.find(WORKERS_BINDING, _EVERY_ROW, {}, LIST_LIMIT)
        return await tx.now_us(), rows

    now, rows = await store.run(body, write=False)
    order = {Presence.LIVE: 0, Presence.MISSING: 1, Presence.STOPPED: 2}
    views = [WorkerView(row.worker_id, row.host, row.pid, _names(row.queues_json), _names(row.tasks_json),
                        row.concurrency, row.in_flight, presence_of(row, now), row.started_at_us,
                        row.last_seen_at_us, row.stopped_at_us, max(0.0, (now - row.last_seen_at_us) / 1e6))
             for row in rows]
    return sorted(views, key=lambda view: (order[view.presence], view.worker_id))
