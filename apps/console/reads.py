"""Every read the console's pages make, and its two kinds of write, on facades a console
keeps open for its lifetime (:class:`ConsoleData`).

Reads are read-only transactions (no lock, nothing written); their times are the
database's clock. Lists are keyset pages of the kernel's listing finders
(:func:`tenure.kernel.queue.finders.listed_page`,
:func:`tenure.kernel.runs.finders.runs_listing`,
:func:`tenure.kernel.consents.finders.pending_page` and ``decided_page``): one more row
than a page is read to know whether another page follows, and the next page starts
after the last row shown, so a page costs the same however deep it is.

Writes go through the public, fenced API and nothing else: a job's retry and cancel
through its job source (``retry_failed``, ``cancel``), a Run's cancel through
``RunLedger.begin_cancel``, a consent's verdict through ``RunLedger.consents.decide`` and
the resume that follows through ``RunLedger.resume``, exactly as ``tenure jobs`` and
``tenure runs`` do without a broker.

The overview reuses :class:`~tenure.apps.health.HealthProbe` (counts by status,
oldest pending age and claims past their lease, per queue, and the nodes' recovery
reports) and adds, in one read transaction, the Runs by status, the pending consents
and each queue's throughput: jobs that finished completed or failed in each of the last
five minutes, by their ``completed_at``. Both the counts and the throughput are read by
:class:`~tenure.apps.queue_counts.QueueCounts`, the one per-queue reader ``tenure
health`` uses too, so a queue's throughput lands on the queue whose counts are shown.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, cast

from tenure.kernel.agent_jobs.record import AgentJobRow
from tenure.kernel.attempts.record import AttemptRow
from tenure.kernel.consents import finders as consent_finders
from tenure.kernel.consents.record import ConsentRow
from tenure.kernel.queue import finders as queue_finders
from tenure.kernel.queue.record import QueueRow
from tenure.kernel.runs import finders as run_finders
from tenure.kernel.runs.record import DeliveryRow, RunRow, key_of
from tenure.model import ConsentStatus, JobState, JobStatus, RunStatus, TenureError, bounds
from tenure.model.runs import check_run_id, check_text

from tenure.adapters.agent_jobs.table import AGENT_JOBS_BINDING
from tenure.adapters.attempts.table import ATTEMPTS_BINDING
from tenure.adapters.consents.table import CONSENTS_BINDING
from tenure.adapters.core.catalog import Executor
from tenure.adapters.core.facade import Cursor
from tenure.adapters.core.store import Transaction
from tenure.adapters.core.tables import Binding, Unreadable, qualified
from tenure.adapters.core.urls import parse_db_url
from tenure.adapters.queue.sources import (JobSource, PipelineJobSource, StreamingJobSource, TaskSource, ValidationJobSource,
                                           job_state)
from tenure.adapters.queue.table import QUEUE_BINDINGS, TASKS_BINDING, envelope_of
from tenure.adapters.runs.ledger import RunLedger
from tenure.adapters.runs.table import CHECKPOINTS_BINDING, DELIVERIES_BINDING, RUNS_BINDING, CheckpointRow
from tenure.adapters.wiring.dialects import backend_for, resolve_schema

from ..health import HealthProbe, HealthSnapshot, NodeReport, Thresholds
from ..queue_counts import Finished, QueueCounts

__all__ = ["ConsoleData", "QUEUE_SOURCES", "QueueView", "Overview", "JobView", "job_view", "JobPage", "RunPage",
           "RunDetail", "ConsentPage", "ConsentDetail", "THROUGHPUT_MINUTES", "MAX_HOPS_SHOWN", "MAX_OWNERS_SHOWN",
           "parse_position"]

QUEUE_SOURCES: dict[str, type[JobSource[Any]]] = {
    "tasks": TaskSource,
    "validation": ValidationJobSource,
    "pipeline": PipelineJobSource,
    "streaming": StreamingJobSource,
}
"""The job tables a console shows, by the name its URLs use (``tasks``: ``tenure_tasks``,
every task queue; the others: pycharter's three queues)."""

THROUGHPUT_MINUTES = 5
MAX_HOPS_SHOWN = 100
"""A Run page lists its latest hops' deliveries, at most this many."""
MAX_OWNERS_SHOWN = 200
"""A Run page lists at most this many consents, delegated jobs and service attempts each."""

_VERDICTS = frozenset({"exceeded", "degraded", "behind"})
"""Reasons of a health check that read its data and judged it against a threshold: the
overview shows the data, and says nothing of thresholds it does not use."""


@dataclasses.dataclass(frozen=True, slots=True)
class QueueView:
    """One queue on the overview: pycharter's (``table`` its table) or a task queue of
    ``tenure_tasks``, with the health probe's readings and its throughput."""

    source: str
    """The console's name of its table (``tasks``, ``validation``, ...)."""
    table: str
    queue: str
    counts: Mapping[str, int]
    oldest_pending_seconds: float | None
    expired_claims: int
    completed_per_minute: tuple[int, ...]
    """Jobs finished completed in each of the last minutes, the latest minute first."""
    failed_per_minute: tuple[int, ...]

    @property
    def live_key(self) -> str:
        return f"{self.table}/{self.queue}"


@dataclasses.dataclass(frozen=True, slots=True)
class Overview:
    database: str
    queues: tuple[QueueView, ...]
    runs_by_status: Mapping[str, int]
    reports: tuple[NodeReport, ...]
    pending_consents: int
    unread: tuple[str, ...]
    """Why the health probe could not read a part (its checks' persistence reasons, such
    as ``timeout`` or ``corrupt_row``), for the page to say."""

    def live_values(self) -> dict[str, int | float | None]:
        """Every count the overview shows, by the key its page marks it with
        (``data-live``): what the page's poll refreshes."""
        values: dict[str, int | float | None] = {"consents/pending": self.pending_consents}
        for queue in self.queues:
            for status, count in queue.counts.items():
                values[f"queue/{queue.live_key}/{status}"] = count
            values[f"queue/{queue.live_key}/oldest_pending_seconds"] = queue.oldest_pending_seconds
            values[f"queue/{queue.live_key}/expired_claims"] = queue.expired_claims
            values[f"queue/{queue.live_key}/completed_last_minute"] = queue.completed_per_minute[0]
            values[f"queue/{queue.live_key}/failed_last_minute"] = queue.failed_per_minute[0]
        for status, count in self.runs_by_status.items():
            values[f"runs/{status}"] = count
        return values


@dataclasses.dataclass(frozen=True, slots=True)
class JobView:
    """One job as a page shows it (never its claim token): its row's
    :class:`~tenure.model.JobState` (the part of a :class:`~tenure.model.JobInfo`, what
    ``tenure jobs`` shows, read from the row's columns alone), and what it carries as
    stored, read when it can be (a row another client wrote may hold neither in a shape
    tenure reads: the page then says so and shows the rest)."""

    state: JobState
    task: tuple[str, str, int] | None
    """Tasks: (task queue, task name, priority)."""
    envelope: dict[str, Any] | None
    """What it was submitted with (None: the stored envelope cannot be read)."""
    result_json: str | None
    progress_json: str | None


def job_view(record: QueueRow) -> JobView:
    try:
        envelope: dict[str, Any] | None = envelope_of(record).model_dump(mode="json")
    except TenureError:  # corrupt_row: a row written outside tenure
        envelope = None
    task = None if record.queue_name is None or record.task_name is None else (
        record.queue_name, record.task_name, record.priority)
    return JobView(job_state(record), task, envelope, record.result_json, record.progress_json)


@dataclasses.dataclass(frozen=True, slots=True)
class JobPage:
    rows: tuple[QueueRow | Unreadable, ...]
    """The jobs; a row tenure cannot read (written outside tenure) is an ``Unreadable``
    in its place, shown as ``corrupt_row`` with what could be read of it."""
    next_after: str | None
    """The ``after`` of the next page (None: this is the last)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunPage:
    rows: tuple[RunRow | Unreadable, ...]
    """The Runs; a row tenure cannot read is an ``Unreadable`` in its place."""
    next_after: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class RunDetail:
    run: RunRow
    deliveries: tuple[DeliveryRow, ...]
    """The latest hops' deliveries, newest first (at most :data:`MAX_HOPS_SHOWN`)."""
    consents: tuple[ConsentRow, ...]
    jobs: tuple[AgentJobRow, ...]
    attempts: tuple[AttemptRow, ...]
    checkpoint: CheckpointRow | None
    now_us: int
    unreadable: int = 0
    """Rows of this Run's (deliveries, consents, delegated jobs, service attempts, the
    checkpoint) that tenure cannot read (written outside tenure): left out, and counted
    for the page to say."""


@dataclasses.dataclass(frozen=True, slots=True)
class ConsentPage:
    pending: tuple[ConsentRow, ...]
    pending_next: str | None
    decided: tuple[ConsentRow, ...]
    decided_next: str | None
    runs: Mapping[str, RunRow]
    """The Runs the listed consents belong to, by Run ID."""
    now_us: int


@dataclasses.dataclass(frozen=True, slots=True)
class ConsentDetail:
    consent: ConsentRow
    run: RunRow | None


def _position(cursor: tuple[int, str] | None) -> str | None:
    return None if cursor is None else Cursor.encode(*cursor)


def _created_position(rows: Sequence[RunRow | Unreadable]) -> tuple[int, str] | None:
    """Where the page after ``rows`` starts: the last row's ``(created_at, run_id)``, or
    (a row whose own position cannot be read) the last one's that can."""
    for row in reversed(rows):
        if isinstance(row, RunRow):
            return row.created_at_us, row.run_id
        created = row.fields.get("created_at_us")
        if type(created) is int and type(row.key) is str:
            return created, row.key
    return None


def parse_position(text: str, key_chars: int) -> tuple[int, str]:
    """A page position ``<instant_us>:<id>``; ``ConfigValidationError`` (``after``
    ``cursor_required``) when it does not parse."""
    return Cursor.parse(text, lambda key: bounds.is_bounded_text(key, key_chars))


class ConsoleData:
    """The console's facades on one database, opened when made (no connection until the
    first read) and closed by :meth:`close`."""

    def __init__(self, db_url: str) -> None:
        target = parse_db_url(db_url)
        backend = backend_for(target)
        self.database = target.kind.value
        self._schema = resolve_schema(target, None)
        self._counts = QueueCounts(backend, self._schema)
        self.ledger = RunLedger(db_url)
        self.sources: dict[str, JobSource[Any]] = {name: kind(db_url) for name, kind in QUEUE_SOURCES.items()}
        self._probe = HealthProbe(db_url)

    async def close(self) -> None:
        await self._probe.close()
        for source in self.sources.values():
            await source.close()
        await self.ledger.close()

    def _table(self, binding: Binding) -> str:
        return qualified(self._schema, binding.spec.name)

    # --- the overview --------------------------------------------------------------------

    async def overview(self) -> Overview:
        snapshot = await self._probe.snapshot(Thresholds(expired_claim_grace_seconds=0.0))

        async def rest(tx: Transaction) -> tuple[Finished, dict[str, int], int]:
            return await self._overview_rest(tx, snapshot)

        throughput, runs, pending = await self.ledger.engine.run(rest, write=False)
        unread = {check.reason for check in snapshot.checks if not check.ok and check.reason not in _VERDICTS}
        if snapshot.never_migrated is not None:
            unread.add(snapshot.never_migrated)
        return Overview(self.database, self._queues(snapshot, throughput), runs, snapshot.reports or (), pending,
                        tuple(sorted(unread)))

    @staticmethod
    def _queues(snapshot: HealthSnapshot, throughput: Finished) -> tuple[QueueView, ...]:
        by_table = {binding.spec.name: kind.value for kind, binding in QUEUE_BINDINGS.items()}
        by_table[TASKS_BINDING.spec.name] = "tasks"
        views = []
        for reading in snapshot.queues or ():
            finished = throughput.get((reading.table, reading.queue), {})
            empty = [0] * THROUGHPUT_MINUTES
            views.append(QueueView(by_table[reading.table], reading.table, reading.queue, reading.counts,
                                   reading.oldest_pending_seconds, reading.expired_claims,
                                   tuple(finished.get(JobStatus.COMPLETED.value, empty)),
                                   tuple(finished.get(JobStatus.FAILED.value, empty))))
        return tuple(views)

    async def _overview_rest(self, tx: Transaction, snapshot: HealthSnapshot,
                             ) -> tuple[Finished, dict[str, int], int]:
        throughput = await self._counts.finished_per_minute(tx, snapshot.queues or (), minutes=THROUGHPUT_MINUTES)
        status = RUNS_BINDING.column_of("status").name
        rows = await cast(Executor, tx).execute(
            f"SELECT {status}, count(*) FROM {self._table(RUNS_BINDING)} GROUP BY {status}")
        known = {member.value for member in RunStatus}
        runs = {member.value: 0 for member in RunStatus}
        for stored, count in rows:
            key = stored if stored in known else "other"
            runs[key] = runs.get(key, 0) + int(count)
        finder = consent_finders.pending_page()
        (pending,) = await tx.count_each([(CONSENTS_BINDING, finder, consent_finders.PENDING_PARAMETERS, None)])
        return throughput, runs, pending

    # --- jobs ----------------------------------------------------------------------------

    async def jobs_page(self, source_name: str, *, status: JobStatus | None, task_queue: str | None,
                        task: str | None, older_than: dt.timedelta | None, after: str | None,
                        limit: int) -> JobPage:
        """One page of a job table, largest job ID first (tasks: newest first)."""
        source = self.sources[source_name]
        wanted: dict[str, Any] = {"status": status, "queue_name": task_queue, "task_name": task}
        parameters = {field: value for field, value in wanted.items() if value is not None}
        finder = queue_finders.listed_page(**{field: True for field in parameters},
                                           created_before=older_than is not None, after=after is not None)
        if after is not None:
            parameters["after_id"] = after
        binding = source.operations.binding

        async def body(tx: Transaction) -> list[QueueRow | Unreadable]:
            if older_than is not None:
                now = await tx.now_us()
                parameters["created_before"] = now - (older_than // dt.timedelta(microseconds=1))
            return await tx.find_or_unreadable(binding, finder, parameters, limit + 1)

        rows = await source.operations.store.run(body, write=False)
        more = len(rows) > limit
        last = rows[limit - 1] if more else None
        after = None if last is None else last.job_id if isinstance(last, QueueRow) else last.shown_key
        return JobPage(tuple(rows[:limit]), after)

    async def job(self, source_name: str, job_id: str) -> JobView | Unreadable | None:
        """One job as stored, or None: no such job. A row tenure cannot read is answered
        as an ``Unreadable`` (its page shows what could be read of it)."""
        record = await self.sources[source_name].operations.get_or_unreadable(job_id)
        return record if record is None or isinstance(record, Unreadable) else job_view(record)

    async def retry_job(self, source_name: str, job_id: str) -> bool | None:
        """``retry_failed`` through the job's source: True when the failed job went back
        to pending; False when it did not (missing or not failed); None: this queue has
        no retry (streaming launches are rerun by a forced submission)."""
        retry = getattr(self.sources[source_name], "retry_failed", None)
        if retry is None:
            return None
        return bool(await retry(job_id))

    async def cancel_job(self, source_name: str, job_id: str) -> bool:
        """The queue's administrative ``cancel`` (streaming: a cancel request its launcher
        acknowledges)."""
        source: Any = self.sources[source_name]
        return bool(await source.cancel(job_id))

    # --- Runs ----------------------------------------------------------------------------

    async def runs_page(self, *, status: RunStatus | None, queue: str | None, workflow: str | None,
                        after: tuple[int, str] | None, limit: int) -> RunPage:
        """One page of Runs, newest created first."""
        wanted: dict[str, Any] = {"status": status, "queue": queue, "workflow": workflow}
        parameters = {field: value for field, value in wanted.items() if value is not None}
        finder = run_finders.runs_listing(**{field: True for field in parameters}, after=after is not None)
        if after is not None:
            parameters.update(after_created=after[0], after_id=after[1])

        async def body(tx: Transaction) -> list[RunRow | Unreadable]:
            return await tx.find_or_unreadable(RUNS_BINDING, finder, parameters, limit + 1)

        rows = await self.ledger.engine.run(body, write=False)
        more = len(rows) > limit
        return RunPage(tuple(rows[:limit]), _position(_created_position(rows[:limit])) if more else None)

    async def run(self, run_id: str) -> RunDetail | Unreadable | None:
        """A Run and what the database holds about it, or None: its latest deliveries (what
        ``get_delivery`` reads per hop), its consents, its delegated jobs (what
        ``RunLedger.jobs.list`` reads) and service attempts, and its checkpoint, all in
        one read transaction (one snapshot, so the parts agree)."""
        key = check_run_id(run_id)

        async def body(tx: Transaction) -> RunDetail | Unreadable | None:
            now = await tx.now_us()
            found: list[RunRow | Unreadable] = await tx.read_or_unreadable(RUNS_BINDING, [key])
            if not found:
                return None
            run = found[0]
            if isinstance(run, Unreadable):
                return run
            first = max(0, run.enqueue_seq - MAX_HOPS_SHOWN + 1)
            parameters = {"run_id": key}
            # Each part read so that a row of it tenure cannot read is left out (and
            # counted), never failing the page.
            parts = [
                await tx.read_or_unreadable(DELIVERIES_BINDING,
                                            [key_of(key, seq) for seq in range(first, run.enqueue_seq + 1)]),
                await tx.find_or_unreadable(CONSENTS_BINDING, run_finders.consents_of_run, parameters,
                                            MAX_OWNERS_SHOWN),
                await tx.find_or_unreadable(AGENT_JOBS_BINDING, run_finders.jobs_of_run, parameters, MAX_OWNERS_SHOWN),
                await tx.find_or_unreadable(ATTEMPTS_BINDING, run_finders.attempts_of_run, parameters,
                                            MAX_OWNERS_SHOWN),
                await tx.read_or_unreadable(CHECKPOINTS_BINDING, [key]),
            ]
            readable = [[row for row in part if not isinstance(row, Unreadable)] for part in parts]
            deliveries, consents, jobs, attempts, checkpoints = readable
            return RunDetail(
                run, tuple(sorted(deliveries, key=lambda row: -row.enqueue_seq)),
                tuple(sorted(consents, key=lambda row: (row.created_at_us, row.consent_id))),
                tuple(sorted(jobs, key=lambda row: (row.created_at_us, row.job_id))),
                tuple(sorted(attempts, key=lambda row: (row.created_at_us, row.attempt_id))),
                checkpoints[0] if checkpoints else None, now,
                sum(len(part) for part in parts) - sum(len(part) for part in readable))

        detail: RunDetail | Unreadable | None = await self.ledger.engine.run(body, write=False)
        return detail

    async def cancel_run(self, run_id: str) -> str:
        """``begin_cancel``, as ``tenure runs cancel`` without ``--broker``: ``cancelling``
        (the Run's next startup reconciliation, or a command with a broker, finishes it),
        ``cancelled`` (it was already) or ``not_cancelled`` (it finished first, or does
        not exist)."""
        ticket = await self.ledger.begin_cancel(run_id)
        if ticket is None:
            return "not_cancelled"
        return "already_cancelled" if ticket.already_cancelled else "cancelling"

    # --- consents -------------------------------------------------------------------------

    async def pending_consents(self) -> int:
        """How many consents are pending (the inbox's badge): a count on the status index."""

        async def body(tx: Transaction) -> int:
            finder = consent_finders.pending_page()
            (pending,) = await tx.count_each([(CONSENTS_BINDING, finder, consent_finders.PENDING_PARAMETERS, None)])
            return pending

        return await self.ledger.engine.run(body, write=False)

    async def consents_page(self, *, pending_after: tuple[int, str] | None, decided_after: tuple[int, str] | None,
                            limit: int) -> ConsentPage:
        pending_finder = consent_finders.pending_page(after=pending_after is not None)
        decided_finder = consent_finders.decided_page(after=decided_after is not None)
        pending_parameters: dict[str, Any] = dict(consent_finders.PENDING_PARAMETERS)
        if pending_after is not None:
            pending_parameters.update(after_created=pending_after[0], after_id=pending_after[1])
        decided_parameters = {} if decided_after is None else {"after_decided": decided_after[0],
                                                               "after_id": decided_after[1]}

        async def body(tx: Transaction) -> ConsentPage:
            now = await tx.now_us()
            pending: list[ConsentRow] = await tx.find(CONSENTS_BINDING, pending_finder, pending_parameters, limit + 1)
            decided: list[ConsentRow] = await tx.find(CONSENTS_BINDING, decided_finder, decided_parameters, limit + 1)
            shown = pending[:limit] + decided[:limit]
            read = await tx.read_or_unreadable(RUNS_BINDING, sorted({row.run_id for row in shown})) if shown else []
            runs = [run for run in read if isinstance(run, RunRow)]  # a Run tenure cannot read: not shown
            pending_next = pending[limit - 1] if len(pending) > limit else None
            decided_next = decided[limit - 1] if len(decided) > limit else None
            return ConsentPage(
                tuple(pending[:limit]),
                None if pending_next is None else Cursor.encode(pending_next.created_at_us, pending_next.consent_id),
                tuple(decided[:limit]),
                None if decided_next is None or decided_next.decided_at_us is None
                else Cursor.encode(decided_next.decided_at_us, decided_next.consent_id),
                {run.run_id: run for run in runs}, now)

        return await self.ledger.engine.run(body, write=False)

    async def consent(self, consent_id: str) -> ConsentDetail | None:
        key = check_text(consent_id, "consent_id", 36)

        async def body(tx: Transaction) -> ConsentDetail | None:
            found: list[ConsentRow] = await tx.read(CONSENTS_BINDING, [key])
            if not found:
                return None
            runs = await tx.read_or_unreadable(RUNS_BINDING, [found[0].run_id])
            return ConsentDetail(found[0], runs[0] if runs and isinstance(runs[0], RunRow) else None)

        return await self.ledger.engine.run(body, write=False)

    async def decide_consent(self, consent_id: str, verdict: ConsentStatus, decided_by: str) -> tuple[bool, int | None]:
        """The verdict through ``RunLedger.consents.decide`` (the first one wins), then the
        Run resumed from it through ``RunLedger.resume``, exactly as ``tenure runs
        consent`` does without a broker (the relays of a running Run worker publish the
        new hop): whether this call decided it, and the hop it resumed the Run at (None:
        not resumed by this call; a relay may have been first)."""
        consent = await self.ledger.consents.get(consent_id)
        if consent is None:
            raise LookupError("no such consent")
        decided = await self.ledger.consents.decide(consent.consent_id, verdict, decided_by=decided_by)
        if not decided:
            # The same operator's same verdict sent again (the first answer was lost, or
            # its resume failed) is theirs, not "someone decided first".
            stored = await self.ledger.consents.get(consent.consent_id)
            decided = stored is not None and stored.decided_by == decided_by and stored.status is verdict
        resumed = await self.ledger.resume(consent.run_id, owner_id=consent.consent_id)
        return decided, resumed

