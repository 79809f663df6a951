"""The canonical submission fingerprint and the immutable submission snapshot."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenure.model import (
    ConfigValidationError,
    PipelineJob,
    QueueKind,
    StreamingJob,
    ValidationJob,
    snapshot_submission,
)

# JSON values the model accepts: finite, built-in, signed 64-bit integers, no NUL or
# unpaired surrogates in text.
text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=8)
json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_values = st.recursive(
    json_leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(text, json_values, max_size=5)
offsets = st.integers(-23 * 60, 23 * 60).map(lambda minutes: dt.timezone(dt.timedelta(minutes=minutes)))
instants = st.datetimes(
    min_value=dt.datetime(1900, 1, 2), max_value=dt.datetime(2200, 1, 1), timezones=st.just(dt.timezone.utc)
)


def validation_job(**changes: Any) -> ValidationJob:
    fields: dict[str, Any] = dict(contract_name="orders", contract_version="1.0.0", data_source="orders.jsonl")
    fields.update(changes)
    return ValidationJob(**fields)


def fingerprint(job: Any, submission_id: str = "sub-1") -> str:
    queue = type(job).queue
    return snapshot_submission(queue, job, submission_id).fingerprint


def _reordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _reordered(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_reordered(item) for item in value]
    return value


@given(options=json_objects)
def test_key_order_does_not_change_the_fingerprint(options: dict[str, Any]) -> None:
    assert fingerprint(validation_job(options=options)) == fingerprint(validation_job(options=_reordered(options)))


@given(instant=instants, first=offsets, second=offsets)
def test_equal_instants_written_with_different_offsets_have_one_fingerprint(
    instant: dt.datetime, first: dt.timezone, second: dt.timezone
) -> None:
    one = validation_job(fires_at=instant.astimezone(first))
    other = validation_job(fires_at=instant.astimezone(second))
    assert fingerprint(one) == fingerprint(other)
    later = validation_job(fires_at=instant + dt.timedelta(microseconds=1))
    assert fingerprint(later) != fingerprint(one)


@given(
    field=st.sampled_from(
        ["contract_name", "contract_version", "data_source", "options", "job_id", "fires_at", "idempotency_key", "max_attempts"]
    ),
    data=st.data(),
)
def test_changing_any_authored_field_changes_the_fingerprint(field: str, data: st.DataObject) -> None:
    base = validation_job(
        options={"a": 1}, job_id="job-1", fires_at=dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc),
        idempotency_key="key-1", max_attempts=3,
    )
    replacements: dict[str, Any] = {
        "contract_name": data.draw(text.filter(lambda t: t not in ("", "orders"))),
        "contract_version": "1.0.1",
        "data_source": "other.jsonl",
        "options": data.draw(json_objects.filter(lambda o: o != {"a": 1})),
        "job_id": data.draw(st.sampled_from(["job-2", "JOB-1", "job-1 ", None])),
        "fires_at": data.draw(st.sampled_from([None, dt.datetime(2030, 1, 1, 0, 0, 0, 1, tzinfo=dt.timezone.utc)])),
        "idempotency_key": data.draw(st.sampled_from(["key-2", "Key-1", None])),
        "max_attempts": data.draw(st.sampled_from([1, 2, 4, None])),
    }
    fields = base.model_dump()
    fields[field] = replacements[field]
    assert fingerprint(ValidationJob(**fields)) != fingerprint(base)


def test_changing_the_queue_or_submission_id_changes_the_fingerprint() -> None:
    job = validation_job()
    assert fingerprint(job, "sub-1") != fingerprint(job, "sub-2")
    assert fingerprint(job, "sub-1") != fingerprint(job, "SUB-1")
    pipeline = snapshot_submission(QueueKind.PIPELINE, PipelineJob(config={}), "sub-1")
    streaming = snapshot_submission(QueueKind.STREAMING, StreamingJob("c", "1"), "sub-1")
    assert len({pipeline.fingerprint, streaming.fingerprint, fingerprint(job)}) == 3


def test_none_and_an_empty_mapping_are_different_requests() -> None:
    assert fingerprint(validation_job(options=None)) != fingerprint(validation_job(options={}))
    assert fingerprint(PipelineJob(config={}, variables=None)) != fingerprint(PipelineJob(config={}, variables={}))


def test_filling_in_a_generated_id_later_is_a_different_request() -> None:
    assert fingerprint(validation_job(job_id=None)) != fingerprint(validation_job(job_id="0b5e6c1e-aaaa"))


def test_unicode_is_not_normalized() -> None:
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert fingerprint(validation_job(data_source=composed)) != fingerprint(validation_job(data_source=decomposed))


def test_the_fingerprint_is_a_versioned_sha256_of_the_canonical_document() -> None:
    job = validation_job(options={"b": [1, 2.5, None], "a": "é"})
    snap = snapshot_submission(QueueKind.VALIDATION, job, "sub-1")
    document = {
        "job": {
            "contract_name": "orders", "contract_version": "1.0.0", "data_source": "orders.jsonl",
            "options": {"a": "é", "b": [1, 2.5, None]}, "job_id": None, "fires_at": None,
            "idempotency_key": None, "max_attempts": None,
        },
        "queue": "validation",
        "submission_id": "sub-1",
    }
    encoded = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert snap.fingerprint == "v1:" + hashlib.sha256(encoded).hexdigest()


def test_fires_at_is_normalized_to_utc_with_six_fractional_digits() -> None:
    job = validation_job(fires_at=dt.datetime(2030, 1, 1, 2, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))))
    snap = snapshot_submission(QueueKind.VALIDATION, job, "sub-1")
    assert '"fires_at":"2030-01-01T00:00:00.000000+00:00"' in snap.authored_json


@given(options=json_objects, key=text, value=json_values)
def test_mutating_the_callers_dictionaries_after_the_snapshot_changes_nothing(
    options: dict[str, Any], key: str, value: Any
) -> None:
    caller_options = {"nested": {"list": [1]}, **options}
    job = validation_job(options=caller_options)
    snap = snapshot_submission(QueueKind.VALIDATION, job, "sub-1")
    before = (snap.fingerprint, snap.authored_json)
    caller_options["nested"] = {"changed": True}
    job.options["nested"]["list"].append(value)  # type: ignore[index]
    job.options[key] = value  # type: ignore[index]
    assert (snap.fingerprint, snap.authored_json) == before
    assert snap.envelope().options == {"nested": {"list": [1]}, **options}


def test_a_snapshot_rechecks_dictionaries_mutated_inside_a_frozen_envelope() -> None:
    job = validation_job(options={"ok": 1})
    job.options["bad"] = float("nan")  # type: ignore[index]
    with pytest.raises(ConfigValidationError):
        snapshot_submission(QueueKind.VALIDATION, job, "sub-1")


def test_a_snapshot_requires_the_exact_envelope_type_of_its_queue() -> None:
    with pytest.raises(ConfigValidationError):
        snapshot_submission(QueueKind.PIPELINE, validation_job(), "sub-1")


@pytest.mark.parametrize("submission_id", ["", "x" * 256, None, 7, b"sub"])
def test_a_snapshot_requires_a_nonempty_bounded_submission_id(submission_id: Any) -> None:
    with pytest.raises(ConfigValidationError):
        snapshot_submission(QueueKind.VALIDATION, validation_job(), submission_id)


def test_submission_ids_are_kept_exactly_never_trimmed_or_folded() -> None:
    snap = snapshot_submission(QueueKind.VALIDATION, validation_job(), " Sub-1 ")
    assert snap.submission_id == " Sub-1 "


def test_a_streaming_snapshot_carries_its_active_key_and_force_flag() -> None:
    snap = snapshot_submission(QueueKind.STREAMING, StreamingJob("orders", "2", force=True), "sub-1")
    assert (snap.active_key, snap.force, snap.idempotency_key) == ("streaming:orders@2", True, None)
