"""Each finder selects exactly the rows its kernel guard accepts (kernel data against
kernel rules; tests/adapters/core/test_store_conformance.py then holds every database's SQL to the
finders). A finder that drifted from the guards would hand the kernel rows it refuses
(harmless but slow) or hide rows it would take (lost work): both fail here."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from tenure.conformance.strategies.attempts import attempt_records
from tenure.conformance.strategies.queues import NOW, TOKENS, queue_names_for, records
from tenure.kernel.attempts import finders as attempt_finders
from tenure.kernel.attempts.record import AttemptRow
from tenure.kernel.core import Applied
from tenure.kernel.queue import finders
from tenure.kernel.queue.commands import ClaimLegacy, ClaimOwned, ExpireLease, PurgeFinished
from tenure.kernel.queue.machine import QUEUE, QueueRefusal
from tenure.kernel.queue.record import QueueRow, QueueStep, dedupe_key_of
from tenure.model import UNRESOLVED_STATES, JobStatus, QueueKind

times = st.integers(NOW - 10**12, NOW + 10**12) | st.integers(NOW - 3, NOW + 3)


def _claimable(record: QueueRow, command: object, now: int) -> bool:
    """The kernel would take the row: a claim, or the overflow conflict (which it raises
    rather than skip); never a refusal as ineligible."""
    rule = QUEUE.select_rule(record, command, now)  # type: ignore[arg-type]
    return not rule.refusal or rule.outcome is QueueRefusal.GENERATION_EXHAUSTED


@given(record=records().filter(lambda r: r is not None), now=times)
def test_eligible_selects_exactly_what_an_owned_claim_with_a_fresh_nonce_takes(record: QueueRow, now: int) -> None:
    fresh = ClaimOwned(owner_id="w", claim_token="fresh", nonce_already_stored=False, lease_us=1)
    assert finders.eligible.matches(record, {"now": now}) == _claimable(record, fresh, now)


@given(record=records().filter(lambda r: r is not None), now=times)
def test_eligible_legacy_selects_exactly_what_a_legacy_claim_takes(record: QueueRow, now: int) -> None:
    assert finders.eligible_legacy.matches(record, {"now": now}) == _claimable(record, ClaimLegacy(owner_id="w", lease_us=1), now)


@given(record=records().filter(lambda r: r is not None), now=times)
def test_claimable_selects_exactly_what_a_claim_with_a_fresh_nonce_applies_to(record: QueueRow, now: int) -> None:
    fresh = ClaimOwned(owner_id="w", claim_token="fresh", nonce_already_stored=False, lease_us=1)
    assert finders.claimable.matches(record, {"now": now}) == isinstance(QUEUE.decide(record, fresh, now), Applied)
    legacy = ClaimLegacy(owner_id="w", lease_us=1)
    assert finders.claimable_legacy.matches(record, {"now": now}) == isinstance(QUEUE.decide(record, legacy, now), Applied)


@given(record=records().filter(lambda r: r is not None), now=times)
def test_expired_selects_exactly_what_the_sweep_settles(record: QueueRow, now: int) -> None:
    assert finders.expired.matches(record, {"now": now}) == isinstance(QUEUE.decide(record, ExpireLease(), now), Applied)


@given(record=records().filter(lambda r: r is not None), cutoff=times)
def test_finished_before_selects_exactly_what_retention_deletes(record: QueueRow, cutoff: int) -> None:
    applied = isinstance(QUEUE.decide(record, PurgeFinished(older_than_us=cutoff), NOW), Applied)
    assert finders.finished_before.matches(record, {"cutoff": cutoff}) == applied


@given(record=records().filter(lambda r: r is not None), token=st.sampled_from(TOKENS))
def test_by_token_and_tokens_stored_select_the_rows_storing_the_token(record: QueueRow, token: str) -> None:
    assert finders.by_token.matches(record, {"claim_token": token}) == (record.claim_token == token)
    assert finders.tokens_stored.matches(record, {"tokens": [token, "other"]}) == (record.claim_token == token)


@given(record=records().filter(lambda r: r is not None), data=st.data())
def test_locate_selects_every_row_sharing_an_identity_and_meets_follow_the_spec(record: QueueRow, data: st.DataObject) -> None:
    keys = {
        "submission_id": data.draw(st.sampled_from([record.submission_id, "sub-other", None])),
        "job_id": data.draw(st.sampled_from([record.job_id, "job-other"])),
        "run_id": data.draw(st.sampled_from([record.run_id, "run-other", None])),
        "key": data.draw(st.sampled_from([dedupe_key_of(record), "key-other", None])),
    }
    shares = (
        (keys["submission_id"] is not None and record.submission_id == keys["submission_id"])
        or record.job_id == keys["job_id"]
        or (record.queue.value == "pipeline" and keys["run_id"] is not None and record.run_id == keys["run_id"])
        or (keys["key"] is not None and dedupe_key_of(record) == keys["key"])
    )
    assert finders.locate(record.queue).matches(record, keys) == shares


@given(record=attempt_records().filter(lambda r: r is not None), data=st.data())
def test_unresolved_selects_exactly_the_unresolved_attempts_after_the_cursor(record: AttemptRow, data: st.DataObject) -> None:
    assert attempt_finders.unresolved.matches(record, {}) == (record.state in UNRESOLVED_STATES)
    after_created = data.draw(st.sampled_from([record.created_at_us - 1, record.created_at_us, record.created_at_us + 1]))
    after_id = data.draw(st.sampled_from(["attempt-0", record.attempt_id, "attempt-9"]))
    after = (record.created_at_us, record.attempt_id) > (after_created, after_id)
    expected = record.state in UNRESOLVED_STATES and after
    assert attempt_finders.unresolved_after.matches(record, {"after_created": after_created, "after_id": after_id}) == expected


@given(record=records().filter(lambda r: r is not None and r.status.value == "pending"))
def test_the_eligibility_properties_have_teeth_a_due_row_matches_and_a_future_one_does_not(record: QueueRow) -> None:
    if record.attempts < record.max_attempts:
        assert finders.eligible.matches(record, {"now": record.fires_at_us})
    assert not finders.eligible.matches(record, {"now": record.fires_at_us - 1})


@given(record=records().filter(lambda r: r is not None), now=times, data=st.data())
def test_the_task_finders_select_exactly_what_a_claim_serving_those_queues_takes(
    record: QueueRow, now: int, data: st.DataObject
) -> None:
    queues = data.draw(queue_names_for(record).filter(lambda names: names is not None))
    parameters = {"now": now, "queues": list(queues)}
    fresh = ClaimOwned(owner_id="w", claim_token="fresh", nonce_already_stored=False, lease_us=1, queue_names=queues)
    legacy = ClaimLegacy(owner_id="w", lease_us=1, queue_names=queues)
    assert finders.eligible_tasks.matches(record, parameters) == _claimable(record, fresh, now)
    assert finders.eligible_tasks_legacy.matches(record, parameters) == _claimable(record, legacy, now)
    assert finders.claimable_tasks.matches(record, parameters) == isinstance(QUEUE.decide(record, fresh, now), Applied)
    assert finders.claimable_tasks_legacy.matches(record, parameters) == isinstance(QUEUE.decide(record, legacy, now), Applied)
    # One queue: the equality finders select exactly what a claim serving that queue takes.
    one = (queues[0],)
    single = {"now": now, "queue": one[0]}
    fresh_one = dataclasses.replace(fresh, queue_names=one)
    legacy_one = dataclasses.replace(legacy, queue_names=one)
    assert finders.eligible_task_queue.matches(record, single) == _claimable(record, fresh_one, now)
    assert finders.eligible_task_queue_legacy.matches(record, single) == _claimable(record, legacy_one, now)
    assert finders.claimable_task_queue.matches(record, single) == isinstance(QUEUE.decide(record, fresh_one, now), Applied)
    assert finders.claimable_task_queue_legacy.matches(record, single) == isinstance(
        QUEUE.decide(record, legacy_one, now), Applied)


@given(base=records(state=QueueStep.PENDING, queue=QueueKind.TASK))
def test_tasks_are_taken_by_priority_then_due_time_then_job_id(base: QueueRow) -> None:
    rows = [
        dataclasses.replace(base, job_id=job_id, priority=priority, fires_at_us=fires_at, attempts=0,
                            max_attempts=3, queue_name="emails")
        for job_id, priority, fires_at in [("b", 0, 1), ("a", 0, 1), ("c", 50, 9), ("d", 50, 2), ("e", 100, 99)]
    ]
    assert [row.job_id for row in finders.eligible_tasks.sorted(rows)] == ["e", "d", "c", "a", "b"]


@given(record=records().filter(lambda r: r is not None), cutoff=times, status=st.sampled_from(
    [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED]))
def test_finished_before_with_status_selects_exactly_what_retention_deletes_of_that_status(
    record: QueueRow, cutoff: int, status: JobStatus
) -> None:
    applied = isinstance(QUEUE.decide(record, PurgeFinished(older_than_us=cutoff), NOW), Applied)
    selected = finders.finished_before_with_status.matches(record, {"cutoff": cutoff, "status": status})
    assert selected == (applied and record.status is status)


@given(record=records(queue=QueueKind.TASK).filter(lambda r: r is not None), data=st.data())
def test_a_listing_selects_exactly_the_rows_with_the_values_asked(record: QueueRow, data: st.DataObject) -> None:
    wanted = data.draw(st.fixed_dictionaries({}, optional={
        "status": st.sampled_from(JobStatus), "queue_name": st.sampled_from(["emails", "reports"]),
        "task_name": st.sampled_from(["send_welcome", "other"])}))
    finder = finders.listed(**{field: True for field in wanted})
    assert finder.matches(record, wanted) == all(getattr(record, field) == value for field, value in wanted.items())
