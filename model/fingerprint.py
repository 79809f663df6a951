"""The submission snapshot and its canonical, versioned fingerprint.

``snapshot_submission`` runs synchronously, before any await: it checks that the
envelope is exactly the queue's type, re-validates every field (a caller may have
mutated a dictionary inside the frozen envelope since construction) and freezes the
authored content as canonical JSON text. Nothing the caller does afterwards can change
what is dispatched.

The fingerprint is ``"v1:" + sha256(canonical JSON)`` over
``{"queue": ..., "submission_id": ..., "job": {every authored field}}``. Authored
``None`` stays ``null`` (so filling in a generated ID later is a different request);
``None`` and ``{}`` differ; an explicit ``fires_at`` is normalized to UTC with six
fractional digits, so equal instants written with different offsets match. Generated
IDs, the default enqueue time, attempts, leases, status, results and PIDs never enter it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from typing import Any

from .bounds import is_identity
from .envelopes import ENVELOPE_FOR_QUEUE, PipelineJob, StreamingJob, SubmissionEnvelope
from .errors import ConfigValidationError
from .json_values import canonical_json, text_problem
from .states import QueueKind
from .validation import datetime_to_micros

__all__ = [
    "FINGERPRINT_VERSION",
    "SubmissionSnapshot",
    "snapshot_submission",
    "submission_fingerprint",
    "normalize_fires_at",
    "check_submission_id",
    "envelope_from_authored_json",
    "FrozenEnvelope",
    "freeze_envelope",
]

FINGERPRINT_VERSION = "v1"

_AUTHORED_FIELDS: dict[QueueKind, tuple[str, ...]] = {
    QueueKind.VALIDATION: (
        "contract_name", "contract_version", "data_source", "options",
        "job_id", "fires_at", "idempotency_key", "max_attempts",
    ),
    QueueKind.PIPELINE: (
        "config", "variables", "fail_fast", "run_id",
        "job_id", "fires_at", "idempotency_key", "max_attempts",
    ),
    QueueKind.STREAMING: (
        "config_name", "config_version", "variables", "force",
        "job_id", "fires_at", "max_attempts",
    ),
}


def normalize_fires_at(value: dt.datetime) -> str:
    """UTC, ISO 8601, exactly six fractional digits."""
    return value.astimezone(dt.timezone.utc).isoformat(timespec="microseconds")


def check_submission_id(submission_id: object) -> str:
    """A nonempty identity of at most 255 characters, else ConfigValidationError."""
    if not is_identity(submission_id) or text_problem(submission_id) is not None:  # type: ignore[arg-type]
        raise ConfigValidationError(
            "invalid_submission_id", fields=("submission_id",), problems=("identity_required",)
        )
    return submission_id  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SubmissionSnapshot:
    """An immutable original submission: what will be stored and how it is identified."""

    queue: QueueKind
    submission_id: str
    authored_json: str
    """Canonical JSON of every authored field (fires_at normalized)."""
    fingerprint: str
    job_id: str | None
    run_id: str | None
    fires_at_us: int | None
    idempotency_key: str | None
    max_attempts: int | None
    active_key: str | None
    """Streaming only: ``streaming:{config_name}@{config_version}``."""
    force: bool

    def envelope(self) -> SubmissionEnvelope:
        """A fresh envelope equal to the one submitted (a new object each call)."""
        return envelope_from_authored_json(self.queue, self.authored_json)


def envelope_from_authored_json(queue: QueueKind, authored_json: str) -> SubmissionEnvelope:
    """Rebuild an envelope from its canonical authored JSON."""
    fields: dict[str, Any] = json.loads(authored_json)
    if fields.get("fires_at") is not None:
        fields["fires_at"] = dt.datetime.fromisoformat(fields["fires_at"])
    return ENVELOPE_FOR_QUEUE[queue](**fields)  # type: ignore[return-value]


def submission_fingerprint(queue: QueueKind, submission_id: str, authored_json: str) -> str:
    """The versioned SHA-256 over queue, submission ID and the authored fields."""
    document = (
        '{"job":' + authored_json
        + ',"queue":' + canonical_json(queue.value)
        + ',"submission_id":' + canonical_json(submission_id) + "}"
    )
    return FINGERPRINT_VERSION + ":" + hashlib.sha256(document.encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FrozenEnvelope:
    """An envelope's authored content as canonical JSON, plus the fields a store needs."""

    queue: QueueKind
    authored_json: str
    job_id: str | None
    run_id: str | None
    fires_at_us: int | None
    idempotency_key: str | None
    max_attempts: int | None
    active_key: str | None
    force: bool

    def envelope(self) -> SubmissionEnvelope:
        return envelope_from_authored_json(self.queue, self.authored_json)


def freeze_envelope(queue: QueueKind, job: object) -> FrozenEnvelope:
    """Check that ``job`` is exactly the queue's envelope type, re-validate every field and
    freeze the authored content (synchronously: call it before any await)."""
    expected = ENVELOPE_FOR_QUEUE[queue]
    if type(job) is not expected:
        raise ConfigValidationError("wrong_envelope_type", fields=("job",), problems=("envelope_type",))
    names = _AUTHORED_FIELDS[queue]
    # Re-validation copies every JSON field, so nothing is shared with the caller.
    fresh: SubmissionEnvelope = expected(**{name: getattr(job, name) for name in names})  # type: ignore[assignment]
    authored: dict[str, Any] = {name: getattr(fresh, name) for name in names}
    fires_at = authored["fires_at"]
    if fires_at is not None:
        authored["fires_at"] = normalize_fires_at(fires_at)
    return FrozenEnvelope(
        queue=queue,
        authored_json=canonical_json(authored),
        job_id=fresh.job_id,
        run_id=fresh.run_id if isinstance(fresh, PipelineJob) else None,
        fires_at_us=None if fires_at is None else datetime_to_micros(fires_at),
        idempotency_key=None if isinstance(fresh, StreamingJob) else fresh.idempotency_key,
        max_attempts=fresh.max_attempts,
        active_key=fresh.active_key if isinstance(fresh, StreamingJob) else None,
        force=fresh.force if isinstance(fresh, StreamingJob) else False,
    )


def snapshot_submission(
    queue: QueueKind, job: object, submission_id: object
) -> SubmissionSnapshot:
    """Validate and freeze one original submission (synchronously; see module docstring)."""
    frozen = freeze_envelope(queue, job)
    checked_submission_id = check_submission_id(submission_id)
    return SubmissionSnapshot(
        queue=queue,
        submission_id=checked_submission_id,
        authored_json=frozen.authored_json,
        fingerprint=submission_fingerprint(queue, checked_submission_id, frozen.authored_json),
        job_id=frozen.job_id,
        run_id=frozen.run_id,
        fires_at_us=frozen.fires_at_us,
        idempotency_key=frozen.idempotency_key,
        max_attempts=frozen.max_attempts,
        active_key=frozen.active_key,
        force=frozen.force,
    )
