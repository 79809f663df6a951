"""What the engine needs from a database: neutral primitives over any machine's table.

A store opens transactions. A transaction reads the database clock once: after the row
locks of :meth:`Transaction.locked` (so a lock wait that outlasts a lease cannot
authorize a stale write), or first, for a :meth:`Transaction.snapshot` whose probes never
wait. It writes records with compare-and-set statements whose result is read back.
Every database failure surfaces as ``TenureError(..._PERSISTENCE_FAILED, reason)`` with
an authored reason (see :mod:`tenure.adapters.core.failures`); driver text never travels
further than the store. A closed store refuses every further transaction; closing it
again does nothing.

Rows are found by kernel :class:`~tenure.kernel.core.Finder` values compiled by
:mod:`tenure.adapters.core.sql`; a :class:`~tenure.adapters.core.tables.Binding` says which table
and codec. Several steps are combined into one statement where a database allows it
(the row locks and the clock; the probes of a snapshot), because round trips are what
an owned operation costs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Protocol, TypeVar

from tenure.kernel.core import Finder, Rewrite

from .failures import persistence_failed
from .sql import (
    Capabilities,
    CompiledCounts,
    CompiledFinder,
    TableStatements,
    compile_finder,
    counts_sql,
    joined_read_sql,
    delete_unreadable_statement,
    set_aside_statement,
    statements_for,
)
from .tables import Binding, Dialect, RowCodec, record_or_unreadable

__all__ = [
    "Store", "Transaction", "Body", "Probe", "SharedPrimitives", "persistence_failed", "TimeObserver",
    "Expected", "AheadAnswer", "AheadWriter", "Picked", "JoinedAnswer", "Count", "Guard", "Beside",
]

T = TypeVar("T")

Count = tuple[Binding, Finder, Mapping[str, Any], int | None]
"""How many rows a non-waiting finder selects: ``(binding, finder, parameters, limit)``."""

Guard = tuple[Count, int]
"""A count a write is made on, and the value it was read with: the write goes only while
the count still has that value (see :meth:`Transaction.write_guarded`)."""

TimeObserver = Callable[[int], None]
"""Called with the database time each transaction read (tracing, conformance tests)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Probe:
    """One question of a snapshot: the rows a finder selects (``rows``; at most one per
    snapshot, last; a row tenure cannot read answers as an
    :class:`~tenure.adapters.core.tables.Unreadable` in its place), whether any exists
    (``exists``), or one field of each (``values``). The parameter ``now`` is the
    snapshot's clock."""

    finder: Finder
    parameters: Mapping[str, Any]
    kind: str = "rows"
    limit: int | None = None
    field: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Expected:
    """One item of a decided-ahead statement (see :class:`AheadWriter`): the row the
    kernel decided on (``record``; None: no row), the row to write instead (``new``; None:
    nothing to write) with the fields that move with the time (``relative``: field ->
    offset from the write's database time). ``known`` False: nothing was decided, the
    statement only locks and reads this key (and so cannot go)."""

    key: str
    record: Any = None
    known: bool = True
    new: Any = None
    relative: Mapping[str, int] = dataclasses.field(default_factory=dict)
    version: int | None = None
    """The row version ``record`` was read or written with, when known: a store that keeps
    versions then proves the row unchanged by comparing it alone (see
    :data:`~tenure.adapters.core.tables.ROW_VERSION`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class AheadAnswer:
    """What a decided-ahead statement saw and did: the clock it read after its last row
    lock, whether it wrote (``went``: every item's row equalled its expected record and
    the clock lay in the window), the rows by key as locked (when it did not write) and
    the keys it wrote. A written row is not sent back: the statement verified every value
    it wrote against the intended one, so the row stored is the decided record."""

    now_us: int
    went: bool
    locked: Mapping[str, Any]
    written: frozenset[str]
    versions: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """The row version of each locked row (when nothing was written) or written row, by
    key, from a store that keeps versions."""


@dataclasses.dataclass(frozen=True, slots=True)
class Beside:
    """A row of a third table a joined decided-ahead statement inserts beside the pair it
    writes (:meth:`AheadWriter.joined_ahead`): ``record`` (its ``relative`` fields at the
    statement's clock plus their offsets), only where ``finder`` (a waiting finder, with
    ``parameters``: every row sharing an identity with it) meets no row. ``announce``:
    notify the table's channel when it is inserted."""

    binding: Binding
    finder: Finder
    parameters: Mapping[str, Any]
    record: Any
    relative: Mapping[str, int]
    announce: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class JoinedAnswer:
    """What a joined decided-ahead statement (:meth:`AheadWriter.joined_ahead`) saw and
    did: its clock (read after both rows' locks), whether it wrote, and, when it did
    not, the rows as locked (as :meth:`Transaction.locked_joined` answers them)."""

    now_us: int
    went: bool
    joined: list[tuple[Any, Any]]
    collided: bool = False
    """An insert that went found its rows taken meanwhile (a concurrent writer's, which
    the statement's snapshot could not see) and wrote nothing: the caller's transaction
    path decides on them."""
    counted: list[int] = dataclasses.field(default_factory=list)
    """The counts a statement with guards read (in the order of its guards)."""
    current: bool = True
    """Whether those counts are current: the row the statement locked is the version its
    snapshot sees (False: a writer of that row committed after the statement began, and
    the counts may miss what it wrote beside the row)."""


class AheadWriter(Protocol):
    """A store that can persist decisions made ahead in one statement (PostgreSQL)."""

    def estimated_now_us(self) -> int | None:
        """The database time now, as estimated from the last clock read and this
        process's monotonic clock since (None before the first read). Only a reference
        for deciding ahead: the statement checks the real clock."""

    async def write_ahead(
        self, binding: Binding, finder: Finder, items: Sequence[Expected], not_before_us: int, not_after_us: int,
        *, announce: bool = False,
    ) -> AheadAnswer | None:
        """One autocommit statement: lock the rows ``finder`` selects for the items' keys,
        read the clock after the last lock, and write every ``new`` row (relative fields
        at that clock plus their offsets) only if every item's row equals its expected
        record and the clock lies in ``[not_before_us, not_after_us)``; all or nothing.
        The written rows are verified in the same statement (a BEFORE trigger that
        changed a value aborts it: ``read_back_mismatch``, nothing kept). A failure
        after the statement was sent is ``commit_unacknowledged``. None: this store
        cannot spell the statement for the table (not all its columns seen); nothing
        was sent."""


    async def insert_ahead(
        self, binding: Binding, finder: Finder, finder_parameters: Mapping[str, Any], record: Any,
        relative: Mapping[str, int], not_before_us: int, not_after_us: int, *, announce: bool = False,
    ) -> AheadAnswer | None:
        """One autocommit statement: lock the rows ``finder`` selects, read the clock
        after the locks, and insert ``record`` only if none was met and the clock lies in
        the window (verified in the same statement); the rows met otherwise come back
        in ``locked``. ``announce``: notify the table's channel when it inserts. None:
        nothing was sent (the caller uses a transaction)."""

    async def joined_ahead(
        self, binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], items: Sequence[Expected],
        not_before_us: int, not_after_us: int, *, guards: Sequence[Guard] = (),
        deletes: Sequence[tuple[Binding, Sequence[str]]] = (), beside: Beside | None = None,
    ) -> JoinedAnswer | None:
        """One autocommit statement for a row of ``binding`` and the one row of ``other``
        it meets (``on``, as :meth:`Transaction.locked_joined`; ``items``: the row of
        ``binding``, then the row of ``other``): lock both in that order, read the clock
        after both locks, and write each item's ``new`` (relative fields at that clock
        plus their offsets) only if exactly one row of ``other`` was met, with the second
        item's key, both rows equal their expected records in every column, and
        the clock lies in the window; both or neither. Written values are verified in
        the same statement. ``known`` False on the first item: it only locks and reads.
        ``guards``: counts the decision was made on, read after the locks, each of which
        must still have its value, in a snapshot that sees the row of ``binding`` it
        locked (the answer carries the counts and whether they were current); ``deletes``:
        rows of other tables deleted by key when the statement writes. ``beside``: a row
        of a third table inserted when the statement writes, and the statement writes
        only if the rows its finder locks (after the pair's, before the clock) are none;
        a row of it that appeared meanwhile (a writer the statement's snapshot cannot
        see) makes the statement keep nothing (``read_back_mismatch``): the pair is
        written exactly when the row is inserted. None: this store cannot spell it
        (nothing was sent)."""

    def same_database(self, other: object) -> bool:
        """Whether ``other`` (another store) reaches the same tables as this one (the same
        server, database and schema): one statement of this store may then write both
        stores' rows (:class:`Beside`). False when it cannot tell."""

    async def joined_insert_ahead(
        self, binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], rows: Sequence[Any],
        relative: Sequence[Mapping[str, int]], holder: tuple[str, Any] | None, not_before_us: int, not_after_us: int,
    ) -> JoinedAnswer | None:
        """One autocommit statement that inserts a row of ``binding`` and the row of
        ``other`` it meets (``rows``, each with the fields that move with the clock and
        their offsets) only if no row of ``binding`` has the first row's key (or, with
        ``holder``, a field and its value, holds that value), and the clock read after
        the locks lies in the window. The rows met otherwise come back in ``joined``
        (with the row of ``other`` each meets); rows inserted meanwhile by a writer the
        statement could not see make it write nothing (``collided``). None: nothing was
        sent."""

    async def claim_ahead(
        self, binding: Binding, pick: Probe, check: Finder, blockers: Sequence[Probe], rewrite: Rewrite,
        commands: Sequence[Any], check_parameters: Mapping[str, Any] | None = None,
    ) -> Picked | None:
        """One autocommit statement (a claim in one round trip): read the clock, pick rows
        (``pick``, a SKIP LOCKED finder, which never waits) and apply ``rewrite`` (the
        kernel's claim effect as data) to the ``i``-th picked row with the ``i``-th
        command, only if no blocker finds a row and every picked row satisfies ``check``
        (the claim rule's guard as a finder, with ``check_parameters``). Every column of every written row is
        verified in the same statement (the rewrite's value, or the value it was picked
        with): anything else aborts it (``read_back_mismatch``, nothing kept). Nothing
        is written when it does not go (``went`` False), and its clock then belongs to
        no decision. A failure after the statement was sent is
        ``commit_unacknowledged``. None: this store cannot spell the statement for the
        table (nothing was sent)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Picked:
    """What :meth:`AheadWriter.claim_ahead` saw and did: its clock, whether it wrote, the
    picked rows in pick order as they were, and as written (committed)."""

    now_us: int
    went: bool
    picked: list[Any]
    written: list[Any]
    versions: dict[str, int] = dataclasses.field(default_factory=dict)
    """The row version of each written row, by key (a store that keeps versions)."""


class Transaction(Protocol):
    """One database transaction."""

    async def now_us(self) -> int:
        """Database time, read once per transaction (after the locks taken so far)."""

    async def locked(self, binding: Binding, finder: Finder, parameters: Mapping[str, Any]) -> list[Any]:
        """The rows a waiting finder selects, locked; the clock is read after the locks."""

    async def snapshot(self, binding: Binding, probes: Sequence[Probe]) -> list[Any]:
        """Read the clock, then answer every probe (none of them waits for a lock)."""

    async def find(self, binding: Binding, finder: Finder, parameters: Mapping[str, Any], limit: int | None = None) -> list[Any]:
        """The rows a non-waiting finder selects (``skip`` locks what it can take)."""

    async def find_or_unreadable(self, binding: Binding, finder: Finder, parameters: Mapping[str, Any],
                                 limit: int | None = None) -> list[Any]:
        """:meth:`find`, where a row tenure cannot read (``corrupt_row``: a value of the
        wrong type or shape, text that is not UTF-8) comes back as an
        :class:`~tenure.adapters.core.tables.Unreadable` in its place instead of failing
        the read: what claims, lists and pages use, so one such row stops none of them."""

    async def read_or_unreadable(self, binding: Binding, keys: Sequence[str]) -> list[Any]:
        """:meth:`read`, where a row tenure cannot read comes back as an ``Unreadable``."""

    async def set_aside(self, binding: Binding, key: Any, rewrite: Rewrite, guard: Finder) -> bool:
        """Write ``rewrite`` (constants and the database time only) to the row whose
        stored key is ``key`` (an ``Unreadable``'s) while it matches ``guard``, without
        reading it: the one write made to a row tenure cannot read. True when it was
        written."""

    async def delete_unreadable(self, binding: Binding, key: Any, guard: Finder, parameters: Mapping[str, Any]) -> bool:
        """Delete the row whose stored key is ``key`` (an ``Unreadable``'s) while it
        matches ``guard`` with ``parameters``, without reading it: how retention removes a
        finished row tenure cannot read. True when it was deleted."""

    async def canonical_key(self, binding: Binding, key: str) -> str:
        """The key as the database spells it (canonical UUID text on a uuid column)."""

    async def insert(self, binding: Binding, record: Any) -> Any:
        """Insert and return the row as stored."""

    async def insert_many(self, binding: Binding, records: Sequence[Any]) -> list[Any]:
        """Insert each record and return the rows as stored, in order (one round trip
        where the driver can pipeline them)."""

    async def update_many(self, binding: Binding, pairs: Sequence[tuple[Any, Any]], *, read_back: bool) -> list[Any]:
        """Compare-and-set each ``(old, new)``: write ``new`` only where the row still
        equals ``old``. Returns the rows as stored, in order; raises ``row_changed`` when
        a row no longer matched. ``read_back`` reads them with a separate statement
        (which also sees what AFTER triggers did)."""

    async def write_across(self, parts: Sequence[tuple[Binding, Any, Any]]) -> list[Any]:
        """Write one row in each of several tables (``(binding, old, new)``, one per
        binding: ``old`` None inserts ``new``, otherwise compare-and-set): the rows as
        stored, in order. Raises ``row_changed`` when a row no longer matched (the
        caller's transaction then rolls back whatever else was written). One statement
        where the database allows it (a Run and its delivery)."""

    async def update_seen(self, binding: Binding, pairs: Sequence[tuple[Any, Any]]) -> list[Any] | None:
        """Compare-and-set each ``(old, new)`` where ``old`` is a row last seen rather than
        one read in this transaction: ``new`` is written only where the row still equals
        ``old`` in every column. Returns the rows as stored, in order; None when any row
        was not as seen, and then nothing was written (the caller reads the rows and
        decides again, in the same transaction)."""

    async def delete(self, binding: Binding, old: Any) -> bool:
        """Compare-and-set delete; False when the row no longer matched."""

    async def delete_keys(self, binding: Binding, keys: Sequence[str]) -> int:
        """Delete the rows with these keys whatever they hold, for a caller that holds a
        lock every writer of those rows takes first (a Run's checkpoint under its Run's
        lock); how many there were."""

    async def read(self, binding: Binding, keys: Sequence[str]) -> list[Any]:
        """The rows with these keys as they are (no lock, no clock)."""

    async def locked_joined(
        self, binding: Binding, keys: Sequence[str], other: Binding, on: tuple[tuple[str, str], ...],
    ) -> list[tuple[Any, Any]]:
        """:meth:`read_joined`, locked: the rows of ``binding`` with these keys first, then
        the rows of ``other`` they meet (the lock order), and the clock read after the
        last lock, in one statement where the database allows it (a Run and its current
        delivery in one round trip)."""

    async def count_each(self, queries: Sequence[tuple[Binding, Finder, Mapping[str, Any], int | None]]) -> list[int]:
        """How many rows each non-waiting ``(binding, finder, parameters, limit)`` selects
        (up to ``limit`` when given), as of one snapshot (one statement: no lock, no clock)."""

    async def locked_joined_counting(
        self, binding: Binding, keys: Sequence[str], other: Binding, on: tuple[tuple[str, str], ...],
        counts: Sequence[Count],
    ) -> tuple[list[tuple[Any, Any]], list[int]]:
        """:meth:`locked_joined` and :meth:`count_each` of ``counts`` together, in one
        statement where the database allows it (a Run's pair with the evidence counted
        beside it). The counts are as of that statement's snapshot, which on a database
        whose statement snapshot is taken before its lock waits (PostgreSQL) may miss rows
        a writer that held the lock committed meanwhile (:attr:`counts_current` False):
        a write made on them then verifies them (:meth:`write_guarded`)."""

    counts_current: ClassVar[bool]
    """Whether counts read after a lock see every write committed before that lock
    (SQLite: the transaction holds the database's write lock from its start); when
    True, :meth:`write_guarded` has nothing to verify."""

    async def write_guarded(
        self, parts: Sequence[tuple[Binding, Any, Any]], deletes: Sequence[tuple[Binding, Sequence[str]]],
        guards: Sequence[Guard],
    ) -> list[Any] | None:
        """:meth:`write_across` of ``parts`` and :meth:`delete_keys` of ``deletes`` (rows
        every writer of which holds a lock the caller holds), only while every guard's
        count still has its value: the rows as stored, in order, or None when a guard
        failed (then nothing was written; the caller reads the counts again and decides
        again). One statement where the database allows it (a Run's settle: the pair
        written, its checkpoint deleted, its evidence verified)."""

    async def read_joined(
        self, binding: Binding, keys: Sequence[str], other: Binding, on: tuple[tuple[str, str], ...],
    ) -> list[tuple[Any, Any]]:
        """The rows of ``binding`` with these keys, each with the row of ``other`` whose
        fields ``on[i][1]`` equal its fields ``on[i][0]`` (None when there is none; a row
        met by several appears once with each), as of one snapshot (one statement: no
        lock, no clock)."""

    async def lock_name(self, name: str) -> None:
        """Hold a lock on ``name`` (any text) until this transaction ends, waiting for
        another holder: what serializes decisions about rows that may not exist yet (an
        admission under an idempotency key, a session's fence). PostgreSQL: a
        transaction-level advisory lock; SQLite: a write transaction already holds the
        database's write lock."""

    def announce(self, binding: Binding) -> None:
        """Tell idle workers, when this transaction commits, that ``binding``'s table
        has new work (PostgreSQL: ``pg_notify`` sent with the COMMIT; a rolled-back
        transaction announces nothing). A store without notifications ignores it."""


Body = Callable[[Transaction], Awaitable[T]]
"""The work of one transaction: awaits only its transaction's methods."""


class Store(Protocol):
    """A database holding the machines' tables."""

    observe_time: TimeObserver | None

    def transaction(self, *, write: bool) -> AbstractAsyncContextManager[Transaction]:
        """A transaction; ``write`` ones take the database's write lock first."""

    async def run(self, body: Body[T], *, write: bool) -> T:
        """``body`` in one transaction (committed when it returns, rolled back when it
        raises). Operations run through here: a store may run the whole transaction in
        one step (SQLite runs it in its connection's thread, one hop for the lot)."""

    async def close(self) -> None: ...

    def borrowed(self, connection: Any) -> AbstractAsyncContextManager[Transaction]:
        """A transaction on the caller's own connection, inside the transaction the caller
        opened and will commit or roll back (tenure sends no BEGIN, COMMIT or ROLLBACK):
        what the body writes commits or rolls back with the caller's data. The connection
        must be this store's driver's (asyncpg, aiosqlite) and in a transaction
        (``ConfigValidationError`` ``invalid_using`` otherwise). Notifications are sent
        in that transaction, so they are delivered only if it commits."""

    async def listen(self, binding: Binding, wake: Callable[[], None]) -> Listener | None:
        """Call ``wake`` whenever a committed write announces new work on ``binding``'s
        table, until the returned listener is closed, and once when the listener loses
        its connection (then ``alive`` is False: the caller opens another one and looks
        for work announced meanwhile). None: this store has no notifications (SQLite:
        workers poll)."""

    @property
    def ahead(self) -> AheadWriter | None:
        """This store's decided-ahead writer, or None (SQLite: a transaction is already one
        hop there)."""


class Listener(Protocol):
    """An open subscription to a table's announcements (see :meth:`Store.listen`)."""

    @property
    def alive(self) -> bool:
        """False once its connection was lost: announcements are no longer heard."""

    async def close(self) -> None: ...


class SharedPrimitives:
    """The primitives every store runs the same way: the statement comes from the store's
    dialect (``capabilities``, and the store's schema) and runs through the store's
    ``_rows``; values go through the binding's codec for the store's ``dialect``.
    Only what truly differs (locking with the clock, snapshots, pipelined writes) stays
    in each store."""

    capabilities: ClassVar[Capabilities]
    dialect: ClassVar[Dialect]
    schema: str | None = None

    async def _rows(self, sql: str, parameters: Mapping[str, Any]) -> list[Any]:
        """One statement's rows, as the driver returns them (each store runs it its way)."""
        raise NotImplementedError

    async def _records(self, binding: Binding, sql: str, parameters: Mapping[str, Any]) -> list[Any]:
        read = self.codec(binding).read
        return [read(row, 0) for row in await self._rows(sql, parameters)]

    async def _rows_or_undecodable(self, sql: str, parameters: Mapping[str, Any]) -> list[Any]:
        """:meth:`_rows`, where a text value the driver cannot decode arrives as an
        :class:`~tenure.adapters.core.tables.UndecodableText` instead of failing the
        statement (a store whose database can hold such text overrides this)."""
        return await self._rows(sql, parameters)

    async def _records_or_unreadable(self, binding: Binding, sql: str, parameters: Mapping[str, Any]) -> list[Any]:
        codec, key_index = self.codec(binding), binding.key_index
        return [record_or_unreadable(codec, key_index, row) for row in await self._rows_or_undecodable(sql, parameters)]

    def codec(self, binding: Binding) -> RowCodec:
        return binding.codec(self.dialect)

    def statements(self, binding: Binding) -> TableStatements:
        return statements_for(binding, self.capabilities, self.schema)

    def compiled(self, binding: Binding, finder: Finder, *, limited: bool = False) -> CompiledFinder:
        return compile_finder(binding, finder, self.capabilities, self.schema, limited=limited)

    def compiled_counts(self, counts: Sequence[Count]) -> tuple[CompiledCounts, dict[str, Any]]:
        """``counts`` as one scalar subquery each (:func:`~tenure.adapters.core.sql.counts_sql`,
        built once per shape), with their parameters bound: the one way every store compiles
        a count, whether it runs the counts alone (:meth:`count_each`) or places them in
        another statement (a Run's pair locked with its evidence counted beside it, a write
        guarded by its counts)."""
        compiled = counts_sql(tuple((binding, finder, limit) for binding, finder, _, limit in counts),
                              self.capabilities, self.schema)
        return compiled, compiled.parameters([parameters for _, _, parameters, _ in counts])

    def compare_parameters(self, binding: Binding, old: Any, *, every_column: bool = False) -> dict[str, Any]:
        """``old_<column>`` for every column the compare-and-set compares (the mutable ones;
        ``every_column``: all, as ``update_seen`` compares), and ``old_key``."""
        codec = self.codec(binding)
        stored = codec.write(old)
        names = codec.spec.column_names if every_column else codec.spec.mutable_names
        compared = {f"old_{column}": stored[column] for column in names}
        compared["old_key"] = getattr(old, binding.key_field)
        return compared

    def write_parameters(self, binding: Binding, old: Any, new: Any) -> dict[str, Any]:
        return {**self.codec(binding).write(new), **self.compare_parameters(binding, old)}

    def as_stored(self, binding: Binding, row: Sequence[Any], written: Mapping[str, Any], new: Any) -> Any:
        """The record a write returned (``row``, every column in order): ``new`` itself
        when every stored value is exactly the value written for it (``written``, by
        column), so nothing needs decoding; otherwise the row decoded, which the caller
        compares with ``new`` (a trigger or a coercion changed a value)."""
        if tuple(row) == tuple(written.values()):
            return new
        return self.codec(binding).read(row, 0)

    async def write_across(self, parts: Sequence[tuple[Binding, Any, Any]]) -> list[Any]:
        stored: list[Any] = []
        for binding, old, new in parts:
            if old is None:
                stored.append(await self.insert(binding, new))
            else:
                stored.extend(await self.update_many(binding, [(old, new)], read_back=False))  # type: ignore[attr-defined]
        return stored

    async def update_seen(self, binding: Binding, pairs: Sequence[tuple[Any, Any]]) -> list[Any] | None:
        codec = self.codec(binding)
        statement = self.statements(binding).update_seen
        several = len(pairs) > 1
        if several:  # all or nothing: a later row not as seen undoes the earlier writes
            await self._rows("SAVEPOINT tenure_seen", {})
        stored: list[Any] = []
        for old, new in pairs:
            written = codec.write(new)
            rows = await self._rows(statement, {**written, **self.compare_parameters(binding, old, every_column=True)})
            if not rows:
                if several:
                    await self._rows("ROLLBACK TO SAVEPOINT tenure_seen", {})
                    await self._rows("RELEASE SAVEPOINT tenure_seen", {})
                return None
            stored.append(self.as_stored(binding, rows[0], written, new))
        if several:
            await self._rows("RELEASE SAVEPOINT tenure_seen", {})
        return stored

    def key_list(self, keys: Sequence[str]) -> Any:
        return self.capabilities.list_parameter(list(keys))

    async def find(self, binding: Binding, finder: Finder, parameters: Mapping[str, Any], limit: int | None = None) -> list[Any]:
        assert finder.lock != "wait", "a waiting finder runs through locked(), which reads the clock after"
        compiled = self.compiled(binding, finder, limited=limit is not None)
        values = dict(parameters) if limit is None else {**parameters, "limit": limit}
        return await self._records(binding, compiled.sql, compiled.parameters(values))

    async def find_or_unreadable(self, binding: Binding, finder: Finder, parameters: Mapping[str, Any],
                                 limit: int | None = None) -> list[Any]:
        assert finder.lock != "wait", "a waiting finder runs through locked(), which reads the clock after"
        compiled = self.compiled(binding, finder, limited=limit is not None)
        values = dict(parameters) if limit is None else {**parameters, "limit": limit}
        return await self._records_or_unreadable(binding, compiled.sql, compiled.parameters(values))

    async def read_or_unreadable(self, binding: Binding, keys: Sequence[str]) -> list[Any]:
        return await self._records_or_unreadable(binding, self.statements(binding).read_keys,
                                                 {"keys": self.key_list(keys)})

    async def set_aside(self, binding: Binding, key: Any, rewrite: Rewrite, guard: Finder) -> bool:
        statement = set_aside_statement(binding, rewrite, guard, self.capabilities, self.schema, key,
                                        await self.now_us())  # type: ignore[attr-defined]
        if statement is None:
            return False
        return bool(await self._rows(*statement))

    async def delete_unreadable(self, binding: Binding, key: Any, guard: Finder, parameters: Mapping[str, Any]) -> bool:
        statement = delete_unreadable_statement(binding, guard, self.capabilities, self.schema, key, parameters)
        if statement is None:
            return False
        return bool(await self._rows(*statement))

    async def insert(self, binding: Binding, record: Any) -> Any:
        stored = await self._records(binding, self.statements(binding).insert, self.codec(binding).write(record))
        if not stored:
            raise persistence_failed("write_not_applied")
        return stored[0]

    async def insert_many(self, binding: Binding, records: Sequence[Any]) -> list[Any]:
        return [await self.insert(binding, record) for record in records]

    async def read(self, binding: Binding, keys: Sequence[str]) -> list[Any]:
        return await self._records(binding, self.statements(binding).read_keys, {"keys": self.key_list(keys)})

    async def count_each(self, queries: Sequence[tuple[Binding, Finder, Mapping[str, Any], int | None]]) -> list[int]:
        assert all(finder.lock == "none" for _, finder, _, _ in queries), "counts take no locks"
        compiled, parameters = self.compiled_counts(queries)
        rows = await self._rows(compiled.sql, parameters)
        return [int(count) for count in rows[0]]

    async def delete_keys(self, binding: Binding, keys: Sequence[str]) -> int:
        return len(await self._rows(self.statements(binding).delete_keys, {"keys": self.key_list(keys)}))

    counts_current: ClassVar[bool] = False

    async def locked_joined_counting(
        self, binding: Binding, keys: Sequence[str], other: Binding, on: tuple[tuple[str, str], ...],
        counts: Sequence[Count],
    ) -> tuple[list[tuple[Any, Any]], list[int]]:
        if not counts:
            return await self.locked_joined(binding, keys, other, on), []  # type: ignore[attr-defined]
        compiled, parameters = self.compiled_counts(counts)
        rows, offset = await self._locked_joined_beside(binding, other, on, compiled.columns,
                                                        {"keys": self.key_list(keys), **parameters})
        # Every row carries the counts as its last columns; no row (a store whose joined
        # read answers none when no row has the keys) leaves nothing they could be evidence for.
        counted = [int(value) for value in rows[0][-len(counts):]] if rows else [0] * len(counts)
        return self.joined_records(binding, other, rows, offset), counted

    async def _locked_joined_beside(
        self, binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], columns: tuple[str, ...],
        parameters: Mapping[str, Any],
    ) -> tuple[list[Any], int]:
        """The rows of :meth:`locked_joined` (the ``:keys`` of ``parameters``), each with
        ``columns`` (scalar subqueries, their parameters in ``parameters``) as its last
        columns, in one statement, and where the pair's columns start in a row: each store
        spells its locking statement and reads its clock its way."""
        raise NotImplementedError

    async def write_guarded(
        self, parts: Sequence[tuple[Binding, Any, Any]], deletes: Sequence[tuple[Binding, Sequence[str]]],
        guards: Sequence[Guard],
    ) -> list[Any] | None:
        if guards and not self.counts_current:
            if await self.count_each([count for count, _ in guards]) != [value for _, value in guards]:
                return None
        stored = await self.write_across(parts) if parts else []
        for binding, keys in deletes:
            await self.delete_keys(binding, keys)
        return stored

    async def read_joined(
        self, binding: Binding, keys: Sequence[str], other: Binding, on: tuple[tuple[str, str], ...],
    ) -> list[tuple[Any, Any]]:
        sql = joined_read_sql(binding, other, on, self.capabilities, self.schema)
        return self.joined_records(binding, other, await self._rows(sql, {"keys": self.key_list(keys)}), 0)

    def joined_records(self, binding: Binding, other: Binding, rows: Sequence[Any], offset: int) -> list[tuple[Any, Any]]:
        """Each joined row (from ``offset``: the columns of ``binding``, then those of
        ``other``) as a record of each (None where ``other`` had no row); rows with no
        record of ``binding`` (an outer join's NULLs) are left out."""
        left, right = self.codec(binding).read, self.codec(other).read
        mine, theirs = offset + binding.key_index, offset + len(binding.spec.columns)
        return [(left(row, offset), None if row[theirs + other.key_index] is None else right(row, theirs))
                for row in rows if row[mine] is not None]

    def announce(self, binding: Binding) -> None:
        """No notifications by default (SQLite's workers poll)."""

    async def lock_name(self, name: str) -> None:
        """Nothing by default: a SQLite write transaction holds the database's write lock."""
