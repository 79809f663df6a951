"""The PostgreSQL store's connections: the pool, the listener, and the one boundary every
driver call passes (its deadline, and the reason a driver failure is reported with).

Every call into asyncpg runs through :func:`call` (or :func:`fetch_once` for one
autocommit statement): under the call's deadline (``WorkerConfig.timeout_seconds``,
counted from the start of the call: the wait for a pooled connection, connecting,
BEGIN, every statement and COMMIT share it), and whatever the driver, the socket, the
pool or the timer raised becomes ``QUEUE_PERSISTENCE_FAILED`` with a reason from
:data:`REASONS_BY_CLASS` (see :mod:`tenure.adapters.core.failures`). No driver text
travels further.

Every connection is opened by :func:`connect`, which honours the URL's ``pooler``
(:class:`~tenure.adapters.core.urls.Pooler`): under ``pooler=transaction`` asyncpg's
statement cache is off (no named prepared statement outlives its transaction), and
without a ``pooler`` a connection answered by a pooler is refused before any statement
is prepared on it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import asyncpg

from tenure.model import ConfigValidationError, TenureError

from ..core.failures import Stage, reason_by_class, translate
from ..core.urls import Pooler

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS", "ROLLBACK_GRACE_SECONDS", "POOL_SIZE", "REASONS_BY_CLASS", "call", "fetch_once",
    "rollback", "connect", "refuse_unnamed_pooler", "Connections", "Listener", "LISTENER_CHECK_SECONDS",
]

T = TypeVar("T")

DEFAULT_TIMEOUT_SECONDS = 30.0
"""The per-call bound when no WorkerConfig gives one (migrations, tools)."""

ROLLBACK_GRACE_SECONDS = 2.0
"""How long a ROLLBACK after a refusal may take beyond the call's deadline before the
connection is terminated instead (a refusal must not leave a healthy connection unused,
nor wait on a frozen server)."""

POOL_SIZE = 10
"""Connections per store; each open transaction holds one."""

LISTENER_CHECK_SECONDS = 30.0
"""How often a listener's connection is checked (one ``LISTEN`` it already holds, a
no-op for the server): a connection cut without a word (a partition, a proxy that
dropped it) delivers nothing and reports nothing until something is sent on it."""

_POSTGRES_EPOCH_US = 946_684_800_000_000
"""2000-01-01 UTC, PostgreSQL's zero instant, in microseconds since the Unix epoch."""


def _instant_to_wire(micros: int) -> tuple[int]:
    return (micros - _POSTGRES_EPOCH_US,)


def _instant_from_wire(wire: tuple[int]) -> int:
    return wire[0] + _POSTGRES_EPOCH_US


async def count_instants_in_microseconds(connection: asyncpg.Connection) -> None:
    """``timestamptz`` values travel as the kernel counts them: integer microseconds since
    the Unix epoch, both ways. asyncpg's "tuple" format hands over PostgreSQL's own binary
    value (microseconds since 2000-01-01, independent of the session time zone), so no
    datetime is built or taken apart for each instant of each row (that was about a tenth
    of a heartbeat's client time). The infinities arrive far outside the kernel's instant
    bounds, so a row holding one reads as corrupt."""
    await connection.set_type_codec(
        "timestamptz", schema="pg_catalog", encoder=_instant_to_wire, decoder=_instant_from_wire, format="tuple"
    )


async def refuse_unnamed_pooler(connection: asyncpg.Connection) -> None:
    """``ConfigValidationError`` (``pooler_detected_needs_pooler_parameter``) when a pooler
    answered this connection though the URL names none.

    A server tells each client its backend's process ID at startup; PgBouncer (and the
    other poolers that share server connections) make one up, since the client's
    statements may run on any of their server connections. So when the process ID the
    connection was given is not the one ``pg_backend_pid()`` reports, something between
    the client and the server hands out its connections. One simple-protocol round trip
    (it prepares no statement: through a pooler in transaction mode, asyncpg's named
    statements collide with those of other clients before anything else could report
    it). A pooler cannot be told apart from its mode this way, so the URL must say which
    (``pooler=transaction`` or ``pooler=session``)."""
    status = await connection.execute(f"SELECT 1 WHERE pg_backend_pid() = {int(connection.get_server_pid())}")
    if status != "SELECT 1":
        raise ConfigValidationError(
            "invalid_db_url", fields=("db_url", "db_url.pooler"),
            problems=("pooler_detected_needs_pooler_parameter",) * 2,
        )


async def connect(dsn: str, pooler: Pooler | None) -> asyncpg.Connection:
    """A new connection to ``dsn`` (its instants in microseconds): see the module docstring.

    A pooler that refuses a setting of the startup packet (PgBouncer refuses every one
    it does not track, such as the URL's ``statement_timeout``, with a protocol
    violation, which a server never sends at startup) is refused as
    ``pooler_refused_startup_parameter``."""
    # asyncpg then prepares every statement unnamed, inside the round trips that run it:
    # PgBouncer keeps a client on one server connection until a Sync ends a statement
    # outside a transaction, so nothing prepared is looked up on another one.
    options = {"statement_cache_size": 0} if pooler is Pooler.TRANSACTION else {}
    refused = False
    try:
        connection = await asyncpg.connect(dsn, **options)
    except asyncpg.ProtocolViolationError:
        refused = True
    if refused:  # raised outside the except block: no driver text rides along as context
        raise ConfigValidationError(
            "invalid_db_url", fields=("db_url",), problems=("pooler_refused_startup_parameter",)
        )
    try:
        if pooler is None:
            await refuse_unnamed_pooler(connection)
        await count_instants_in_microseconds(connection)
    except BaseException:
        connection.terminate()
        raise
    return connection


REASONS_BY_CLASS: tuple[tuple[type[BaseException], str], ...] = (
    (TimeoutError, "timeout"),
    (asyncpg.UniqueViolationError, "constraint_violated"),
    (asyncpg.DivisionByZeroError, "read_back_mismatch"),  # a decided-ahead write's own check
    (asyncpg.DeadlockDetectedError, "deadlock"),
    (asyncpg.InvalidCatalogNameError, "database_missing"),
    (asyncpg.UndefinedTableError, "schema_missing"),
    (asyncpg.UndefinedColumnError, "schema_missing"),
    (asyncpg.InvalidSchemaNameError, "schema_missing"),
    (asyncpg.InvalidAuthorizationSpecificationError, "authentication_failed"),
    (asyncpg.CannotConnectNowError, "connection_refused"),
    (asyncpg.TooManyConnectionsError, "connection_refused"),
    (ConnectionRefusedError, "connection_refused"),
    (socket.gaierror, "host_not_found"),  # before OSError, its base
    (ssl.SSLError, "tls_failed"),
    (asyncpg.AdminShutdownError, "connection_lost"),
    (asyncpg.CrashShutdownError, "connection_lost"),
    (asyncpg.PostgresConnectionError, "connection_lost"),
    (ValueError, "unavailable"),  # asyncpg's client-side DataError: a value it cannot send
    (asyncpg.InterfaceError, "connection_lost"),  # "connection is closed", "another operation is in progress"
    (asyncpg.InternalClientError, "connection_lost"),
    (OSError, "connection_lost"),
)
"""Which reason a driver failure gets (first match); anything else is ``unavailable``."""


def _reason(error: Exception, stage: Stage) -> str:
    # asyncpg refuses a server that declines TLS under sslmode=require with a plain
    # ConnectionError; its text is read here to tell it apart, never passed on.
    if type(error) is ConnectionError and "SSL" in str(error):
        return "tls_failed"
    reason = reason_by_class(error, REASONS_BY_CLASS)
    if reason == "tls_failed" and stage is not Stage.CONNECT:
        return "connection_lost"  # a TLS error mid-call is a broken connection (retry-safe), not a handshake
    return reason


def _failure(error: Exception, stage: Stage) -> Exception:
    sqlstate = getattr(error, "sqlstate", None)
    detail = sqlstate if isinstance(sqlstate, str) and sqlstate.isalnum() and len(sqlstate) == 5 else ""
    return translate(error, stage, _reason(error, stage), detail=detail)


async def call(operation: Callable[[], Awaitable[T]], deadline: float, stage: Stage) -> T:
    """The one boundary: ``operation`` (one driver call) under the deadline, any failure
    but our own errors turned into the documented one. Raised outside the ``except``
    block, so no driver exception (and its text) is attached as context."""
    failure: Exception | None = None
    try:
        async with asyncio.timeout_at(deadline):
            return await operation()
    except (TenureError, ConfigValidationError):
        raise
    except Exception as error:  # noqa: BLE001 - this is the boundary: nothing else may pass
        failure = error
    raise _failure(failure, stage)


async def fetch_once(connection: asyncpg.Connection, sql: str, arguments: Sequence[Any], deadline: float) -> Any:
    """The boundary for one autocommit statement: an error the server answered with
    means nothing was kept (its own reason); any other failure once it was sent (the
    connection, the deadline) leaves the outcome unknown: ``commit_unacknowledged``. A
    deadline that passed before it was sent sends nothing: ``timeout``.

    The deadline is the driver's own timeout, given what is left of the call (asyncpg
    bounds a prepare by it and the execution by what is left after the prepare, and
    cancels the statement on the server when it fires, as it does for a cancelled task):
    no ``asyncio.timeout`` scope around it, which cost a call some fifteen Python calls
    (issue 51)."""
    remaining = deadline - asyncio.get_running_loop().time()
    if remaining <= 0:
        raise _failure(TimeoutError(), Stage.STATEMENT)
    failure: Exception | None = None
    try:
        return await connection.fetch(sql, *arguments, timeout=remaining)
    except (TenureError, ConfigValidationError):
        raise
    except Exception as error:  # noqa: BLE001 - this is the boundary: nothing else may pass
        failure = error
    answered = isinstance(failure, asyncpg.PostgresError) and not isinstance(failure, asyncpg.PostgresConnectionError)
    raise _failure(failure, Stage.STATEMENT if answered else Stage.COMMIT)


async def rollback(connection: asyncpg.Connection, deadline: float) -> bool:
    """ROLLBACK after a refusal; True when it was acknowledged (the connection is fit
    for reuse). Any failure only means the connection is dropped instead."""
    grace = max(deadline, asyncio.get_running_loop().time() + ROLLBACK_GRACE_SECONDS)
    try:
        await call(lambda: connection.execute("ROLLBACK"), grace, Stage.STATEMENT)
    except TenureError:
        return False
    return True


class Slots:
    """At most ``size`` holders at once: a counting semaphore whose free slot is taken
    by reading two attributes (:meth:`Connections.take`'s hot path makes no call into it;
    ``asyncio.Semaphore`` cost seven Python calls a call: issue 51). When none is free,
    callers wait first come first served.

    A give hands the slot to the first waiter whose wait was not cancelled, dropping the
    cancelled ones before it, so no slot is free while anyone is queued (a new caller
    queues only when none is free, or behind others). A waiter cancelled after a slot was
    handed to it (its deadline passed as the slot came) gives the slot back, so none is
    ever lost."""

    __slots__ = ("free", "waiters")

    def __init__(self, size: int) -> None:
        self.free = size
        """Slots nobody holds (taken at once when no one waits: ``free and not waiters``)."""
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def take(self) -> None:
        """Hold a slot, waiting for one if none is free or others wait first."""
        if self.free and not self.waiters:
            self.free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)  # none is free here: a give leaves none free while any waits
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot as it left: passed on
            else:
                with contextlib.suppress(ValueError):
                    self.waiters.remove(waiter)
            raise

    def give(self) -> None:
        """Let go of a held slot (to the first live waiter, if any)."""
        self.free += 1
        self.hand_over()

    def hand_over(self) -> None:
        """Hand the free slots to the first waiters whose wait was not cancelled."""
        while self.free and self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                self.free -= 1
                waiter.set_result(None)


class Connections:
    """At most ``size`` open connections, reused last-in first-out.

    Measured cheaper than asyncpg's pool for tenure's one-transaction-per-call use: taking
    and returning a connection costs no event-loop round (asyncpg's pool shields its
    release in a task and re-arms timers on every call); the pool cost about 80 us of an
    850 us ``heartbeat_owned`` on this machine. It can be this simple because tenure keeps
    no session state (no LISTEN, SET or session lock; asyncpg's statement cache is safe
    to keep, and is off under ``pooler=transaction``): a connection is only handed out again when its transaction ended cleanly
    (committed or rolled back) and it is still open; any other connection is terminated
    and replaced by a fresh one on demand. Idle connections stay open until the store is
    closed (there is no idle timeout). tests/adapters/postgres/test_postgres.py holds these rules.

    Waiting for a free slot and connecting run under the caller's deadline.
    """

    def __init__(self, dsn: str, size: int, *, pooler: Pooler | None = None) -> None:
        self._dsn = dsn
        self._pooler = pooler
        self._slots = Slots(size)
        self._idle: list[asyncpg.Connection] = []
        self._closed = False

    async def take(self, deadline: float) -> asyncpg.Connection:
        slots = self._slots
        if slots.free and not slots.waiters:
            # A free slot is taken without waiting (nothing to bound) and without a call,
            # and an idle connection without a driver call: the call's one deadline scope
            # is then its statement's (no timer armed and cancelled around a wait that
            # cannot happen).
            slots.free -= 1
        else:
            await call(slots.take, deadline, Stage.CONNECT)
        try:
            while self._idle:
                connection = self._idle.pop()
                if not connection.is_closed():
                    return connection
            return await call(self._connect, deadline, Stage.CONNECT)
        except BaseException:
            self._slots.give()
            raise

    async def _connect(self) -> asyncpg.Connection:
        return await connect(self._dsn, self._pooler)

    def give_back(self, connection: asyncpg.Connection, *, clean: bool) -> None:
        try:
            if clean and not self._closed and not connection.is_closed() and not connection.is_in_transaction():
                self._idle.append(connection)
            else:
                connection.terminate()
        finally:
            slots = self._slots
            slots.free += 1  # Slots.give, inline: with nobody waiting, no call
            if slots.waiters:
                slots.hand_over()

    async def close(self, deadline: float) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            try:
                await call(connection.close, deadline, Stage.CONNECT)
            except TenureError:
                connection.terminate()


class Listener:
    """A dedicated connection LISTENing on one channel (see :meth:`~tenure.adapters.postgres.store.PostgresStore.listen`).
    It holds session state, so it never joins the pool.

    When its connection ends for any reason but :meth:`close` (the server terminated it,
    the network reset it), ``wake`` is called, so its worker notices the loss at once
    (``alive`` is then False) instead of at its next fallback poll. A connection cut
    silently is found by a check every :data:`LISTENER_CHECK_SECONDS`: the ``LISTEN``
    is sent again (a no-op for the server) under ``timeout_seconds``; no answer in time
    ends the connection, which wakes the worker the same way."""

    def __init__(self, connection: asyncpg.Connection, channel: str, wake: Callable[[], None],
                 timeout_seconds: float) -> None:
        self._connection = connection
        self._wake = wake
        self._closing = False
        self._statement = 'LISTEN "' + channel.replace('"', '""') + '"'
        self._timeout_seconds = timeout_seconds
        connection.add_termination_listener(self._ended)
        self._checks = asyncio.create_task(self._check_periodically())

    def _ended(self, _connection: object) -> None:
        if not self._closing:
            self._wake()

    async def _check_periodically(self) -> None:
        connection = self._connection
        while not connection.is_closed():
            await asyncio.sleep(LISTENER_CHECK_SECONDS)
            try:
                async with asyncio.timeout(self._timeout_seconds):
                    await connection.execute(self._statement)
            except Exception:  # noqa: BLE001 - any failure means the same: this connection is gone
                connection.terminate()  # its termination listener wakes the worker

    @property
    def alive(self) -> bool:
        return not self._connection.is_closed()

    async def close(self) -> None:
        self._closing = True
        self._checks.cancel()
        await asyncio.wait([self._checks], timeout=ROLLBACK_GRACE_SECONDS)  # never two operations at once
        connection = self._connection
        if connection.is_closed():
            return
        try:
            await asyncio.wait_for(connection.close(), ROLLBACK_GRACE_SECONDS)
        except (Exception, asyncio.CancelledError):
            connection.terminate()
            raise
