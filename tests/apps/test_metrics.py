"""Metrics and traces (issue 31 item 3): a live ``tenure worker`` and ``tenure runs worker``
process serve ``/metrics`` with the counts of what they did, the histograms and the sampled
gauges; in process, every Worker counter matches ``Worker.stats``, spans nest as documented,
labels stay bounded; without ``--metrics-port`` nothing imports prometheus-client or
OpenTelemetry; bad values and missing extras are refused (exit 2) naming the flag."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import pathlib
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from adapter_support import expire_lease
from polling import until
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from tenure.adapters import (
    InMemoryBroker,
    JobContext,
    RunLedger,
    RunWorker,
    TaskApp,
    ValidationJobSource,
    Worker,
    Workflows,
)
from tenure.apps.cli import main
from tenure.apps.metrics import MAX_LABEL_VALUES, OTHER_LABEL, Instruments
from tenure.adapters.runs.recovery import COUNT_NAMES, RecoveryIssue, RecoveryReport
from tenure.model import (
    ConfigValidationError,
    ConsentStatus,
    QueueKind,
    RunIntent,
    RunStatus,
    ValidationJob,
    WaitKind,
    WorkerConfig,
    WorkflowPin,
)

CLI = [sys.executable, "-P", "-m", "tenure.apps.cli"]

TASKS = '''
import os

from tenure.adapters import Backoff, TaskApp

app = TaskApp(os.environ["TENURE_METRICS_TEST_DB"])


@app.task(queue="emails", name="send")
async def send(ctx, n):
    return {"n": n}


@app.task(queue="emails", name="flaky", max_attempts=2, retry=Backoff(base_s=0.01, max_s=0.02, jitter=False))
async def flaky(ctx, n):
    raise ValueError("still broken")
'''

FLOWS = '''
from tenure.adapters import Workflows

registry = Workflows()


@registry.workflow("hello", "1")
async def hello(ctx):
    if not ctx.resumed:
        await ctx.request_consent(tool_name="greet", tool_call_id="call-1", payload={}, state={"n": 1})
    if ctx.consent.verdict is not True:
        raise PermissionError()
'''


def load(folder: pathlib.Path, name: str, text: str) -> Any:
    """A module written into ``folder`` and imported under a name of its own."""
    path = folder / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"{name}_{uuid.uuid4().hex}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample ``/metrics`` serves, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        assert answer.status == 200
        text = answer.read().decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def names(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> set[str]:
    return {name for name, _ in samples}


def started(command: list[str], folder: pathlib.Path) -> tuple[subprocess.Popen[str], int]:
    """A long-running command and the port its ``/metrics`` serves (from its first lines).
    Its log goes to a file (a pipe nobody reads could fill and stall it)."""
    with open(folder / "stderr.log", "w", encoding="utf-8") as log:
        process = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=log, text=True,
                                   env=os.environ.copy())
    assert process.stdout is not None
    for _ in range(5):
        line = process.stdout.readline()
        if line.startswith("metrics: serving /metrics on port "):
            return process, int(line.rsplit(" ", 1)[1])
    process.kill()
    process.communicate(timeout=30)
    raise AssertionError("no metrics port announced: " + (folder / "stderr.log").read_text(encoding="utf-8"))


def stopped(process: subprocess.Popen[str], folder: pathlib.Path) -> str:
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out + (folder / "stderr.log").read_text(encoding="utf-8")
    return out


def labels_hold_none_of(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], ids: list[str]) -> bool:
    return not any(value_ in ids for _, labels in samples for _, value_ in labels)


# --- a live `tenure worker` process ------------------------------------------------------------


async def test_a_worker_process_serves_its_counts_histograms_and_sampled_gauges(
    db_url: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TENURE_METRICS_TEST_DB", db_url)
    app = load(tmp_path, "metric_tasks", TASKS).app
    try:
        ids = [await app.defer("send", {"n": n}) for n in range(5)]
        ids += [await app.defer("flaky", {"n": n}) for n in range(2)]
    finally:
        await app.close()
    process, port = await asyncio.to_thread(started, [
        *CLI, "worker", "--db", db_url, "--app", "metric_tasks:app", "--metrics-port", "0",
        "--metrics-sample-seconds", "0.2", "--idle-wait", "0.2"], tmp_path)
    try:
        def finished() -> dict[Any, float] | None:
            samples = scrape(port)
            done = value(samples, "tenure_queue_jobs", table="tenure_tasks", queue="emails", status="completed")
            failed = value(samples, "tenure_queue_jobs", table="tenure_tasks", queue="emails", status="failed")
            counted = value(samples, "tenure_jobs_failed_total", queue="emails", task="flaky")
            return samples if (done, failed, counted) == (5, 2, 2) else None

        samples = await until(lambda: asyncio.to_thread(finished), 60, what="every task finished and sampled",
                              interval_s=0.2)
    finally:
        out = await asyncio.to_thread(stopped, process, tmp_path)
    send, flaky = {"queue": "emails", "task": "send"}, {"queue": "emails", "task": "flaky"}
    expected = {
        "tenure_jobs_claimed_total": (5, 4), "tenure_jobs_completed_total": (5, 0),
        "tenure_jobs_retried_total": (0, 2), "tenure_jobs_failed_total": (0, 2),
        "tenure_jobs_stale_writes_refused_total": (0, 0), "tenure_jobs_lease_losses_total": (0, 0),
        "tenure_jobs_released_total": (0, 0),
    }
    assert {name: (value(samples, name, **send), value(samples, name, **flaky)) for name in expected} == expected
    assert value(samples, "tenure_jobs_queue_wait_seconds_count", **send) == 5
    assert value(samples, "tenure_jobs_queue_wait_seconds_count", **flaky) == 4
    assert value(samples, "tenure_jobs_handler_seconds_count", **send, outcome="complete") == 5
    assert value(samples, "tenure_jobs_handler_seconds_count", **flaky, outcome="fail") == 4
    assert value(samples, "tenure_jobs_handler_seconds_bucket", **send, outcome="complete", le="+Inf") == 5
    assert value(samples, "tenure_queue_jobs", table="tenure_tasks", queue="emails", status="pending") == 0
    assert value(samples, "tenure_queue_oldest_pending_seconds", table="tenure_tasks", queue="emails") == 0
    assert value(samples, "tenure_queue_expired_claims", table="tenure_tasks", queue="emails") == 0
    assert value(samples, "tenure_queue_jobs", table="validation_jobs", queue="validation", status="pending") == 0
    assert value(samples, "tenure_health_sample_up") == 1
    sampled = {"tenure_runs_cancelling", "tenure_recovery_degraded_nodes", "tenure_health_sample_age_seconds"}
    assert sampled <= names(samples)
    # The same counts as the worker's own status line, and no ID in any label.
    assert "stopped: claimed 9, completed 5, failed 2, retried 2" in out
    assert labels_hold_none_of(samples, ids)


# --- a live `tenure runs worker` process -------------------------------------------------------


def hop_tasks_of(samples: dict[Any, float]) -> list[Any]:
    """The per-queue job gauges of the tasks table (where QueueBroker's hops live)."""
    return [labels for name, labels in samples if name == "tenure_queue_jobs" and ("table", "tenure_tasks") in labels]


async def test_a_runs_worker_process_serves_hop_outcomes_consent_waits_and_recovery_counts(
    db_url: str, tmp_path: pathlib.Path,
) -> None:
    flows = load(tmp_path, "metric_flows", FLOWS)
    process, port = await asyncio.to_thread(started, [
        *CLI, "runs", "worker", "--db", db_url, "--broker", "queue", "--workflows", "metric_flows:registry",
        "--node", "node-m", "--relay-seconds", "0.2", "--node-lease-seconds", "10", "--metrics-port", "0",
        "--metrics-sample-seconds", "0.2"], tmp_path)
    try:
        async with RunLedger(db_url) as ledger:
            pin = flows.registry.pin("hello", "1")
            run_ids = [(await ledger.admit(RunIntent(None, "test", "operator", frozenset(), {}), workflow=pin,
                                           queue="runs", priority=50)).run.run_id for _ in range(2)]
            for run_id, verdict in zip(run_ids, (ConsentStatus.GRANTED, ConsentStatus.DENIED), strict=True):
                async def parked(run_id: str = run_id) -> Any:
                    run = await ledger.get(run_id)
                    return run if run is not None and run.status is RunStatus.AWAITING_CONSENT else None

                run = await until(parked, 60, what="the Run parked on its consent")
                assert run.owner_kind is WaitKind.CONSENT
                assert await ledger.consents.decide(run.owner_id, verdict, decided_by="bob")
            # The worker's relays resume both; one ends DONE, the other FAILED (consent denied).

            async def ended() -> bool:
                runs = [await ledger.get(run_id) for run_id in run_ids]
                return [run.status for run in runs if run is not None] == [RunStatus.DONE, RunStatus.FAILED]

            await until(ended, 60, what="both Runs ended")

        def counted() -> dict[Any, float] | None:
            # The hop counters move as hops end; the per-queue gauges only with the next
            # health sample (every 0.2 s, later on a loaded machine): wait for a sample
            # that saw QueueBroker's hop tasks, not merely for the first sample.
            samples = scrape(port)
            hops = [value(samples, "tenure_run_hops_total", queue="runs", workflow="hello", outcome=outcome)
                    for outcome in ("parked", "done", "failed")]
            sampled = value(samples, "tenure_health_sample_up") == 1 and hop_tasks_of(samples)
            return samples if hops == [2, 1, 1] and sampled else None

        samples = await until(lambda: asyncio.to_thread(counted), 60, what="the hops counted", interval_s=0.2)
    finally:
        out = await asyncio.to_thread(stopped, process, tmp_path)
    hello = {"queue": "runs", "workflow": "hello"}
    assert value(samples, "tenure_run_hop_seconds_count", **hello, outcome="done") == 1
    assert value(samples, "tenure_run_hop_seconds_count", **hello, outcome="parked") == 2
    assert value(samples, "tenure_run_consent_wait_seconds_count", **hello, verdict="granted") == 1
    assert value(samples, "tenure_run_consent_wait_seconds_count", **hello, verdict="denied") == 1
    assert value(samples, "tenure_run_consent_wait_seconds_bucket", **hello, verdict="granted", le="+Inf") == 1
    assert value(samples, "tenure_recovery_passes_total", **{"pass": "startup"}) == 1
    assert (value(samples, "tenure_recovery_passes_total", **{"pass": "relay"}) or 0) >= 1
    # Both admissions were published by a recovery pass: a relay round, or the startup
    # reconciliation when an admission landed before it ran (on a loaded machine it can).
    published = [value(samples, "tenure_recovery_writes_total", **{"pass": kind, "kind": "published"}) or 0
                 for kind in ("startup", "relay")]
    assert sum(published) >= 2, published
    assert value(samples, "tenure_runs_cancelling") == 0
    assert value(samples, "tenure_recovery_degraded_nodes") == 0
    assert hop_tasks_of(samples)  # QueueBroker's hop tasks live in tenure_tasks
    assert labels_hold_none_of(samples, run_ids)
    assert "done 1" in out and "failed 1" in out and "parked 2" in out


# --- in process: the Worker's observer ---------------------------------------------------------


COUNTERS = {"claimed": "tenure_jobs_claimed_total", "completed": "tenure_jobs_completed_total",
            "failed": "tenure_jobs_failed_total", "retried": "tenure_jobs_retried_total",
            "cancels_acknowledged": "tenure_jobs_cancels_acknowledged_total",
            "stale_writes_refused": "tenure_jobs_stale_writes_refused_total",
            "lease_losses": "tenure_jobs_lease_losses_total", "released": "tenure_jobs_released_total"}


def counted(instruments: Instruments, queue: str = "validation", task: str = "") -> dict[str, float]:
    assert instruments.registry is not None
    return {field: instruments.registry.get_sample_value(name, {"queue": queue, "task": task}) or 0
            for field, name in COUNTERS.items()}


def stats_of(worker: Worker) -> dict[str, float]:
    return {field: getattr(worker.stats, field) for field in COUNTERS}


def config(db_url: str, **settings: Any) -> WorkerConfig:
    return WorkerConfig(db_url, **{"lease_seconds": 5, "heartbeat_seconds": 1, "backoff_base_ms": 0, **settings})


async def submit(source: ValidationJobSource, count: int, **fields: Any) -> list[str]:
    prefix = uuid.uuid4().hex[:8]
    return [await source.submit_owned(ValidationJob("orders", "1", f"{prefix}-{n}.jsonl", **fields),
                                      submission_id=f"{prefix}-{n}") for n in range(count)]


async def test_the_worker_counters_match_its_stats_and_the_histograms_count_every_job(db_url: str) -> None:
    instruments = Instruments()
    async with ValidationJobSource(db_url, config(db_url)) as source:
        await submit(source, 12, max_attempts=2)

        async def handler(claimed: Any, context: JobContext) -> dict[str, Any]:
            if int(claimed.job.data_source.split("-")[1].split(".")[0]) % 3 == 0:
                raise ValueError("odd row")
            return {}

        worker = Worker(source, handler, concurrency=4, metrics=instruments)
        await worker.run_until_idle()
    assert stats_of(worker) == counted(instruments)
    assert (worker.stats.claimed, worker.stats.completed, worker.stats.retried, worker.stats.failed) == (16, 8, 4, 4)
    registry = instruments.registry
    assert registry is not None
    labels = {"queue": "validation", "task": ""}
    assert registry.get_sample_value("tenure_jobs_queue_wait_seconds_count", labels) == 16
    assert registry.get_sample_value("tenure_jobs_handler_seconds_count", {**labels, "outcome": "complete"}) == 8
    assert registry.get_sample_value("tenure_jobs_handler_seconds_count", {**labels, "outcome": "fail"}) == 8


async def test_stale_writes_lease_losses_and_releases_are_counted_as_the_stats_count_them(db_url: str) -> None:
    instruments = Instruments()
    # An hour's lease (heartbeats every 0.2 s, so the lost lease below is seen at once): no
    # claim here may lapse on its own, since a lapse on a loaded machine would be one more
    # lease loss and one fewer stale write or release. The lost lease is the database's
    # answer, and the claim it leaves is made claimable by moving its lease back.
    async with ValidationJobSource(db_url, config(db_url, lease_seconds=3600, heartbeat_seconds=0.2)) as source:
        # A write after an operator cancelled the job: refused, counted stale.
        await submit(source, 1)

        async def cancelled_under_it(claimed: Any, context: JobContext) -> dict[str, Any]:
            assert await source.cancel(claimed.job_id)
            return {}

        first = Worker(source, cancelled_under_it, metrics=instruments)
        await first.run_until_idle()
        # A lease lost (the database answers every heartbeat: not yours any more).
        [lost] = await submit(source, 1)
        original = source.heartbeat_many_owned

        async def never_renewed(fences: Any) -> list[bool]:
            return [False for _ in fences]

        async def waits(claimed: Any, context: JobContext) -> None:
            await asyncio.sleep(30)

        source.heartbeat_many_owned = never_renewed  # type: ignore[method-assign]
        second = Worker(source, waits, metrics=instruments)
        await second.run_until_idle()
        source.heartbeat_many_owned = original  # type: ignore[method-assign]
        # A claim given back at shutdown (the lost claim's lease ran out: claimable again).
        expire_lease(db_url, QueueKind.VALIDATION, lost)
        began = asyncio.Event()

        async def stopped_midway(claimed: Any, context: JobContext) -> None:
            began.set()
            await asyncio.sleep(30)

        stop = asyncio.Event()
        third = Worker(source, stopped_midway, shutdown_grace_s=0, metrics=instruments)
        running = asyncio.create_task(third.run(stop))
        await asyncio.wait_for(began.wait(), 30)
        stop.set()
        await running
    together = {field: stats_of(first)[field] + stats_of(second)[field] + stats_of(third)[field] for field in COUNTERS}
    assert together == counted(instruments)
    assert (together["stale_writes_refused"], together["lease_losses"], together["released"]) == (1, 1, 1)
    registry = instruments.registry
    assert registry is not None
    assert registry.get_sample_value("tenure_jobs_handler_seconds_count",
                                     {"queue": "validation", "task": "", "outcome": "cancelled"}) == 2


async def test_a_task_is_labelled_by_queue_and_task_and_waits_from_its_due_time_on_the_database_clock(
    db_url: str,
) -> None:
    instruments = Instruments()
    async with TaskApp(db_url) as app:
        @app.task(queue="reports", name="render")
        async def render(ctx: Any) -> dict[str, Any]:
            return {}

        await render.defer()
        await asyncio.sleep(0.5)  # due now, claimed half a second later at the earliest
        await app.worker(metrics=instruments).run_until_idle()
    registry = instruments.registry
    assert registry is not None
    labels = {"queue": "reports", "task": "render"}
    assert registry.get_sample_value("tenure_jobs_claimed_total", labels) == 1
    assert registry.get_sample_value("tenure_jobs_completed_total", labels) == 1
    waited = registry.get_sample_value("tenure_jobs_queue_wait_seconds_sum", labels)
    assert waited is not None and 0.4 <= waited < 60


async def test_spans_nest_the_handler_under_its_job_and_the_handler_sees_its_own_span(db_url: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    instruments = Instruments(metrics=False, tracing=True, tracer=tracer)
    seen: dict[str, Any] = {}
    async with ValidationJobSource(db_url, config(db_url)) as source:
        ok, broken = await submit(source, 2, max_attempts=1)

        async def handler(claimed: Any, context: JobContext) -> dict[str, Any]:
            seen[claimed.job_id] = trace.get_current_span().get_span_context()
            with tracer.start_as_current_span("inside"):
                pass
            if claimed.job_id == broken:
                raise ValueError("broken")
            return {}

        await Worker(source, handler, metrics=instruments).run_until_idle()
    spans = exporter.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    assert {name: len(found) for name, found in by_name.items() if name != "tenure.claim"} == {
        "tenure.job": 2, "tenure.handler": 2, "tenure.settle": 2, "inside": 2}
    assert sum(span.attributes["tenure.claimed"] for span in by_name["tenure.claim"]) == 2
    jobs = {span.attributes["tenure.job_id"]: span for span in by_name["tenure.job"]}
    assert set(jobs) == {ok, broken}
    for job_id, job in jobs.items():
        handler_span = next(span for span in by_name["tenure.handler"] if span.parent.span_id == job.context.span_id)
        settle = next(span for span in by_name["tenure.settle"] if span.parent.span_id == job.context.span_id)
        inside = next(span for span in by_name["inside"] if span.parent.span_id == handler_span.context.span_id)
        assert seen[job_id] == handler_span.context and inside.context.trace_id == job.context.trace_id
        failed = job_id == broken
        assert settle.attributes["tenure.result"] == ("failed" if failed else "completed")
        assert handler_span.attributes["tenure.outcome"] == ("fail" if failed else "complete")
        assert (handler_span.status.status_code is trace.StatusCode.ERROR) == failed
        assert [event.name for event in handler_span.events] == (["exception"] if failed else [])
        assert job.attributes["tenure.queue"] == "validation" and job.attributes["tenure.attempt"] == 1


async def test_a_ledger_with_an_observer_counts_each_new_admission_once(db_url: str) -> None:
    instruments = Instruments()
    pin = WorkflowPin("review", "rev-1", "sha256:" + "a" * 64)
    async with RunLedger(db_url) as ledger:
        ledger.metrics = instruments
        intent = RunIntent(None, "test", "operator", frozenset(), {"n": 1})
        for _ in range(2):  # the second is a replay of the first: not a new Run
            await ledger.admit(intent, workflow=pin, queue="agents", priority=50, idempotency_key="k-1")
        await ledger.admit(intent, workflow=pin, queue="agents", priority=50)
    assert instruments.registry is not None
    assert instruments.registry.get_sample_value("tenure_runs_admitted_total",
                                                 {"queue": "agents", "workflow": "review"}) == 2


async def test_a_run_worker_counts_its_hops_and_consent_waits_and_the_workflow_runs_in_its_hop_span(
    db_url: str,
) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instruments = Instruments(tracing=True, tracer=provider.get_tracer("test"))
    current: list[Any] = []
    flows = Workflows()

    @flows.workflow("review", "1")
    async def review(ctx: Any) -> None:
        current.append(trace.get_current_span().get_span_context())
        if not ctx.resumed:
            await ctx.request_consent(tool_name="mail", tool_call_id="call-1", payload={}, state={})

    async with RunLedger(db_url) as ledger:
        ledger.metrics = instruments
        run_id = (await ledger.admit(RunIntent(None, "test", "operator", frozenset(), {}),
                                     workflow=flows.pin("review", "1"), queue="reviews", priority=50)).run.run_id
        runner = RunWorker(ledger, InMemoryBroker(), flows, node="node-a", queues=["reviews"], metrics=instruments)
        assert await runner.perform(run_id, 0) == "parked"
        assert await runner.perform(run_id, 0) == "skipped"  # a duplicate delivery claims nothing
        run = await ledger.get(run_id)
        assert run is not None and run.owner_id is not None
        assert await ledger.consents.decide(run.owner_id, ConsentStatus.GRANTED, decided_by="bob")
        assert await ledger.resume(run_id, owner_id=run.owner_id) == 1
        assert await runner.perform(run_id, 1) == "done"
    registry = instruments.registry
    assert registry is not None
    labels = {"queue": "reviews", "workflow": "review"}
    assert registry.get_sample_value("tenure_runs_admitted_total", labels) == 1
    assert {outcome: registry.get_sample_value("tenure_run_hops_total", {**labels, "outcome": outcome})
            for outcome in ("parked", "done")} == {"parked": 1, "done": 1}
    assert registry.get_sample_value("tenure_run_hops_total", {"queue": "", "workflow": "", "outcome": "skipped"}) == 1
    assert registry.get_sample_value("tenure_run_hop_seconds_count", {**labels, "outcome": "done"}) == 1
    assert registry.get_sample_value("tenure_run_consent_wait_seconds_count", {**labels, "verdict": "granted"}) == 1
    hops = [span for span in exporter.get_finished_spans() if span.name == "tenure.hop"]
    assert [(span.attributes["tenure.seq"], span.attributes["tenure.outcome"]) for span in hops] == [
        (0, "parked"), (0, "skipped"), (1, "done")]
    assert current == [hops[0].context, hops[2].context]  # each workflow ran inside its own hop's span
    assert all(span.attributes["tenure.run_id"] == run_id for span in hops)
    assert trace.get_current_span().get_span_context().is_valid is False  # nothing left attached


def test_recovery_reports_add_their_counts_and_issues_by_pass() -> None:
    instruments = Instruments()
    counts = dict.fromkeys(COUNT_NAMES, 0) | {"published": 3, "resumed": 1}
    instruments.recovery_report("relay", RecoveryReport(False, counts, ()))
    instruments.recovery_report("relay", RecoveryReport(True, counts, (RecoveryIssue("r-1", "port_failed"),)))
    registry = instruments.registry
    assert registry is not None
    assert registry.get_sample_value("tenure_recovery_passes_total", {"pass": "relay"}) == 2
    assert registry.get_sample_value("tenure_recovery_degraded_passes_total", {"pass": "relay"}) == 1
    assert registry.get_sample_value("tenure_recovery_writes_total", {"pass": "relay", "kind": "published"}) == 6
    assert registry.get_sample_value("tenure_recovery_writes_total", {"pass": "relay", "kind": "rotated"}) is None
    assert registry.get_sample_value("tenure_recovery_issues_total", {"pass": "relay", "reason": "port_failed"}) == 1


def test_label_values_past_the_bound_are_counted_together() -> None:
    instruments = Instruments()
    for n in range(MAX_LABEL_VALUES + 10):
        instruments.run_labels("runs", f"workflow_{n}")
    assert instruments.run_labels("runs", "workflow_0") == ("runs", "workflow_0")
    assert instruments.run_labels("runs", f"workflow_{MAX_LABEL_VALUES + 5}") == ("runs", OTHER_LABEL)


def test_two_instruments_in_one_process_keep_their_own_registries() -> None:
    first, second = Instruments(), Instruments()
    assert first.registry is not second.registry
    shared = CollectorRegistry()
    assert Instruments(registry=shared).registry is shared


def test_an_observer_without_the_hooks_is_refused(tmp_path: pathlib.Path) -> None:
    source = ValidationJobSource(f"sqlite:///{tmp_path}/q.db", WorkerConfig(f"sqlite:///{tmp_path}/q.db"))

    async def handler(claimed: Any, context: JobContext) -> None:
        return None

    with pytest.raises(ConfigValidationError) as refused:
        Worker(source, handler, metrics=object())  # type: ignore[arg-type]
    assert refused.value.fields == ("metrics",)


# --- disabled: nothing imported -------------------------------------------------------------------

NEVER_IMPORTED = '''
import asyncio, sys
from tenure.adapters import TaskApp, upgrade

async def main(url):
    await upgrade(url)
    async with TaskApp(url) as app:
        @app.task(queue="q", name="t")
        async def t(ctx):
            return {}

        await t.defer()
        stats = await app.worker().run_until_idle()
    assert stats.completed == 1, stats

asyncio.run(main(sys.argv[1]))
# The command line names the metrics flags without importing the libraries behind them.
from tenure.apps import cli
cli._parser().parse_args(["worker", "--app", "a:b"])
cli._parser().parse_args(["runs", "worker", "--db", "sqlite:///x.db", "--broker", "queue", "--workflows", "a:b"])
print(sorted(name for name in sys.modules if name.split(".")[0] in ("prometheus_client", "opentelemetry")))
'''


def test_a_process_that_never_asks_for_metrics_never_imports_their_libraries(tmp_path: pathlib.Path) -> None:
    done = subprocess.run([sys.executable, "-P", "-c", NEVER_IMPORTED, f"sqlite:///{tmp_path}/q.db"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


# --- refusals ---------------------------------------------------------------------------------------


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        yield int(listening.getsockname()[1])


WORKER = ["worker", "--queue", "validation", "--handler", "asyncio:sleep"]
PORT_RANGE = "  --metrics-port: integer_out_of_range (--metrics-port takes 0 to 65,535; 0: a free port)"


@pytest.mark.parametrize(("flags", "line"), [
    (["--metrics-port", "70000"], PORT_RANGE),
    (["--metrics-port", "-1"], PORT_RANGE),
    (["--metrics-port", "0", "--metrics-sample-seconds", "nan"],
     "  --metrics-sample-seconds: number_out_of_range (--metrics-sample-seconds takes 0 to 3,600 seconds; "
     "0: no sampling)"),
    (["--metrics-port", "BUSY"],
     "  --metrics-port: port_in_use (another process serves that port: pick another, or 0)"),
    (["--metrics-port", "0", "--metrics-host", "192.0.2.1"],
     "  --metrics-host: address_not_local (--metrics-host takes an address of this machine)"),
])
def test_a_bad_metrics_flag_is_refused_naming_it_before_the_worker_starts(
    flags: list[str], line: str, busy_port: int, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"sqlite:///{tmp_path}/q.db"
    flags = [str(busy_port) if flag == "BUSY" else flag for flag in flags]
    assert main([*WORKER, "--db", url, *flags]) == 2
    assert capsys.readouterr().out.splitlines() == ["refused: invalid_arguments", line,
                                                    "  `tenure COMMAND --help` lists what each option takes"]
    assert not (tmp_path / "q.db").exists()


MISSING = '''
import sys
sys.modules[sys.argv[1]] = None  # as if the extra were not installed
from tenure.apps.cli import main
sys.exit(main(sys.argv[2:]))
'''


@pytest.mark.parametrize("database", ["sqlite"])
@pytest.mark.parametrize(("library", "flag", "line"), [
    ("prometheus_client", "--metrics-port",
     "  --metrics-port: metrics_not_installed (install the metrics extra: pip install 'tenure[metrics]')"),
    ("opentelemetry", "--tracing",
     "  --tracing: tracing_not_installed (install the tracing extra: pip install 'tenure[tracing]')"),
])
@pytest.mark.parametrize("command", ["worker", "runs worker"])
def test_a_metrics_or_tracing_flag_without_its_extra_is_refused_with_the_install_line(
    library: str, flag: str, line: str, command: str, db_url: str, tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "flows.py").write_text(FLOWS, encoding="utf-8")
    if command == "worker":
        arguments = [*WORKER, "--db", db_url]
    else:
        arguments = ["runs", "worker", "--db", db_url, "--broker", "queue", "--workflows", "flows:registry"]
    arguments += [flag, "0"] if flag == "--metrics-port" else [flag]
    done = subprocess.run([sys.executable, "-P", "-c", MISSING, library, *arguments], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["refused: invalid_arguments", line,
                                        "  `tenure COMMAND --help` lists what each option takes"]
