"""Health of a tenure database: what ``tenure health`` checks, and what a metrics sampler
reads (queue depth by status, the oldest due pending job's age).

:func:`health_snapshot` (or a :class:`HealthProbe` kept open between samples) reads the
database at a URL and returns a :class:`HealthSnapshot`: the readings, and one
:class:`HealthCheck` per check judged from them against :class:`Thresholds`. Every read
is a read-only statement on the store's own connections (no lock, nothing written); the
times are the database's clock, read by each read transaction, never this machine's.

The checks, in order, with their defaults:

``reachable``
    The database answered (value: milliseconds to the first answer, connecting
    included). Reason ``answered``, or the persistence reason of the failure
    (``timeout``, ``connection_refused``, ``authentication_failed``, ...).
``migrated``
    Every schema step this version of tenure knows is recorded in
    ``tenure_migrations`` (value: how many are missing; threshold 0). Reason
    ``current`` or ``behind``; ``detail.missing_steps`` names them. A database that was
    never migrated (no ``tenure_migrations``, no ``tenure_clock``, no SQLite file, no
    PostgreSQL database) is no check result: :attr:`HealthSnapshot.never_migrated`
    holds the reason (``schema_missing``, ``database_missing``) and ``tenure health``
    refuses it, as ``tenure worker`` does (exit 2).
``pending_jobs``
    Jobs waiting (status ``pending``, due or not) in pycharter's three queue tables
    and ``tenure_tasks`` together (threshold ``max_pending_jobs``, default none: never
    unhealthy). ``detail.by_status`` counts every status over every queue; the snapshot's
    :attr:`HealthSnapshot.queues` counts them per queue (each task queue name apart).
``oldest_pending_seconds``
    How long the oldest due pending job has been due: the database clock minus its
    ``fires_at`` (threshold ``max_oldest_pending_seconds``, default 300). Reason
    ``none_due`` (value null) when no pending job is due.
``expired_claims``
    Claimed jobs whose lease ran out more than ``expired_claim_grace_seconds`` ago
    (default 60: a claim a worker's sweep is about to take back is not a fault), over
    every queue (threshold ``max_expired_claims``, default 0). A claim stays expired only
    while no worker of its queue claims (each claim sweeps first): a crashed worker
    whose queue nobody serves any more.
``oldest_cancelling_seconds``
    How long the oldest Run in CANCELLING has been there (since its last change,
    ``updated_at``; threshold ``max_cancelling_seconds``, default 300; reason
    ``none_cancelling`` with value null when there is none); ``detail.stuck`` counts the
    Runs past the threshold.
``recovery_reports``
    How many nodes' latest recovery report (``tenure_run_recovery_reports``, written by
    every Run runtime after each reconciliation and relay round, see
    :mod:`tenure.adapters.runs.reports`) is degraded (threshold ``max_degraded_nodes``,
    default 0). Reason ``clean``, ``degraded`` or ``no_reports`` (no Run runtime ever ran
    on this database: nothing to judge, so ok). ``detail`` counts the nodes, the degraded
    ones, their issues by reason and the newest report's age; never a node name or a Run
    ID.

Absent data. ``tenure migrate`` creates every table (the Run tables too, whether or not
Runs are used), so on a database at the current step every check has its data. On one
that is behind (``migrated`` fails, so the database is unhealthy anyway), a check whose
table a missing step would create is reported ``ok`` with reason ``table_absent`` and a
null value: no row can be stuck in a table that does not exist, and failing it too would
only repeat ``migrated``. A check whose read failed is not ok, with the read's
persistence reason (``corrupt_row``: a row another writer left that tenure cannot read).
After a database failure before the first answer, every other check is not ok with
reason ``not_checked``.

Timeout. The whole snapshot runs under ``timeout_seconds`` (and each call under the
store's own deadline of the same length): a database that does not answer, or stops
answering midway, makes every check not yet read not ok with reason ``timeout``; closing
the connections is bounded too. It never hangs, so it suits a container probe.

Costs. The queues are read by :class:`~tenure.apps.queue_counts.QueueCounts` (the
reader the console's overview shows too): per queue table one ``GROUP BY`` over its
rows (an index-only scan where PostgreSQL can) and one statement counting the expired
claims of every queue; one statement over the Runs in CANCELLING (the status index); one over the reports. A table
holding millions of finished rows costs a scan of them per probe: purge them
(``tenure jobs purge``) or probe less often.

Nothing here reads or returns a payload, a claim token or a Run ID. Queue names are
reported as stored only when they are identifiers (:func:`~tenure.model.validation.is_queue_name`);
any other name, and names past the first
:data:`~tenure.apps.queue_counts.MAX_TASK_QUEUES`, are counted under ``(other)``.
Statuses other than the queue machine's are counted as ``other``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import Mapping
from typing import Any, cast

from tenure.kernel.core import Condition, Finder, Param
from tenure.model import ConfigValidationError, JobStatus, RunStatus, TenureError

from tenure.adapters.core.catalog import Executor
from tenure.adapters.core.schema import MIGRATIONS_TABLE
from tenure.adapters.core.store import Store, Transaction
from tenure.adapters.core.tables import Binding, Dialect, Step, qualified
from tenure.adapters.core.urls import parse_db_url
from tenure.adapters.queue.table import OWNED_STEP, TASKS_STEP
from tenure.adapters.runs.reports import latest_reports, stored_counts
from tenure.adapters.runs.table import REPORTS_STEP, RUNS_BINDING, RUNS_STEP
from tenure.adapters.wiring.dialects import backend_for, open_store, resolve_schema
from tenure.adapters.wiring.migrations import RECORDED_STEPS

from .queue_counts import QueueCounts, QueueReading

__all__ = ["Thresholds", "THRESHOLD_LIMITS", "HealthCheck", "CancellingReading", "NodeReport",
           "HealthSnapshot", "HealthProbe", "health_snapshot", "CHECK_NAMES", "NEVER_MIGRATED",
           "DEFAULT_TIMEOUT_SECONDS", "check_setting"]

CHECK_NAMES = ("reachable", "migrated", "pending_jobs", "oldest_pending_seconds", "expired_claims",
               "oldest_cancelling_seconds", "recovery_reports")
"""Every check, in the order a snapshot lists them."""

NEVER_MIGRATED = ("schema_missing", "database_missing")
"""The persistence reasons of a database no ``tenure migrate`` ever ran on."""

DEFAULT_TIMEOUT_SECONDS = 5.0

THRESHOLD_LIMITS: dict[str, tuple[float, float]] = {
    "max_pending_jobs": (0, 1_000_000_000),
    "max_oldest_pending_seconds": (0, 31_536_000),
    "max_expired_claims": (0, 1_000_000_000),
    "expired_claim_grace_seconds": (0, 86_400),
    "max_cancelling_seconds": (0, 31_536_000),
    "max_degraded_nodes": (0, 1_000_000),
    "timeout_seconds": (0.1, 300),
}
"""The range each setting takes (a year at most for an age, a day for the grace)."""

_INTEGERS = frozenset({"max_pending_jobs", "max_expired_claims", "max_degraded_nodes"})


def check_setting(field: str, value: object) -> None:
    """Refuse (``invalid_arguments``, naming ``field``) a value outside its range."""
    low, high = THRESHOLD_LIMITS[field]
    if field in _INTEGERS:
        ok = type(value) is int and low <= value <= high
        problem = "integer_out_of_range"
    else:
        ok = type(value) in (int, float) and math.isfinite(value) and low <= value <= high  # type: ignore[arg-type,operator]
        problem = "number_out_of_range"
    if not ok:
        raise ConfigValidationError("invalid_arguments", fields=(field,), problems=(problem,))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Thresholds:
    """What a check tolerates (see the module docstring); checked when made."""

    max_pending_jobs: int | None = None
    max_oldest_pending_seconds: float = 300.0
    max_expired_claims: int = 0
    expired_claim_grace_seconds: float = 60.0
    max_cancelling_seconds: float = 300.0
    max_degraded_nodes: int = 0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None or field.name != "max_pending_jobs":
                check_setting(field.name, value)


@dataclasses.dataclass(frozen=True, slots=True)
class HealthCheck:
    """One check's verdict: ``value`` against ``threshold`` (None: none applies), why
    (``reason``, an authored word) and what else it counted (``detail``)."""

    name: str
    ok: bool
    value: int | float | None
    threshold: int | float | None
    reason: str
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "value": self.value, "threshold": self.threshold,
                "reason": self.reason, "detail": dict(self.detail)}


@dataclasses.dataclass(frozen=True, slots=True)
class CancellingReading:
    """The Runs in CANCELLING: how many, the oldest's age, and how many are past the threshold."""

    cancelling: int
    oldest_seconds: float | None
    stuck: int


@dataclasses.dataclass(frozen=True, slots=True)
class NodeReport:
    """One node's latest recovery report (``node`` is for a caller's own use: the
    command never prints it)."""

    node: str
    pass_kind: str
    degraded: bool
    issue_count: int
    counts: Mapping[str, int]
    issue_reasons: Mapping[str, int]
    age_seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class HealthSnapshot:
    """What one health read found (see the module docstring)."""

    database: str
    """``sqlite`` or ``postgresql``."""
    checks: tuple[HealthCheck, ...]
    """One per name of :data:`CHECK_NAMES`, in that order (empty when never migrated)."""
    never_migrated: str | None = None
    """``schema_missing`` or ``database_missing`` for a database no migration ran on."""
    missing_steps: tuple[str, ...] | None = None
    queues: tuple[QueueReading, ...] | None = None
    cancelling: CancellingReading | None = None
    reports: tuple[NodeReport, ...] | None = None

    @property
    def healthy(self) -> bool:
        return self.never_migrated is None and all(check.ok for check in self.checks)

    def check(self, name: str) -> HealthCheck:
        return next(check for check in self.checks if check.name == name)

    def document(self) -> dict[str, Any]:
        """The snapshot as one JSON object (no node name, no Run ID)."""
        return {"healthy": self.healthy, "database": self.database,
                "checks": [check.document() for check in self.checks],
                "queues": [queue.document() for queue in self.queues or ()]}


# --- reading -----------------------------------------------------------------------------------

_STUCK_CANCELLING = Finder(
    "health_stuck_cancelling",
    ((Condition("status", "=", RunStatus.CANCELLING), Condition("updated_at_us", "<", Param("cutoff"))),),
    lock="none",
)


def _seconds(micros: int) -> float:
    return round(micros / 1_000_000, 3)


def _micros(seconds: float) -> int:
    return int(seconds * 1_000_000)


class _Reader:
    """One snapshot's reads, each group in its own read transaction, filled in as they
    answer (what a timeout leaves unread stays None)."""

    def __init__(self, store: Store, counts: QueueCounts, codec: Dialect, schema: str | None,
                 thresholds: Thresholds) -> None:
        self.store, self.counts, self.codec, self.schema, self.thresholds = store, counts, codec, schema, thresholds
        self.latency_ms: float | None = None
        self.unreachable: str | None = None
        self.never_migrated: str | None = None
        self.applied: frozenset[str] | None = None
        self.failed: dict[str, str] = {}
        """Group ("queues", "runs", "reports") -> the persistence reason its read failed with."""
        self.queues: tuple[QueueReading, ...] | None = None
        self.cancelling: CancellingReading | None = None
        self.reports: tuple[NodeReport, ...] | None = None

    def table(self, binding: Binding) -> str:
        return qualified(self.schema, binding.spec.name)

    def has(self, step: Step) -> bool:
        return self.applied is not None and step.value in self.applied

    async def read(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            self.applied = await self.store.run(self._steps, write=False)
        except TenureError as error:
            if error.reason in NEVER_MIGRATED:
                self.never_migrated = error.reason
            else:
                self.unreachable = error.reason
            return
        self.latency_ms = round((loop.time() - started) * 1000, 1)
        for group, step, body in (("queues", OWNED_STEP, self._queues), ("runs", RUNS_STEP, self._cancelling),
                                  ("reports", REPORTS_STEP, self._reports)):
            if not self.has(step):
                continue
            try:
                await self.store.run(body, write=False)
            except TenureError as error:
                self.failed[group] = error.reason

    async def _steps(self, tx: Transaction) -> frozenset[str]:
        await tx.now_us()  # SQLite: a file never migrated has no clock row (schema_missing)
        rows = await cast(Executor, tx).execute(f"SELECT name FROM {qualified(self.schema, MIGRATIONS_TABLE)}")
        return frozenset(str(name) for (name,) in rows)

    async def _queues(self, tx: Transaction) -> None:
        cutoff = await tx.now_us() - _micros(self.thresholds.expired_claim_grace_seconds)
        self.queues = await self.counts.read(tx, tasks=self.has(TASKS_STEP), expired_before_us=cutoff)

    async def _cancelling(self, tx: Transaction) -> None:
        now = await tx.now_us()
        status = RUNS_BINDING.column_of("status").name
        updated = RUNS_BINDING.column_of("updated_at_us").name
        rows = await cast(Executor, tx).execute(
            f"SELECT count(*), min({updated}) FROM {self.table(RUNS_BINDING)} "
            f"WHERE {status} = '{RunStatus.CANCELLING.value}'")
        count, earliest = rows[0]
        cutoff = now - _micros(self.thresholds.max_cancelling_seconds)
        (stuck,) = await tx.count_each([(RUNS_BINDING, _STUCK_CANCELLING, {"cutoff": cutoff}, None)])
        oldest = None if earliest is None else _seconds(max(0, now - self.codec.instant_from_stored(earliest)))
        self.cancelling = CancellingReading(int(count), oldest, stuck)

    async def _reports(self, tx: Transaction) -> None:
        now = await tx.now_us()
        self.reports = tuple(
            NodeReport(row.node, row.pass_kind, row.degraded, row.issue_count, stored_counts(row.counts_json),
                       stored_counts(row.issue_reasons_json), _seconds(max(0, now - row.finished_at_us)))
            for row in await latest_reports(tx))

    # --- judging ---------------------------------------------------------------------------

    def snapshot(self, database: str, *, timed_out: bool) -> HealthSnapshot:
        if self.never_migrated is not None:
            return HealthSnapshot(database, (), never_migrated=self.never_migrated)
        missing = None if self.applied is None else tuple(
            step.value for step in RECORDED_STEPS if step.value not in self.applied)
        checks = (self._reachable(timed_out), self._migrated(missing, timed_out), *self._judged(timed_out))
        return HealthSnapshot(database, checks, missing_steps=missing, queues=self.queues, cancelling=self.cancelling,
                              reports=self.reports)

    def _unread(self, name: str, threshold: int | float | None, group: str | None, step: Step | None,
                timed_out: bool) -> HealthCheck | None:
        """The verdict of a check whose data was not read, or None when it was."""
        if self.applied is None:
            return HealthCheck(name, False, None, threshold, "timeout" if timed_out else "not_checked")
        if step is not None and not self.has(step):
            return HealthCheck(name, True, None, threshold, "table_absent")
        if group is not None and group in self.failed:
            return HealthCheck(name, False, None, threshold, self.failed[group])
        if timed_out:
            return HealthCheck(name, False, None, threshold, "timeout")
        return None

    def _reachable(self, timed_out: bool) -> HealthCheck:
        if self.applied is not None:
            return HealthCheck("reachable", True, self.latency_ms, None, "answered")
        reason = self.unreachable or ("timeout" if timed_out else "not_checked")
        return HealthCheck("reachable", False, None, None, reason)

    def _migrated(self, missing: tuple[str, ...] | None, timed_out: bool) -> HealthCheck:
        if missing is None:
            return HealthCheck("migrated", False, None, 0, "timeout" if timed_out else "not_checked")
        return HealthCheck("migrated", not missing, len(missing), 0, "behind" if missing else "current",
                           {"missing_steps": list(missing)})

    def _judged(self, timed_out: bool) -> list[HealthCheck]:
        t = self.thresholds
        checks: list[HealthCheck] = []
        for name, threshold in (("pending_jobs", t.max_pending_jobs),
                                ("oldest_pending_seconds", t.max_oldest_pending_seconds),
                                ("expired_claims", t.max_expired_claims)):
            unread = self._unread(name, threshold, "queues", OWNED_STEP, timed_out and self.queues is None)
            checks.append(unread or self._queue_check(name, threshold))
        unread = self._unread("oldest_cancelling_seconds", t.max_cancelling_seconds, "runs", RUNS_STEP,
                              timed_out and self.cancelling is None)
        checks.append(unread or self._cancelling_check())
        unread = self._unread("recovery_reports", t.max_degraded_nodes, "reports", REPORTS_STEP,
                              timed_out and self.reports is None)
        checks.append(unread or self._reports_check())
        return checks

    def _queue_check(self, name: str, threshold: int | float | None) -> HealthCheck:
        assert self.queues is not None
        t = self.thresholds
        if name == "pending_jobs":
            by_status: dict[str, int] = {}
            for reading in self.queues:
                for status, count in reading.counts.items():
                    by_status[status] = by_status.get(status, 0) + count
            pending = by_status.get(JobStatus.PENDING.value, 0)
            ok = threshold is None or pending <= threshold
            return HealthCheck(name, ok, pending, threshold, "within" if ok else "exceeded", {"by_status": by_status})
        if name == "oldest_pending_seconds":
            ages = [age for age in (reading.oldest_pending_seconds for reading in self.queues) if age is not None]
            if not ages:
                return HealthCheck(name, True, None, threshold, "none_due")
            oldest = max(ages)
            ok = oldest <= t.max_oldest_pending_seconds
            return HealthCheck(name, ok, oldest, threshold, "within" if ok else "exceeded")
        expired = sum(reading.expired_claims for reading in self.queues)
        ok = expired <= t.max_expired_claims
        reason = "none" if expired == 0 else "within" if ok else "exceeded"
        return HealthCheck(name, ok, expired, threshold, reason, {"grace_seconds": t.expired_claim_grace_seconds})

    def _cancelling_check(self) -> HealthCheck:
        assert self.cancelling is not None
        reading, threshold = self.cancelling, self.thresholds.max_cancelling_seconds
        detail = {"cancelling": reading.cancelling, "stuck": reading.stuck}
        if reading.oldest_seconds is None:
            return HealthCheck("oldest_cancelling_seconds", True, None, threshold, "none_cancelling", detail)
        ok = reading.oldest_seconds <= threshold
        return HealthCheck("oldest_cancelling_seconds", ok, reading.oldest_seconds, threshold,
                           "within" if ok else "exceeded", detail)

    def _reports_check(self) -> HealthCheck:
        assert self.reports is not None
        threshold = self.thresholds.max_degraded_nodes
        if not self.reports:
            return HealthCheck("recovery_reports", True, 0, threshold, "no_reports", {"nodes": 0})
        degraded = [report for report in self.reports if report.degraded]
        reasons: dict[str, int] = {}
        for report in degraded:
            for reason, count in report.issue_reasons.items():
                reasons[reason] = reasons.get(reason, 0) + count
        detail = {"nodes": len(self.reports), "degraded_nodes": len(degraded),
                  "issues": sum(report.issue_count for report in degraded), "issue_reasons": reasons,
                  "newest_age_seconds": min(report.age_seconds for report in self.reports)}
        ok = len(degraded) <= threshold
        return HealthCheck("recovery_reports", ok, len(degraded), threshold,
                           "clean" if not degraded else "within" if ok else "degraded", detail)


# --- the probe ---------------------------------------------------------------------------------


class HealthProbe:
    """The database at ``db_url``, read on demand (``async with HealthProbe(url) as probe:
    await probe.snapshot()``): a sampler keeps one open between samples. A bad URL is
    refused here (``ConfigValidationError``, never quoting it); nothing connects until
    the first snapshot."""

    def __init__(self, db_url: str, *, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        check_setting("timeout_seconds", timeout_seconds)
        target = parse_db_url(db_url)
        backend = backend_for(target)
        self.database = target.kind.value
        self.timeout_seconds = float(timeout_seconds)
        self._schema = resolve_schema(target, None)
        self._codec = backend.codec
        self._counts = QueueCounts(backend, self._schema)
        self._store = open_store(db_url, timeout_seconds=self.timeout_seconds)

    async def snapshot(self, thresholds: Thresholds | None = None) -> HealthSnapshot:
        """One reading, within ``timeout_seconds`` (see the module docstring)."""
        reader = _Reader(self._store, self._counts, self._codec, self._schema, thresholds or Thresholds())
        timed_out = False
        try:
            async with asyncio.timeout(self.timeout_seconds):
                await reader.read()
        except TimeoutError:
            timed_out = True
        return reader.snapshot(self.database, timed_out=timed_out)

    async def close(self) -> None:
        """Close the connections, within the timeout (a connection that hangs is left)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._store.close(), timeout=self.timeout_seconds)

    async def __aenter__(self) -> HealthProbe:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def health_snapshot(db_url: str, *, thresholds: Thresholds | None = None,
                          timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> HealthSnapshot:
    """One :class:`HealthSnapshot` of the database at ``db_url`` (opened and closed here)."""
    async with HealthProbe(db_url, timeout_seconds=timeout_seconds) as probe:
        return await probe.snapshot(thresholds)
