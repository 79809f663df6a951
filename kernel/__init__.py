"""tenure.kernel: pure, total decision functions. No I/O, no clock, no randomness.

``tenure.kernel.core`` holds what every machine shares (rows, rules, decisions,
finders, ``decide``) and ``tenure.kernel.ahead`` the decisions made ahead of a write.
Each machine has its own folder: ``queue/`` (the owned queue), ``attempts/`` (service
job attempts), ``runs/`` (workflow Runs and their deliveries), ``consents/`` and
``agent_jobs/`` (the owners a Run waits for), ``nodes/`` (node leases), and
``recovery/`` (the decision table startup reconciliation and relays follow). See
``specs/`` for the tables reviewers read and the invariants every decision keeps.

Exported here: the core (``Machine``, ``Row``, ``Rule``, ``Applied``, ``Refused``,
``Decision``) and every machine by name (``QUEUE``, ``ATTEMPTS``, ``RUNS``,
``CONSENTS``, ``AGENT_JOBS``, ``NODES``; ``machine.decide(record, command, now_us)``),
and, for the callers that grew up with them, the queue's own names (``decide`` and
``select_rule`` here are the queue's). A machine's records, commands and rules are
imported from its folder.

Every machine names its parts alike: ``<Machine>Step`` (the states of its table),
``<Machine>Row`` (its record), ``<Machine>CommandType`` and ``<Machine>Refusal``. The
queue's names before that scheme (``QueueState``, ``JobRecord``, ``CommandType``,
``Refusal``) remain here as aliases for one release; new code uses ``QueueStep``,
``QueueRow``, ``QueueCommandType`` and ``QueueRefusal``.
"""

from __future__ import annotations

from .agent_jobs.machine import AGENT_JOBS
from .attempts.machine import ATTEMPTS
from .consents.machine import CONSENTS
from .core import Machine, Row
from .nodes.machine import NODES
from .queue.commands import (
    FENCED_COMMANDS,
    Ack,
    AcknowledgeCancelOwned,
    CancelAdmin,
    ClaimFence,
    ClaimGranted,
    ClaimLegacy,
    ClaimOwned,
    Command,
    CompleteLegacy,
    CompleteOwned,
    DeleteLegacy,
    ExpireLease,
    FailLegacy,
    FailOwned,
    HeartbeatLegacy,
    HeartbeatOwned,
    PurgeFinished,
    QueueCommandType,
    ReadStateOwned,
    RecoverOwned,
    ReleaseKeyForLegacy,
    ReleaseKeyForOwned,
    ReleaseOwned,
    ProgressOwned,
    Reply,
    RequestCancel,
    RetryFailed,
    SetPidLegacy,
    SetPidOwned,
    StreamingStateReply,
    SubmitLegacy,
    SubmitOwned,
    Submitted,
)
from .queue.machine import (
    EFFECTS,
    GUARDS,
    LEASE_EXPIRED_ERROR,
    OUTCOMES,
    QUEUE,
    ROWS,
    TABLE,
    Applied,
    Decision,
    QueueRefusal,
    Refused,
    Rule,
    backoff_delay_us,
    claim_identity_problem,
    decide,
    fence_matches,
    select_rule,
    transition_violations,
)
from .queue.record import (
    MAX_INSTANT_US,
    MIN_INSTANT_US,
    QueueRow,
    QueueStep,
    dedupe_key_of,
    is_currently_owned,
    is_valid_record,
    record_violations,
    state_of,
)
from .runs.machine import RUNS

MACHINES: tuple[Machine, ...] = (QUEUE, ATTEMPTS, RUNS, CONSENTS, AGENT_JOBS, NODES)
"""Every machine, registered once: the adapters' registry, the spec-table checks and the
shared tests read this tuple (a machine's folder is :attr:`Machine.folder`)."""

__all__ = [
    "QueueState",
    "JobRecord",
    "CommandType",
    "Refusal",
    "FENCED_COMMANDS",
    "AcknowledgeCancelOwned",
    "ReleaseOwned",
    "ProgressOwned",
    "RetryFailed",
    "Ack",
    "CancelAdmin",
    "ClaimFence",
    "ClaimGranted",
    "ClaimLegacy",
    "ClaimOwned",
    "Command",
    "QueueCommandType",
    "CompleteLegacy",
    "CompleteOwned",
    "DeleteLegacy",
    "ExpireLease",
    "FailLegacy",
    "FailOwned",
    "HeartbeatLegacy",
    "HeartbeatOwned",
    "PurgeFinished",
    "ReadStateOwned",
    "RecoverOwned",
    "ReleaseKeyForLegacy",
    "ReleaseKeyForOwned",
    "Reply",
    "RequestCancel",
    "SetPidLegacy",
    "SetPidOwned",
    "StreamingStateReply",
    "SubmitLegacy",
    "Submitted",
    "SubmitOwned",
    "EFFECTS",
    "GUARDS",
    "LEASE_EXPIRED_ERROR",
    "OUTCOMES",
    "QUEUE",
    "ROWS",
    "TABLE",
    "Applied",
    "Decision",
    "QueueRefusal",
    "Refused",
    "Rule",
    "backoff_delay_us",
    "claim_identity_problem",
    "decide",
    "fence_matches",
    "select_rule",
    "transition_violations",
    "MAX_INSTANT_US",
    "MIN_INSTANT_US",
    "QueueRow",
    "QueueStep",
    "dedupe_key_of",
    "is_currently_owned",
    "is_valid_record",
    "record_violations",
    "state_of",
    "Machine",
    "Row",
    "ATTEMPTS",
    "RUNS",
    "CONSENTS",
    "AGENT_JOBS",
    "NODES",
    "MACHINES",
]

# The queue's names before every machine was named alike (deprecated; removed in the next
# release).
QueueState = QueueStep
JobRecord = QueueRow
CommandType = QueueCommandType
Refusal = QueueRefusal
