"""The runtime SQL of the job stores: one text per statement, shaped by dialect capabilities.

Statements use ``:name`` parameters (sqlite3's own style); the PostgreSQL store rewrites
them to ``$n`` once. Dialect differences are capability flags, never scattered
``if dialect == ...`` branches. A list parameter is matched with the dialect's
``member_of`` form (SQLite reads a JSON array, PostgreSQL an array). Every column list
comes from the table description (:mod:`tenure.adapters.queue_table`); the table is
qualified by the store's schema.
"""

from __future__ import annotations

import dataclasses
import functools

from tenure.model import QueueKind

from .queue_table import QUEUE_TABLES
from .tables import qualified

__all__ = ["Capabilities", "SQLITE", "POSTGRESQL", "QueueStatements", "statements_for"]


@dataclasses.dataclass(frozen=True, slots=True)
class Capabilities:
    """How a database spells the few things that differ."""

    name: str
    lock_row: str
    """Suffix that locks the selected rows for this transaction (empty where the whole
    database is locked by the write transaction, as on SQLite)."""
    lock_skip_locked: str
    """Suffix that locks and skips rows other transactions hold (claims)."""
    null_safe_equal: str
    """Operator comparing two values where NULL equals NULL."""
    member_of: str
    """``{column} <member_of :list>``: membership in a list parameter."""
    comparable_json: str
    """A JSON column as a comparable expression (PostgreSQL's ``json`` has no ``=``)."""


SQLITE = Capabilities(
    name="sqlite", lock_row="", lock_skip_locked="", null_safe_equal="IS",
    member_of="IN (SELECT value FROM json_each(:{}))", comparable_json="{}",
)
POSTGRESQL = Capabilities(
    name="postgresql",
    lock_row=" FOR UPDATE",
    lock_skip_locked=" FOR UPDATE SKIP LOCKED",
    null_safe_equal="IS NOT DISTINCT FROM",
    member_of="= ANY(:{})",
    comparable_json="{}::text",
)


@dataclasses.dataclass(frozen=True, slots=True)
class QueueStatements:
    """Every statement the stores run against one queue table."""

    table: str
    """The (schema-qualified) table name."""
    columns: tuple[str, ...]
    lock_rows: str
    locate: str
    tokens_stored: str
    sweep_needed: str
    eligible_owned: str
    eligible_legacy: str
    by_token: str
    expired: str
    finished_before: str
    insert: str
    update: str
    delete: str
    read_rows: str
    list_all: str
    list_by_status: str


@functools.cache
def statements_for(queue: QueueKind, caps: Capabilities, schema: str | None = None) -> QueueStatements:
    spec = QUEUE_TABLES[queue]
    table = qualified(schema, spec.name)
    columns = spec.column_names
    select = f"SELECT {', '.join(columns)} FROM {table}"

    def comparable(name: str) -> str:
        return caps.comparable_json.format(name) if name in spec.json_names else name

    compare = " AND ".join(
        f"{comparable(column)} {caps.null_safe_equal} :old_{column}" for column in spec.mutable_names
    )
    identities = ["submission_id = :submission_id", "id = :job_id"]
    if queue is QueueKind.PIPELINE:
        identities.append("run_id = :run_id")
    # The idempotency key column: the authored key, or (streaming) the active key.
    identities.append("idempotency_key = :idempotency_key")
    # Claims take the earliest due row, then the smallest job ID, so every store (and the
    # lockstep model) picks the same ones. attempt < max_attempts is implied by pending
    # (INV-Q4) but kept so the query states the kernel's whole eligibility.
    eligible = f"{select} WHERE status = 'pending' AND fires_at <= :now AND attempt < max_attempts"
    return QueueStatements(
        table=table,
        columns=columns,
        lock_rows=f"{select} WHERE id {caps.member_of.format('job_ids')} ORDER BY id{caps.lock_row}",
        locate=f"{select} WHERE {' OR '.join(identities)} ORDER BY id{caps.lock_row}",
        tokens_stored=f"SELECT claim_token FROM {table} WHERE claim_token {caps.member_of.format('tokens')}",
        sweep_needed=f"SELECT 1 FROM {table} WHERE status = 'claimed' AND lease_expires_at <= :now LIMIT 1",
        eligible_owned=f"{eligible} ORDER BY fires_at, id LIMIT :limit{caps.lock_skip_locked}",
        eligible_legacy=(
            f"{eligible} AND fence_required = :false ORDER BY fires_at, id LIMIT :limit{caps.lock_skip_locked}"
        ),
        by_token=f"{select} WHERE claim_token = :claim_token{caps.lock_row}",
        expired=(
            f"{select} WHERE status = 'claimed' AND lease_expires_at <= :now "
            f"ORDER BY lease_expires_at, id LIMIT :limit{caps.lock_skip_locked}"
        ),
        finished_before=(
            f"{select} WHERE status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff "
            f"AND fence_required = :false ORDER BY completed_at, id LIMIT :limit{caps.lock_skip_locked}"
        ),
        insert=(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)}) "
            f"RETURNING {', '.join(columns)}"
        ),
        update=(
            f"UPDATE {table} SET {', '.join(f'{c} = :{c}' for c in spec.mutable_names)} "
            f"WHERE id = :old_id AND {compare} RETURNING {', '.join(columns)}"
        ),
        delete=f"DELETE FROM {table} WHERE id = :old_id AND {compare} RETURNING id",
        read_rows=f"{select} WHERE id {caps.member_of.format('job_ids')} ORDER BY id",
        list_all=f"{select} ORDER BY created_at, id LIMIT :limit",
        list_by_status=f"{select} WHERE status = :status ORDER BY created_at, id LIMIT :limit",
    )
