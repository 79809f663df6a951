"""What the engine needs from a database, and the errors a store may raise.

A store opens transactions. A transaction samples the database clock once (after its
lock), finds and locks rows, and writes records with compare-and-set statements that
return what was stored. Every database failure surfaces as
``TenureError(QUEUE_PERSISTENCE_FAILED, reason)`` with an authored reason; driver text
never travels further than the store.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from tenure.kernel import JobRecord
from tenure.model import ErrorCode, JobStatus, QueueKind, TenureError

__all__ = ["Store", "Transaction", "persistence_failed", "TimeObserver"]

TimeObserver = Callable[[int], None]
"""Called with the database time each transaction sampled (tracing, conformance tests)."""


def persistence_failed(reason: str) -> TenureError:
    return TenureError(ErrorCode.QUEUE_PERSISTENCE_FAILED, reason)


class Transaction(Protocol):
    """One database transaction. Row-returning finders lock what they return."""

    async def now_us(self) -> int:
        """Database time, sampled once per transaction after its lock."""

    async def canonical_job_id(self, queue: QueueKind, job_id: str) -> str:
        """The job ID as the database spells it (canonical UUID text on a uuid column)."""

    async def load(self, queue: QueueKind, job_id: str) -> JobRecord | None: ...

    async def by_submission(self, queue: QueueKind, submission_id: str) -> JobRecord | None: ...

    async def colliding(
        self, queue: QueueKind, job_id: str, run_id: str | None, idempotency_key: str | None
    ) -> JobRecord | None: ...

    async def key_holder(self, queue: QueueKind, active_key: str) -> JobRecord | None: ...

    async def token_stored(self, queue: QueueKind, claim_token: str) -> bool: ...

    async def by_token(self, queue: QueueKind, claim_token: str) -> JobRecord | None: ...

    async def next_eligible(self, queue: QueueKind, now_us: int, *, owned: bool) -> JobRecord | None: ...

    async def expired_claims(self, queue: QueueKind, now_us: int, limit: int) -> list[JobRecord]: ...

    async def finished_before(self, queue: QueueKind, cutoff_us: int, limit: int) -> list[JobRecord]: ...

    async def insert(self, record: JobRecord) -> JobRecord:
        """Insert and return the row as stored."""

    async def update(self, old: JobRecord, new: JobRecord) -> JobRecord | None:
        """Compare-and-set: write ``new`` only where the row still equals ``old``; return
        the stored row, or None when the row no longer matched."""

    async def delete(self, old: JobRecord) -> bool:
        """Compare-and-set delete; False when the row no longer matched."""

    async def list_records(self, queue: QueueKind, status: JobStatus | None, limit: int) -> list[JobRecord]: ...

    async def claim_identity(self, queue: QueueKind, job_id: str) -> tuple[object, object, object]:
        """The stored owner, claim token and generation, read back exactly as stored."""


class Store(Protocol):
    """A database holding the three queue tables."""

    observe_time: TimeObserver | None

    def transaction(self, *, write: bool) -> AbstractAsyncContextManager[Transaction]:
        """A transaction; ``write`` ones take the database's write lock first."""

    async def close(self) -> None: ...
