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

An operation's whole transaction runs in one hop to aiosqlite's connection thread
(:meth:`SqliteStore.run`): BEGIN, its statements, the kernel's decisions and COMMIT
are one function call there, because a hop between the event loop and that thread
costs more than most statements do. The body is the same coroutine the PostgreSQL
store awaits statement by statement; here each of its awaits completes at once, so it
is driven to its end without an event loop. A call cancelled during its hop rolls back
unless COMMIT had begun. Migrations and tools use :meth:`SqliteStore.transaction`, one
hop per statement. A fenced write whose row the engine has seen reads nothing first: it
is decided from that row and written by :meth:`SharedPrimitives.update_seen`, which
compares every column (see :meth:`tenure.adapters.core.engine.Engine.on_keys`).

Every driver call passes one boundary (:func:`_run`, :func:`_run_here` in the
connection's thread): any exception (sqlite3, aiosqlite, the binding, the deadline) becomes ``QUEUE_PERSISTENCE_FAILED`` with a reason from the
tables below. A file is opened read-write without being created (a missing file or
folder is ``database_missing``; only the migration creates one), so a mistyped path
leaves no empty database behind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import aiosqlite

from tenure.kernel.core import Finder
from tenure.model import ConfigValidationError, TenureError

from ..core.failures import Stage, persistence_failed, translate
from ..core.schema import CLOCK_TABLE
from ..core.sql import SQLITE, joined_read_sql
from ..core.store import Body, Probe, SharedPrimitives, TimeObserver
from ..core.tables import SQLITE_DIALECT, Binding, UndecodableText

__all__ = ["SqliteStore", "SqliteTransaction", "DEFAULT_TIMEOUT_SECONDS", "wall_clock_us"]

T = TypeVar("T")

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
    # A TEXT value that is not UTF-8 (another writer put raw bytes there): sqlite3 fails
    # the whole fetch while decoding it.
    ("Could not decode to UTF-8", "corrupt_row"),
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


def _text_or_undecodable(data: bytes) -> str | UndecodableText:
    """A TEXT value as ``str``, or (not UTF-8) kept as its bytes: the text factory of a
    read that must not fail on one row (see :meth:`SqliteTransaction._rows_or_undecodable`)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return UndecodableText(data)


def _statement(connection: sqlite3.Connection, sql: str, parameters: Mapping[str, Any] | Sequence[Any]) -> list[Any]:
    """Execute one statement and fetch its rows (in the connection's thread). Every
    statement of every path runs through here (fault-injection tests replace it)."""
    return connection.execute(sql, parameters).fetchall()


async def _run(
    connection: aiosqlite.Connection,
    sql: str,
    parameters: Mapping[str, Any] | Sequence[Any] = (),
    stage: Stage = Stage.STATEMENT,
) -> list[Any]:
    """The one boundary, for a statement sent from the event loop: one hop to the
    connection's thread (execute, fetch and close in one); any failure becomes the
    documented error, raised outside the ``except`` block so no driver text rides along
    as context."""
    failure: Exception | None = None
    try:
        # aiosqlite's own way of running a function in its thread (every public method
        # goes through it); tests/adapters/sqlite/test_sqlite_store.py pins that it exists.
        return await connection._execute(lambda: _statement(connection._conn, sql, parameters))  # type: ignore[no-any-return, no-untyped-call]  # noqa: SLF001
    except Exception as error:  # noqa: BLE001 - this is the boundary: nothing else may pass
        failure = error
    raise _failure(failure, stage)


def _run_here(
    connection: sqlite3.Connection,
    sql: str,
    parameters: Mapping[str, Any] | Sequence[Any] = (),
    stage: Stage = Stage.STATEMENT,
) -> list[Any]:
    """The same boundary for a statement run in the connection's own thread (inside
    :meth:`SqliteStore.run`)."""
    failure: Exception | None = None
    try:
        return _statement(connection, sql, parameters)
    except Exception as error:  # noqa: BLE001 - this is the boundary: nothing else may pass
        failure = error
    raise _failure(failure, stage)


Execute = Callable[[str, "Mapping[str, Any] | Sequence[Any]"], Awaitable[list[Any]]]


def _drive(body: Awaitable[T]) -> T:
    """Run a transaction body to its end without an event loop. Every await in a body
    reaches a method of its transaction, which here runs its statement at once and never
    suspends, so the coroutine finishes in one ``send``; a body that awaited anything else
    (a sleep, another task) is a programming error."""
    coroutine = body.__await__()
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    coroutine.close()
    raise AssertionError("a transaction body awaited something other than its transaction")


WAL_SWITCH_PAUSE_S = 0.01
"""The pause between two tries to switch a file to WAL mode (see :func:`_switch_to_wal`)."""


def _connect(path: str, *, create: bool, busy_timeout_ms: int, wal: bool) -> sqlite3.Connection:
    """Open the file (runs in a worker thread). ``mode=rw`` never creates a file."""
    uri = f"file:{urllib.parse.quote(path)}?mode={'rwc' if create else 'rw'}"
    connection = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        connection.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        if wal:
            _switch_to_wal(connection, busy_timeout_ms / 1000)
    except BaseException:
        connection.close()
        raise
    return connection


def _switch_to_wal(connection: sqlite3.Connection, timeout_s: float) -> None:
    """Put the file in WAL mode (a no-op once it is: the mode is stored in the file).
    A migration leaves the journal mode alone, so the first connections to a migrated
    file switch it; two of them switching at once each hold the shared lock the other's
    switch must wait out, and SQLite answers one SQLITE_BUSY at once, without waiting
    for the busy timeout (about one pair in sixteen here; it failed a ledger's first
    admission beside a polling worker). The switch is tried again until the busy
    timeout ran out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            busy = str(getattr(error, "sqlite_errorname", "")).startswith("SQLITE_BUSY")
            if not busy or time.monotonic() >= deadline:
                raise
        time.sleep(WAL_SWITCH_PAUSE_S)


def _daemon_thread_of(connection: aiosqlite.Connection) -> None:
    """Make the thread that will run ``connection`` a daemon, before it starts.

    aiosqlite runs each connection in a thread of its own that is not a daemon, and that
    thread ends only when the connection is closed: a program that crashes (or simply
    returns) before ``close()`` would print its traceback and then never exit, since the
    interpreter waits for every non-daemon thread before it ends. A daemon thread does
    not hold the process. Nothing committed is lost when the process ends with it: a
    COMMIT has returned only once SQLite wrote it to the file, and a transaction cut off
    midway is rolled back by the next connection, as after any crash. aiosqlite before
    0.22 makes the connection itself the thread (a ``Thread`` subclass); from 0.22 it
    creates one, ``_thread`` (tests/adapters/sqlite/test_sqlite_store.py pins both)."""
    thread: Any = getattr(connection, "_thread", connection)
    assert isinstance(thread, threading.Thread), "aiosqlite runs each connection in a thread"
    thread.daemon = True


class _Flag:
    """Raised by the event loop, read in the connection's thread (a plain attribute: one
    store and one load, atomic under the interpreter lock)."""

    __slots__ = ("raised",)

    def __init__(self) -> None:
        self.raised = False


class SqliteTransaction(SharedPrimitives):
    """A transaction on the store's connection (see :class:`tenure.adapters.core.store.Transaction`)."""

    capabilities = SQLITE
    dialect = SQLITE_DIALECT

    def __init__(self, store: SqliteStore, execute: Execute, *, write: bool,
                 raw: sqlite3.Connection | None = None) -> None:
        self._store = store
        self._execute = execute
        """Runs one statement: through aiosqlite (a hop to the connection's thread per
        statement), or directly when the whole transaction already runs in that thread."""
        self._write = write
        self._now: int | None = None
        self._raw = raw
        """The sqlite3 connection the statements run on (its text factory is switched for
        a read that keeps undecodable text; None: not known, such a read fails)."""

    async def execute(self, sql: str, parameters: Mapping[str, Any] | Sequence[Any] = ()) -> list[Any]:
        """Run one statement in this transaction (migrations and admission checks)."""
        return await self._execute(sql, parameters)

    async def now_us(self) -> int:
        """The transaction's database time (see the module docstring): a write
        transaction advances the high-water mark to it, a read transaction only reads."""
        if self._now is None:
            parameters = {"wall": self._store.wall_clock_us()}
            rows = await self._execute(_ADVANCE_CLOCK if self._write else _READ_CLOCK, parameters)
            if not rows or type(rows[0][0]) is not int:
                raise persistence_failed("schema_missing")  # the clock row is tenure's: migrate
            self._now = rows[0][0]
            if self._store.observe_time is not None:
                self._store.observe_time(self._now)
        return self._now

    async def _rows(self, sql: str, parameters: Mapping[str, Any]) -> list[Any]:
        return list(await self._execute(sql, parameters))

    async def _rows_or_undecodable(self, sql: str, parameters: Mapping[str, Any]) -> list[Any]:
        """The statement's rows; when one holds text that is not UTF-8 (the fetch fails
        with ``corrupt_row``), the statement runs again (it only reads) with a text factory
        that keeps such a value as :class:`UndecodableText`. Only then: the default
        factory is the fast one. Statements of one connection never overlap, so the
        factory is this statement's alone."""
        try:
            return await self._rows(sql, parameters)
        except TenureError as error:
            if error.reason != "corrupt_row" or self._raw is None:
                raise
        raw = self._raw
        raw.text_factory = _text_or_undecodable
        try:
            return await self._rows(sql, parameters)
        finally:
            raw.text_factory = str

    async def canonical_key(self, binding: Binding, key: str) -> str:
        return key  # SQLite keeps text exactly as given

    async def locked(self, binding: Binding, finder: Finder, parameters: Mapping[str, Any]) -> list[Any]:
        compiled = self.compiled(binding, finder)
        found = await self._records(binding, compiled.sql, compiled.parameters(parameters))
        await self.now_us()  # the whole database is already locked: any time now is after the lock
        return found

    async def locked_joined(
        self, binding: Binding, keys: Sequence[str], other: Binding, on: tuple[tuple[str, str], ...],
    ) -> list[tuple[Any, Any]]:
        found = await self.read_joined(binding, keys, other, on)
        await self.now_us()  # the whole database is already locked: any time now is after the lock
        return found

    counts_current = True  # the transaction holds the database's write lock from its start

    async def _locked_joined_beside(
        self, binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], columns: tuple[str, ...],
        parameters: Mapping[str, Any],
    ) -> tuple[list[Any], int]:
        joined = joined_read_sql(binding, other, on, self.capabilities, self.schema)
        rows = await self._rows(joined.replace(" FROM ", f", {', '.join(columns)} FROM ", 1), parameters)
        await self.now_us()  # the whole database is already locked: any time now is after the lock
        return rows, 0

    async def snapshot(self, binding: Binding, probes: Sequence[Probe]) -> list[Any]:
        """The clock, then every probe under the write lock: the questions (``exists``,
        ``values``) counted in one statement first, and a ``values`` probe's rows read only
        when it counted some (a claim's stored tokens: almost never)."""
        now = await self.now_us()
        questions = [probe for probe in probes if probe.kind != "rows"]
        counts = iter(await self.count_each([
            (binding, dataclasses.replace(probe.finder, lock="none"), {**probe.parameters, "now": now}, 1)
            for probe in questions  # whether any row matches is all a count must tell
        ]) if questions else [])
        answers: list[Any] = []
        for probe in probes:
            values = {**probe.parameters, "now": now}
            if probe.kind == "rows":
                answers.append(await self.find_or_unreadable(binding, probe.finder, values, probe.limit))
                continue
            counted = next(counts)
            if probe.kind == "exists":
                answers.append(counted > 0)
                continue
            assert probe.field is not None
            found = [] if counted == 0 else await self.find(binding, dataclasses.replace(probe.finder, lock="none"),
                                                            values, probe.limit)
            answers.append([getattr(record, probe.field) for record in found])
        return answers

    async def update_many(self, binding: Binding, pairs: Sequence[tuple[Any, Any]], *, read_back: bool) -> list[Any]:
        stored: list[Any] = []
        update = self.statements(binding).update
        codec = self.codec(binding)
        for old, new in pairs:
            written = codec.write(new)
            rows = await self._rows(update, {**written, **self.compare_parameters(binding, old)})
            if not rows:
                raise persistence_failed("row_changed")
            stored.append(self.as_stored(binding, rows[0], written, new))
        if read_back and pairs:
            keys = [getattr(new, binding.key_field) for _, new in pairs]
            by_key = {getattr(r, binding.key_field): r for r in await self.read(binding, keys)}
            if set(by_key) != set(keys):
                raise persistence_failed("read_back_mismatch")
            stored = [by_key[key] for key in keys]
        return stored

    async def delete(self, binding: Binding, old: Any) -> bool:
        rows = await self._execute(self.statements(binding).delete, self.compare_parameters(binding, old))
        return bool(rows)


class SqliteStore:
    """A SQLite database file holding the queue tables.

    One connection per store; transactions on it are serialized by an asyncio semaphore.
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
        self._raw: sqlite3.Connection | None = None
        """The connection aiosqlite runs; used directly only inside its thread."""
        self._broken = False
        self._lock = asyncio.BoundedSemaphore(1)
        """One transaction at a time. A semaphore, not a Lock: its ``locked()`` says whether
        it can be taken at once (a Lock just released may still owe a woken waiter);
        bounded, so a release without an acquire raises."""
        self._closed = False
        self.observe_time: TimeObserver | None = None
        self.ahead = None
        """No decided-ahead statements: a whole transaction is already one hop here."""
        self.wall_clock_us: Callable[[], int] = wall_clock_us
        """This process's clock (replaceable in tests: a clock that steps back)."""

    async def _open(self) -> aiosqlite.Connection:
        if self._broken:  # a ROLLBACK failed in the connection's thread
            await self._discard()
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
        connection = aiosqlite.Connection(lambda: raw, 64)
        _daemon_thread_of(connection)
        self._connection = await connection  # starts the thread
        self._raw = raw
        return self._connection

    @asynccontextmanager
    async def _turn(self) -> AsyncIterator[aiosqlite.Connection]:
        """This store's connection, for one transaction at a time (waiting at most the
        call's timeout for the transaction before it)."""
        if self._closed:
            raise ConfigValidationError("source_closed", fields=("source",), problems=("closed",))
        failure: Exception | None = None
        if self._lock.locked():  # a free connection is taken at once, without a timer
            try:
                async with asyncio.timeout(self._timeout_seconds):
                    await self._lock.acquire()
            except TimeoutError as error:
                failure = error
            if failure is not None:
                raise _failure(failure, Stage.CONNECT)
        else:
            await self._lock.acquire()
        try:
            if self._closed:
                raise ConfigValidationError("source_closed", fields=("source",), problems=("closed",))
            yield await self._open()
        finally:
            self._lock.release()

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[SqliteTransaction]:
        """A transaction whose statements each hop to the connection's thread (migrations,
        tools and tests; operations use :meth:`run`)."""
        async with self._turn() as connection:

            async def execute(sql: str, parameters: Mapping[str, Any] | Sequence[Any] = ()) -> list[Any]:
                return await _run(connection, sql, parameters)

            await _run(connection, "BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield SqliteTransaction(self, execute, write=write, raw=self._raw)
            except BaseException:
                await self._rollback(connection)
                raise
            await self._commit(connection)

    @asynccontextmanager
    async def borrowed(self, connection: Any) -> AsyncIterator[SqliteTransaction]:
        """See :meth:`tenure.adapters.core.store.Store.borrowed`. The write lock is the
        caller's transaction's: the first statement that writes takes it (a transaction
        begun deferred that read a snapshot another writer has since changed is refused by
        SQLite then, ``SQLITE_BUSY_SNAPSHOT``, and nothing is written)."""
        if self._closed:
            raise ConfigValidationError("source_closed", fields=("source",), problems=("closed",))
        if not isinstance(connection, aiosqlite.Connection):
            raise ConfigValidationError("invalid_using", fields=("using",), problems=("aiosqlite_connection_required",))
        if not connection.in_transaction:
            raise ConfigValidationError("invalid_using", fields=("using",), problems=("open_transaction_required",))

        async def execute(sql: str, parameters: Mapping[str, Any] | Sequence[Any] = ()) -> list[Any]:
            return await _run(connection, sql, parameters)

        transaction = SqliteTransaction(self, execute, write=True, raw=getattr(connection, "_conn", None))
        # The clock first: advancing it takes the write lock, so the rows read after it
        # are the ones the write is decided on.
        await transaction.now_us()
        yield transaction

    async def run(self, body: Body[T], *, write: bool) -> T:
        """The whole transaction (BEGIN, the body's statements and decisions, COMMIT) in one
        hop to the connection's thread: a hop costs more than most statements do. A call
        cancelled meanwhile rolls back unless its COMMIT had already begun (then, as for
        any interrupted COMMIT, the outcome is uncertain)."""
        async with self._turn() as connection:
            abandoned = _Flag()
            try:
                result: T = await connection._execute(self._whole, body, write, abandoned)  # type: ignore[no-untyped-call]  # noqa: SLF001
                return result
            except asyncio.CancelledError:
                abandoned.raised = True
                raise

    def _whole(self, body: Body[T], write: bool, abandoned: _Flag) -> T:
        """:meth:`run`'s transaction, in the connection's thread."""
        raw = self._raw
        assert raw is not None

        async def execute(sql: str, parameters: Mapping[str, Any] | Sequence[Any] = ()) -> list[Any]:
            return _run_here(raw, sql, parameters)

        _run_here(raw, "BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            result = _drive(body(SqliteTransaction(self, execute, write=write, raw=raw)))
            if abandoned.raised:
                raise asyncio.CancelledError
        except BaseException:
            self._rollback_here(raw)
            raise
        try:
            _run_here(raw, "COMMIT", stage=Stage.COMMIT)
        except TenureError:
            self._rollback_here(raw)
            raise
        return result

    def _rollback_here(self, raw: sqlite3.Connection) -> None:
        """ROLLBACK in the connection's thread; if even that fails the connection is
        replaced before its next use (see :meth:`_rollback`)."""
        try:
            _run_here(raw, "ROLLBACK")
        except TenureError:
            self._broken = True

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
        await self._discard()

    async def _discard(self) -> None:
        connection, self._connection, self._raw, self._broken = self._connection, None, None, False
        if connection is None:
            return
        try:
            await connection.close()
        except Exception:  # noqa: BLE001 - closing is best effort; the thread stops either way
            pass

    async def listen(self, binding: Binding, wake: Callable[[], None]) -> None:
        """SQLite has no notifications: workers poll (with backoff up to their idle wait)."""
        return None

    async def close(self) -> None:
        """Close the connection (after the call holding it, if any). Final: later calls
        raise ``source_closed``; closing again does nothing."""
        self._closed = True
        async with self._lock:
            await self._discard()
