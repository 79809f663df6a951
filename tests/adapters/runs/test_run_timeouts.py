"""Durable workflow timeouts (issue 50, item 5): a Run admitted with ``timeout_s`` has a
deadline on the database clock (its admission time plus the timeout, stored with it);
once it passed, the relays (or startup reconciliation) time the Run out and finish the
cancellation with proven containment exactly as an operator's cancel does, and the Run
ends CANCELLED with the reason ``timeout``. Nothing happens before the deadline, to a
Run without one, or to a Run that finished first. Every test runs on SQLite and
PostgreSQL.

No test asserts a duration: a deadline is waited for by polling the database clock with
a generous hang guard, and every outcome is asserted only after it happened. A Run's
steps before its deadline (claim, consent, park) are the ledger's own calls, which no
deadline stops (only the relays act on it), so a slow machine changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from polling import until
from run_support import (  # noqa: F401 (ledger, runs, runs_db: fixtures)
    Runs, ledger, ports, raises, runs, runs_db, status_of,
)
from tenure.adapters import InMemoryBroker, RunLedger, RunRuntime, RunWorker, Workflows
from tenure.kernel.runs.machine import CANCELLED_BY
from tenure.model import (
    BrokerJobState,
    ConfigValidationError,
    ConsentStatus,
    ErrorCode,
    RunIntent,
    RunRecord,
    RunStatus,
    WaitKind,
    hop_key,
)

SHORT_S = 1.0
"""A deadline a test waits for (polling the database clock; never a timing)."""


@pytest.fixture
async def own_ledger(db_url: str) -> AsyncIterator[RunLedger]:
    """A ledger on a database of this test's own: the relays sweep every Run whose deadline
    passed, so a test that counts what they did shares its database with nobody."""
    async with RunLedger(db_url) as made:
        yield made


def own_runs(ledger: RunLedger, db_url: str) -> Runs:
    return Runs(ledger, db_url)


async def past_deadline(ledger: RunLedger, run_id: str) -> RunRecord:
    """The Run once the database clock reached its deadline (a hang guard, not a timing)."""
    run = await ledger.get(run_id)
    assert run is not None and run.deadline is not None
    deadline = run.deadline

    async def passed() -> bool:
        return await ledger.database_now() >= deadline

    await until(passed, what="the database clock to reach the deadline")
    return run


async def relay(ledger: RunLedger, broker: Any) -> Any:
    return await ledger.relay(ports(ledger, broker))


def timed_out(run: RunRecord | None) -> bool:
    return run is not None and run.status is RunStatus.CANCELLED and run.error == "timeout" and run.timed_out


# --- admission ---------------------------------------------------------------------------------


async def test_the_deadline_is_the_admission_time_on_the_database_clock_plus_the_timeout(runs: Runs) -> None:
    admission = await runs.admit("timed", timeout_s=90.5)
    run = admission.run
    assert run.deadline is not None and run.deadline - run.created_at == dt.timedelta(seconds=90.5)
    stored = await runs.ledger.get(run.run_id)
    assert stored is not None and stored.deadline == run.deadline and not stored.timed_out
    untimed = (await runs.admit("untimed")).run
    assert untimed.deadline is None


async def test_a_replay_with_the_same_timeout_answers_the_same_run_and_another_timeout_is_changed_work(
    runs: Runs,
) -> None:
    first = await runs.admit("replayed", timeout_s=30)
    again = await runs.admit("replayed", timeout_s=30.0)
    assert (again.created, again.run.run_id, again.run.deadline) == (False, first.run.run_id, first.run.deadline)
    for other in (31, 29.999999, None):
        error = await raises(ErrorCode.RUN_ADMISSION_CONFLICT, runs.admit("replayed", timeout_s=other))
        assert error.reason == "timeout_changed"
    await runs.admit("never-timed")
    error = await raises(ErrorCode.RUN_ADMISSION_CONFLICT, runs.admit("never-timed", timeout_s=30))
    assert error.reason == "timeout_changed"
    assert runs.runs_holding("replayed") == runs.runs_holding("never-timed") == 1


@pytest.mark.parametrize("bad", [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf, True, False, "30", 1e-9,
                                 366 * 86_400 + 1, 10**12, 10**400])
async def test_a_timeout_that_is_not_a_positive_number_of_seconds_up_to_366_days_is_refused_and_nothing_is_written(
    runs: Runs, bad: Any,
) -> None:
    with pytest.raises(ConfigValidationError) as refused:
        await runs.admit("bad", timeout_s=bad)
    assert "timeout_s" in str(refused.value)
    assert runs.runs_of_source() == 0


async def test_the_longest_timeout_is_accepted(runs: Runs) -> None:
    run = (await runs.admit("longest", timeout_s=366 * 86_400)).run
    assert run.deadline is not None and run.deadline - run.created_at == dt.timedelta(days=366)


# --- the relays ------------------------------------------------------------------------------


async def test_a_run_parked_on_a_consent_is_timed_out_by_a_relay_once_its_deadline_passed(
    own_ledger: RunLedger, db_url: str,
) -> None:
    runs = own_runs(own_ledger, db_url)
    run_id, consent_id = await runs.waiting_on_consent("parked", timeout_s=SHORT_S)
    await past_deadline(own_ledger, run_id)
    report = await relay(own_ledger, runs.broker)
    assert not report.degraded, report.issues
    assert (report.counts["timed_out"], report.counts["cancels_finished"]) == (1, 1)
    run = await own_ledger.get(run_id)
    assert timed_out(run)
    consent = await own_ledger.consents.get(consent_id)
    assert consent is not None and (consent.status, consent.decided_by) == (ConsentStatus.CANCELLED, CANCELLED_BY)
    # Terminal now: the next round finds nothing, and a late verdict resumes nothing.
    again = await relay(own_ledger, runs.broker)
    assert (again.counts["timed_out"], again.counts["cancels_finished"]) == (0, 0)
    assert await own_ledger.time_out(run_id) is None
    assert await own_ledger.resume(run_id, owner_id=consent_id) is None


async def test_a_deadline_not_yet_due_and_a_run_without_one_are_left_as_they_are(
    own_ledger: RunLedger, db_url: str,
) -> None:
    runs = own_runs(own_ledger, db_url)
    later, _ = await runs.waiting_on_consent("in-an-hour", timeout_s=3600)
    never, _ = await runs.waiting_on_consent("never")
    assert await own_ledger.time_out(later) is None and await own_ledger.time_out(never) is None
    assert (await relay(own_ledger, runs.broker)).counts["timed_out"] == 0
    report = await own_ledger.reconcile(ports(own_ledger, runs.broker), node="node-a",
                                        boot_cutoff=await own_ledger.database_now())
    assert report.counts["timed_out"] == 0
    for run_id in (later, never):
        run = await own_ledger.get(run_id)
        assert run is not None and (run.status, run.error) == (RunStatus.AWAITING_CONSENT, None)


async def test_a_run_finished_before_its_deadline_is_untouched(own_ledger: RunLedger, db_url: str) -> None:
    runs = own_runs(own_ledger, db_url)
    run_id = await runs.running("finished", timeout_s=SHORT_S)
    assert await own_ledger.settle(run_id, 0, RunStatus.DONE, result={"answer": 42})
    await past_deadline(own_ledger, run_id)
    assert (await relay(own_ledger, runs.broker)).counts["timed_out"] == 0
    assert await own_ledger.time_out(run_id) is None
    run = await own_ledger.get(run_id)
    assert run is not None and (run.status, run.error, run.result, run.timed_out) == (
        RunStatus.DONE, None, {"answer": 42}, False)


async def test_a_running_hop_whose_run_timed_out_is_fenced_and_its_late_settle_is_refused(
    own_ledger: RunLedger, db_url: str,
) -> None:
    runs = own_runs(own_ledger, db_url)
    run_id = await runs.published("running", timeout_s=SHORT_S)
    assert runs.broker.take("agents") == hop_key(run_id, 0)  # a broker worker runs the hop
    assert await own_ledger.claim(run_id, 0, node="node-a") is not None
    await past_deadline(own_ledger, run_id)
    report = await relay(own_ledger, runs.broker)
    assert (report.counts["timed_out"], report.counts["cancels_finished"]) == (1, 1), report.issues
    assert runs.broker.jobs[hop_key(run_id, 0)].state is BrokerJobState.ABORTED
    assert timed_out(await own_ledger.get(run_id))
    # The hop comes back after its Run was taken from it: nothing it says is recorded.
    assert await own_ledger.settle(run_id, 0, RunStatus.DONE, result={"late": True}) is False
    assert not await own_ledger.checkpoints.save(run_id, 0, state={"late": True})
    run = await own_ledger.get(run_id)
    assert timed_out(run) and run is not None and run.result is None


async def test_an_open_delegated_job_keeps_the_timed_out_run_cancelling_until_it_ends(
    own_ledger: RunLedger, db_url: str,
) -> None:
    runs = own_runs(own_ledger, db_url)
    run_id = await runs.running("delegating", timeout_s=SHORT_S)
    job_id = await runs.job(run_id)
    assert await own_ledger.park(run_id, 0, kind=WaitKind.DELEGATE, owner_id=job_id)
    await past_deadline(own_ledger, run_id)
    report = await relay(own_ledger, runs.broker)
    assert report.counts["timed_out"] == 1 and [issue.reason for issue in report.issues] == ["containment_unproven"]
    held = await own_ledger.get(run_id)
    assert held is not None and (held.status, held.error, held.timed_out) == (RunStatus.CANCELLING, "timeout", True)
    assert await own_ledger.jobs.record_cancelled(job_id)  # the runtime contained it
    report = await relay(own_ledger, runs.broker)
    assert (report.degraded, report.counts["timed_out"], report.counts["cancels_finished"]) == (False, 0, 1)
    assert timed_out(await own_ledger.get(run_id))


async def test_an_operators_cancel_keeps_its_own_reason_when_the_deadline_passes_before_it_finished(
    own_ledger: RunLedger, db_url: str,
) -> None:
    runs = own_runs(own_ledger, db_url)
    run_id, _ = await runs.waiting_on_consent("operator", timeout_s=SHORT_S)
    ticket = await own_ledger.begin_cancel(run_id)
    assert ticket is not None
    await past_deadline(own_ledger, run_id)
    report = await relay(own_ledger, runs.broker)  # the relay finishes it; the reason stays the operator's
    assert (report.counts["timed_out"], report.counts["cancels_finished"]) == (0, 1)
    run = await own_ledger.get(run_id)
    assert run is not None and (run.status, run.error, run.timed_out) == (RunStatus.CANCELLED, None, False)


async def test_a_retried_lost_run_keeps_its_timeout_counted_from_its_own_admission(runs: Runs) -> None:
    run_id = await runs.running("lost", timeout_s=120)
    assert await runs.ledger.settle(run_id, 0, RunStatus.FAILED, error="lost")
    retried = await runs.ledger.retry(run_id)
    assert retried is not None and retried.run.deadline is not None
    assert retried.run.deadline - retried.run.created_at == dt.timedelta(seconds=120)
    again = await runs.ledger.retry(run_id)
    assert again is not None and (again.created, again.run.run_id) == (False, retried.run.run_id)


# --- through the runtime: a workflow past its deadline, and a restart --------------------------


@contextlib.asynccontextmanager
async def runtime(ledger: RunLedger, broker: Any, flows: Workflows, node: str) -> AsyncIterator[RunRuntime]:
    runner = RunWorker(ledger, broker, flows, node=node, watch_interval_s=0.05)
    async with RunRuntime(ledger, brokers=[broker], workers=[runner], node=node, relay_interval_s=0.1,
                          node_lease_s=5, require_clean=False) as started:
        yield started


async def test_a_workflow_still_running_at_its_deadline_is_cancelled_by_the_relays(
    own_ledger: RunLedger,
) -> None:
    flows, broker = Workflows(), InMemoryBroker()
    seen: list[str] = []

    @flows.workflow("stuck", "1")
    async def stuck(ctx: Any) -> dict[str, Any]:
        seen.append("started")
        try:
            await asyncio.Event().wait()  # never set: only a cancellation ends it
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return {}

    async with runtime(own_ledger, broker, flows, "node-a"):
        admission = await own_ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}),
                                           workflow=flows.pin("stuck", "1"), queue="runs", priority=50,
                                           timeout_s=SHORT_S)
        run_id = admission.run.run_id
        await own_ledger.publish(run_id, 0, broker)
        run = await status_of(own_ledger, run_id, RunStatus.CANCELLED, RunStatus.DONE, RunStatus.FAILED)
        await until(lambda: seen in ([], ["started", "cancelled"]), what="the hop to end")
    assert timed_out(run)
    # The body never finished: it either never started (a slow start met the deadline
    # first) or it was cancelled.
    assert seen in ([], ["started", "cancelled"])


async def test_a_timeout_survives_a_restart_and_the_next_process_cancels_the_run(db_url: str) -> None:
    """The process that admitted and parked the Run (on a timer an hour away) stops before
    its deadline; a later process (new objects, nothing shared in memory) starts after
    the deadline passed and cancels it for its timeout."""
    flows = Workflows()
    async with RunLedger(db_url) as first:
        runs = own_runs(first, db_url)
        run_id = await runs.running("restarted", timeout_s=SHORT_S)
        assert await first.park_timer(run_id, 0, name="sleep:0", delay_s=3600)
    async with RunLedger(db_url) as second:
        await past_deadline(second, run_id)
        async with runtime(second, InMemoryBroker(), flows, "node-b"):
            run = await status_of(second, run_id, RunStatus.CANCELLED)
    assert timed_out(run) and run.owner_kind is WaitKind.TIMER


async def test_a_relay_round_reaches_every_due_run_across_pages(own_ledger: RunLedger, db_url: str) -> None:
    """A page of Runs that cannot finish (an open delegated job each) does not hide the
    Runs after it: the sweep's cursor goes forward and wraps."""
    runs = own_runs(own_ledger, db_url)
    stuck = []
    for number in range(2):
        run_id = await runs.running(f"stuck-{number}", timeout_s=SHORT_S)
        job_id = await runs.job(run_id)
        assert await own_ledger.park(run_id, 0, kind=WaitKind.DELEGATE, owner_id=job_id)
        stuck.append(run_id)
    free, _ = await runs.waiting_on_consent("free", timeout_s=SHORT_S)
    for run_id in (*stuck, free):
        await past_deadline(own_ledger, run_id)
    cursor = None
    for _ in range(3):  # pages of one: every Run is met within three rounds
        report = await own_ledger.relay(ports(own_ledger, runs.broker), cursor=cursor, page_size=1)
        cursor = report.cursor
    assert timed_out(await own_ledger.get(free))
    for run_id in stuck:
        run = await own_ledger.get(run_id)
        assert run is not None and (run.status, run.error) == (RunStatus.CANCELLING, "timeout")


@pytest.mark.parametrize("database", ["sqlite"])
async def test_tenure_runs_show_prints_the_deadline_and_the_timeout_reason(own_ledger: RunLedger, db_url: str) -> None:
    runs = own_runs(own_ledger, db_url)
    run_id, _ = await runs.waiting_on_consent("shown", timeout_s=SHORT_S)
    await past_deadline(own_ledger, run_id)
    await relay(own_ledger, runs.broker)
    shown = await asyncio.to_thread(subprocess.run, [sys.executable, "-P", "-m", "tenure.apps.cli", "runs", "show",
                                                     "--db", db_url, run_id],
                                    capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr
    lines = {line.split()[0]: line for line in shown.stdout.splitlines() if line.split()}
    assert "cancelled" in lines["status"] and "timeout" in lines["error"] and "deadline" in lines
