"""The Run machine's tables, in the queues' database.

``tenure_runs`` (one row per Run, step ``runs_v1``; ``runs_v2`` adds ``admitted_node``,
``runs_v4`` an index on ``idempotency_key``, ``runs_v5`` the result and the lost-hop
retries, ``runs_v7`` the deadline) and ``tenure_run_deliveries`` (one row per hop, keyed by its hop key; at most one
unsettled per Run, enforced by a partial unique index on both databases): the two halves
of the Run machine's pair. Beside them, two tables no machine decides, written under the
Run's lock: ``tenure_run_checkpoints`` (``runs_v3``) and the step journal
``tenure_run_steps`` (``runs_v5``), and the latest recovery report of each node,
``tenure_run_recovery_reports`` (``runs_v6``). The Run's owners have their machines' tables
(``adapters/consents/table.py``, ``adapters/agent_jobs/table.py``, and
``adapters/messages/table.py``: its messages and receives, ``runs_v8``, which also
re-creates the Runs' and checkpoints' checks with the status ``awaiting_message`` and
the owner kind ``message``). CHECK constraints hold
the stored values to the machines' states and bounds even against a writer that is not
tenure. Intents, payloads and results are canonical JSON text; instants follow the
dialect, like every tenure table.
"""

from __future__ import annotations

import dataclasses
import functools

from sqlalchemy import Boolean, DateTime, Integer, String, Text

from tenure.kernel.runs.machine import RUNS
from tenure.kernel.runs.record import DeliveryRow, RunRow
from tenure.model import DeliveryState, RunStatus, WaitKind

from ..core.tables import (
    Binding,
    Codec,
    ColumnSpec,
    IndexSpec,
    MachineTables,
    RetirementGuard,
    Step,
    TableSpec,
    column,
    one_of,
)

__all__ = [
    "RUNS_TABLE", "DELIVERIES_TABLE", "RUNS_BINDING", "DELIVERIES_BINDING", "CURRENT_DELIVERY",
    "CheckpointRow", "CHECKPOINTS_TABLE", "CHECKPOINTS_BINDING", "StepRow", "STEPS_TABLE", "STEPS_BINDING", "MAX_STEP_NAME_CHARS",
    "RecoveryReportRow", "RECOVERY_REPORTS_TABLE", "RECOVERY_REPORTS_BINDING", "REPORT_PASSES",
    "RUNS_STEP", "RECOVERY_STEP", "WORKERS_STEP", "ADMISSION_KEYS_STEP", "LIVENESS_STEP", "REPORTS_STEP", "CONSOLE_STEP",
    "TIMEOUTS_STEP",
    "MESSAGES_STEP",
    "MACHINE_TABLES",
]

C = Codec

RUNS_STEP = Step("runs_v1", 3)
"""``tenure_runs`` and ``tenure_run_deliveries``, with the owners' tables (consents,
delegated jobs) and an index of the attempts by Run."""
RECOVERY_STEP = Step("runs_v2", 4)
"""``tenure_runs.admitted_node``."""
WORKERS_STEP = Step("runs_v3", 5)
"""``tenure_run_checkpoints`` (and the Run hops' queue table, ``tenure_run_hops``)."""
ADMISSION_KEYS_STEP = Step("runs_v4", 6)
"""An index on ``tenure_runs.idempotency_key``."""
LIVENESS_STEP = Step("runs_v5", 7)
"""A Run's result and lost-hop retries, timers, the step journal, node leases and
consent deadlines."""
TIMEOUTS_STEP = Step("runs_v7", 13)
"""``tenure_runs.deadline``: when a Run admitted with a timeout times out (database
clock), and an index the relays find the Runs whose deadline passed by."""
REPORTS_STEP = Step("runs_v6", 9)
"""``tenure_run_recovery_reports``: the latest recovery report of each node (what
``tenure health`` reads). Numbered before ``versions_v1`` although it came after it, as
``tasks_v1`` is."""
CONSOLE_STEP = Step("console_v1", 10)
"""Indexes in the orders the console's lists page in (``tenure console``)."""
MESSAGES_STEP = Step("runs_v8", 14)
"""Messages to a Run (``adapters/messages/table.py`` creates their table): a Run may wait
``awaiting_message`` on a receive (owner kind ``message``), so the checks of the Runs and
their checkpoints created earlier are re-created with the wider lists."""

_STEP = RUNS_STEP
_INSTANT = DateTime(timezone=True)


_column = functools.partial(column, step=_STEP)



RUNS_TABLE = TableSpec(
    "tenure_runs",
    (
        _column("run_id", C.TEXT, String(36), mutable=False, primary_key=True),
        _column("status", C.ENUM, String(20), mutable=True, choices=RunStatus),
        _column("session_id", C.OPTIONAL_TEXT, String(128), mutable=False),
        _column("source", C.TEXT, String(64), mutable=False),
        _column("principal", C.TEXT, String(255), mutable=False),
        _column("scopes", C.TEXTS, Text(), mutable=False),
        _column("payload_json", C.TEXT, Text(), mutable=False),
        _column("requested_priority", C.OPTIONAL_INT, Integer(), mutable=False),
        _column("intent_digest", C.TEXT, String(71), mutable=False),
        _column("idempotency_key", C.OPTIONAL_TEXT, String(255), mutable=False),
        _column("queue_name", C.TEXT, String(50), mutable=False, field="queue"),
        _column("priority", C.INT, Integer(), mutable=False),
        _column("workflow_name", C.TEXT, String(100), mutable=False),
        _column("workflow_revision", C.TEXT, String(64), mutable=False),
        _column("workflow_digest", C.TEXT, String(255), mutable=False),
        _column("enqueue_seq", C.INT, Integer(), mutable=True),
        _column("started_at", C.OPTIONAL_INSTANT, _INSTANT, mutable=True, field="started_at_us"),
        _column("node", C.OPTIONAL_TEXT, String(128), mutable=True),
        _column("owner_kind", C.OPTIONAL_ENUM, String(20), mutable=True, choices=WaitKind),
        _column("owner_id", C.OPTIONAL_TEXT, String(128), mutable=True),
        _column("error", C.OPTIONAL_TEXT, Text(), mutable=True),
        _column("created_at", C.INSTANT, _INSTANT, mutable=False, field="created_at_us"),
        _column("updated_at", C.INSTANT, _INSTANT, mutable=True, field="updated_at_us"),
        # runs_v2 (recovery): the admitting node, so startup fails only its own node's
        # unreleased HELD admissions (NULL: every node's, as in one process).
        ColumnSpec("admitted_node", "admitted_node", C.OPTIONAL_TEXT, String(128), True, False, step=RECOVERY_STEP),
        # runs_v5 (liveness): a DONE Run's result, the lost-hop retries its workflow allows
        # and has used, and the lost Run an operator re-admitted this one for.
        ColumnSpec("result_json", "result_json", C.OPTIONAL_TEXT, Text(), True, True, step=LIVENESS_STEP),
        ColumnSpec("max_hop_retries", "max_hop_retries", C.INT, Integer(), False, False, step=LIVENESS_STEP,
                   default_sql="0"),
        ColumnSpec("hop_retries", "hop_retries", C.INT, Integer(), False, True, step=LIVENESS_STEP, default_sql="0"),
        ColumnSpec("retry_of", "retry_of", C.OPTIONAL_TEXT, String(36), True, False, step=LIVENESS_STEP),
        # runs_v5: a timer wait's due time (its owner is the database clock).
        ColumnSpec("wake_at", "wake_at_us", C.OPTIONAL_INSTANT, _INSTANT, True, True, step=LIVENESS_STEP),
        # runs_v7: when the Run times out (admission time plus its timeout; NULL: never),
        # part of its identity (never updated). Runs admitted earlier have none.
        ColumnSpec("deadline", "deadline_us", C.OPTIONAL_INSTANT, _INSTANT, True, False, step=TIMEOUTS_STEP),
    ),
    indexes=(
        IndexSpec("ix_tenure_runs_status_updated", ("status", "updated_at", "run_id"), step=_STEP),
        IndexSpec("ix_tenure_runs_session", ("session_id", "status"), step=_STEP),
        IndexSpec("ix_tenure_runs_created", ("created_at", "run_id"), step=_STEP),
        # runs_v4: an admission that meets no Run at its key's derived ID looks the key up
        # (Runs admitted before runs_v4 keep their source-scoped IDs).
        IndexSpec("ix_tenure_runs_idempotency_key", ("idempotency_key",), step=ADMISSION_KEYS_STEP),
        # console_v1: the console's Run pages of one status, one queue or one workflow,
        # newest first, each one range of an index in the page's order.
        IndexSpec("ix_tenure_runs_status_created", ("status", "created_at", "run_id"), step=CONSOLE_STEP),
        IndexSpec("ix_tenure_runs_queue_created", ("queue_name", "created_at", "run_id"), step=CONSOLE_STEP),
        IndexSpec("ix_tenure_runs_workflow_created", ("workflow_name", "created_at", "run_id"), step=CONSOLE_STEP),
        # runs_v7: the relays' sweep of deadlines that passed, one range per open status
        # in (deadline, run_id) order (terminal Runs are never read there).
        IndexSpec("ix_tenure_runs_status_deadline", ("status", "deadline", "run_id"), step=TIMEOUTS_STEP),
    ),
    created_by=_STEP,
    # runs_v5 added the status awaiting_timer and the owner kind timer, runs_v8 the status
    # awaiting_message and the owner kind message: a table created earlier has its status
    # and owner checks re-created with the wider lists (once, by the latest step that
    # widened them: an upgrade applies every step in one transaction).
    checks_replaced_by=MESSAGES_STEP,
    checks=(
        ("ck_tenure_runs_status", one_of("status", RunStatus)),
        ("ck_tenure_runs_priority", "priority >= 0 AND priority <= 100"),
        ("ck_tenure_runs_enqueue_seq", "enqueue_seq >= 0"),
        ("ck_tenure_runs_wait_owner",
         "status NOT IN ('awaiting_consent', 'awaiting_delegate', 'awaiting_service', 'awaiting_message') "
         "OR owner_id IS NOT NULL"),
        ("ck_tenure_runs_owner_kind", "owner_kind IS NULL OR " + one_of("owner_kind", WaitKind)),
    ),
)

DELIVERIES_TABLE = TableSpec(
    "tenure_run_deliveries",
    (
        _column("delivery_id", C.TEXT, String(64), mutable=False, primary_key=True),
        _column("run_id", C.TEXT, String(36), mutable=False),
        _column("enqueue_seq", C.INT, Integer(), mutable=False),
        _column("state", C.ENUM, String(20), mutable=True, choices=DeliveryState),
        _column("queue_name", C.TEXT, String(50), mutable=False, field="queue"),
        _column("priority", C.INT, Integer(), mutable=False),
        _column("resume", C.FLAG, Boolean(), mutable=False),
        _column("publish_attempts", C.INT, Integer(), mutable=True),
        _column("last_error", C.OPTIONAL_TEXT, Text(), mutable=True),
        _column("claimed_by", C.OPTIONAL_TEXT, String(128), mutable=True),
        _column("published_at", C.OPTIONAL_INSTANT, _INSTANT, mutable=True, field="published_at_us"),
        _column("claimed_at", C.OPTIONAL_INSTANT, _INSTANT, mutable=True, field="claimed_at_us"),
        _column("settled_at", C.OPTIONAL_INSTANT, _INSTANT, mutable=True, field="settled_at_us"),
        _column("created_at", C.INSTANT, _INSTANT, mutable=False, field="created_at_us"),
    ),
    indexes=(
        IndexSpec("ux_tenure_run_deliveries_run_seq", ("run_id", "enqueue_seq"), unique=True, step=_STEP),
        IndexSpec("ux_tenure_run_deliveries_unsettled", ("run_id",), unique=True, step=_STEP,
                  where="state <> 'settled'"),
        IndexSpec("ix_tenure_run_deliveries_state_queue", ("state", "queue_name"), step=_STEP),
    ),
    created_by=_STEP,
    checks=(
        ("ck_tenure_run_deliveries_state", one_of("state", DeliveryState)),
        ("ck_tenure_run_deliveries_attempts", "publish_attempts >= 0"),
        ("ck_tenure_run_deliveries_seq", "enqueue_seq >= 0"),
        ("ck_tenure_run_deliveries_priority", "priority >= 0 AND priority <= 100"),
    ),
)

RUNS_BINDING = Binding("runs", RUNS, RUNS_TABLE, RunRow, {}, "run_id")
DELIVERIES_BINDING = Binding("run_deliveries", RUNS, DELIVERIES_TABLE, DeliveryRow, {}, "delivery_id")
"""The two halves of the Run machine's pair (the machine checks the pair, not a half)."""

CURRENT_DELIVERY = (("run_id", "run_id"), ("enqueue_seq", "enqueue_seq"))
"""A Run's current delivery, as a join: the delivery of its Run at its ``enqueue_seq``."""


# --- The Run's own side tables: written through the shared store primitives, decided by no machine. ---

@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointRow:
    run_id: str
    enqueue_seq: int
    owner_kind: WaitKind | None
    owner_id: str | None
    state_json: str
    saved_at_us: int
    outcome_seq: int | None = None
    outcome_status: RunStatus | None = None
    outcome_json: str | None = None
    outcome_error: str | None = None


_checkpoint_column = functools.partial(column, step=WORKERS_STEP)


CHECKPOINTS_TABLE = TableSpec(
    "tenure_run_checkpoints",
    (
        _checkpoint_column("run_id", Codec.TEXT, String(36), mutable=False, primary_key=True),
        _checkpoint_column("enqueue_seq", Codec.INT, Integer(), mutable=True),
        _checkpoint_column("owner_kind", Codec.OPTIONAL_ENUM, String(20), mutable=True, choices=WaitKind),
        _checkpoint_column("owner_id", Codec.OPTIONAL_TEXT, String(128), mutable=True),
        _checkpoint_column("state_json", Codec.TEXT, Text(), mutable=True),
        _checkpoint_column("saved_at", Codec.INSTANT, DateTime(timezone=True), mutable=True, field="saved_at_us"),
        # runs_v5: the outcome a finished hop recorded before it settles.
        ColumnSpec("outcome_seq", "outcome_seq", Codec.OPTIONAL_INT, Integer(), True, True, step=LIVENESS_STEP),
        ColumnSpec("outcome_status", "outcome_status", Codec.OPTIONAL_ENUM, String(20), True, True,
                   step=LIVENESS_STEP, choices=RunStatus),
        ColumnSpec("outcome_json", "outcome_json", Codec.OPTIONAL_TEXT, Text(), True, True, step=LIVENESS_STEP),
        ColumnSpec("outcome_error", "outcome_error", Codec.OPTIONAL_TEXT, Text(), True, True, step=LIVENESS_STEP),
    ),
    created_by=WORKERS_STEP,
    checks=(
        ("ck_tenure_run_checkpoints_seq", "enqueue_seq >= 0"),
        ("ck_tenure_run_checkpoints_owner",
         "(owner_kind IS NULL AND owner_id IS NULL) OR "
         "(owner_kind IN ('consent', 'delegate', 'service', 'timer', 'message') AND owner_id IS NOT NULL)"),
    ),
    checks_replaced_by=MESSAGES_STEP,  # runs_v5: a checkpoint may bind a timer; runs_v8: a receive
)

CHECKPOINTS_BINDING = Binding("run_checkpoints", None, CHECKPOINTS_TABLE, CheckpointRow, {}, "run_id")
"""Stored through the shared store primitives; no machine decides a checkpoint."""


MAX_STEP_NAME_CHARS = 128


@dataclasses.dataclass(frozen=True, slots=True)
class StepRow:
    step_id: str
    run_id: str
    name: str
    enqueue_seq: int
    result_json: str
    recorded_at_us: int


_step_column = functools.partial(column, step=LIVENESS_STEP)


STEPS_TABLE = TableSpec(
    "tenure_run_steps",
    (
        _step_column("step_id", Codec.TEXT, String(200), primary_key=True),
        _step_column("run_id", Codec.TEXT, String(36)),
        _step_column("name", Codec.TEXT, String(MAX_STEP_NAME_CHARS)),
        _step_column("enqueue_seq", Codec.INT, Integer()),
        _step_column("result_json", Codec.TEXT, Text()),
        _step_column("recorded_at", Codec.INSTANT, DateTime(timezone=True), field="recorded_at_us"),
    ),
    indexes=(IndexSpec("ix_tenure_run_steps_run", ("run_id", "name"), step=LIVENESS_STEP),),
    created_by=LIVENESS_STEP,
    checks=(("ck_tenure_run_steps_seq", "enqueue_seq >= 0"),),
)

STEPS_BINDING = Binding("run_steps", None, STEPS_TABLE, StepRow, {}, "step_id")
"""Stored through the shared store primitives; no machine decides a step."""


# --- The latest recovery report of each node: a diagnostic, decided by no machine. ---

REPORT_PASSES = ("startup", "reboot", "takeover", "relay")
"""Which pass wrote a report: the node's startup reconciliation, its reconciliation after
it fenced itself and booted again, a reconciliation of a dead node's Runs by the node
that took it over (stored under the dead node's name), or a relay round."""


@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryReportRow:
    """What the latest pass about ``node`` reported: never a Run ID, only counts."""

    node: str
    pass_kind: str
    degraded: bool
    issue_count: int
    counts_json: str
    """Canonical JSON object: each of recovery's count names and its count."""
    issue_reasons_json: str
    """Canonical JSON object: each issue reason met and how many Runs had it."""
    finished_at_us: int
    """The database time the report was recorded."""
    queues_json: str = "[]"
    """Canonical JSON array: the Run queues the node's workers serve (a takeover's: none),
    so ``tenure runs admit`` can say when no worker serves a queue."""


_report_column = functools.partial(column, step=REPORTS_STEP)


RECOVERY_REPORTS_TABLE = TableSpec(
    "tenure_run_recovery_reports",
    (
        _report_column("node", Codec.TEXT, String(128), primary_key=True),
        _report_column("pass_kind", Codec.TEXT, String(20), mutable=True),
        _report_column("degraded", Codec.FLAG, Boolean(), mutable=True),
        _report_column("issue_count", Codec.INT, Integer(), mutable=True),
        _report_column("counts_json", Codec.TEXT, Text(), mutable=True),
        _report_column("issue_reasons_json", Codec.TEXT, Text(), mutable=True),
        _report_column("finished_at", Codec.INSTANT, DateTime(timezone=True), mutable=True, field="finished_at_us"),
        _report_column("queues_json", Codec.TEXT, Text(), mutable=True),
    ),
    created_by=REPORTS_STEP,
    checks=(
        ("ck_tenure_run_recovery_reports_pass",
         "pass_kind IN (" + ", ".join(repr(kind) for kind in REPORT_PASSES) + ")"),
        ("ck_tenure_run_recovery_reports_issues", "issue_count >= 0"),
        ("ck_tenure_run_recovery_reports_degraded", "degraded = (issue_count > 0)"),
    ),
)

RECOVERY_REPORTS_BINDING = Binding("run_recovery_reports", None, RECOVERY_REPORTS_TABLE, RecoveryReportRow, {}, "node")
"""Stored through the shared store primitives (see :mod:`tenure.adapters.runs.reports`)."""


MACHINE_TABLES = MachineTables(
    machine=RUNS,
    tables=(RUNS_TABLE, DELIVERIES_TABLE, CHECKPOINTS_TABLE, STEPS_TABLE, RECOVERY_REPORTS_TABLE),
    bindings=(RUNS_BINDING, DELIVERIES_BINDING),
    retirement_guards=(
        # Runs are canonical workflow truth (and their owners the evidence a resume
        # reads): removing the step would lose them. runs_v2, runs_v4, runs_v5 and
        # runs_v7 need no guard of their own: their columns and indexes live on tenure_runs, and
        # this guard already refuses the downgrade while any Run exists.
        RetirementGuard(RUNS_STEP, RUNS_TABLE.name, "run_id", "no recorded runs", "TRUE", "runs_remain"),
        # A checkpoint is what a parked Run resumes from: dropping one strands its Run.
        RetirementGuard(WORKERS_STEP, CHECKPOINTS_TABLE.name, "run_id", "no saved checkpoints", "TRUE",
                        "checkpoints_remain"),
        # runs_v6 needs none: a recovery report is a diagnostic (the next pass writes it
        # again), never evidence any Run is waiting on.
    ),
)
"""The Run machine's tables: the pair, and the evidence written under the Run's lock
(checkpoints, the step journal) and the recovery reports, which no machine decides
(migrated here, bound to no machine)."""
