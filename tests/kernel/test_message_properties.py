"""The message kernel (``specs/messages.md``): properties of every decision over generated
situations, and each guarantee as a plain example a reviewer can read; with the Run
machine's side of it (a Run parks on a receive and resumes only from its answer). The
message mutants in kernel_mutants.py must make this file fail."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure.conformance.strategies.messages import NOW, message_records, message_row, message_situations
from tenure.conformance.strategies.runs import RUN_ID, base_run, delivery_for
from tenure.kernel.core import Applied, Decision, Refused, decide
from tenure.kernel.messages.commands import (
    CancelPending,
    Delivered,
    MessageCommandType,
    Queued,
    ReceiveMessage,
    Replayed,
    SendMessage,
    Taken,
    TimeOut,
    Waiting,
)
from tenure.kernel.messages.machine import DEADLINE_OWNER, MESSAGES, OUTCOMES, MessageRefusal
from tenure.kernel.messages.record import MessageRow, MessageStep, receive_answered
from tenure.kernel.runs.commands import OwnerEvidence, Park, Resume, Resumed
from tenure.kernel.runs.machine import CANCELLED_BY, RUNS, SETTLED_BY, RunRefusal
from tenure.kernel.runs.record import RunPair
from tenure.model import DeliveryState, ErrorCode, MessageStatus, RunStatus, WaitKind

OPEN = RunStatus.RUNNING


def applied(decision: Decision) -> Any:
    assert isinstance(decision, Applied), decision
    return decision.new_record


def refused(decision: Decision, reason: MessageRefusal | RunRefusal) -> bool:
    return isinstance(decision, Refused) and decision.reason is reason


def send(message_json: str = '{"n":1}', *, message_id: str = "m-1", topic: str = "go", run_id: str = "run-1",
         run_status: RunStatus | None = OPEN, sequence: int = 1) -> SendMessage:
    row = message_row(slot_id="slot-new", run_id=run_id, topic=topic, message_id=message_id,
                      message_json=message_json, sequence=None, sent_at_us=None, created_at_us=0)
    return SendMessage(row=row, run_status=run_status, sequence=sequence)


def receive(key: str = "@1", *, topic: str = "go", run_id: str = "run-1", hop_holds: bool = True,
            expires_in_us: int | None = None) -> ReceiveMessage:
    row = message_row(slot_id="slot-new", run_id=run_id, topic=topic, status=MessageStatus.PENDING,
                      message_id=None, message_json=None, sequence=None, sent_at_us=None, receive_key=key,
                      created_at_us=0)
    return ReceiveMessage(row=row, hop_holds=hop_holds, expires_in_us=expires_in_us)


def stored(command: Any, now: int = NOW, record: MessageRow | None = None) -> MessageRow:
    row: MessageRow = applied(decide(MESSAGES, record, command, now))
    assert MESSAGES.record_violations(row) == []
    return row


# --- properties of every decision -------------------------------------------------------------


@pytest.mark.parametrize("kind", list(MessageCommandType), ids=lambda kind: kind.value)
@settings(max_examples=150)
@given(data=st.data())
def test_every_decision_from_a_valid_slot_keeps_the_invariants_and_the_transition_rules(
    kind: MessageCommandType, data: st.DataObject,
) -> None:
    record, command, now = data.draw(message_situations(None, kind))
    assert record is None or MESSAGES.record_violations(record) == []
    decision = decide(MESSAGES, record, command, now)
    assert MESSAGES.transition_violations(record, command, now, decision) == []
    if isinstance(decision, Applied):
        assert decision.new_record is not None, "a slot is never deleted"
        assert MESSAGES.record_violations(decision.new_record) == []
    else:
        assert decision.reason in OUTCOMES


@settings(max_examples=300)
@given(record=message_records(), data=st.data())
def test_a_decided_slot_never_changes_whatever_is_sent_to_it(record: MessageRow | None, data: st.DataObject) -> None:
    # Written here, independently of the table: a message is delivered once and a
    # receive answered once.
    if record is None or record.status in (MessageStatus.SENT, MessageStatus.PENDING):
        return
    for kind in MessageCommandType:
        _, command, now = data.draw(message_situations(MessageStep(record.status.value), kind))
        decision = decide(MESSAGES, record, command, now)
        assert not isinstance(decision, Applied) or decision.new_record == record, (kind, decision)


# --- sends ------------------------------------------------------------------------------------


def test_a_message_to_an_open_run_is_stored_sent_with_its_sequence_and_times() -> None:
    decision = decide(MESSAGES, None, send(sequence=3), NOW)
    row = applied(decision)
    assert decision.reply == Queued()  # type: ignore[union-attr]
    assert (row.status, row.sequence, row.sent_at_us, row.created_at_us, row.receive_key) == (
        MessageStatus.SENT, 3, NOW, NOW, None)
    for status in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.AWAITING_MESSAGE, RunStatus.AWAITING_CONSENT):
        assert applied(decide(MESSAGES, None, send(run_status=status), NOW)).status is MessageStatus.SENT


@pytest.mark.parametrize("status", [RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.CANCELLING,
                                    None])
def test_a_message_to_a_finished_cancelling_or_missing_run_is_refused_with_nothing_stored(
    status: RunStatus | None,
) -> None:
    reason = MessageRefusal.RUN_NOT_FOUND if status is None else MessageRefusal.RUN_FINISHED
    assert refused(decide(MESSAGES, None, send(run_status=status), NOW), reason)
    waiting = stored(receive())
    assert refused(decide(MESSAGES, waiting, send(run_status=status), NOW), reason)
    assert OUTCOMES[reason] is ErrorCode.RUN_MESSAGE_REFUSED


def test_a_message_fills_the_waiting_receive_and_resumes_its_run() -> None:
    waiting = stored(receive(expires_in_us=5_000_000))
    decision = decide(MESSAGES, waiting, send(sequence=2), NOW + 7)
    row = applied(decision)
    assert decision.reply == Delivered()  # type: ignore[union-attr]
    assert (row.slot_id, row.status, row.receive_key, row.message_id, row.sequence) == (
        waiting.slot_id, MessageStatus.RECEIVED, "@1", "m-1", 2)
    assert (row.sent_at_us, row.decided_at_us, row.expires_at_us) == (NOW + 7, NOW + 7, NOW + 5_000_000)
    assert receive_answered(row)


def test_a_replayed_send_answers_the_stored_message_and_changed_content_is_refused() -> None:
    sent = stored(send())
    delivered = stored(receive(), NOW + 1, sent)
    for slot in (sent, delivered):
        decision = decide(MESSAGES, slot, send(), NOW + 2)
        assert applied(decision) == slot and decision.reply == Replayed()  # type: ignore[union-attr]
        for changed in (send('{"n":2}'), send(topic="stop")):
            assert refused(decide(MESSAGES, slot, changed, NOW + 2), MessageRefusal.MESSAGE_CHANGED)
    assert OUTCOMES[MessageRefusal.MESSAGE_CHANGED] is ErrorCode.RUN_MESSAGE_CONFLICT
    # Even once the Run finished: the sender asking again gets its answer.
    assert applied(decide(MESSAGES, sent, send(run_status=RunStatus.DONE), NOW + 3)) == sent


def test_a_message_never_fills_a_receive_of_another_topic_or_run() -> None:
    waiting = stored(receive())
    for other in (send(topic="stop"), send(run_id="run-2")):
        assert refused(decide(MESSAGES, waiting, other, NOW), MessageRefusal.OTHER_SLOT)


# --- receives ---------------------------------------------------------------------------------


def test_a_receive_takes_a_sent_message_at_once_and_only_for_the_hop_holding_its_run() -> None:
    sent = stored(send())
    assert refused(decide(MESSAGES, sent, receive(hop_holds=False), NOW + 1), MessageRefusal.HOP_LOST)
    assert OUTCOMES[MessageRefusal.HOP_LOST] is ErrorCode.RUN_OWNER_MISMATCH
    decision = decide(MESSAGES, sent, receive(), NOW + 1)
    taken = applied(decision)
    assert decision.reply == Taken()  # type: ignore[union-attr]
    assert (taken.status, taken.receive_key, taken.decided_at_us, taken.message_id) == (
        MessageStatus.RECEIVED, "@1", NOW + 1, "m-1")
    assert refused(decide(MESSAGES, sent, receive(topic="stop"), NOW + 1), MessageRefusal.OTHER_SLOT)


def test_a_receive_with_nothing_to_take_waits_with_its_deadline_and_only_for_the_hop_holding_its_run() -> None:
    assert refused(decide(MESSAGES, None, receive(hop_holds=False), NOW), MessageRefusal.HOP_LOST)
    decision = decide(MESSAGES, None, receive(expires_in_us=3_000_000), NOW)
    waiting = applied(decision)
    assert decision.reply == Waiting()  # type: ignore[union-attr]
    assert (waiting.status, waiting.expires_at_us, waiting.message_id) == (MessageStatus.PENDING, NOW + 3_000_000, None)
    assert applied(decide(MESSAGES, None, receive(), NOW)).expires_at_us is None
    assert not receive_answered(waiting)


def test_a_replayed_receive_answers_what_it_answered_and_never_takes_a_second_message() -> None:
    taken = stored(receive(), NOW + 1, stored(send()))
    for hop_holds in (True, False):
        decision = decide(MESSAGES, taken, receive(hop_holds=hop_holds), NOW + 5)
        assert applied(decision) == taken and decision.reply == Replayed()  # type: ignore[union-attr]
    waiting = stored(receive())
    assert applied(decide(MESSAGES, waiting, receive(), NOW + 1)) == waiting
    assert refused(decide(MESSAGES, waiting, receive(hop_holds=False), NOW + 1), MessageRefusal.HOP_LOST)
    timed_out = stored(TimeOut(), NOW + 10, stored(receive(expires_in_us=10)))
    assert applied(decide(MESSAGES, timed_out, receive(), NOW + 20)) == timed_out
    for slot in (taken, waiting, timed_out):
        assert refused(decide(MESSAGES, slot, receive(topic="stop"), NOW + 30), MessageRefusal.RECEIVE_CHANGED)
    assert OUTCOMES[MessageRefusal.RECEIVE_CHANGED] is ErrorCode.RUN_MESSAGE_CONFLICT
    cancelled = stored(CancelPending(decided_by=CANCELLED_BY), NOW + 1, waiting)
    assert refused(decide(MESSAGES, cancelled, receive(), NOW + 2), MessageRefusal.HOP_LOST)


# --- timeouts and sweeps ----------------------------------------------------------------------


def test_the_deadline_owner_times_a_receive_out_only_once_its_deadline_has_come() -> None:
    waiting = stored(receive(expires_in_us=5_000_000))
    deadline = NOW + 5_000_000
    for early in (NOW, deadline - 1):
        assert refused(decide(MESSAGES, waiting, TimeOut(), early), MessageRefusal.NOT_DUE)
    for due in (deadline, deadline + 1):
        row = stored(TimeOut(), due, waiting)
        assert (row.status, row.decided_by, row.decided_at_us) == (MessageStatus.TIMED_OUT, DEADLINE_OWNER, due)
        assert receive_answered(row)
    assert refused(decide(MESSAGES, stored(receive()), TimeOut(), NOW + 10**12), MessageRefusal.NOT_DUE)
    assert OUTCOMES[MessageRefusal.NOT_DUE] is None


def test_a_message_that_won_stands_and_a_late_one_is_kept_for_the_next_receive() -> None:
    waiting = stored(receive(expires_in_us=10))
    delivered = stored(send(), NOW + 1, waiting)
    assert refused(decide(MESSAGES, delivered, TimeOut(), NOW + 100), MessageRefusal.ALREADY_DECIDED)
    timed_out = stored(TimeOut(), NOW + 10, waiting)
    # The send's finder meets no waiting receive any more: a late message is stored anew.
    assert refused(decide(MESSAGES, timed_out, send(), NOW + 11), MessageRefusal.NOT_WAITING)
    assert applied(decide(MESSAGES, None, send(), NOW + 11)).status is MessageStatus.SENT


def test_only_the_runs_terminal_truth_cancels_a_waiting_receive_and_an_answer_stands() -> None:
    waiting = stored(receive())
    for sweeper in (SETTLED_BY, CANCELLED_BY):
        row = stored(CancelPending(decided_by=sweeper), NOW + 1, waiting)
        assert (row.status, row.decided_by, receive_answered(row)) == (MessageStatus.CANCELLED, sweeper, False)
    delivered = stored(send(), NOW + 1, waiting)
    assert refused(decide(MESSAGES, delivered, CancelPending(decided_by=SETTLED_BY), NOW + 2),
                   MessageRefusal.ALREADY_DECIDED)
    assert refused(decide(MESSAGES, stored(send()), CancelPending(decided_by=SETTLED_BY), NOW + 2),
                   MessageRefusal.NOT_WAITING)


def test_a_decision_is_never_dated_before_its_slot_existed() -> None:
    waiting = stored(receive(expires_in_us=1), NOW)
    assert stored(send(), NOW - 10, waiting).decided_at_us == NOW
    assert stored(CancelPending(decided_by=SETTLED_BY), NOW - 10, waiting).decided_at_us == NOW
    sent = stored(send(), NOW)
    assert stored(receive(), NOW - 10, sent).decided_at_us == NOW


# --- the Run machine's side -------------------------------------------------------------------


def _claimed() -> RunPair:
    run = base_run(status=RunStatus.RUNNING, started_at_us=NOW - 50, node="node-a")
    return RunPair(run, (delivery_for(run, DeliveryState.CLAIMED),))


def _evidence(row: MessageRow, run_id: str = RUN_ID) -> OwnerEvidence:
    return OwnerEvidence(WaitKind.MESSAGE, row.slot_id, run_id, row.status.value, row.decided_at_us is not None)


def test_a_run_parks_on_its_receive_and_resumes_only_from_its_answer() -> None:
    waiting = stored(receive(run_id=RUN_ID))
    park = Park(enqueue_seq=0, wait=WaitKind.MESSAGE, owner_id=waiting.slot_id, owner=_evidence(waiting))
    parked = applied(decide(RUNS, _claimed(), park, NOW))
    assert (parked.run.status, parked.run.owner_kind, parked.run.owner_id) == (
        RunStatus.AWAITING_MESSAGE, WaitKind.MESSAGE, waiting.slot_id)
    assert parked.current.state is DeliveryState.SETTLED
    other = dataclasses.replace(park, owner=_evidence(waiting, run_id="run-2"))
    assert refused(decide(RUNS, _claimed(), other, NOW), RunRefusal.OWNER_MISMATCH)
    cancelled = stored(CancelPending(decided_by=CANCELLED_BY), NOW + 1, waiting)
    for unanswered in (waiting, cancelled):
        resume = Resume(owner_id=waiting.slot_id, owner=_evidence(unanswered))
        assert refused(decide(RUNS, parked, resume, NOW + 2), RunRefusal.OWNER_UNDECIDED)
    for answered in (stored(send(run_id=RUN_ID), NOW + 1, waiting),
                     stored(TimeOut(), NOW + 1, stored(receive(run_id=RUN_ID, expires_in_us=1)))):
        resume = Resume(owner_id=waiting.slot_id, owner=dataclasses.replace(_evidence(answered),
                                                                            owner_id=waiting.slot_id))
        decision = decide(RUNS, parked, resume, NOW + 2)
        assert applied(decision).run.status is RunStatus.QUEUED
        assert decision.reply == Resumed(enqueue_seq=1)  # type: ignore[union-attr]
