"""A publication on tenure's own queue in one statement: where the broker keeps its hops in
the Run ledger's own PostgreSQL database and schema (``QueueBroker``, the
``JoinedPublisher`` capability), ``RunLedger.publish`` submits the hop's task (as the queue
kernel decides a first submission) and records ``RECORD_PUBLISHED`` (as the Run kernel
decides it from the pair last seen) in one statement, both or neither
(``Engine.joined_ahead_beside``). Whatever that statement cannot settle takes the ordinary
path (the broker's submit, then the record), which stays the reference: a task already
stored under the hop's key (a replayed submit), a stale pair the kernel still publishes on,
another broker, SQLite. A stale pair the kernel refuses on the rows as locked sends
nothing at all.

Breakages the scenarios catch: the pair written whatever the insert did (its verdict
ignoring the row met, and the statement's all-or-nothing check dropped), and the task
inserted whether or not the pair is written (its gate ignoring the verdict, and the same
check dropped).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from adapter_support import raw
from run_support import PIN, broken, unique
from statements import count_statements

from tenure.adapters import QueueBroker, RunLedger
from tenure.adapters.postgres import statements
from tenure.adapters.runs.engine import RunEngine
from tenure.kernel.runs.commands import RecordPublishError
from tenure.model import BrokerJobState, DeliveryState, ErrorCode, RunIntent, RunStatus, TenureError, hop_key


class Publishing:
    """One test's ledger and QueueBroker on one database (a second broker, on another Run
    queue, plants what another process would have submitted)."""

    def __init__(self, ledger: RunLedger, broker: QueueBroker, db_url: str) -> None:
        self.ledger = ledger
        self.broker = broker
        self.db_url = db_url

    async def admit(self, name: str) -> str:
        intent = RunIntent(None, "api", "alice", frozenset(), {"name": name})
        admission = await self.ledger.admit(intent, workflow=PIN, queue="runs", priority=50,
                                            idempotency_key=unique(name))
        return admission.run.run_id

    async def stored(self, run_id: str) -> Any:
        engine: RunEngine = self.ledger.engine
        pair = await engine.read(lambda tx: engine.read_pair(tx, run_id))
        assert pair is not None
        return pair

    def tasks(self, run_id: str) -> list[tuple[Any, ...]]:
        """The hop tasks stored under the Run's hop 0 (status, priority, arguments)."""
        return [tuple(row) for row in raw(self.db_url, "SELECT status, priority, args_json FROM tenure_tasks "
                                          "WHERE submission_id = ?", (hop_key(run_id, 0),))]


@pytest.fixture
async def publishing(db_url: str) -> AsyncIterator[Publishing]:
    broker = QueueBroker(db_url, queues=["runs"], lease_seconds=3600, heartbeat_seconds=600, poll_s=60)
    try:
        async with RunLedger(db_url) as ledger:
            yield Publishing(ledger, broker, db_url)
    finally:
        await broker.close()


def _shape(pair: Any) -> tuple[Any, ...]:
    run, delivery = pair.run, pair.current
    return (run.status, run.enqueue_seq, delivery.state, delivery.publish_attempts, delivery.last_error,
            delivery.published_at_us is None)


async def _published(publishing: Publishing, run_id: str) -> Any:
    """What a publication answers: True or False, or the error's code."""
    try:
        return await publishing.ledger.publish(run_id, 0, publishing.broker)
    except TenureError as error:
        return error.code


# --- the common case ------------------------------------------------------------------------------


async def test_a_publication_on_tenures_own_queue_submits_the_hop_and_records_it_as_the_ordinary_path_does(
    publishing: Publishing, database: str,
) -> None:
    ledger, broker = publishing.ledger, publishing.broker
    joined, reference = await publishing.admit("joined"), await publishing.admit("reference")
    with count_statements() as counted:
        assert await ledger.publish(joined, 0, broker)
    if database == "postgresql":
        assert counted.total == 1, counted.texts
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(broker, "hop_insertion", lambda *_, **__: None)  # the ordinary path: submit, then record
        assert await ledger.publish(reference, 0, broker)
    assert _shape(await publishing.stored(joined)) == _shape(await publishing.stored(reference))
    assert (await publishing.stored(joined)).current.state is DeliveryState.PUBLISHED
    assert publishing.tasks(joined) == [(task[0], task[1], task[2].replace(reference, joined))
                                        for task in publishing.tasks(reference)]
    probe = await broker.probe(hop_key(joined, 0))
    assert (probe.state, probe.queue, probe.wire_priority) == (BrokerJobState.QUEUED, "runs", 50)


# --- the fallbacks --------------------------------------------------------------------------------


async def test_a_replayed_submit_keeps_the_ordinary_path_and_one_task(publishing: Publishing, database: str) -> None:
    # The hop's task is already stored (a publication whose record was lost, republished):
    # the statement meets it and writes nothing; the broker's submit replays it.
    run_id = await publishing.admit("replayed")
    await publishing.broker.publish(hop_key(run_id, 0), queue="runs", wire_priority=50)
    with count_statements() as counted:
        assert await publishing.ledger.publish(run_id, 0, publishing.broker)
    if database == "postgresql":
        assert counted.total > 1, "the joined statement wrote nothing; the ordinary path recorded it"
    assert (await publishing.stored(run_id)).current.state is DeliveryState.PUBLISHED
    assert len(publishing.tasks(run_id)) == 1


async def test_a_stale_pair_the_kernel_still_publishes_on_takes_the_ordinary_path(
    publishing: Publishing, database: str,
) -> None:
    # Another process recorded a publish error in between: the pair remembered is stale
    # but the hop is still publishable; the statement writes nothing, the ordinary path
    # publishes and records it (as it does for a Run admitted alike, published after the
    # same error by the ordinary path alone).
    run_id, reference = await publishing.admit("stale-publishable"), await publishing.admit("reference")
    async with RunLedger(publishing.db_url) as other:
        for each in (run_id, reference):
            assert await other.engine.applied(each, RecordPublishError(enqueue_seq=0, error="publish_failed:Reset"))
    with count_statements() as counted:
        assert await publishing.ledger.publish(run_id, 0, publishing.broker)
    if database == "postgresql":
        assert "wrote_c" in counted.texts[0], "the joined statement was tried first"
        assert counted.total > 1, "the joined statement wrote nothing; the ordinary path recorded it"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(publishing.broker, "hop_insertion", lambda *_, **__: None)
        assert await publishing.ledger.publish(reference, 0, publishing.broker)
    assert _shape(await publishing.stored(run_id)) == _shape(await publishing.stored(reference))
    assert (await publishing.stored(run_id)).current.state is DeliveryState.PUBLISHED
    assert len(publishing.tasks(run_id)) == 1


async def test_another_broker_keeps_the_ordinary_path(db_url: str, database: str) -> None:
    from tenure.adapters import InMemoryBroker

    async with RunLedger(db_url) as ledger:
        broker = InMemoryBroker()
        admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=PIN, queue="runs",
                                       priority=50)
        assert await ledger.publish(admission.run.run_id, 0, broker)
        assert hop_key(admission.run.run_id, 0) in broker.jobs


# --- scenarios the breakages below must fail -------------------------------------------------------


async def a_stale_pair_refused_on_the_rows_as_locked_sends_nothing(publishing: Publishing) -> None:
    """The ledger remembers the Run its admission inserted; another process cancels it.
    The publication asked on the pair remembered goes ahead to the statement, which finds
    the pair changed and inserts nothing; the kernel refuses on the rows it locked: False,
    no hop submitted, the Run as the cancellation left it."""
    run_id = await publishing.admit("stale-cancelled")
    async with RunLedger(publishing.db_url) as other:
        ticket = await other.begin_cancel(run_id)
        assert ticket is not None and await other.finish_cancel(run_id, 0, publishing.broker)
    answered = await _published(publishing, run_id)
    assert publishing.tasks(run_id) == [], "a hop submitted for a Run that was not published"
    assert answered is False
    assert (await publishing.stored(run_id)).run.status is RunStatus.CANCELLED


async def a_task_the_broker_refuses_is_never_recorded_published(publishing: Publishing) -> None:
    """Another process stored a different task under the hop's key (the hop published on
    another Run queue): the statement meets it and writes nothing; the broker's submit
    refuses the conflict, which is recorded as a publish error (RUN_BROKER_FAILED)."""
    run_id = await publishing.admit("conflict")
    planter = QueueBroker(publishing.db_url, queues=["elsewhere"], lease_seconds=3600, heartbeat_seconds=600, poll_s=60)
    try:
        await planter.publish(hop_key(run_id, 0), queue="elsewhere", wire_priority=50)
    finally:
        await planter.close()
    answered = await _published(publishing, run_id)
    delivery = (await publishing.stored(run_id)).current
    assert delivery.state is not DeliveryState.PUBLISHED, "a publication recorded where the broker refused the hop"
    assert answered is ErrorCode.RUN_BROKER_FAILED
    assert (delivery.publish_attempts, delivery.last_error is not None) == (1, True)


Scenario = Callable[[Publishing], Awaitable[None]]


def _pair_written_whatever_the_insert_did(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(statements, "BESIDE_MET_NONE", "true")
    patch.setattr(statements, "INSERTED_WITH_PAIR", "true")
    statements.clear_statement_cache()


def _inserted_whether_or_not_the_pair_is_written(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(statements, "BESIDE_GATE", "true")
    patch.setattr(statements, "INSERTED_WITH_PAIR", "true")
    statements.clear_statement_cache()


BREAKAGES: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], Scenario, str]] = {
    "the_pair_written_whatever_the_insert_did": (
        _pair_written_whatever_the_insert_did, a_task_the_broker_refuses_is_never_recorded_published,
        "a publication recorded where the broker refused the hop"),
    "the_task_inserted_whether_or_not_the_pair_is_written": (
        _inserted_whether_or_not_the_pair_is_written, a_stale_pair_refused_on_the_rows_as_locked_sends_nothing,
        "a hop submitted for a Run that was not published"),
}
"""Each breakage, the scenario that catches it, and what that scenario's failure says."""


@pytest.mark.parametrize("name", sorted(BREAKAGES))
async def test_each_scenario_holds_on_the_joined_publication_as_built(publishing: Publishing, name: str) -> None:
    await BREAKAGES[name][1](publishing)


@pytest.mark.parametrize("name", sorted(BREAKAGES))
@pytest.mark.parametrize("database", ["postgresql"])
async def test_each_broken_joined_publication_is_caught_by_its_scenario(publishing: Publishing, name: str) -> None:
    breakage, scenario, message = BREAKAGES[name]
    with broken(breakage, after=statements.clear_statement_cache), pytest.raises(AssertionError, match=message):
        await scenario(publishing)
