"""The SQLite store: one aiosqlite connection, serialized, with explicit transactions.

The lock is SQLite's write transaction: a writing transaction starts with
``BEGIN IMMEDIATE``, so no other connection can write until it ends, and the database
time is read inside it (after the lock). The connection runs in autocommit mode
(``isolation_level=None``) so that ``BEGIN`` and ``COMMIT`` are ours alone. WAL
journaling lets readers proceed while a writer holds the lock.

Database time never runs backwards. SQLite has no clock of its own (its ``'now'`` is the
calling process's wall clock), so a process whose clock stepped back would see leases
live again. Instead the database keeps a high-water mark (table ``tenure_clock``,
created by the migration): every write transaction sets it to
``max(high-water mark, this process's wall clock)`` in one statement after taking the
write lock, and that value is the transaction's time; read transactions use the same
maximum without writing it. A clock stepped back by D therefore holds database time
still for up to D (leases and backoffs pause; nothing seen expired becomes live again),
across every process sharing the file. What remains: all processes must be on one
host (SQLite's locking needs that anyway), and a clock that jumps forward ends leases
early, as it would on any single clock. Time has microsecond resolution.

Every driver call passes one boundary (:func:`_run`): any exception (sqlite3, aiosqlite,
the binding, the deadline) becomes ``QUEUE_PERSISTENCE_FAILED`` with a reason from the
tables below. A file is opened read-write without being created (a missing file or
folder is ``database_missing``; only the migration creates one), so a mistyped path
leaves no empty database behind.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiosqlite

from tenure.kernel import JobRecord
from tenure.model import ConfigValidationError, QueueKind, TenureError

from ..failures import Stage, persistence_failed, translate
from ..schema import CLOCK_TABLE
from ..sql import SQLITE
from ..store import ClaimView, SharedFinders, TimeObserver
from ..tables import SQLITE_DIALECT

__all__ = ["SqliteStore", "SqliteTransaction", "DEFAULT_TIMEOUT_SECONDS", "wall_clock_us"]

DEFAULT_TIMEOUT_SECONDS = 30.0
"""How long a call waits for the source's connection, and for another connection's
write lock (SQLite's busy timeout), when no WorkerConfig says otherwise."""

_ADVANCE_CLOCK = (
    f"UPDATE {CLOCK_TABLE} SET high_water_us = max(high_water_us, :wall) WHERE id = 1 RETURNING high_water_us"
)
_READ_CLOCK = f"SELECT max(high_water_us, :wall) FROM {CLOCK_TABLE} WHERE id = 1"

_REASONS_BY_ERROR_NAME = (
    ("SQLITE_BUSY", "timeout"),  # the busy timeout ran out waiting for another writer
    ("SQLITE_LOCKED", "timeout"),
    ("SQLITE_CANTOPEN", "database_missing"),
    ("SQLITE_CONSTRAINT", "constraint_violated"),
)
_REASONS_BY_MESSAGE_START = (
    ("no such table", "schema_missing"),
    ("no such column", "schema_missing"),
)


def wall_clock_us() -> int:
    """This process's wall clock in microseconds since the Unix epoch."""
    return time.time_ns() // 1000


def _reason_of(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "timeout"
    name = getattr(error, "sqlite_errorname", None)
    if isinstance(name, str):
        for prefix, reason in _REASONS_BY_ERROR_NAME:
            if name.startswith(prefix):
                return reason
    if isinstance(error, sqlite3.Error):
        # Matched here, never shown: the text may quote values.
        message = str(error)
        for start, reason in _REASONS_BY_MESSAGE_START:
            if message.startswith(start):
                return reason
    return "unavailable"


def _failure(error: Exception, stage: Stage) -> TenureError:
    name = getattr(error, "sqlite_errorname", None)
    detail = name if isinstance(name, str) and name.replace("_", "").isalnum() else ""
    return translate(error, stage, _reason_of(error), detail=detail)


async def _run(
    connection: aiosqlite.Connection,
    sql: str,
    parameters: Mapping[str, Any] | Sequence[Any] = (),
    stage: Stage = Stage.STATEMENT,
) -> list[Any]:
    """The one boundary: execute one statement (one hop to the connection's thread:
    execute, fetch and close in one); any failure becomes the documented error, raised
    outside the ``except`` block so no driver text rides along as context."""
    failure: Exception | None = None
    try:
        return list(await connection.execute_fetchall(sql, parameters))
    except Exception as error:  # noqa: BLE001 - this is the boundary: nothing else may pass
        failure = error
    raise _failure(failure, stage)


def _connect(path: str, *, create: bool, busy_timeout_ms: int, wal: bool) -> sqlite3.Connection:
    """Open the file (runs in a worker thread). ``mode=rw`` never creates a file."""
    uri = f"file:{urllib.parse.quote(path)}?mode={'rwc' if create else 'rw'}"
    connection = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        connection.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        if wal:
            connection.execute("PRAGMA journal_mode = WAL")
    except BaseException:
        connection.close()
        raise
    return connection


class SqliteTransaction(SharedFinders):
    """A transaction on the store's connection (see :class:`tenure.adapters.store.Transaction`)."""

    capabilities = SQLITE
    dialect = SQLITE_DIALECT

    def __init__(self, store: SqliteStore, connection: aiosqlite.Connection, *, write: bool) -> None:
        self._store = store
        self._connection = connection
        self._write = write
        self._now: int | None = None

    async def execute(self, sql: str, parameters: Mapping[str, Any] | Sequence[Any] = ()) -> list[Any]:
        """Run one statement in this transaction (migrations and admission checks)."""
        return await _run(self._connection, sql, parameters)

    async def now_us(self) -> int:
        """The transaction's database time (see the module docstring): a write
        transaction advances the high-water mark to it, a read transaction only reads."""
        if self._now is None:
            parameters = {"wall": self._store.wall_clock_us()}
            rows = await _run(self._connection, _ADVANCE_CLOCK if self._write else _READ_CLOCK, parameters)
            if not rows or type(rows[0][0]) is not int:
                raise persistence_failed("schema_missing")  # the clock row is tenure's: migrate
            self._now = rows[0][0]
            if self._store.observe_time is not None:
                self._store.observe_time(self._now)
        return self._now

    async def _records(self, queue: QueueKind, sql: str, parameters: Mapping[str, Any]) -> list[JobRecord]:
        read = self.codec(queue).read
        return [read(row, 0) for row in await _run(self._connection, sql, parameters)]

    async def canonical_job_id(self, queue: QueueKind, job_id: str) -> str:
        return job_id  # SQLite keeps text exactly as given

    async def lock_rows(self, queue: QueueKind, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        found = await self._records(queue, self.statements(queue).lock_rows, {"job_ids": json.dumps(list(job_ids))})
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
            # One column holds the authored key, or (streaming) the active key.
            "idempotency_key": idempotency_key if active_key is None else active_key,
        }
        found = await self._records(queue, self.statements(queue).locate, parameters)
        await self.now_us()
        return found

    async def claim_view(self, queue: QueueKind, *, limit: int, tokens: Sequence[str], owned: bool) -> ClaimView:
        statements = self.statements(queue)
        now = await self.now_us()
        sweep_needed = bool(await _run(self._connection, statements.sweep_needed, {"now": self.codec(queue).stored_instant(now)}))
        stored = await _run(self._connection, statements.tokens_stored, {"tokens": json.dumps(list(tokens))})
        candidates = [] if sweep_needed else await self.pick_eligible(queue, now, limit, owned=owned)
        return ClaimView(sweep_needed, frozenset(token for (token,) in stored), candidates)

    async def update_many(self, pairs: Sequence[tuple[JobRecord, JobRecord]], *, read_back: bool) -> list[JobRecord]:
        stored: list[JobRecord] = []
        for old, new in pairs:
            written = await self._records(new.queue, self.statements(new.queue).update, self.write_parameters(old, new))
            if not written:
                raise persistence_failed("row_changed")
            stored.append(written[0])
        if read_back and pairs:
            queue = pairs[0][1].queue
            ids = [new.job_id for _, new in pairs]
            by_id = {r.job_id: r for r in await self._records(
                queue, self.statements(queue).read_rows, {"job_ids": json.dumps(ids)}
            )}
            if set(by_id) != set(ids):
                raise persistence_failed("read_back_mismatch")
            stored = [by_id[job_id] for job_id in ids]
        return stored

    async def delete(self, old: JobRecord) -> bool:
        rows = await _run(self._connection, self.statements(old.queue).delete, self.compare_parameters(old))
        return bool(rows)

    async def read_rows(self, queue: QueueKind, job_ids: Sequence[str]) -> list[JobRecord]:
        return await self._records(queue, self.statements(queue).read_rows, {"job_ids": json.dumps(list(job_ids))})



class SqliteStore:
    """A SQLite database file holding the queue tables.

    One connection per store; transactions on it are serialized by an asyncio lock.
    Several stores (for example one per worker process) may share one file: SQLite's
    write lock serializes their writers. A call waits at most ``timeout_seconds`` for
    its turn on this store's connection and at most ``timeout_seconds`` for another
    connection's write lock (SQLite's busy timeout). ``create`` lets the first
    connection create a missing file (the migration only). After :meth:`close`, every
    transaction is refused with ``ConfigValidationError`` (``source_closed``).
    """

    def __init__(
        self, path: str, *, create: bool = False, wal: bool = True, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    ) -> None:
        self._path = path
        self._create = create
        self._wal = wal
        self._timeout_seconds = timeout_seconds
        self._connection: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self.observe_time: TimeObserver | None = None
        self.wall_clock_us: Callable[[], int] = wall_clock_us
        """This process's clock (replaceable in tests: a clock that steps back)."""

    async def _open(self) -> aiosqlite.Connection:
        if self._connection is not None:
            return self._connection
        busy_timeout_ms = max(1, round(self._timeout_seconds * 1000))
        failure: Exception | None = None
        try:
            # Opened in a worker thread and handed to aiosqlite already open: aiosqlite's
            # own failed open leaves a thread that reports to a closed event loop later.
            raw = await asyncio.to_thread(
                _connect, self._path, create=self._create, busy_timeout_ms=busy_timeout_ms, wal=self._wal
            )
        except Exception as error:  # noqa: BLE001 - the boundary for opening
            failure = error
        if failure is not None:
            raise _failure(failure, Stage.CONNECT)
        self._connection = await aiosqlite.Connection(lambda: raw, 64)
        return self._connection

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[SqliteTransaction]:
        if self._closed:
            raise ConfigValidationError("source_closed", fields=("source",), problems=("closed",))
        failure: Exception | None = None
        try:
            async with asyncio.timeout(self._timeout_seconds):
                await self._lock.acquire()
        except TimeoutError as error:
            failure = error
        if failure is not None:
            raise _failure(failure, Stage.CONNECT)
        try:
            if self._closed:
                raise ConfigValidationError("source_closed", fields=("source",), problems=("closed",))
            connection = await self._open()
            await _run(connection, "BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield SqliteTransaction(self, connection, write=write)
            except BaseException:
                await self._rollback(connection)
                raise
            await self._commit(connection)
        finally:
            self._lock.release()

    async def _commit(self, connection: aiosqlite.Connection) -> None:
        """COMMIT. A failure here is an uncertain acknowledgement: the caller must
        recover by replay or claim recovery, never by assuming nothing was written."""
        try:
            await _run(connection, "COMMIT", stage=Stage.COMMIT)
        except TenureError:
            await self._rollback(connection)
            raise

    async def _rollback(self, connection: aiosqlite.Connection) -> None:
        """ROLLBACK; if even that fails, the connection's state is unknown (a transaction
        may still be open on it), so it is closed and the next call opens a new one."""
        try:
            await _run(connection, "ROLLBACK")
            return
        except TenureError:
            pass
        self._connection = None
        try:
            await connection.close()
        except Exception:  # noqa: BLE001 - closing is best effort; the thread stops either way
            pass

    async def close(self) -> None:
        """Close the connection (after the call holding it, if any). Final: later calls
        raise ``source_closed``; closing again does nothing."""
        self._closed = True
        async with self._lock:
            if self._connection is not None:
                connection, self._connection = self._connection, None
                try:
                    await connection.close()
                except Exception:  # noqa: BLE001 - closing is best effort; the thread stops either way
                    pass
