"""Run recovery on every database: ``RunLedger.reconcile`` and ``RunLedger.relay`` do what
``specs/recovery.md`` says, one scenario per rule, on a fresh database each (a
reconciliation scans every Run stored).

Each test brings Runs to a state a dead process leaves (claimed by ``node-a`` before the
boot cutoff, parked, published to a broker that lost it, ...), reconciles or relays, and
checks what is stored, what the broker holds and what the report says.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from adapter_support import raw
from run_support import Runs, succeeded

from tenure.adapters import InMemoryBroker, RecoveryIssue, RecoveryPorts, RunLedger, run_relays
from tenure.adapters.runs import recovery as recovery_module
from tenure.model import (
    AgentJobStatus,
    AttemptState,
    BrokerJobState,
    ConfigValidationError,
    ConsentStatus,
    DeliveryState,
    EgressDecision,
    Found,
    RunStatus,
    WaitKind,
    hop_key,
)

NODE = "node-a"


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


async def boot() -> dt.datetime:
    """A boot cutoff strictly after everything set up so far."""
    await asyncio.sleep(0.002)
    cutoff = now()
    await asyncio.sleep(0.002)
    return cutoff


def issues_of(report: Any) -> set[tuple[str, str]]:
    return {(issue.run_id, issue.reason) for issue in report.issues}


def nonzero(report: Any) -> dict[str, int]:
    return {name: count for name, count in report.counts.items() if count}


async def status_of(ledger: RunLedger, run_id: str) -> tuple[RunStatus, int, str | None]:
    run = await ledger.get(run_id)
    assert run is not None
    return run.status, run.enqueue_seq, run.error


@pytest.fixture
async def runs(db_url: str) -> Any:
    async with RunLedger(db_url) as ledger:
        yield Runs(ledger, db_url)


# --- orphans: this node's hops from before the boot -------------------------------------------


async def test_an_orphan_without_checkpoint_evidence_is_fenced_and_failed_lost(runs: Runs) -> None:
    run_id = await runs.running()
    key = hop_key(run_id, 0)
    assert runs.broker.take("agents") == key  # the dead process's hop is active at the broker
    cutoff = await boot()
    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker), node=NODE, boot_cutoff=cutoff)
    assert runs.broker.jobs[key].state is BrokerJobState.ABORTED
    assert await status_of(runs.ledger, run_id) == (RunStatus.FAILED, 0, "lost")
    assert nonzero(report) == {"orphans_failed": 1} and not report.degraded


async def test_an_orphan_is_reparked_only_on_a_checkpoint_that_binds_its_latest_owner(runs: Runs) -> None:
    bound = await runs.running("bound")
    bound_consent = await runs.consent(bound)
    stale = await runs.running("stale")
    older = await runs.consent(stale)
    await runs.consent(stale)  # a newer owner the checkpoint does not name
    checkpoints = {bound: bound_consent, stale: older}

    async def checkpoint_owner(run_id: str) -> str | None:
        return checkpoints.get(run_id)

    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker, checkpoint_owner=checkpoint_owner),
                                         node=NODE, boot_cutoff=await boot())
    run = await runs.ledger.get(bound)
    assert run is not None and (run.status, run.owner_kind, run.owner_id) == (
        RunStatus.AWAITING_CONSENT, WaitKind.CONSENT, bound_consent)
    assert await status_of(runs.ledger, stale) == (RunStatus.FAILED, 0, "lost")
    assert nonzero(report) == {"orphans_parked": 1, "orphans_failed": 1}
    # The stale Run's pending consents were swept with its failure.
    consent = await runs.ledger.consents.get(older)
    assert consent is not None and consent.status is ConsentStatus.CANCELLED


async def test_an_orphaned_hardware_wait_is_reparked_on_the_same_evidence_else_failed(runs: Runs) -> None:
    reparked = await runs.running("reparked")
    job_id = await runs.job(reparked)
    assert await runs.ledger.enter_hardware_wait(reparked, 0)
    failed = await runs.running("failed")
    assert await runs.ledger.enter_hardware_wait(failed, 0)

    async def checkpoint_owner(run_id: str) -> str | None:
        return job_id if run_id == reparked else None

    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker, checkpoint_owner=checkpoint_owner),
                                         node=NODE, boot_cutoff=await boot())
    assert (await status_of(runs.ledger, reparked))[0] is RunStatus.AWAITING_DELEGATE
    assert await status_of(runs.ledger, failed) == (RunStatus.FAILED, 0, "lost")
    assert nonzero(report) == {"orphans_parked": 1, "orphans_failed": 1}


async def test_another_nodes_hop_and_a_hop_of_this_boot_are_never_touched(runs: Runs) -> None:
    elsewhere = await runs.running("elsewhere", node="node-b")
    cutoff = await boot()
    current = await runs.running("current")  # claimed by this node after the cutoff
    for key in (hop_key(elsewhere, 0), hop_key(current, 0)):
        runs.broker.jobs[key].state = BrokerJobState.ACTIVE
    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker), node=NODE, boot_cutoff=cutoff)
    for run_id in (elsewhere, current):
        assert await status_of(runs.ledger, run_id) == (RunStatus.RUNNING, 0, None)
        assert runs.broker.jobs[hop_key(run_id, 0)].state is BrokerJobState.ACTIVE
    assert nonzero(report) == {} and not report.degraded


async def test_an_orphan_whose_abort_fails_stays_nonterminal_and_degrades_the_report(runs: Runs) -> None:
    run_id = await runs.running()
    runs.broker.take("agents")
    runs.broker.fail_aborts = 1
    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker), node=NODE, boot_cutoff=await boot())
    assert await status_of(runs.ledger, run_id) == (RunStatus.RUNNING, 0, None)
    assert report.degraded and issues_of(report) == {(run_id, "orphan_unfenced")}


async def test_an_orphans_delegated_job_is_contained_before_it_fails_and_unproven_containment_keeps_it(
    runs: Runs,
) -> None:
    contained = await runs.running("contained")
    contained_job = await runs.job(contained)
    stuck = await runs.running("stuck")
    stuck_job = await runs.job(stuck)
    asked: list[str] = []

    async def contain_job(job: Any) -> bool:
        asked.append(job.job_id)
        return job.job_id == contained_job

    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker, contain_job=contain_job), node=NODE,
                                         boot_cutoff=await boot())
    assert sorted(asked) == sorted([contained_job, stuck_job])
    job = await runs.ledger.jobs.get(contained_job)
    assert job is not None and job.status is AgentJobStatus.CANCELLED
    assert await status_of(runs.ledger, contained) == (RunStatus.FAILED, 0, "lost")
    assert await status_of(runs.ledger, stuck) == (RunStatus.RUNNING, 0, None)
    assert issues_of(report) == {(stuck, "containment_unproven")}
    assert nonzero(report) == {"orphans_failed": 1}


async def test_an_orphans_service_attempts_are_cancelled_or_observed_before_it_fails(runs: Runs) -> None:
    run_id = await runs.running()
    prepared = await runs.attempt(run_id)  # never transmitted: a cancel request cancels it at once
    sent = await runs.attempt(run_id)
    attempts = runs.ledger.attempts
    egress = EgressDecision(decision_id="egress-1", allowed=True, policy_revision="p")
    assert await attempts.begin_submit(sent, egress=egress) is not None
    assert await attempts.record_accepted(sent, provider_job_id="provider-1")
    observed: list[tuple[str, bool]] = []

    async def observe_attempt(attempt: Any, *, cancel: bool) -> Any:
        observed.append((attempt.attempt_id, cancel))
        return Found(provider_job_id="provider-1", state=AttemptState.CANCELLED)

    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker, observe_attempt=observe_attempt), node=NODE,
                                         boot_cutoff=await boot())
    assert observed == [(sent, True)]  # the PREPARED one needed no provider
    for attempt_id in (prepared, sent):
        record = await attempts.get(attempt_id)
        assert record is not None and record.state is AttemptState.CANCELLED
    assert await status_of(runs.ledger, run_id) == (RunStatus.FAILED, 0, "lost")
    assert nonzero(report) == {"orphans_failed": 1}


async def test_a_service_wait_is_observed_and_resumed_once_its_attempt_ended(runs: Runs) -> None:
    run_id = await runs.running()
    attempt_id = await runs.attempt(run_id)
    attempts = runs.ledger.attempts
    egress = EgressDecision(decision_id="egress-1", allowed=True, policy_revision="p")
    assert await attempts.begin_submit(attempt_id, egress=egress) is not None
    assert await attempts.record_accepted(attempt_id, provider_job_id="provider-1")
    assert await runs.ledger.park(run_id, 0, kind=WaitKind.SERVICE, owner_id=attempt_id)
    answers = [Found(provider_job_id="provider-1", state=AttemptState.RUNNING),
               Found(provider_job_id="provider-1", state=AttemptState.SUCCEEDED, result_refs=("ref-1",))]

    async def observe_attempt(attempt: Any, *, cancel: bool) -> Any:
        assert not cancel
        return answers.pop(0)

    ports = RecoveryPorts(runs.broker, observe_attempt=observe_attempt)
    first = await runs.ledger.relay(ports)
    assert nonzero(first) == {} and (await status_of(runs.ledger, run_id))[0] is RunStatus.AWAITING_SERVICE
    second = await runs.ledger.relay(ports, cursor=first.cursor)
    assert nonzero(second) == {"resumed": 1, "published": 1}
    assert await status_of(runs.ledger, run_id) == (RunStatus.QUEUED, 1, None)


# --- queued Runs and their deliveries --------------------------------------------------------


async def test_a_lost_publication_is_published_again_under_the_same_key(runs: Runs) -> None:
    pending = (await runs.admit("pending")).run.run_id  # admitted, never published
    published = await runs.published("published")
    del runs.broker.jobs[hop_key(published, 0)]  # the broker lost it
    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker), node=NODE, boot_cutoff=await boot())
    assert set(runs.broker.jobs) == {hop_key(pending, 0), hop_key(published, 0)}
    for run_id in (pending, published):
        delivery = await runs.ledger.get_delivery(run_id, 0)
        assert delivery is not None and delivery.state is DeliveryState.PUBLISHED
    assert nonzero(report) == {"published": 1, "republished": 1}


async def test_work_the_broker_holds_is_marked_published_and_a_finished_hop_rotates_keeping_its_mode(
    runs: Runs,
) -> None:
    acknowledged = (await runs.admit("acknowledged")).run.run_id
    await runs.broker.publish(hop_key(acknowledged, 0), queue="agents", wire_priority=50)  # ack lost
    resumed, consent_id = await runs.waiting_on_consent("resumed", decided=True)
    seq = await runs.ledger.resume(resumed, owner_id=consent_id)
    assert seq == 1 and await runs.ledger.publish(resumed, 1, runs.broker)
    runs.broker.take("agents")
    runs.broker.finish(hop_key(resumed, 1), failed=True)  # the broker finished it; nobody claimed
    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker), node=NODE, boot_cutoff=await boot())
    delivery = await runs.ledger.get_delivery(acknowledged, 0)
    assert delivery is not None and delivery.state is DeliveryState.PUBLISHED
    assert await status_of(runs.ledger, resumed) == (RunStatus.QUEUED, 2, None)
    rotated = await runs.ledger.get_delivery(resumed, 2)
    assert rotated is not None and rotated.resume and rotated.state is DeliveryState.PUBLISHED
    assert runs.broker.jobs[hop_key(resumed, 2)].wire_priority == 50
    assert nonzero(report) == {"published": 2, "rotated": 1}


async def test_a_stale_active_hop_is_fenced_and_rotated_and_a_young_one_is_left_to_its_worker(
    runs: Runs,
) -> None:
    stale = await runs.published("stale")
    young = await runs.published("young")
    cutoff = await boot()
    for run_id, started in ((stale, cutoff - dt.timedelta(seconds=600)), (young, cutoff - dt.timedelta(seconds=5))):
        job = runs.broker.jobs[hop_key(run_id, 0)]
        job.state, job.started_at = BrokerJobState.ACTIVE, started
    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker), node=NODE, boot_cutoff=cutoff)
    assert runs.broker.jobs[hop_key(stale, 0)].state is BrokerJobState.ABORTED
    assert await status_of(runs.ledger, stale) == (RunStatus.QUEUED, 1, None)
    assert runs.broker.jobs[hop_key(stale, 1)].state is BrokerJobState.QUEUED
    assert runs.broker.jobs[hop_key(young, 0)].state is BrokerJobState.ACTIVE
    assert await status_of(runs.ledger, young) == (RunStatus.QUEUED, 0, None)
    assert nonzero(report) == {"rotated": 1, "published": 1}


async def test_a_stale_active_hop_claimed_after_its_page_was_read_is_not_fenced(
    runs: Runs, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A visit starts from its page's reading (adapters/runs/pages.py), but a fence (an
    abort) is decided on the Run as stored when it is sent: a worker that claims the hop
    after the page was read keeps its broker job."""
    run_id = await runs.published("claimed-meanwhile")
    cutoff = await boot()
    job = runs.broker.jobs[hop_key(run_id, 0)]
    job.state, job.started_at = BrokerJobState.ACTIVE, cutoff - dt.timedelta(seconds=600)
    read_entries = recovery_module._Visits.entries

    async def page_then_claim(visits: Any, run_ids: Any) -> Any:
        entries = await read_entries(visits, run_ids)
        if run_id in entries and entries[run_id].run.status is RunStatus.QUEUED:
            claimed.append(await runs.ledger.claim(run_id, 0, node="node-b"))  # a live worker, after the read
        return entries

    claimed: list[Any] = []
    monkeypatch.setattr(recovery_module._Visits, "entries", page_then_claim)
    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker), node=NODE, boot_cutoff=cutoff)
    assert claimed and claimed[0] is not None
    assert runs.broker.jobs[hop_key(run_id, 0)].state is BrokerJobState.ACTIVE  # not aborted
    assert await status_of(runs.ledger, run_id) == (RunStatus.RUNNING, 0, None)
    assert nonzero(report) == {} and not report.issues


async def test_an_active_hop_without_a_start_time_is_reported(runs: Runs) -> None:
    run_id = await runs.published()
    runs.broker.jobs[hop_key(run_id, 0)].state = BrokerJobState.ACTIVE  # no started_at
    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker), node=NODE, boot_cutoff=await boot())
    assert issues_of(report) == {(run_id, "start_time_unknown")}
    assert await status_of(runs.ledger, run_id) == (RunStatus.QUEUED, 0, None)


async def test_this_nodes_held_admission_of_an_earlier_boot_fails_and_nothing_else_does(runs: Runs) -> None:
    mine = (await runs.admit("mine", hold=True, node=NODE)).run.run_id
    anyones = (await runs.admit("anyones", hold=True)).run.run_id
    theirs = (await runs.admit("theirs", hold=True, node="node-b")).run.run_id
    cutoff = await boot()
    fresh = (await runs.admit("fresh", hold=True, node=NODE)).run.run_id
    relayed = await runs.ledger.relay(RecoveryPorts(runs.broker))
    assert nonzero(relayed) == {}  # a relay never fails a HELD admission
    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker), node=NODE, boot_cutoff=cutoff)
    for run_id in (mine, anyones):
        assert await status_of(runs.ledger, run_id) == (RunStatus.FAILED, 0, "admission context unresolved")
    for run_id in (theirs, fresh):
        assert await status_of(runs.ledger, run_id) == (RunStatus.QUEUED, 0, None)
    assert nonzero(report) == {"held_failed": 2} and runs.broker.jobs == {}


async def test_corrupt_mismatched_unknown_and_unprobeable_deliveries_are_reported_never_guessed(
    runs: Runs, db_url: str,
) -> None:
    missing = (await runs.admit("missing")).run.run_id
    raw(db_url, "DELETE FROM tenure_run_deliveries WHERE run_id = ?", (missing,))
    elsewhere = (await runs.admit("elsewhere", queue="gpu")).run.run_id
    mismatch = await runs.published("mismatch")
    runs.broker.jobs[hop_key(mismatch, 0)].queue = "other"
    unprobeable = (await runs.admit("unprobeable")).run.run_id

    class Flaky(InMemoryBroker):
        async def probe(self, key: str) -> Any:
            if key == hop_key(unprobeable, 0):
                raise OSError("connection refused")
            return await runs.broker.probe(key)

    ports = RecoveryPorts(Flaky(), known_queues=frozenset({"agents"}))
    report = await runs.ledger.reconcile(ports, node=NODE, boot_cutoff=await boot())
    assert issues_of(report) == {
        (missing, "delivery_missing"), (elsewhere, "queue_unknown"), (mismatch, "delivery_mismatch"),
        (unprobeable, "broker_unprobeable"),
    }
    assert report.degraded and nonzero(report) == {}
    for run_id in (elsewhere, mismatch, unprobeable):
        assert (await status_of(runs.ledger, run_id))[0] is RunStatus.QUEUED


# --- waits and cancellations -----------------------------------------------------------------


async def test_decided_waits_are_resumed_and_published_and_undecided_ones_kept(runs: Runs) -> None:
    decided, _ = await runs.waiting_on_consent("decided", decided=True)
    undecided, _ = await runs.waiting_on_consent("undecided")
    delegated = await runs.running("delegated")
    job_id = await runs.job(delegated)
    assert await runs.ledger.park(delegated, 0, kind=WaitKind.DELEGATE, owner_id=job_id)
    assert await runs.ledger.jobs.adopt_result(job_id, succeeded(job_id))
    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker), node=NODE, boot_cutoff=await boot())
    for run_id in (decided, delegated):
        assert await status_of(runs.ledger, run_id) == (RunStatus.QUEUED, 1, None)
        assert runs.broker.jobs[hop_key(run_id, 1)].state is BrokerJobState.QUEUED
    assert (await status_of(runs.ledger, undecided))[0] is RunStatus.AWAITING_CONSENT
    assert nonzero(report) == {"resumed": 2, "published": 2}


async def test_a_relay_resumes_a_consent_decided_while_nobody_listened(runs: Runs) -> None:
    run_id, consent_id = await runs.waiting_on_consent()
    first = await runs.ledger.relay(RecoveryPorts(runs.broker))
    assert nonzero(first) == {}
    assert await runs.ledger.consents.decide(consent_id, ConsentStatus.GRANTED, decided_by="bob")
    second = await runs.ledger.relay(RecoveryPorts(runs.broker), cursor=first.cursor)
    assert nonzero(second) == {"resumed": 1, "published": 1}
    assert await status_of(runs.ledger, run_id) == (RunStatus.QUEUED, 1, None)


async def test_a_cancellation_is_finished_after_its_hop_is_fenced_or_stays_unproven(runs: Runs) -> None:
    finished = await runs.running("finished", node="node-b")  # node-independent
    unproven = await runs.running("unproven", node="node-b")
    for run_id in (finished, unproven):
        runs.broker.jobs[hop_key(run_id, 0)].state = BrokerJobState.ACTIVE
        assert await runs.ledger.begin_cancel(run_id) is not None

    class StuckAbort(InMemoryBroker):
        async def abort(self, key: str, *, terminal: bool = False) -> bool:
            return False if key == hop_key(unproven, 0) else await super().abort(key, terminal=terminal)

    broker = StuckAbort()
    broker.jobs = runs.broker.jobs
    report = await runs.ledger.reconcile(RecoveryPorts(broker), node=NODE, boot_cutoff=await boot())
    assert (await status_of(runs.ledger, finished))[0] is RunStatus.CANCELLED
    assert (await status_of(runs.ledger, unproven))[0] is RunStatus.CANCELLING
    assert issues_of(report) == {(unproven, "containment_unproven")}
    assert nonzero(report) == {"cancels_finished": 1}


async def test_terminal_runs_have_their_checkpoints_deleted_and_a_failing_port_is_isolated(runs: Runs) -> None:
    done = await runs.running("done")
    assert await runs.ledger.settle(done, 0, RunStatus.DONE)
    poisoned = await runs.running("poisoned")
    assert await runs.ledger.settle(poisoned, 0, RunStatus.FAILED, error="boom")
    lost = (await runs.admit("lost")).run.run_id
    deleted: list[str] = []

    async def delete_checkpoint(run_id: str) -> None:
        if run_id == poisoned:
            raise RuntimeError("disk full at /secret/path")
        deleted.append(run_id)

    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker, delete_checkpoint=delete_checkpoint),
                                         node=NODE, boot_cutoff=await boot())
    assert deleted == [done]
    assert issues_of(report) == {(poisoned, "port_failed")}
    assert nonzero(report) == {"published": 1} and hop_key(lost, 0) in runs.broker.jobs
    assert all("/secret" not in repr(issue) for issue in report.issues)


# --- relays: fairness, cursors, the loop ------------------------------------------------------


async def test_pages_of_poison_runs_do_not_starve_newer_runs(runs: Runs) -> None:
    page, poison_pages, good_pages = 4, 3, 2
    poison = [(await runs.admit(f"poison-{n}", queue="unknown")).run.run_id for n in range(page * poison_pages)]
    good = [(await runs.admit(f"good-{n}")).run.run_id for n in range(page * good_pages)]
    ports = RecoveryPorts(runs.broker, known_queues=frozenset({"agents"}))
    cursor, calls, reported = None, 0, set()
    bound = 2 * (poison_pages + good_pages)  # every Run within twice the number of pages
    while calls < bound and not all(hop_key(run_id, 0) in runs.broker.jobs for run_id in good):
        report = await runs.ledger.relay(ports, cursor=cursor, page_size=page)
        cursor, calls = report.cursor, calls + 1
        reported |= {issue.run_id for issue in report.issues}
    assert all(hop_key(run_id, 0) in runs.broker.jobs for run_id in good), calls
    assert reported == set(poison)  # the poison pages stayed under repair (reported), never dropped
    # And they keep being revisited afterwards.
    later = await runs.ledger.relay(ports, cursor=cursor, page_size=page)
    assert {issue.reason for issue in later.issues} == {"queue_unknown"}


async def test_a_relay_refuses_a_cursor_it_did_not_write(runs: Runs) -> None:
    ports = RecoveryPorts(runs.broker)
    for cursor in ("not base64!", "e30=", 7, "eyJ2IjoxLCJraW5kcyI6eyJ4Ijp7fX19"):
        with pytest.raises(ConfigValidationError) as caught:
            await runs.ledger.relay(ports, cursor=cursor)  # type: ignore[arg-type]
        assert caught.value.reason == "invalid_cursor"
    with pytest.raises(ConfigValidationError):
        await runs.ledger.relay(ports, page_size=0)
    with pytest.raises(ConfigValidationError):
        await runs.ledger.reconcile(ports, node=NODE, boot_cutoff=dt.datetime(2026, 1, 1))  # naive
    with pytest.raises(ConfigValidationError):
        RecoveryPorts(object())  # type: ignore[arg-type]


async def test_run_relays_restarts_a_failing_relay_with_capped_backoff_until_stopped(
    runs: Runs, monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_id = (await runs.admit()).run.run_id
    real_relay = RunLedger.relay
    calls: list[str | None] = []
    waits: list[float] = []

    async def flaky_relay(self: RunLedger, ports: RecoveryPorts, *, cursor: str | None = None,
                          page_size: int = 32) -> Any:
        calls.append(cursor)
        if len(calls) <= 2:
            raise OSError("database restarting")
        return await real_relay(self, ports, cursor=cursor, page_size=page_size)

    backoff = recovery_module.relay_backoff_s
    monkeypatch.setattr(RunLedger, "relay", flaky_relay)
    monkeypatch.setattr(recovery_module, "relay_backoff_s", lambda failures: waits.append(failures) or 0.0)
    stop = asyncio.Event()
    task = asyncio.create_task(run_relays(runs.ledger, RecoveryPorts(runs.broker), node=NODE, stop=stop,
                                          interval_s=0.01))
    for _ in range(500):
        if hop_key(run_id, 0) in runs.broker.jobs and len(calls) >= 4:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 60)
    assert waits == [1, 2] and hop_key(run_id, 0) in runs.broker.jobs
    assert calls[3] is not None  # a successful round's cursor is passed to the next
    assert [backoff(n) for n in (1, 2, 3, 6, 7, 40)] == [0.2, 0.4, 0.8, 5.0, 5.0, 5.0]


def test_report_shapes() -> None:
    assert recovery_module.COUNT_NAMES == ("published", "republished", "rotated", "held_failed", "orphans_parked",
                                           "orphans_failed", "resumed", "cancels_finished", "outcomes_settled",
                                           "hops_retried", "timed_out")
    assert RecoveryIssue("r", "port_failed").reason == "port_failed"


async def test_relays_from_several_processes_at_once_rotate_and_publish_each_run_once(runs: Runs) -> None:
    ids = [await runs.published(f"finished-{n}") for n in range(12)]
    for run_id in ids:  # the broker ran each hop's job and nobody claimed it
        runs.broker.jobs[hop_key(run_id, 0)].state = BrokerJobState.COMPLETE
    ports = RecoveryPorts(runs.broker)
    async with RunLedger(runs.db_url) as second, RunLedger(runs.db_url) as third:
        reports = await asyncio.gather(*(ledger.relay(ports) for ledger in (runs.ledger, second, third)))
    assert not any(report.degraded for report in reports), [report.issues for report in reports]
    assert sum(report.counts["rotated"] for report in reports) == len(ids)
    for run_id in ids:
        assert await status_of(runs.ledger, run_id) == (RunStatus.QUEUED, 1, None)
        delivery = await runs.ledger.get_delivery(run_id, 1)
        assert delivery is not None and delivery.state is DeliveryState.PUBLISHED
        assert runs.broker.jobs[hop_key(run_id, 1)].state is BrokerJobState.QUEUED
    assert not any(hop_key(run_id, 2) in runs.broker.jobs for run_id in ids)


# --- visits at once, and the one-statement read of a Run with its delivery ---------------------


async def test_the_runs_of_a_page_are_visited_at_once_when_the_ports_allow_and_each_is_recovered_as_alone(runs: Runs) -> None:
    """With ports that accept it, a page's visits overlap (at most ``concurrency`` at a
    time): the broker sees several probes in flight, and every Run ends exactly as a
    visit of its own leaves it."""
    lost = [await runs.published(f"lost-{n}") for n in range(12)]
    held = [await runs.published(f"held-{n}") for n in range(12)]
    for run_id in lost:
        del runs.broker.jobs[hop_key(run_id, 0)]
    in_flight, most = 0, 0

    class Slow(InMemoryBroker):
        async def probe(self, key: str) -> Any:
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            try:
                await asyncio.sleep(0.01)  # a broker round trip: the other visits go on meanwhile
                return await runs.broker.probe(key)
            finally:
                in_flight -= 1

        async def publish(self, *args: Any, **kwargs: Any) -> Any:
            return await runs.broker.publish(*args, **kwargs)

    at_once = RecoveryPorts(Slow(), concurrency=recovery_module.VISIT_CONCURRENCY)
    report = await runs.ledger.reconcile(at_once, node=NODE, boot_cutoff=await boot())
    assert 1 < most <= recovery_module.VISIT_CONCURRENCY
    assert nonzero(report) == {"republished": 12} and not report.degraded
    assert set(runs.broker.jobs) == {hop_key(run_id, 0) for run_id in lost + held}
    # By default a pass calls the ports for one Run at a time (ports written for one caller).
    most = 0
    report = await runs.ledger.reconcile(RecoveryPorts(Slow()), node=NODE, boot_cutoff=await boot())
    assert most == 1 and not report.degraded
    with pytest.raises(ConfigValidationError):
        RecoveryPorts(runs.broker, concurrency=0)


async def test_a_run_and_its_delivery_are_read_in_one_statement_and_stray_rows_fall_back(
    runs: Runs, db_url: str,
) -> None:
    """The pair comes from one join (one snapshot: the unique index on a Run's sequence
    allows one row at most); a delivery row another writer left under a key that is not
    the one its Run and sequence name makes the separate reads (with their re-read proof)
    answer instead, and they find no delivery under the Run's key."""
    run_id = await runs.published("paired")

    async def pair() -> Any:
        async def body(tx: Any) -> Any:
            return await recovery_module._consistent_pair(tx, run_id)  # noqa: SLF001

        return await runs.ledger.engine.run(body, write=False)

    async def joined() -> Any:
        async def body(tx: Any) -> Any:
            return await tx.read_joined(recovery_module.RUNS_BINDING, [run_id], recovery_module.DELIVERIES_BINDING,
                                        recovery_module.CURRENT_DELIVERY)

        return await runs.ledger.engine.run(body, write=False)

    [(run, delivery)] = await joined()
    assert run.run_id == run_id and delivery.delivery_id == hop_key(run_id, 0)
    assert await pair() == (run, delivery)
    raw(db_url, "UPDATE tenure_run_deliveries SET delivery_id = 'stray' WHERE delivery_id = ?", (hop_key(run_id, 0),))
    assert [found.delivery_id for _, found in await joined()] == ["stray"]
    assert await pair() == (run, None)
    assert await runs.ledger.engine.run(
        lambda tx: tx.read_joined(recovery_module.RUNS_BINDING, ["no-such-run"], recovery_module.DELIVERIES_BINDING,
                                  recovery_module.CURRENT_DELIVERY), write=False) == []
