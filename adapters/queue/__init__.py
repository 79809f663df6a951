"""The owned queue's adapters: its tables (pycharter's, plus tenure's additions), its
operations on the shared engine, and the public job sources."""

from __future__ import annotations

from .sources import JobSource, PipelineJobSource, StreamingJobSource, ValidationJobSource

__all__ = ["JobSource", "ValidationJobSource", "PipelineJobSource", "StreamingJobSource"]
