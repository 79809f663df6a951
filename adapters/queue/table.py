"""The queue tables: pycharter 0.0.67's three job tables, plus tenure's owned additions.

The legacy step is exactly what pycharter's models create (``validation_jobs``,
``pipeline_jobs``, ``streaming_jobs``: names, column order, types, nullability, unique
constraints and index names; in the schema ``pycharter`` on PostgreSQL when pycharter
created them), so a database pycharter created is adopted in place and both libraries
keep reading what the other wrote. The owned step adds ``generation``, ``claim_token``,
``submission_id``, ``fingerprint``, ``fence_required`` and ``authored_json``, two full
unique indexes and two indexes for tenure's claim and lease-sweep queries; step
``console_v1`` adds one more, ``(status, id)``, for the console's pages of one status
(removed with the rest by ``downgrade``).

The envelope lives in pycharter's domain columns, in pycharter's shapes:

* validation: ``contract_name``, ``contract_version`` and ``data_json``
  (``{"data_source", "options"}``);
* pipeline: ``payload_json`` (``{"config", "variables", "fail_fast", "concept_scheme"}``)
  with the run ID in ``run_id``;
* streaming: ``config_name``, ``config_version`` and ``payload_json``
  (``{"variables", "force"}``); the active key is ``idempotency_key``, as in pycharter.

``authored_json`` keeps what those columns cannot: which of ``job_id``, ``run_id``,
``fires_at`` and ``max_attempts`` the submitter wrote, and as what (JSON ``null`` when it
left them out), so a claimed envelope equals the submitted one. Rows other clients wrote
have none; their envelope shows the stored ID and attempt budget and no ``fires_at``.
Record fields are filled from the columns by :mod:`tenure.adapters.core.tables`; the
kernel's ``payload`` tuple holds the domain columns' stored values in this order.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Integer, String, Text
from sqlalchemy.engine import Dialect as SqlDialect

from tenure.kernel.queue.machine import QUEUE
from tenure.kernel.queue.record import QueueRow
from tenure.model import (
    ENVELOPE_FOR_QUEUE,
    ConfigValidationError,
    JobStatus,
    QueueKind,
    SubmissionEnvelope,
    load_json,
)

from ..core.tables import (
    Binding,
    Codec,
    ColumnSpec,
    Dialect,
    IndexSpec,
    MachineTables,
    RetirementGuard,
    RowCodec,
    Step,
    TableSpec,
    column,
    corrupt,
)

__all__ = [
    "TABLE_NAMES",
    "QUEUE_TABLES",
    "QUEUE_BINDINGS",
    "PAYLOAD_COLUMNS",
    "OWNED_UNIQUE_COLUMNS",
    "HOPS_TABLE",
    "HOPS_BINDING",
    "TASKS_TABLE",
    "TASKS_BINDING",
    "binding_for",
    "queue_codec",
    "stored_payload",
    "envelope_of",
    "probe_record",
    "legacy_ddl",
    "OWNED_STEP",
    "TASKS_STEP",
    "WORKERS_STEP",
    "WORKERS_TABLE",
    "WORKERS_BINDING",
    "WorkerRow",
    "MACHINE_TABLES",
]

OWNED_STEP = Step("owned_v2", 1)
"""tenure's columns and indexes on pycharter's three queue tables (the tables themselves
are the legacy step's: created where missing, as pycharter creates them)."""
TASKS_STEP = Step("tasks_v1", 8)
"""``tenure_tasks``. Numbered before ``versions_v1`` although it came after it: that
step gives every existing table its row version, so a table had to exist by then (on a
database already at ``versions_v1`` the runner versions the new table)."""
_HOPS_STEP = Step("runs_v3", 5)
"""The Run hops' table (the Run machine's ``runs_v3``)."""
_CONSOLE_STEP = Step("console_v1", 10)
"""Indexes in the orders the console's lists page in (``tenure console``): a filtered
list reads one range of an index instead of sorting every match."""

TABLE_NAMES: dict[QueueKind, str] = {
    QueueKind.VALIDATION: "validation_jobs",
    QueueKind.PIPELINE: "pipeline_jobs",
    QueueKind.STREAMING: "streaming_jobs",
}

_INSTANT = DateTime(timezone=True)
C = Codec


def _queue_head() -> tuple[ColumnSpec, ...]:
    return (ColumnSpec("id", "job_id", C.TEXT, String(36), nullable=False, mutable=False, primary_key=True),)


def _status() -> ColumnSpec:
    return ColumnSpec("status", "status", C.ENUM, String(20), nullable=False, mutable=True, choices=JobStatus)


def _claim_columns() -> tuple[ColumnSpec, ...]:
    return (
        ColumnSpec("fires_at", "fires_at_us", C.INSTANT, _INSTANT, nullable=False, mutable=True),
        ColumnSpec("claimed_by", "owner_id", C.OPTIONAL_TEXT, String(255), nullable=True, mutable=True),
        ColumnSpec("claimed_at", "claimed_at_us", C.OPTIONAL_INSTANT, _INSTANT, nullable=True, mutable=True),
        ColumnSpec("lease_expires_at", "lease_expires_at_us", C.OPTIONAL_INSTANT, _INSTANT, nullable=True, mutable=True),
    )


def _dlq() -> ColumnSpec:
    return ColumnSpec("dlq_record_id", "dlq_record_id", C.OPTIONAL_TEXT, String(32), nullable=True, mutable=True)


def _attempts() -> tuple[ColumnSpec, ...]:
    return (
        ColumnSpec("attempt", "attempts", C.INT, Integer(), nullable=False, mutable=True),
        ColumnSpec("max_attempts", "max_attempts", C.INT, Integer(), nullable=False, mutable=False),
    )


def _error() -> ColumnSpec:
    return ColumnSpec("error_message", "error_message", C.OPTIONAL_TEXT, Text(), nullable=True, mutable=True)


def _idempotency_key(field: str, *, mutable: bool) -> ColumnSpec:
    return ColumnSpec("idempotency_key", field, C.OPTIONAL_TEXT, String(255), nullable=True, mutable=mutable)


def _tail() -> tuple[ColumnSpec, ...]:
    # created_at is nullable in pycharter's DDL, but every client fills it: a row without
    # one reads as corrupt.
    return (
        ColumnSpec("created_at", "created_at_us", C.INSTANT, _INSTANT, nullable=True, mutable=False),
        ColumnSpec("completed_at", "completed_at_us", C.OPTIONAL_INSTANT, _INSTANT, nullable=True, mutable=True),
        ColumnSpec("result_json", "result_json", C.OPTIONAL_JSON, JSON(), nullable=True, mutable=True),
    )


def _owned(authored_part: int) -> tuple[ColumnSpec, ...]:
    owned = OWNED_STEP
    return (
        ColumnSpec("generation", "generation", C.INT, BigInteger(), nullable=False, mutable=True, step=owned,
                default_sql="0", admission="generation"),
        ColumnSpec("claim_token", "claim_token", C.OPTIONAL_TEXT, String(255), nullable=True, mutable=True, step=owned,
                admission="identity"),
        ColumnSpec("submission_id", "submission_id", C.OPTIONAL_TEXT, String(255), nullable=True, mutable=False,
                step=owned, admission="identity"),
        ColumnSpec("fingerprint", "fingerprint", C.OPTIONAL_TEXT, String(255), nullable=True, mutable=False, step=owned,
                admission="text"),
        ColumnSpec("fence_required", "fence_required", C.FLAG, Boolean(), nullable=False, mutable=False, step=owned,
                default_sql="false", admission="flag"),
        ColumnSpec("authored_json", "payload", C.OPTIONAL_TEXT, Text(), nullable=True, mutable=False, step=owned,
                admission="document", part=authored_part),
    )


OWNED_UNIQUE_COLUMNS: tuple[str, ...] = ("claim_token", "submission_id")
"""Owned columns that need a full (not partial) unique index of their own."""


def _owned_indexes(table: str) -> tuple[IndexSpec, ...]:
    owned = OWNED_STEP
    return (
        *(IndexSpec(f"ux_{table}_{column}", (column,), unique=True, step=owned) for column in OWNED_UNIQUE_COLUMNS),
        # Claims read due rows in (fires_at, id) order; the sweep reads expired leases.
        IndexSpec(f"ix_{table}_eligible", ("status", "fires_at", "id"), step=owned),
        IndexSpec(f"ix_{table}_lease", ("status", "lease_expires_at"), step=owned),
    )


def _listed_indexes(table: str) -> tuple[IndexSpec, ...]:
    # console_v1: the console's job pages of one status, largest job ID first, each one
    # range of this index in the page's order (no sort of every row of that status).
    return (IndexSpec(f"ix_{table}_status_id", ("status", "id"), step=_CONSOLE_STEP),)


def _probe_row(queue: QueueKind) -> Callable[[Dialect, str, str, int], Mapping[str, Any]]:
    """The migration's collation probe on ``queue``'s table: :func:`probe_record`, as
    the table's codec writes it on the probed database."""

    def row(dialect: Dialect, suffix: str, identity: str, now_us: int) -> Mapping[str, Any]:
        return queue_codec(queue, dialect).write(probe_record(queue, suffix, identity, now_us))

    return row


def _payload(name: str, part: int, codec: Codec, sql_type: Any, **more: Any) -> ColumnSpec:
    return ColumnSpec(name, "payload", codec, sql_type, nullable=False, mutable=False, part=part, **more)


VALIDATION_TABLE = TableSpec(
    "validation_jobs",
    (
        *_queue_head(),
        _payload("contract_name", 0, C.TEXT, String(255)),
        _payload("contract_version", 1, C.TEXT, String(50)),
        _payload("data_json", 2, C.JSON, JSON()),
        _status(),
        *_claim_columns(),
        _dlq(),
        *_attempts(),
        _error(),
        _idempotency_key("idempotency_key", mutable=False),
        *_tail(),
        *_owned(authored_part=3),
    ),
    indexes=(IndexSpec("ix_validation_jobs_poll", ("status", "fires_at")), *_owned_indexes("validation_jobs"),
             *_listed_indexes("validation_jobs")),
    unique_columns=("idempotency_key",),
    exact_unique_columns=OWNED_UNIQUE_COLUMNS,
    probe_row=_probe_row(QueueKind.VALIDATION),
)

PIPELINE_TABLE = TableSpec(
    "pipeline_jobs",
    (
        *_queue_head(),
        ColumnSpec("run_id", "run_id", C.TEXT, String(32), nullable=False, mutable=False),
        _status(),
        _payload("payload_json", 0, C.JSON, JSON()),
        *_claim_columns(),
        _dlq(),
        *_attempts(),
        _idempotency_key("idempotency_key", mutable=False),
        _error(),
        *_tail(),
        *_owned(authored_part=1),
    ),
    indexes=(
        IndexSpec("ix_pipeline_jobs_poll", ("status", "fires_at")),
        IndexSpec("ix_pycharter_pipeline_jobs_run_id", ("run_id",), unique=True),
        IndexSpec("ix_pycharter_pipeline_jobs_status", ("status",)),
        *_owned_indexes("pipeline_jobs"), *_listed_indexes("pipeline_jobs"),
    ),
    unique_columns=("idempotency_key",),
    exact_unique_columns=OWNED_UNIQUE_COLUMNS,
    probe_row=_probe_row(QueueKind.PIPELINE),
)

STREAMING_TABLE = TableSpec(
    "streaming_jobs",
    (
        *_queue_head(),
        _payload("config_name", 0, C.TEXT, String(512)),
        _payload("config_version", 1, C.TEXT, String(64)),
        _status(),
        _payload("payload_json", 2, C.JSON, JSON()),
        *_claim_columns(),
        ColumnSpec("cancel_requested", "cancel_requested", C.FLAG, Boolean(), nullable=False, mutable=True),
        ColumnSpec("pid", "pid", C.OPTIONAL_INT, Integer(), nullable=True, mutable=True),
        *_attempts(),
        # pycharter's idempotency key is the streaming active key, released on finishing.
        _idempotency_key("active_key", mutable=True),
        _error(),
        *_tail(),
        *_owned(authored_part=3),
    ),
    indexes=(
        IndexSpec("ix_pycharter_streaming_jobs_config_name", ("config_name",)),
        IndexSpec("ix_pycharter_streaming_jobs_config_version", ("config_version",)),
        IndexSpec("ix_pycharter_streaming_jobs_status", ("status",)),
        IndexSpec("ix_streaming_jobs_config", ("config_name", "config_version")),
        IndexSpec("ix_streaming_jobs_poll", ("status", "fires_at")),
        *_owned_indexes("streaming_jobs"), *_listed_indexes("streaming_jobs"),
    ),
    unique_columns=("idempotency_key",),
    exact_unique_columns=OWNED_UNIQUE_COLUMNS,
    probe_row=_probe_row(QueueKind.STREAMING),
)

QUEUE_TABLES: dict[QueueKind, TableSpec] = {
    QueueKind.VALIDATION: VALIDATION_TABLE,
    QueueKind.PIPELINE: PIPELINE_TABLE,
    QueueKind.STREAMING: STREAMING_TABLE,
}


def legacy_ddl(dialect: SqlDialect, schema: str | None) -> list[str]:
    """pycharter's three queue tables and their indexes as pycharter creates them, in
    idempotent forms (what the legacy step creates where they are missing)."""
    return [statement for spec in QUEUE_TABLES.values() for statement in spec.create_ddl(dialect, schema)]

PAYLOAD_COLUMNS: dict[QueueKind, tuple[str, ...]] = {
    queue: tuple(
        column.name for column in sorted(
            (column for column in spec.columns if column.field == "payload"), key=lambda column: column.part or 0
        )
    )
    for queue, spec in QUEUE_TABLES.items()
}
"""The payload tuple's parts, by column name, in order."""

_NOT_A_TASK = {"queue_name": None, "task_name": None, "priority": 0, "progress_json": None}
"""pycharter's tables hold no task fields."""

_CONSTANTS: dict[QueueKind, dict[str, Any]] = {
    QueueKind.VALIDATION: {"queue": QueueKind.VALIDATION, "run_id": None, "cancel_requested": False, "pid": None,
                           "active_key": None, **_NOT_A_TASK},
    QueueKind.PIPELINE: {"queue": QueueKind.PIPELINE, "cancel_requested": False, "pid": None, "active_key": None,
                         **_NOT_A_TASK},
    QueueKind.STREAMING: {"queue": QueueKind.STREAMING, "run_id": None, "idempotency_key": None,
                          "dlq_record_id": None, **_NOT_A_TASK},
}
# (QueueKind.TASK's table is TASKS_TABLE, below, with TASKS_BINDING.)


def _became_pending(old: QueueRow | None, new: QueueRow) -> bool:
    """A submission, a retry sent back and an expired claim made claimable again: the
    changes an idle worker is woken for (a retry's backoff may still hold it a while)."""
    return new.status is JobStatus.PENDING and (old is None or old.status is not JobStatus.PENDING)


QUEUE_BINDINGS: dict[QueueKind, Binding] = {
    queue: Binding(f"queue.{spec.name}", QUEUE, spec, QueueRow, _CONSTANTS[queue], "job_id",
                   announces=_became_pending)
    for queue, spec in QUEUE_TABLES.items()
}
"""The queue machine's records in each of its three tables."""


_HOPS_NAME = "tenure_run_hops"


def _hops_table() -> TableSpec:
    shape = QUEUE_TABLES[QueueKind.VALIDATION]
    # The validation queue's columns, all created by this step (no admission: tenure
    # creates the table, nobody else ever wrote it).
    columns = tuple(dataclasses.replace(column, step=_HOPS_STEP, admission="") for column in shape.columns)
    indexes = (
        *(IndexSpec(f"ux_{_HOPS_NAME}_{column}", (column,), unique=True, step=_HOPS_STEP) for column in OWNED_UNIQUE_COLUMNS),
        IndexSpec(f"ix_{_HOPS_NAME}_eligible", ("status", "fires_at", "id"), step=_HOPS_STEP),
        IndexSpec(f"ix_{_HOPS_NAME}_lease", ("status", "lease_expires_at"), step=_HOPS_STEP),
    )
    return TableSpec(_HOPS_NAME, columns, indexes=indexes, unique_columns=shape.unique_columns, created_by=_HOPS_STEP)


HOPS_TABLE = _hops_table()
"""Run hops on tenure's own queue (``QueueBroker``): the validation queue's shape, driven by
the same queue machine and store code (schema step ``runs_v3``)."""


HOPS_BINDING = Binding(
    f"queue.{_HOPS_NAME}", QUEUE, HOPS_TABLE, QueueRow,
    {"queue": QueueKind.VALIDATION, "run_id": None, "cancel_requested": False, "pid": None, "active_key": None,
     **_NOT_A_TASK},
    "job_id", announces=_became_pending,
)


_TASKS_NAME = "tenure_tasks"
_TASKS_STEP = TASKS_STEP


def _tasks_table() -> TableSpec:
    def created(column: ColumnSpec) -> ColumnSpec:
        return dataclasses.replace(column, step=_TASKS_STEP, admission="")

    created_at, completed_at, result = _tail()
    columns = (
        *_queue_head(),
        ColumnSpec("queue_name", "queue_name", C.TEXT, String(63), nullable=False, mutable=False),
        ColumnSpec("task_name", "task_name", C.TEXT, String(255), nullable=False, mutable=False),
        _payload("args_json", 0, C.JSON, JSON()),
        ColumnSpec("priority", "priority", C.INT, Integer(), nullable=False, mutable=False),
        _status(),
        *_claim_columns(),
        *_attempts(),
        # The retry policy the task was deferred under: {"retry_base_ms", "retry_jitter", "retry_max_ms"}.
        _payload("retry_json", 1, C.JSON, JSON()),
        _error(),
        _dlq(),
        ColumnSpec("progress_json", "progress_json", C.OPTIONAL_JSON, JSON(), nullable=True, mutable=True),
        dataclasses.replace(created_at, nullable=False),
        completed_at,
        result,
        *_owned(authored_part=2),
    )
    indexes = (
        *(IndexSpec(f"ux_{_TASKS_NAME}_{column}", (column,), unique=True, step=_TASKS_STEP)
          for column in OWNED_UNIQUE_COLUMNS),
        # A claim of one queue reads its due rows in (priority DESC, fires_at, id) order:
        # this index serves it as a range scan whatever the number of waiting tasks. A
        # claim of several queues reads the next index in that order, filtering the queue
        # (PostgreSQL 15 cannot keep an index's order across a list of queue names).
        IndexSpec(f"ix_{_TASKS_NAME}_claim", ("queue_name", "status", "-priority", "fires_at", "id"), step=_TASKS_STEP),
        IndexSpec(f"ix_{_TASKS_NAME}_claim_any", ("status", "-priority", "fires_at", "id"), step=_TASKS_STEP),
        IndexSpec(f"ix_{_TASKS_NAME}_lease", ("status", "lease_expires_at"), step=_TASKS_STEP),
        IndexSpec(f"ix_{_TASKS_NAME}_finished", ("status", "completed_at"), step=_TASKS_STEP),
        # console_v1: the console's task pages of one status or one task queue, newest
        # first (task IDs are time-ordered), each one range of an index in the page's
        # order. A page of one queue and one status reads the queue's range and skips the
        # other statuses: no third index, since every index here costs every claim and
        # every completion a write.
        *_listed_indexes(_TASKS_NAME),
        IndexSpec(f"ix_{_TASKS_NAME}_queue_id", ("queue_name", "id"), step=_CONSOLE_STEP),
    )
    return TableSpec(_TASKS_NAME, tuple(created(column) for column in columns), indexes=indexes,
                     created_by=_TASKS_STEP)


TASKS_TABLE = _tasks_table()
"""General tasks (``TaskJob``): any queue name, any task name, JSON arguments, a priority
and the retry policy they were deferred under, driven by the same queue machine and
store code (schema step ``tasks_v1``). Tasks have no idempotency key (the submission ID
is the replay key), no run ID and no streaming state."""

TASKS_BINDING = Binding(
    f"queue.{_TASKS_NAME}", QUEUE, TASKS_TABLE, QueueRow,
    {"queue": QueueKind.TASK, "run_id": None, "idempotency_key": None, "cancel_requested": False, "pid": None,
     "active_key": None},
    "job_id", announces=_became_pending,
)


WORKERS_STEP = Step("workers_v1", 15)
"""``tenure_workers``: each worker process's own record of itself (``tenure workers``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerRow:
    """One worker as it recorded itself (:mod:`tenure.adapters.queue.presence`): a
    diagnostic no machine decides and no job waits on."""

    worker_id: str
    host: str
    pid: int
    queues_json: str
    """Canonical JSON array: the task queues it serves, or its queue's kind."""
    tasks_json: str
    """Canonical JSON array: the task names its app registers (none for the other queues)."""
    concurrency: int
    report_every_ms: int
    """How often it reports while it runs: it is missing after three reports' time."""
    started_at_us: int
    last_seen_at_us: int
    in_flight: int
    stopped_at_us: int | None = None


_worker_column = functools.partial(column, step=WORKERS_STEP)

WORKERS_TABLE = TableSpec(
    "tenure_workers",
    (
        _worker_column("worker_id", C.TEXT, String(255), primary_key=True),
        _worker_column("host", C.TEXT, String(255)),
        _worker_column("pid", C.INT, Integer()),
        _worker_column("queues_json", C.TEXT, Text()),
        _worker_column("tasks_json", C.TEXT, Text()),
        _worker_column("concurrency", C.INT, Integer()),
        _worker_column("report_every_ms", C.INT, Integer()),
        _worker_column("started_at", C.INSTANT, _INSTANT, mutable=True, field="started_at_us"),
        _worker_column("last_seen_at", C.INSTANT, _INSTANT, mutable=True, field="last_seen_at_us"),
        _worker_column("in_flight", C.INT, Integer(), mutable=True),
        _worker_column("stopped_at", C.OPTIONAL_INSTANT, _INSTANT, mutable=True, field="stopped_at_us"),
    ),
    indexes=(IndexSpec("ix_tenure_workers_last_seen", ("last_seen_at", "worker_id"), step=WORKERS_STEP),),
    created_by=WORKERS_STEP,
    checks=(
        ("ck_tenure_workers_counts", "pid >= 0 AND concurrency >= 1 AND in_flight >= 0 AND report_every_ms >= 1"),
    ),
)

WORKERS_BINDING = Binding("workers", None, WORKERS_TABLE, WorkerRow, {}, "worker_id")
"""Stored through the shared store primitives (see :mod:`tenure.adapters.queue.presence`)."""


MACHINE_TABLES = MachineTables(
    machine=QUEUE,
    tables=(*QUEUE_TABLES.values(), HOPS_TABLE, TASKS_TABLE, WORKERS_TABLE),
    bindings=(*QUEUE_BINDINGS.values(), HOPS_BINDING, TASKS_BINDING),
    retirement_guards=(
        *(guard for spec in QUEUE_TABLES.values() for guard in (
            RetirementGuard(OWNED_STEP, spec.name, "fence_required", "no protected submissions", "fence_required = ?",
                            "protected_submissions_remain"),
            RetirementGuard(OWNED_STEP, spec.name, "claim_token", "no live owned claims",
                            "status = 'claimed' AND claim_token IS NOT NULL", "owned_claims_remain"),
        )),
        # A queued or running hop is a delivery some Run is waiting on.
        RetirementGuard(_HOPS_STEP, HOPS_TABLE.name, "status", "no queued or running hops",
                        "status IN ('pending', 'claimed')", "hops_remain"),
        # A queued or running task is work someone deferred; a protected one is also the
        # record its submission ID replays against.
        RetirementGuard(TASKS_STEP, TASKS_TABLE.name, "status", "no pending or claimed tasks",
                        "status IN ('pending', 'claimed')", "tasks_remain"),
        RetirementGuard(TASKS_STEP, TASKS_TABLE.name, "fence_required", "no protected task submissions",
                        "fence_required = ?", "protected_submissions_remain"),
    ),
)
"""The queue machine's tables: pycharter's three, the Run hops' queue and the general
tasks, all driven by the one queue machine."""


def binding_for(queue: QueueKind) -> Binding:
    """The table binding of ``queue``: pycharter's job tables, or ``tenure_tasks``."""
    return TASKS_BINDING if queue is QueueKind.TASK else QUEUE_BINDINGS[queue]


def queue_codec(queue: QueueKind, dialect: Dialect, *, uuid_ids: bool = False) -> RowCodec:
    """The row mapping of ``queue``'s table on ``dialect``."""
    return binding_for(queue).codec(dialect, key_as_text=uuid_ids)



# --- the payload: envelope -> stored domain columns -> envelope -------------------------


def _object(texts: Mapping[str, str], names: tuple[str, ...]) -> str:
    """The canonical JSON object of these fields (names in sorted order), from their
    canonical texts: no payload is encoded twice."""
    return "{" + ",".join(f'"{name}":{texts[name]}' for name in names) + "}"


_DOMAIN_OBJECT: dict[QueueKind, tuple[str, ...]] = {
    QueueKind.VALIDATION: ("data_source", "options"),
    QueueKind.PIPELINE: ("concept_scheme", "config", "fail_fast", "variables"),
    QueueKind.STREAMING: ("force", "variables"),
    QueueKind.TASK: ("retry_base_ms", "retry_jitter", "retry_max_ms"),
}
_DOMAIN_TEXT: dict[QueueKind, tuple[str, ...]] = {
    QueueKind.VALIDATION: ("contract_name", "contract_version"),
    QueueKind.PIPELINE: (),
    QueueKind.STREAMING: ("config_name", "config_version"),
    QueueKind.TASK: (),
}
_DOMAIN_JSON: dict[QueueKind, tuple[str, ...]] = {queue: () for queue in QueueKind} | {QueueKind.TASK: ("args",)}
"""JSON fields stored whole in a column of their own (a task's arguments), after the plain texts."""
_AUTHORED: dict[QueueKind, tuple[str, ...]] = {
    QueueKind.VALIDATION: ("fires_at", "job_id", "max_attempts"),
    QueueKind.PIPELINE: ("fires_at", "job_id", "max_attempts", "run_id"),
    QueueKind.STREAMING: ("fires_at", "job_id", "max_attempts"),
    QueueKind.TASK: ("delay_ms", "fires_at", "job_id", "max_attempts"),
}
_RECORD_FIELDS: dict[QueueKind, tuple[str, ...]] = {queue: () for queue in QueueKind} | {
    QueueKind.TASK: ("queue_name", "task_name", "priority"),
}
"""Envelope fields the record holds itself (identity the claim reads), not the payload."""


def stored_payload(queue: QueueKind, field_texts: Mapping[str, str]) -> tuple[str | None, ...]:
    """The payload tuple a submission stores, from its fields' canonical texts."""
    plain = tuple(json.loads(field_texts[name]) for name in _DOMAIN_TEXT[queue])
    whole = tuple(field_texts[name] for name in _DOMAIN_JSON[queue])
    return (*plain, *whole, _object(field_texts, _DOMAIN_OBJECT[queue]), _object(field_texts, _AUTHORED[queue]))


def _parsed_object(text: object) -> dict[str, Any]:
    try:
        value = load_json(text) if type(text) is str else None
    except ValueError:  # JsonProblem: not JSON, or nested deeper than tenure reads
        value = None
    if type(value) is not dict:
        raise corrupt()
    return value


def envelope_of(record: QueueRow) -> SubmissionEnvelope:
    """The envelope a stored row holds; ``corrupt_row`` when its shape or values are not
    an envelope's (a row written outside tenure)."""
    queue = record.queue
    *texts, domain_text, authored_text = record.payload
    plain = texts[:len(_DOMAIN_TEXT[queue])]
    domain = _parsed_object(domain_text)
    if authored_text is None:  # written by another client
        authored: dict[str, Any] = {"job_id": record.job_id, "fires_at": None, "max_attempts": record.max_attempts}
        if queue is QueueKind.PIPELINE:
            authored["run_id"] = record.run_id
    else:
        authored = _parsed_object(authored_text)
    fields: dict[str, Any] = dict(zip(_DOMAIN_TEXT[queue], plain, strict=True))
    for name, text in zip(_DOMAIN_JSON[queue], texts[len(plain):], strict=True):
        fields[name] = _parsed_object(text)
    for name in _RECORD_FIELDS[queue]:
        fields[name] = getattr(record, name)
    for name in _DOMAIN_OBJECT[queue]:
        fields[name] = domain.get(name)
    if queue is QueueKind.PIPELINE and "fail_fast" not in domain:
        fields["fail_fast"] = True  # pycharter's reading of a missing flag
    if queue is QueueKind.STREAMING and "force" not in domain:
        fields["force"] = False
    for name in _AUTHORED[queue]:
        fields[name] = authored.get(name)
    if queue in (QueueKind.VALIDATION, QueueKind.PIPELINE):
        fields["idempotency_key"] = record.idempotency_key
    envelope: SubmissionEnvelope | None = None
    try:
        if fields.get("fires_at") is not None:
            fields["fires_at"] = dt.datetime.fromisoformat(fields["fires_at"])
        envelope = ENVELOPE_FOR_QUEUE[queue](**fields)  # type: ignore[assignment]
    except (ConfigValidationError, TypeError, ValueError):
        pass  # raised below, outside the handler, so nothing of the row rides along
    if envelope is None:
        raise corrupt()
    return envelope


def probe_record(queue: QueueKind, suffix: str, identity: str, now_us: int) -> QueueRow:
    """A finished, owned-looking row for the migration's collation probe: every NOT NULL
    column filled, the two identity columns set to ``identity``."""
    texts = {
        "contract_name": '"probe"', "contract_version": '"probe"', "data_source": '"probe"', "options": "null",
        "config": "{}", "variables": "null", "fail_fast": "true", "concept_scheme": "null",
        "config_name": '"probe"', "config_version": f'"{suffix}"', "force": "false",
        "fires_at": "null", "job_id": "null", "max_attempts": "null", "run_id": "null",
    }
    return QueueRow(
        queue=queue,
        job_id="tenure-probe-" + suffix,
        run_id=("probe" + suffix) if queue is QueueKind.PIPELINE else None,
        status=JobStatus.CANCELLED,
        attempts=0,
        max_attempts=1,
        generation=0,
        owner_id=None,
        claim_token="tenure-probe-" + identity,
        claimed_at_us=None,
        lease_expires_at_us=None,
        fires_at_us=now_us,
        created_at_us=now_us,
        completed_at_us=now_us,
        cancel_requested=False,
        pid=None,
        fence_required=False,
        submission_id="tenure-probe-" + identity,
        fingerprint=None,
        idempotency_key=None,
        active_key=None,
        dlq_record_id=None,
        error_message=None,
        result_json=None,
        payload=stored_payload(queue, texts),
    )

