"""Workflow Runs on SQLite and PostgreSQL: the Run ledger (Runs, deliveries, consents,
delegated jobs), the broker port their hops are delivered through and its brokers,
checkpoints, recovery, the workflow registry, the Run worker and the lifespan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .broker import Broker, BrokerJobState, BrokerProbe, BrokerUnavailable, InMemoryBroker
    from .checkpoints import Checkpoint, Checkpoints
    from .ledger import RunLedger, resume_and_publish
    from .queue_broker import QueueBroker
    from .recovery import RecoveryIssue, RecoveryPorts, RecoveryReport, run_relays
    from .runtime import RunRuntime, ShutdownIncomplete, StartupDegraded
    from .saq_broker import SaqBroker  # imports SAQ only when it connects (extra tenure[saq])
    from .worker import RunWorker, WorkerStopFailed
    from .replay import ChildFailed, ChildHandle, ConsentAnswer, JobAnswer, ServiceAnswer, WorkflowContext
    from .workflows import HopLost, HopParked, RunContext, WorkflowDiverged, Workflows

__all__ = ["Broker", "BrokerJobState", "BrokerProbe", "BrokerUnavailable", "InMemoryBroker", "RunLedger",
           "RecoveryPorts", "RecoveryReport", "RecoveryIssue", "run_relays", "SaqBroker", "QueueBroker",
           "Checkpoint", "Checkpoints", "Workflows", "RunContext", "HopParked", "HopLost", "WorkflowDiverged", "WorkflowContext", "ConsentAnswer",
           "JobAnswer", "ChildFailed", "ChildHandle", "ServiceAnswer", "resume_and_publish",
           "RunWorker", "WorkerStopFailed", "RunRuntime", "StartupDegraded", "ShutdownIncomplete"]

__getattr__ = lazy_exports(__name__, {
    "Broker": ".broker", "BrokerJobState": ".broker", "BrokerProbe": ".broker", "BrokerUnavailable": ".broker",
    "InMemoryBroker": ".broker",
    "Checkpoint": ".checkpoints", "Checkpoints": ".checkpoints",
    "RunLedger": ".ledger",
    "QueueBroker": ".queue_broker",
    "RecoveryIssue": ".recovery", "RecoveryPorts": ".recovery", "RecoveryReport": ".recovery", "run_relays": ".recovery",
    "RunRuntime": ".runtime", "ShutdownIncomplete": ".runtime", "StartupDegraded": ".runtime",
    "SaqBroker": ".saq_broker",
    "RunWorker": ".worker", "WorkerStopFailed": ".worker",
    "HopLost": ".workflows", "HopParked": ".workflows", "RunContext": ".workflows", "Workflows": ".workflows",
    "WorkflowDiverged": ".workflows", "WorkflowContext": ".replay", "ConsentAnswer": ".replay", "JobAnswer": ".replay",
    "ServiceAnswer": ".replay", "ChildFailed": ".replay", "ChildHandle": ".replay",
    "resume_and_publish": ".ledger",
})
