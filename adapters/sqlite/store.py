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
import dataclasses
import sqlite3
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiosqlite

from tenure.kernel.core import Finder
from tenure.model import ConfigValidationError, TenureError

from ..failures import Stage, persistence_failed, translate
from ..schema import CLOCK_TABLE
from ..sql import SQLITE
from ..store import Probe, SharedPrimitives, TimeObserver
from ..tables import SQLITE_DIALECT, Binding

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


class SqliteTransaction(SharedPrimitives):
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

    async def _records(self, binding: Binding, sql: str, parameters: Mapping[str, Any]) -> list[Any]:
        read = self.codec(binding).read
        return [read(row, 0) for row in await _run(self._connection, sql, parameters)]

    async def canonical_key(self, binding: Binding, key: str) -> str:
        return key  # SQLite keeps text exactly as given

    async def locked(self, binding: Binding, finder: Finder, parameters: Mapping[str, Any]) -> list[Any]:
        compiled = self.compiled(binding, finder)
        found = await self._records(binding, compiled.sql, compiled.parameters(parameters))
        await self.now_us()  # the whole database is already locked: any time now is after the lock
        return found

    async def snapshot(self, binding: Binding, probes: Sequence[Probe]) -> list[Any]:
        now = await self.now_us()
        answers: list[Any] = []
        for probe in probes:
            values = {**probe.parameters, "now": now}
            if probe.kind == "rows":
                answers.append(await self.find(binding, probe.finder, values, probe.limit))
                continue
            found = await self.find(binding, dataclasses.replace(probe.finder, lock="none"), values, probe.limit)
            if probe.kind == "exists":
                answers.append(bool(found))
            else:
                assert probe.field is not None
                answers.append([getattr(record, probe.field) for record in found])
        return answers

    async def update_many(self, binding: Binding, pairs: Sequence[tuple[Any, Any]], *, read_back: bool) -> list[Any]:
        stored: list[Any] = []
        update = self.statements(binding).update
        for old, new in pairs:
            written = await self._records(binding, update, self.write_parameters(binding, old, new))
            if not written:
                raise persistence_failed("row_changed")
            stored.append(written[0])
        if read_back and pairs:
            keys = [getattr(new, binding.key_field) for _, new in pairs]
            by_key = {getattr(r, binding.key_field): r for r in await self.read(binding, keys)}
            if set(by_key) != set(keys):
                raise persistence_failed("read_back_mismatch")
            stored = [by_key[key] for key in keys]
        return stored

    async def delete(self, binding: Binding, old: Any) -> bool:
        rows = await _run(self._connection, self.statements(binding).delete, self.compare_parameters(binding, old))
        return bool(rows)


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
