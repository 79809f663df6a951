"""The owned queue's adapters: its tables (pycharter's, plus tenure's additions), its
operations on the shared engine, the public job sources and the fenced worker."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .owned import OwnedPipelineJobSource, OwnedStreamingJobSource, OwnedValidationJobSource
    from .sources import JobSource, PipelineJobSource, StreamingJobSource, TaskSource, ValidationJobSource
    from .job import FailJob, JobContext
    from .runner import WorkerStats
    from .worker import Worker

__all__ = ["JobSource", "ValidationJobSource", "PipelineJobSource", "StreamingJobSource", "TaskSource",
           "OwnedValidationJobSource", "OwnedPipelineJobSource", "OwnedStreamingJobSource",
           "Worker", "JobContext", "WorkerStats", "FailJob"]

__getattr__ = lazy_exports(__name__, {
    "JobSource": ".sources", "ValidationJobSource": ".sources", "PipelineJobSource": ".sources",
    "StreamingJobSource": ".sources", "TaskSource": ".sources",
    "OwnedValidationJobSource": ".owned", "OwnedPipelineJobSource": ".owned", "OwnedStreamingJobSource": ".owned",
    "Worker": ".worker", "JobContext": ".job", "WorkerStats": ".runner", "FailJob": ".job",
})
