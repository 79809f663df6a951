"""The Run ledger on every database, rule by rule (issue 14's "Rules", specs/runs.md):
admission and its replays, the session fence, priorities, publication, claims, hardware
waits, parks and resumes, settlement with containment, cancellation, and the reads (a
consent's verdicts: tests/adapters/consents/test_consent_verdicts.py; delegated jobs:
tests/adapters/agent_jobs/test_agent_jobs.py). Each test states one rule and fails if the
ledger breaks it.

The tests of a module share one migrated database per kind (see run_support.py); each
test's Runs come from its own admitting surface.
"""

from __future__ import annotations

import pathlib
import sqlite3
from typing import Any

import pytest

from adapter_support import raw, stored_instant
from attempt_fakes import spec
from run_support import (  # noqa: F401 (ledger, runs, runs_db: fixtures)
    OTHER_PIN, PIN, Runs, ledger, on_ledgers, raises, result_of, runs, runs_db, succeeded, unique,
)
from tenure.adapters import AttemptLedger, InMemoryBroker, RunLedger
from tenure.adapters.runs.ledger import job_id_for, run_id_for
from tenure.kernel.runs.machine import CANCELLED_BY, SETTLED_BY
from tenure.model import (
    AgentJobStatus,
    AttemptState,
    BrokerJobState,
    CancelTicket,
    ConfigValidationError,
    ConsentStatus,
    DeliveryState,
    EgressDecision,
    ErrorCode,
    RunClaim,
    RunStatus,
    TenureError,
    WaitKind,
    broker_priority,
    hop_key,
    parse_hop_key,
)


def stored(db_url: str, table: str, key_column: str, key: str, columns: str) -> tuple[Any, ...]:
    found = raw(db_url, f"SELECT {columns} FROM {table} WHERE {key_column} = ?", (key,))
    assert len(found) == 1
    return found[0]


# --- admission -------------------------------------------------------------------------------


async def test_admission_makes_a_queued_run_with_a_pending_delivery_zero_and_publishes_nothing(runs: Runs) -> None:
    admission = await runs.admit("run-1", queue="agents", priority=30)
    run, delivery = admission.run, admission.delivery
    assert admission.created is True
    assert run.run_id == run_id_for(runs.key("run-1")) == runs.run_id("run-1")
    assert (run.status, run.enqueue_seq, run.queue, run.priority, run.workflow) == (
        RunStatus.QUEUED, 0, "agents", 30, PIN)
    assert (run.started_at, run.node, run.owner_kind, run.owner_id, run.error) == (None, None, None, None, None)
    assert run.intent == runs.intent() and run.idempotency_key == runs.key("run-1")
    assert (delivery.run_id, delivery.enqueue_seq, delivery.state, delivery.queue, delivery.priority,
            delivery.resume, delivery.publish_attempts) == (run.run_id, 0, DeliveryState.PENDING, "agents", 30, False, 0)
    assert delivery.key == hop_key(run.run_id, 0) == f"run:{run.run_id}:0"
    assert await runs.ledger.get(run.run_id) == run
    assert await runs.ledger.get_delivery(run.run_id, 0) == delivery
    assert (runs.count("tenure_runs", run.run_id), runs.count("tenure_run_deliveries", run.run_id)) == (1, 1)


def test_a_hop_key_is_parsed_back_exactly_and_nothing_else_is() -> None:
    for run_id, seq in (("a", 0), ("0f5c-uuid", 7), ("with:colons", 2_147_483_647)):
        assert parse_hop_key(hop_key(run_id, seq)) == (run_id, seq)
    for key in (None, 7, "", "run:", "run:x", "run::1", "job:x:1", "run:x:", "run:x:-1", "run:x:+1",
                "run:x:01", "run:x: 1", "run:x:2147483648", "run:x:\u0661", "run:x\x00:1"):
        with pytest.raises(ConfigValidationError) as refused:
            parse_hop_key(key)
        assert refused.value.problems == ("hop_key_required",) and "run:" not in str(refused.value)


async def test_a_held_admission_is_released_to_pending_exactly_once(runs: Runs) -> None:
    admission = await runs.admit("run-1", hold=True)
    run_id = admission.run.run_id
    assert admission.delivery.state is DeliveryState.HELD
    assert await runs.ledger.release(run_id, 1) is False  # not this admission's generation
    assert await runs.ledger.release(run_id, 0) is True
    assert (await runs.ledger.get_delivery(run_id, 0)).state is DeliveryState.PENDING  # type: ignore[union-attr]
    assert await runs.ledger.release(run_id, 0) is False
    assert await runs.ledger.fail_held(run_id, 0, error="context lost") is False  # no longer held
    assert (await runs.ledger.get(run_id)).status is RunStatus.QUEUED  # type: ignore[union-attr]


async def test_fail_held_fails_exactly_that_held_generation(runs: Runs) -> None:
    pending = (await runs.admit("run-pending")).run.run_id
    assert await runs.ledger.fail_held(pending, 0, error="context lost") is False
    run_id = (await runs.admit("run-held", hold=True)).run.run_id
    assert await runs.ledger.fail_held(run_id, 1, error="context lost") is False
    assert await runs.ledger.fail_held(run_id, 0, error="context lost") is True
    run = await runs.ledger.get(run_id)
    assert run is not None and (run.status, run.error) == (RunStatus.FAILED, "context lost")
    assert (await runs.ledger.get_delivery(run_id, 0)).state is DeliveryState.SETTLED  # type: ignore[union-attr]
    assert await runs.ledger.release(run_id, 0) is False
    assert await runs.ledger.fail_held(run_id, 0, error="again") is False
    assert (await runs.ledger.get(run_id)).error == "context lost"  # type: ignore[union-attr]


async def test_release_racing_fail_held_has_exactly_one_winner(runs: Runs, runs_db: str) -> None:
    for round_number in range(6):
        run_id = (await runs.admit(f"run-{round_number}", hold=True)).run.run_id
        release_first = round_number % 2 == 0

        async def call(ledger: RunLedger, number: int) -> bool:
            if (number == 0) == release_first:
                return await ledger.release(run_id, 0)
            return await ledger.fail_held(run_id, 0, error="context lost")

        outcomes = await on_ledgers(runs_db, 2, call)
        assert sorted(outcomes) == [False, True], outcomes
        released = outcomes[0] if release_first else outcomes[1]
        run = await runs.ledger.get(run_id)
        delivery = await runs.ledger.get_delivery(run_id, 0)
        assert run is not None and delivery is not None
        if released:
            assert (run.status, delivery.state) == (RunStatus.QUEUED, DeliveryState.PENDING)
        else:
            assert (run.status, delivery.state) == (RunStatus.FAILED, DeliveryState.SETTLED)


async def test_admissions_without_a_key_are_never_replays(runs: Runs) -> None:
    first = await runs.admit(None)
    second = await runs.admit(None)
    assert first.created and second.created and first.run.run_id != second.run.run_id
    assert first.run.idempotency_key is None
    assert runs.runs_of_source() == 2


async def test_a_replay_returns_the_stored_run_and_never_reroutes(runs: Runs) -> None:
    first = await runs.admit("run-1", queue="agents", priority=30, workflow=PIN)
    replay = await runs.admit("run-1", queue="elsewhere", priority=99, workflow=OTHER_PIN)
    assert replay.created is False
    assert replay.run == first.run and replay.delivery == first.delivery
    assert (replay.run.queue, replay.run.priority, replay.run.workflow) == ("agents", 30, PIN)
    assert (replay.delivery.queue, replay.delivery.priority) == ("agents", 30)
    assert runs.runs_of_source() == 1 and runs.count("tenure_run_deliveries", first.run.run_id) == 1


async def test_a_replay_after_the_run_moved_on_returns_where_it_stands(runs: Runs) -> None:
    run_id = await runs.running("run-1")
    replay = await runs.admit("run-1")
    assert replay.created is False
    assert (replay.run.status, replay.delivery.state) == (RunStatus.RUNNING, DeliveryState.CLAIMED)


@pytest.mark.parametrize("field, value", [
    ("session_id", "session-other"),
    ("principal", "mallory"),
    ("scopes", frozenset({"files:read"})),
    ("scopes", frozenset({"files:read", "mail:send", "admin"})),
    ("payload", {"task": "summarise", "items": [1, 2]}),
    ("payload", {"task": "summarise", "items": [1, 2, 3], "extra": None}),
    ("requested_priority", 7),
])
async def test_a_replay_with_any_changed_intent_field_conflicts_and_stores_nothing(runs: Runs, field: str, value: Any) -> None:
    first = await runs.admit("run-1")
    error = await raises(ErrorCode.RUN_ADMISSION_CONFLICT, runs.admit("run-1", intent=runs.intent(**{field: value})))
    assert error.reason == "intent_changed"
    assert await runs.ledger.get(first.run.run_id) == first.run
    assert await runs.ledger.get_delivery(first.run.run_id, 0) == first.delivery
    assert runs.runs_of_source() == 1 and runs.count("tenure_run_deliveries", first.run.run_id) == 1


async def test_the_order_of_scopes_and_keys_is_not_a_change(runs: Runs) -> None:
    first = await runs.admit("run-1", intent=runs.intent(payload={"a": 1, "b": [1, 2]}))
    again = await runs.admit("run-1", intent=runs.intent(payload={"b": [1, 2], "a": 1},
                                                         scopes=frozenset({"mail:send", "files:read"})))
    assert again.created is False and again.run.run_id == first.run.run_id


async def test_a_key_reused_from_another_source_is_refused_and_stores_nothing(runs: Runs) -> None:
    first = await runs.admit("run-1")
    other_source = unique("cli")
    error = await raises(ErrorCode.RUN_ADMISSION_CONFLICT, runs.admit("run-1", intent=runs.intent(source=other_source)))
    assert error.reason == "intent_changed"
    assert runs.runs_holding("run-1") == 1 and runs.count("tenure_run_deliveries", first.run.run_id) == 1
    again = await runs.admit("run-1")
    assert again.created is False and again.run == first.run


async def test_a_derived_run_id_held_under_another_key_conflicts(runs: Runs, runs_db: str) -> None:
    first = await runs.admit("run-1")
    # Another writer stored a Run under this derived ID with a different key.
    raw(runs_db, "UPDATE tenure_runs SET idempotency_key = ? WHERE run_id = ?", ("someone-else", first.run.run_id))
    error = await raises(ErrorCode.RUN_ADMISSION_CONFLICT, runs.admit("run-1"))
    assert error.reason == "key_reused"
    assert runs.count("tenure_run_deliveries", first.run.run_id) == 1


async def test_replaying_a_held_admission_needs_hold(runs: Runs) -> None:
    held = await runs.admit("run-1", hold=True)
    error = await raises(ErrorCode.RUN_ADMISSION_HELD, runs.admit("run-1"))
    assert error.reason == "admission_held"
    again = await runs.admit("run-1", hold=True)
    assert (again.created, again.delivery.state) == (False, DeliveryState.HELD)
    assert await runs.ledger.release(held.run.run_id, 0)
    after_release = await runs.admit("run-1")
    assert (after_release.created, after_release.delivery.state) == (False, DeliveryState.PENDING)


async def test_ten_concurrent_same_key_admissions_converge_to_one_run_created_once(runs: Runs, runs_db: str) -> None:
    intent = runs.intent()

    async def call(ledger: RunLedger, number: int) -> Any:
        return await ledger.admit(intent, workflow=PIN, queue="agents", priority=50, idempotency_key=runs.key("run-1"))

    admissions = await on_ledgers(runs_db, 10, call)
    assert [admission.created for admission in admissions].count(True) == 1
    assert {admission.run.run_id for admission in admissions} == {runs.run_id("run-1")}
    assert runs.runs_of_source() == 1 and runs.count("tenure_run_deliveries", runs.run_id("run-1")) == 1


# --- the session fence -------------------------------------------------------------------------


async def test_a_fenced_session_holds_one_nonterminal_run_and_an_exact_replay_passes(runs: Runs) -> None:
    session = unique("session")
    intent = runs.intent(session_id=session)
    first = await runs.admit("run-a", intent=intent, session_fence=True)
    error = await raises(ErrorCode.RUN_SESSION_BUSY, runs.admit("run-b", intent=intent, session_fence=True))
    assert error.reason == "session_busy"
    assert await runs.ledger.get(runs.run_id("run-b")) is None
    replay = await runs.admit("run-a", intent=intent, session_fence=True)
    assert replay.created is False and replay.run.run_id == first.run.run_id
    # The fence is opt-in: an unfenced admission into the same session passes.
    assert (await runs.admit("run-c", intent=intent)).created is True
    other = await runs.admit("run-d", intent=runs.intent(session_id=unique("session")), session_fence=True)
    assert other.created is True


async def test_a_session_fence_needs_a_session(runs: Runs) -> None:
    with pytest.raises(ConfigValidationError) as caught:
        await runs.admit("run-1", session_fence=True)
    assert caught.value.fields == ("session_fence",)


async def fence_busy(runs: Runs, intent: Any, key: str) -> bool:
    try:
        await runs.admit(key, intent=intent, session_fence=True)
    except TenureError as error:
        assert error.code is ErrorCode.RUN_SESSION_BUSY
        return True
    return False


@pytest.mark.parametrize("ending", ["done", "failed", "cancelled", "failed_held"])
async def test_only_terminal_truth_releases_a_session_fence(runs: Runs, ending: str) -> None:
    intent = runs.intent(session_id=unique("session"))
    ledger = runs.ledger
    admission = await runs.admit("run-a", intent=intent, session_fence=True, hold=ending == "failed_held")
    run_id = admission.run.run_id
    probes = iter(f"probe-{number}" for number in range(20))
    assert await fence_busy(runs, intent, next(probes))  # queued
    if ending == "failed_held":
        assert await ledger.fail_held(run_id, 0, error="context lost")
    else:
        assert await ledger.claim(run_id, 0, node="node-a") is not None
        assert await fence_busy(runs, intent, next(probes))  # running
        assert await ledger.enter_hardware_wait(run_id, 0)
        assert await fence_busy(runs, intent, next(probes))  # awaiting hardware
        assert await ledger.leave_hardware_wait(run_id, 0)
        consent_id = await runs.consent(run_id, preauthorized=True)
        assert await ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent_id)
        assert await fence_busy(runs, intent, next(probes))  # awaiting consent
        assert await ledger.resume(run_id, owner_id=consent_id) == 1
        assert await ledger.claim(run_id, 1, node="node-a") is not None
        if ending == "done":
            assert await ledger.settle(run_id, 1, RunStatus.DONE)
        elif ending == "failed":
            assert await ledger.settle(run_id, 1, RunStatus.FAILED, error="tool crashed")
        else:
            ticket = await ledger.begin_cancel(run_id)
            assert ticket is not None
            assert await fence_busy(runs, intent, next(probes))  # cancelling
            assert await ledger.finish_cancel(run_id, ticket.enqueue_seq, runs.broker)
    assert not await fence_busy(runs, intent, "run-after")
    assert (await ledger.get(runs.run_id("run-after"))).status is RunStatus.QUEUED  # type: ignore[union-attr]


async def test_concurrent_fenced_admissions_of_one_session_admit_exactly_one(runs: Runs, runs_db: str) -> None:
    intent = runs.intent(session_id=unique("session"))

    async def call(ledger: RunLedger, number: int) -> Any:
        return await ledger.admit(intent, workflow=PIN, queue="agents", priority=50,
                                  idempotency_key=f"run-{number}", session_fence=True)

    outcomes = await on_ledgers(runs_db, 6, call)
    admitted = [outcome for outcome in outcomes if not isinstance(outcome, ErrorCode)]
    assert len(admitted) == 1 and admitted[0].created
    assert outcomes.count(ErrorCode.RUN_SESSION_BUSY) == 5
    assert runs.runs_of_source() == 1


# --- priorities --------------------------------------------------------------------------------


@pytest.mark.parametrize("priority", [-1, 101, True, False, 50.0, "50", None, 2**64])
async def test_a_priority_is_an_int_from_0_to_100_and_never_a_bool(runs: Runs, priority: Any) -> None:
    with pytest.raises(ConfigValidationError) as caught:
        await runs.admit("run-1", priority=priority)
    assert caught.value.fields == ("priority",)
    with pytest.raises(ConfigValidationError) as caught:
        runs.intent(requested_priority=priority if priority is not None else "none")
    assert caught.value.fields == ("requested_priority",)
    if priority is not None:
        with pytest.raises(ConfigValidationError):
            broker_priority(priority)
    assert runs.runs_of_source() == 0


async def test_the_edges_of_the_priority_range_are_admitted(runs: Runs) -> None:
    assert (await runs.admit("run-0", priority=0)).run.priority == 0
    assert (await runs.admit("run-100", priority=100)).run.priority == 100
    assert (broker_priority(0), broker_priority(100), broker_priority(30)) == (100, 0, 70)


async def test_a_requested_priority_overrides_the_router_and_the_broker_gets_100_minus_it(runs: Runs) -> None:
    admission = await runs.admit("run-1", intent=runs.intent(requested_priority=90), priority=10)
    assert (admission.run.priority, admission.delivery.priority, admission.run.requested_priority) == (90, 90, 90)
    assert await runs.ledger.publish(admission.run.run_id, 0, runs.broker)
    job = runs.broker.jobs[hop_key(admission.run.run_id, 0)]
    assert (job.queue, job.wire_priority) == ("agents", 10)
    routed = await runs.admit("run-2", priority=10)
    assert await runs.ledger.publish(routed.run.run_id, 0, runs.broker)
    assert runs.broker.jobs[hop_key(routed.run.run_id, 0)].wire_priority == 90


# --- publication -------------------------------------------------------------------------------


async def test_an_acknowledged_publish_moves_pending_to_published_and_counts_every_call(runs: Runs) -> None:
    run_id = (await runs.admit("run-1")).run.run_id
    assert await runs.ledger.publish(run_id, 0, runs.broker) is True
    delivery = await runs.ledger.get_delivery(run_id, 0)
    assert (delivery.state, delivery.publish_attempts) == (DeliveryState.PUBLISHED, 1)  # type: ignore[union-attr]
    assert runs.broker.jobs[hop_key(run_id, 0)].state is BrokerJobState.QUEUED
    assert await runs.ledger.publish(run_id, 0, runs.broker) is True  # a republish never moves it back
    delivery = await runs.ledger.get_delivery(run_id, 0)
    assert (delivery.state, delivery.publish_attempts) == (DeliveryState.PUBLISHED, 2)  # type: ignore[union-attr]
    assert list(runs.broker.jobs) == [hop_key(run_id, 0)]
    assert (await runs.ledger.get(run_id)).status is RunStatus.QUEUED  # type: ignore[union-attr]


async def test_a_publish_error_is_recorded_and_raised_and_the_run_stays_queued_under_the_same_key(runs: Runs, runs_db: str) -> None:
    run_id = (await runs.admit("run-1")).run.run_id
    runs.broker.fail_publishes = 1
    error = await raises(ErrorCode.RUN_BROKER_FAILED, runs.ledger.publish(run_id, 0, runs.broker))
    assert error.reason == "publish_failed"
    assert error.__cause__ is None and error.__context__ is None, "the broker's exception never rides along"
    delivery = await runs.ledger.get_delivery(run_id, 0)
    assert (delivery.state, delivery.publish_attempts) == (DeliveryState.PENDING, 1)  # type: ignore[union-attr]
    (last_error,) = stored(runs_db, "tenure_run_deliveries", "delivery_id", hop_key(run_id, 0), "last_error")
    assert last_error == "publish_failed:BrokerUnavailable"
    run = await runs.ledger.get(run_id)
    assert (run.status, run.enqueue_seq) == (RunStatus.QUEUED, 0)  # type: ignore[union-attr]
    assert runs.broker.jobs == {}
    assert await runs.ledger.publish(run_id, 0, runs.broker) is True
    delivery = await runs.ledger.get_delivery(run_id, 0)
    assert (delivery.state, delivery.publish_attempts) == (DeliveryState.PUBLISHED, 2)  # type: ignore[union-attr]
    assert list(runs.broker.jobs) == [hop_key(run_id, 0)]
    assert stored(runs_db, "tenure_run_deliveries", "delivery_id", hop_key(run_id, 0), "last_error") == (None,)


async def test_a_lost_acknowledgement_then_a_retry_publishes_one_job_under_the_same_key(runs: Runs) -> None:
    run_id = (await runs.admit("run-1")).run.run_id
    runs.broker.lose_acknowledgements = 1
    await raises(ErrorCode.RUN_BROKER_FAILED, runs.ledger.publish(run_id, 0, runs.broker))
    assert list(runs.broker.jobs) == [hop_key(run_id, 0)]  # the broker has it; the caller could not know
    assert (await runs.ledger.get_delivery(run_id, 0)).state is DeliveryState.PENDING  # type: ignore[union-attr]
    assert await runs.ledger.publish(run_id, 0, runs.broker) is True
    assert list(runs.broker.jobs) == [hop_key(run_id, 0)] and runs.broker.publish_calls == 2
    assert (await runs.ledger.get_delivery(run_id, 0)).publish_attempts == 2  # type: ignore[union-attr]


async def test_publish_sends_nothing_for_a_held_stale_claimed_or_unknown_delivery(runs: Runs) -> None:
    broker = runs.broker
    held = (await runs.admit("run-held", hold=True)).run.run_id
    assert await runs.ledger.publish(held, 0, broker) is False
    queued = (await runs.admit("run-queued")).run.run_id
    assert await runs.ledger.publish(queued, 1, broker) is False
    assert await runs.ledger.publish(runs.run_id("no-such-run"), 0, broker) is False
    claimed = (await runs.admit("run-claimed")).run.run_id
    assert await runs.ledger.claim(claimed, 0, node="node-a") is not None
    assert await runs.ledger.publish(claimed, 0, broker) is False
    failed = (await runs.admit("run-failed", hold=True)).run.run_id
    assert await runs.ledger.fail_held(failed, 0, error="context lost")
    assert await runs.ledger.publish(failed, 0, broker) is False
    assert broker.publish_calls == 0 and broker.jobs == {}
    for run_id in (held, queued, claimed, failed):
        assert (await runs.ledger.get_delivery(run_id, 0)).publish_attempts == 0  # type: ignore[union-attr]


class ClaimingBroker(InMemoryBroker):
    """A broker whose job is claimed by a fast worker before the acknowledgement is recorded."""

    def __init__(self, worker: RunLedger, run_id: str) -> None:
        super().__init__()
        self.worker, self.run_id = worker, run_id

    async def publish(self, key: str, *, queue: str, wire_priority: int) -> None:
        await super().publish(key, queue=queue, wire_priority=wire_priority)
        assert await self.worker.claim(self.run_id, 0, node="node-fast") is not None


async def test_an_acknowledgement_recorded_after_the_claim_never_moves_the_delivery_back(runs: Runs, runs_db: str) -> None:
    run_id = (await runs.admit("run-1")).run.run_id
    async with RunLedger(runs_db) as worker:
        assert await runs.ledger.publish(run_id, 0, ClaimingBroker(worker, run_id)) is False
    delivery = await runs.ledger.get_delivery(run_id, 0)
    assert (delivery.state, delivery.publish_attempts) == (DeliveryState.CLAIMED, 0)  # type: ignore[union-attr]
    assert (await runs.ledger.get(run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]


# --- claims ------------------------------------------------------------------------------------


async def test_a_claim_takes_exactly_that_sequence_once(runs: Runs) -> None:
    run_id = (await runs.admit("run-1")).run.run_id
    assert await runs.ledger.claim(run_id, 1, node="node-a") is None
    claim = await runs.ledger.claim(run_id, 0, node="node-a")
    assert isinstance(claim, RunClaim)
    assert (claim.enqueue_seq, claim.resume, claim.workflow) == (0, False, PIN)
    assert (claim.run.status, claim.run.node) == (RunStatus.RUNNING, "node-a") and claim.run.started_at is not None
    assert await runs.ledger.get(run_id) == claim.run
    delivery = await runs.ledger.get_delivery(run_id, 0)
    assert delivery.state is DeliveryState.CLAIMED  # type: ignore[union-attr]
    assert stored(runs.db_url, "tenure_run_deliveries", "delivery_id", hop_key(run_id, 0), "claimed_by") == ("node-a",)
    assert await runs.ledger.claim(run_id, 0, node="node-b") is None
    assert await runs.ledger.claim(runs.run_id("no-such-run"), 0, node="node-a") is None
    assert (await runs.ledger.get(run_id)).node == "node-a"  # type: ignore[union-attr]


async def test_a_held_delivery_cannot_be_claimed_but_a_published_one_can(runs: Runs) -> None:
    held = (await runs.admit("run-held", hold=True)).run.run_id
    assert await runs.ledger.claim(held, 0, node="node-a") is None
    published = await runs.published("run-published")
    assert (await runs.ledger.claim(published, 0, node="node-a")) is not None


async def test_of_two_claimers_of_one_hop_exactly_one_wins(runs: Runs, runs_db: str) -> None:
    for round_number in range(6):
        run_id = await runs.published(f"run-{round_number}")

        async def call(ledger: RunLedger, number: int) -> RunClaim | None:
            return await ledger.claim(run_id, 0, node=f"node-{number}")

        outcomes = await on_ledgers(runs_db, 2, call)
        winners = [outcome for outcome in outcomes if outcome is not None]
        assert len(winners) == 1 and outcomes.count(None) == 1
        assert (await runs.ledger.get(run_id)).node == winners[0].run.node  # type: ignore[union-attr]


async def test_started_at_is_kept_across_resume_hops_and_the_latest_node_is_recorded(runs: Runs) -> None:
    run_id = await runs.running("run-1", node="node-a")
    first = await runs.ledger.get(run_id)
    consent_id = await runs.consent(run_id, preauthorized=True)
    assert await runs.ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent_id)
    assert await runs.ledger.resume(run_id, owner_id=consent_id) == 1
    assert await runs.ledger.claim(run_id, 0, node="node-b") is None  # the old hop is stale
    assert await runs.ledger.publish(run_id, 1, runs.broker)
    claim = await runs.ledger.claim(run_id, 1, node="node-b")
    assert claim is not None and (claim.enqueue_seq, claim.resume, claim.workflow) == (1, True, PIN)
    assert claim.run.started_at == first.started_at  # type: ignore[union-attr]
    assert claim.run.node == "node-b"
    assert claim.run.updated_at >= first.updated_at  # type: ignore[union-attr]


# --- settlement --------------------------------------------------------------------------------


async def test_settling_done_from_running_settles_the_delivery_once(runs: Runs) -> None:
    run_id = await runs.running("run-1")
    assert await runs.ledger.settle(run_id, 0, RunStatus.DONE) is True
    run = await runs.ledger.get(run_id)
    assert (run.status, run.error) == (RunStatus.DONE, None)  # type: ignore[union-attr]
    assert (await runs.ledger.get_delivery(run_id, 0)).state is DeliveryState.SETTLED  # type: ignore[union-attr]
    assert await runs.ledger.settle(run_id, 0, RunStatus.DONE) is False
    assert await runs.ledger.settle(run_id, 0, RunStatus.FAILED, error="late") is False
    assert (await runs.ledger.get(run_id)).status is RunStatus.DONE  # type: ignore[union-attr]


async def test_settlement_is_only_from_running_or_hardware_wait_and_fenced_by_the_claimed_sequence(runs: Runs) -> None:
    queued = (await runs.admit("run-queued")).run.run_id
    assert await runs.ledger.settle(queued, 0, RunStatus.DONE) is False
    waiting, consent_id = await runs.waiting_on_consent("run-waiting", decided=True)
    assert await runs.ledger.settle(waiting, 0, RunStatus.DONE) is False
    assert await runs.ledger.resume(waiting, owner_id=consent_id) == 1
    assert await runs.ledger.claim(waiting, 1, node="node-b") is not None
    assert await runs.ledger.settle(waiting, 0, RunStatus.DONE) is False  # the old hop
    assert await runs.ledger.settle(waiting, 2, RunStatus.DONE) is False
    assert await runs.ledger.enter_hardware_wait(waiting, 1)
    assert await runs.ledger.settle(waiting, 1, RunStatus.DONE) is True
    for run_id, status in ((queued, RunStatus.QUEUED), (waiting, RunStatus.DONE)):
        assert (await runs.ledger.get(run_id)).status is status  # type: ignore[union-attr]
    assert (await runs.ledger.get_delivery(waiting, 1)).state is DeliveryState.SETTLED  # type: ignore[union-attr]


async def test_settling_failed_needs_an_error_and_a_failed_run_is_never_retried(runs: Runs) -> None:
    run_id = await runs.running("run-1")
    with pytest.raises(ConfigValidationError) as caught:
        await runs.ledger.settle(run_id, 0, RunStatus.FAILED)
    assert caught.value.fields == ("error",)
    with pytest.raises(ConfigValidationError) as caught:
        await runs.ledger.settle(run_id, 0, RunStatus.DONE, error="not for done")
    assert caught.value.fields == ("error",)
    for status in (RunStatus.CANCELLED, RunStatus.RUNNING, "done"):
        with pytest.raises(ConfigValidationError) as caught:
            await runs.ledger.settle(run_id, 0, status)  # type: ignore[arg-type]
        assert caught.value.fields == ("status",)
    assert await runs.ledger.settle(run_id, 0, RunStatus.FAILED, error="tool crashed") is True
    run = await runs.ledger.get(run_id)
    assert (run.status, run.error) == (RunStatus.FAILED, "tool crashed")  # type: ignore[union-attr]
    assert await runs.ledger.claim(run_id, 0, node="node-a") is None
    assert await runs.ledger.publish(run_id, 0, runs.broker) is False
    assert await runs.ledger.begin_cancel(run_id) is None
    replay = await runs.admit("run-1")
    assert (replay.created, replay.run.status, replay.delivery.enqueue_seq) == (False, RunStatus.FAILED, 0)
    assert runs.count("tenure_run_deliveries", run_id) == 1


async def test_settlement_over_cancelling_answers_false(runs: Runs) -> None:
    run_id = await runs.running("run-1")
    assert await runs.ledger.begin_cancel(run_id) == CancelTicket(run_id, 0, False)
    assert await runs.ledger.settle(run_id, 0, RunStatus.DONE) is False
    assert await runs.ledger.settle(run_id, 0, RunStatus.FAILED, error="crash") is False
    assert (await runs.ledger.get(run_id)).status is RunStatus.CANCELLING  # type: ignore[union-attr]
    assert (await runs.ledger.get_delivery(run_id, 0)).state is DeliveryState.CLAIMED  # type: ignore[union-attr]


async def test_settlement_is_unproven_while_a_delegated_job_is_open_or_lost(runs: Runs) -> None:
    run_id = await runs.running("run-1")
    job_id = await runs.job(run_id)
    await raises(ErrorCode.RUN_CONTAINMENT_UNPROVEN, runs.ledger.settle(run_id, 0, RunStatus.DONE))
    assert await runs.ledger.jobs.advance(job_id, AgentJobStatus.ADMITTED)
    await raises(ErrorCode.RUN_CONTAINMENT_UNPROVEN, runs.ledger.settle(run_id, 0, RunStatus.FAILED, error="x"))
    assert await runs.ledger.jobs.adopt_result(job_id, result_of(job_id, AgentJobStatus.LOST, error="runtime gone"))
    await raises(ErrorCode.RUN_CONTAINMENT_UNPROVEN, runs.ledger.settle(run_id, 0, RunStatus.DONE))
    assert [job.job_id for job in await runs.ledger.jobs.list(run_id)] == [job_id]
    assert (await runs.ledger.get(run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]
    assert (await runs.ledger.get_delivery(run_id, 0)).state is DeliveryState.CLAIMED  # type: ignore[union-attr]
    assert await runs.ledger.jobs.record_cancelled(job_id)
    assert await runs.ledger.jobs.list(run_id) == ()
    assert await runs.ledger.settle(run_id, 0, RunStatus.DONE) is True


@pytest.mark.parametrize("ending", [AgentJobStatus.SUCCEEDED, AgentJobStatus.FAILED, AgentJobStatus.TIMED_OUT,
                                    AgentJobStatus.CANCELLED])
async def test_a_job_with_an_adopted_result_other_than_lost_is_contained(runs: Runs, ending: AgentJobStatus) -> None:
    run_id = await runs.running("run-1")
    job_id = await runs.job(run_id)
    more = {"error": "it broke"} if ending in (AgentJobStatus.FAILED, AgentJobStatus.TIMED_OUT) else {}
    assert await runs.ledger.jobs.adopt_result(job_id, result_of(job_id, ending, **more))
    assert await runs.ledger.settle(run_id, 0, RunStatus.DONE) is True


async def test_settlement_is_unproven_while_a_service_attempt_of_this_run_is_unresolved(runs: Runs, runs_db: str) -> None:
    run_id = await runs.running("run-1")
    other = await runs.running("run-other")
    await runs.attempt(other)  # another Run's attempt does not hold this one
    async with AttemptLedger(runs_db) as attempts:
        attempt_id = await attempts.prepare(spec(unique("owner"), run_id=run_id))
        await raises(ErrorCode.RUN_CONTAINMENT_UNPROVEN, runs.ledger.settle(run_id, 0, RunStatus.DONE))
        await attempts.begin_submit(attempt_id, egress=EgressDecision(decision_id="egress-1", allowed=True,
                                                                      policy_revision="policy-1"))
        await raises(ErrorCode.RUN_CONTAINMENT_UNPROVEN, runs.ledger.settle(run_id, 0, RunStatus.DONE))
        assert await attempts.record_accepted(attempt_id, provider_job_id="provider-1")
        assert await attempts.record_succeeded(attempt_id, result_refs=["ref-1"])
        assert (await attempts.get(attempt_id)).state is AttemptState.SUCCEEDED  # type: ignore[union-attr]
    assert (await runs.ledger.get(run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]
    assert await runs.ledger.settle(run_id, 0, RunStatus.DONE) is True
    await raises(ErrorCode.RUN_CONTAINMENT_UNPROVEN, runs.ledger.settle(other, 0, RunStatus.DONE))


async def test_settlement_cancels_pending_consents_in_the_same_transaction(runs: Runs) -> None:
    run_id = await runs.running("run-1")
    pending = [await runs.consent(run_id), await runs.consent(run_id)]
    granted = await runs.consent(run_id, preauthorized=True)
    denied = await runs.consent(run_id)
    assert await runs.ledger.consents.decide(denied, ConsentStatus.DENIED, decided_by="bob")
    job_id = await runs.job(run_id)
    # A refused settlement changes nothing, the consents included.
    await raises(ErrorCode.RUN_CONTAINMENT_UNPROVEN, runs.ledger.settle(run_id, 0, RunStatus.DONE))
    for consent_id in pending:
        assert (await runs.ledger.consents.get(consent_id)).status is ConsentStatus.PENDING  # type: ignore[union-attr]
    assert await runs.ledger.jobs.adopt_result(job_id, succeeded(job_id))
    assert await runs.ledger.settle(run_id, 0, RunStatus.DONE)
    for consent_id in pending:
        consent = await runs.ledger.consents.get(consent_id)
        assert consent is not None and (consent.status, consent.decided_by) == (ConsentStatus.CANCELLED, SETTLED_BY)
        assert consent.decided_at is not None and consent.verdict is False
    assert (await runs.ledger.consents.get(granted)).status is ConsentStatus.GRANTED  # type: ignore[union-attr]
    assert (await runs.ledger.consents.get(denied)).decided_by == "bob"  # type: ignore[union-attr]


# --- parks and hardware waits -----------------------------------------------------------------


async def owner_of(runs: Runs, kind: WaitKind, run_id: str) -> str:
    if kind is WaitKind.CONSENT:
        return await runs.consent(run_id)
    if kind is WaitKind.DELEGATE:
        return await runs.job(run_id)
    return await runs.attempt(run_id)


OWNER_KINDS = [WaitKind.CONSENT, WaitKind.DELEGATE, WaitKind.SERVICE]


@pytest.mark.parametrize("kind", OWNER_KINDS)
async def test_parking_on_an_owner_of_another_run_is_an_owner_mismatch_and_changes_nothing(runs: Runs, kind: WaitKind) -> None:
    run_id = await runs.running("run-1")
    other = await runs.running("run-other")
    foreign = await owner_of(runs, kind, other)
    before = (await runs.ledger.get(run_id), await runs.ledger.get_delivery(run_id, 0))
    error = await raises(ErrorCode.RUN_OWNER_MISMATCH, runs.ledger.park(run_id, 0, kind=kind, owner_id=foreign))
    assert error.reason == "owner_mismatch"
    assert (await runs.ledger.get(run_id), await runs.ledger.get_delivery(run_id, 0)) == before
    # The owner of this Run, named under the wrong kind, does not match either.
    mine = await owner_of(runs, kind, run_id)
    wrong_kind = OWNER_KINDS[(OWNER_KINDS.index(kind) + 1) % 3]
    await raises(ErrorCode.RUN_OWNER_MISMATCH, runs.ledger.park(run_id, 0, kind=wrong_kind, owner_id=mine))
    assert (await runs.ledger.get(run_id), await runs.ledger.get_delivery(run_id, 0)) == before
    assert await runs.ledger.park(run_id, 0, kind=kind, owner_id=mine) is True


@pytest.mark.parametrize("kind", OWNER_KINDS)
async def test_parking_on_a_missing_owner_is_an_owner_mismatch(runs: Runs, kind: WaitKind) -> None:
    run_id = await runs.running("run-1")
    before = await runs.ledger.get(run_id)
    await raises(ErrorCode.RUN_OWNER_MISMATCH, runs.ledger.park(run_id, 0, kind=kind, owner_id=unique("missing")))
    assert await runs.ledger.get(run_id) == before


async def test_a_park_records_the_owner_settles_the_delivery_and_needs_the_running_hop(runs: Runs) -> None:
    queued = (await runs.admit("run-queued")).run.run_id
    run_id = await runs.running("run-1")
    consent_id = await runs.consent(run_id)
    assert await runs.ledger.park(queued, 0, kind=WaitKind.CONSENT, owner_id=consent_id) is False
    assert await runs.ledger.park(run_id, 1, kind=WaitKind.CONSENT, owner_id=consent_id) is False
    with pytest.raises(ConfigValidationError) as caught:
        await runs.ledger.park(run_id, 0, kind=WaitKind.HARDWARE, owner_id=consent_id)
    assert caught.value.fields == ("kind",)
    assert await runs.ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent_id) is True
    run = await runs.ledger.get(run_id)
    assert (run.status, run.owner_kind, run.owner_id) == (RunStatus.AWAITING_CONSENT, WaitKind.CONSENT, consent_id)  # type: ignore[union-attr]
    assert (await runs.ledger.get_delivery(run_id, 0)).state is DeliveryState.SETTLED  # type: ignore[union-attr]
    assert await runs.ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent_id) is False


@pytest.mark.parametrize("kind", OWNER_KINDS)
async def test_parking_on_an_already_decided_owner_may_be_resumed_at_once(runs: Runs, runs_db: str, kind: WaitKind) -> None:
    run_id = await runs.running("run-1")
    if kind is WaitKind.CONSENT:
        owner_id = await runs.consent(run_id, preauthorized=True)
    elif kind is WaitKind.DELEGATE:
        owner_id = await runs.job(run_id)
        assert await runs.ledger.jobs.adopt_result(owner_id, succeeded(owner_id))
    else:
        owner_id = await runs.attempt(run_id)
        async with AttemptLedger(runs_db) as attempts:
            assert await attempts.request_cancel(owner_id)  # never sent: cancelled at once
    assert await runs.ledger.park(run_id, 0, kind=kind, owner_id=owner_id)
    assert (await runs.ledger.get(run_id)).status.value == f"awaiting_{kind.value}"  # type: ignore[union-attr]
    assert await runs.ledger.resume(run_id, owner_id=owner_id) == 1
    delivery = await runs.ledger.get_delivery(run_id, 1)
    assert delivery is not None and (delivery.state, delivery.resume) == (DeliveryState.PENDING, True)


async def test_a_hardware_wait_is_the_same_hop_both_ways_and_keeps_its_claim(runs: Runs) -> None:
    run_id = await runs.running("run-1")
    ledger = runs.ledger
    assert await ledger.leave_hardware_wait(run_id, 0) is False
    assert await ledger.enter_hardware_wait(run_id, 1) is False
    assert await ledger.enter_hardware_wait(run_id, 0) is True
    assert (await ledger.get(run_id)).status is RunStatus.AWAITING_HARDWARE  # type: ignore[union-attr]
    assert (await ledger.get_delivery(run_id, 0)).state is DeliveryState.CLAIMED  # type: ignore[union-attr]
    assert await ledger.enter_hardware_wait(run_id, 0) is False
    assert await ledger.claim(run_id, 0, node="node-b") is None
    assert await ledger.leave_hardware_wait(run_id, 1) is False
    assert await ledger.leave_hardware_wait(run_id, 0) is True
    run = await ledger.get(run_id)
    assert (run.status, run.node, run.owner_kind) == (RunStatus.RUNNING, "node-a", None)  # type: ignore[union-attr]
    assert await ledger.leave_hardware_wait(run_id, 0) is False
    assert runs.count("tenure_run_deliveries", run_id) == 1


async def test_consents_and_jobs_are_created_only_for_a_running_run(runs: Runs) -> None:
    queued = (await runs.admit("run-queued")).run.run_id
    for run_id in (queued, runs.run_id("no-such-run")):
        await raises(ErrorCode.RUN_OWNER_MISMATCH, runs.consent(run_id))
        await raises(ErrorCode.RUN_OWNER_MISMATCH, runs.job(run_id))
    waiting, _ = await runs.waiting_on_consent("run-waiting")
    await raises(ErrorCode.RUN_OWNER_MISMATCH, runs.consent(waiting))
    assert runs.count("tenure_consents", queued) == 0 and runs.count("tenure_agent_jobs", queued) == 0
    assert runs.count("tenure_consents", waiting) == 1


# --- resume ------------------------------------------------------------------------------------


async def test_only_the_current_decided_owner_resumes_a_waiting_run(runs: Runs) -> None:
    ledger = runs.ledger
    run_id, consent_id = await runs.waiting_on_consent("run-1")
    foreign = await runs.consent(await runs.running("run-other"), preauthorized=True)
    assert await ledger.resume(run_id, owner_id=consent_id) is None  # still pending
    assert await ledger.consents.decide(consent_id, ConsentStatus.GRANTED, decided_by="bob")
    assert await ledger.resume(run_id, owner_id=foreign) is None
    assert await ledger.resume(run_id, owner_id=unique("nobody")) is None
    assert (await ledger.get(run_id)).status is RunStatus.AWAITING_CONSENT  # type: ignore[union-attr]
    assert await ledger.resume(run_id, owner_id=consent_id) == 1
    run = await ledger.get(run_id)
    assert (run.status, run.enqueue_seq, run.owner_kind, run.owner_id) == (RunStatus.QUEUED, 1, None, None)  # type: ignore[union-attr]
    assert (await ledger.get_delivery(run_id, 0)).state is DeliveryState.SETTLED  # type: ignore[union-attr]
    new = await ledger.get_delivery(run_id, 1)
    assert new is not None and (new.state, new.resume, new.publish_attempts) == (DeliveryState.PENDING, True, 0)
    assert await ledger.resume(run_id, owner_id=consent_id) is None  # not waiting any more
    # Next hop: parked on a second consent, the first is history and resumes nothing.
    assert await ledger.claim(run_id, 1, node="node-a") is not None
    second = await runs.consent(run_id, preauthorized=True)
    assert await ledger.park(run_id, 1, kind=WaitKind.CONSENT, owner_id=second)
    assert await ledger.resume(run_id, owner_id=consent_id) is None
    assert await ledger.resume(run_id, owner_id=second) == 2
    assert runs.count("tenure_run_deliveries", run_id) == 3


@pytest.mark.parametrize("verdict", [ConsentStatus.DENIED, ConsentStatus.EXPIRED])
async def test_a_denied_or_expired_consent_resumes_its_run_too(runs: Runs, verdict: ConsentStatus) -> None:
    run_id, consent_id = await runs.waiting_on_consent("run-1")
    assert await runs.ledger.consents.decide(consent_id, verdict, decided_by="deadline-keeper")
    assert await runs.ledger.resume(run_id, owner_id=consent_id) == 1


async def test_a_cancelled_consent_never_resumes_its_run(runs: Runs, runs_db: str) -> None:
    run_id, consent_id = await runs.waiting_on_consent("run-1")
    raw(runs_db, "UPDATE tenure_consents SET status = 'cancelled', decided_by = 'operator', decided_at = created_at "
                 "WHERE consent_id = ?", (consent_id,))
    assert await runs.ledger.resume(run_id, owner_id=consent_id) is None
    assert (await runs.ledger.get(run_id)).status is RunStatus.AWAITING_CONSENT  # type: ignore[union-attr]


async def test_a_delegated_job_resumes_its_run_only_with_an_adopted_result(runs: Runs) -> None:
    ledger = runs.ledger
    run_id = await runs.running("run-1")
    job_id = await runs.job(run_id)
    assert await ledger.park(run_id, 0, kind=WaitKind.DELEGATE, owner_id=job_id)
    assert await ledger.resume(run_id, owner_id=job_id) is None
    for status in (AgentJobStatus.ADMITTED, AgentJobStatus.PREPARING, AgentJobStatus.RUNNING):
        assert await ledger.jobs.advance(job_id, status)
        assert await ledger.resume(run_id, owner_id=job_id) is None
    assert await ledger.jobs.adopt_result(job_id, succeeded(job_id))
    assert await ledger.resume(run_id, owner_id=job_id) == 1


async def test_a_service_attempt_resumes_its_run_only_once_terminal(runs: Runs, runs_db: str) -> None:
    run_id = await runs.running("run-1")
    attempt_id = await runs.attempt(run_id)
    assert await runs.ledger.park(run_id, 0, kind=WaitKind.SERVICE, owner_id=attempt_id)
    assert await runs.ledger.resume(run_id, owner_id=attempt_id) is None
    async with AttemptLedger(runs_db) as attempts:
        await attempts.begin_submit(attempt_id, egress=EgressDecision(decision_id="egress-1", allowed=True,
                                                                      policy_revision="policy-1"))
        assert await runs.ledger.resume(run_id, owner_id=attempt_id) is None
        assert await attempts.record_accepted(attempt_id, provider_job_id="provider-1")
        assert await runs.ledger.resume(run_id, owner_id=attempt_id) is None
        assert await attempts.record_succeeded(attempt_id, result_refs=["ref-1"])
    assert await runs.ledger.resume(run_id, owner_id=attempt_id) == 1


async def test_twenty_concurrent_resumers_converge_on_one_new_sequence(runs: Runs, runs_db: str) -> None:
    run_id, consent_id = await runs.waiting_on_consent("run-1", decided=True)

    async def call(ledger: RunLedger, number: int) -> int | None:
        return await ledger.resume(run_id, owner_id=consent_id)

    outcomes = await on_ledgers(runs_db, 20, call)
    assert outcomes.count(1) == 1 and outcomes.count(None) == 19, outcomes
    assert runs.count("tenure_run_deliveries", run_id) == 2
    unsettled = raw(runs_db, "SELECT enqueue_seq FROM tenure_run_deliveries WHERE run_id = ? AND state <> 'settled'",
                    (run_id,))
    assert unsettled == [(1,)]


# --- cancellation ------------------------------------------------------------------------------


async def test_begin_cancel_freezes_the_generation_and_is_reentrant(runs: Runs) -> None:
    ledger = runs.ledger
    run_id = await runs.published("run-1")
    ticket = await ledger.begin_cancel(run_id)
    assert ticket == CancelTicket(run_id, 0, False)
    assert await ledger.begin_cancel(run_id) == ticket
    assert (await ledger.get(run_id)).status is RunStatus.CANCELLING  # type: ignore[union-attr]
    calls = runs.broker.publish_calls
    assert await ledger.publish(run_id, 0, runs.broker) is False
    assert runs.broker.publish_calls == calls
    assert await ledger.claim(run_id, 0, node="node-a") is None
    assert (await ledger.get_delivery(run_id, 0)).state is DeliveryState.PUBLISHED  # type: ignore[union-attr]


@pytest.mark.parametrize("state", ["held", "waiting", "hardware"])
async def test_every_nonterminal_run_can_be_cancelled(runs: Runs, state: str) -> None:
    ledger = runs.ledger
    if state == "held":
        run_id = (await runs.admit("run-1", hold=True)).run.run_id
    elif state == "waiting":
        run_id, consent_id = await runs.waiting_on_consent("run-1")
    else:
        run_id = await runs.running("run-1")
        assert await ledger.enter_hardware_wait(run_id, 0)
    ticket = await ledger.begin_cancel(run_id)
    assert ticket is not None and ticket.enqueue_seq == 0
    assert await ledger.release(run_id, 0) is False
    assert await ledger.leave_hardware_wait(run_id, 0) is False
    if state == "waiting":
        assert await ledger.consents.decide(consent_id, ConsentStatus.GRANTED, decided_by="bob")
        assert await ledger.resume(run_id, owner_id=consent_id) is None
    assert await ledger.finish_cancel(run_id, 0, runs.broker) is True
    assert (await ledger.get(run_id)).status is RunStatus.CANCELLED  # type: ignore[union-attr]
    assert (await ledger.get_delivery(run_id, 0)).state is DeliveryState.SETTLED  # type: ignore[union-attr]


async def test_completion_before_the_election_wins(runs: Runs) -> None:
    done = await runs.running("run-done")
    assert await runs.ledger.settle(done, 0, RunStatus.DONE)
    failed = await runs.running("run-failed")
    assert await runs.ledger.settle(failed, 0, RunStatus.FAILED, error="crash")
    for run_id, status in ((done, RunStatus.DONE), (failed, RunStatus.FAILED)):
        assert await runs.ledger.begin_cancel(run_id) is None
        assert await runs.ledger.finish_cancel(run_id, 0, runs.broker) is False
        assert (await runs.ledger.get(run_id)).status is status  # type: ignore[union-attr]
    assert await runs.ledger.begin_cancel(runs.run_id("no-such-run")) is None


async def test_cancellation_racing_completion_has_one_winner(runs: Runs, runs_db: str) -> None:
    for round_number in range(6):
        run_id = await runs.running(f"run-{round_number}")

        async def call(ledger: RunLedger, number: int) -> Any:
            if number == round_number % 2:
                return await ledger.settle(run_id, 0, RunStatus.DONE)
            return await ledger.begin_cancel(run_id)

        outcomes = await on_ledgers(runs_db, 2, call)
        settled = outcomes[round_number % 2]
        ticket = outcomes[1 - round_number % 2]
        status = (await runs.ledger.get(run_id)).status  # type: ignore[union-attr]
        if settled:
            assert ticket is None and status is RunStatus.DONE
        else:
            assert ticket == CancelTicket(run_id, 0, False) and status is RunStatus.CANCELLING


async def test_finish_cancel_with_a_failed_abort_is_unproven_then_succeeds(runs: Runs) -> None:
    ledger, broker = runs.ledger, runs.broker
    run_id = await runs.published("run-1")
    key = hop_key(run_id, 0)
    assert broker.take("agents") == key  # a worker's broker job is active
    ticket = await ledger.begin_cancel(run_id)
    assert ticket is not None
    broker.fail_aborts = 1
    error = await raises(ErrorCode.RUN_CONTAINMENT_UNPROVEN, ledger.finish_cancel(run_id, ticket.enqueue_seq, broker))
    assert error.reason == "hop_live"
    assert (await ledger.get(run_id)).status is RunStatus.CANCELLING  # type: ignore[union-attr]
    assert (await ledger.get_delivery(run_id, 0)).state is DeliveryState.PUBLISHED  # type: ignore[union-attr]
    assert broker.jobs[key].state is BrokerJobState.ACTIVE
    assert await ledger.finish_cancel(run_id, ticket.enqueue_seq, broker) is True
    assert broker.jobs[key].state is BrokerJobState.ABORTED
    assert (await ledger.get(run_id)).status is RunStatus.CANCELLED  # type: ignore[union-attr]
    assert (await ledger.get_delivery(run_id, 0)).state is DeliveryState.SETTLED  # type: ignore[union-attr]


async def test_finish_cancel_with_a_broker_that_cannot_say_is_unproven(runs: Runs) -> None:
    run_id = await runs.published("run-1")
    ticket = await runs.ledger.begin_cancel(run_id)
    runs.broker.fail_probes = 1
    await raises(ErrorCode.RUN_CONTAINMENT_UNPROVEN, runs.ledger.finish_cancel(run_id, 0, runs.broker))
    assert (await runs.ledger.get(run_id)).status is RunStatus.CANCELLING  # type: ignore[union-attr]
    assert ticket is not None and await runs.ledger.finish_cancel(run_id, 0, runs.broker) is True


@pytest.mark.parametrize("broker_state", [BrokerJobState.COMPLETE, BrokerJobState.FAILED, BrokerJobState.ABSENT])
async def test_a_hop_the_broker_finished_or_never_had_is_not_live(runs: Runs, broker_state: BrokerJobState) -> None:
    run_id = await runs.published("run-1")
    key = hop_key(run_id, 0)
    if broker_state is BrokerJobState.ABSENT:
        del runs.broker.jobs[key]
    else:
        runs.broker.take("agents")
        runs.broker.finish(key, failed=broker_state is BrokerJobState.FAILED)
    assert await runs.ledger.begin_cancel(run_id) is not None
    runs.broker.fail_aborts = 5  # an abort would fail: none may be needed
    assert await runs.ledger.finish_cancel(run_id, 0, runs.broker) is True


async def test_finish_cancel_needs_every_job_contained_and_every_attempt_resolved(runs: Runs, runs_db: str) -> None:
    ledger = runs.ledger
    run_id = await runs.running("run-1")
    job_id = await runs.job(run_id)
    attempt_id = await runs.attempt(run_id)
    ticket = await ledger.begin_cancel(run_id)
    assert ticket is not None
    error = await raises(ErrorCode.RUN_CONTAINMENT_UNPROVEN, ledger.finish_cancel(run_id, 0, runs.broker))
    assert error.reason == "containment_unproven"
    assert await ledger.jobs.adopt_result(job_id, result_of(job_id, AgentJobStatus.LOST, error="ambiguous start"))
    await raises(ErrorCode.RUN_CONTAINMENT_UNPROVEN, ledger.finish_cancel(run_id, 0, runs.broker))
    assert await ledger.jobs.record_cancelled(job_id)
    await raises(ErrorCode.RUN_CONTAINMENT_UNPROVEN, ledger.finish_cancel(run_id, 0, runs.broker))
    assert (await ledger.get(run_id)).status is RunStatus.CANCELLING  # type: ignore[union-attr]
    async with AttemptLedger(runs_db) as attempts:
        assert await attempts.request_cancel(attempt_id)
    assert await ledger.finish_cancel(run_id, 0, runs.broker) is True


async def test_a_late_hop_can_neither_claim_nor_settle_after_cancelling(runs: Runs) -> None:
    ledger = runs.ledger
    run_id = await runs.running("run-1")
    consent_id = await runs.consent(run_id, preauthorized=True)
    assert await ledger.begin_cancel(run_id) is not None
    assert await ledger.settle(run_id, 0, RunStatus.DONE) is False
    assert await ledger.enter_hardware_wait(run_id, 0) is False
    assert await ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent_id) is False
    assert await ledger.claim(run_id, 0, node="node-b") is None
    await raises(ErrorCode.RUN_OWNER_MISMATCH, runs.consent(run_id))
    await raises(ErrorCode.RUN_OWNER_MISMATCH, runs.job(run_id))
    assert await ledger.finish_cancel(run_id, 0, runs.broker) is True
    assert await ledger.settle(run_id, 0, RunStatus.DONE) is False
    assert await ledger.claim(run_id, 0, node="node-b") is None
    assert (await ledger.get(run_id)).status is RunStatus.CANCELLED  # type: ignore[union-attr]


async def test_finish_cancel_cancels_pending_consents_and_settles_the_delivery(runs: Runs) -> None:
    run_id, consent_id = await runs.waiting_on_consent("run-1")
    ticket = await runs.ledger.begin_cancel(run_id)
    assert ticket is not None
    assert (await runs.ledger.consents.get(consent_id)).status is ConsentStatus.PENDING  # type: ignore[union-attr]
    assert await runs.ledger.finish_cancel(run_id, ticket.enqueue_seq, runs.broker) is True
    consent = await runs.ledger.consents.get(consent_id)
    assert consent is not None and (consent.status, consent.decided_by) == (ConsentStatus.CANCELLED, CANCELLED_BY)
    assert await runs.ledger.consents.decide(consent_id, ConsentStatus.GRANTED, decided_by="bob") is False


async def test_finish_cancel_with_another_generation_answers_false(runs: Runs) -> None:
    run_id = await runs.published("run-1")
    assert await runs.ledger.finish_cancel(run_id, 0, runs.broker) is False  # not cancelling
    assert await runs.ledger.begin_cancel(run_id) is not None
    assert await runs.ledger.finish_cancel(run_id, 1, runs.broker) is False
    assert runs.broker.jobs[hop_key(run_id, 0)].state is BrokerJobState.QUEUED  # nothing fenced for a stale ticket
    assert (await runs.ledger.get(run_id)).status is RunStatus.CANCELLING  # type: ignore[union-attr]


async def test_finish_cancel_on_a_cancelled_run_repeats_the_sweep_and_answers_false(runs: Runs, runs_db: str) -> None:
    run_id = await runs.published("run-1")
    ticket = await runs.ledger.begin_cancel(run_id)
    assert ticket is not None and await runs.ledger.finish_cancel(run_id, 0, runs.broker)
    again = await runs.ledger.begin_cancel(run_id)
    assert again == CancelTicket(run_id, 0, True)
    # A pending consent a crashed writer left behind is swept by the repeat.
    straggler = unique("consent")[:36]
    created = stored_instant(runs_db, 1_800_000_000_000_000)
    raw(runs_db, "INSERT INTO tenure_consents (consent_id, run_id, tool_name, tool_call_id, payload_json, status, "
                 "decided_by, decided_at, preauthorized_by, created_at) "
                 "VALUES (?, ?, 'mail.send', 'call-1', '{}', 'pending', NULL, NULL, NULL, ?)",
        (straggler, run_id, created))
    assert await runs.ledger.finish_cancel(run_id, again.enqueue_seq, runs.broker) is False
    consent = await runs.ledger.consents.get(straggler)
    assert consent is not None and (consent.status, consent.decided_by) == (ConsentStatus.CANCELLED, CANCELLED_BY)
    assert (await runs.ledger.get(run_id)).status is RunStatus.CANCELLED  # type: ignore[union-attr]


async def test_finish_cancel_racing_the_election_never_cancels_a_hop_it_did_not_probe(runs: Runs, runs_db: str) -> None:
    run_id = await runs.published("run-1")
    key = hop_key(run_id, 0)
    ledger = runs.ledger
    original = ledger.engine.run
    elected: list[CancelTicket | None] = []

    async def elect_after_the_read(body: Any, *, write: bool = True) -> Any:
        result = await original(body, write=write)
        if not write and not elected:
            async with RunLedger(runs_db) as operator:
                elected.append(await operator.begin_cancel(run_id))
        return result

    ledger.engine.run = elect_after_the_read  # type: ignore[method-assign]
    try:
        outcome: Any
        try:
            outcome = await ledger.finish_cancel(run_id, 0, runs.broker)
        except TenureError as error:
            outcome = error.code
    finally:
        del ledger.engine.run
    assert elected == [CancelTicket(run_id, 0, False)]
    status = (await ledger.get(run_id)).status  # type: ignore[union-attr]
    # The hop is still queued at the broker: a CANCELLED Run here would be unproven.
    assert runs.broker.jobs[key].state is BrokerJobState.QUEUED
    assert (outcome, status) == (ErrorCode.RUN_CONTAINMENT_UNPROVEN, RunStatus.CANCELLING)
    assert await ledger.finish_cancel(run_id, 0, runs.broker) is True
    assert runs.broker.jobs[key].state is BrokerJobState.ABORTED


# --- reads -------------------------------------------------------------------------------------


async def test_list_runs_pages_oldest_first_and_filters_by_status_and_session(runs: Runs) -> None:
    ledger = runs.ledger
    session = unique("session")
    intent = runs.intent(session_id=session)
    ids = [(await runs.admit(f"run-{number}", intent=intent)).run.run_id for number in range(5)]
    assert await ledger.claim(ids[1], 0, node="node-a") and await ledger.claim(ids[3], 0, node="node-a")
    await runs.admit("run-elsewhere", intent=runs.intent(session_id=unique("session")))
    seen: list[str] = []
    cursor = None
    while True:
        page = await ledger.list_runs(session_id=session, after=cursor, limit=2)
        assert len(page.items) <= 2
        seen += [run.run_id for run in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == ids
    running = await ledger.list_runs(session_id=session, status=RunStatus.RUNNING)
    assert [run.run_id for run in running.items] == [ids[1], ids[3]] and running.next_cursor is None
    queued = await ledger.list_runs(session_id=session, status=RunStatus.QUEUED, limit=1)
    assert [run.run_id for run in queued.items] == [ids[0]]
    rest = await ledger.list_runs(session_id=session, status=RunStatus.QUEUED, after=queued.next_cursor)
    assert [run.run_id for run in rest.items] == [ids[2], ids[4]]
    exact = await ledger.list_runs(session_id=session, limit=5)
    assert len(exact.items) == 5 and exact.next_cursor is None
    every_running: list[str] = []
    cursor = None
    while True:  # without a session filter: every Run of the database, paged
        page = await ledger.list_runs(status=RunStatus.RUNNING, after=cursor, limit=1000)
        assert all(run.status is RunStatus.RUNNING for run in page.items)
        every_running += [run.run_id for run in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert {ids[1], ids[3]} <= set(every_running) and len(every_running) == len(set(every_running))
    for bad in ({"limit": 0}, {"limit": 1001}, {"limit": True}, {"after": "no-cursor"}, {"status": "queued"}):
        with pytest.raises(ConfigValidationError) as caught:
            await ledger.list_runs(**bad)
        assert caught.value.fields == (next(iter(bad)),)


async def test_get_delivery_reads_each_hop_and_unknown_things_are_none(runs: Runs) -> None:
    ledger = runs.ledger
    run_id, consent_id = await runs.waiting_on_consent("run-1", decided=True)
    assert await ledger.resume(run_id, owner_id=consent_id) == 1
    first, second = await ledger.get_delivery(run_id, 0), await ledger.get_delivery(run_id, 1)
    assert first is not None and (first.enqueue_seq, first.state, first.resume) == (0, DeliveryState.SETTLED, False)
    assert second is not None and (second.enqueue_seq, second.state, second.resume) == (1, DeliveryState.PENDING, True)
    assert await ledger.get_delivery(run_id, 2) is None
    unknown = runs.run_id("no-such-run")
    assert await ledger.get(unknown) is None and await ledger.get_delivery(unknown, 0) is None
    assert await ledger.consents.get(unique("consent")[:36]) is None
    assert await ledger.jobs.get(job_id_for(unique("request"))) is None


async def test_an_unknown_run_answers_false_or_none_to_every_operation(runs: Runs) -> None:
    ledger, unknown = runs.ledger, runs.run_id("no-such-run")
    assert await ledger.release(unknown, 0) is False
    assert await ledger.fail_held(unknown, 0, error="x") is False
    assert await ledger.publish(unknown, 0, runs.broker) is False
    assert await ledger.claim(unknown, 0, node="node-a") is None
    assert await ledger.enter_hardware_wait(unknown, 0) is False
    assert await ledger.leave_hardware_wait(unknown, 0) is False
    assert await ledger.park(unknown, 0, kind=WaitKind.CONSENT, owner_id="consent-1") is False
    assert await ledger.resume(unknown, owner_id="consent-1") is None
    assert await ledger.settle(unknown, 0, RunStatus.DONE) is False
    assert await ledger.begin_cancel(unknown) is None
    assert await ledger.finish_cancel(unknown, 0, runs.broker) is False
    assert runs.broker.publish_calls == 0 and runs.count("tenure_runs", unknown) == 0


async def test_a_database_failure_is_a_run_persistence_failure(tmp_path: pathlib.Path) -> None:
    sqlite3.connect(tmp_path / "empty.db").close()
    runs = Runs(RunLedger(f"sqlite:///{tmp_path}/empty.db"), f"sqlite:///{tmp_path}/empty.db")
    async with runs.ledger:
        error = await raises(ErrorCode.RUN_PERSISTENCE_FAILED, runs.admit("run-1"))
        assert error.reason == "schema_missing"
        error = await raises(ErrorCode.RUN_PERSISTENCE_FAILED, runs.ledger.get(runs.run_id("run-1")))
        assert error.reason == "schema_missing"
    async with RunLedger(f"sqlite:///{tmp_path}/missing/runs.db") as ledger:
        error = await raises(ErrorCode.RUN_PERSISTENCE_FAILED, ledger.begin_cancel(runs.run_id("run-1")))
        assert error.reason == "database_missing" and error.__cause__ is None
    assert sorted(path.name for path in tmp_path.iterdir()) == ["empty.db"]
    closed = RunLedger(f"sqlite:///{tmp_path}/empty.db")
    await closed.close()
    with pytest.raises(ConfigValidationError) as caught:
        await closed.get(runs.run_id("run-1"))
    assert caught.value.reason == "source_closed"
