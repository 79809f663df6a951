"""Per-queue counts: the one reader ``tenure health``, the metrics sampler and the
console's overview share.

:class:`QueueCounts` reads, inside its caller's read transaction, each queue's jobs by
status, how long its oldest due pending job has been due and how many of its claims ran
past their lease (:meth:`QueueCounts.read`), and the jobs that finished in each of the
last minutes (:meth:`QueueCounts.finished_per_minute`). A queue is one of pycharter's
three tables (named by its kind) or a task queue of ``tenure_tasks`` (named as stored
when it is an identifier, :func:`~tenure.model.validation.is_queue_name`); any other
name, and the names past the first :data:`MAX_TASK_QUEUES`, are counted under
:data:`OTHER`. Both reads name the queues the same way, so what the overview shows of a
queue's throughput lands on the queue whose counts it shows. Statuses other than the
queue machine's are counted as ``other``.

Costs. Per queue table one ``GROUP BY`` over its rows (an index-only scan where
PostgreSQL can) and one statement counting the expired claims of every queue; the
finished jobs: one ``GROUP BY`` per table over the rows finished in the window
(``tenure_tasks``: its ``(status, completed_at)`` index; pycharter's tables have none).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from tenure.kernel.core import Condition, Finder, Param
from tenure.kernel.queue import finders as queue_finders
from tenure.model import JobStatus
from tenure.model.validation import is_queue_name

from tenure.adapters.core.backend import Backend
from tenure.adapters.core.catalog import Executor
from tenure.adapters.core.store import Transaction
from tenure.adapters.core.tables import Binding, qualified
from tenure.adapters.queue.table import QUEUE_BINDINGS, TASKS_BINDING

__all__ = ["QueueCounts", "QueueReading", "OTHER", "MAX_TASK_QUEUES", "Finished"]

MAX_TASK_QUEUES = 256
"""Task queue names reported one by one; the rest are counted under :data:`OTHER`."""

OTHER = "(other)"
"""The queue every task queue name not reported by itself is counted under."""

Finished = dict[tuple[str, str], dict[str, list[int]]]
"""``(table, queue)`` -> status (``completed``, ``failed``) -> jobs finished in each of the
last minutes, the latest minute first."""

_EXPIRED = dataclasses.replace(queue_finders.expired, lock="none")
_CLAIMED = Condition("status", "=", JobStatus.CLAIMED)
_EXPIRED_OF_TASK_QUEUE = Finder(
    "health_expired_of_task_queue",
    ((_CLAIMED, Condition("lease_expires_at_us", "<=", Param("now")), Condition("queue_name", "=", Param("queue"))),),
    lock="none",
)
_STATUSES = tuple(status.value for status in JobStatus)
_FINISHED = (JobStatus.COMPLETED.value, JobStatus.FAILED.value)


@dataclasses.dataclass(frozen=True, slots=True)
class QueueReading:
    """One queue: pycharter's (``table`` its table, ``queue`` its kind) or a task queue
    of ``tenure_tasks`` (``queue`` its name, or :data:`OTHER`)."""

    table: str
    queue: str
    counts: Mapping[str, int]
    """Jobs by status: every status of the queue machine (zeros included), and ``other``
    when rows hold a status it does not know."""
    oldest_pending_seconds: float | None
    """How long the oldest due pending job has been due; None: none is due."""
    expired_claims: int
    """Claims whose lease ran out longer ago than the grace."""

    def document(self) -> dict[str, Any]:
        return {"table": self.table, "queue": self.queue, "counts": dict(self.counts),
                "oldest_pending_seconds": self.oldest_pending_seconds, "expired_claims": self.expired_claims}


def _seconds(micros: int) -> float:
    return round(micros / 1_000_000, 3)


class QueueCounts:
    """The per-queue reads of one database (``backend`` and ``schema`` as its URL
    resolves them), run in a caller's read transaction (see the module docstring)."""

    def __init__(self, backend: Backend, schema: str | None) -> None:
        self._backend = backend
        self._codec = backend.codec
        self._schema = schema

    def _table(self, binding: Binding) -> str:
        return qualified(self._schema, binding.spec.name)

    async def read(self, tx: Transaction, *, tasks: bool, expired_before_us: int) -> tuple[QueueReading, ...]:
        """Every queue's counts, oldest due pending age and claims whose lease ran out
        before ``expired_before_us`` (``tasks``: whether ``tenure_tasks`` exists)."""
        now = await tx.now_us()
        readings: list[QueueReading] = []
        queries: list[tuple[Binding, Finder, Mapping[str, Any], int | None]] = []
        for kind, binding in QUEUE_BINDINGS.items():
            counts, oldest = (await self._groups(tx, binding, kind.value)).get(kind.value, ({}, None))
            readings.append(_reading(binding, kind.value, counts, oldest, now))
            queries.append((binding, _EXPIRED, {"now": expired_before_us}, None))
        claimed: list[str] = []  # the task queues with claims, whose expired ones are counted apart
        if tasks:
            groups = await self._groups(tx, TASKS_BINDING, None)
            for name, (counts, oldest) in sorted(groups.items()):
                readings.append(_reading(TASKS_BINDING, name, counts, oldest, now))
                if name != OTHER and counts.get(JobStatus.CLAIMED.value):
                    claimed.append(name)
            queries.append((TASKS_BINDING, _EXPIRED, {"now": expired_before_us}, None))
            queries.extend((TASKS_BINDING, _EXPIRED_OF_TASK_QUEUE, {"now": expired_before_us, "queue": name}, None)
                           for name in claimed)
        answers = iter(await tx.count_each(queries))
        expired = {binding.spec.name: next(answers) for binding in QUEUE_BINDINGS.values()}
        tasks_expired = next(answers, 0)
        of_task_queue = dict(zip(claimed, answers))
        of_task_queue[OTHER] = tasks_expired - sum(of_task_queue.values())
        return tuple(
            dataclasses.replace(reading, expired_claims=of_task_queue.get(reading.queue, 0)
                                if reading.table == TASKS_BINDING.spec.name else expired[reading.table])
            for reading in readings)

    async def _groups(self, tx: Transaction, binding: Binding, queue: str | None,
                      ) -> dict[str, tuple[dict[str, int], int | None]]:
        """Per queue (one of pycharter's tables: ``queue``; None: the task queues of
        ``tenure_tasks``): jobs by status, and the earliest ``fires_at`` of a pending job."""
        status = binding.column_of("status").name
        fires = binding.column_of("fires_at_us").name
        keys = status if queue is not None else f"{binding.column_of('queue_name').name}, {status}"
        rows = await cast(Executor, tx).execute(
            f"SELECT {keys}, count(*), min({fires}) FROM {self._table(binding)} GROUP BY {keys}")
        groups: dict[str, tuple[dict[str, int], int | None]] = {}
        for row in rows:
            if queue is not None:
                name = queue
                stored_status, count, earliest = row
            else:
                stored_name, stored_status, count, earliest = row
                known = is_queue_name(stored_name) and (
                    stored_name in groups or len(groups) - (OTHER in groups) < MAX_TASK_QUEUES)
                name = stored_name if known else OTHER
            counts, oldest = groups.setdefault(name, ({}, None))
            key = stored_status if stored_status in _STATUSES else "other"
            counts[key] = counts.get(key, 0) + int(count)
            if key == JobStatus.PENDING.value and earliest is not None:
                due = self._codec.instant_from_stored(earliest)
                groups[name] = (counts, due if oldest is None else min(oldest, due))
        return groups

    async def finished_per_minute(self, tx: Transaction, readings: Sequence[QueueReading], *,
                                  minutes: int) -> Finished:
        """Jobs that finished completed or failed in each of the last ``minutes`` minutes
        (the database clock, by ``completed_at``), under the queue ``readings`` name
        them: a task queue the readings count under :data:`OTHER` is counted there too."""
        now = await tx.now_us()
        reported = {reading.queue for reading in readings if reading.table == TASKS_BINDING.spec.name}
        finished: Finished = {}
        for kind, binding in QUEUE_BINDINGS.items():
            await self._finished(tx, binding, functools.partial(_named, kind.value), now, minutes, finished)
        await self._finished(tx, TASKS_BINDING, functools.partial(_reported, reported), now, minutes, finished)
        return finished

    async def _finished(self, tx: Transaction, binding: Binding, queue_of: Callable[[Any], str], now: int,
                        minutes: int, into: Finished) -> None:
        status = binding.column_of("status").name
        completed = binding.column_of("completed_at_us").name
        first_mark = self._backend.migration_rules().placeholder  # ? or $1: the database's positional marks
        marks = [first_mark.replace("1", str(number)) for number in range(1, minutes + 1)]
        boundaries = [self._codec.instant_to_stored(now - minute * 60_000_000) for minute in range(1, minutes + 1)]
        minute = "CASE " + " ".join(f"WHEN {completed} > {mark} THEN {index}"
                                    for index, mark in enumerate(marks[:-1])) + f" ELSE {minutes - 1} END"
        tasks = binding is TASKS_BINDING
        keys = f"{binding.column_of('queue_name').name}, {status}" if tasks else status
        groups = "1, 2, 3" if tasks else "1, 2"  # by position: the minute's marks appear once
        statuses = ", ".join(f"'{value}'" for value in _FINISHED)
        rows = await cast(Executor, tx).execute(
            f"SELECT {keys}, {minute}, count(*) FROM {self._table(binding)} "
            f"WHERE {status} IN ({statuses}) AND {completed} > {marks[-1]} GROUP BY {groups}", boundaries)
        for row in rows:
            stored_name, stored_status, index, count = row if tasks else (None, *row)
            per_status = into.setdefault((binding.spec.name, queue_of(stored_name)), {})
            counts = per_status.setdefault(str(stored_status), [0] * minutes)
            counts[int(index)] += int(count)


def _reading(binding: Binding, queue: str, counts: Mapping[str, int], oldest: int | None, now: int) -> QueueReading:
    every = {status: counts.get(status, 0) for status in _STATUSES}
    if counts.get("other"):
        every["other"] = counts["other"]
    age = None if oldest is None or oldest > now else _seconds(now - oldest)
    return QueueReading(binding.spec.name, queue, every, age, 0)


def _named(queue: str, stored: object) -> str:
    """One of pycharter's tables: its one queue, whatever the row."""
    return queue


def _reported(reported: set[str], stored: object) -> str:
    """A task queue as the counts name it: by its stored name when they report it, else :data:`OTHER`."""
    return stored if isinstance(stored, str) and stored in reported else OTHER
