"""The PostgreSQL store: asyncpg connections from a pool, one transaction per operation.

The lock is the row lock: every finder that returns rows to decide on ends in
``FOR UPDATE`` (claims and sweeps in ``FOR UPDATE SKIP LOCKED``, which never waits).
The database time is ``clock_timestamp()`` (``now()`` would be the transaction's start),
sampled after the lock, so a lock wait that outlasts a lease cannot authorize a stale
write.

Job IDs may live in a genuine ``uuid`` column: IDs are then canonicalized by the
database (``$1::uuid::text``) before anything is decided, and rows come back as
canonical UUID text. A syntactically invalid UUID is a persistence failure
(``unavailable``) raised before any row is touched.

The store is in three rooms: :mod:`.statements` builds every SQL text it sends (and
their parameters), :mod:`.connections` holds the pool, the listener and the one
boundary every driver call passes (its deadline, the reason of a failure), and this
module holds the store and its transactions. A connection that failed once is never
used again (terminated, not rolled back: the server rolls back a transaction whose
connection is gone).

asyncpg is used directly rather than through SQLAlchemy's async engine: on this
machine a fenced-write transaction ran about 3x faster through asyncpg
(``python bench/driver_overhead.py DSN``), and the statements here are fixed texts that
need none of the engine's features. SQLAlchemy Core still declares the schema.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import asyncpg

from tenure.kernel.core import Finder, Rewrite, SetValue
from tenure.model import ConfigValidationError

from ..core.failures import Stage, persistence_failed
from ..core.sql import POSTGRESQL, CompiledFinder, compile_finder, counts_sql
from ..core.store import AheadAnswer, Beside, Body, Expected, Guard, JoinedAnswer, Picked, Probe, SharedPrimitives, TimeObserver
from ..core.tables import POSTGRESQL_DIALECT, ROW_VERSION, Binding, RowCodec, announce_channel, record_or_unreadable
from ..core.urls import Pooler
from . import statements
from .connections import (
    DEFAULT_TIMEOUT_SECONDS,
    POOL_SIZE,
    Connections,
    Listener,
    call,
    fetch_once,
    connect,
    count_instants_in_microseconds,
    rollback,
)
from .statements import Numbered, numbered

__all__ = ["PostgresStore", "PostgresTransaction", "POOL_SIZE", "DEFAULT_TIMEOUT_SECONDS"]

_AHEAD_TEXTS_KEPT = 256
"""How many :class:`_AheadText` shapes a store keeps before it starts again."""


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class _AheadText:
    """One shape of :meth:`PostgresStore.write_ahead`'s statement, built once: the binding
    and finder it was built for (kept, so their identities stay theirs), whether the table
    has its row version, the binding's codec, the compiled finder (its parameters) and
    the numbered statement."""

    binding: Binding
    finder: Finder
    versioned: bool
    codec: RowCodec
    compiled: CompiledFinder
    statement: Numbered
    channel: str | None

T = TypeVar("T")


class PostgresTransaction(SharedPrimitives):
    """A transaction on one pooled connection (see :class:`tenure.adapters.core.store.Transaction`)."""

    capabilities = POSTGRESQL
    dialect = POSTGRESQL_DIALECT

    def __init__(self, store: PostgresStore, connection: asyncpg.Connection, deadline: float, *,
                 writable: bool = True) -> None:
        self._store = store
        self.writable = writable
        """False: a read, whose statements run in autocommit (see :meth:`PostgresStore.transaction`)."""
        self.schema = store.schema
        self._connection = connection
        self._deadline = deadline
        self._now: int | None = None
        self.announcements: set[str] = set()
        """Channels to notify with the COMMIT (see :meth:`announce`)."""
        self.broken = False
        """A driver call of this transaction failed: its connection is not used again."""

    async def call(self, operation: Callable[[asyncpg.Connection], Awaitable[T]], stage: Stage = Stage.STATEMENT) -> T:
        """One driver call on this transaction's connection, through the boundary."""
        connection = self._connection
        try:
            return await call(lambda: operation(connection), self._deadline, stage)
        except BaseException:  # failed, timed out or cancelled mid-call: never reused
            self.broken = True
            raise

    async def _fetch(self, sql: str, parameters: Mapping[str, Any]) -> list[Any]:
        compiled = numbered(sql)
        arguments = compiled.arguments(parameters)
        return list(await self.call(lambda connection: connection.fetch(compiled.sql, *arguments)))

    async def _fetch_many(self, sql: str, many: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Run one statement per parameter set, pipelined in one round trip."""
        compiled = numbered(sql)
        arguments = [compiled.arguments(p) for p in many]
        return list(await self.call(lambda connection: connection.fetchmany(compiled.sql, arguments)))

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        """Run one ``$n`` statement in this transaction (migrations and checks)."""
        return list(await self.call(lambda connection: connection.fetch(sql, *parameters)))

    def _observe(self, now: int) -> None:
        if self._now is None:
            self._now = now
            self._store.saw_clock(now)
            if self._store.observe_time is not None:
                self._store.observe_time(self._now)

    async def now_us(self) -> int:
        if self._now is None:
            rows = await self.execute("SELECT clock_timestamp()")
            self._observe(rows[0][0])
        assert self._now is not None
        return self._now

    def codec(self, binding: Binding) -> RowCodec:
        return self._store.codec(binding)

    async def _rows(self, sql: str, parameters: Mapping[str, Any]) -> list[Any]:
        return await self._fetch(sql, parameters)

    async def canonical_key(self, binding: Binding, key: str) -> str:
        if (binding.spec.name, binding.key_column) not in self._store.uuid_columns:
            return key
        rows = await self.execute("SELECT $1::uuid::text", [key])
        return str(rows[0][0])

    async def locked(self, binding: Binding, finder: Finder, parameters: Mapping[str, Any]) -> list[Any]:
        compiled = self.compiled(binding, finder)
        sql = statements.touching(binding, compiled.sql, self.schema) if finder.lock == "touch" else (
            statements.with_clock(compiled.sql))
        rows = await self._fetch(sql, compiled.parameters(parameters))
        self._observe(rows[0][0])
        read = self.codec(binding).read
        return [read(row, 1) for row in rows if row[1] is not None]

    async def locked_joined(
        self, binding: Binding, keys: Sequence[str], other: Binding, on: tuple[tuple[str, str], ...],
    ) -> list[tuple[Any, Any]]:
        sql = statements.locked_joined_sql(binding, other, on, self.schema)
        rows = await self._fetch(sql, {"keys": self.key_list(keys)})
        self._observe(rows[0][0])
        return self.joined_records(binding, other, rows, 1)

    async def _locked_joined_beside(
        self, binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], columns: tuple[str, ...],
        parameters: Mapping[str, Any],
    ) -> tuple[list[Any], int]:
        rows = await self._fetch(statements.locked_joined_counting_sql(binding, other, on, self.schema, columns),
                                 parameters)
        self._observe(rows[0][0])
        return rows, 1

    async def write_guarded(
        self, parts: Sequence[tuple[Binding, Any, Any]], deletes: Sequence[tuple[Binding, Sequence[str]]],
        guards: Sequence[Guard],
    ) -> list[Any] | None:
        if any(old is None for _, old, _ in parts) or len({binding for binding, _, _ in parts}) != len(parts):
            return await super().write_guarded(parts, deletes, guards)  # inserts, or two rows of one table
        self._require_writable()
        parameters = self._part_parameters(parts)
        for index, (_, keys) in enumerate(deletes):
            parameters[f"d{index}_keys"] = self.key_list(keys)
        columns: tuple[str, ...] = ()
        if guards:
            compiled, bound = self.compiled_counts([count for count, _ in guards])
            columns = compiled.columns
            parameters.update(bound)
            parameters.update((f"g{index}", value) for index, (_, value) in enumerate(guards))
        shape = tuple(binding for binding, _, _ in parts)
        sql = statements.guarded_write_sql(shape, tuple(binding for binding, _ in deletes), columns, self.schema)
        row = (await self._fetch(sql, parameters))[0]
        if not row[0]:
            return None  # a count moved since it was read: nothing written
        return self._stored_parts(shape, row, 1)

    def _part_parameters(self, parts: Sequence[tuple[Binding, Any, Any]]) -> dict[str, Any]:
        """The parameters of the one-row-per-table writes of :func:`.statements.write_across_sql`
        and :func:`.statements.guarded_write_sql`, each part's under ``w<i>_``: the new row's
        values for an insert (no old row), a compare-and-set's otherwise."""
        parameters: dict[str, Any] = {}
        for index, (binding, old, new) in enumerate(parts):
            written = self.codec(binding).write(new) if old is None else self.write_parameters(binding, old, new)
            parameters.update((f"w{index}_{name}", value) for name, value in written.items())
        return parameters

    def _stored_parts(self, bindings: Sequence[Binding], row: Any, offset: int) -> list[Any]:
        """The rows those statements answer side by side from ``offset``, one per binding
        and as stored; a part whose compare-and-set found its row changed (NULL columns)
        raises ``row_changed``, for the caller's transaction to roll every write back."""
        stored: list[Any] = []
        for binding in bindings:
            if row[offset + binding.key_index] is None:
                raise persistence_failed("row_changed")  # its compare-and-set found the row changed
            stored.append(self.codec(binding).read(row, offset))
            offset += len(binding.spec.columns)
        return stored

    async def snapshot(self, binding: Binding, probes: Sequence[Probe]) -> list[Any]:
        parts: list[tuple[str, str, str | None]] = []
        parameters: dict[str, Any] = {}
        for number, probe in enumerate(probes):
            sql = statements.probe_sql(binding, self.schema, probe, f"p{number}", parameters)
            column = None if probe.field is None else binding.column_of(probe.field).name
            parts.append((probe.kind, sql, column))
        assert [kind for kind, _, _ in parts].count("rows") <= 1 and all(kind != "rows" for kind, _, _ in parts[:-1])
        rows = await self._fetch(statements.snapshot_sql(tuple(parts)), parameters)
        first = rows[0]
        self._observe(first[0])
        answers: list[Any] = []
        offset = 1
        for kind, _, _ in parts:
            if kind == "rows":
                codec, key_index = self.codec(binding), binding.key_index
                answers.append([record_or_unreadable(codec, key_index, row, offset)
                                for row in rows if row[offset] is not None])
            else:
                answers.append(bool(first[offset]) if kind == "exists" else list(first[offset]))
                offset += 1
        return answers

    def _require_writable(self) -> None:
        if not self.writable:  # a read's statements each commit alone: a write there would be unatomic
            raise persistence_failed("invariant_broken")

    async def insert(self, binding: Binding, record: Any) -> Any:
        self._require_writable()
        return await super().insert(binding, record)

    async def insert_many(self, binding: Binding, records: Sequence[Any]) -> list[Any]:
        if len(records) < 2:
            return await super().insert_many(binding, records)
        self._require_writable()
        write = self.codec(binding).write
        rows = await self._fetch_many(self.statements(binding).insert, [write(record) for record in records])
        if len(rows) != len(records):  # every INSERT ... RETURNING answers one row, or fails
            raise persistence_failed("write_not_applied")
        read = self.codec(binding).read
        return [read(row, 0) for row in rows]

    async def update_many(self, binding: Binding, pairs: Sequence[tuple[Any, Any]], *, read_back: bool) -> list[Any]:
        if not pairs:
            return []
        self._require_writable()
        statements = self.statements(binding)
        key = binding.key_field
        keys = [getattr(new, key) for _, new in pairs]
        parameters = [self.write_parameters(binding, old, new) for old, new in pairs]
        if len(pairs) == 1:
            rows = await self._fetch(statements.update, parameters[0])
        else:  # every UPDATE of the batch in one pipelined round trip
            rows = await self._fetch_many(statements.update, parameters)
        if read_back:
            # A separate statement sees what AFTER triggers did; RETURNING does not. A
            # compare-and-set that missed shows as a row that does not read back as written.
            if len(rows) != len(keys):
                raise persistence_failed("row_changed")
            written = {getattr(r, key): r for r in await self.read(binding, keys)}
            if set(written) != set(keys):
                raise persistence_failed("read_back_mismatch")
        else:
            read = self.codec(binding).read
            written = {getattr(record, key): record for record in (read(row, 0) for row in rows)}
            if set(written) != set(keys):
                raise persistence_failed("row_changed")  # a compare-and-set found its row changed
        return [written[k] for k in keys]

    async def write_across(self, parts: Sequence[tuple[Binding, Any, Any]]) -> list[Any]:
        bindings = tuple(binding for binding, _, _ in parts)
        if len(parts) < 2 or len(set(bindings)) != len(bindings):
            return await super().write_across(parts)
        self._require_writable()
        shape = tuple((binding, old is None) for binding, old, _ in parts)
        row = (await self._fetch(statements.write_across_sql(shape, self.schema), self._part_parameters(parts)))[0]
        return self._stored_parts(bindings, row, 0)

    async def delete_keys(self, binding: Binding, keys: Sequence[str]) -> int:
        self._require_writable()
        return await super().delete_keys(binding, keys)

    async def delete(self, binding: Binding, old: Any) -> bool:
        self._require_writable()
        return bool(await self._fetch(self.statements(binding).delete, self.compare_parameters(binding, old)))

    async def lock_name(self, name: str) -> None:
        self._require_writable()
        # A 64-bit hash of the name: two names sharing one only serialize more than needed.
        await self.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", [name])

    def announce(self, binding: Binding) -> None:
        self.announcements.add(announce_channel(self.schema, binding.spec.name))


class PostgresStore:
    """A PostgreSQL database holding the queue tables, reached through a small pool.

    ``timeout_seconds`` bounds every call (see the module docstring). After
    :meth:`close`, every transaction is refused with ``ConfigValidationError``
    (``source_closed``); closing again does nothing.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        pool_size: int = POOL_SIZE,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        pooler: Pooler | None = None,
    ) -> None:
        self._dsn = dsn
        self.schema = schema
        """The schema holding the queue tables (None: the connection's current schema)."""
        self.pooler = pooler
        """The pooler the URL names (see :class:`~tenure.adapters.core.urls.Pooler`)."""
        self._pool_size = pool_size
        self._timeout_seconds = timeout_seconds
        self._pool: Connections | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        self.observe_time: TimeObserver | None = None
        self.uuid_columns: frozenset[tuple[str, str]] = frozenset()
        """(table, column) of every genuine uuid column in the schema (read at first use):
        keys stored there are canonicalized by the database and read back as text."""
        self.column_types: dict[str, tuple[tuple[str, str], ...]] = {}
        """Each table's columns with their PostgreSQL type names (read at first use)."""
        self.versioned_tables: frozenset[str] = frozenset()
        """Tables with their row version (migrated through versions_v1), read at open."""
        self._seen_whole: dict[tuple[str, tuple[str, ...]], bool] = {}
        """Whether each table was seen with every column a binding names (by table and columns)."""
        self._ahead_texts: dict[tuple[Any, ...], _AheadText] = {}
        """:meth:`write_ahead`'s statements by shape (see :class:`_AheadText`)."""
        self._rewrite_sets: dict[tuple[int, int], tuple[Binding, Rewrite, dict[str, Any]]] = {}
        """:meth:`_rewrite_values`'s parameters, by the identities of binding and rewrite."""
        self._claim_texts: dict[tuple[Any, ...], tuple[tuple[Any, ...], statements.ClaimText]] = {}
        """The claim statements, per shape by identity (:meth:`_claim_text`)."""
        self._clock: tuple[int, float] | None = None
        """The last database time read, with this process's monotonic time then."""
        self.ahead = self

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self._timeout_seconds

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise ConfigValidationError("source_closed", fields=("source",), problems=("closed",))

    async def _open(self, deadline: float) -> Connections:
        if self._pool is not None:
            return self._pool
        await call(self._opening.acquire, deadline, Stage.CONNECT)
        try:
            if self._pool is None:
                pool = Connections(self._dsn, self._pool_size, pooler=self.pooler)
                try:
                    connection = await pool.take(deadline)
                    try:
                        rows = await call(lambda: connection.fetch(
                            "SELECT table_name, column_name, udt_name FROM information_schema.columns"
                            " WHERE table_schema = coalesce($1, current_schema()) ORDER BY table_name, ordinal_position",
                            self.schema,
                        ), deadline, Stage.CONNECT)
                    except BaseException:
                        pool.give_back(connection, clean=False)
                        raise
                    pool.give_back(connection, clean=True)
                except BaseException:
                    await pool.close(self._deadline())
                    raise
                self.uuid_columns = frozenset((table, column) for table, column, kind in rows if kind == "uuid")
                types: dict[str, list[tuple[str, str]]] = {}
                for table, column, kind in rows:
                    types.setdefault(table, []).append((column, kind))
                self.column_types = {table: tuple(columns) for table, columns in types.items()}
                self.versioned_tables = frozenset(table for table, column, _ in rows if column == ROW_VERSION)
                self._pool = pool
        finally:
            self._opening.release()
        assert self._pool is not None
        return self._pool

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[PostgresTransaction]:
        self._refuse_if_closed()
        deadline = self._deadline()
        pool = await self._open(deadline)
        connection = await pool.take(deadline)
        clean = False  # the connection is reused only if its transaction ended cleanly
        if not write:
            # A read needs no BEGIN and COMMIT: under READ COMMITTED each statement of a
            # transaction sees its own snapshot anyway, exactly as an autocommit statement
            # does (a consistent read is one statement: see with_clock, snapshot_sql). Two
            # round trips fewer; a row lock a read takes lasts for its statement, and a
            # write refuses (``invariant_broken``).
            try:
                reader = PostgresTransaction(self, connection, deadline, writable=False)
                yield reader
                clean = not reader.broken
            except BaseException:
                clean = not reader.broken and not connection.is_in_transaction()
                raise
            finally:
                pool.give_back(connection, clean=clean)
            return
        try:
            transaction = PostgresTransaction(self, connection, deadline)
            await transaction.call(lambda c: c.execute("BEGIN"))
            try:
                yield transaction
            except BaseException:
                clean = not transaction.broken and await rollback(connection, deadline)
                raise
            await self._commit(transaction)
            clean = True
        finally:
            pool.give_back(connection, clean=clean)

    @asynccontextmanager
    async def borrowed(self, connection: Any, *, restore: Callable[[], Awaitable[None]] | None = None,
                       ) -> AsyncIterator[PostgresTransaction]:
        """See :meth:`tenure.adapters.core.store.Store.borrowed`.

        tenure's statements read instants as integer microseconds and JSON as its text:
        for the call, the connection gets tenure's codecs for ``timestamptz``, ``json``
        and ``jsonb``; afterwards ``restore`` runs (a SQLAlchemy connection's own codec
        setup), else asyncpg's default codecs for those three types are put back (a
        connection that had its own codecs for them must set them again)."""
        self._refuse_if_closed()
        if not isinstance(connection, asyncpg.Connection):
            raise ConfigValidationError("invalid_using", fields=("using",), problems=("asyncpg_connection_required",))
        if not connection.is_in_transaction():
            raise ConfigValidationError("invalid_using", fields=("using",), problems=("open_transaction_required",))
        transaction = PostgresTransaction(self, connection, self._deadline())
        # tenure's statements carry instants as integer microseconds (its pool sets that
        # codec on every connection it opens); on the caller's connection it holds for
        # this call only, and asyncpg's own timestamptz codec is back when it returns.
        try:
            await transaction.call(count_instants_in_microseconds, Stage.CONNECT)
            for kind in ("json", "jsonb"):
                await transaction.call(lambda c, kind=kind: c.reset_type_codec(kind, schema="pg_catalog"),  # type: ignore[misc]
                                       Stage.CONNECT)
            yield transaction
            if transaction.announcements:
                notify = "".join(f"SELECT pg_notify({statements.literal(channel)}, ''); "
                                 for channel in sorted(transaction.announcements))
                await transaction.call(lambda c: c.execute(notify))
        finally:
            if not connection.is_closed():
                for kind in ("timestamptz", "json", "jsonb"):
                    await transaction.call(lambda c, kind=kind: c.reset_type_codec(kind, schema="pg_catalog"),  # type: ignore[misc]
                                           Stage.CONNECT)
                if restore is not None:
                    await transaction.call(lambda _: restore(), Stage.CONNECT)

    async def listen(self, binding: Binding, wake: Callable[[], None]) -> Listener | None:
        """A dedicated connection that calls ``wake`` on every notification of
        ``binding``'s channel (:func:`~tenure.adapters.core.tables.announce_channel`).
        Connecting and LISTEN run under the store's timeout; failures raise
        ``QUEUE_PERSISTENCE_FAILED`` like any call. ``wake`` is also called when the
        connection is lost (see :class:`~tenure.adapters.postgres.connections.Listener`).

        None under ``pooler=transaction``: a pooler in transaction mode would accept the
        LISTEN on whichever server connection ran it and then deliver nothing to this
        client, so nothing listens and workers poll (backing off up to their ``idle_wait_s``).
        Notifications are still sent with each commit, for listeners connected directly."""
        self._refuse_if_closed()
        if self.pooler is Pooler.TRANSACTION:
            return None
        deadline = self._deadline()
        connection = await call(lambda: connect(self._dsn, self.pooler), deadline, Stage.CONNECT)

        def heard(*_: object) -> None:
            wake()

        channel = announce_channel(self.schema, binding.spec.name)
        try:
            await call(lambda: connection.add_listener(channel, heard), deadline, Stage.STATEMENT)
        except BaseException:
            connection.terminate()
            raise
        return Listener(connection, channel, wake, self._timeout_seconds)

    def saw_clock(self, now_us: int) -> None:
        self._clock = (now_us, time.monotonic())

    def estimated_now_us(self) -> int | None:
        if self._clock is None:
            return None
        seen, at = self._clock
        return seen + round((time.monotonic() - at) * 1_000_000)

    async def _one_statement(self, binding: Binding) -> tuple[Connections, float, tuple[tuple[str, str], ...]] | None:
        """What a one-statement call needs: the pool, the call's deadline and the table's
        column types; None when the table was not (or not yet) seen whole (the caller
        takes the transaction path; nothing was sent)."""
        self._refuse_if_closed()
        deadline = self._deadline()
        pool = await self._open(deadline)
        types = self.column_types.get(binding.spec.name, ())
        shape = (binding.spec.name, binding.spec.column_names)
        whole = self._seen_whole.get(shape)
        if whole is None:  # once per table and columns: the types are read once, when the pool opens
            whole = self._seen_whole[shape] = set(binding.spec.column_names) <= {c for c, _ in types}
        if not whole:
            return None
        return pool, deadline, types

    async def write_ahead(
        self, binding: Binding, finder: Finder, items: Sequence[Expected], not_before_us: int, not_after_us: int,
        *, announce: bool = False,
    ) -> AheadAnswer | None:
        """One autocommit statement that locks, reads the clock after the locks, checks
        every item's expected row and the window, and writes all or nothing (see
        :func:`.statements.ahead_sql` and :class:`tenure.adapters.core.store.AheadWriter`)."""
        opened = await self._one_statement(binding)
        if opened is None:
            return None
        pool, deadline, types = opened
        keys = [item.key for item in items]
        base = self._ahead_text(binding, finder, types, keys, None, announce)
        codec, versioned = base.codec, base.versioned
        by_version = statements.ahead_version_parameters(binding, codec, items[0]) if (
            versioned and len(items) == 1) else None
        parameters: dict[str, Any] | None
        if by_version is not None:
            changed, parameters = by_version
            text = self._ahead_text(binding, finder, types, keys, changed, announce)
        elif len(items) == 1:
            text, parameters = base, statements.ahead_one_parameters(binding, codec, items[0])
        else:
            text, parameters = base, statements.ahead_parameters(binding, codec, items)
        if parameters is None:
            return None
        if announce:
            parameters["channel"] = text.channel
        parameters.update(text.compiled.parameters({"keys": keys}))
        parameters["not_before"], parameters["not_after"] = not_before_us, not_after_us
        rows = await self._fetch_once(pool, deadline, text.statement.sql, text.statement.arguments(parameters))
        return self._answer(binding, codec, rows, versioned)

    def _ahead_text(
        self, binding: Binding, finder: Finder, types: tuple[tuple[str, str], ...], keys: Sequence[str],
        changed: tuple[str, ...] | None, announce: bool,
    ) -> _AheadText:
        """The statement :meth:`write_ahead` sends for this shape: one item (its key looked
        up as an equality, the plan PostgreSQL caches: issue 51) or several; written by
        row version (``changed``: the columns it writes) or compared column by column.
        Built once per shape and kept by the identity of the binding and finder (hashing
        them, as the builders' own caches do, costs a heartbeat several dataclass hashes);
        the entry keeps them, so an identity is never reused for another while it is kept."""
        key = (id(binding), id(finder), len(keys) == 1, changed, announce)
        found = self._ahead_texts.get(key)
        if found is not None and found.binding is binding and found.finder is finder:
            return found
        versioned = binding.spec.name in self.versioned_tables
        one = statements.single(finder, {"keys": keys})  # the same for every list of as many keys
        locking = statements.keyed_sql(binding, finder, self.schema, types, versioned=versioned, one=one)
        if changed is not None:
            sql = statements.ahead_version_sql(binding, self.schema, locking, types, changed, announce)
        elif len(keys) == 1:
            sql = statements.ahead_one_sql(binding, self.schema, locking, types, announce, versioned)
        else:
            sql = statements.ahead_sql(binding, self.schema, locking, types, announce, versioned)
        if len(self._ahead_texts) >= _AHEAD_TEXTS_KEPT:
            self._ahead_texts.clear()  # bindings built per call would otherwise grow it forever
        made = self._ahead_texts[key] = _AheadText(
            binding, finder, versioned, self.codec(binding),
            compile_finder(binding, finder, POSTGRESQL, self.schema, versioned=versioned), numbered(sql),
            announce_channel(self.schema, binding.spec.name) if announce else None,
        )
        return made

    async def insert_ahead(
        self, binding: Binding, finder: Finder, finder_parameters: Mapping[str, Any], record: Any,
        relative: Mapping[str, int], not_before_us: int, not_after_us: int, *, announce: bool = False,
    ) -> AheadAnswer | None:
        """One autocommit statement that locks the rows ``finder`` selects, reads the
        clock after the locks, and inserts ``record`` (its ``relative`` fields at that
        clock plus their offsets) only if the finder met no row and the clock lies in the
        window. ``locked`` holds the rows met otherwise. None: this store cannot spell it
        for the table (nothing was sent)."""
        opened = await self._one_statement(binding)
        if opened is None or (binding.spec.name, binding.key_column) in self.uuid_columns:
            return None  # keys the database canonicalizes: the transaction path
        pool, deadline, types = opened
        codec = self.codec(binding)
        versioned = binding.spec.name in self.versioned_tables
        compiled = compile_finder(binding, finder, POSTGRESQL, self.schema, versioned=versioned)
        parameters = dict(compiled.parameters(finder_parameters))
        relative_columns = {binding.column_of(field).name: offset for field, offset in relative.items()}
        for column, value in codec.write(record).items():
            parameters[f"v_{column}"] = value
        for column in binding.spec.instant_names:
            parameters[f"rel_{column}"] = relative_columns.get(column)
        parameters["not_before"], parameters["not_after"] = not_before_us, not_after_us
        if announce:
            parameters["channel"] = announce_channel(self.schema, binding.spec.name)
        locking = statements.keyed_sql(binding, finder, self.schema, types, versioned=versioned,
                                       one=statements.single(finder, finder_parameters))
        statement = numbered(statements.insert_sql(binding, self.schema, locking, types, announce, versioned))
        arguments = statement.arguments(parameters)
        rows = await self._fetch_once(pool, deadline, statement.sql, arguments)
        return self._answer(binding, codec, rows, versioned)

    async def joined_ahead(
        self, binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], items: Sequence[Expected],
        not_before_us: int, not_after_us: int, *, guards: Sequence[Guard] = (),
        deletes: Sequence[tuple[Binding, Sequence[str]]] = (), beside: Beside | None = None,
    ) -> JoinedAnswer | None:
        """See :meth:`tenure.adapters.core.store.AheadWriter.joined_ahead` (the statement:
        :func:`.statements.joined_ahead_sql`)."""
        opened = await self._one_statement(binding)
        sides = (binding, other) if beside is None else (binding, other, beside.binding)
        if opened is None or any(not set(side.spec.column_names) <= {c for c, _ in self.column_types.get(side.spec.name, ())}
                                 or (side.spec.name, side.key_column) in self.uuid_columns for side in sides):
            return None  # a table not seen whole, or keys the database canonicalizes: the transaction path
        other_types = self.column_types[other.spec.name]
        pool, deadline, types = opened
        mine, its = items
        parameters: dict[str, Any] = {}
        for side, item, prefix in ((binding, mine, "a_"), (other, its, "b_")):
            bound = statements.joined_ahead_parameters(side, self.codec(side), item, prefix)
            if bound is None:
                return None
            parameters.update(bound)
        parameters["keys"] = POSTGRESQL.list_parameter([mine.key])
        parameters["b_key"] = its.key
        parameters["not_before"], parameters["not_after"] = not_before_us, not_after_us
        columns: tuple[str, ...] = ()
        if guards:
            compiled = counts_sql(tuple((table, finder, limit) for (table, finder, _, limit), _ in guards), POSTGRESQL,
                                  self.schema)
            columns = compiled.columns
            parameters.update(compiled.parameters([count[2] for count, _ in guards]))
            parameters.update((f"g{index}", value) for index, (_, value) in enumerate(guards))
        for index, (_, keys) in enumerate(deletes):
            parameters[f"d{index}_keys"] = POSTGRESQL.list_parameter(list(keys))
        third = None if beside is None else self._beside(beside, parameters)
        statement = numbered(statements.joined_ahead_sql(binding, other, on, self.schema, types, other_types, columns,
                                                         tuple(table for table, _ in deletes), third))
        rows = await self._fetch_once(pool, deadline, statement.sql, statement.arguments(parameters))
        now, went = rows[0][0], bool(rows[0][1])
        self.saw_clock(now)
        theirs = 4 + len(binding.spec.columns)
        after = theirs + len(other.spec.columns)
        counted_at = after + (1 + len(guards) if guards else 0)
        if went and (rows[0][2] != int(mine.new is not None) or rows[0][3] != int(its.new is not None)
                     or (beside is not None and rows[0][counted_at] != 1)):
            raise persistence_failed("read_back_mismatch")  # a verified write that wrote no row: never expected
        current, counted = (bool(rows[0][after]), [int(value) for value in rows[0][after + 1:counted_at]]) \
            if guards else (True, [])
        if went:
            return JoinedAnswer(now, True, [], counted=counted, current=current)
        mine_at = 4 + binding.key_index
        read, read_other = self.codec(binding).read, self.codec(other).read
        joined = [(read(row, 4), None if row[theirs + other.key_index] is None else read_other(row, theirs))
                  for row in rows if row[mine_at] is not None]
        return JoinedAnswer(now, False, joined, counted=counted, current=current)

    def _beside(self, beside: Beside, parameters: dict[str, Any]) -> tuple[Binding, str, tuple[tuple[str, str], ...], bool]:
        """:func:`.statements.joined_ahead_sql`'s ``beside`` for a row inserted beside a
        joined pair, binding its parameters (its finder's under ``f_``, its values and
        offsets under ``c_``) into ``parameters``."""
        binding = beside.binding
        compiled = compile_finder(binding, beside.finder, POSTGRESQL, self.schema)
        for name, value in compiled.parameters(beside.parameters).items():
            parameters[f"f_{name}"] = value
        moving = {binding.column_of(field).name: offset for field, offset in beside.relative.items()}
        for column, value in self.codec(binding).write(beside.record).items():
            parameters[f"c_v_{column}"] = value
        for column in binding.spec.instant_names:
            parameters[f"c_rel_{column}"] = moving.get(column)
        if beside.announce:
            parameters["channel"] = announce_channel(self.schema, binding.spec.name)
        locking = statements.prefixed(compiled.sql, "f_")
        return binding, locking, self.column_types[binding.spec.name], beside.announce

    def same_database(self, other: object) -> bool:
        """See :meth:`tenure.adapters.core.store.AheadWriter.same_database`: the same
        connection string and schema."""
        return isinstance(other, PostgresStore) and (other._dsn, other.schema) == (self._dsn, self.schema)

    async def joined_insert_ahead(
        self, binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], rows: Sequence[Any],
        relative: Sequence[Mapping[str, int]], holder: tuple[str, Any] | None, not_before_us: int, not_after_us: int,
    ) -> JoinedAnswer | None:
        """See :meth:`tenure.adapters.core.store.AheadWriter.joined_insert_ahead` (the
        statement: :func:`.statements.joined_insert_sql`)."""
        opened = await self._one_statement(binding)
        other_types = self.column_types.get(other.spec.name, ())
        if opened is None or not set(other.spec.column_names) <= {column for column, _ in other_types} or any(
                (side.spec.name, side.key_column) in self.uuid_columns for side in (binding, other)):
            return None  # a table not seen whole, or keys the database canonicalizes: the transaction path
        pool, deadline, types = opened
        parameters: dict[str, Any] = {}
        for side, record, moving, prefix in ((binding, rows[0], relative[0], "a_"), (other, rows[1], relative[1], "b_")):
            for column, value in self.codec(side).write(record).items():
                parameters[f"{prefix}v_{column}"] = value
            moving_columns = {side.column_of(field).name: offset for field, offset in moving.items()}
            for column in side.spec.instant_names:
                parameters[f"{prefix}rel_{column}"] = moving_columns.get(column)
        holder_column = None if holder is None else binding.column_of(holder[0]).name
        parameters["holder"] = None if holder is None else holder[1]
        parameters["keys"] = POSTGRESQL.list_parameter([getattr(rows[0], binding.key_field)])
        parameters["not_before"], parameters["not_after"] = not_before_us, not_after_us
        statement = numbered(statements.joined_insert_sql(binding, other, on, self.schema, types, other_types,
                                                          holder_column))
        answered = await self._fetch_once(pool, deadline, statement.sql, statement.arguments(parameters))
        now, went = answered[0][0], bool(answered[0][1])
        self.saw_clock(now)
        if went:
            return JoinedAnswer(now, True, [], collided=answered[0][2] == 0)
        mine_at, theirs = 4 + binding.key_index, 4 + len(binding.spec.columns)
        read, read_other = self.codec(binding).read, self.codec(other).read
        joined = [(read(row, 4), None if row[theirs + other.key_index] is None else read_other(row, theirs))
                  for row in answered if row[mine_at] is not None]
        return JoinedAnswer(now, False, joined)

    async def claim_ahead(
        self, binding: Binding, pick: Probe, check: Finder, blockers: Sequence[Probe], rewrite: Rewrite,
        commands: Sequence[Any], check_parameters: Mapping[str, Any] | None = None,
    ) -> Picked | None:
        """See :meth:`tenure.adapters.core.store.AheadWriter.claim_ahead` (the statement:
        :func:`.statements.pick_sql`)."""
        opened = await self._one_statement(binding)
        if opened is None:
            return None
        pool, deadline, types = opened
        parameters: dict[str, Any] = {}
        text = self._claim_text(binding, pick, check, blockers, rewrite, types)
        statements.bind_claim(text, pick, blockers, check_parameters or {}, parameters)
        for attribute, _ in text.attributes:
            parameters[f"a_{attribute}"] = [getattr(command, attribute) for command in commands]
        parameters.update(self._rewrite_values(binding, rewrite))
        statement = text.statement
        rows = await self._fetch_once(pool, deadline, statement.sql, statement.arguments(parameters))
        now, went = rows[0][0], bool(rows[0][1])
        width = len(binding.spec.columns)
        codec, key_index = self.codec(binding), binding.key_index
        # A row tenure cannot read comes back as an Unreadable in its place, picked and
        # written alike: the claim sets it aside instead of failing for it.
        picked = [record_or_unreadable(codec, key_index, row, 3) for row in rows if row[2] is not None]
        at = 3 + width + binding.key_index
        written_rows = [row for row in rows if row[2] is not None and row[at] is not None]
        written = [record_or_unreadable(codec, key_index, row, 3 + width) for row in written_rows]
        versioned = binding.spec.name in self.versioned_tables
        versions = {str(row[at]): row[3 + 2 * width] for row in written_rows} if versioned else {}
        if went:
            self.saw_clock(now)
        return Picked(now, went, picked, written, versions)

    def _claim_text(self, binding: Binding, pick: Probe, check: Finder, blockers: Sequence[Probe], rewrite: Rewrite,
                    types: tuple[tuple[str, str], ...]) -> statements.ClaimText:
        """The claim's statement for this shape (:func:`.statements.claim_text`), kept by
        the identities of what it is built from (hashing the shape, finders and rewrite
        cost a claim some twenty calls: issue 51); only whether each probe's list
        parameters hold one value is asked per call. The entry keeps those objects, so an
        identity is never reused for another while it is kept."""
        blocker_key: list[tuple[int, str, bool, bool]] = []
        for blocker in blockers:
            blocker_key.append((id(blocker.finder), blocker.kind, blocker.limit is not None,
                                statements.single(blocker.finder, blocker.parameters)))
        pick_one = statements.single(pick.finder, pick.parameters)
        key = (id(binding), id(pick.finder), pick.kind, pick.limit is not None, pick_one, id(check), id(rewrite),
               id(types), tuple(blocker_key))
        found = self._claim_texts.get(key)
        if found is not None:
            return found[1]
        text = statements.claim_text(
            binding, self.schema, (pick.finder, pick.kind, pick.limit is not None, pick_one), check,
            tuple((blocker.finder, kind, limited, one) for blocker, (_, kind, limited, one) in zip(blockers, blocker_key)),
            rewrite, types)
        if len(self._claim_texts) >= _AHEAD_TEXTS_KEPT:
            self._claim_texts.clear()
        self._claim_texts[key] = ((binding, pick.finder, check, rewrite, types, *(b.finder for b in blockers)), text)
        return text

    def _rewrite_values(self, binding: Binding, rewrite: Rewrite) -> dict[str, Any]:
        """The ``set_<column>`` parameters of a claim's fixed changes (the stored value of
        each :class:`SetValue`), built once per binding and rewrite (kept by identity, as
        :meth:`_ahead_text` keeps its statements)."""
        key = (id(binding), id(rewrite))
        found = self._rewrite_sets.get(key)
        if found is not None and found[0] is binding and found[1] is rewrite:
            return found[2]
        values: dict[str, Any] = {}
        for field, change in rewrite.changes:
            if isinstance(change, SetValue) and field not in binding.constants:
                column = binding.column_of(field)
                values[f"set_{column.name}"] = POSTGRESQL_DIALECT.value_writer(column)(change.value)
        if len(self._rewrite_sets) >= _AHEAD_TEXTS_KEPT:
            self._rewrite_sets.clear()
        self._rewrite_sets[key] = (binding, rewrite, values)
        return values

    async def _fetch_once(self, pool: Connections, deadline: float, sql: str, arguments: list[Any]) -> list[Any]:
        connection = await pool.take(deadline)
        clean = False
        try:
            rows = await fetch_once(connection, sql, arguments, deadline)
            clean = True
        finally:
            pool.give_back(connection, clean=clean)
        return list(rows)

    def _answer(self, binding: Binding, codec: RowCodec, rows: Sequence[Any], versioned: bool) -> AheadAnswer:
        """A decided-ahead statement's rows: (clock, went, row as locked [its version],
        split, key as written [its version], verified)."""
        width = len(binding.spec.columns) + versioned
        now, went = rows[0][0], bool(rows[0][1])
        self.saw_clock(now)
        at, split = 2 + binding.key_index, 3 + width
        locked: dict[str, Any] = {}
        written: set[str] = set()
        versions: dict[str, int] = {}
        for row in rows:  # a plain loop: the one or few rows of a call pay no generator each
            if row[at] is not None:
                locked[str(row[at])] = codec.read(row, 2)
                if versioned:
                    versions[str(row[at])] = row[1 + width]
            if row[split] is not None:
                written.add(str(row[split]))
        if versioned:  # the versions written last: they are the rows' versions now
            for row in rows:
                if row[split] is not None:
                    versions[str(row[split])] = row[4 + width]
        return AheadAnswer(now, went, locked, frozenset(written), versions)

    def codec(self, binding: Binding) -> RowCodec:
        return binding.codec(POSTGRESQL_DIALECT, key_as_text=(binding.spec.name, binding.key_column) in self.uuid_columns)

    async def run(self, body: Body[T], *, write: bool) -> T:
        """``body`` in one transaction: BEGIN, its statements, COMMIT."""
        async with self.transaction(write=write) as transaction:
            return await body(transaction)

    @staticmethod
    async def _commit(transaction: PostgresTransaction) -> None:
        """COMMIT. Once it is sent, a failure (or the deadline) is an uncertain
        acknowledgement: the caller must recover by replay or claim recovery, never by
        assuming nothing was written. A deadline that passed before COMMIT was sent is a
        plain ``timeout``: the connection is dropped and the server rolls back."""
        if asyncio.get_running_loop().time() >= transaction._deadline:
            transaction.broken = True
            raise persistence_failed("timeout")
        # Notifications travel with the COMMIT in one simple-protocol round trip; the
        # server delivers them only if the transaction commits.
        notify = "".join(f"SELECT pg_notify({statements.literal(channel)}, ''); " for channel in sorted(transaction.announcements))
        status = await transaction.call(lambda c: c.execute(notify + "COMMIT"), Stage.COMMIT)
        if status != "COMMIT":  # the server rolled the transaction back instead
            transaction.broken = True
            raise persistence_failed("unavailable")

    async def close(self) -> None:
        """Close every idle connection; calls still running end on their own connection,
        which is then terminated. Final: later calls raise ``source_closed``."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close(self._deadline())
