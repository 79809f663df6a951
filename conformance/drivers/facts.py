"""Server facts: what tenure's guarantees rest on, checked on the user's own database.

The lockstep proof shows the kernel and the database agree on the commands it ran; the
facts say whether the server under it behaves as tenure assumes everywhere else. Each
fact is checked by doing the thing (a row locked in one connection and skipped in
another, a notification sent from one connection and awaited on another), never by
reading a version number, and each is reported as passed, failed or not applicable
(``None``: SQLite has no row locks to skip, no server time zone, no notifications), with
a short reason word. No reason carries driver text, a URL or an identifier.

``db_url`` names a scratch area the caller made and migrated and will drop (PostgreSQL:
the URL's ``?schema=``; SQLite: a scratch file): the checks create and drop tables of
their own there (``tenure_facts_<random>``), read and advance tenure's own clock row
(SQLite), and touch nothing else. Connections are tenure's own
(:func:`tenure.adapters.postgres.connections.connect` and the stores of
:func:`tenure.adapters.wiring.dialects.open_store`), so the URL's ``schema`` and ``pooler``
hold exactly as they do for tenure: through PgBouncer in transaction mode
(``pooler=transaction``) LISTEN/NOTIFY and prepared statements fail here, and the
reason says that tenure's pooler mode does without them; without ``pooler`` every
PostgreSQL fact fails as ``pooler_detected_needs_pooler_parameter``.

The facts (:data:`FACT_NAMES`, in the order they are reported):

- ``clock_monotonic``: the database clock read many times, in turn on several
  connections, never goes back (PostgreSQL: ``clock_timestamp()``; SQLite: tenure's
  high-water clock, also with this process's clock stepped back an hour);
- ``transaction_isolation``: a transaction tenure begins runs at READ COMMITTED (the
  PostgreSQL store's reads and row locks assume it); SQLite: a second writer is kept
  out while one holds ``BEGIN IMMEDIATE``;
- ``skip_locked``: ``FOR UPDATE SKIP LOCKED`` passes over a row another connection holds;
- ``advisory_locks``: a transaction-level advisory lock excludes another transaction
  until it ends (tenure takes no session-level one);
- ``listen_notify``: a notification sent on one connection reaches a LISTEN on another
  within the deadline;
- ``prepared_statements``: a named prepared statement stays usable on its connection
  while other connections prepare and run theirs;
- ``time_zone_irrelevant``: an instant written through tenure's codec under one
  ``TimeZone`` reads back as the same instant under another;
- ``statement_timeouts``: no nonzero ``statement_timeout``, ``lock_timeout``,
  ``idle_in_transaction_session_timeout`` (or ``transaction_timeout``) is shorter than
  the per-call deadline (such a timeout would end tenure's calls before their deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from tenure.adapters.core.failures import reason_by_class
from tenure.adapters.core.tables import qualified
from tenure.adapters.core.urls import DatabaseKind, DatabaseTarget, Pooler, parse_db_url
from tenure.adapters.wiring.dialects import open_store
from tenure.model import ConfigValidationError, TenureError

__all__ = ["Fact", "FACT_NAMES", "CHECKS", "CLOCK_READS", "CHECK_BUDGET_DEADLINES", "check_server_facts"]


@dataclasses.dataclass(frozen=True)
class Fact:
    """One fact about the server: ``passed`` is None when it does not apply to this
    database; ``reason`` is a short reason word, never driver text."""

    name: str
    passed: bool | None
    reason: str


CLOCK_READS = 60
"""How many times ``clock_monotonic`` reads the clock (in turn on three connections)."""

CHECK_BUDGET_DEADLINES = 4
"""A check may take this many per-call deadlines in all (it makes several calls) before
it fails as ``timeout``."""

_HOUR_US = 3_600_000_000


@dataclasses.dataclass(frozen=True)
class _Probe:
    """What every check gets: the URL, what it names, and the per-call deadline."""

    db_url: str
    target: DatabaseTarget
    deadline_seconds: float

    def scratch_table(self) -> str:
        """A new table name of this run's own, in the URL's schema (quoted)."""
        return qualified(self.target.schema, f"tenure_facts_{secrets.token_hex(6)}")

    @property
    def transaction_pooler(self) -> bool:
        return self.target.pooler is Pooler.TRANSACTION

    @contextlib.asynccontextmanager
    async def connections(self, count: int) -> AsyncIterator[list[Any]]:
        """``count`` asyncpg connections opened as tenure opens its own (the URL's pooler
        honoured; a pooler the URL does not name refused), closed afterwards."""
        from tenure.adapters.postgres.connections import connect

        opened: list[Any] = []
        try:
            for _ in range(count):
                async with asyncio.timeout(self.deadline_seconds):
                    opened.append(await connect(self.target.location, self.target.pooler))
            yield opened
        finally:
            for connection in opened:
                connection.terminate()  # nothing of theirs outlives the check (a LISTEN, a lock)


Check = Callable[[_Probe], Awaitable[tuple[bool | None, str]]]


# --- the clock ------------------------------------------------------------------------------


async def _clock_reads(probe: _Probe, stores: list[Any], last: int | None) -> tuple[int | None, bool]:
    """Read the clock CLOCK_READS times, each read on the next store in turn, each read
    begun after the one before was answered; (the last value, whether it never went back)."""
    for number in range(CLOCK_READS):
        async with stores[number % len(stores)].transaction(write=False) as transaction:
            now = await transaction.now_us()
        if last is not None and now < last:
            return now, False
        last = now
    return last, True


@contextlib.asynccontextmanager
async def _stores(probe: _Probe, count: int) -> AsyncIterator[list[Any]]:
    """``count`` of tenure's own stores on the URL (each its own connection)."""
    stores = [open_store(probe.db_url, timeout_seconds=probe.deadline_seconds) for _ in range(count)]
    try:
        yield stores
    finally:
        for store in stores:
            with contextlib.suppress(Exception):
                await store.close()


async def _clock_monotonic(probe: _Probe) -> tuple[bool | None, str]:
    async with _stores(probe, 3) as stores:
        _, kept = await _clock_reads(probe, stores, None)
    return (True, "monotonic") if kept else (False, "clock_went_back")


async def _sqlite_clock_monotonic(probe: _Probe) -> tuple[bool | None, str]:
    """As on PostgreSQL, then the high-water mark: a write transaction sets the clock to
    this process's wall clock; with the wall clock stepped back an hour, writes and reads
    on every connection still never see a time before it."""
    async with _stores(probe, 3) as stores:
        last, kept = await _clock_reads(probe, stores, None)
        if not kept:
            return False, "clock_went_back"
        async with stores[0].transaction(write=True) as transaction:
            written = await transaction.now_us()
        if last is not None and written < last:
            return False, "clock_went_back"
        real = stores[0].wall_clock_us
        for store in stores:
            store.wall_clock_us = lambda real=real: real() - _HOUR_US
        async with stores[1].transaction(write=True) as transaction:
            held = await transaction.now_us()
        _, kept = await _clock_reads(probe, stores, held)
        if held < written or not kept:
            return False, "clock_went_back_with_the_wall_clock"
    return True, "monotonic_high_water_holds"


# --- isolation and locks -------------------------------------------------------------------


async def _transaction_isolation(probe: _Probe) -> tuple[bool | None, str]:
    async with _stores(probe, 1) as stores, stores[0].transaction(write=True) as transaction:
        rows = await transaction.execute("SELECT current_setting('transaction_isolation')")
    level = str(rows[0][0]).replace(" ", "_")
    if level == "read_committed":
        return True, "read_committed"
    return False, f"{level}_not_read_committed" if level.isidentifier() and len(level) < 40 else "not_read_committed"


def _sqlite_writers_excluded(path: str) -> bool:
    holder = sqlite3.connect(path, isolation_level=None, timeout=5)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        holder.execute("BEGIN IMMEDIATE")
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return True  # busy: the write lock is held
        other.execute("ROLLBACK")
        return False
    finally:
        with contextlib.suppress(sqlite3.Error):
            holder.execute("ROLLBACK")
        holder.close()
        other.close()


async def _sqlite_transaction_isolation(probe: _Probe) -> tuple[bool | None, str]:
    excluded = await asyncio.to_thread(_sqlite_writers_excluded, probe.target.location)
    return (True, "serializable_writers") if excluded else (False, "second_writer_admitted")


@contextlib.asynccontextmanager
async def _scratch_rows(probe: _Probe, connection: Any) -> AsyncIterator[str]:
    """A table of this check's own holding rows 1 and 2 (``id``, ``at timestamptz``), dropped afterwards."""
    table = probe.scratch_table()
    await connection.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, at timestamptz)")
    try:
        await connection.execute(f"INSERT INTO {table} (id) VALUES (1), (2)")
        yield table
    finally:
        await connection.execute(f"DROP TABLE IF EXISTS {table}")


async def _skip_locked(probe: _Probe) -> tuple[bool | None, str]:
    import asyncpg

    async with probe.connections(2) as (holder, skipper), _scratch_rows(probe, holder) as table:
        async with holder.transaction():
            await holder.fetch(f"SELECT id FROM {table} WHERE id = 1 FOR UPDATE")
            try:
                async with skipper.transaction():
                    # Waiting instead of skipping fails fast: a lock wait bounded well inside the deadline.
                    await skipper.execute(f"SET LOCAL lock_timeout = {max(1, int(probe.deadline_seconds * 500))}")
                    rows = await skipper.fetch(f"SELECT id FROM {table} ORDER BY id FOR UPDATE SKIP LOCKED")
            except asyncpg.LockNotAvailableError:
                return False, "skip_locked_waited"
            except (asyncpg.PostgresSyntaxError, asyncpg.FeatureNotSupportedError):
                return False, "skip_locked_unsupported"
    ids = [row[0] for row in rows]
    return (True, "locked_row_skipped") if ids == [2] else (False, "locked_row_not_skipped")


async def _advisory_locks(probe: _Probe) -> tuple[bool | None, str]:
    import asyncpg

    key = secrets.randbits(62)
    try:
        async with probe.connections(2) as (holder, other):
            async with holder.transaction():
                await holder.execute(f"SELECT pg_advisory_xact_lock({key})")
                async with other.transaction():
                    while_held = await other.fetchval(f"SELECT pg_try_advisory_xact_lock({key})")
            async with other.transaction():
                after = await other.fetchval(f"SELECT pg_try_advisory_xact_lock({key})")
    except (asyncpg.UndefinedFunctionError, asyncpg.FeatureNotSupportedError):
        return False, "advisory_locks_unavailable"
    if while_held is False and after is True:
        return True, "transaction_locks_exclude"
    return False, "advisory_lock_not_exclusive" if while_held else "advisory_lock_not_released"


# --- what a pooler may drop ------------------------------------------------------------------


POOLED_NOTIFY_WAIT_S = 2.0
"""How long the notification probe waits through a transaction pooler. There tenure opens
no listener (its workers poll), so the verdict is "not needed" either way and the wait
only tells the user what the pooler does; a server delivers a notification within
milliseconds, and a transaction pooler never does, so waiting out the whole per-call
deadline (``tenure conform``'s is 30 s) would only spend time."""


async def _listen_notify(probe: _Probe) -> tuple[bool | None, str]:
    channel = f"tenure_facts_{secrets.token_hex(6)}"
    heard = asyncio.Event()

    def hear(*_: object) -> None:
        heard.set()

    wait_s = min(probe.deadline_seconds, POOLED_NOTIFY_WAIT_S) if probe.transaction_pooler else probe.deadline_seconds
    async with probe.connections(2) as (listener, sender):
        await listener.add_listener(channel, hear)
        await sender.fetchval("SELECT pg_notify($1, 'probe')", channel)
        try:
            async with asyncio.timeout(wait_s):
                await heard.wait()
        except TimeoutError:
            # tenure's pooler mode opens no listener: its workers poll instead.
            return False, "notify_not_delivered_workers_poll" if probe.transaction_pooler else "notify_not_delivered"
    return True, "delivered"


async def _prepared_statements(probe: _Probe) -> tuple[bool | None, str]:
    """Two connections prepare statements of the same name, then run them, in rounds; in
    each round the other connection holds a transaction while the first runs its
    statement. On a server (or a pooler in session mode) each connection keeps its own;
    a pooler in transaction mode hands the statements' server connections around, so a
    name collides there or is missing where the next statement runs."""
    import asyncpg

    name = f"tenure_facts_{secrets.token_hex(6)}"
    lost = False
    async with probe.connections(2) as (first, second):
        try:
            for round_number in range(4):
                statement = f"{name}_{round_number}"
                mine = await first.prepare("SELECT $1::integer + 1", name=statement)
                theirs = await second.prepare("SELECT $1::integer + 1", name=statement)
                async with second.transaction():
                    await second.fetchval("SELECT 1")
                    answered = await mine.fetchval(round_number)
                answered_too = await theirs.fetchval(round_number)
                if (answered, answered_too) != (round_number + 1, round_number + 1):
                    lost = True
                    break
        except (asyncpg.InvalidSQLStatementNameError, asyncpg.DuplicatePreparedStatementError):
            lost = True
    if not lost:
        return True, "prepared_statements_kept"
    if probe.transaction_pooler:
        return False, "prepared_statements_lost_pooler_mode_avoids_them"
    return False, "prepared_statements_lost_needs_pooler_transaction"


# --- instants and timeouts -----------------------------------------------------------------


async def _time_zone_irrelevant(probe: _Probe) -> tuple[bool | None, str]:
    """An instant (integer microseconds, tenure's codec) written under one time zone and
    read back under another, both as a value and as compared by the server."""
    instant = time.time_ns() // 1000 // 1_000_000 * 1_000_000 + 123_457  # microseconds that matter
    async with probe.connections(2) as (writer, reader), _scratch_rows(probe, writer) as table:
        async with writer.transaction():
            await writer.execute("SET LOCAL TimeZone = 'Pacific/Kiritimati'")
            await writer.execute(f"UPDATE {table} SET at = $1 WHERE id = 1", instant)
        async with reader.transaction():
            await reader.execute("SET LOCAL TimeZone = 'America/Adak'")
            row = await reader.fetchrow(
                f"SELECT at, at = 'epoch'::timestamptz + $1::bigint * interval '1 microsecond', "
                f"current_setting('TimeZone') FROM {table} WHERE id = 1", instant)
    if row[2] != "America/Adak":
        return False, "time_zone_not_set"
    return (True, "instants_independent_of_time_zone") if (row[0], row[1]) == (instant, True) \
        else (False, "instant_changed_with_time_zone")


_TIMEOUTS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout", "transaction_timeout")


async def _statement_timeouts(probe: _Probe) -> tuple[bool | None, str]:
    """The timeouts a transaction tenure begins runs under (the role's and database's
    settings included), in milliseconds (``pg_settings`` reports these in ms)."""
    async with probe.connections(1) as (connection,), connection.transaction():
        rows = await connection.fetch("SELECT name, setting::bigint FROM pg_settings WHERE name = ANY($1::text[])",
                                      list(_TIMEOUTS))
    deadline_ms = probe.deadline_seconds * 1000
    settings = {str(name): int(setting) for name, setting in rows}
    for name in _TIMEOUTS:
        if 0 < settings.get(name, 0) < deadline_ms:
            return False, f"{name}_shorter_than_deadline"
    return True, "no_timeout_below_deadline"


# --- the tables -------------------------------------------------------------------------------


def _not_applicable(reason: str) -> Check:
    async def check(probe: _Probe) -> tuple[bool | None, str]:
        return None, reason

    return check


FACT_NAMES = ("clock_monotonic", "transaction_isolation", "skip_locked", "advisory_locks", "listen_notify",
              "prepared_statements", "time_zone_irrelevant", "statement_timeouts")
"""Every fact, in the order :func:`check_server_facts` reports them."""

CHECKS: Mapping[DatabaseKind, Mapping[str, Check]] = {
    DatabaseKind.POSTGRESQL: {
        "clock_monotonic": _clock_monotonic,
        "transaction_isolation": _transaction_isolation,
        "skip_locked": _skip_locked,
        "advisory_locks": _advisory_locks,
        "listen_notify": _listen_notify,
        "prepared_statements": _prepared_statements,
        "time_zone_irrelevant": _time_zone_irrelevant,
        "statement_timeouts": _statement_timeouts,
    },
    DatabaseKind.SQLITE: {
        "clock_monotonic": _sqlite_clock_monotonic,
        "transaction_isolation": _sqlite_transaction_isolation,
        "skip_locked": _not_applicable("sqlite_serializes_writers"),
        "advisory_locks": _not_applicable("sqlite_serializes_writers"),
        "listen_notify": _not_applicable("sqlite_workers_poll"),
        "prepared_statements": _not_applicable("sqlite_in_process"),
        "time_zone_irrelevant": _not_applicable("sqlite_has_no_server_time_zone"),
        "statement_timeouts": _not_applicable("sqlite_has_no_server_timeouts"),
    },
}
"""Per database kind, each fact's check (a coroutine function of the probe returning
``(passed, reason)``)."""


def _failure_reason(error: BaseException) -> str:
    """A reason word for a check that could not finish (never the driver's text)."""
    if isinstance(error, ConfigValidationError) and error.problems:
        return error.problems[0]
    if isinstance(error, TenureError):
        return error.reason
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, sqlite3.Error):
        return "unavailable"
    try:
        import asyncpg

        from tenure.adapters.postgres.connections import REASONS_BY_CLASS
    except ImportError:  # pragma: no cover - asyncpg is a dependency of tenure
        return "unavailable"
    table = ((asyncpg.InsufficientPrivilegeError, "permission_denied"),
             (asyncpg.ReadOnlySQLTransactionError, "read_only_transaction"), *REASONS_BY_CLASS)
    return reason_by_class(error, table)


async def _run_check(check: Check, probe: _Probe) -> tuple[bool | None, str]:
    try:
        async with asyncio.timeout(probe.deadline_seconds * CHECK_BUDGET_DEADLINES):
            return await check(probe)
    except Exception as error:  # noqa: BLE001 - a fact that could not be checked is reported, with its reason
        return False, _failure_reason(error)


async def check_server_facts(db_url: str, *, per_call_deadline_seconds: float = 5.0) -> list[Fact]:
    """Every fact of :data:`FACT_NAMES` about the database ``db_url`` names (a migrated
    scratch area: see the module docstring), checked one after another. A bad URL or
    deadline is refused (``ConfigValidationError``); a check that cannot finish fails
    with the reason it could not (``timeout``, ``connection_refused``,
    ``pooler_detected_needs_pooler_parameter``, ...)."""
    target = parse_db_url(db_url)
    deadline = per_call_deadline_seconds
    if type(deadline) not in (int, float) or not math.isfinite(deadline) or not 0 < deadline <= 3600:
        raise ConfigValidationError("invalid_per_call_deadline_seconds", fields=("per_call_deadline_seconds",),
                                    problems=("number_out_of_range",))
    probe = _Probe(db_url, target, float(deadline))
    checks = CHECKS[target.kind]
    facts = []
    for name in FACT_NAMES:
        passed, reason = await _run_check(checks[name], probe)
        facts.append(Fact(name, passed, reason))
    return facts
