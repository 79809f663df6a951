"""The public job envelopes: what a caller submits, and what an owned claim returns.

Submission envelopes are strict, frozen pydantic models. Construction checks every
bound of the queue specification and raises :class:`ConfigValidationError` (never
pydantic's own error, whose message quotes the input). JSON fields are deep-copied on
construction; :func:`tenure.model.snapshot_submission` copies them again when a
submission is dispatched, so later mutation of any dictionary changes nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any, ClassVar

from pydantic import PrivateAttr
from pydantic_core import PydanticCustomError

from .fence import QueueClaimFence
from .states import JobStatus, QueueKind
from .validation import (
    AwareDatetime,
    ConfigNameText,
    ConfigVersionText,
    ContractNameText,
    ContractVersionText,
    IdentityText,
    JobIdText,
    JsonObject,
    NonEmptyText,
    NonNegativeMs,
    PositiveInt32,
    Priority,
    QueueNameText,
    RunIdText,
    StrictBool,
    StrictModel,
    StringMap,
    TaskNameText,
    take_canonical_text,
)

__all__ = [
    "ValidationJob",
    "PipelineJob",
    "StreamingJob",
    "TaskJob",
    "SubmissionEnvelope",
    "ClaimedJob",
    "ClaimedPipelineJob",
    "ClaimedStreamingJob",
    "ClaimedTask",
    "ENVELOPE_FOR_QUEUE",
    "DEFAULT_MAX_ATTEMPTS",
    "JobState",
    "JobInfo",
]


class _Envelope(StrictModel):
    """Envelopes remember the canonical text of their JSON fields as validated, so a
    submission snapshot can check them and reuse the text instead of encoding again."""

    json_fields: ClassVar[tuple[str, ...]] = ()
    _json_texts: dict[str, str] = PrivateAttr(default_factory=dict)

    def __init__(self, /, **data: Any) -> None:
        super().__init__(**data)

    def model_post_init(self, context: Any, /) -> None:
        for name in self.json_fields:
            value = getattr(self, name)
            text = take_canonical_text(value) if value is not None else None
            if text is not None:
                self._json_texts[name] = text

    def json_text_if_unchanged(self, name: str) -> str | None:
        """The canonical text of a JSON field when its value still equals what was
        validated (a caller may have mutated the dictionary since), else None."""
        text = self._json_texts.get(name)
        if text is None:
            return None
        value = getattr(self, name)
        return text if type(value) is dict and json.loads(text) == value else None


class ValidationJob(_Envelope):
    """Validate ``data_source`` against a named, versioned data contract."""

    queue: ClassVar[QueueKind] = QueueKind.VALIDATION
    json_fields: ClassVar[tuple[str, ...]] = ("options",)

    contract_name: ContractNameText
    contract_version: ContractVersionText
    data_source: NonEmptyText
    options: JsonObject | None = None
    job_id: JobIdText | None = None
    fires_at: AwareDatetime | None = None
    idempotency_key: IdentityText | None = None
    max_attempts: PositiveInt32 | None = None

    def __init__(
        self,
        contract_name: str,
        contract_version: str,
        data_source: str,
        options: dict[str, Any] | None = None,
        job_id: str | None = None,
        fires_at: dt.datetime | None = None,
        idempotency_key: str | None = None,
        max_attempts: int | None = None,
    ) -> None:
        super().__init__(
            contract_name=contract_name,
            contract_version=contract_version,
            data_source=data_source,
            options=options,
            job_id=job_id,
            fires_at=fires_at,
            idempotency_key=idempotency_key,
            max_attempts=max_attempts,
        )


class PipelineJob(_Envelope):
    """Run a pipeline ``config`` with string ``variables``; the run ID names the run.

    ``fail_fast`` (default True, as pycharter's) stops the pipeline at its first failing
    step; ``concept_scheme`` (last, as in pycharter) names the concept scheme the run
    binds, if any.
    """

    queue: ClassVar[QueueKind] = QueueKind.PIPELINE
    json_fields: ClassVar[tuple[str, ...]] = ("config",)

    config: JsonObject
    variables: StringMap | None = None
    fail_fast: StrictBool = True
    run_id: RunIdText | None = None
    job_id: JobIdText | None = None
    fires_at: AwareDatetime | None = None
    idempotency_key: IdentityText | None = None
    max_attempts: PositiveInt32 | None = None
    concept_scheme: IdentityText | None = None

    def __init__(
        self,
        config: dict[str, Any],
        variables: dict[str, str] | None = None,
        fail_fast: bool = True,
        run_id: str | None = None,
        job_id: str | None = None,
        fires_at: dt.datetime | None = None,
        idempotency_key: str | None = None,
        max_attempts: int | None = None,
        concept_scheme: str | None = None,
    ) -> None:
        super().__init__(
            config=config,
            variables=variables,
            fail_fast=fail_fast,
            concept_scheme=concept_scheme,
            run_id=run_id,
            job_id=job_id,
            fires_at=fires_at,
            idempotency_key=idempotency_key,
            max_attempts=max_attempts,
        )


class StreamingJob(_Envelope):
    """Launch a long-running stream for ``config_name@config_version``.

    ``force=True`` asks to cancel the config's active launch and replace it atomically.
    """

    queue: ClassVar[QueueKind] = QueueKind.STREAMING

    config_name: ConfigNameText
    config_version: ConfigVersionText
    variables: StringMap | None = None
    force: StrictBool = False
    job_id: JobIdText | None = None
    fires_at: AwareDatetime | None = None
    max_attempts: PositiveInt32 | None = None

    def __init__(
        self,
        config_name: str,
        config_version: str,
        variables: dict[str, str] | None = None,
        force: bool = False,
        job_id: str | None = None,
        fires_at: dt.datetime | None = None,
        max_attempts: int | None = None,
    ) -> None:
        super().__init__(
            config_name=config_name,
            config_version=config_version,
            variables=variables,
            force=force,
            job_id=job_id,
            fires_at=fires_at,
            max_attempts=max_attempts,
        )

    @property
    def active_key(self) -> str:
        """The per-config key an active launch holds (``streaming:{name}@{version}``)."""
        return f"streaming:{self.config_name}@{self.config_version}"


class TaskJob(_Envelope):
    """Run the task ``task_name`` with keyword arguments ``args`` (a JSON object) on the
    task queue ``queue_name``.

    ``priority`` (0..100, default 0): a higher priority is claimed first, then the
    earlier due time, then the earlier submission. It is due at ``fires_at``, or
    ``delay_ms`` after the database time of its insert, or at once. The retry policy
    travels with the task, so a retry follows the policy it was deferred under even after
    a deploy: attempt ``n`` failing waits ``min(retry_max_ms, retry_base_ms * 2**n)``,
    less a random part of up to half of it when ``retry_jitter`` (so that tasks failing
    together do not retry together).
    """

    queue: ClassVar[QueueKind] = QueueKind.TASK
    json_fields: ClassVar[tuple[str, ...]] = ("args",)

    queue_name: QueueNameText
    task_name: TaskNameText
    args: JsonObject
    priority: Priority = 0
    retry_base_ms: NonNegativeMs = 1000
    retry_max_ms: NonNegativeMs = 300_000
    retry_jitter: StrictBool = True
    job_id: JobIdText | None = None
    fires_at: AwareDatetime | None = None
    delay_ms: NonNegativeMs | None = None
    max_attempts: PositiveInt32 | None = None

    def __init__(
        self,
        queue_name: str,
        task_name: str,
        args: dict[str, Any] | None = None,
        priority: int = 0,
        retry_base_ms: int = 1000,
        retry_max_ms: int = 300_000,
        retry_jitter: bool = True,
        job_id: str | None = None,
        fires_at: dt.datetime | None = None,
        delay_ms: int | None = None,
        max_attempts: int | None = None,
    ) -> None:
        super().__init__(
            queue_name=queue_name,
            task_name=task_name,
            args={} if args is None else args,
            priority=priority,
            retry_base_ms=retry_base_ms,
            retry_max_ms=retry_max_ms,
            retry_jitter=retry_jitter,
            job_id=job_id,
            fires_at=fires_at,
            delay_ms=delay_ms,
            max_attempts=max_attempts,
        )

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        # Checked after construction (StrictModel turns these into ConfigValidationError
        # through the failure path below, never pydantic's text).
        if self.retry_base_ms > self.retry_max_ms:
            raise PydanticCustomError("base_above_max", "retry base above its maximum")
        if self.fires_at is not None and self.delay_ms is not None:
            raise PydanticCustomError("fires_at_and_delay", "either fires_at or delay_ms")


SubmissionEnvelope = ValidationJob | PipelineJob | StreamingJob | TaskJob

ENVELOPE_FOR_QUEUE: dict[QueueKind, type[StrictModel]] = {
    QueueKind.VALIDATION: ValidationJob,
    QueueKind.PIPELINE: PipelineJob,
    QueueKind.STREAMING: StreamingJob,
    QueueKind.TASK: TaskJob,
}

DEFAULT_MAX_ATTEMPTS: dict[QueueKind, int] = {
    QueueKind.VALIDATION: 5,
    QueueKind.PIPELINE: 5,
    QueueKind.STREAMING: 3,
    QueueKind.TASK: 3,
}
"""Used when neither the envelope nor WorkerConfig sets max_attempts (the legacy defaults;
a task gets three, so that a worker lost mid-task does not fail it outright)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedJob:
    """A claimed validation job: its ID, this claim's attempt number, the submitted envelope
    and the fence every later owned write must present unchanged (None for a legacy
    ``claim_next``, which has no fence)."""

    job_id: str
    attempt: int
    job: ValidationJob
    claim_fence: QueueClaimFence | None
    due_at_us: int | None = None
    """When the job was due, as stored when claimed (database clock, microseconds since
    the epoch): its ``fires_at``, or a retry's backoff end."""
    claimed_at_us: int | None = None
    """When this claim was made (database clock, microseconds since the epoch)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedPipelineJob:
    """A claimed pipeline job; ``run_id`` names the run, the fence carries the job ID."""

    job_id: str
    run_id: str
    attempt: int
    job: PipelineJob
    claim_fence: QueueClaimFence | None
    due_at_us: int | None = None
    """When the job was due, as stored when claimed (database clock, microseconds since
    the epoch): its ``fires_at``, or a retry's backoff end."""
    claimed_at_us: int | None = None
    """When this claim was made (database clock, microseconds since the epoch)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedStreamingJob:
    """A claimed streaming launch."""

    job_id: str
    attempt: int
    job: StreamingJob
    claim_fence: QueueClaimFence | None
    due_at_us: int | None = None
    """When the job was due, as stored when claimed (database clock, microseconds since
    the epoch): its ``fires_at``, or a retry's backoff end."""
    claimed_at_us: int | None = None
    """When this claim was made (database clock, microseconds since the epoch)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedTask:
    """A claimed task: this claim's attempt number, the deferred envelope and its fence."""

    job_id: str
    attempt: int
    job: TaskJob
    claim_fence: QueueClaimFence | None
    due_at_us: int | None = None
    """When the job was due, as stored when claimed (database clock, microseconds since
    the epoch): its ``fires_at``, or a retry's backoff end."""
    claimed_at_us: int | None = None
    """When this claim was made (database clock, microseconds since the epoch)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobState:
    """A job's row without what it carries (its envelope, result and progress): what a
    display shows of a job even when another client stored those in a shape tenure does
    not read (the console's job page). Never its claim token."""

    queue: QueueKind
    job_id: str
    run_id: str | None
    status: JobStatus
    attempt: int
    max_attempts: int
    generation: int
    owner_id: str | None
    protected: bool
    """An owned submission (replayable by its submission ID; skipped by retention)."""
    submission_id: str | None
    fires_at: dt.datetime
    created_at: dt.datetime
    claimed_at: dt.datetime | None
    lease_expires_at: dt.datetime | None
    completed_at: dt.datetime | None
    cancel_requested: bool
    pid: int | None
    error: str | None
    dlq_record_id: str | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobInfo(JobState):
    """What ``get_job`` and ``list_jobs`` show of a job: its :class:`JobState` and what it
    carries, read. Never its claim token."""

    result: Any
    job: SubmissionEnvelope
    progress: Any = None
    """A task's last reported progress (None for pycharter's queues)."""
