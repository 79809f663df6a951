"""The SQLite store: one aiosqlite connection, serialized, with explicit transactions.

The lock is SQLite's write transaction: a writing transaction starts with
``BEGIN IMMEDIATE``, so no other connection can write until it ends, and the database
time is read inside it (after the lock). The connection runs in autocommit mode
(``isolation_level=None``) so that ``BEGIN`` and ``COMMIT`` are ours alone. WAL
journaling lets readers proceed while a writer holds the lock.

Database time is SQLite's own clock (``'now'``, millisecond resolution), read once per
transaction.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiosqlite

from tenure.kernel import JobRecord
from tenure.model import QueueKind

from ..records import MUTABLE_COLUMNS_FOR, record_from_columns, row_from_record
from ..sql import SQLITE, statements_for
from ..store import ClaimView, SharedFinders, TimeObserver, persistence_failed

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
        # One hop to the connection's thread per statement (execute, fetch and close in one).
        return list(await connection.execute_fetchall(sql, parameters))
    except sqlite3.IntegrityError:
        failure = "constraint_violated"
    except (sqlite3.Error, ValueError, OverflowError):
        failure = "unavailable"
    raise persistence_failed(failure)


def _compare(old: JobRecord) -> dict[str, Any]:
    old_row = row_from_record(old)
    compared = {f"old_{column}": old_row[column] for column in MUTABLE_COLUMNS_FOR[old.queue]}
    compared["old_id"] = old.job_id
    return compared


class SqliteTransaction(SharedFinders):
    """A transaction on the store's connection (see :class:`tenure.adapters.store.Transaction`)."""

    capabilities = SQLITE

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
        return [record_from_columns(queue, row) for row in await _run(self._connection, sql, parameters)]

    async def canonical_job_id(self, queue: QueueKind, job_id: str) -> str:
        return job_id  # SQLite keeps text exactly as given

    async def lock_rows(self, queue: QueueKind, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        found = await self._records(queue, statements_for(queue, SQLITE).lock_rows, {"job_ids": json.dumps(list(job_ids))})
        await self.now_us()  # the whole database is already locked: any time now is after the lock
        return {record.job_id: record for record in found}

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
        parameters = {
            "submission_id": submission_id, "job_id": job_id, "run_id": run_id,
            "idempotency_key": idempotency_key, "active_key": active_key,
        }
        found = await self._records(queue, statements_for(queue, SQLITE).locate, parameters)
        await self.now_us()
        return found

    async def claim_view(self, queue: QueueKind, *, limit: int, tokens: Sequence[str], owned: bool) -> ClaimView:
        statements = statements_for(queue, SQLITE)
        now = await self.now_us()
        sweep_needed = bool(await _run(self._connection, statements.sweep_needed, {"now": now}))
        stored = await _run(self._connection, statements.tokens_stored, {"tokens": json.dumps(list(tokens))})
        candidates = [] if sweep_needed else await self.pick_eligible(queue, now, limit, owned=owned)
        return ClaimView(sweep_needed, frozenset(token for (token,) in stored), candidates)

    async def update_many(self, pairs: Sequence[tuple[JobRecord, JobRecord]], *, read_back: bool) -> list[JobRecord]:
        stored: list[JobRecord] = []
        for old, new in pairs:
            statements = statements_for(new.queue, SQLITE)
            written = await self._records(new.queue, statements.update, {**row_from_record(new), **_compare(old)})
            if not written:
                raise persistence_failed("row_changed")
            stored.append(written[0])
        if read_back and pairs:
            queue = pairs[0][1].queue
            ids = [new.job_id for _, new in pairs]
            by_id = {r.job_id: r for r in await self._records(
                queue, statements_for(queue, SQLITE).read_rows, {"job_ids": json.dumps(ids)}
            )}
            if set(by_id) != set(ids):
                raise persistence_failed("read_back_mismatch")
            stored = [by_id[job_id] for job_id in ids]
        return stored

    async def delete(self, old: JobRecord) -> bool:
        rows = await _run(self._connection, statements_for(old.queue, SQLITE).delete, _compare(old))
        return bool(rows)

    async def read_rows(self, queue: QueueKind, job_ids: Sequence[str]) -> list[JobRecord]:
        return await self._records(queue, statements_for(queue, SQLITE).read_rows, {"job_ids": json.dumps(list(job_ids))})



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
            await connection.execute_fetchall("COMMIT")
        except sqlite3.Error:
            failure = True
        if failure:
            await self._rollback(connection)
            raise persistence_failed("commit_unacknowledged")

    async def _rollback(self, connection: aiosqlite.Connection) -> None:
        try:
            await connection.execute_fetchall("ROLLBACK")
        except (sqlite3.Error, ValueError):
            pass  # nothing open (already committed or never begun), or the connection is gone

    async def close(self) -> None:
        async with self._lock:
            if self._connection is not None:
                connection, self._connection = self._connection, None
                try:
                    await connection.close()
                except (sqlite3.Error, ValueError):
                    pass
