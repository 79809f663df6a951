"""Invalid requests raise ConfigValidationError, and no message echoes what was supplied."""

from __future__ import annotations

import datetime as dt
import pickle
import traceback
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenure.model import (
    ConfigValidationError,
    ErrorCode,
    PipelineJob,
    QueueClaimFence,
    QueueKind,
    StreamingJob,
    TenureError,
    ValidationJob,
    WorkerConfig,
    check_pid,
    snapshot_submission,
)

markers = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=6, max_size=10).map(
    lambda tail: "SECRET" + tail
)


def _strings_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in _strings_in(key) + _strings_in(item)]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in _strings_in(item)]
    return []


def assert_refused_without_echo(build: Any, supplied: dict[str, Any]) -> ConfigValidationError:
    with pytest.raises(ConfigValidationError) as caught:
        build()
    error = caught.value
    assert error.code is ErrorCode.CONFIG
    rendered = "\n".join(
        [str(error), repr(error), *map(str, error.args), *traceback.format_exception_only(error)]
    )
    for text in _strings_in(list(supplied.values())):
        if len(text) >= 6:
            assert text not in rendered
            assert text[:40] not in rendered
    assert error.__context__ is None and error.__cause__ is None
    return error


def valid_validation(marker: str) -> dict[str, Any]:
    return dict(
        contract_name=marker + "c", contract_version="1", data_source=marker + "-source",
        options={marker: "value"}, job_id=marker[:30], idempotency_key=marker + "-key",
    )


invalid_validation_changes = st.sampled_from([
    ("contract_name", lambda m: ""),
    ("contract_name", lambda m: m * 40),
    ("contract_version", lambda m: m * 10),
    ("data_source", lambda m: 7),
    ("options", lambda m: {m: float("nan")}),
    ("options", lambda m: {m: [1, float("inf")]}),
    ("options", lambda m: {m: (1, 2)}),
    ("options", lambda m: {m: {1: "int key"}}),
    ("options", lambda m: [m]),
    ("options", lambda m: {m: 2**64}),
    ("options", lambda m: {m: m + "\x00"}),
    ("options", lambda m: {m: "\ud800"}),
    ("job_id", lambda m: m * 5),
    ("job_id", lambda m: ""),
    ("fires_at", lambda m: dt.datetime(2030, 1, 1)),
    ("fires_at", lambda m: dt.date(2030, 1, 1)),
    ("fires_at", lambda m: m),
    ("idempotency_key", lambda m: m * 30),
    ("max_attempts", lambda m: True),
    ("max_attempts", lambda m: 0),
    ("max_attempts", lambda m: 2**31),
    ("max_attempts", lambda m: 3.0),
])


@given(marker=markers, change=invalid_validation_changes)
def test_invalid_validation_jobs_are_refused_without_echo(marker: str, change: Any) -> None:
    field, bad = change
    fields = valid_validation(marker)
    fields[field] = bad(marker)
    error = assert_refused_without_echo(lambda: ValidationJob(**fields), fields)
    assert field in error.fields


invalid_pipeline_changes = st.sampled_from([
    ("config", lambda m: None),
    ("config", lambda m: {m: float("-inf")}),
    ("variables", lambda m: {m: 5}),
    ("variables", lambda m: {m: None}),
    ("variables", lambda m: [m]),
    ("fail_fast", lambda m: 1),
    ("run_id", lambda m: m * 4),
    ("job_id", lambda m: m * 4),
])


@given(marker=markers, change=invalid_pipeline_changes)
def test_invalid_pipeline_jobs_are_refused_without_echo(marker: str, change: Any) -> None:
    field, bad = change
    fields: dict[str, Any] = dict(config={marker: 1}, variables={marker: marker}, run_id=marker[:30])
    fields[field] = bad(marker)
    error = assert_refused_without_echo(lambda: PipelineJob(**fields), fields)
    assert field in error.fields


invalid_streaming_changes = st.sampled_from([
    ("config_name", lambda m: m * 60),
    ("config_version", lambda m: m * 7),
    ("variables", lambda m: {m: 1.5}),
    ("force", lambda m: "yes"),
    ("force", lambda m: 0),
    ("max_attempts", lambda m: False),
])


@given(marker=markers, change=invalid_streaming_changes)
def test_invalid_streaming_jobs_are_refused_without_echo(marker: str, change: Any) -> None:
    field, bad = change
    fields: dict[str, Any] = dict(config_name=marker, config_version="1", variables={marker: marker})
    fields[field] = bad(marker)
    error = assert_refused_without_echo(lambda: StreamingJob(**fields), fields)
    assert field in error.fields


invalid_fence_changes = st.sampled_from([
    ("queue", lambda m: "validation"),
    ("job_id", lambda m: m * 5),
    ("job_id", lambda m: ""),
    ("owner_id", lambda m: m * 30),
    ("owner_id", lambda m: ""),
    ("owner_id", lambda m: None),
    ("generation", lambda m: True),
    ("generation", lambda m: 0),
    ("generation", lambda m: 2**63),
    ("generation", lambda m: 1.0),
    ("claim_token", lambda m: m * 30),
    ("claim_token", lambda m: m.encode()),
    ("claim_token", lambda m: m + "\x00"),
])


@given(marker=markers, change=invalid_fence_changes)
def test_invalid_fences_are_refused_without_echo(marker: str, change: Any) -> None:
    field, bad = change
    fields: dict[str, Any] = dict(
        queue=QueueKind.STREAMING, job_id=marker[:30], owner_id=marker + "-owner", generation=1, claim_token=marker + "-token"
    )
    fields[field] = bad(marker)
    error = assert_refused_without_echo(lambda: QueueClaimFence(**fields), fields)
    assert field in error.fields


@given(marker=markers, change=st.sampled_from([
    ("lease_seconds", lambda m: 0),
    ("lease_seconds", lambda m: float("nan")),
    ("lease_seconds", lambda m: True),
    ("heartbeat_seconds", lambda m: 300),
    ("backoff_base_ms", lambda m: -1),
    ("backoff_max_ms", lambda m: 10),
    ("max_attempts", lambda m: 0),
]))
def test_invalid_worker_configs_never_echo_the_database_url(marker: str, change: Any) -> None:
    field, bad = change
    db_url = f"postgresql://user:{marker}@host/{marker}"
    settings = {field: bad(marker)}
    error = assert_refused_without_echo(lambda: WorkerConfig(db_url, **settings), {"db_url": db_url})
    assert error.fields


def test_a_worker_config_never_prints_its_database_url() -> None:
    config = WorkerConfig("postgresql://user:SECRETpassword@host/db", lease_seconds=0.5, heartbeat_seconds=0.1)
    assert "SECRETpassword" not in repr(config) and "SECRETpassword" not in str(config)
    assert config.lease_us == 500_000


def test_a_fence_never_prints_its_token() -> None:
    fence = QueueClaimFence(QueueKind.VALIDATION, "job-1", "worker-a", 3, "SECRETtoken")
    assert "SECRETtoken" not in repr(fence) and "SECRETtoken" not in str(fence)
    assert "worker-a" in repr(fence)


@pytest.mark.parametrize("pid", [0, -1, 2**31, True, 1.0, "12"])
def test_invalid_pids_are_refused(pid: Any) -> None:
    with pytest.raises(ConfigValidationError):
        check_pid(pid)


def test_deeply_nested_json_is_refused_instead_of_exhausting_the_stack() -> None:
    value: Any = "SECRETleaf"
    for _ in range(10_000):
        value = [value]
    assert_refused_without_echo(
        lambda: ValidationJob("c", "1", "s", options={"deep": value}), {"leaf": "SECRETleaf"}
    )


def test_a_snapshot_of_a_wrong_envelope_type_does_not_echo_it() -> None:
    job = ValidationJob("SECRETname", "1", "SECRETsource")
    assert_refused_without_echo(
        lambda: snapshot_submission(QueueKind.STREAMING, job, "SECRETsubmission"),
        {"values": ["SECRETname", "SECRETsource", "SECRETsubmission"]},
    )


def test_errors_survive_pickling_with_code_reason_and_fields() -> None:
    error = ConfigValidationError("invalid_validation_job", fields=("options",), problems=("json_not_finite",))
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.code, copy.reason, copy.fields, copy.problems) == (error.code, error.reason, error.fields, error.problems)
    plain = pickle.loads(pickle.dumps(TenureError(ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused")))
    assert (plain.code, plain.reason) == (ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused")


def test_a_reason_must_be_an_authored_word() -> None:
    with pytest.raises(AssertionError):
        TenureError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "could not connect to postgresql://u:p@h")
