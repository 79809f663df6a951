"""Workflow Runs on SQLite and PostgreSQL: the Run ledger (Runs, deliveries, consents,
delegated jobs) and the broker port their hops are delivered through."""

from __future__ import annotations

from .broker import Broker, BrokerJobState, BrokerProbe, BrokerUnavailable, InMemoryBroker
from .ledger import RunLedger
from .recovery import RecoveryIssue, RecoveryPorts, RecoveryReport, run_relays
from .queue_broker import QueueBroker
from .saq_broker import SaqBroker  # imports SAQ only when it connects (extra tenure[saq])
from .checkpoints import Checkpoint, Checkpoints
from .workflows import HopLost, HopParked, RunContext, Workflows, resume_and_publish
from .worker import RunWorker, WorkerStopFailed
from .runtime import RunRuntime, ShutdownIncomplete, StartupDegraded

__all__ = ["Broker", "BrokerJobState", "BrokerProbe", "BrokerUnavailable", "InMemoryBroker", "RunLedger",
           "RecoveryPorts", "RecoveryReport", "RecoveryIssue", "run_relays", "SaqBroker", "QueueBroker",
           "Checkpoint", "Checkpoints", "Workflows", "RunContext", "HopParked", "HopLost", "resume_and_publish",
           "RunWorker", "WorkerStopFailed", "RunRuntime", "StartupDegraded", "ShutdownIncomplete"]
