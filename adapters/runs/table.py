"""The Run ledger's tables, created by the ``runs_v1`` step in the queues' database.

``tenure_runs`` (one row per Run; the ``runs_v2`` step adds ``admitted_node``, ``runs_v4``
an index on ``idempotency_key``, ``runs_v5`` the result and the lost-hop retries),
``tenure_run_deliveries`` (one row per hop, keyed by its hop key; at most one unsettled per Run, enforced by a partial unique index on both
databases), ``tenure_consents`` (``runs_v5`` adds a consent's deadline, ``expires_at``, and an
index on it) and ``tenure_agent_jobs`` (the Run's owners). CHECK
constraints hold the stored values to the machines' states and bounds even against a
writer that is not tenure. Intents, payloads, requests and results are canonical JSON
text; instants follow the dialect, like every tenure table.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Boolean, DateTime, Integer, String, Text

from tenure.kernel.agent_jobs.machine import AGENT_JOBS
from tenure.kernel.agent_jobs.record import AgentJobRow
from tenure.kernel.consents.machine import CONSENTS
from tenure.kernel.consents.record import ConsentRow
from tenure.kernel.runs.machine import RUNS
from tenure.kernel.runs.record import DeliveryRow, RunRow
from tenure.model import AgentJobStatus, ConsentStatus, DeliveryState, RunStatus, WaitKind

from ..tables import Binding, Codec, ColumnSpec, IndexSpec, Step, TableSpec

__all__ = [
    "RUNS_TABLE", "DELIVERIES_TABLE", "CONSENTS_TABLE", "AGENT_JOBS_TABLE", "RUN_TABLES",
    "RUNS_BINDING", "DELIVERIES_BINDING", "CONSENTS_BINDING", "AGENT_JOBS_BINDING", "RUN_BINDINGS",
]

C = Codec
_STEP = Step.RUNS
_INSTANT = DateTime(timezone=True)


def _column(name: str, codec: Codec, sql_type: Any, *, mutable: bool, field: str | None = None, **more: Any) -> ColumnSpec:
    return ColumnSpec(name, field or name, codec, sql_type, codec.optional, mutable, step=_STEP, **more)


def _one_of(column: str, values: type[Any]) -> str:
    return f"{column} IN ({', '.join(repr(member.value) for member in values)})"


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
        ColumnSpec("admitted_node", "admitted_node", C.OPTIONAL_TEXT, String(128), True, False, step=Step.RECOVERY),
        # runs_v5 (liveness): a DONE Run's result, the lost-hop retries its workflow allows
        # and has used, and the lost Run an operator re-admitted this one for.
        ColumnSpec("result_json", "result_json", C.OPTIONAL_TEXT, Text(), True, True, step=Step.LIVENESS),
        ColumnSpec("max_hop_retries", "max_hop_retries", C.INT, Integer(), False, False, step=Step.LIVENESS,
                   default_sql="0"),
        ColumnSpec("hop_retries", "hop_retries", C.INT, Integer(), False, True, step=Step.LIVENESS, default_sql="0"),
        ColumnSpec("retry_of", "retry_of", C.OPTIONAL_TEXT, String(36), True, False, step=Step.LIVENESS),
        # runs_v5: a timer wait's due time (its owner is the database clock).
        ColumnSpec("wake_at", "wake_at_us", C.OPTIONAL_INSTANT, _INSTANT, True, True, step=Step.LIVENESS),
    ),
    indexes=(
        IndexSpec("ix_tenure_runs_status_updated", ("status", "updated_at", "run_id"), step=_STEP),
        IndexSpec("ix_tenure_runs_session", ("session_id", "status"), step=_STEP),
        IndexSpec("ix_tenure_runs_created", ("created_at", "run_id"), step=_STEP),
        # runs_v4: an admission that meets no Run at its key's derived ID looks the key up
        # (Runs admitted before runs_v4 keep their source-scoped IDs).
        IndexSpec("ix_tenure_runs_idempotency_key", ("idempotency_key",), step=Step.ADMISSION_KEYS),
    ),
    created_by=_STEP,
    # runs_v5 added the status awaiting_timer and the owner kind timer: a table created
    # earlier has its status and owner checks re-created with the wider lists.
    checks_replaced_by=Step.LIVENESS,
    checks=(
        ("ck_tenure_runs_status", _one_of("status", RunStatus)),
        ("ck_tenure_runs_priority", "priority >= 0 AND priority <= 100"),
        ("ck_tenure_runs_enqueue_seq", "enqueue_seq >= 0"),
        ("ck_tenure_runs_wait_owner",
         "status NOT IN ('awaiting_consent', 'awaiting_delegate', 'awaiting_service') OR owner_id IS NOT NULL"),
        ("ck_tenure_runs_owner_kind", "owner_kind IS NULL OR " + _one_of("owner_kind", WaitKind)),
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
        ("ck_tenure_run_deliveries_state", _one_of("state", DeliveryState)),
        ("ck_tenure_run_deliveries_attempts", "publish_attempts >= 0"),
        ("ck_tenure_run_deliveries_seq", "enqueue_seq >= 0"),
        ("ck_tenure_run_deliveries_priority", "priority >= 0 AND priority <= 100"),
    ),
)

CONSENTS_TABLE = TableSpec(
    "tenure_consents",
    (
        _column("consent_id", C.TEXT, String(36), mutable=False, primary_key=True),
        _column("run_id", C.TEXT, String(36), mutable=False),
        _column("tool_name", C.TEXT, String(128), mutable=False),
        _column("tool_call_id", C.TEXT, String(128), mutable=False),
        _column("payload_json", C.TEXT, Text(), mutable=False),
        _column("status", C.ENUM, String(10), mutable=True, choices=ConsentStatus),
        _column("decided_by", C.OPTIONAL_TEXT, String(255), mutable=True),
        _column("decided_at", C.OPTIONAL_INSTANT, _INSTANT, mutable=True, field="decided_at_us"),
        _column("preauthorized_by", C.OPTIONAL_TEXT, String(128), mutable=False),
        _column("created_at", C.INSTANT, _INSTANT, mutable=False, field="created_at_us"),
        # runs_v5 (liveness): the consent's deadline, which the relays apply (NULL: none).
        ColumnSpec("expires_at", "expires_at_us", C.OPTIONAL_INSTANT, _INSTANT, True, False, step=Step.LIVENESS),
    ),
    indexes=(
        IndexSpec("ix_tenure_consents_run", ("run_id", "status"), step=_STEP),
        # runs_v5: the relays' page of pending consents whose deadline came.
        IndexSpec("ix_tenure_consents_status_expires", ("status", "expires_at", "consent_id"), step=Step.LIVENESS),
    ),
    created_by=_STEP,
    checks=(
        ("ck_tenure_consents_status", _one_of("status", ConsentStatus)),
        ("ck_tenure_consents_decision",
         "(status = 'pending' AND decided_by IS NULL AND decided_at IS NULL) OR "
         "(status <> 'pending' AND decided_by IS NOT NULL AND decided_at IS NOT NULL)"),
    ),
)

_OPEN_JOB = "status IN ('queued', 'admitted', 'preparing', 'running')"

AGENT_JOBS_TABLE = TableSpec(
    "tenure_agent_jobs",
    (
        _column("job_id", C.TEXT, String(36), mutable=False, primary_key=True),
        _column("request_id", C.TEXT, String(128), mutable=False),
        _column("run_id", C.TEXT, String(36), mutable=False),
        _column("runtime", C.TEXT, String(128), mutable=False),
        _column("profile", C.TEXT, String(128), mutable=False),
        _column("request_json", C.TEXT, Text(), mutable=False),
        _column("status", C.ENUM, String(32), mutable=True, choices=AgentJobStatus),
        _column("result_json", C.OPTIONAL_TEXT, Text(), mutable=True),
        _column("runtime_job_id", C.OPTIONAL_TEXT, String(128), mutable=True),
        _column("created_at", C.INSTANT, _INSTANT, mutable=False, field="created_at_us"),
        _column("updated_at", C.INSTANT, _INSTANT, mutable=True, field="updated_at_us"),
    ),
    indexes=(
        IndexSpec("ux_tenure_agent_jobs_request", ("request_id",), unique=True, step=_STEP),
        IndexSpec("ix_tenure_agent_jobs_run", ("run_id", "status"), step=_STEP),
    ),
    created_by=_STEP,
    checks=(
        ("ck_tenure_agent_jobs_status", _one_of("status", AgentJobStatus)),
        ("ck_tenure_agent_jobs_result", f"({_OPEN_JOB} AND result_json IS NULL) OR "
                                        f"(NOT {_OPEN_JOB} AND result_json IS NOT NULL)"),
    ),
)

RUN_TABLES = (RUNS_TABLE, DELIVERIES_TABLE, CONSENTS_TABLE, AGENT_JOBS_TABLE)

RUNS_BINDING = Binding("runs", RUNS, RUNS_TABLE, RunRow, {}, "run_id")
DELIVERIES_BINDING = Binding("run_deliveries", RUNS, DELIVERIES_TABLE, DeliveryRow, {}, "delivery_id")
"""The two halves of the Run machine's pair (the machine checks the pair, not a half)."""
CONSENTS_BINDING = Binding("consents", CONSENTS, CONSENTS_TABLE, ConsentRow, {}, "consent_id")
AGENT_JOBS_BINDING = Binding("agent_jobs", AGENT_JOBS, AGENT_JOBS_TABLE, AgentJobRow, {}, "job_id")
RUN_BINDINGS = (RUNS_BINDING, DELIVERIES_BINDING, CONSENTS_BINDING, AGENT_JOBS_BINDING)
