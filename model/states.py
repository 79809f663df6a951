"""Queue kinds and job statuses. Enum values are exactly the stored column values."""

from __future__ import annotations

import enum

__all__ = ["QueueKind", "JobStatus", "TERMINAL_STATUSES"]


class QueueKind(enum.Enum):
    """Which queue table a job lives in; part of every fence and fingerprint."""

    VALIDATION = "validation"
    PIPELINE = "pipeline"
    STREAMING = "streaming"


class JobStatus(enum.Enum):
    """Where one job row stands."""

    PENDING = "pending"
    CLAIMED = "claimed"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
