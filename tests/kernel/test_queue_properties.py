"""Properties of every queue decision, over generated records, commands and times."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure.conformance.strategies.queues import NOW, records, situations
from tenure.kernel import QUEUE, Applied, Refused
from tenure.kernel.queue.commands import ClaimGranted, QueueCommandType, Submitted
from tenure.kernel.queue.machine import transition_violations
from tenure.kernel.queue.record import QueueStep, is_valid_record, record_violations
from tenure.kernel.queue.commands import command_violations
from tenure.kernel.queue.record import QueueRow


@settings(max_examples=300)
@given(record=records())
def test_generated_records_keep_every_invariant(record: QueueRow | None) -> None:
    if record is not None:
        assert record_violations(record) == []


@pytest.mark.parametrize("state", list(QueueStep), ids=lambda s: s.value)
@pytest.mark.parametrize("kind", list(QueueCommandType), ids=lambda c: c.value)
@settings(max_examples=100)
@given(data=st.data())
def test_every_decision_keeps_the_record_invariants_and_the_transition_rules(
    state: QueueStep, kind: QueueCommandType, data: st.DataObject
) -> None:
    record, command, now_us = data.draw(situations(state, kind))
    assert command_violations(command) == []  # type: ignore[arg-type]
    decision = QUEUE.decide(record, command, now_us)  # type: ignore[arg-type]
    assert transition_violations(record, command, now_us, decision) == []  # type: ignore[arg-type]
    if isinstance(decision, Applied) and decision.new_record is not None:
        assert record_violations(decision.new_record) == []


@settings(max_examples=1500)
@given(situation=situations())
def test_read_only_commands_never_change_the_record(situation: tuple[Any, Any, int]) -> None:
    record, command, now_us = situation
    decision = QUEUE.decide(record, command, now_us)
    read_only = {QueueCommandType.RECOVER_OWNED, QueueCommandType.READ_STATE_OWNED}
    if command.kind in read_only and isinstance(decision, Applied):
        assert decision.new_record == record


@settings(max_examples=1500)
@given(situation=situations(kind=QueueCommandType.SUBMIT_OWNED))
def test_a_replayed_submission_returns_the_original_ids_and_changes_nothing(
    situation: tuple[Any, Any, int],
) -> None:
    record, command, now_us = situation
    decision = QUEUE.decide(record, command, now_us)
    if isinstance(decision, Applied) and record is not None:
        assert decision.new_record == record
        assert decision.reply == Submitted(record.job_id, record.run_id, replayed=True)
        assert (record.submission_id, record.fingerprint) == (command.submission_id, command.fingerprint)


@settings(max_examples=2000)
@given(situation=situations(state=QueueStep.PENDING, kind=QueueCommandType.CLAIM_OWNED))
def test_an_owned_claim_stores_exactly_the_requested_owner_and_nonce_with_a_fresh_generation(
    situation: tuple[Any, Any, int],
) -> None:
    record, command, now_us = situation
    decision = QUEUE.decide(record, command, now_us)
    if isinstance(decision, Applied):
        new = decision.new_record
        assert isinstance(decision.reply, ClaimGranted)
        assert (new.owner_id, new.claim_token) == (command.owner_id, command.claim_token)
        assert new.generation == record.generation + 1
        assert new.lease_expires_at_us == now_us + command.lease_us > now_us
        assert new.attempts == record.attempts + 1
    else:
        assert isinstance(decision, Refused)


@given(record=records(), now_us=st.integers(NOW - 5, NOW + 5))
def test_is_valid_record_agrees_with_record_violations(record: QueueRow | None, now_us: int) -> None:
    if record is not None:
        assert is_valid_record(record) == (record_violations(record) == [])


@settings(max_examples=300)
@given(record=st.sampled_from([QueueStep.PENDING, QueueStep.CLAIMED]).flatmap(lambda state: records(state=state)),
       now_us=st.integers(NOW - 5, NOW + 5))
def test_a_set_aside_finishes_a_pending_or_claimed_row_failed_like_a_failure_and_keeps_every_invariant(
    record: QueueRow | None, now_us: int
) -> None:
    # SET_ASIDE is what a claim writes, by SQL, to a row it cannot read (specs/queue.md,
    # "Rows tenure cannot read"); on a row it could read it must be a terminal failure the
    # kernel itself could have written: failed, finished now, nothing live left, key released.
    from tenure.kernel.queue.finders import set_aside_guard
    from tenure.kernel.queue.machine import SET_ASIDE, UNREADABLE_ROW_ERROR
    from tenure.kernel.queue.record import replace_fields
    from tenure.model import JobStatus

    assert record is not None and set_aside_guard.matches(record, {})
    aside = SET_ASIDE.apply(record, None, now_us, replace_fields)
    assert record_violations(aside) == []
    assert (aside.status, aside.error_message, aside.completed_at_us) == (JobStatus.FAILED, UNREADABLE_ROW_ERROR, now_us)
    assert aside.lease_expires_at_us is None and aside.pid is None and not aside.cancel_requested
    assert aside.active_key is None
    # Identity, the claim's identity and the attempt count stay as they were.
    assert replace_fields(aside, status=record.status, error_message=record.error_message,
                          completed_at_us=record.completed_at_us, lease_expires_at_us=record.lease_expires_at_us,
                          pid=record.pid, cancel_requested=record.cancel_requested,
                          active_key=record.active_key) == record
