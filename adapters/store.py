"""What the engine needs from a database, and the errors a store may raise.

A store opens transactions. A transaction reads the database clock exactly once, after
the locks of the statement that first needs it, and writes records with
compare-and-set statements whose result is read back. Every database failure surfaces
as ``TenureError(QUEUE_PERSISTENCE_FAILED, reason)`` with an authored reason (see
:mod:`tenure.adapters.failures`); driver text never travels further than the store.
A closed store refuses every further transaction; closing it again does nothing.

Finders that return rows to decide on lock them. Several steps are combined into one
statement where a database allows it (the row locks and the clock, the claim's view of
the queue), because round trips are what an owned operation costs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Protocol

from tenure.kernel import JobRecord
from tenure.model import JobStatus, QueueKind

from .failures import persistence_failed
from .queue_table import queue_codec
from .sql import Capabilities, QueueStatements, statements_for
from .tables import Dialect, RowCodec

__all__ = ["Store", "Transaction", "ClaimView", "SharedFinders", "persistence_failed", "TimeObserver"]

TimeObserver = Callable[[int], None]
"""Called with the database time each transaction read (tracing, conformance tests)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimView:
    """What a claim needs to know, read (and locked) at once."""

    sweep_needed: bool
    """Some claim of this queue has a lease that is not after ``now``."""
    stored_tokens: frozenset[str]
    """Which of the requested claim tokens some row already stores."""
    candidates: list[JobRecord]
    """The next eligible rows, earliest ``fires_at`` then job ID, locked for this claim."""


class Transaction(Protocol):
    """One database transaction."""

    async def now_us(self) -> int:
        """Database time, read once per transaction (after the locks taken so far)."""

    async def canonical_job_id(self, queue: QueueKind, job_id: str) -> str:
        """The job ID as the database spells it (canonical UUID text on a uuid column)."""

    async def lock_rows(self, queue: QueueKind, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        """Lock the rows with these IDs (in ID order); the clock is read after the locks."""

    async def locate_submission(
        self,
        queue: QueueKind,
        *,
        submission_id: str | None,
        job_id: str,
        run_id: str | None,
        idempotency_key: str | None,
        active_key: str | None,
    ) -> list[JobRecord]:
        """Lock every row sharing one of these identities; the clock is read after."""

    async def claim_view(
        self, queue: QueueKind, *, limit: int, tokens: Sequence[str], owned: bool
    ) -> ClaimView:
        """Read the clock, then the claim's view of the queue (candidates locked with
        SKIP LOCKED, which never waits)."""

    async def expired_claims(self, queue: QueueKind, now_us: int, limit: int) -> list[JobRecord]: ...

    async def pick_eligible(self, queue: QueueKind, now_us: int, limit: int, *, owned: bool) -> list[JobRecord]: ...

    async def by_token(self, queue: QueueKind, claim_token: str) -> JobRecord | None: ...

    async def finished_before(self, queue: QueueKind, cutoff_us: int, limit: int) -> list[JobRecord]: ...

    async def insert(self, record: JobRecord) -> JobRecord:
        """Insert and return the row as stored."""

    async def update_many(
        self, pairs: Sequence[tuple[JobRecord, JobRecord]], *, read_back: bool
    ) -> list[JobRecord]:
        """Compare-and-set each ``(old, new)``: write ``new`` only where the row still
        equals ``old``. Returns the rows as stored, in order; raises ``row_changed`` when
        a row no longer matched. ``read_back`` reads them with a separate statement
        (which also sees what AFTER triggers did)."""

    async def delete(self, old: JobRecord) -> bool:
        """Compare-and-set delete; False when the row no longer matched."""

    async def read_rows(self, queue: QueueKind, job_ids: Sequence[str]) -> list[JobRecord]:
        """The rows with these IDs as they are (no lock, no clock)."""

    async def list_records(self, queue: QueueKind, status: JobStatus | None, limit: int) -> list[JobRecord]: ...


class Store(Protocol):
    """A database holding the three queue tables."""

    observe_time: TimeObserver | None

    def transaction(self, *, write: bool) -> AbstractAsyncContextManager[Transaction]:
        """A transaction; ``write`` ones take the database's write lock first."""

    async def close(self) -> None: ...


class SharedFinders:
    """The finders every store runs the same way: the statement comes from the store's
    dialect (``capabilities``, and the store's schema) and runs through the store's
    ``_records``; instants and rows go through the table description's codec for the
    store's ``dialect``. Only what truly differs (locking with the clock, list
    parameters, writes) stays in each store."""

    capabilities: ClassVar[Capabilities]
    dialect: ClassVar[Dialect]
    schema: str | None = None

    async def _records(self, queue: QueueKind, sql: str, parameters: Mapping[str, Any]) -> list[JobRecord]:
        raise NotImplementedError

    def codec(self, queue: QueueKind) -> RowCodec:
        return queue_codec(queue, self.dialect)

    def statements(self, queue: QueueKind) -> QueueStatements:
        return statements_for(queue, self.capabilities, self.schema)

    def compare_parameters(self, old: JobRecord) -> dict[str, Any]:
        """``old_<column>`` for every column the compare-and-set compares, and ``old_id``."""
        codec = self.codec(old.queue)
        stored = codec.write(old)
        compared = {f"old_{column}": stored[column] for column in codec.spec.mutable_names}
        compared["old_id"] = old.job_id
        return compared

    def write_parameters(self, old: JobRecord, new: JobRecord) -> dict[str, Any]:
        return {**self.codec(new.queue).write(new), **self.compare_parameters(old)}

    async def expired_claims(self, queue: QueueKind, now_us: int, limit: int) -> list[JobRecord]:
        parameters = {"now": self.codec(queue).stored_instant(now_us), "limit": limit}
        return await self._records(queue, self.statements(queue).expired, parameters)

    async def pick_eligible(self, queue: QueueKind, now_us: int, limit: int, *, owned: bool) -> list[JobRecord]:
        statements = self.statements(queue)
        sql = statements.eligible_owned if owned else statements.eligible_legacy
        parameters = {"now": self.codec(queue).stored_instant(now_us), "limit": limit, "false": False}
        return await self._records(queue, sql, parameters)

    async def by_token(self, queue: QueueKind, claim_token: str) -> JobRecord | None:
        found = await self._records(queue, self.statements(queue).by_token, {"claim_token": claim_token})
        return found[0] if found else None

    async def finished_before(self, queue: QueueKind, cutoff_us: int, limit: int) -> list[JobRecord]:
        parameters = {"cutoff": self.codec(queue).stored_instant(cutoff_us), "limit": limit, "false": False}
        return await self._records(queue, self.statements(queue).finished_before, parameters)

    async def insert(self, record: JobRecord) -> JobRecord:
        stored = await self._records(record.queue, self.statements(record.queue).insert, self.codec(record.queue).write(record))
        if not stored:
            raise persistence_failed("write_not_applied")
        return stored[0]

    async def list_records(self, queue: QueueKind, status: JobStatus | None, limit: int) -> list[JobRecord]:
        statements = self.statements(queue)
        if status is None:
            return await self._records(queue, statements.list_all, {"limit": limit})
        return await self._records(queue, statements.list_by_status, {"status": status.value, "limit": limit})
