"""Queue kinds and job statuses. Enum values are exactly the stored column values."""

from __future__ import annotations

import enum

__all__ = ["QueueKind", "PYCHARTER_QUEUES", "JobStatus", "TERMINAL_STATUSES"]


class QueueKind(enum.Enum):
    """Which queue table a job lives in; part of every fence and fingerprint."""

    VALIDATION = "validation"
    PIPELINE = "pipeline"
    STREAMING = "streaming"
    TASK = "task"
    """tenure's general tasks (``tenure_tasks``): any named queue, any task name."""


PYCHARTER_QUEUES: tuple[QueueKind, ...] = (QueueKind.VALIDATION, QueueKind.PIPELINE, QueueKind.STREAMING)
"""The queues of pycharter's three job tables (legacy writes and claims are theirs only)."""


class JobStatus(enum.Enum):
    """Where one job row stands."""

    PENDING = "pending"
    CLAIMED = "claimed"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
