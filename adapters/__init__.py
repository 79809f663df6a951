"""tenure.adapters: the imperative shell (schema, SQLite and PostgreSQL stores, job sources).

Adapters lock a row, sample the database clock, ask the kernel and persist its decision
with a compare-and-set. They never decide a transition themselves.
"""

from __future__ import annotations

from .migrations import MigrationReport, downgrade, upgrade
from .queue.sources import JobSource, PipelineJobSource, StreamingJobSource, ValidationJobSource

__all__ = [
    "ValidationJobSource",
    "PipelineJobSource",
    "StreamingJobSource",
    "JobSource",
    "upgrade",
    "downgrade",
    "MigrationReport",
]
