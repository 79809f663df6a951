"""The attempt ledger on every database: the answer law, conflicts, concurrency, paging,
and failures that say what they are."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import pathlib
from typing import Any

import pytest

from adapter_support import raw
from attempt_fakes import spec
from polling import until
from tenure.adapters import AttemptLedger
from tenure.adapters.attempts.ledger import attempt_id_for
from tenure.model import (
    AttemptState,
    CancelConfirmed,
    ConfigValidationError,
    EgressDecision,
    ErrorCode,
    Found,
    LookupFailed,
    NotFound,
    ProviderFailed,
    RejectedBeforeEffect,
    TenureError,
    ToolBinding,
)


def egress(number: int = 1, *, allowed: bool = True) -> EgressDecision:
    return EgressDecision(decision_id=f"egress-{number}", allowed=allowed, policy_revision="policy-1")


@pytest.fixture
async def ledger(db_url: str) -> Any:
    async with AttemptLedger(db_url) as made:
        yield made


async def test_prepare_returns_the_derived_id_and_a_replay_returns_it_again(ledger: AttemptLedger) -> None:
    attempt_id = await ledger.prepare(spec())
    assert attempt_id == attempt_id_for("owner-1", 1)
    assert await ledger.prepare(spec()) == attempt_id
    record = await ledger.get(attempt_id)
    assert record is not None and record.state is AttemptState.PREPARED and record.transmissions == 0
    assert record.envelope == "ServiceJobAttempt@1" and record.binding == spec().binding


async def test_a_changed_spec_under_the_same_generation_conflicts_and_stores_nothing(ledger: AttemptLedger, db_url: str) -> None:
    attempt_id = await ledger.prepare(spec())
    with pytest.raises(TenureError) as caught:
        await ledger.prepare(spec(target="provider-b"))
    assert (caught.value.code, caught.value.reason) == (ErrorCode.ATTEMPT_PREPARE_CONFLICT, "spec_changed")
    assert (await ledger.get(attempt_id)).target == "provider-a"  # type: ignore[union-attr]
    assert raw(db_url, "SELECT count(*) FROM tenure_attempts") == [(1,)]


async def test_generations_follow_only_a_failed_or_cancelled_predecessor(ledger: AttemptLedger) -> None:
    first = await ledger.prepare(spec())
    assert await ledger.begin_submit(first, egress=egress()) is not None
    with pytest.raises(TenureError) as caught:
        await ledger.prepare(spec(generation=2))
    assert caught.value.code is ErrorCode.ATTEMPT_PREDECESSOR_UNRESOLVED
    assert await ledger.record_failed(first, evidence=RejectedBeforeEffect("quota"), transmission=1)
    for bad, reason in ((spec(generation=3), "generation_gap"), (spec(generation=2, key="key-owner-1-1"), "key_reused")):
        with pytest.raises(TenureError) as caught:
            await ledger.prepare(bad)
        assert (caught.value.code, caught.value.reason) == (ErrorCode.ATTEMPT_PREPARE_CONFLICT, reason)
    second = await ledger.prepare(spec(generation=2))
    assert (await ledger.get(second)).generation == 2  # type: ignore[union-attr]


async def test_after_success_no_retry_generation_is_allowed(ledger: AttemptLedger) -> None:
    first = await ledger.prepare(spec())
    await ledger.begin_submit(first, egress=egress())
    assert await ledger.record_accepted(first, provider_job_id="job-a")
    assert await ledger.record_succeeded(first, result_refs=["ref-1"])
    with pytest.raises(TenureError) as caught:
        await ledger.prepare(spec(generation=2))
    assert caught.value.reason == "predecessor_succeeded"


async def test_begin_submit_grants_one_transmission_and_a_denied_egress_returns_none(ledger: AttemptLedger) -> None:
    attempt_id = await ledger.prepare(spec(kind="lookup_only"))
    assert await ledger.begin_submit(attempt_id, egress=egress(1, allowed=False)) is None
    assert (await ledger.get(attempt_id)).state is AttemptState.PREPARED  # type: ignore[union-attr]
    transmission = await ledger.begin_submit(attempt_id, egress=egress(2))
    assert transmission is not None
    assert (transmission.number, transmission.idempotency_key, transmission.egress_decision_id) == (
        1, "key-owner-1-1", "egress-2")
    with pytest.raises(TenureError) as caught:
        await ledger.begin_submit(attempt_id, egress=egress(3))
    assert caught.value.code is ErrorCode.ATTEMPT_RESUBMIT_UNPROVEN


async def test_of_concurrent_first_submissions_exactly_one_gets_the_transmission(db_url: str) -> None:
    async with AttemptLedger(db_url) as setup:
        attempt_id = await setup.prepare(spec(kind="lookup_only"))
    ledgers = [AttemptLedger(db_url) for _ in range(6)]
    try:
        async def one(number: int, ledger: AttemptLedger) -> str:
            try:
                granted = await ledger.begin_submit(attempt_id, egress=egress(number))
            except TenureError as error:
                return error.code.value
            return "granted" if granted is not None else "none"

        outcomes = await asyncio.gather(*(one(n, ledger) for n, ledger in enumerate(ledgers)))
    finally:
        for ledger in ledgers:
            await ledger.close()
    assert sorted(outcomes) == ["attempt_resubmit_unproven"] * 5 + ["granted"]


async def test_a_no_effect_proof_outside_the_submit_lease_allows_one_resubmission(ledger: AttemptLedger) -> None:
    attempt_id = await ledger.prepare(spec(kind="lookup_only"))
    await ledger.begin_submit(attempt_id, egress=egress(1), lease_seconds=0.05)
    during = await ledger.database_now()
    assert await ledger.reconcile(attempt_id, NotFound(proves_no_effect=True), looked_up_at=during) is False
    await _lease_over(ledger, during)
    assert await ledger.reconcile(attempt_id, LookupFailed("provider down")) is False
    # Looked up while the lease was live, reported after it ended: still no proof (the
    # transmission may have landed between the lookup and now).
    assert await ledger.reconcile(attempt_id, NotFound(proves_no_effect=True), looked_up_at=during) is False
    with pytest.raises(TenureError) as caught:
        await ledger.begin_submit(attempt_id, egress=egress(2), proof=NotFound(True), looked_up_at=during)
    assert caught.value.code is ErrorCode.ATTEMPT_RESUBMIT_UNPROVEN
    after = await ledger.database_now()
    assert await ledger.reconcile(attempt_id, NotFound(proves_no_effect=True), looked_up_at=after) is True
    again = await ledger.begin_submit(attempt_id, egress=egress(2))
    assert again is not None and again.number == 2


async def _lease_over(ledger: AttemptLedger, granted_by: dt.datetime, lease_s: float = 0.05) -> None:
    """Wait until the database clock passes a lease of ``lease_s`` granted no later than
    ``granted_by`` (a hang guard, not a timing)."""
    end = granted_by + dt.timedelta(seconds=lease_s)

    async def over() -> bool:
        return await ledger.database_now() >= end
    await until(over, what="the submit lease to end")


def _aware() -> dt.datetime:
    return dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


async def test_a_rejection_names_its_transmission_and_fails_only_the_latest_alone(ledger: AttemptLedger) -> None:
    """A late rejection of transmission 1 after transmission 2 was granted fails nothing;
    on a same-key-replay binding a rejection of a transmission granted beside a live one
    fails nothing either; the attempt stays submitting."""
    proven = await ledger.prepare(spec("owner-late", kind="lookup_only"))
    await ledger.begin_submit(proven, egress=egress(1), lease_seconds=0.05)
    await _lease_over(ledger, await ledger.database_now())
    assert await ledger.reconcile(proven, NotFound(True), looked_up_at=await ledger.database_now())
    assert (await ledger.begin_submit(proven, egress=egress(2))).number == 2  # type: ignore[union-attr]
    assert await ledger.record_failed(proven, evidence=RejectedBeforeEffect("quota"), transmission=1) is False
    assert (await ledger.get(proven)).state is AttemptState.SUBMITTING  # type: ignore[union-attr]
    assert await ledger.record_failed(proven, evidence=RejectedBeforeEffect("quota"), transmission=2) is True

    replayed = await ledger.prepare(spec("owner-beside", kind="replay"))
    await ledger.begin_submit(replayed, egress=egress(3))
    assert (await ledger.begin_submit(replayed, egress=egress(4))).number == 2  # type: ignore[union-attr]
    assert await ledger.record_failed(replayed, evidence=RejectedBeforeEffect("quota"), transmission=2) is False
    assert (await ledger.get(replayed)).state is AttemptState.SUBMITTING  # type: ignore[union-attr]


async def test_the_identity_is_recorded_once_and_a_lying_replay_conflicts(ledger: AttemptLedger) -> None:
    attempt_id = await ledger.prepare(spec())
    await ledger.begin_submit(attempt_id, egress=egress())
    assert await ledger.record_accepted(attempt_id, provider_job_id="job-a") is True
    assert await ledger.record_accepted(attempt_id, provider_job_id="job-a") is False
    with pytest.raises(TenureError) as caught:
        await ledger.record_accepted(attempt_id, provider_job_id="job-b")
    assert caught.value.code is ErrorCode.ATTEMPT_IDENTITY_CONFLICT
    with pytest.raises(TenureError):
        await ledger.reconcile(attempt_id, Found("job-b", AttemptState.SUCCEEDED, ("ref",)))
    assert (await ledger.get(attempt_id)).state is AttemptState.ACCEPTED  # type: ignore[union-attr]


async def test_ambiguity_is_indeterminate_and_failure_needs_evidence(ledger: AttemptLedger) -> None:
    attempt_id = await ledger.prepare(spec(reservation="gpu-0"))
    await ledger.begin_submit(attempt_id, egress=egress())
    assert await ledger.record_failed(attempt_id, evidence=ProviderFailed("no")) is False
    assert await ledger.record_ambiguous(attempt_id, reason="timeout") is True
    record = await ledger.get(attempt_id)
    assert record.state is AttemptState.INDETERMINATE and record.evidence[-1] == "ambiguous:timeout"  # type: ignore[union-attr]
    assert await ledger.release_reservation(attempt_id) is False  # containment unproven
    assert await ledger.reconcile(attempt_id, Found("job-a", AttemptState.FAILED)) is True
    assert await ledger.release_reservation(attempt_id) is True
    assert (await ledger.get(attempt_id)).reservation_released is True  # type: ignore[union-attr]


async def test_cancellation_is_immediate_when_prepared_and_needs_evidence_otherwise(ledger: AttemptLedger) -> None:
    unsent = await ledger.prepare(spec("owner-a"))
    assert await ledger.request_cancel(unsent) is True
    assert (await ledger.get(unsent)).state is AttemptState.CANCELLED  # type: ignore[union-attr]
    sent = await ledger.prepare(spec("owner-b"))
    await ledger.begin_submit(sent, egress=egress())
    await ledger.record_accepted(sent, provider_job_id="job-b")
    assert await ledger.request_cancel(sent) is True
    assert await ledger.request_cancel(sent) is False
    record = await ledger.get(sent)
    assert (record.state, record.cancel_requested) == (AttemptState.ACCEPTED, True)  # type: ignore[union-attr]
    assert await ledger.record_cancelled(sent, evidence=CancelConfirmed("job-b")) is True
    assert (await ledger.get(sent)).state is AttemptState.CANCELLED  # type: ignore[union-attr]


async def test_list_unresolved_pages_oldest_first_and_skips_settled_attempts(ledger: AttemptLedger) -> None:
    ids = []
    for number in range(5):
        attempt_id = await ledger.prepare(spec(f"owner-{number}"))
        await ledger.begin_submit(attempt_id, egress=egress(number))
        ids.append(attempt_id)
    await ledger.record_failed(ids[2], evidence=RejectedBeforeEffect("no"), transmission=1)
    seen: list[str] = []
    cursor = None
    while True:
        page = await ledger.list_unresolved(after=cursor, limit=2)
        seen += [item.attempt_id for item in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [ids[0], ids[1], ids[3], ids[4]]


async def test_progress_usage_and_a_tool_binding_round_trip(ledger: AttemptLedger) -> None:
    tool = ToolBinding(implementation="impl", resolution_lock="lock-1", tool_profile="t1", executor_profile="e1")
    attempt_id = await ledger.prepare(spec(binding=tool, policy_revisions={"egress": "r7"}))
    await ledger.begin_submit(attempt_id, egress=egress())
    await ledger.record_accepted(attempt_id, provider_job_id="job-t")
    assert await ledger.record_progress(attempt_id, cursor="40%", usage={"seconds": 3}, warnings=["slow start"])
    assert await ledger.record_running(attempt_id)
    assert await ledger.record_succeeded(attempt_id, result_refs=["out-1"], diagnostic_refs=["log-1"], cost={"usd": 0.2})
    record = await ledger.get(attempt_id)
    assert record is not None and record.binding == tool and record.policy_revisions == {"egress": "r7"}
    assert (record.usage, record.cost, record.warnings, record.result_refs) == (
        {"seconds": 3}, {"usd": 0.2}, ("slow start",), ("out-1",))


async def test_bad_input_is_a_config_error_that_echoes_nothing(ledger: AttemptLedger) -> None:
    attempt_id = await ledger.prepare(spec())
    for call in (
        lambda: ledger.begin_submit(attempt_id, egress="SECRET"),  # type: ignore[arg-type]
        lambda: ledger.begin_submit(attempt_id, egress=egress(), lease_seconds=10**400),
        lambda: ledger.record_progress(attempt_id, cursor="x", usage={"n": float("nan")}),
        lambda: ledger.record_succeeded(attempt_id, result_refs=["SECRET" * 100]),
        lambda: ledger.reconcile(attempt_id, "SECRET"),  # type: ignore[arg-type]
        lambda: ledger.list_unresolved(after="SECRET"),
        lambda: ledger.record_failed(attempt_id, evidence="SECRET"),  # type: ignore[arg-type]
        lambda: ledger.record_failed(attempt_id, evidence=RejectedBeforeEffect("SECRET")),
        lambda: ledger.record_failed(attempt_id, evidence=RejectedBeforeEffect("SECRET"), transmission=0),
        lambda: ledger.record_failed(attempt_id, evidence=RejectedBeforeEffect("SECRET"), transmission=True),
        lambda: ledger.record_failed(attempt_id, evidence=ProviderFailed("SECRET"), transmission=1),
        lambda: ledger.reconcile(attempt_id, NotFound(True)),
        lambda: ledger.reconcile(attempt_id, NotFound(True), looked_up_at=dt.datetime(2026, 1, 1)),
        lambda: ledger.reconcile(attempt_id, NotFound(True), looked_up_at="SECRET"),  # type: ignore[arg-type]
        lambda: ledger.reconcile(attempt_id, Found("SECRET", AttemptState.RUNNING), looked_up_at=_aware()),
        lambda: ledger.begin_submit(attempt_id, egress=egress(), proof=NotFound(True)),
        lambda: ledger.begin_submit(attempt_id, egress=egress(), looked_up_at=_aware()),
    ):
        with pytest.raises(ConfigValidationError) as caught:
            await call()
        assert "SECRET" not in str(caught.value) and "SECRET" not in repr(caught.value)
    with pytest.raises(ConfigValidationError):
        spec(request_digest="md5:abc")


async def test_a_database_failure_is_an_attempt_persistence_failure(tmp_path: pathlib.Path) -> None:
    import sqlite3

    sqlite3.connect(tmp_path / "empty.db").close()
    async with AttemptLedger(f"sqlite:///{tmp_path}/empty.db") as ledger:
        with pytest.raises(TenureError) as caught:
            await ledger.prepare(spec())
        assert (caught.value.code, caught.value.reason) == (ErrorCode.ATTEMPT_PERSISTENCE_FAILED, "schema_missing")
    async with AttemptLedger(f"sqlite:///{tmp_path}/missing/x.db") as ledger:
        with pytest.raises(TenureError) as caught:
            await ledger.get("attempt-1")
        assert (caught.value.code, caught.value.reason) == (ErrorCode.ATTEMPT_PERSISTENCE_FAILED, "database_missing")


async def test_an_unknown_attempt_answers_false_or_none(ledger: AttemptLedger) -> None:
    assert await ledger.get("attempt-none") is None
    assert await ledger.begin_submit("attempt-none", egress=egress()) is None
    assert await ledger.record_accepted("attempt-none", provider_job_id="job") is False
    assert dataclasses.is_dataclass(NotFound(True))
