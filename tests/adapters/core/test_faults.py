"""Failures at the worst moments: nothing half-written, and the original is always recoverable.

Faults are injected at the driver (see adapter_support.injected_faults): a COMMIT that
succeeds but whose acknowledgement is lost, a COMMIT that fails, a statement that fails
mid-transaction and, on PostgreSQL, a session the server ends mid-transaction.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from adapter_support import all_rows, claim_commit, injected_faults, kind_of, row
from tenure.adapters import StreamingJobSource, ValidationJobSource
from tenure.model import ErrorCode, JobStatus, QueueKind, StreamingJob, TenureError, ValidationJob, WorkerConfig

REQUEST = ValidationJob("orders", "1.0.0", "orders.jsonl")


@contextlib.asynccontextmanager
async def faulty_source(source_type: type[Any], db_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    source = source_type(db_url, WorkerConfig(db_url, lease_seconds=30, heartbeat_seconds=10))
    with injected_faults(kind_of(db_url), monkeypatch) as faults:
        try:
            yield source, faults
        finally:
            await source.close()


def assert_persistence_failure(caught: pytest.ExceptionInfo[TenureError]) -> None:
    assert caught.value.code is ErrorCode.QUEUE_PERSISTENCE_FAILED
    assert "injected" not in str(caught.value) and "injected" not in repr(caught.value)


async def test_a_lost_commit_acknowledgement_on_submission_is_recovered_by_replaying_it(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with faulty_source(ValidationJobSource, db_url, monkeypatch) as (source, faults):
        faults.arm("COMMIT", "after")
        with pytest.raises(TenureError) as caught:
            await source.submit_owned(REQUEST, submission_id="sub-1")
        assert_persistence_failure(caught)
        assert caught.value.reason == "commit_unacknowledged"
        job_id = await source.submit_owned(REQUEST, submission_id="sub-1")
        assert len(all_rows(db_url, QueueKind.VALIDATION)) == 1
        assert (await source.get_job(job_id)).submission_id == "sub-1"


async def test_a_failed_commit_on_submission_writes_nothing_and_a_retry_inserts_once(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with faulty_source(ValidationJobSource, db_url, monkeypatch) as (source, faults):
        faults.arm("COMMIT", "before")
        with pytest.raises(TenureError) as caught:
            await source.submit_owned(REQUEST, submission_id="sub-1")
        assert_persistence_failure(caught)
        assert all_rows(db_url, QueueKind.VALIDATION) == []
        await source.submit_owned(REQUEST, submission_id="sub-1")
        assert len(all_rows(db_url, QueueKind.VALIDATION)) == 1


async def test_a_lost_commit_acknowledgement_on_a_claim_is_recovered_with_the_same_nonce(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with faulty_source(ValidationJobSource, db_url, monkeypatch) as (source, faults):
        job_id = await source.submit_owned(REQUEST, submission_id="sub-1")
        faults.arm(claim_commit(kind_of(db_url)), "after")
        with pytest.raises(TenureError) as caught:
            await source.claim_next_owned("worker-a", claim_token="token-1")
        assert_persistence_failure(caught)
        recovered = await source.recover_owned_claim("worker-a", claim_token="token-1")
        assert recovered is not None and recovered.job_id == job_id
        with pytest.raises(TenureError) as again:
            await source.claim_next_owned("worker-a", claim_token="token-1")
        assert again.value.reason == "nonce_reused"
        assert await source.complete_owned(recovered.claim_fence, {"ok": True})


async def test_a_failed_commit_on_a_claim_leaves_the_job_pending_and_recovery_observes_nothing(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with faulty_source(ValidationJobSource, db_url, monkeypatch) as (source, faults):
        job_id = await source.submit_owned(REQUEST, submission_id="sub-1")
        before = row(db_url, QueueKind.VALIDATION, job_id)
        faults.arm(claim_commit(kind_of(db_url)), "before")
        with pytest.raises(TenureError):
            await source.claim_next_owned("worker-a", claim_token="token-1")
        assert row(db_url, QueueKind.VALIDATION, job_id) == before
        assert await source.recover_owned_claim("worker-a", claim_token="token-1") is None
        got = await source.claim_next_owned("worker-a", claim_token="token-1")
        assert got is not None and got.claim_fence.generation == 1


async def test_a_statement_failing_mid_transaction_leaves_nothing_half_written(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with faulty_source(StreamingJobSource, db_url, monkeypatch) as (source, faults):
        first = await source.submit_owned(StreamingJob("orders", "1"), submission_id="sub-1")
        before = all_rows(db_url, QueueKind.STREAMING)
        # The forced rerun cancels the predecessor (an UPDATE) and then inserts the
        # successor; failing the INSERT must undo the cancellation too.
        faults.arm("INSERT", "before")
        with pytest.raises(TenureError) as caught:
            await source.submit_owned(StreamingJob("orders", "1", force=True), submission_id="sub-2")
        assert_persistence_failure(caught)
        assert all_rows(db_url, QueueKind.STREAMING) == before
        assert (await source.get_job(first)).status is JobStatus.PENDING


async def test_a_lost_acknowledgement_on_a_completion_is_settled_by_reading_the_job(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with faulty_source(ValidationJobSource, db_url, monkeypatch) as (source, faults):
        await source.submit_owned(REQUEST, submission_id="sub-1")
        got = await source.claim_next_owned("worker-a", claim_token="token-1")
        # SQLite commits a transaction; PostgreSQL's completion is one statement.
        faults.arm("COMMIT" if kind_of(db_url) == "sqlite" else "WITH locked", "after")
        with pytest.raises(TenureError) as caught:
            await source.complete_owned(got.claim_fence, {"rows": 1})
        assert caught.value.reason == "commit_unacknowledged"
        # The write did commit: a repeat answers False and the job shows the result.
        assert await source.complete_owned(got.claim_fence, {"rows": 1}) is False
        assert (await source.get_job(got.job_id)).result == {"rows": 1}


@pytest.mark.parametrize("database", ["postgresql"])  # SQLite has no server session to end
async def test_a_session_ended_by_the_server_mid_transaction_leaves_nothing_half_written(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with faulty_source(StreamingJobSource, db_url, monkeypatch) as (source, faults):
        first = await source.submit_owned(StreamingJob("orders", "1"), submission_id="sub-1")
        before = all_rows(db_url, QueueKind.STREAMING)
        faults.arm("INSERT", "kill")
        with pytest.raises(TenureError) as caught:
            await source.submit_owned(StreamingJob("orders", "1", force=True), submission_id="sub-2")
        assert_persistence_failure(caught)
        assert all_rows(db_url, QueueKind.STREAMING) == before
        # The pool replaces the lost connection; the retry goes through exactly once.
        second = await source.submit_owned(StreamingJob("orders", "1", force=True), submission_id="sub-2")
        assert (await source.get_job(first)).status is JobStatus.CANCELLED
        assert await source.submit_owned(StreamingJob("orders", "1", force=True), submission_id="sub-2") == second
