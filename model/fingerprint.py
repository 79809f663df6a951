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
import typing
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pydantic import PlainValidator
from pydantic_core import PydanticCustomError

from .bounds import MAX_IDENTITY_CHARS, is_identity
from .envelopes import ENVELOPE_FOR_QUEUE, SubmissionEnvelope
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
        "config", "variables", "fail_fast", "concept_scheme", "run_id",
        "job_id", "fires_at", "idempotency_key", "max_attempts",
    ),
    QueueKind.STREAMING: (
        "config_name", "config_version", "variables", "force",
        "job_id", "fires_at", "max_attempts",
    ),
    QueueKind.TASK: (
        "queue_name", "task_name", "args", "priority", "retry_base_ms", "retry_max_ms", "retry_jitter",
        "job_id", "fires_at", "delay_ms", "max_attempts",
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
    field_texts: Mapping[str, str]
    """Each authored field's canonical JSON text, by field name (stores assemble the
    queue's domain columns from these without encoding a payload again)."""
    fingerprint: str
    job_id: str | None
    run_id: str | None
    fires_at_us: int | None
    idempotency_key: str | None
    max_attempts: int | None
    active_key: str | None
    """Streaming only: ``streaming:{config_name}@{config_version}``."""
    force: bool
    queue_name: str | None = None
    """Tasks only: the task queue's name."""
    task_name: str | None = None
    """Tasks only: the task's name."""
    priority: int = 0
    """Tasks only: the claim priority."""
    delay_us: int = 0
    """Tasks only: due this long after the insert's database time (no ``fires_at``)."""

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
    field_texts: Mapping[str, str]
    job_id: str | None
    run_id: str | None
    fires_at_us: int | None
    idempotency_key: str | None
    max_attempts: int | None
    active_key: str | None
    force: bool
    queue_name: str | None = None
    task_name: str | None = None
    priority: int = 0
    delay_us: int = 0

    def envelope(self) -> SubmissionEnvelope:
        return envelope_from_authored_json(self.queue, self.authored_json)


def _plain_validator(annotation: Any) -> Any:
    """The check function inside ``Annotated[T, PlainValidator(f)]``, also when the
    annotation is ``Annotated[...] | None``."""
    for item in getattr(annotation, "__metadata__", ()):
        if isinstance(item, PlainValidator):
            return item.func
    for argument in typing.get_args(annotation):
        found = _plain_validator(argument)
        if found is not None:
            return found
    return None


def _field_checks(model: type[Any]) -> dict[str, Any]:
    """Each field's own check function (the PlainValidator pydantic runs)."""
    checks = {}
    for name, field in model.model_fields.items():
        metadata_checks = [item.func for item in field.metadata if isinstance(item, PlainValidator)]
        checks[name] = metadata_checks[0] if metadata_checks else _plain_validator(field.annotation)
        assert checks[name] is not None, f"{model.__name__}.{name} has no check"
    return checks


_CHECKS = {queue: _field_checks(model) for queue, model in ENVELOPE_FOR_QUEUE.items()}


def _checked_field(queue: QueueKind, job: Any, name: str) -> tuple[Any, str]:
    """A field's value re-checked now (the envelope may have been built around its
    checks, or a dictionary inside it mutated since), and its canonical text."""
    value = getattr(job, name)
    if value is not None and name in job.json_fields:
        text = job.json_text_if_unchanged(name)
        if text is not None:
            return value, text
    check = _CHECKS[queue][name]
    failure: str | None = None
    if value is not None and check is not None:
        try:
            value = check(value)
        except PydanticCustomError as error:
            failure = error.type
    if failure is not None:
        raise ConfigValidationError(
            f"invalid_{type(job).__name__.lower()}", fields=(name,), problems=(failure,)
        )
    if value is not None and name in job.json_fields:
        text = job.json_text_if_unchanged(name) or canonical_json(value)
    elif name == "fires_at" and value is not None:
        text = canonical_json(normalize_fires_at(value))
    else:
        text = canonical_json(value)
    return value, text


def freeze_envelope(queue: QueueKind, job: object) -> FrozenEnvelope:
    """Check that ``job`` is exactly the queue's envelope type, re-check every field and
    freeze the authored content as canonical text (synchronously: call it before any
    await). JSON fields unchanged since construction reuse the text computed then."""
    expected = ENVELOPE_FOR_QUEUE[queue]
    if type(job) is not expected:
        raise ConfigValidationError("wrong_envelope_type", fields=("job",), problems=("envelope_type",))
    fields: dict[str, tuple[Any, str]] = {name: _checked_field(queue, job, name) for name in _AUTHORED_FIELDS[queue]}
    # The canonical text of the authored dictionary, assembled from the fields' texts
    # (keys sorted, compact separators), so a large payload is never encoded twice.
    authored_json = "{" + ",".join(
        canonical_json(name) + ":" + fields[name][1] for name in sorted(fields)
    ) + "}"
    values = {name: value for name, (value, _) in fields.items()}
    fires_at = values["fires_at"]
    active_key = None
    if queue is QueueKind.STREAMING:
        active_key = f"streaming:{values['config_name']}@{values['config_version']}"
        if len(active_key) > MAX_IDENTITY_CHARS:
            # The key lives in a 255-character column (the table's idempotency_key).
            raise ConfigValidationError(
                "invalid_streamingjob", fields=("config_name",), problems=("active_key_too_long",)
            )
    return FrozenEnvelope(
        queue=queue,
        authored_json=authored_json,
        field_texts=MappingProxyType({name: text for name, (_, text) in fields.items()}),
        job_id=values["job_id"],
        run_id=values.get("run_id"),
        fires_at_us=None if fires_at is None else datetime_to_micros(fires_at),
        idempotency_key=values.get("idempotency_key"),
        max_attempts=values["max_attempts"],
        active_key=active_key,
        force=bool(values.get("force", False)),
        queue_name=values.get("queue_name"),
        task_name=values.get("task_name"),
        priority=values.get("priority", 0),
        delay_us=(values.get("delay_ms") or 0) * 1000,
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
        field_texts=frozen.field_texts,
        fingerprint=submission_fingerprint(queue, checked_submission_id, frozen.authored_json),
        job_id=frozen.job_id,
        run_id=frozen.run_id,
        fires_at_us=frozen.fires_at_us,
        idempotency_key=frozen.idempotency_key,
        max_attempts=frozen.max_attempts,
        active_key=frozen.active_key,
        force=frozen.force,
        queue_name=frozen.queue_name,
        task_name=frozen.task_name,
        priority=frozen.priority,
        delay_us=frozen.delay_us,
    )
