"""tenure.adapters: the imperative shell (schema, SQLite and PostgreSQL stores, job sources).

Adapters lock a row, sample the database clock, ask the kernel and persist its decision
with a compare-and-set. They never decide a transition themselves.

The names below are imported on first use (``core/lazy.py``), so ``import
tenure.adapters`` (and the ``tenure`` command's start) pays only for what it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core.lazy import lazy_exports

if TYPE_CHECKING:
    from .attempts import AttemptLedger, AttemptRunner, EgressPolicy, ProviderDriver
    from .wiring.migrations import MigrationReport, downgrade, upgrade
    from .queue import (
        FailJob,
        JobContext,
        JobSource,
        OwnedPipelineJobSource,
        OwnedStreamingJobSource,
        OwnedValidationJobSource,
        PipelineJobSource,
        StreamingJobSource,
        TaskSource,
        ValidationJobSource,
        Worker,
        WorkerStats,
    )
    from .runs import (
        Broker,
        BrokerJobState,
        BrokerProbe,
        Checkpoint,
        InMemoryBroker,
        QueueBroker,
        RecoveryIssue,
        RecoveryPorts,
        RecoveryReport,
        RunContext,
        RunLedger,
        RunRuntime,
        RunWorker,
        SaqBroker,
        ShutdownIncomplete,
        StartupDegraded,
        WorkerStopFailed,
        Workflows,
        resume_and_publish,
        run_relays,
    )
    from .tasks import Backoff, Task, TaskApp, TaskContext, TaskOutcome

__all__ = [
    "TaskApp",
    "Task",
    "Backoff",
    "TaskContext",
    "TaskOutcome",
    "AttemptLedger",
    "Broker",
    "BrokerJobState",
    "BrokerProbe",
    "InMemoryBroker",
    "RunLedger",
    "RecoveryPorts",
    "RecoveryReport",
    "RecoveryIssue",
    "run_relays",
    "SaqBroker",
    "QueueBroker",
    "Checkpoint",
    "Workflows",
    "RunContext",
    "RunWorker",
    "WorkerStopFailed",
    "RunRuntime",
    "StartupDegraded",
    "ShutdownIncomplete",
    "resume_and_publish",
    "AttemptRunner",
    "ProviderDriver",
    "EgressPolicy",
    "ValidationJobSource",
    "PipelineJobSource",
    "StreamingJobSource",
    "TaskSource",
    "JobSource",
    "OwnedValidationJobSource",
    "OwnedPipelineJobSource",
    "OwnedStreamingJobSource",
    "Worker",
    "JobContext",
    "WorkerStats",
    "FailJob",
    "upgrade",
    "downgrade",
    "MigrationReport",
]

__getattr__ = lazy_exports(__name__, {
    "TaskApp": ".tasks",
    "Task": ".tasks",
    "Backoff": ".tasks",
    "TaskContext": ".tasks",
    "TaskOutcome": ".tasks",
    "AttemptLedger": ".attempts",
    "AttemptRunner": ".attempts",
    "EgressPolicy": ".attempts",
    "ProviderDriver": ".attempts",
    "Broker": ".runs",
    "BrokerJobState": ".runs",
    "BrokerProbe": ".runs",
    "Checkpoint": ".runs",
    "InMemoryBroker": ".runs",
    "QueueBroker": ".runs",
    "RecoveryIssue": ".runs",
    "RecoveryPorts": ".runs",
    "RecoveryReport": ".runs",
    "RunContext": ".runs",
    "RunLedger": ".runs",
    "RunRuntime": ".runs",
    "RunWorker": ".runs",
    "SaqBroker": ".runs",
    "ShutdownIncomplete": ".runs",
    "StartupDegraded": ".runs",
    "WorkerStopFailed": ".runs",
    "Workflows": ".runs",
    "resume_and_publish": ".runs",
    "run_relays": ".runs",
    "MigrationReport": ".wiring.migrations",
    "downgrade": ".wiring.migrations",
    "upgrade": ".wiring.migrations",
    "OwnedPipelineJobSource": ".queue",
    "OwnedStreamingJobSource": ".queue",
    "OwnedValidationJobSource": ".queue",
    "JobSource": ".queue",
    "PipelineJobSource": ".queue",
    "StreamingJobSource": ".queue",
    "TaskSource": ".queue",
    "ValidationJobSource": ".queue",
    "FailJob": ".queue",
    "JobContext": ".queue",
    "Worker": ".queue",
    "WorkerStats": ".queue",
})
