"""The runtime SQL of the job stores: one text per statement, shaped by dialect capabilities.

Statements use ``:name`` parameters (sqlite3's own style); the PostgreSQL store rewrites
them to ``$n`` once. Dialect differences are capability flags, never scattered
``if dialect == ...`` branches.
"""

from __future__ import annotations

import dataclasses
import functools

from tenure.model import QueueKind

from .records import MUTABLE_COLUMNS_FOR, columns_for
from .schema import TABLE_NAMES

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


SQLITE = Capabilities(name="sqlite", lock_row="", lock_skip_locked="", null_safe_equal="IS")
POSTGRESQL = Capabilities(
    name="postgresql",
    lock_row=" FOR UPDATE",
    lock_skip_locked=" FOR UPDATE SKIP LOCKED",
    null_safe_equal="IS NOT DISTINCT FROM",
)


@dataclasses.dataclass(frozen=True, slots=True)
class QueueStatements:
    """Every statement the engine runs against one queue table."""

    load: str
    by_submission: str
    colliding: str
    key_holder: str
    token_stored: str
    by_token: str
    next_owned: str
    next_legacy: str
    expired: str
    finished_before: str
    insert: str
    update: str
    delete: str
    list_all: str
    list_by_status: str
    read_claim_identity: str


@functools.cache
def statements_for(queue: QueueKind, caps: Capabilities) -> QueueStatements:
    table = TABLE_NAMES[queue]
    columns = columns_for(queue)
    select = f"SELECT {', '.join(columns)} FROM {table}"
    mutable = MUTABLE_COLUMNS_FOR[queue]
    compare = " AND ".join(f"{column} {caps.null_safe_equal} :old_{column}" for column in mutable)
    identity_terms = ["id = :job_id"]
    if queue is QueueKind.PIPELINE:
        identity_terms.append("run_id = :run_id")
    if queue is not QueueKind.STREAMING:
        identity_terms.append("idempotency_key = :idempotency_key")
    # Claims take the earliest due row, then the smallest job ID, so every store (and the
    # lockstep model) picks the same one. attempt < max_attempts is implied by pending
    # (INV-Q4) but kept so the index predicate equals the kernel's eligibility.
    eligible = (
        f"{select} WHERE status = 'pending' AND fires_at <= :now AND attempt < max_attempts"
    )
    return QueueStatements(
        load=f"{select} WHERE id = :job_id{caps.lock_row}",
        by_submission=f"{select} WHERE submission_id = :submission_id{caps.lock_row}",
        colliding=f"{select} WHERE {' OR '.join(identity_terms)} ORDER BY id LIMIT 1{caps.lock_row}",
        key_holder=f"{select} WHERE active_key = :active_key{caps.lock_row}" if queue is QueueKind.STREAMING else "",
        token_stored=f"SELECT 1 FROM {table} WHERE claim_token = :claim_token LIMIT 1",
        by_token=f"{select} WHERE claim_token = :claim_token{caps.lock_row}",
        next_owned=f"{eligible} ORDER BY fires_at, id LIMIT 1{caps.lock_skip_locked}",
        next_legacy=f"{eligible} AND fence_required = :false ORDER BY fires_at, id LIMIT 1{caps.lock_skip_locked}",
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
            f"UPDATE {table} SET {', '.join(f'{c} = :{c}' for c in mutable)} "
            f"WHERE id = :old_id AND {compare} RETURNING {', '.join(columns)}"
        ),
        delete=f"DELETE FROM {table} WHERE id = :old_id AND {compare} RETURNING id",
        list_all=f"{select} ORDER BY created_at, id LIMIT :limit",
        list_by_status=f"{select} WHERE status = :status ORDER BY created_at, id LIMIT :limit",
        read_claim_identity=f"SELECT claimed_by, claim_token, generation FROM {table} WHERE id = :job_id",
    )
