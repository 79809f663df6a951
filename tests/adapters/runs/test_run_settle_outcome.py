"""A hop's outcome and its settlement in one transaction (issue 49, item 3): the worker's
finished hop sends one settle carrying its outcome. Applied, the Run settles, its
checkpoint is deleted and its pending consents are swept; refused because an effect is
not contained, the outcome is recorded in the checkpoint row in that same transaction
(recovery's ``settle_recorded`` settles the Run with it once contained); refused because
the hop no longer holds the Run, nothing is written. A retried settle whose COMMIT
applied unacknowledged finds its own result. After a database failure the worker records
the outcome in a transaction of its own before it retries the settle (the retry path), so
a process that dies then still leaves the hop's answer for recovery; one that dies before
any write committed is an orphan recovery treats as its table says. Every test runs on
SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from polling import until
from run_support import ports, succeeded, unique
from statements import count_statements

from tenure.adapters import InMemoryBroker, RunLedger, RunWorker, Workflows
from tenure.adapters.runs.checkpoints import RecordedOutcome
from tenure.adapters.runs.engine import RunEngine
from tenure.model import ConfigValidationError, ConsentStatus, ErrorCode, RunIntent, RunStatus, TenureError

flows = Workflows()
JOBS: dict[str, str] = {}
"""The delegated job each Run's ``leaves_a_job`` hop submitted, by Run ID."""
CONSENTS: dict[str, str] = {}
"""The consent each Run's ``leaves_a_checkpoint_and_a_consent`` hop left pending, by Run ID."""


@flows.workflow("answer", "1")
async def answer(ctx: Any) -> dict[str, Any]:
    return {"answer": 7}


@flows.workflow("leaves_a_job", "1")
async def leaves_a_job(ctx: Any) -> dict[str, Any]:
    # The hop submits a delegated job and returns without waiting for it: an effect the
    # settle cannot prove contained.
    job = await ctx._ledger.jobs.submit(ctx.run_id, request_id=unique("request"), runtime="sandbox",
                                       profile="small", request={})
    JOBS[ctx.run_id] = job.job_id
    return {"answer": 7}


@flows.workflow("leaves_a_checkpoint_and_a_consent", "1")
async def leaves_a_checkpoint_and_a_consent(ctx: Any) -> dict[str, Any]:
    await ctx.save({"step": 1})
    consent = await ctx._ledger.consents.create(ctx.run_id, tool_name="mail.send", tool_call_id=unique("call"),
                                                payload={})
    CONSENTS[ctx.run_id] = consent.consent_id
    return {"answer": 7}


@flows.workflow("cancels_itself", "1")
async def cancels_itself(ctx: Any) -> dict[str, Any]:
    await ctx._ledger.begin_cancel(ctx.run_id)  # an operator's cancel, while the hop runs
    return {"answer": 7}


@pytest.fixture
async def ledger(db_url: str) -> AsyncIterator[RunLedger]:
    async with RunLedger(db_url) as made:
        yield made


def runner(ledger: RunLedger) -> RunWorker:
    # A long watch interval: every workflow here ends before any watch re-reads the Run.
    return RunWorker(ledger, InMemoryBroker(), flows, node="node-a", concurrency=1, watch_interval_s=60)


async def published(ledger: RunLedger, worker: RunWorker, name: str) -> str:
    admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=flows.pin(name, "1"),
                                   queue="runs", priority=50)
    run_id = admission.run.run_id
    assert await ledger.publish(run_id, 0, worker.broker)
    return run_id


async def reconcile(ledger: RunLedger, worker: RunWorker) -> Any:
    return await ledger.reconcile(ports(ledger, worker.broker), node="node-a", boot_cutoff=await ledger.database_now())


async def _transaction_path(*_: Any) -> None:
    return None  # the decided-ahead settle (PostgreSQL) is not tried: see test_run_ahead.py


def transactions(texts: list[str]) -> int:
    return sum(1 for text in texts if text.strip().upper().startswith("BEGIN"))


async def test_a_finished_hop_settles_with_its_outcome_in_one_transaction(ledger: RunLedger) -> None:
    worker = runner(ledger)
    await worker.perform(await published(ledger, worker, "answer"), 0)  # warm: statements prepared
    run_id = await published(ledger, worker, "answer")
    with count_statements() as counted:
        assert await worker.perform(run_id, 0) == "done"
    # The claim's transaction and the settle's: no transaction of its own for the outcome.
    assert transactions(counted.texts) <= 2, counted.profile()
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.result) == (RunStatus.DONE, {"answer": 7})


async def test_a_settled_hop_deletes_its_checkpoint_and_sweeps_its_pending_consents(ledger: RunLedger) -> None:
    worker = runner(ledger)
    run_id = await published(ledger, worker, "leaves_a_checkpoint_and_a_consent")
    assert await worker.perform(run_id, 0) == "done"
    assert await ledger.checkpoints.load(run_id) is None
    consent = await ledger.consents.get(CONSENTS[run_id])
    assert consent is not None and consent.status is ConsentStatus.CANCELLED


async def test_a_hop_refused_for_an_open_job_records_its_outcome_and_recovery_settles_the_run_with_it(
    ledger: RunLedger,
) -> None:
    worker = runner(ledger)
    run_id = await published(ledger, worker, "leaves_a_job")
    assert await worker.perform(run_id, 0) == "unsettled"
    run = await ledger.get(run_id)
    assert run is not None and run.status is RunStatus.RUNNING
    assert await ledger.checkpoints.outcome(run_id) == RecordedOutcome(0, RunStatus.DONE, '{"answer":7}', None)
    assert await ledger.jobs.adopt_result(JOBS[run_id], succeeded(JOBS[run_id]))  # contained now
    # The process that ran the hop is gone; the next start of its node settles the Run.
    report = await reconcile(ledger, worker)
    assert (report.counts["outcomes_settled"], report.counts["orphans_failed"]) == (1, 0)
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.result) == (RunStatus.DONE, {"answer": 7})
    assert await ledger.checkpoints.load(run_id) is None


async def test_a_live_worker_settles_its_unsettled_hop_again_once_the_job_ended(ledger: RunLedger) -> None:
    """No reboot needed: the worker keeps the hop it left ``unsettled`` and settles it
    again (without recovery's ports: the settle alone, which applies once the job ended
    by itself); a Run that moved on is forgotten."""
    worker = runner(ledger)
    run_id = await published(ledger, worker, "leaves_a_job")
    assert await worker.perform(run_id, 0) == "unsettled"
    assert worker.unsettled == 1
    assert await worker.settle_unsettled(due_only=False) == 0  # the job is still open
    assert worker.unsettled == 1 and await worker.settle_unsettled() == 0  # not due again yet
    assert await ledger.jobs.adopt_result(JOBS[run_id], succeeded(JOBS[run_id]))
    assert await worker.settle_unsettled(due_only=False) == 1 and worker.unsettled == 0
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.result) == (RunStatus.DONE, {"answer": 7})
    # One that moved on meanwhile (an operator's cancel) is forgotten, not settled.
    other = await published(ledger, worker, "leaves_a_job")
    assert await worker.perform(other, 0) == "unsettled"
    assert await ledger.begin_cancel(other) is not None
    assert await worker.settle_unsettled(due_only=False) == 0 and worker.unsettled == 0
    run = await ledger.get(other)
    assert run is not None and run.status is RunStatus.CANCELLING


async def test_recovering_an_ended_hop_never_fences_a_hop_claimed_after_it(ledger: RunLedger) -> None:
    """``recover_ended_hop``'s cutoff lies one microsecond after the ended hop's claim: a
    hop of the Run claimed later (here: the live hop, named with an instant just before
    its claim) is not this node's orphan and is left alone; named with its own claim
    instant, it is (fenced, then failed ``lost`` as its workflow declares)."""
    worker = runner(ledger)
    run_id = await published(ledger, worker, "answer")
    claim = await ledger.claim(run_id, 0, node="node-a")
    assert claim is not None
    recovery = ports(ledger, worker.broker)
    before = claim.run.updated_at - dt.timedelta(microseconds=1)
    report = await ledger.recover_ended_hop(recovery, run_id, node="node-a", claimed_at=before)
    assert not report.degraded and not any(report.counts.values())
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.enqueue_seq) == (RunStatus.RUNNING, 0)
    report = await ledger.recover_ended_hop(recovery, run_id, node="node-a", claimed_at=claim.run.updated_at)
    assert report.counts["orphans_failed"] == 1
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.error) == (RunStatus.FAILED, "lost")
    with pytest.raises(ConfigValidationError):
        await ledger.recover_ended_hop(recovery, run_id, node="node-a", claimed_at=dt.datetime(2026, 1, 1))  # naive


async def test_a_hop_that_no_longer_holds_its_run_writes_no_outcome(ledger: RunLedger) -> None:
    worker = runner(ledger)
    run_id = await published(ledger, worker, "cancels_itself")
    assert await worker.perform(run_id, 0) == "cancelled"
    run = await ledger.get(run_id)
    assert run is not None and run.status is RunStatus.CANCELLING
    assert await ledger.checkpoints.load(run_id) is None  # no outcome row written for a hop that lost its Run


async def test_a_settle_of_a_hop_that_lost_its_run_with_an_open_job_records_nothing(ledger: RunLedger) -> None:
    """The kernel refuses a hop that no longer holds its Run (here: cancelling) before it
    looks at containment, so the outcome is recorded only for a hop that holds it."""
    worker = runner(ledger)
    run_id = await published(ledger, worker, "answer")
    assert await ledger.claim(run_id, 0, node="node-a") is not None
    await ledger.jobs.submit(run_id, request_id=unique("request"), runtime="sandbox", profile="small", request={})
    await ledger.begin_cancel(run_id)
    assert not await ledger.engine.settle(run_id, RecordedOutcome(0, RunStatus.DONE, None, None), record=True)
    assert await ledger.checkpoints.load(run_id) is None


@pytest.mark.parametrize("name", ["answer", "leaves_a_job"])
async def test_a_settle_retried_after_its_commit_applied_unacknowledged_finds_its_own_result(
    ledger: RunLedger, name: str,
) -> None:
    worker = runner(ledger)
    settle, calls = ledger.engine.settle, []

    async def unacknowledged(*args: Any, **kwargs: Any) -> bool:
        calls.append(1)
        answer = settle(*args, **kwargs)
        if len(calls) == 1:
            with pytest.raises(TenureError) if name == "leaves_a_job" else contextlib.nullcontext():
                await answer
            raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, "commit_unacknowledged")
        return await answer

    ledger.engine.settle = unacknowledged  # type: ignore[method-assign]
    run_id = await published(ledger, worker, name)
    expected = "unsettled" if name == "leaves_a_job" else "done"
    assert await worker.perform(run_id, 0) == expected
    # The retry path records the outcome on its own first: refused for the settled Run
    # (no hop holds it: the worker reads its own result, no second settle), written for
    # the one still running (then the settle is retried, and refused again).
    assert len(calls) == (2 if name == "leaves_a_job" else 1) and worker.persist_retries == 1
    run = await ledger.get(run_id)
    assert run is not None and run.status is (RunStatus.RUNNING if name == "leaves_a_job" else RunStatus.DONE)
    if name == "leaves_a_job":
        assert await ledger.checkpoints.outcome(run_id) == RecordedOutcome(0, RunStatus.DONE, '{"answer":7}', None)


async def test_a_hop_whose_settle_fails_records_its_outcome_on_its_own_and_recovery_settles_with_it(
    ledger: RunLedger,
) -> None:
    """The retry path: the one-transaction settle met a database failure, so the worker
    records the outcome in a transaction of its own before it retries the settle. The
    process dies while the settle still fails: the next start settles the Run with the
    hop's answer, never fails it ``lost``."""
    worker = runner(ledger)
    tries: list[int] = []

    async def unreachable(*args: Any, **kwargs: Any) -> bool:
        tries.append(1)
        raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, "connection_refused")

    ledger.engine.settle = unreachable  # type: ignore[method-assign]
    run_id = await published(ledger, worker, "answer")
    hop = asyncio.ensure_future(worker.perform(run_id, 0))
    await until(lambda: len(tries) >= 2, what="the settle to be retried")
    hop.cancel()  # the process dies here: no settle ever committed
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(hop, 60)
    del ledger.engine.settle
    assert await ledger.checkpoints.outcome(run_id) == RecordedOutcome(0, RunStatus.DONE, '{"answer":7}', None)
    report = await reconcile(ledger, worker)
    assert (report.counts["outcomes_settled"], report.counts["orphans_failed"]) == (1, 0)
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.result) == (RunStatus.DONE, {"answer": 7})


async def test_a_hop_that_dies_before_any_outcome_write_commits_is_an_orphan_recovery_fails_lost(
    ledger: RunLedger,
) -> None:
    """With the database away for the settle and the outcome's own record alike, nothing
    of the hop's answer is durable when the process dies: an orphan, failed ``lost``."""
    worker = runner(ledger)
    tries: list[int] = []

    async def unreachable(*args: Any, **kwargs: Any) -> bool:
        tries.append(1)
        raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, "connection_refused")

    ledger.engine.settle = unreachable  # type: ignore[method-assign]
    ledger.checkpoints.record_outcome = unreachable  # type: ignore[method-assign]
    run_id = await published(ledger, worker, "answer")
    hop = asyncio.ensure_future(worker.perform(run_id, 0))
    await until(lambda: len(tries) >= 3, what="the outcome's record to be retried")
    hop.cancel()  # the process dies here: nothing committed
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(hop, 60)
    del ledger.engine.settle, ledger.checkpoints.record_outcome
    assert await ledger.checkpoints.outcome(run_id) is None
    report = await reconcile(ledger, worker)
    assert report.counts["orphans_failed"] == 1
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.error) == (RunStatus.FAILED, "lost")


async def counts_read_before_the_lock(ledger: RunLedger, monkeypatch: pytest.MonkeyPatch, value: int) -> bool:
    """Make the settle's pair statement answer ``value`` for every count, as PostgreSQL's
    can: its counts come from a snapshot taken before the statement waited for the Run's
    lock, so a writer that held that lock may have committed meanwhile. Whether the store
    can answer such counts at all: SQLite's transaction holds the write lock from its
    start, so nothing can commit between its lock and its counts and nothing is left to
    verify (the caller's test ends there)."""
    counted = RunEngine.locked_pair_counting

    async def from_before_the_lock(tx: Any, counted_run_id: str, counts: Any) -> Any:
        pair, values = await counted(tx, counted_run_id, counts)
        return pair, [value] * len(values)

    monkeypatch.setattr(RunEngine, "locked_pair_counting", staticmethod(from_before_the_lock))
    monkeypatch.setattr(ledger.engine, "send_ahead", _transaction_path)  # the path these counts are read on
    async with ledger.engine.engine.store.transaction(write=True) as tx:
        current = tx.counts_current
    if current:
        assert ledger.engine.engine.store.__class__.__name__.lower().startswith("sqlite")
    return not current


async def test_a_settle_counted_before_a_job_committed_is_verified_at_its_write_and_refused(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The counts read in the pair's statement as PostgreSQL can see them: from a snapshot
    taken before the statement waited for the Run's lock, so without the job a writer
    holding that lock committed meanwhile (played by a counting reader that answers
    zero). The settle's write verifies the counts in its own statement, writes nothing,
    and the engine counts again and refuses. SQLite's transaction holds the write lock
    from its start: its counts are current, and nothing is left to verify."""
    worker = runner(ledger)
    run_id = await published(ledger, worker, "answer")
    assert await ledger.claim(run_id, 0, node="node-a") is not None
    job = await ledger.jobs.submit(run_id, request_id=unique("request"), runtime="sandbox", profile="small",
                                   request={})
    if not await counts_read_before_the_lock(ledger, monkeypatch, 0):  # without the job
        return
    with pytest.raises(TenureError) as refused:
        await ledger.engine.settle(run_id, RecordedOutcome(0, RunStatus.DONE, None, None), record=True)
    assert refused.value.code is ErrorCode.RUN_CONTAINMENT_UNPROVEN
    run = await ledger.get(run_id)
    assert run is not None and run.status is RunStatus.RUNNING
    assert await ledger.checkpoints.outcome(run_id) == RecordedOutcome(0, RunStatus.DONE, None, None)
    assert (await ledger.jobs.get(job.job_id)) is not None


async def test_a_settle_counted_before_a_job_closed_is_decided_again_on_fresh_counts_and_settles(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other side of a count read before the pair's lock on PostgreSQL: a job that
    closed meanwhile still counted open (played by a counting reader that answers one). A
    refusal decided on counts no write verified is decided again on counts read after the
    lock, as a settle whose count came after its lock always was: the Run settles."""
    worker = runner(ledger)
    run_id = await published(ledger, worker, "answer")
    assert await ledger.claim(run_id, 0, node="node-a") is not None
    if not await counts_read_before_the_lock(ledger, monkeypatch, 1):  # a job that closed meanwhile, still open
        return
    assert await ledger.engine.settle(run_id, RecordedOutcome(0, RunStatus.DONE, None, None), record=True)
    run = await ledger.get(run_id)
    assert run is not None and run.status is RunStatus.DONE
    assert await ledger.checkpoints.load(run_id) is None

