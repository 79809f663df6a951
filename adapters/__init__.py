"""tenure.adapters: the imperative shell (schema, SQLite and PostgreSQL stores, job sources).

Adapters lock a row, sample the database clock, ask the kernel and persist its decision
with a compare-and-set. They never decide a transition themselves.
"""

from __future__ import annotations

from .attempts import AttemptLedger, AttemptRunner, EgressPolicy, ProviderDriver
from .runs import (
    Broker, BrokerJobState, BrokerProbe, Checkpoint, InMemoryBroker, QueueBroker, RecoveryIssue, RecoveryPorts, RecoveryReport,
    RunContext, RunLedger, RunRuntime, RunWorker, SaqBroker, ShutdownIncomplete, StartupDegraded, WorkerStopFailed, Workflows, resume_and_publish, run_relays,
)
from .migrations import MigrationReport, downgrade, upgrade
from .queue.owned import OwnedPipelineJobSource, OwnedStreamingJobSource, OwnedValidationJobSource
from .queue.sources import JobSource, PipelineJobSource, StreamingJobSource, ValidationJobSource
from .worker import FailJob, JobContext, Worker, WorkerStats

__all__ = [
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
