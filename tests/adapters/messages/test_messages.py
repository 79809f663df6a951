"""Messages to a Run (``RunLedger.messages``, ``RunContext.receive``; ``specs/messages.md``):
a message sent before its receive is taken at once, one sent while the Run waits resumes
it, a topic's messages are delivered in order and each once, another topic's message
wakes nobody, a receive's timeout resumes its Run through the relays, a replayed receive
answers what it answered, a replayed send answers what it stored (changed content is
refused), a finished Run takes no message, a hop that lost its Run takes none either,
and a Run's terminal truth cancels its waiting receives. Every test runs on SQLite and
PostgreSQL."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from polling import until
from run_support import (
    Runs,
    admit,
    ledger,  # noqa: F401 - fixture
    parked_and_ended,
    ports,
    raises,
    runs,  # noqa: F401 - fixture
    runs_db,  # noqa: F401 - fixture
    serving,
    status_of,
    worker,
)

from tenure.adapters import InMemoryBroker, RunLedger, Workflows
from tenure.adapters.runs.ledger import time_out_due_receives
from tenure.adapters.runs.workflows import HopLost, RunContext
from tenure.kernel.messages.machine import DEADLINE_OWNER
from tenure.kernel.runs.machine import CANCELLED_BY, SETTLED_BY
from tenure.model import ConfigValidationError, ErrorCode, MessageStatus, ReceiveAnswer, RunStatus, WaitKind

SHORT_S = 0.3
"""A receive timeout that passes within the test (a relay round applies it)."""


def receiver(flows: Workflows, seen: list[Any], *, timeout_s: float | None = None) -> None:
    """``wait``: one receive of topic ``go``; returns what it answered."""
    @flows.workflow("wait", "1")
    async def wait(ctx: RunContext) -> dict[str, Any]:
        answer = await ctx.receive("go", key="@1", timeout_s=timeout_s, state={"waiting": True})
        seen.append((ctx.enqueue_seq, ctx.resumed, answer, ctx.receive_answer, ctx.state))
        return {"status": answer.status.value, "message": answer.message, "sequence": answer.sequence}


def two_receiver(flows: Workflows, seen: list[Any]) -> None:
    """``two``: two receives of topic ``go`` (keys ``@1`` and ``@2``, as a replay layer names them)."""
    @flows.workflow("two", "1")
    async def two(ctx: RunContext) -> dict[str, Any]:
        first = await ctx.receive("go", key="@1")
        second = await ctx.receive("go", key="@2")
        seen.append((ctx.enqueue_seq, first.message, second.message))
        return {"messages": [first.message, second.message], "sequences": [first.sequence, second.sequence]}


async def parked_on_receive(ledger: RunLedger, runs: Runs, key: str = "run-1", *, topic: str = "go",
                            receive_key: str = "@1", timeout_s: float | None = None) -> tuple[str, str]:
    """A Run parked at sequence 0 on a pending receive (the seed's order: receive, park)."""
    run_id = await runs.running(key)
    slot = await ledger.messages.receive(run_id, 0, topic, key=receive_key, timeout_s=timeout_s)
    assert slot.status is MessageStatus.PENDING and slot.answer is None
    assert await ledger.park(run_id, 0, kind=WaitKind.MESSAGE, owner_id=slot.slot_id)
    return run_id, slot.slot_id


# --- through a Run worker: what a workflow sees ----------------------------------------------------


async def test_a_message_sent_before_the_recipient_waits_is_received_at_once_without_a_park(ledger: RunLedger) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []
    receiver(flows, seen)
    run_id = await admit(ledger, flows.pin("wait", "1"))
    sent = await ledger.messages.send(run_id, "go", {"answer": 42})
    assert (sent.status, sent.sequence) == (MessageStatus.SENT, 1)
    async with serving(worker(ledger, broker, flows)):
        await ledger.publish(run_id, 0, broker)
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (done.status, done.enqueue_seq) == (RunStatus.DONE, 0)  # one hop: it never parked
    assert done.result == {"status": "received", "message": {"answer": 42}, "sequence": 1}
    [(seq, resumed, answer, resumed_answer, _)] = seen
    assert (seq, resumed, resumed_answer) == (0, False, None)
    assert (answer.message_id, answer.receive_id, answer.key) == (sent.message_id, sent.slot_id, "@1")
    [slot] = await ledger.messages.list(run_id)
    assert (slot.status, slot.receive_key, slot.message) == (MessageStatus.RECEIVED, "@1", {"answer": 42})


async def test_a_message_sent_while_the_run_waits_resumes_it_and_the_next_hop_gets_it(ledger: RunLedger) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []
    receiver(flows, seen)
    run_id = await admit(ledger, flows.pin("wait", "1"))
    async with serving(worker(ledger, broker, flows)) as runner:
        await ledger.publish(run_id, 0, broker)
        parked = await parked_and_ended(ledger, runner, run_id, RunStatus.AWAITING_MESSAGE)
        assert parked.owner_kind is WaitKind.MESSAGE
        waiting = await ledger.messages.get(parked.owner_id)
        assert waiting is not None and (waiting.status, waiting.receive_key) == (MessageStatus.PENDING, "@1")
        sent = await ledger.messages.send(run_id, "go", {"answer": 7}, broker=broker)
        assert (sent.status, sent.slot_id, sent.sequence) == (MessageStatus.RECEIVED, parked.owner_id, 1)
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (done.status, done.enqueue_seq) == (RunStatus.DONE, 1)
    assert done.result == {"status": "received", "message": {"answer": 7}, "sequence": 1}
    [(seq, resumed, answer, resumed_answer, state)] = seen  # the first hop parked: it saw nothing
    assert (seq, resumed, state) == (1, True, {"waiting": True})
    assert answer == resumed_answer and answer.received and answer.message_id == sent.message_id


async def test_two_messages_on_one_topic_are_delivered_in_order_each_once_across_two_receives(
    ledger: RunLedger,
) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []
    two_receiver(flows, seen)
    run_id = await admit(ledger, flows.pin("two", "1"))
    async with serving(worker(ledger, broker, flows)) as runner:
        await ledger.publish(run_id, 0, broker)
        await parked_and_ended(ledger, runner, run_id, RunStatus.AWAITING_MESSAGE)
        # Both sent while the Run waits on its first receive: the first fills it, the
        # second is kept for the next receive.
        first = await ledger.messages.send(run_id, "go", "first", broker=broker)
        second = await ledger.messages.send(run_id, "go", "second", broker=broker)
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (first.status, first.sequence, second.status, second.sequence) == (
        MessageStatus.RECEIVED, 1, MessageStatus.SENT, 2)
    assert (done.status, done.enqueue_seq) == (RunStatus.DONE, 1)  # the second receive did not park
    assert done.result == {"messages": ["first", "second"], "sequences": [1, 2]}
    assert seen == [(1, "first", "second")]  # the resumed hop replayed @1 and took the next at @2
    slots = sorted(await ledger.messages.list(run_id), key=lambda slot: slot.sequence or 0)
    assert [(slot.receive_key, slot.message, slot.status) for slot in slots] == [
        ("@1", "first", MessageStatus.RECEIVED), ("@2", "second", MessageStatus.RECEIVED)]


async def test_a_receive_timeout_resumes_the_run_with_timed_out_through_the_relays(ledger: RunLedger) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []
    receiver(flows, seen, timeout_s=SHORT_S)
    run_id = await admit(ledger, flows.pin("wait", "1"))
    async with serving(worker(ledger, broker, flows)) as runner:
        await ledger.publish(run_id, 0, broker)
        parked = await parked_and_ended(ledger, runner, run_id, RunStatus.AWAITING_MESSAGE)
        waiting = await ledger.messages.get(parked.owner_id)
        assert waiting is not None and waiting.expires_at is not None
        assert waiting.expires_at - waiting.created_at == dt.timedelta(seconds=SHORT_S)
        expires_at = waiting.expires_at

        async def passed() -> bool:
            return await ledger.database_now() >= expires_at

        await until(passed, what="the receive's deadline")
        await ledger.relay(ports(ledger, broker))
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (done.status, done.enqueue_seq) == (RunStatus.DONE, 1)
    assert done.result == {"status": "timed_out", "message": None, "sequence": None}
    [(seq, resumed, answer, resumed_answer, _)] = seen
    assert (seq, resumed, answer.timed_out, answer == resumed_answer) == (1, True, True, True)
    timed_out = await ledger.messages.get(parked.owner_id)
    assert timed_out is not None and (timed_out.status, timed_out.decided_by) == (MessageStatus.TIMED_OUT, DEADLINE_OWNER)
    assert timed_out.decided_at is not None and timed_out.decided_at >= expires_at  # never before its deadline


async def test_a_hop_that_lost_its_run_gets_hop_lost_from_receive_and_takes_no_message(
    ledger: RunLedger, runs: Runs,
) -> None:
    run_id = await runs.running()
    sent = await ledger.messages.send(run_id, "go", {"n": 1})
    run = await ledger.get(run_id)
    assert run is not None and await ledger.begin_cancel(run_id) is not None
    context = RunContext(run, 0, False, None, None, None, None, ledger, runs.broker)
    with pytest.raises(HopLost):
        await context.receive("go", key="@1")
    [slot] = await ledger.messages.list(run_id)
    assert (slot.slot_id, slot.status, slot.receive_key) == (sent.slot_id, MessageStatus.SENT, None)


# --- the ledger's messages -------------------------------------------------------------------------


async def test_a_message_on_another_topic_does_not_wake_the_receive(ledger: RunLedger, runs: Runs) -> None:
    run_id, slot_id = await parked_on_receive(ledger, runs)
    other = await ledger.messages.send(run_id, "stop", {"n": 1}, broker=runs.broker)
    assert (other.status, other.sequence, other.receive_key) == (MessageStatus.SENT, 1, None)
    run = await ledger.get(run_id)
    waiting = await ledger.messages.get(slot_id)
    assert run is not None and (run.status, run.owner_id) == (RunStatus.AWAITING_MESSAGE, slot_id)
    assert waiting is not None and waiting.status is MessageStatus.PENDING
    # Its own topic does, and is numbered on its own.
    mine = await ledger.messages.send(run_id, "go", {"n": 2}, broker=runs.broker)
    assert (mine.slot_id, mine.status, mine.sequence) == (slot_id, MessageStatus.RECEIVED, 1)
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.enqueue_seq) == (RunStatus.QUEUED, 1)


async def test_a_replayed_receive_with_the_same_key_answers_the_same_message_never_a_second_one(
    ledger: RunLedger, runs: Runs,
) -> None:
    run_id = await runs.running()
    first = await ledger.messages.send(run_id, "go", "first")
    second = await ledger.messages.send(run_id, "go", "second")
    taken = await ledger.messages.receive(run_id, 0, "go", key="@1")
    again = await ledger.messages.receive(run_id, 0, "go", key="@1")
    assert taken == again and taken.answer is not None and taken.answer.message == "first"
    assert taken.slot_id == first.slot_id
    assert (await ledger.messages.get(second.slot_id)).status is MessageStatus.SENT  # type: ignore[union-attr]
    nxt = await ledger.messages.receive(run_id, 0, "go", key="@2")
    assert nxt.answer is not None and (nxt.answer.message, nxt.answer.sequence) == ("second", 2)
    # A pending receive asked again is the same pending receive (a hop that died before
    # its park asks again): no second receive, no message taken twice.
    pending = await ledger.messages.receive(run_id, 0, "go", key="@3")
    assert pending.status is MessageStatus.PENDING
    assert await ledger.messages.receive(run_id, 0, "go", key="@3") == pending
    assert len(await ledger.messages.list(run_id)) == 3


async def test_the_same_receive_key_for_another_topic_is_refused(ledger: RunLedger, runs: Runs) -> None:
    run_id = await runs.running()
    await ledger.messages.receive(run_id, 0, "go", key="@1")
    error = await raises(ErrorCode.RUN_MESSAGE_CONFLICT, ledger.messages.receive(run_id, 0, "stop", key="@1"))
    assert error.reason == "receive_changed"
    assert len(await ledger.messages.list(run_id)) == 1


async def test_a_send_replayed_by_message_id_answers_the_same_and_changed_content_is_refused(
    ledger: RunLedger, runs: Runs,
) -> None:
    run_id = await runs.running()
    stored = await ledger.messages.send(run_id, "go", {"a": 1}, message_id="m-1")
    assert await ledger.messages.send(run_id, "go", {"a": 1}, message_id="m-1") == stored
    for topic, message in (("go", {"a": 2}), ("stop", {"a": 1})):
        error = await raises(ErrorCode.RUN_MESSAGE_CONFLICT,
                             ledger.messages.send(run_id, topic, message, message_id="m-1"))
        assert error.reason == "message_changed" and "m-1" not in str(error) and run_id not in str(error)
    assert [slot.slot_id for slot in await ledger.messages.list(run_id)] == [stored.slot_id]
    # Delivered since: the replay answers the delivered message, and takes no receive.
    taken = await ledger.messages.receive(run_id, 0, "go", key="@1")
    waiting = await ledger.messages.receive(run_id, 0, "go", key="@2")
    replayed = await ledger.messages.send(run_id, "go", {"a": 1}, message_id="m-1")
    assert replayed == taken and replayed.status is MessageStatus.RECEIVED
    assert (await ledger.messages.get(waiting.slot_id)) == waiting  # still waiting
    # Message IDs are the Run's own: another Run may use the same one.
    other = await runs.running("run-2")
    assert (await ledger.messages.send(other, "go", {"b": 1}, message_id="m-1")).run_id == other


@pytest.mark.parametrize("finished", ["done", "failed", "cancelling", "cancelled", "unknown"])
async def test_a_message_to_a_finished_or_unknown_run_is_refused_and_nothing_is_stored(
    ledger: RunLedger, runs: Runs, finished: str,
) -> None:
    run_id = await runs.running()
    if finished in ("done", "failed"):
        status = RunStatus.DONE if finished == "done" else RunStatus.FAILED
        assert await ledger.settle(run_id, 0, status, error=None if finished == "done" else "boom")
    elif finished in ("cancelling", "cancelled"):
        assert await ledger.begin_cancel(run_id) is not None
        if finished == "cancelled":
            assert await ledger.finish_cancel(run_id, 0, runs.broker)
    target = runs.run_id("never-admitted") if finished == "unknown" else run_id
    error = await raises(ErrorCode.RUN_MESSAGE_REFUSED, ledger.messages.send(target, "go", {"n": 1},
                                                                               message_id="m-1"))
    assert error.reason == ("run_not_found" if finished == "unknown" else "run_finished")
    assert target not in str(error) and "m-1" not in str(error)
    assert await ledger.messages.list(target) == ()


async def test_a_receive_of_a_hop_that_does_not_hold_its_run_is_refused_and_takes_nothing(
    ledger: RunLedger, runs: Runs,
) -> None:
    run_id, slot_id = await parked_on_receive(ledger, runs)
    sent = await ledger.messages.send(run_id, "go", "resumes it")  # the Run is QUEUED at sequence 1 now
    later = await ledger.messages.send(run_id, "go", "for the next receive")
    assert sent.slot_id == slot_id and later.status is MessageStatus.SENT
    assert await ledger.claim(run_id, 1, node="node-a") is not None
    # The old hop (sequence 0) asks for a new receive: fenced, nothing taken.
    error = await raises(ErrorCode.RUN_OWNER_MISMATCH, ledger.messages.receive(run_id, 0, "go", key="@2"))
    assert error.reason == "hop_lost"
    assert (await ledger.messages.get(later.slot_id)) == later
    # The hop holding the Run takes it.
    taken = await ledger.messages.receive(run_id, 1, "go", key="@2")
    assert taken.slot_id == later.slot_id and taken.status is MessageStatus.RECEIVED


async def test_a_send_resumes_the_waiting_run_without_a_broker_and_the_relays_publish_it(
    ledger: RunLedger, runs: Runs,
) -> None:
    run_id, _ = await parked_on_receive(ledger, runs)
    await ledger.messages.send(run_id, "go", {"n": 1})
    run = await ledger.get(run_id)
    delivery = await ledger.get_delivery(run_id, 1)
    assert run is not None and (run.status, run.enqueue_seq) == (RunStatus.QUEUED, 1)
    assert delivery is not None and delivery.resume and delivery.publish_attempts == 0  # left to the relays
    await ledger.relay(ports(ledger, runs.broker))
    assert (await ledger.get_delivery(run_id, 1)).publish_attempts == 1  # type: ignore[union-attr]


async def test_a_late_message_after_a_timeout_is_kept_for_the_next_receive(ledger: RunLedger, runs: Runs) -> None:
    run_id, slot_id = await parked_on_receive(ledger, runs, timeout_s=SHORT_S)
    waiting = await ledger.messages.get(slot_id)
    assert waiting is not None and waiting.expires_at is not None
    expires_at = waiting.expires_at

    async def timed_out() -> int:
        if await ledger.database_now() < expires_at:
            return 0
        return await time_out_due_receives(ledger, broker=runs.broker)

    assert await until(timed_out, what="the receive's deadline") == 1
    late = await ledger.messages.send(run_id, "go", "late")
    assert (late.status, late.sequence) == (MessageStatus.SENT, 1)
    answered = await ledger.messages.get(slot_id)
    assert answered is not None and answered.answer == ReceiveAnswer(
        status=MessageStatus.TIMED_OUT, topic="go", key="@1", receive_id=slot_id)
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.enqueue_seq) == (RunStatus.QUEUED, 1)


async def test_settling_a_run_cancels_its_waiting_receive_and_a_cancellation_does_too(
    ledger: RunLedger, runs: Runs,
) -> None:
    # A receive created and never parked on (its hop settles instead).
    running = await runs.running()
    created = await ledger.messages.receive(running, 0, "go", key="@1")
    assert await ledger.settle(running, 0, RunStatus.DONE)
    swept = await ledger.messages.get(created.slot_id)
    assert swept is not None and (swept.status, swept.decided_by) == (MessageStatus.CANCELLED, SETTLED_BY)
    # A Run parked on its receive, cancelled.
    run_id, slot_id = await parked_on_receive(ledger, runs, "run-2")
    assert await ledger.begin_cancel(run_id) is not None
    assert await ledger.finish_cancel(run_id, 0, runs.broker)
    cancelled = await ledger.messages.get(slot_id)
    assert cancelled is not None and (cancelled.status, cancelled.decided_by) == (MessageStatus.CANCELLED, CANCELLED_BY)
    assert cancelled.answer is None
    await raises(ErrorCode.RUN_MESSAGE_REFUSED, ledger.messages.send(run_id, "go", "too late"))
    assert (await ledger.messages.get(slot_id)) == cancelled


@pytest.mark.parametrize(("call", "field"), [
    (lambda messages, run_id: messages.send(run_id, "", 1), "topic"),
    (lambda messages, run_id: messages.send(run_id, "-go", 1), "topic"),
    (lambda messages, run_id: messages.send(run_id, "go\n", 1), "topic"),
    (lambda messages, run_id: messages.send(run_id, "g" * 65, 1), "topic"),
    (lambda messages, run_id: messages.send(run_id, "go", float("nan")), "message"),
    (lambda messages, run_id: messages.send(run_id, "go", 1, message_id=""), "message_id"),
    (lambda messages, run_id: messages.send(run_id, "go", 1, broker="not a broker"), "broker"),
    (lambda messages, run_id: messages.receive(run_id, 0, "go", key=""), "key"),
    (lambda messages, run_id: messages.receive(run_id, 0, "go", key="@1", timeout_s=0), "timeout_s"),
    (lambda messages, run_id: messages.receive(run_id, 0, "go", key="@1", timeout_s=True), "timeout_s"),
    (lambda messages, run_id: messages.receive(run_id, -1, "go", key="@1"), "enqueue_seq"),
], ids=["empty topic", "topic punctuation first", "topic newline", "long topic", "nan", "empty message ID",
        "broker", "empty key", "zero timeout", "bool timeout", "negative sequence"])
async def test_invalid_messages_and_receives_are_refused_before_any_database_work(
    ledger: RunLedger, runs: Runs, call: Any, field: str,
) -> None:
    run_id = await runs.running()
    with pytest.raises(ConfigValidationError) as caught:
        await call(ledger.messages, run_id)
    assert caught.value.fields == (field,)
    assert await ledger.messages.list(run_id) == ()


# --- between the receive and its park; a hop that died there --------------------------------------


async def test_a_message_sent_between_the_receive_and_its_park_resumes_the_run_once_it_parks(
    ledger: RunLedger, runs: Runs,
) -> None:
    run_id = await runs.running()
    waiting = await ledger.messages.receive(run_id, 0, "go", key="@1")
    filled = await ledger.messages.send(run_id, "go", "early", broker=runs.broker)  # the Run is not parked yet
    assert (filled.slot_id, filled.status) == (waiting.slot_id, MessageStatus.RECEIVED)
    run = await ledger.get(run_id)
    assert run is not None and run.status is RunStatus.RUNNING  # nothing to resume yet
    # The hop parks on its receive, answered already, and resumes it (its _refire) or the relays do.
    assert await ledger.park(run_id, 0, kind=WaitKind.MESSAGE, owner_id=waiting.slot_id)
    await ledger.relay(ports(ledger, runs.broker))
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.enqueue_seq) == (RunStatus.QUEUED, 1)


async def test_a_hop_that_died_between_its_receive_and_its_park_is_reparked_on_it_by_reconciliation(
    ledger: RunLedger, runs: Runs,
) -> None:
    node = "node-receives"
    run_id = await runs.running(node=node)
    waiting = await ledger.messages.receive(run_id, 0, "go", key="@1", timeout_s=3600)
    assert await ledger.checkpoints.save(run_id, 0, state={"step": 1}, owner_kind=WaitKind.MESSAGE,
                                         owner_id=waiting.slot_id)
    # The process dies here, before its park; the next boot reconciles its node.
    cutoff = await ledger.database_now() + dt.timedelta(microseconds=1)
    await ledger.reconcile(ports(ledger, runs.broker), node=node, boot_cutoff=cutoff)
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.owner_kind, run.owner_id) == (
        RunStatus.AWAITING_MESSAGE, WaitKind.MESSAGE, waiting.slot_id)
    await ledger.messages.send(run_id, "go", "after the crash", broker=runs.broker)
    run = await ledger.get(run_id)
    assert run is not None and (run.status, run.enqueue_seq) == (RunStatus.QUEUED, 1)
    checkpoint = await ledger.checkpoints.load(run_id)
    assert checkpoint is not None and (checkpoint.owner_id, checkpoint.state) == (waiting.slot_id, {"step": 1})
