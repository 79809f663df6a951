"""Metrics and traces, as optional extras: Prometheus counters, histograms and sampled
gauges served on ``/metrics``, and OpenTelemetry spans around claims, handlers and writes.

    pip install 'tenure[metrics]'    # prometheus-client
    pip install 'tenure[tracing]'    # opentelemetry-api (an SDK, configured by you, exports)

    tenure worker --app tasks:app --metrics-port 9464 [--metrics-host 127.0.0.1]
    tenure runs worker --db URL --broker queue --workflows flows:registry --metrics-port 9465
    tenure worker ... --tracing      # spans through OpenTelemetry's global tracer provider

In a program, an :class:`Instruments` is the observer a
:class:`~tenure.adapters.Worker` and a :class:`~tenure.adapters.RunWorker` take
(``metrics=``), a :class:`~tenure.adapters.RunLedger` holds (``ledger.metrics``), and
:meth:`Instruments.watch_runtime` attaches to a :class:`~tenure.adapters.RunRuntime`;
:meth:`Instruments.serve` serves ``/metrics`` and :meth:`Instruments.sample` keeps the
gauges fresh. Each Instruments records into its own ``CollectorRegistry`` (never
prometheus-client's global one, so that two in one process do not collide); pass
``registry=`` to share one.

Nothing here imports ``prometheus_client`` or ``opentelemetry`` until metrics or tracing
are asked for: a process that never asks never loads them, and a worker without an
observer pays one ``is None`` check per event.

Metrics (labels in braces; ``queue`` is a task queue's name, or the pycharter queue
``validation``, ``pipeline`` or ``streaming``; ``task`` a task's name, empty for pycharter
jobs; ``workflow`` a workflow's registered name; at most 256 values of each label per
process, the rest counted under ``(other)``; never a job ID, Run ID or payload):

Counters, per queue Worker (``Worker.stats`` counts the same events):
``tenure_jobs_claimed_total{queue,task}``, ``tenure_jobs_completed_total``,
``tenure_jobs_failed_total`` (finished failed), ``tenure_jobs_retried_total`` (failed
and sent back to pending), ``tenure_jobs_cancels_acknowledged_total`` (streaming),
``tenure_jobs_stale_writes_refused_total`` (a fenced write refused: the claim was no
longer this worker's), ``tenure_jobs_lease_losses_total``, ``tenure_jobs_released_total``
(given back at shutdown), all ``{queue,task}``; ``tenure_worker_database_failures_total{call}``
(``claim``, ``write``, ``heartbeat``, ``listen``, ...).

Counters, Runs: ``tenure_runs_admitted_total{queue,workflow}`` (new Runs admitted through
a ledger that has the observer: in ``tenure runs worker``, the Runs its workflows and
retries admit; an application that admits Runs sets ``ledger.metrics`` itself, since
admission is where a Run is created, and no worker sees it);
``tenure_run_hops_total{queue,workflow,outcome}`` with ``outcome`` one of the RunWorker's
``skipped``, ``unserved``, ``done``, ``failed``, ``parked``, ``cancelled``, ``lost``, ``unsettled``
(``queue`` and ``workflow`` empty for a hop that claimed nothing);
``tenure_recovery_passes_total{pass}``, ``tenure_recovery_degraded_passes_total{pass}``,
``tenure_recovery_writes_total{pass,kind}`` (a report's counts: ``published``,
``resumed``, ``orphans_failed``, ...) and ``tenure_recovery_issues_total{pass,reason}``,
with ``pass`` one of ``startup``, ``relay``, ``reboot``, ``takeover``.

Histograms (seconds): ``tenure_jobs_queue_wait_seconds{queue,task}``, from when a job was
due (its ``fires_at``, or a retry's backoff end) to its claim, both read from the
database clock by the claim; ``tenure_jobs_handler_seconds{queue,task,outcome}``
(``complete``, ``fail``, ``cancelled``; this process's monotonic clock);
``tenure_run_hop_seconds{queue,workflow,outcome}``, from a hop's claim to its outcome
(monotonic); ``tenure_run_consent_wait_seconds{queue,workflow,verdict}``, from a
consent's creation to its decision (database clock), observed when a resumed hop loads
the decided consent (again if that hop is lost and retried).

Gauges, sampled every ``--metrics-sample-seconds`` (default 15; 0: no sampling) by one
read-only :class:`~tenure.apps.health.HealthProbe` snapshot (what ``tenure
health`` reads; its queues through :class:`~tenure.apps.queue_counts.QueueCounts`, the reader
the console's overview shows too), never per call: ``tenure_queue_jobs{table,queue,status}``,
``tenure_queue_oldest_pending_seconds{table,queue}`` (how long the oldest due pending job
has been due, database clock; 0 when none is due),
``tenure_queue_expired_claims{table,queue}``, ``tenure_runs_cancelling``,
``tenure_runs_oldest_cancelling_seconds``, ``tenure_recovery_degraded_nodes``,
``tenure_health_sample_up`` (1: the last sample read the database) and
``tenure_health_sample_age_seconds``. Each process samples the whole database: on a fleet,
sample from one process (``--metrics-sample-seconds 0`` on the others).

Spans (with ``--tracing``, or ``Instruments(tracing=True)``): ``tenure.claim`` (one per
claim call: ``tenure.want``, ``tenure.claimed``), ``tenure.job`` (claim to the end of the
job's task) with its children ``tenure.handler`` (current while the handler runs, so the
handler's own spans nest under it; status ERROR with the exception when it raised) and
``tenure.settle`` (``tenure.result``); ``tenure.hop`` (current while the workflow runs;
``tenure.outcome``). Job and Run IDs are span attributes (``tenure.job_id``,
``tenure.run_id``), never metric labels. OpenTelemetry's API alone records nothing: an
SDK configured in the process (``opentelemetry-instrument``, or your own
``TracerProvider``) exports them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import importlib.util
import logging
import math
import socket
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tenure.model import ConfigValidationError

from .reporting import ArgumentsRefused

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from tenure.model import ConsentRecord, RunClaim, RunRecord

    from tenure.adapters.queue.job import JobContext
    from tenure.adapters.runs.recovery import RecoveryReport
    from tenure.adapters.runs.runtime import RunRuntime
    from .health import HealthProbe, HealthSnapshot

__all__ = ["Instruments", "add_metrics_options", "start_metrics", "metrics_installed", "tracing_installed",
           "MAX_LABEL_VALUES", "OTHER_LABEL", "METRICS_HINT", "TRACING_HINT", "DEFAULT_SAMPLE_SECONDS",
           "MAX_SAMPLE_SECONDS", "DURATION_BUCKETS", "WAIT_BUCKETS", "CONSENT_BUCKETS"]

log = logging.getLogger("tenure.apps.metrics")

MAX_LABEL_VALUES = 256
"""Values one label takes per process; later ones are counted under :data:`OTHER_LABEL`."""

OTHER_LABEL = "(other)"

METRICS_HINT = "install the metrics extra: pip install 'tenure[metrics]'"
TRACING_HINT = "install the tracing extra: pip install 'tenure[tracing]'"

DEFAULT_SAMPLE_SECONDS = 15.0
MAX_SAMPLE_SECONDS = 3600.0

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
"""Handler and hop durations: 5 ms to an hour."""
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)
"""Queue waits: 1 ms to a day."""
CONSENT_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0, 259200.0, 604800.0)
"""Consent waits: a second to a week."""


def metrics_installed() -> bool:
    """Whether ``prometheus_client`` can be imported (it is not imported here)."""
    return importlib.util.find_spec("prometheus_client") is not None


def tracing_installed() -> bool:
    """Whether ``opentelemetry`` (the API) can be imported (it is not imported here)."""
    return importlib.util.find_spec("opentelemetry") is not None and \
        importlib.util.find_spec("opentelemetry.trace") is not None


class _Bounded:
    """A label's values: the first :data:`MAX_LABEL_VALUES` as they are, the rest
    :data:`OTHER_LABEL` (a label's cardinality stays bounded whatever the database holds)."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) >= MAX_LABEL_VALUES:
            return OTHER_LABEL
        self._seen.add(value)
        return value


def _seconds_between_us(start_us: object, end_us: object) -> float | None:
    if type(start_us) is not int or type(end_us) is not int:
        return None
    return max(0, end_us - start_us) / 1_000_000


class _Families:
    """The counters and histograms of one Instruments, in its registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Histogram

        def counter(name: str, text: str, labels: tuple[str, ...]) -> Any:
            return Counter(name, text, labels, registry=registry)

        job = ("queue", "task")
        self.claimed = counter("tenure_jobs_claimed", "Claims taken by this process's workers", job)
        self.settled = {
            "completed": counter("tenure_jobs_completed", "Jobs completed by a fenced write", job),
            "failed": counter("tenure_jobs_failed", "Jobs finished as failed (no retry left, or retry=False)", job),
            "retried": counter("tenure_jobs_retried", "Failures sent back to pending for another attempt", job),
            "cancel_acknowledged": counter("tenure_jobs_cancels_acknowledged",
                                           "Streaming launches stopped on a cancel request", job),
            "stale_write_refused": counter("tenure_jobs_stale_writes_refused",
                                           "Fenced writes refused: the claim was no longer this worker's", job),
        }
        self.lease_losses = counter("tenure_jobs_lease_losses", "Claims whose lease was lost while held", job)
        self.released = counter("tenure_jobs_released", "Claims given back at shutdown", job)
        self.database_failures = counter("tenure_worker_database_failures", "Worker calls the database failed",
                                         ("call",))
        self.queue_wait = Histogram("tenure_jobs_queue_wait_seconds",
                                    "From a job's due time to its claim (database clock)", job,
                                    buckets=WAIT_BUCKETS, registry=registry)
        self.handler = Histogram("tenure_jobs_handler_seconds", "Handler run time by outcome",
                                 (*job, "outcome"), buckets=DURATION_BUCKETS, registry=registry)
        run = ("queue", "workflow")
        self.admitted = counter("tenure_runs_admitted", "New Runs admitted through an observed ledger", run)
        self.hops = counter("tenure_run_hops", "Delivered hops by outcome", (*run, "outcome"))
        self.hop_seconds = Histogram("tenure_run_hop_seconds", "From a hop's claim to its outcome",
                                     (*run, "outcome"), buckets=DURATION_BUCKETS, registry=registry)
        self.consent_wait = Histogram("tenure_run_consent_wait_seconds",
                                      "From a consent's creation to its decision (database clock)",
                                      (*run, "verdict"), buckets=CONSENT_BUCKETS, registry=registry)
        self.passes = counter("tenure_recovery_passes", "Recovery passes finished", ("pass",))
        self.degraded_passes = counter("tenure_recovery_degraded_passes", "Recovery passes that were degraded",
                                       ("pass",))
        self.recovery_writes = counter("tenure_recovery_writes", "Recovery writes that applied, by kind",
                                       ("pass", "kind"))
        self.recovery_issues = counter("tenure_recovery_issues", "Runs that made a recovery pass degraded, by reason",
                                       ("pass", "reason"))


class _JobSeries:
    """The labelled children of one (queue, task): looked up once, not per event."""

    __slots__ = ("families", "labels", "claimed", "settled", "lease_losses", "released", "queue_wait", "handler")

    def __init__(self, families: _Families, queue: str, task: str) -> None:
        self.families = families
        self.labels = (queue, task)
        self.claimed = families.claimed.labels(queue, task)
        self.settled = {result: family.labels(queue, task) for result, family in families.settled.items()}
        self.lease_losses = families.lease_losses.labels(queue, task)
        self.released = families.released.labels(queue, task)
        self.queue_wait = families.queue_wait.labels(queue, task)
        self.handler: dict[str, Any] = {}


class _Tracing:
    """OpenTelemetry's pieces, imported once tracing is asked for."""

    def __init__(self, tracer: Any) -> None:
        from opentelemetry import context, trace

        self.tracer = tracer if tracer is not None else trace.get_tracer("tenure")
        self.attach = context.attach
        self.detach = context.detach
        self.in_context = trace.set_span_in_context
        self.error = trace.Status(trace.StatusCode.ERROR)


class _JobWatch:
    """A :class:`~tenure.adapters.core.observers.JobObserver`: one claimed job."""

    __slots__ = ("_series", "_tracing", "_job_span", "_handler_span", "_settle_span", "_handler_started")

    def __init__(self, series: _JobSeries | None, tracing: _Tracing | None, claimed: Any, context: JobContext) -> None:
        self._series = series
        self._tracing = tracing
        self._job_span: Any = None
        self._handler_span: Any = None
        self._settle_span: Any = None
        self._handler_started = 0.0
        if series is not None:
            series.claimed.inc()
            wait = _seconds_between_us(getattr(claimed, "due_at_us", None), getattr(claimed, "claimed_at_us", None))
            if wait is not None:
                series.queue_wait.observe(wait)
        if tracing is not None:
            attributes: dict[str, Any] = {"tenure.queue": context.queue_name or context.queue.value,
                                          "tenure.job_id": context.job_id, "tenure.attempt": context.attempt}
            if context.task_name is not None:
                attributes["tenure.task"] = context.task_name
            self._job_span = tracing.tracer.start_span("tenure.job", attributes=attributes)

    def run_handler(self, start: Callable[[], asyncio.Task[Any]]) -> asyncio.Task[Any]:
        self._handler_started = time.monotonic()
        tracing = self._tracing
        if tracing is None:
            return start()
        span = self._handler_span = tracing.tracer.start_span("tenure.handler",
                                                              context=tracing.in_context(self._job_span))
        token = tracing.attach(tracing.in_context(span))
        try:
            return start()  # the handler's task copies this context: its own spans nest under this one
        finally:
            tracing.detach(token)

    def handler_ended(self, outcome: str, error: BaseException | None) -> None:
        series = self._series
        if series is not None:
            child = series.handler.get(outcome)
            if child is None:
                child = series.handler[outcome] = series.families.handler.labels(*series.labels, outcome)
            child.observe(time.monotonic() - self._handler_started)
        span, self._handler_span = self._handler_span, None
        if span is not None:
            span.set_attribute("tenure.outcome", outcome)
            if error is not None:
                span.record_exception(error)
                span.set_status(self._tracing.error)  # type: ignore[union-attr]
            span.end()

    def settle_started(self) -> None:
        tracing = self._tracing
        if tracing is not None:
            self._settle_span = tracing.tracer.start_span("tenure.settle", context=tracing.in_context(self._job_span))

    def settled(self, result: str) -> None:
        if self._series is not None:
            self._series.settled[result].inc()
        span, self._settle_span = self._settle_span, None
        if span is not None:
            span.set_attribute("tenure.result", result)
            span.end()

    def lease_lost(self) -> None:
        if self._series is not None:
            self._series.lease_losses.inc()
        if self._job_span is not None:
            self._job_span.add_event("tenure.lease_lost")

    def released(self) -> None:
        if self._series is not None:
            self._series.released.inc()

    def finished(self) -> None:
        for name in ("_handler_span", "_settle_span", "_job_span"):
            span = getattr(self, name)
            if span is not None:
                setattr(self, name, None)
                span.end()


class _HopWatch:
    """A :class:`~tenure.adapters.core.observers.HopObserver`: one delivered hop."""

    __slots__ = ("_owner", "_labels", "_claimed_at", "_span", "_token", "_ended")

    def __init__(self, owner: Instruments, run_id: str, enqueue_seq: int) -> None:
        self._owner = owner
        self._labels = ("", "")
        self._claimed_at: float | None = None
        self._span: Any = None
        self._token: Any = None
        self._ended = False
        tracing = owner.tracing
        if tracing is not None:
            self._span = tracing.tracer.start_span("tenure.hop", attributes={"tenure.run_id": run_id,
                                                                              "tenure.seq": enqueue_seq})
            self._token = tracing.attach(tracing.in_context(self._span))  # the workflow's task copies it

    def claimed(self, claim: RunClaim) -> None:
        self._claimed_at = time.monotonic()
        self._labels = self._owner.run_labels(claim.run.queue, claim.workflow.name)
        if self._span is not None:
            self._span.set_attribute("tenure.workflow", claim.workflow.name)

    def ended(self, outcome: str | None) -> None:
        if self._ended:
            return
        self._ended = True
        families = self._owner.families
        if families is not None and outcome is not None:
            families.hops.labels(*self._labels, outcome).inc()
            if self._claimed_at is not None:
                families.hop_seconds.labels(*self._labels, outcome).observe(time.monotonic() - self._claimed_at)
        if self._span is not None:
            self._span.set_attribute("tenure.outcome", outcome or "aborted")
            self._span.end()
            tracing = self._owner.tracing
            assert tracing is not None
            with contextlib.suppress(Exception):  # detached elsewhere than attached: nothing to restore
                tracing.detach(self._token)


class Instruments:
    """The observer of workers, Run workers, ledgers and runtimes (see the module
    docstring): Prometheus metrics when ``metrics`` (in ``registry``, a new
    ``CollectorRegistry`` by default), OpenTelemetry spans when ``tracing`` (from
    ``tracer``, by default ``opentelemetry.trace.get_tracer("tenure")``). Refused
    (``ConfigValidationError``) when the library for what is asked is not installed."""

    def __init__(self, *, metrics: bool = True, tracing: bool = False, registry: CollectorRegistry | None = None,
                 tracer: Any = None) -> None:
        if type(metrics) is not bool or type(tracing) is not bool:
            raise ConfigValidationError("invalid_instruments", fields=("metrics" if type(metrics) is not bool
                                                                       else "tracing",), problems=("bool_required",))
        if metrics and not metrics_installed():
            raise ConfigValidationError("invalid_instruments", fields=("metrics",), problems=("metrics_not_installed",))
        if tracing and not tracing_installed():
            raise ConfigValidationError("invalid_instruments", fields=("tracing",), problems=("tracing_not_installed",))
        self.registry: CollectorRegistry | None = None
        self.families: _Families | None = None
        if metrics:
            from prometheus_client import CollectorRegistry

            self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
            self.families = _Families(self.registry)
        self.tracing: _Tracing | None = _Tracing(tracer) if tracing else None
        self._queues = _Bounded()
        self._tasks = _Bounded()
        self._workflows = _Bounded()
        self._series: dict[tuple[str, str], _JobSeries] = {}
        self._server: Any = None
        self._sampler: asyncio.Task[None] | None = None
        self._lifetime: asyncio.Task[None] | None = None

    # --- the queue Worker (WorkerObserver) -------------------------------------------------

    def claim_started(self, want: int) -> object:
        tracing = self.tracing
        return None if tracing is None else tracing.tracer.start_span("tenure.claim", attributes={"tenure.want": want})

    def claim_ended(self, token: object, claimed: int | None) -> None:
        if token is not None:
            span: Any = token
            if claimed is None:
                span.set_status(self.tracing.error)  # type: ignore[union-attr]
            else:
                span.set_attribute("tenure.claimed", claimed)
            span.end()

    def job_claimed(self, claimed: Any, context: JobContext) -> _JobWatch:
        series = None
        if self.families is not None:
            key = (context.queue_name or context.queue.value, context.task_name or "")
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _JobSeries(self.families, self._queues(key[0]),
                                                        self._tasks(key[1]) if key[1] else "")
        return _JobWatch(series, self.tracing, claimed, context)

    def call_failed(self, call: str) -> None:
        if self.families is not None:
            self.families.database_failures.labels(call).inc()

    # --- Runs (RunWorkerObserver, LedgerObserver, RuntimeObserver) -------------------------------

    def run_labels(self, queue: str, workflow: str) -> tuple[str, str]:
        return self._queues(queue), self._workflows(workflow)

    def hop_started(self, run_id: str, enqueue_seq: int) -> _HopWatch:
        return _HopWatch(self, run_id, enqueue_seq)

    def consent_decided(self, claim: RunClaim, consent: ConsentRecord) -> None:
        if self.families is None or consent.decided_at is None:
            return
        waited = max(0.0, (consent.decided_at - consent.created_at).total_seconds())
        labels = self.run_labels(claim.run.queue, claim.workflow.name)
        self.families.consent_wait.labels(*labels, consent.status.value).observe(waited)

    def run_admitted(self, run: RunRecord) -> None:
        if self.families is not None:
            self.families.admitted.labels(*self.run_labels(run.queue, run.workflow.name)).inc()

    def recovery_report(self, pass_kind: str, report: RecoveryReport) -> None:
        families = self.families
        if families is None:
            return
        families.passes.labels(pass_kind).inc()
        if report.degraded:
            families.degraded_passes.labels(pass_kind).inc()
        for kind, count in report.counts.items():
            if count:
                families.recovery_writes.labels(pass_kind, kind).inc(count)
        for issue in report.issues:
            families.recovery_issues.labels(pass_kind, issue.reason).inc()

    def watch_runtime(self, runtime: RunRuntime) -> None:
        """Count every recovery report ``runtime`` records (its startup reconciliation,
        each relay round, each reboot and takeover): attach before entering it. The
        runtime records every report through ``record_report``; this wraps that one
        method of this one runtime, changing nothing it does."""
        record = runtime.record_report

        async def recorded(node: str, pass_kind: str, report: RecoveryReport) -> None:
            self.recovery_report(pass_kind, report)
            await record(node, pass_kind, report)

        runtime.record_report = recorded  # type: ignore[method-assign]

    # --- gauges and serving ----------------------------------------------------------------

    def sample(self, db_url: str, every_s: float = DEFAULT_SAMPLE_SECONDS) -> None:
        """Sample the database at ``db_url`` every ``every_s`` seconds into this
        registry's gauges, on the running loop, from now until :meth:`close` (or until
        the loop cancels what is left when it ends)."""
        if self.registry is None:
            raise ConfigValidationError("invalid_instruments", fields=("metrics",), problems=("metrics_disabled",))
        if type(every_s) not in (int, float) or not 0 < every_s <= MAX_SAMPLE_SECONDS:
            raise ConfigValidationError("invalid_instruments", fields=("every_s",), problems=("number_out_of_range",))
        if self._sampler is not None:
            raise ConfigValidationError("invalid_instruments", fields=("db_url",), problems=("already_sampling",))
        from .health import HealthProbe

        probe = HealthProbe(db_url)
        readings = _Readings()
        self.registry.register(readings)
        self._sampler = asyncio.get_running_loop().create_task(self._sampling(probe, readings, float(every_s)))
        self._live()

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``host``:``port`` (0: a free port) from
        prometheus-client's server thread, until :meth:`close` (or until the running
        loop ends); returns the port. Refused (``ArgumentsRefused`` naming
        ``metrics_port`` or ``metrics_host``) when it cannot bind."""
        if self.registry is None:
            raise ConfigValidationError("invalid_instruments", fields=("metrics",), problems=("metrics_disabled",))
        if type(port) is not int or not 0 <= port <= 65535:
            raise ConfigValidationError("invalid_instruments", fields=("port",), problems=("integer_out_of_range",))
        if type(host) is not str or not host:
            raise ConfigValidationError("invalid_instruments", fields=("host",), problems=("host_required",))
        if self._server is not None:
            raise ConfigValidationError("invalid_instruments", fields=("port",), problems=("already_serving",))
        from prometheus_client import start_http_server

        try:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
            raise _bind_refusal(error) from None
        self._live()
        return int(self._server.server_port)

    def _live(self) -> None:
        """One task for the instruments' lifetime: when it ends (:meth:`close`, or the
        loop cancelling what is left at its end) the sampling stops, its probe is closed
        and the server is shut down."""
        if self._lifetime is None:
            self._lifetime = asyncio.get_running_loop().create_task(self._lifetime_body())

    async def _lifetime_body(self) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            sampler, self._sampler = self._sampler, None
            if sampler is not None:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            server, self._server = self._server, None
            if server is not None:
                await asyncio.to_thread(server.shutdown)
                server.server_close()

    async def _sampling(self, probe: HealthProbe, readings: _Readings, every_s: float) -> None:
        try:
            failing = False
            while True:
                try:
                    readings.update(await probe.snapshot())
                    failing = False
                except Exception as error:  # noqa: BLE001 - a failed sample never stops the process
                    if not failing:
                        log.warning("metrics: a sample failed with %s; the gauges keep their last values",
                                    type(error).__name__)
                    failing = True
                    readings.update(None)
                await asyncio.sleep(every_s)
        finally:
            await probe.close()

    async def close(self) -> None:
        """Stop sampling and serving (idempotent)."""
        lifetime, self._lifetime = self._lifetime, None
        if lifetime is not None:
            lifetime.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lifetime


def _refusal(field: str, problem: str, hint: str) -> ArgumentsRefused:
    """A refusal naming the flag that sets ``field`` (``--metrics-port``) and what to do."""
    return ArgumentsRefused(fields=(field,), problems=(problem,), hints={field: hint},
                            spellings={field: "--" + field.replace("_", "-")})


def _bind_refusal(error: OSError) -> ArgumentsRefused:
    if isinstance(error, socket.gaierror):
        return _refusal("metrics_host", "host_not_found", "--metrics-host takes a local address or host name")
    if error.errno == errno.EADDRINUSE:
        return _refusal("metrics_port", "port_in_use", "another process serves that port: pick another, or 0")
    if error.errno == errno.EADDRNOTAVAIL:
        return _refusal("metrics_host", "address_not_local", "--metrics-host takes an address of this machine")
    if error.errno == errno.EACCES:
        return _refusal("metrics_port", "port_not_permitted", "ports below 1024 need privileges: pick another")
    return _refusal("metrics_port", "bind_failed", "--metrics-port and --metrics-host could not be bound")


class _Readings:
    """The gauges of the latest sample: a prometheus-client collector that answers each
    scrape from the snapshot it holds (replaced whole by each sample, so a scrape never
    sees half of one)."""

    NAMES = ("tenure_queue_jobs", "tenure_queue_oldest_pending_seconds", "tenure_queue_expired_claims",
             "tenure_runs_cancelling", "tenure_runs_oldest_cancelling_seconds", "tenure_recovery_degraded_nodes",
             "tenure_health_sample_up", "tenure_health_sample_age_seconds")

    def __init__(self) -> None:
        self._latest: tuple[HealthSnapshot, float] | None = None
        self._up = False

    def update(self, snapshot: HealthSnapshot | None) -> None:
        """A sample's snapshot (None: it failed). A sample that did not reach the
        database keeps the last good readings (their age grows) and reads as down."""
        up = snapshot is not None and bool(snapshot.checks) and snapshot.check("reachable").ok
        if up:
            assert snapshot is not None
            self._latest = (snapshot, time.monotonic())
        self._up = up

    def describe(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        for name in self.NAMES:
            yield GaugeMetricFamily(name, name)

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        latest = self._latest
        up = GaugeMetricFamily("tenure_health_sample_up", "1 when the last sample read the database, else 0")
        up.add_metric([], 1.0 if self._up else 0.0)
        yield up
        if latest is None:
            return
        snapshot, read_at = latest
        age = GaugeMetricFamily("tenure_health_sample_age_seconds", "Seconds since the gauges were read")
        age.add_metric([], time.monotonic() - read_at)
        yield age
        yield from _snapshot_families(snapshot)


def _snapshot_families(snapshot: HealthSnapshot) -> Iterator[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    if snapshot.queues is not None:
        jobs = GaugeMetricFamily("tenure_queue_jobs", "Jobs by status (sampled)", labels=("table", "queue", "status"))
        oldest = GaugeMetricFamily("tenure_queue_oldest_pending_seconds",
                                   "How long the oldest due pending job has been due (sampled; 0: none due)",
                                   labels=("table", "queue"))
        expired = GaugeMetricFamily("tenure_queue_expired_claims", "Claims past their lease and its grace (sampled)",
                                    labels=("table", "queue"))
        for reading in snapshot.queues:
            for status, count in reading.counts.items():
                jobs.add_metric([reading.table, reading.queue, status], count)
            oldest.add_metric([reading.table, reading.queue], reading.oldest_pending_seconds or 0.0)
            expired.add_metric([reading.table, reading.queue], reading.expired_claims)
        yield from (jobs, oldest, expired)
    if snapshot.cancelling is not None:
        cancelling = GaugeMetricFamily("tenure_runs_cancelling", "Runs in CANCELLING (sampled)")
        cancelling.add_metric([], snapshot.cancelling.cancelling)
        oldest_cancelling = GaugeMetricFamily("tenure_runs_oldest_cancelling_seconds",
                                              "How long the oldest Run in CANCELLING has been there (sampled)")
        oldest_cancelling.add_metric([], snapshot.cancelling.oldest_seconds or 0.0)
        yield from (cancelling, oldest_cancelling)
    if snapshot.reports is not None:
        degraded = GaugeMetricFamily("tenure_recovery_degraded_nodes",
                                     "Nodes whose latest recovery report is degraded (sampled)")
        degraded.add_metric([], sum(1 for report in snapshot.reports if report.degraded))
        yield degraded


# --- the command line ------------------------------------------------------------------------


def add_metrics_options(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port``, ``--metrics-host``, ``--metrics-sample-seconds`` and
    ``--tracing``, alike on every long-running command."""
    parser.add_argument("--metrics-port", type=int,
                        help="serve Prometheus metrics on this port at /metrics (0: a free port, printed; needs "
                             "pip install 'tenure[metrics]')")
    parser.add_argument("--metrics-host", default="127.0.0.1",
                        help="the address /metrics listens on (default 127.0.0.1; 0.0.0.0: every interface)")
    parser.add_argument("--metrics-sample-seconds", type=float, default=DEFAULT_SAMPLE_SECONDS,
                        help="how often the queue depth gauges are read from the database (default 15; 0: never)")
    parser.add_argument("--tracing", action="store_true",
                        help="OpenTelemetry spans around claims, handlers, writes and hops, through the global "
                             "tracer provider (needs pip install 'tenure[tracing]' and an SDK to export)")


def _checked(arguments: argparse.Namespace) -> None:
    port, every_s = arguments.metrics_port, arguments.metrics_sample_seconds
    if port is not None and not 0 <= port <= 65535:
        raise _refusal("metrics_port", "integer_out_of_range", "--metrics-port takes 0 to 65,535; 0: a free port")
    if not (math.isfinite(every_s) and 0 <= every_s <= MAX_SAMPLE_SECONDS):
        raise _refusal("metrics_sample_seconds", "number_out_of_range",
                       "--metrics-sample-seconds takes 0 to 3,600 seconds; 0: no sampling")
    if port is not None and not metrics_installed():
        raise _refusal("metrics_port", "metrics_not_installed", METRICS_HINT)
    if arguments.tracing and not tracing_installed():
        raise _refusal("tracing", "tracing_not_installed", TRACING_HINT)


def start_metrics(arguments: argparse.Namespace, db_url: str, *, ledger: Any = None) -> Instruments | None:
    """The instruments a long-running command asked for with :func:`add_metrics_options`
    (None: neither metrics nor tracing): ``/metrics`` served (its port printed) and the
    database at ``db_url`` sampled, until the running loop ends; ``ledger`` (a
    RunLedger) counts its admissions. Refused (``ArgumentsRefused``, exit 2) for a bad
    value, a port that cannot be bound, or an extra that is not installed."""
    _checked(arguments)
    if arguments.metrics_port is None and not arguments.tracing:
        return None
    instruments = Instruments(metrics=arguments.metrics_port is not None, tracing=arguments.tracing)
    if arguments.metrics_port is not None:
        port = instruments.serve(arguments.metrics_port, arguments.metrics_host)
        if arguments.metrics_sample_seconds > 0:
            instruments.sample(db_url, arguments.metrics_sample_seconds)
        print(f"metrics: serving /metrics on port {port}", flush=True)
    if ledger is not None:
        ledger.metrics = instruments
    return instruments
