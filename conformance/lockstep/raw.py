"""Raw SQL the public API cannot express, for the lockstep machines: an operator moving a
lease into the past, another session holding a row lock, a writer changing a row between
the engine's read and its write, a writer whose transaction stays open while a statement
waits on its locks. It plays the adversary and the clock; it never bypasses
what the lockstep checks. The rooms standing on this one use it too: the driver proofs
(a raw read), the scratch area (its connections) and the explorer's replays (the clock). Statements use ``?`` placeholders (PostgreSQL gets ``$n``) and
run in the URL's schema: a scratch schema in a user's database, or a test database.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sqlite3
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from tenure.adapters.core.tables import instant_from_sqlite_text, instant_to_sqlite_text
from tenure.adapters.core.urls import parse_db_url
from tenure.adapters.queue.table import binding_for
from tenure.model import QueueKind, TenureError

__all__ = [
    "kind_of", "sqlite_path", "raw", "run_async", "connect", "table", "shift_instants", "expire_lease",
    "interfering_after_load", "RowHolder", "store_module", "holding_open",
]


def kind_of(db_url: str) -> str:
    return "sqlite" if db_url.startswith("sqlite") else "postgresql"


def sqlite_path(db_url: str) -> str:
    return db_url.split(":///", 1)[1].split("?", 1)[0]


T = TypeVar("T")


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync or async code (in a worker thread)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def connect(db_url: str) -> Any:
    """An asyncpg connection to the URL's server, with no statement cache (a pooler in
    transaction mode keeps no prepared statement); :func:`in_schema` sets the schema per
    transaction."""
    import asyncpg

    return await asyncpg.connect(parse_db_url(db_url).location, statement_cache_size=0)


async def in_schema(connection: Any, db_url: str) -> None:
    """Inside a transaction: its statements name the URL's schema's tables (SET LOCAL, so
    nothing outlives the transaction on a pooled server connection)."""
    schema = parse_db_url(db_url).schema
    if schema is not None:
        await connection.execute(f'SET LOCAL search_path TO "{schema}"')


async def _pg(db_url: str, sql: str, parameters: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    connection = await connect(db_url)
    try:
        numbered, count = [], 0
        for piece in sql.split("?"):
            numbered.append(piece)
            count += 1
            numbered.append(f"${count}")
        text = "".join(numbered[:-1])
        if parse_db_url(db_url).schema is None:  # CREATE DATABASE and its kin refuse a transaction
            return [tuple(row) for row in await connection.fetch(text, *parameters)]
        async with connection.transaction():
            await in_schema(connection, db_url)
            return [tuple(row) for row in await connection.fetch(text, *parameters)]
    finally:
        await connection.close()


def store_module(kind: str) -> Any:
    if kind == "sqlite":
        from tenure.adapters.sqlite import store as sqlite_store

        return sqlite_store
    from tenure.adapters.postgres import store as postgres_store

    return postgres_store


def raw(db_url: str, sql: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement outside the library and commit it."""
    if kind_of(db_url) == "sqlite":
        connection = sqlite3.connect(sqlite_path(db_url))
        try:
            rows = connection.execute(sql, parameters).fetchall()
            connection.commit()
            return rows
        finally:
            connection.close()
    return run_async(_pg(db_url, sql, parameters))


def table(queue: QueueKind, db_url: str | None = None) -> str:
    """The queue's table, qualified with the URL's schema when it names one (a statement
    run inside the store's own transaction does not see :func:`in_schema`)."""
    name = binding_for(queue).spec.name
    schema = None if db_url is None or kind_of(db_url) == "sqlite" else parse_db_url(db_url).schema
    return name if schema is None else f'"{schema}".{name}'



def shift_instants(db_url: str, queue: QueueKind, column: str, by_us: int, job_id: str | None = None) -> None:
    """Move a stored instant column back by ``by_us`` (one row, or every row that has one).
    SQLite keeps SQLAlchemy's DATETIME text, so the arithmetic happens here."""
    where = "" if job_id is None else " AND id = ?"
    selector = () if job_id is None else (job_id,)
    if kind_of(db_url) == "sqlite":
        for row_id, value in raw(db_url, f"SELECT id, {column} FROM {table(queue, db_url)} WHERE {column} IS NOT NULL{where}", selector):
            moved = instant_to_sqlite_text(instant_from_sqlite_text(value) - by_us)
            raw(db_url, f"UPDATE {table(queue, db_url)} SET {column} = ? WHERE id = ?", (moved, row_id))
        return
    sql = (f"UPDATE {table(queue, db_url)} SET {column} = {column} - make_interval(secs => ?::bigint / 1e6) "
           f"WHERE {column} IS NOT NULL{where}")
    raw(db_url, sql, (by_us, *selector))


def expire_lease(db_url: str, queue: QueueKind, job_id: str, by_us: int = 3_600_000_000) -> None:
    """Move a claim's lease into the past (the clock ran on while the worker stalled)."""
    shift_instants(db_url, queue, "lease_expires_at", by_us, job_id)


# --- interference ---------------------------------------------------------------------------


@contextlib.contextmanager
def interfering_after_load(kind: str, queue: QueueKind, marker: str, db_url: str) -> Iterator[None]:
    """While active, every row the engine loads is changed by another writer right after
    the read (in the same transaction, as a trigger or a privileged session would), and
    every row it writes from the row last seen just before that write: its error message
    becomes ``marker``."""
    module = store_module(kind)
    if kind == "sqlite":
        transaction_type: Any = module.SqliteTransaction
        sql = f"UPDATE {table(queue, db_url)} SET error_message = ? WHERE id = ?"
    else:
        transaction_type = module.PostgresTransaction
        sql = f"UPDATE {table(queue, db_url)} SET error_message = $1 WHERE id = $2"
    original = transaction_type.locked

    async def lock_then_interfere(self: Any, binding: Any, finder: Any, parameters: Any) -> Any:
        records = await original(self, binding, finder, parameters)
        if finder.name == "by_keys":
            for record in records:
                await self.execute(sql, [marker, record.job_id])
        return records

    transaction_type.locked = lock_then_interfere
    # A write from the row last seen has no read in its transaction (SQLite); the nearest
    # interference is another writer's change just before it.
    original_seen = transaction_type.update_seen

    async def interfere_then_update_seen(self: Any, binding: Any, pairs: Any) -> Any:
        for old, _ in pairs:
            await self.execute(sql, [marker, old.job_id])
        return await original_seen(self, binding, pairs)

    transaction_type.update_seen = interfere_then_update_seen
    # A one-statement write has no moment between its read and its write; the nearest
    # interference is a write committed after the row was last seen, just before it.
    store_type = getattr(module, "PostgresStore", None)
    original_ahead = None if store_type is None else store_type.write_ahead

    async def interfere_then_write_ahead(self: Any, binding: Any, finder: Any, items: Any, *args: Any, **kwargs: Any) -> Any:
        for item in items:
            raw(db_url, f"UPDATE {table(queue, db_url)} SET error_message = ? WHERE id = ?", (marker, item.key))
        assert original_ahead is not None  # installed only where the store has write_ahead
        return await original_ahead(self, binding, finder, items, *args, **kwargs)

    if store_type is not None:
        store_type.write_ahead = interfere_then_write_ahead
    try:
        yield
    finally:
        transaction_type.locked = original
        transaction_type.update_seen = original_seen
        if store_type is not None:
            store_type.write_ahead = original_ahead


class RowHolder:
    """Another session holding one row's lock while a call runs (PostgreSQL: the row
    lock; SQLite: the write lock, which covers every row), optionally moving the row's
    lease (if it has one) to end ``lease_ends_in_us`` after the holder's database time.

    ``while_held(call)`` takes the lock, starts the call, waits until it is blocked on
    the lock (PostgreSQL: ``pg_blocking_pids``; SQLite: a short pause), holds on past the
    moved lease, reads the database time it releases at (``released_at_us``), commits,
    and returns the call's outcome."""

    HOLD_PAST_THE_LEASE_S = 0.015
    WAIT_FOR_THE_BATCH_S = 120.0
    """How long the holder waits for the batch to block on its lock before releasing
    anyway (a hang guard: the batch always reaches the lock unless it fails first)."""

    def __init__(self, kind: str, db_url: str, queue: QueueKind, job_id: str, *, lease_ends_in_us: int | None) -> None:
        self.kind, self.db_url, self.queue, self.job_id = kind, db_url, queue, job_id
        self.lease_ends_in_us = lease_ends_in_us
        self.new_lease_us: int | None = None
        self.released_at_us: int | None = None

    async def while_held(self, call: Any) -> Any:
        if self.kind == "sqlite":
            return await self._sqlite(call)
        return await self._postgresql(call)

    async def _postgresql(self, call: Any) -> Any:
        from tenure.model import datetime_to_micros

        name = table(self.queue, self.db_url)
        connection = await connect(self.db_url)
        try:
            await connection.execute("BEGIN")
            await in_schema(connection, self.db_url)
            await connection.fetch(f"SELECT id FROM {name} WHERE id = $1 FOR UPDATE", self.job_id)
            if self.lease_ends_in_us is not None:
                moved = await connection.fetchval(
                    f"UPDATE {name} SET lease_expires_at = clock_timestamp() + make_interval(secs => $2::float8 / 1e6) "
                    "WHERE id = $1 AND lease_expires_at IS NOT NULL RETURNING lease_expires_at",
                    self.job_id, self.lease_ends_in_us,
                )
                self.new_lease_us = None if moved is None else datetime_to_micros(moved)
            task = asyncio.ensure_future(call())
            holder_pid = await connection.fetchval("SELECT pg_backend_pid()")
            # Until the batch waits on this lock (or ended): only a batch that waited shows
            # where it read the clock. The bound is a hang guard, not a timing: a loaded
            # machine may take seconds to start the call, and releasing before it waits
            # would make the race's outcome depend on the load (Hypothesis then sees a
            # divergence that does not reproduce while shrinking).
            loop = asyncio.get_running_loop()
            give_up_at = loop.time() + self.WAIT_FOR_THE_BATCH_S
            while loop.time() < give_up_at:
                blocked = await connection.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", holder_pid
                )
                if blocked or task.done():
                    break
                await asyncio.sleep(0.002)
            await asyncio.sleep(self.HOLD_PAST_THE_LEASE_S)
            self.released_at_us = datetime_to_micros(await connection.fetchval("SELECT clock_timestamp()"))
            await connection.execute("COMMIT")
        finally:
            await connection.close()
        return await task

    async def _sqlite(self, call: Any) -> Any:
        from tenure.adapters.core.schema import CLOCK_TABLE
        from tenure.adapters.sqlite.store import wall_clock_us

        name = table(self.queue, self.db_url)
        connection = sqlite3.connect(sqlite_path(self.db_url), isolation_level=None, check_same_thread=False)

        def lock_and_move() -> int | None:
            connection.execute("BEGIN IMMEDIATE")
            if self.lease_ends_in_us is None:
                return None
            (mark,) = connection.execute(f"SELECT high_water_us FROM {CLOCK_TABLE}").fetchone()
            moved = connection.execute(
                f"UPDATE {name} SET lease_expires_at = ? WHERE id = ? AND lease_expires_at IS NOT NULL RETURNING lease_expires_at",
                (instant_to_sqlite_text(max(mark, wall_clock_us()) + self.lease_ends_in_us), self.job_id),
            ).fetchone()
            return None if moved is None else instant_from_sqlite_text(moved[0])

        try:
            self.new_lease_us = await asyncio.to_thread(lock_and_move)
            task = asyncio.ensure_future(call())
            await asyncio.sleep(0.01 + self.HOLD_PAST_THE_LEASE_S)
            self.released_at_us = wall_clock_us()  # the waiting call's time is at least this
            await asyncio.to_thread(connection.execute, "COMMIT")
        finally:
            connection.close()
        return await task


async def holding_open(
    connection: Any, db_url: str, hold: Callable[[Any], Awaitable[Any]], call: Callable[[], Awaitable[Any]],
) -> tuple[tuple[Any, ...], tuple[Any, ...], bool]:
    """PostgreSQL: ``hold(connection)`` inside a transaction on ``connection`` (a session of
    the caller's own, from :func:`connect`, left as it was found; the caller writes
    through ``Store.borrowed(connection)``), then ``call`` while that transaction is still
    open, until ``call`` waits on one of its locks (``pg_blocking_pids``), then the commit:
    the writer that commits while a statement waits on the rows it locked. Returns both
    outcomes (``("ok", value)`` or ``("error", code, reason)``: a ``hold`` that raised is
    rolled back, and ``call`` then runs on its own) and whether ``call`` waited. The wait
    is bounded by a hang guard only: releasing before ``call`` waits would make what it
    meets depend on the machine's load."""
    try:
        await connection.execute("BEGIN")
        await in_schema(connection, db_url)
        held = await _outcome(hold(connection))
        if held[0] == "error":
            await connection.execute("ROLLBACK")
            return held, await _outcome(call()), False
        task = asyncio.ensure_future(_outcome(call()))
        holder_pid = await connection.fetchval("SELECT pg_backend_pid()")
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + RowHolder.WAIT_FOR_THE_BATCH_S
        waited = False
        while not task.done() and loop.time() < give_up_at:
            waited = bool(await connection.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", holder_pid))
            if waited:
                break
            await asyncio.sleep(0.002)
        await connection.execute("COMMIT")
    finally:
        if connection.is_in_transaction():
            await connection.execute("ROLLBACK")
    return held, await task, waited


async def _outcome(call: Awaitable[Any]) -> tuple[Any, ...]:
    try:
        return ("ok", await call)
    except TenureError as error:
        return ("error", error.code.value, error.reason)
