"""The public job sources, against every database: the behaviour the queue spec requires."""

from __future__ import annotations

import datetime as dt
import pathlib
from typing import Any

import pytest
from adapter_support import age_finished_rows, expire_lease, install_owner_folding_trigger, raw, row, table

from tenure.adapters import PipelineJobSource, StreamingJobSource, ValidationJobSource, upgrade
from tenure.model import (
    ClaimedJob,
    ConfigValidationError,
    ErrorCode,
    JobStatus,
    OwnedStreamingState,
    PipelineJob,
    QueueClaimFence,
    QueueKind,
    StreamingJob,
    TenureError,
    ValidationJob,
    WorkerConfig,
)


def config(db_url: str, **changes: Any) -> WorkerConfig:
    settings: dict[str, Any] = dict(lease_seconds=30, heartbeat_seconds=10, backoff_base_ms=0, backoff_max_ms=0)
    settings.update(changes)
    return WorkerConfig(db_url, **settings)


def job(n: int = 1, **changes: Any) -> ValidationJob:
    fields: dict[str, Any] = dict(contract_name="orders", contract_version="1.0.0", data_source=f"orders-{n}.jsonl")
    fields.update(changes)
    return ValidationJob(**fields)


@pytest.fixture
async def validation(db_url: str) -> Any:
    source = ValidationJobSource(db_url, config(db_url))
    yield source
    await source.close()


@pytest.fixture
async def streaming(db_url: str) -> Any:
    source = StreamingJobSource(db_url, config(db_url))
    yield source
    await source.close()


@pytest.fixture
async def pipeline(db_url: str) -> Any:
    source = PipelineJobSource(db_url, config(db_url))
    yield source
    await source.close()


async def claimed(source: Any, owner: str = "worker-a", token: str = "token-1") -> ClaimedJob:
    got = await source.claim_next_owned(owner, claim_token=token)
    assert got is not None
    return got  # type: ignore[no-any-return]


# --- construction -------------------------------------------------------------------


async def test_constructing_a_source_neither_connects_nor_migrates(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path}/never-created.db"
    source = ValidationJobSource(url)
    await source.close()
    assert not (tmp_path / "never-created.db").exists()


def test_a_config_for_another_database_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigValidationError) as caught:
        ValidationJobSource(f"sqlite:///{tmp_path}/a.db", WorkerConfig(f"sqlite:///{tmp_path}/b.db"))
    assert "db_url_mismatch" in caught.value.problems
    assert str(tmp_path) not in str(caught.value)


@pytest.mark.parametrize("url", ["mysql://u:SECRETpw@h/db", "sqlite:///:memory:", "", "sqlite://"])
def test_an_unsupported_url_is_refused_without_echoing_it(url: str) -> None:
    with pytest.raises(ConfigValidationError) as caught:
        ValidationJobSource(url)
    assert "SECRETpw" not in str(caught.value) and "SECRETpw" not in repr(caught.value)
    assert caught.value.fields == ("db_url",)


async def test_the_sqlalchemy_style_sqlite_url_works(tmp_path: pathlib.Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/q.db"
    await upgrade(url)
    async with ValidationJobSource(url) as source:
        assert await source.submit_owned(job(), submission_id="s") is not None


# --- submission ---------------------------------------------------------------------


async def test_submit_owned_snapshots_the_request_before_returning(validation: Any, db_url: str) -> None:
    options = {"nested": {"rows": [1, 2]}}
    request = job(options=options)
    pending_submission = validation.submit_owned(request, submission_id="sub-1")
    request.options["nested"]["rows"].append(3)  # mutate before the await
    job_id = await pending_submission
    got = await validation.get_job(job_id)
    assert got.job.options == {"nested": {"rows": [1, 2]}}


async def test_an_invalid_submission_raises_before_any_database_work(validation: Any) -> None:
    with pytest.raises(ConfigValidationError):
        validation.submit_owned(job(), submission_id="")
    with pytest.raises(ConfigValidationError):
        validation.submit_owned(StreamingJob("c", "1"), submission_id="sub-1")


@pytest.mark.parametrize("ending", ["complete", "fail", "cancel"])
async def test_an_exact_replay_returns_the_original_id_after_the_job_ended(validation: Any, ending: str) -> None:
    job_id = await validation.submit_owned(job(), submission_id="sub-1")
    got = await claimed(validation)
    if ending == "complete":
        assert await validation.complete_owned(got.claim_fence, {"ok": True})
    elif ending == "fail":
        assert await validation.fail_owned(got.claim_fence, "boom", retry=False)
    else:
        assert await validation.cancel(job_id)
    assert await validation.submit_owned(job(), submission_id="sub-1") == job_id
    assert (await validation.get_job(job_id)).status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


async def test_changed_content_under_the_same_submission_id_conflicts(validation: Any) -> None:
    await validation.submit_owned(job(), submission_id="sub-1")
    with pytest.raises(TenureError) as caught:
        await validation.submit_owned(job(options={}), submission_id="sub-1")
    assert (caught.value.code, caught.value.reason) == (ErrorCode.QUEUE_SUBMISSION_CONFLICT, "fingerprint_mismatch")


async def test_filling_in_the_returned_id_is_a_different_request(validation: Any) -> None:
    job_id = await validation.submit_owned(job(), submission_id="sub-1")
    with pytest.raises(TenureError) as caught:
        await validation.submit_owned(job(job_id=job_id), submission_id="sub-1")
    assert caught.value.code is ErrorCode.QUEUE_SUBMISSION_CONFLICT


async def test_a_legacy_row_is_never_promoted(validation: Any) -> None:
    legacy_id = await validation.submit(job(idempotency_key="key-1"))
    with pytest.raises(TenureError) as caught:
        await validation.submit_owned(job(idempotency_key="key-1"), submission_id="sub-1")
    assert caught.value.reason == "legacy_row_collision"
    info = await validation.get_job(legacy_id)
    assert info.protected is False and info.submission_id is None


async def test_pipeline_submission_returns_the_run_id_and_fences_carry_the_job_id(pipeline: Any) -> None:
    run_id = await pipeline.submit_owned(PipelineJob({"steps": []}, run_id="run-7"), submission_id="sub-1")
    assert run_id == "run-7"
    got = await pipeline.claim_next_owned("worker-a", claim_token="token-1")
    assert got.run_id == "run-7" and got.claim_fence.job_id == got.job_id != "run-7"
    assert await pipeline.submit_owned(PipelineJob({"steps": []}, run_id="run-7"), submission_id="sub-1") == "run-7"


async def test_generated_ids_are_uuids_and_run_ids_fit_their_column(pipeline: Any) -> None:
    run_id = await pipeline.submit_owned(PipelineJob({}), submission_id="sub-1")
    got = await pipeline.claim_next_owned("w", claim_token="t")
    assert len(run_id) <= 32 and len(got.job_id) == 36


# --- claims and fenced writes -------------------------------------------------------


async def test_the_full_owned_cycle(validation: Any) -> None:
    job_id = await validation.submit_owned(job(), submission_id="sub-1")
    got = await claimed(validation)
    fence = got.claim_fence
    assert (got.job_id, got.attempt, fence.job_id, fence.owner_id, fence.generation) == (job_id, 1, job_id, "worker-a", 1)
    assert got.job == job()
    assert await validation.heartbeat_owned(fence)
    assert await validation.complete_owned(fence, {"rows": 3})
    assert await validation.complete_owned(fence, {"rows": 3}) is False
    info = await validation.get_job(job_id)
    assert (info.status, info.result) == (JobStatus.COMPLETED, {"rows": 3})


async def test_an_empty_queue_claims_nothing(validation: Any) -> None:
    assert await validation.claim_next_owned("worker-a", claim_token="token-1") is None


async def test_a_stored_nonce_is_a_claim_conflict_and_recovery_finds_the_claim(validation: Any) -> None:
    await validation.submit_owned(job(1), submission_id="sub-1")
    await validation.submit_owned(job(2), submission_id="sub-2")
    got = await claimed(validation)
    with pytest.raises(TenureError) as caught:
        await validation.claim_next_owned("worker-a", claim_token="token-1")
    assert (caught.value.code, caught.value.reason) == (ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused")
    recovered = await validation.recover_owned_claim("worker-a", claim_token="token-1")
    assert recovered == got


async def test_recovery_never_claims_or_renews(validation: Any, db_url: str) -> None:
    await validation.submit_owned(job(), submission_id="sub-1")
    assert await validation.recover_owned_claim("worker-a", claim_token="token-1") is None
    got = await claimed(validation)
    before = row(db_url, QueueKind.VALIDATION, got.job_id)
    assert await validation.recover_owned_claim("worker-b", claim_token="token-1") is None
    assert await validation.recover_owned_claim("worker-a", claim_token="token-1") is not None
    assert row(db_url, QueueKind.VALIDATION, got.job_id) == before


async def test_a_stale_worker_cannot_write_after_its_lease_expired_and_another_took_over(validation: Any, db_url: str) -> None:
    await validation.submit_owned(job(), submission_id="sub-1")
    stale = await claimed(validation, "worker-a", "token-1")
    expire_lease(db_url, QueueKind.VALIDATION, stale.job_id)
    assert await validation.heartbeat_owned(stale.claim_fence) is False
    fresh = await claimed(validation, "worker-b", "token-2")
    assert fresh.job_id == stale.job_id and fresh.claim_fence.generation == 2
    assert await validation.complete_owned(stale.claim_fence, {"stale": True}) is False
    assert await validation.fail_owned(stale.claim_fence, "stale", retry=True) is False
    assert await validation.complete_owned(fresh.claim_fence, {"fresh": True})
    assert (await validation.get_job(fresh.job_id)).result == {"fresh": True}


@pytest.mark.parametrize("change", [
    {"owner_id": "Worker-A"}, {"owner_id": "worker-a "}, {"claim_token": "TOKEN-1"}, {"generation": 2},
])
async def test_a_fence_differing_in_any_part_returns_false_and_changes_nothing(
    validation: Any, db_url: str, change: dict[str, Any]
) -> None:
    await validation.submit_owned(job(), submission_id="sub-1")
    fence = (await claimed(validation)).claim_fence
    parts = dict(queue=fence.queue, job_id=fence.job_id, owner_id=fence.owner_id, generation=fence.generation,
                 claim_token=fence.claim_token)
    parts.update(change)
    before = row(db_url, QueueKind.VALIDATION, fence.job_id)
    forged = QueueClaimFence(**parts)
    assert await validation.complete_owned(forged, {"x": 1}) is False
    assert await validation.heartbeat_owned(forged) is False
    assert row(db_url, QueueKind.VALIDATION, fence.job_id) == before


async def test_a_fence_for_another_queue_returns_false(validation: Any, pipeline: Any) -> None:
    await validation.submit_owned(job(), submission_id="sub-1")
    fence = (await claimed(validation)).claim_fence
    assert await pipeline.complete_owned(fence) is False


async def test_fail_with_retry_requeues_and_the_next_claim_has_a_new_generation(validation: Any) -> None:
    job_id = await validation.submit_owned(job(max_attempts=2), submission_id="sub-1")
    first = await claimed(validation, token="token-1")
    assert await validation.fail_owned(first.claim_fence, "transient", retry=True)
    second = await claimed(validation, token="token-2")
    assert (second.job_id, second.attempt, second.claim_fence.generation) == (job_id, 2, 2)
    assert await validation.fail_owned(second.claim_fence, "still broken", retry=True, dlq_record_id="dlq-9")
    info = await validation.get_job(job_id)
    assert (info.status, info.error, info.dlq_record_id) == (JobStatus.FAILED, "still broken", "dlq-9")


async def test_an_expired_claim_with_no_attempts_left_fails_at_the_next_claim(validation: Any, db_url: str) -> None:
    job_id = await validation.submit_owned(job(max_attempts=1), submission_id="sub-1")
    got = await claimed(validation)
    expire_lease(db_url, QueueKind.VALIDATION, got.job_id)
    assert await validation.claim_next_owned("worker-b", claim_token="token-2") is None
    assert (await validation.get_job(job_id)).status is JobStatus.FAILED


async def test_administrative_cancel_voids_a_live_fence(validation: Any) -> None:
    job_id = await validation.submit_owned(job(), submission_id="sub-1")
    fence = (await claimed(validation)).claim_fence
    assert await validation.cancel(job_id)
    assert await validation.complete_owned(fence) is False
    assert await validation.cancel(job_id) is False


@pytest.mark.parametrize("bad", [None, "fence", {"job_id": "x"}])
async def test_a_write_without_a_real_fence_is_a_config_error(validation: Any, bad: Any) -> None:
    with pytest.raises(ConfigValidationError):
        await validation.complete_owned(bad)


@pytest.mark.parametrize("delay_s", [-1, float("nan"), float("inf"), 10**400, 366 * 86_400 + 1, "1", True, None])
async def test_a_release_delay_out_of_range_is_a_config_error_and_keeps_the_claim(
    validation: Any, db_url: str, delay_s: Any,
) -> None:
    await validation.submit_owned(job(), submission_id="sub-1")
    fence = (await claimed(validation)).claim_fence
    before = row(db_url, QueueKind.VALIDATION, fence.job_id)
    for release in (lambda: validation.release_owned(fence, delay_s=delay_s),
                    lambda: validation.release_many_owned([fence], delay_s=delay_s)):
        with pytest.raises(ConfigValidationError) as caught:
            await release()
        assert caught.value.fields == ("delay_s",)
    assert row(db_url, QueueKind.VALIDATION, fence.job_id) == before
    assert await validation.release_owned(fence, delay_s=366 * 86_400)  # the longest delay is taken


@pytest.mark.parametrize(
    "result", [float("nan"), {"x": (1, 2)}, {1: "int key"}, object(), 3, 2.5, "text", [1, 2], True],
)
async def test_an_invalid_result_is_a_config_error_and_writes_nothing(validation: Any, db_url: str, result: Any) -> None:
    """A result is a JSON object (pycharter's ``dict``): a bare number, text, list or flag
    is refused too (SQLite's JSON columns would not keep a bare number as written)."""
    await validation.submit_owned(job(), submission_id="sub-1")
    fence = (await claimed(validation)).claim_fence
    before = row(db_url, QueueKind.VALIDATION, fence.job_id)
    with pytest.raises(ConfigValidationError) as caught:
        await validation.complete_owned(fence, result)
    assert caught.value.fields == ("result",)
    assert row(db_url, QueueKind.VALIDATION, fence.job_id) == before


# --- streaming ------------------------------------------------------------------------


async def test_streaming_pid_state_cancel_request_and_acknowledgement(streaming: Any) -> None:
    job_id = await streaming.submit_owned(StreamingJob("orders", "1"), submission_id="sub-1")
    got = await streaming.claim_next_owned("launcher-a", claim_token="token-1")
    fence = got.claim_fence
    assert await streaming.set_pid_owned(fence, 4242)
    assert await streaming.get_owned_state(fence) == OwnedStreamingState(False, 4242)
    assert await streaming.acknowledge_cancel_owned(fence) is False  # nothing requested yet
    assert await streaming.request_cancel(job_id)
    assert await streaming.get_owned_state(fence) == OwnedStreamingState(True, 4242)
    assert await streaming.complete_owned(fence) is False
    assert await streaming.fail_owned(fence, "x", retry=False) is False
    assert await streaming.set_pid_owned(fence, 4243) is False
    assert await streaming.heartbeat_owned(fence)
    assert await streaming.acknowledge_cancel_owned(fence)
    info = await streaming.get_job(job_id)
    assert (info.status, info.pid, info.lease_expires_at) == (JobStatus.CANCELLED, None, None)
    assert await streaming.get_owned_state(fence) is None


async def test_an_expired_cancel_requested_stream_becomes_cancelled_not_pending(streaming: Any, db_url: str) -> None:
    job_id = await streaming.submit_owned(StreamingJob("orders", "1"), submission_id="sub-1")
    got = await streaming.claim_next_owned("launcher-a", claim_token="token-1")
    assert await streaming.request_cancel(job_id)
    expire_lease(db_url, QueueKind.STREAMING, job_id)
    assert await streaming.claim_next_owned("launcher-b", claim_token="token-2") is None
    assert (await streaming.get_job(job_id)).status is JobStatus.CANCELLED
    assert await streaming.heartbeat_owned(got.claim_fence) is False


async def test_a_forced_rerun_cancels_the_active_launch_atomically_and_an_old_replay_cannot_cancel_the_successor(
    streaming: Any,
) -> None:
    first = await streaming.submit_owned(StreamingJob("orders", "1"), submission_id="sub-1")
    running = await streaming.claim_next_owned("launcher-a", claim_token="token-1")
    with pytest.raises(TenureError) as caught:
        await streaming.submit_owned(StreamingJob("orders", "1"), submission_id="sub-2")
    assert caught.value.reason == "active_key_held"
    second = await streaming.submit_owned(StreamingJob("orders", "1", force=True), submission_id="sub-3")
    assert (await streaming.get_job(first)).status is JobStatus.CANCELLED
    assert await streaming.complete_owned(running.claim_fence) is False
    # Retrying the force request returns its own ID and leaves the successor alone.
    assert await streaming.submit_owned(StreamingJob("orders", "1", force=True), submission_id="sub-3") == second
    assert (await streaming.get_job(second)).status is JobStatus.PENDING
    # Retrying the very first request also just returns its (cancelled) ID.
    assert await streaming.submit_owned(StreamingJob("orders", "1"), submission_id="sub-1") == first
    assert (await streaming.get_job(second)).status is JobStatus.PENDING


async def test_a_legacy_launch_holding_the_key_refuses_an_owned_rerun(streaming: Any) -> None:
    legacy = await streaming.submit(StreamingJob("orders", "1"))
    with pytest.raises(TenureError) as caught:
        await streaming.submit_owned(StreamingJob("orders", "1", force=True), submission_id="sub-1")
    assert caught.value.reason == "legacy_predecessor"
    assert (await streaming.get_job(legacy)).status is JobStatus.PENDING


async def test_a_legacy_force_cannot_cancel_owned_work(streaming: Any) -> None:
    owned = await streaming.submit_owned(StreamingJob("orders", "1"), submission_id="sub-1")
    with pytest.raises(TenureError) as caught:
        await streaming.submit(StreamingJob("orders", "1", force=True))
    assert caught.value.reason == "protected_predecessor"
    assert (await streaming.get_job(owned)).status is JobStatus.PENDING


async def test_a_finished_launch_lets_a_fresh_submission_through(streaming: Any) -> None:
    await streaming.submit_owned(StreamingJob("orders", "1"), submission_id="sub-1")
    got = await streaming.claim_next_owned("launcher-a", claim_token="token-1")
    assert await streaming.complete_owned(got.claim_fence)
    assert await streaming.submit_owned(StreamingJob("orders", "1"), submission_id="sub-2")


@pytest.mark.parametrize("pid", [0, -5, 2**31, True])
async def test_an_invalid_pid_is_a_config_error(streaming: Any, pid: Any) -> None:
    await streaming.submit_owned(StreamingJob("orders", "1"), submission_id="sub-1")
    got = await streaming.claim_next_owned("launcher-a", claim_token="token-1")
    with pytest.raises(ConfigValidationError):
        await streaming.set_pid_owned(got.claim_fence, pid)


# --- legacy coexistence -----------------------------------------------------------------


async def test_legacy_claims_skip_protected_submissions(validation: Any) -> None:
    await validation.submit_owned(job(1), submission_id="sub-1")
    assert await validation.claim_next("legacy-worker") is None
    legacy_id = await validation.submit(job(2))
    got = await validation.claim_next("legacy-worker")
    assert got.job_id == legacy_id and got.claim_fence is None


async def test_legacy_writes_never_touch_protected_or_owned_work(validation: Any, db_url: str) -> None:
    owned_id = await validation.submit_owned(job(1), submission_id="sub-1")
    owned = await claimed(validation)
    legacy_id = await validation.submit(job(2))
    owned_claim_of_legacy_row = await claimed(validation, "worker-b", "token-2")
    assert owned_claim_of_legacy_row.job_id == legacy_id
    for job_id, owner in ((owned_id, "worker-a"), (legacy_id, "worker-b")):
        before = row(db_url, QueueKind.VALIDATION, job_id)
        assert await validation.heartbeat(job_id, owner) is False
        assert await validation.complete(job_id, {"legacy": True}) is False
        assert await validation.fail(job_id, "legacy", retry=False) is False
        assert await validation.delete_job(job_id) is False
        assert row(db_url, QueueKind.VALIDATION, job_id) == before
    assert await validation.complete_owned(owned.claim_fence)


async def test_legacy_operations_still_work_on_legacy_rows(validation: Any) -> None:
    job_id = await validation.submit(job(idempotency_key="key-1"))
    assert await validation.submit(job(7, idempotency_key="key-1")) == job_id  # legacy: content not compared
    got = await validation.claim_next("legacy-worker")
    assert await validation.heartbeat(job_id, "legacy-worker")
    assert await validation.heartbeat(job_id, "someone-else") is False
    assert await validation.complete(got.job_id, {"ok": 1})
    assert await validation.delete_job(job_id)
    assert await validation.get_job(job_id) is None


async def test_retention_skips_protected_rows(validation: Any, db_url: str) -> None:
    owned_id = await validation.submit_owned(job(1), submission_id="sub-1")
    legacy_id = await validation.submit(job(2))
    assert await validation.cancel(owned_id) and await validation.cancel(legacy_id)
    assert await validation.purge_finished(dt.timedelta(hours=1)) == 0  # finished just now: retained
    age_finished_rows(db_url, QueueKind.VALIDATION, hours=2)
    assert await validation.purge_finished(dt.timedelta(hours=1)) == 1
    assert await validation.get_job(legacy_id) is None
    assert (await validation.get_job(owned_id)).status is JobStatus.CANCELLED


async def test_job_views_never_show_claim_tokens(validation: Any) -> None:
    await validation.submit_owned(job(), submission_id="sub-1")
    await claimed(validation, token="SECRET-token-value")
    listed = await validation.list_jobs()
    assert listed and all("SECRET-token-value" not in repr(info) for info in listed)
    assert not hasattr(listed[0], "claim_token")
    assert [info.status for info in await validation.list_jobs(JobStatus.CLAIMED)] == [JobStatus.CLAIMED]


# --- failures -----------------------------------------------------------------------------


async def test_a_database_failure_raises_and_never_becomes_false_or_none(validation: Any, db_url: str) -> None:
    await validation.submit_owned(job(), submission_id="sub-1")
    fence = (await claimed(validation)).claim_fence
    raw(db_url, f"DROP TABLE {table(QueueKind.VALIDATION)}")
    for call in (
        validation.complete_owned(fence),
        validation.heartbeat_owned(fence),
        validation.claim_next_owned("w", claim_token="t9"),
        validation.recover_owned_claim("w", claim_token="t9"),
        validation.submit_owned(job(), submission_id="sub-2"),
    ):
        with pytest.raises(TenureError) as caught:
            await call
        assert caught.value.code is ErrorCode.QUEUE_PERSISTENCE_FAILED
        assert "validation_jobs" not in str(caught.value) and "no such table" not in str(caught.value)


async def test_a_trigger_that_changes_the_claimed_owner_rolls_the_whole_claim_back(validation: Any, db_url: str) -> None:
    job_id = await validation.submit_owned(job(), submission_id="sub-1")
    before = row(db_url, QueueKind.VALIDATION, job_id)
    install_owner_folding_trigger(db_url, QueueKind.VALIDATION)
    with pytest.raises(TenureError) as caught:
        await validation.claim_next_owned("Worker-A", claim_token="token-1")
    assert (caught.value.code, caught.value.reason) == (ErrorCode.QUEUE_CLAIM_CONFLICT, "claim_identity_changed")
    assert row(db_url, QueueKind.VALIDATION, job_id) == before


async def test_a_refused_forced_legacy_submission_leaves_the_predecessor_running(streaming: Any) -> None:
    # Found by the lockstep suite: the predecessor's cancellation was committed although
    # the successor was refused (its authored job ID was the predecessor's own).
    first = await streaming.submit(StreamingJob("orders", "1", job_id="launch-1"))
    with pytest.raises(TenureError) as caught:
        await streaming.submit(StreamingJob("orders", "1", force=True, job_id="launch-1"))
    assert caught.value.reason == "identity_collision"
    assert (await streaming.get_job(first)).status is JobStatus.PENDING


# --- batched owned operations ---------------------------------------------------------------


async def test_a_batch_claim_gives_each_job_its_own_token_and_fence(validation: Any) -> None:
    ids = [await validation.submit_owned(job(n), submission_id=f"sub-{n}") for n in range(3)]
    claimed = await validation.claim_batch_owned("worker-a", claim_tokens=["t-1", "t-2", "t-3", "t-4"])
    assert sorted(c.job_id for c in claimed) == sorted(ids)
    assert [c.claim_fence.claim_token for c in claimed] == ["t-1", "t-2", "t-3"]
    assert all(c.claim_fence.generation == 1 and c.attempt == 1 for c in claimed)
    # The unused token was never stored: it can claim later.
    await validation.submit_owned(job(9), submission_id="sub-9")
    assert (await validation.claim_next_owned("worker-a", claim_token="t-4")) is not None


async def test_a_batch_claim_with_one_stored_token_claims_nothing(validation: Any, db_url: str) -> None:
    for n in range(3):
        await validation.submit_owned(job(n), submission_id=f"sub-{n}")
    await validation.claim_next_owned("worker-a", claim_token="t-1")
    with pytest.raises(TenureError) as caught:
        await validation.claim_batch_owned("worker-a", claim_tokens=["t-9", "t-1"])
    assert (caught.value.code, caught.value.reason) == (ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused")
    assert len(await validation.list_jobs(JobStatus.PENDING)) == 2


@pytest.mark.parametrize("tokens", [[], ["a", "a"], "abc", ["ok", ""], ["x"] * 1001])
async def test_an_invalid_token_list_is_a_config_error(validation: Any, tokens: Any) -> None:
    with pytest.raises(ConfigValidationError):
        await validation.claim_batch_owned("worker-a", claim_tokens=tokens)


async def test_complete_many_answers_each_fence_as_the_single_call_would(validation: Any) -> None:
    for n in range(3):
        await validation.submit_owned(job(n), submission_id=f"sub-{n}")
    first, second, third = await validation.claim_batch_owned("worker-a", claim_tokens=["t-1", "t-2", "t-3"])
    stale = QueueClaimFence(second.claim_fence.queue, second.job_id, "worker-b", 1, "t-2")
    answers = await validation.complete_many_owned([
        (first.claim_fence, {"n": 1}),
        (stale, {"n": 2}),
        (third.claim_fence, None),
        (first.claim_fence, {"again": True}),  # the row is completed by the first item
    ])
    assert answers == [True, False, True, False]
    assert (await validation.get_job(first.job_id)).result == {"n": 1}
    assert (await validation.get_job(second.job_id)).status is JobStatus.CLAIMED
    assert await validation.heartbeat_many_owned([second.claim_fence, first.claim_fence, stale]) == [True, False, False]
    assert await validation.complete_many_owned([]) == []


@pytest.mark.parametrize("items", [[("fence", {})], [1], "items"])
async def test_invalid_complete_many_items_are_a_config_error(validation: Any, items: Any) -> None:
    with pytest.raises(ConfigValidationError):
        await validation.complete_many_owned(items)
