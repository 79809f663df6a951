"""The SQLite store: one aiosqlite connection, serialized, with explicit transactions.

The lock is SQLite's write transaction: a writing transaction starts with
``BEGIN IMMEDIATE``, so no other connection can write until it ends, and the database
time is sampled inside it (after the lock). The connection runs in autocommit mode
(``isolation_level=None``) so that ``BEGIN`` and ``COMMIT`` are ours alone. WAL
journaling lets readers proceed while a writer holds the lock.

Database time is SQLite's own clock (``'now'``, millisecond resolution), read once per
transaction.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiosqlite

from tenure.kernel import JobRecord
from tenure.model import JobStatus, QueueKind

from ..records import MUTABLE_COLUMNS_FOR, columns_for, record_from_row, row_from_record
from ..sql import SQLITE, statements_for
from ..store import TimeObserver, persistence_failed

__all__ = ["SqliteStore", "SqliteTransaction", "BUSY_TIMEOUT_MS"]

BUSY_TIMEOUT_MS = 30_000
"""How long a writer waits for another connection's write lock before failing."""

# Seconds and milliseconds of one 'now': SQLite evaluates 'now' once per statement.
_NOW_SQL = (
    "SELECT CAST(strftime('%s', 'now') AS INTEGER) * 1000000"
    " + CAST(substr(strftime('%f', 'now'), 4, 3) AS INTEGER) * 1000"
)


async def _run(connection: aiosqlite.Connection, sql: str, parameters: Mapping[str, Any] | Sequence[Any] = ()) -> list[Any]:
    """Execute one statement; driver errors become authored persistence failures."""
    failure: str | None = None
    try:
        cursor = await connection.execute(sql, parameters)
        rows = await cursor.fetchall()
        await cursor.close()
        return list(rows)
    except sqlite3.IntegrityError:
        failure = "constraint_violated"
    except (sqlite3.Error, ValueError, OverflowError):
        failure = "unavailable"
    raise persistence_failed(failure)


class SqliteTransaction:
    """A transaction on the store's connection (see :class:`tenure.adapters.store.Transaction`)."""

    def __init__(self, store: SqliteStore, connection: aiosqlite.Connection) -> None:
        self._store = store
        self._connection = connection
        self._now: int | None = None

    async def execute(self, sql: str, parameters: Mapping[str, Any] | Sequence[Any] = ()) -> list[Any]:
        """Run one statement in this transaction (migrations and admission checks)."""
        return await _run(self._connection, sql, parameters)

    async def now_us(self) -> int:
        if self._now is None:
            rows = await _run(self._connection, _NOW_SQL)
            self._now = int(rows[0][0])
            if self._store.observe_time is not None:
                self._store.observe_time(self._now)
        return self._now

    async def _records(self, queue: QueueKind, sql: str, parameters: Mapping[str, Any]) -> list[JobRecord]:
        columns = columns_for(queue)
        return [record_from_row(queue, dict(zip(columns, row))) for row in await _run(self._connection, sql, parameters)]

    async def _one(self, queue: QueueKind, sql: str, parameters: Mapping[str, Any]) -> JobRecord | None:
        found = await self._records(queue, sql, parameters)
        return found[0] if found else None

    async def canonical_job_id(self, queue: QueueKind, job_id: str) -> str:
        return job_id  # SQLite keeps text exactly as given

    async def load(self, queue: QueueKind, job_id: str) -> JobRecord | None:
        return await self._one(queue, statements_for(queue, SQLITE).load, {"job_id": job_id})

    async def by_submission(self, queue: QueueKind, submission_id: str) -> JobRecord | None:
        return await self._one(queue, statements_for(queue, SQLITE).by_submission, {"submission_id": submission_id})

    async def colliding(
        self, queue: QueueKind, job_id: str, run_id: str | None, idempotency_key: str | None
    ) -> JobRecord | None:
        parameters = {"job_id": job_id, "run_id": run_id, "idempotency_key": idempotency_key}
        return await self._one(queue, statements_for(queue, SQLITE).colliding, parameters)

    async def key_holder(self, queue: QueueKind, active_key: str) -> JobRecord | None:
        return await self._one(queue, statements_for(queue, SQLITE).key_holder, {"active_key": active_key})

    async def token_stored(self, queue: QueueKind, claim_token: str) -> bool:
        rows = await _run(self._connection, statements_for(queue, SQLITE).token_stored, {"claim_token": claim_token})
        return bool(rows)

    async def by_token(self, queue: QueueKind, claim_token: str) -> JobRecord | None:
        return await self._one(queue, statements_for(queue, SQLITE).by_token, {"claim_token": claim_token})

    async def next_eligible(self, queue: QueueKind, now_us: int, *, owned: bool) -> JobRecord | None:
        statements = statements_for(queue, SQLITE)
        sql = statements.next_owned if owned else statements.next_legacy
        return await self._one(queue, sql, {"now": now_us, "false": False})

    async def expired_claims(self, queue: QueueKind, now_us: int, limit: int) -> list[JobRecord]:
        return await self._records(queue, statements_for(queue, SQLITE).expired, {"now": now_us, "limit": limit})

    async def finished_before(self, queue: QueueKind, cutoff_us: int, limit: int) -> list[JobRecord]:
        parameters = {"cutoff": cutoff_us, "limit": limit, "false": False}
        return await self._records(queue, statements_for(queue, SQLITE).finished_before, parameters)

    async def insert(self, record: JobRecord) -> JobRecord:
        stored = await self._one(record.queue, statements_for(record.queue, SQLITE).insert, row_from_record(record))
        if stored is None:
            raise persistence_failed("write_not_applied")
        return stored

    def _compare(self, old: JobRecord) -> dict[str, Any]:
        old_row = row_from_record(old)
        compared = {f"old_{column}": old_row[column] for column in MUTABLE_COLUMNS_FOR[old.queue]}
        compared["old_id"] = old.job_id
        return compared

    async def update(self, old: JobRecord, new: JobRecord) -> JobRecord | None:
        parameters = {**row_from_record(new), **self._compare(old)}
        return await self._one(new.queue, statements_for(new.queue, SQLITE).update, parameters)

    async def delete(self, old: JobRecord) -> bool:
        rows = await _run(self._connection, statements_for(old.queue, SQLITE).delete, self._compare(old))
        return bool(rows)

    async def claim_identity(self, queue: QueueKind, job_id: str) -> tuple[object, object, object]:
        rows = await _run(self._connection, statements_for(queue, SQLITE).read_claim_identity, {"job_id": job_id})
        if not rows:
            return (None, None, None)
        owner_id, claim_token, generation = rows[0]
        return (owner_id, claim_token, generation)

    async def list_records(self, queue: QueueKind, status: JobStatus | None, limit: int) -> list[JobRecord]:
        statements = statements_for(queue, SQLITE)
        if status is None:
            return await self._records(queue, statements.list_all, {"limit": limit})
        return await self._records(queue, statements.list_by_status, {"status": status.value, "limit": limit})


class SqliteStore:
    """A SQLite database file holding the queue tables.

    One connection per store; transactions on it are serialized by an asyncio lock.
    Several stores (for example one per worker process) may share one file: SQLite's
    write lock serializes their writers, each waiting up to BUSY_TIMEOUT_MS.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._connection: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()
        self.observe_time: TimeObserver | None = None

    async def _open(self) -> aiosqlite.Connection:
        if self._connection is not None:
            return self._connection
        failure: str | None = None
        try:
            connection = await aiosqlite.connect(self._path, isolation_level=None)
            try:
                await connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                await connection.execute("PRAGMA journal_mode = WAL")
            except BaseException:
                await connection.close()
                raise
        except (sqlite3.Error, OSError, ValueError):
            failure = "unavailable"
        if failure is not None:
            raise persistence_failed(failure)
        self._connection = connection
        return connection

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[SqliteTransaction]:
        async with self._lock:
            connection = await self._open()
            await _run(connection, "BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield SqliteTransaction(self, connection)
            except BaseException:
                await self._rollback(connection)
                raise
            await self._commit(connection)

    async def _commit(self, connection: aiosqlite.Connection) -> None:
        """COMMIT. A failure here is an uncertain acknowledgement: the caller must
        recover by replay or claim recovery, never by assuming nothing was written."""
        failure = False
        try:
            await connection.execute("COMMIT")
        except sqlite3.Error:
            failure = True
        if failure:
            await self._rollback(connection)
            raise persistence_failed("commit_unacknowledged")

    async def _rollback(self, connection: aiosqlite.Connection) -> None:
        try:
            await connection.execute("ROLLBACK")
        except (sqlite3.Error, ValueError):
            pass  # nothing open (already committed or never begun), or the connection is gone

    async def execute_script(self, statements: Sequence[str]) -> None:
        """Run statements outside any queue transaction (migrations)."""
        async with self._lock:
            connection = await self._open()
            for statement in statements:
                await _run(connection, statement)

    async def close(self) -> None:
        async with self._lock:
            if self._connection is not None:
                connection, self._connection = self._connection, None
                try:
                    await connection.close()
                except (sqlite3.Error, ValueError):
                    pass
