"""The public vocabulary: envelopes, fences, configuration and errors behave as documented."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from tenure.model import (
    DEFAULT_MAX_ATTEMPTS,
    ClaimedPipelineJob,
    ConfigValidationError,
    ErrorCode,
    OwnedStreamingState,
    PipelineJob,
    QueueClaimFence,
    QueueKind,
    StreamingJob,
    TenureError,
    ValidationJob,
    WorkerConfig,
    snapshot_submission,
)


def test_envelopes_take_their_fields_positionally_in_the_documented_order() -> None:
    job = ValidationJob("orders", "1.0.0", "orders.jsonl", {"fixture": True}, "job-1")
    assert (job.contract_name, job.options, job.job_id) == ("orders", {"fixture": True}, "job-1")
    pipeline = PipelineJob({"steps": []}, {"env": "test"}, True, "run-1")
    assert (pipeline.fail_fast, pipeline.run_id) == (True, "run-1")
    stream = StreamingJob("orders", "2", None, True)
    assert stream.force is True and stream.active_key == "streaming:orders@2"


def test_envelopes_are_frozen() -> None:
    job = ValidationJob("orders", "1", "s")
    with pytest.raises(Exception):
        job.contract_name = "other"  # type: ignore[misc]


def test_envelopes_copy_dictionaries_on_construction() -> None:
    options = {"nested": [1]}
    job = ValidationJob("orders", "1", "s", options=options)
    options["nested"].append(2)
    assert job.options == {"nested": [1]}


def test_a_snapshot_rebuilds_an_equal_envelope_every_time() -> None:
    job = PipelineJob(
        {"steps": [{"name": "a"}]}, {"x": "1"}, False, "run-1", "job-1",
        dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc), "key-1", 4,
    )
    snapshot = snapshot_submission(QueueKind.PIPELINE, job, "sub-1")
    first, second = snapshot.envelope(), snapshot.envelope()
    assert first == job and second == job and first is not second
    assert (snapshot.job_id, snapshot.run_id, snapshot.idempotency_key, snapshot.max_attempts) == (
        "job-1", "run-1", "key-1", 4,
    )


def test_the_fence_is_frozen_and_slotted() -> None:
    fence = QueueClaimFence(QueueKind.PIPELINE, "job-1", "worker-a", 1, "token-1")
    assert not hasattr(fence, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        fence.generation = 2  # type: ignore[misc]


def test_streaming_state_is_a_frozen_snapshot() -> None:
    state = OwnedStreamingState(cancel_requested=True, pid=12)
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.pid = 13  # type: ignore[misc]


def test_a_claimed_pipeline_job_carries_the_run_id_while_its_fence_carries_the_job_id() -> None:
    fence = QueueClaimFence(QueueKind.PIPELINE, "job-1", "worker-a", 1, "token-1")
    claimed = ClaimedPipelineJob(job_id="job-1", run_id="run-1", attempt=1, job=PipelineJob({}), claim_fence=fence)
    assert claimed.claim_fence.job_id == "job-1" and claimed.run_id == "run-1"


def test_worker_config_defaults_are_the_legacy_queue_defaults() -> None:
    config = WorkerConfig("sqlite:///queue.db")
    assert (config.lease_seconds, config.heartbeat_seconds, config.backoff_base_ms, config.backoff_max_ms) == (
        300, 60, 1000, 300_000,
    )
    assert config.max_attempts is None
    assert DEFAULT_MAX_ATTEMPTS == {QueueKind.VALIDATION: 5, QueueKind.PIPELINE: 5, QueueKind.STREAMING: 3, QueueKind.TASK: 3}


def test_worker_config_requires_the_heartbeat_to_be_shorter_than_the_lease() -> None:
    with pytest.raises(ConfigValidationError) as caught:
        WorkerConfig("sqlite:///q.db", lease_seconds=10, heartbeat_seconds=10)
    assert "heartbeat_not_shorter_than_lease" in caught.value.problems
    assert WorkerConfig("sqlite:///q.db", lease_seconds=0.25, heartbeat_seconds=0.1).lease_us == 250_000


def test_config_validation_error_is_a_tenure_error_with_code_config() -> None:
    error = ConfigValidationError("invalid_pid")
    assert isinstance(error, TenureError) and error.code is ErrorCode.CONFIG and error.reason == "invalid_pid"


def test_error_codes_are_the_documented_ones() -> None:
    assert {code.name for code in ErrorCode} >= {
        "CONFIG", "QUEUE_SUBMISSION_CONFLICT", "QUEUE_CLAIM_CONFLICT", "QUEUE_PERSISTENCE_FAILED",
    }
