"""The queue tables, declared once with SQLAlchemy Core and compiled for each database.

Two schema steps, as deployed systems met them:

* ``legacy`` (version 1): the three queue tables as unfenced queues used them;
* ``owned`` (version 2, additive): ``generation``, ``claim_token``, ``submission_id``,
  ``fingerprint`` and ``fence_required`` plus full unique indexes on the token and the
  submission ID. Old rows start with generation 0, no token and no submission identity.

Instants are stored as integer microseconds on SQLite and as ``timestamptz`` on
PostgreSQL (both exact to the microsecond). Only DDL is compiled through SQLAlchemy;
runtime statements are plain SQL in the stores, so no per-call engine overhead applies.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.types import TIMESTAMP, TypeDecorator, TypeEngine

from tenure.model import QueueKind

__all__ = [
    "TABLE_NAMES",
    "MIGRATIONS_TABLE",
    "CLOCK_TABLE",
    "clock_ddl",
    "OWNED_COLUMNS",
    "OWNED_UNIQUE_INDEXES",
    "Instant",
    "metadata",
    "queue_table",
    "legacy_ddl",
    "legacy_table_ddl",
    "legacy_index_ddl",
    "legacy_columns",
    "owned_column_ddl",
    "owned_index_ddl",
    "dialect_for",
    "OwnedColumn",
]

TABLE_NAMES: dict[QueueKind, str] = {
    QueueKind.VALIDATION: "validation_jobs",
    QueueKind.PIPELINE: "pipeline_jobs",
    QueueKind.STREAMING: "streaming_jobs",
}
MIGRATIONS_TABLE = "tenure_migrations"
CLOCK_TABLE = "tenure_clock"
"""SQLite only: the database time's high-water mark (see adapters/sqlite/store.py)."""


def clock_ddl() -> list[str]:
    """SQLite: the one-row clock table, created with the owned migration (idempotent)."""
    return [
        f"CREATE TABLE IF NOT EXISTS {CLOCK_TABLE} "
        "(id INTEGER PRIMARY KEY CHECK (id = 1), high_water_us INTEGER NOT NULL)",
        f"INSERT OR IGNORE INTO {CLOCK_TABLE} (id, high_water_us) VALUES (1, 0)",
    ]


class Instant(TypeDecorator[int]):
    """Microseconds since the epoch in the kernel; INTEGER on SQLite, timestamptz on PostgreSQL."""

    impl = BigInteger
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(TIMESTAMP(timezone=True))
        return dialect.type_descriptor(BigInteger())


metadata = MetaData()


def _queue_table(queue: QueueKind) -> Table:
    name = TABLE_NAMES[queue]
    columns: list[Column[Any]] = [
        Column("id", String(36), primary_key=True),
        Column("status", String(20), nullable=False),
        Column("payload_json", Text, nullable=False),
        Column("fires_at", Instant, nullable=False),
        Column("created_at", Instant, nullable=False),
        Column("claimed_by", String(255)),
        Column("claimed_at", Instant),
        Column("lease_expires_at", Instant),
        Column("completed_at", Instant),
        Column("attempt", Integer, nullable=False, server_default=text("0")),
        Column("max_attempts", Integer, nullable=False),
        Column("error_message", Text),
        Column("result_json", Text),
    ]
    if queue is QueueKind.PIPELINE:
        columns.append(Column("run_id", String(32), unique=True))
    if queue is QueueKind.STREAMING:
        columns += [
            Column("active_key", String(600), unique=True),
            Column("cancel_requested", Boolean, nullable=False, server_default=text("false")),
            Column("pid", Integer),
        ]
    else:
        columns += [
            Column("idempotency_key", String(255), unique=True),
            Column("dlq_record_id", String(32)),
        ]
    table = Table(name, metadata, *columns)
    Index(f"ix_{name}_eligible", table.c.status, table.c.fires_at, table.c.id)
    Index(f"ix_{name}_lease", table.c.status, table.c.lease_expires_at)
    return table


_TABLES = {queue: _queue_table(queue) for queue in QueueKind}

migrations_table = Table(
    MIGRATIONS_TABLE,
    metadata,
    Column("name", String(64), primary_key=True),
    Column("applied_at", Instant, nullable=False),
)


def queue_table(queue: QueueKind) -> Table:
    return _TABLES[queue]


@dataclasses.dataclass(frozen=True, slots=True)
class OwnedColumn:
    """A column the owned migration adds, and what admission requires of it."""

    name: str
    ddl_type: TypeEngine[Any]
    nullable: bool
    default_sql: str | None
    kind: str
    """``identity`` (VARCHAR, no default), ``generation`` (integer, default 0),
    ``flag`` (boolean, default false) or ``text`` (VARCHAR, no default)."""


OWNED_COLUMNS: tuple[OwnedColumn, ...] = (
    OwnedColumn("generation", BigInteger(), False, "0", "generation"),
    OwnedColumn("claim_token", String(255), True, None, "identity"),
    OwnedColumn("submission_id", String(255), True, None, "identity"),
    OwnedColumn("fingerprint", String(255), True, None, "text"),
    OwnedColumn("fence_required", Boolean(), False, "false", "flag"),
)

OWNED_UNIQUE_INDEXES: tuple[str, ...] = ("claim_token", "submission_id")
"""Columns that need a full (not partial) unique index of their own."""


def dialect_for(name: str) -> Dialect:
    dialect = postgresql.dialect() if name == "postgresql" else sqlite.dialect()  # type: ignore[no-untyped-call]
    return cast(Dialect, dialect)


def legacy_table_ddl(dialect: Dialect) -> list[str]:
    """CREATE TABLE IF NOT EXISTS for the legacy tables."""
    tables = [migrations_table, *_TABLES.values()]
    return [str(CreateTable(table, if_not_exists=True).compile(dialect=dialect)).strip() for table in tables]


def legacy_index_ddl(dialect: Dialect) -> list[str]:
    """CREATE INDEX IF NOT EXISTS for the legacy indexes."""
    return [
        str(CreateIndex(index, if_not_exists=True).compile(dialect=dialect)).strip()
        for table in _TABLES.values()
        for index in sorted(table.indexes, key=lambda i: str(i.name))
    ]


def legacy_columns(queue: QueueKind) -> list[str]:
    """The columns a legacy queue table must have."""
    return [column.name for column in _TABLES[queue].columns]


def legacy_ddl(dialect: Dialect) -> list[str]:
    """The whole legacy schema (tables, then indexes), in idempotent forms."""
    return legacy_table_ddl(dialect) + legacy_index_ddl(dialect)


def owned_column_ddl(table: str, column: OwnedColumn, dialect: Dialect) -> str:
    """``ALTER TABLE ... ADD COLUMN`` for one owned column."""
    sql = f"ALTER TABLE {table} ADD COLUMN {column.name} {column.ddl_type.compile(dialect=dialect)}"
    if column.default_sql is not None:
        sql += f" DEFAULT {column.default_sql}"
    if not column.nullable:
        sql += " NOT NULL"
    return sql


def owned_index_ddl(table: str, column: str) -> str:
    """A full unique index on one identity column."""
    return f"CREATE UNIQUE INDEX IF NOT EXISTS ux_{table}_{column} ON {table} ({column})"
