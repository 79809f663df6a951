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

Every call into asyncpg passes one boundary (:meth:`PostgresTransaction.call` and
:func:`_call`): it runs under the call's deadline (``WorkerConfig.timeout_seconds``,
counted from the start of the call: the wait for a pooled connection, connecting, BEGIN,
every statement and COMMIT share it) and turns whatever the driver, the socket, the pool
or the timer raised into ``QUEUE_PERSISTENCE_FAILED`` with a reason from
:data:`_REASONS_BY_CLASS` (see :mod:`tenure.adapters.core.failures`). A connection that
failed once is never used again (terminated, not rolled back: the server rolls back a
transaction whose connection is gone).

asyncpg is used directly rather than through SQLAlchemy's async engine: on this
machine a fenced-write transaction ran about 3x faster through asyncpg
(``python bench/driver_overhead.py DSN``), and the statements here are fixed texts that
need none of the engine's features. SQLAlchemy Core still declares the schema.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import asyncpg

from tenure.kernel.core import AtTime, Finder, FromCommand, Increment, Rewrite, SetValue
from tenure.model import ConfigValidationError, TenureError

from ..core.failures import Stage, persistence_failed, reason_by_class, translate
from ..core.sql import POSTGRESQL, compile_finder
from ..core.store import AheadAnswer, Body, Expected, Probe, SharedPrimitives, TimeObserver
from ..core.tables import POSTGRESQL_DIALECT, Binding, RowCodec, announce_channel, qualified

__all__ = ["PostgresStore", "PostgresTransaction", "POOL_SIZE", "DEFAULT_TIMEOUT_SECONDS"]

T = TypeVar("T")

DEFAULT_TIMEOUT_SECONDS = 30.0
"""The per-call bound when no WorkerConfig gives one (migrations, tools)."""

ROLLBACK_GRACE_SECONDS = 2.0
"""How long a ROLLBACK after a refusal may take beyond the call's deadline before the
connection is terminated instead (a refusal must not leave a healthy connection unused,
nor wait on a frozen server)."""

POOL_SIZE = 10
"""Connections per store; each open transaction holds one."""

_PARAMETER = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")

_POSTGRES_EPOCH_US = 946_684_800_000_000
"""2000-01-01 UTC, PostgreSQL's zero instant, in microseconds since the Unix epoch."""


def _instant_to_wire(micros: int) -> tuple[int]:
    return (micros - _POSTGRES_EPOCH_US,)


def _instant_from_wire(wire: tuple[int]) -> int:
    return wire[0] + _POSTGRES_EPOCH_US


async def _count_instants_in_microseconds(connection: asyncpg.Connection) -> None:
    """``timestamptz`` values travel as the kernel counts them: integer microseconds since
    the Unix epoch, both ways. asyncpg's "tuple" format hands over PostgreSQL's own binary
    value (microseconds since 2000-01-01, independent of the session time zone), so no
    datetime is built or taken apart for each instant of each row (that was about a tenth
    of a heartbeat's client time). The infinities arrive far outside the kernel's instant
    bounds, so a row holding one reads as corrupt."""
    await connection.set_type_codec(
        "timestamptz", schema="pg_catalog", encoder=_instant_to_wire, decoder=_instant_from_wire, format="tuple"
    )


class _Compiled:
    """A ``:name`` statement rewritten to asyncpg's ``$n`` with its parameter order."""

    __slots__ = ("sql", "names")

    def __init__(self, sql: str) -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        self.sql = _PARAMETER.sub(number, sql)
        self.names = tuple(names)

    def arguments(self, parameters: Mapping[str, Any]) -> list[Any]:
        return [parameters[name] for name in self.names]


_COMPILED: dict[str, _Compiled] = {}


def _compiled(sql: str) -> _Compiled:
    found = _COMPILED.get(sql)
    if found is None:
        found = _COMPILED[sql] = _Compiled(sql)
    return found


_REASONS_BY_CLASS: tuple[tuple[type[BaseException], str], ...] = (
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
    (asyncpg.AdminShutdownError, "connection_lost"),
    (asyncpg.CrashShutdownError, "connection_lost"),
    (asyncpg.PostgresConnectionError, "connection_lost"),
    (ValueError, "unavailable"),  # asyncpg's client-side DataError: a value it cannot send
    (asyncpg.InterfaceError, "connection_lost"),  # "connection is closed", "another operation is in progress"
    (asyncpg.InternalClientError, "connection_lost"),
    (OSError, "connection_lost"),
)
"""Which reason a driver failure gets (first match); anything else is ``unavailable``."""


def _failure(error: Exception, stage: Stage) -> Exception:
    sqlstate = getattr(error, "sqlstate", None)
    detail = sqlstate if isinstance(sqlstate, str) and sqlstate.isalnum() and len(sqlstate) == 5 else ""
    return translate(error, stage, reason_by_class(error, _REASONS_BY_CLASS), detail=detail)


async def _call(operation: Callable[[], Awaitable[T]], deadline: float, stage: Stage) -> T:
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


async def _call_once(operation: Callable[[], Awaitable[T]], deadline: float) -> T:
    """The boundary for one autocommit statement: an error the server answered with
    means nothing was kept (its own reason); any other failure (the connection, the
    deadline) leaves the outcome unknown: ``commit_unacknowledged``."""
    failure: Exception | None = None
    try:
        async with asyncio.timeout_at(deadline):
            return await operation()
    except (TenureError, ConfigValidationError):
        raise
    except Exception as error:  # noqa: BLE001 - this is the boundary: nothing else may pass
        failure = error
    answered = isinstance(failure, asyncpg.PostgresError) and not isinstance(failure, asyncpg.PostgresConnectionError)
    raise _failure(failure, Stage.STATEMENT if answered else Stage.COMMIT)


def _with_clock(locking_select: str) -> str:
    """One statement that takes every row lock, then reads the clock.

    The locking query runs as a materialized CTE. The clock is read by a second
    materialized CTE that aggregates over the first: an aggregate's output (and with it
    ``clock_timestamp()`` in the same target list) is computed only once its input is
    exhausted, that is once every row is locked, however long each lock waited. (Reading
    the clock in the projection over the locked rows instead would read it when the
    first row arrives, before the later rows' lock waits: a batch would then decide a
    later row with a time from before its lock.) The outer join keeps one row (with NULL
    columns) when nothing matched, so the clock is read even then.
    """
    return (
        f"WITH locked AS MATERIALIZED ({locking_select}), "
        "clock AS MATERIALIZED (SELECT clock_timestamp() AS now, count(*) AS locked_rows FROM locked) "
        "SELECT clock.now, locked.* FROM clock LEFT JOIN locked ON true"
    )


def _snapshot_sql(parts: Sequence[tuple[str, str, str | None]]) -> str:
    """One statement answering every probe after reading the clock first: ``parts`` are
    (kind, finder SQL with ``:now`` meaning the clock, field column). The rows probe (at
    most one, last) is a materialized CTE joined so that the statement returns one row
    even when it selects nothing."""
    clock = "(SELECT now FROM clock)"
    ctes = ["clock AS MATERIALIZED (SELECT clock_timestamp() AS now)"]
    columns = [f"{clock} AS now"]
    rows_cte = None
    for number, (kind, sql, column) in enumerate(parts):
        sql = sql.replace(":now", clock)
        if kind == "rows":
            rows_cte = f"probe{number}"
            ctes.append(f"{rows_cte} AS MATERIALIZED ({sql})")
        elif kind == "exists":
            columns.append(f"EXISTS ({sql})")
        else:
            columns.append(f"ARRAY(SELECT {column} FROM ({sql}) AS probe_values{number})")
    tail = f"{rows_cte}.* FROM (SELECT 1) AS one LEFT JOIN {rows_cte} ON true" if rows_cte else "1"
    return f"WITH {', '.join(ctes)} SELECT {', '.join(columns)}, {tail}"


_ARRAY_TYPES = {"text": "text", "enum": "text", "texts": "text", "json": "text", "int": "bigint",
                "flag": "boolean", "instant": "bigint"}
"""How each codec's values travel in a decided-ahead statement's arrays (instants as
integer microseconds since the Unix epoch, JSON as its exact text)."""


def _instant(expression: str) -> str:
    """Integer microseconds since the epoch as a ``timestamptz`` (exact: whole microseconds
    stay whole through the interval arithmetic)."""
    return f"(timestamptz 'epoch' + ({expression}) * interval '1 microsecond')"


_CLOCK_AFTER_LOCKS = "clock AS MATERIALIZED (SELECT clock_timestamp() AS now, count(*) AS locked_rows FROM locked)"
"""The clock, read in an aggregate over the locked rows: only once every lock is held
(tests/adapters/core/test_ahead_postgres.py replaces it with a clock read first and sees stale writes)."""


def _as_text(binding: Binding, udt: Mapping[str, str], column: str) -> bool:
    """Whether a column is compared as its text: JSON (``json`` has no ``=``; its text is
    what was written) and genuine ``uuid`` columns (records hold their canonical text)."""
    return binding.spec.column(column).codec.base == "json" or udt.get(column) == "uuid"


def _compared(binding: Binding, udt: Mapping[str, str], alias: str, column: str) -> str:
    """A stored column as the decided-ahead statements compare it."""
    return f"{alias}.{column}::text" if _as_text(binding, udt, column) else f"{alias}.{column}"


def _keeps_unwritten_columns(binding: Binding, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a new row differs from the old one only in the mutable columns (the only
    ones a decided-ahead UPDATE writes)."""
    mutable = binding.spec.mutable_names
    return all(new[c] == old.get(c) for c in binding.spec.column_names if c not in mutable)


_ANNOUNCED = ", (SELECT count(*) FROM (SELECT pg_notify(:channel, '') FROM written LIMIT 1) AS sent) AS announced"
"""The last column of a decided-ahead statement that announces: it notifies the table's
channel exactly when the statement wrote (an uncorrelated subquery runs once), in the
statement's own transaction."""


@functools.cache
def _ahead_sql(
    binding: Binding, schema: str | None, locking_select: str, types: tuple[tuple[str, str], ...], announce: bool = False,
) -> str:
    """The decided-ahead statement for ``binding`` (see :meth:`PostgresStore.write_ahead`).

    A chain of CTEs, each depending on the one before, so that no plan can read the
    clock before the locks or write before the checks: ``want`` unnests the items;
    ``locked`` (MATERIALIZED) takes the row locks; ``clock`` (MATERIALIZED) reads
    ``clock_timestamp()`` in an aggregate over ``locked``, which is computed only once
    every lock is held; ``verdict`` (MATERIALIZED) compares every locked row with its
    expected record column by column and the clock with the window; ``written``
    updates only when the verdict says go, with the relative times taken from the
    verdict's clock, and verifies each written row against the intended values in its
    RETURNING list (a mismatch divides by zero, aborting the whole statement). Nothing
    about a machine is spelled here: the comparisons are generic over the table's
    mutable columns.
    """
    spec = binding.spec
    udt = dict(types)
    key = binding.key_column
    mutable = spec.mutable_names
    instants = [c for c in mutable if spec.column(c).codec.base == "instant"]

    def array_type(column: str) -> str:
        return _ARRAY_TYPES[spec.column(column).codec.base]

    def stored(alias: str, column: str) -> str:
        return _compared(binding, udt, alias, column)

    def given(prefix: str, column: str) -> str:
        if spec.column(column).codec.base == "instant":
            return _instant(f"w.{prefix}{column}")
        return f"w.{prefix}{column}"

    def intended(column: str) -> str:
        if column in instants:
            return (f"CASE WHEN w.rel_{column} IS NULL THEN {given('new_', column)} "
                    f"ELSE verdict.now + w.rel_{column} * interval '1 microsecond' END")
        return f"(w.new_{column})::{udt[column]}"

    def verified(column: str) -> str:
        if column in instants:
            return f"t.{column} IS NOT DISTINCT FROM {intended(column)}"
        return f"{stored('t', column)} IS NOT DISTINCT FROM {given('new_', column)}"

    inputs = [("key", "text"), ("present", "boolean")]
    inputs += [(f"old_{c}", array_type(c)) for c in mutable]
    inputs += [("write", "boolean")]
    inputs += [(f"new_{c}", array_type(c)) for c in mutable]
    inputs += [(f"rel_{c}", "bigint") for c in instants]
    unnest = ", ".join(f":w_{name}::{kind}[]" for name, kind in inputs)
    names = ", ".join(name for name, _ in inputs)
    same = " AND ".join(f"{stored('l', c)} IS NOT DISTINCT FROM {given('old_', c)}" for c in mutable)
    matched = (f"CASE WHEN w.present IS NULL THEN false WHEN w.present THEN l.{key} IS NOT NULL AND {same} "
               f"ELSE l.{key} IS NULL END")
    table = qualified(schema, spec.name)
    key_cast = f"::{udt[key]}" if key in udt else ""
    return (
        f"WITH want AS MATERIALIZED (SELECT * FROM unnest({unnest}) AS w({names})), "
        f"locked AS MATERIALIZED ({locking_select}), "
        f"{_CLOCK_AFTER_LOCKS}, "
        "verdict AS MATERIALIZED (SELECT clock.now, (clock.now >= :not_before AND clock.now < :not_after AND "
        f"(SELECT bool_and({matched}) FROM want w LEFT JOIN locked l ON {stored('l', key)} = w.key)) AS go FROM clock), "
        f"written AS (UPDATE {table} AS t SET {', '.join(f'{c} = {intended(c)}' for c in mutable)} "
        # ``= ANY(:keys)`` as well as the join: the planner cannot see that ``want`` is as
        # small as the key list, and a generic plan would otherwise scan the whole table.
        f"FROM want w, verdict WHERE verdict.go AND w.write AND t.{key} = ANY(:keys) AND t.{key} = w.key{key_cast} "
        f"RETURNING {stored('t', key)} AS key, "
        f"1 / (CASE WHEN {' AND '.join(verified(c) for c in mutable)} THEN 1 ELSE 0 END) AS verified) "
        # Rows as locked only when nothing was written (the kernel decides again on them);
        # rows as written otherwise: a statement's answer carries one of the two.
        "SELECT verdict.now, verdict.go, locked.*, NULL AS split, written.*" + (_ANNOUNCED if announce else "")
        + " FROM verdict LEFT JOIN locked ON NOT verdict.go LEFT JOIN written ON verdict.go"
    )


@functools.cache
def _ahead_one_sql(
    binding: Binding, schema: str | None, locking_select: str, types: tuple[tuple[str, str], ...], announce: bool = False,
) -> str:
    """:func:`_ahead_sql` for one row, with scalar parameters: the same chain of CTEs
    (lock, clock after the locks, verdict, write, verified RETURNING) without unnesting
    arrays, which costs the server about as much again as the rest of the statement."""
    spec = binding.spec
    udt = dict(types)
    key = binding.key_column
    mutable = spec.mutable_names
    instants = [c for c in mutable if c in spec.instant_names]

    def stored(alias: str, column: str) -> str:
        return _compared(binding, udt, alias, column)

    def intended(column: str) -> str:
        if column in instants:
            return (f"CASE WHEN (:rel_{column})::bigint IS NULL THEN (:new_{column})::timestamptz "
                    f"ELSE verdict.now + (:rel_{column})::bigint * interval '1 microsecond' END")
        return f"(:new_{column})::{udt[column]}"

    def verified(column: str) -> str:
        if column in instants:
            return f"t.{column} IS NOT DISTINCT FROM {intended(column)}"
        if _as_text(binding, udt, column):
            return f"t.{column}::text IS NOT DISTINCT FROM (:check_{column})::text"
        return f"t.{column} IS NOT DISTINCT FROM (:new_{column})::{udt[column]}"

    def expected(column: str) -> str:
        if column in instants:
            return f"l.{column} IS NOT DISTINCT FROM (:old_{column})::timestamptz"
        if _as_text(binding, udt, column):
            return f"l.{column}::text IS NOT DISTINCT FROM (:old_{column})::text"
        return f"l.{column} IS NOT DISTINCT FROM (:old_{column})::{udt[column]}"

    same = " AND ".join(expected(c) for c in mutable)
    table = qualified(schema, spec.name)
    return (
        f"WITH locked AS MATERIALIZED ({locking_select}), "
        f"{_CLOCK_AFTER_LOCKS}, "
        "verdict AS MATERIALIZED (SELECT clock.now, (clock.now >= :not_before AND clock.now < :not_after AND "
        "CASE WHEN (:present)::boolean IS NULL THEN false "
        f"WHEN (:present)::boolean THEN EXISTS (SELECT 1 FROM locked l WHERE {same}) "
        "ELSE clock.locked_rows = 0 END) AS go FROM clock), "
        f"written AS (UPDATE {table} AS t SET {', '.join(f'{c} = {intended(c)}' for c in mutable)} "
        f"FROM verdict WHERE verdict.go AND (:write)::boolean AND t.{key} = ANY(:keys) "
        f"RETURNING {stored('t', key)} AS key, "
        f"1 / (CASE WHEN {' AND '.join(verified(c) for c in mutable)} THEN 1 ELSE 0 END) AS verified) "
        "SELECT verdict.now, verdict.go, locked.*, NULL AS split, written.*" + (_ANNOUNCED if announce else "")
        + " FROM verdict LEFT JOIN locked ON NOT verdict.go LEFT JOIN written ON verdict.go"
    )


@functools.cache
def _insert_sql(
    binding: Binding, schema: str | None, locking_select: str, types: tuple[tuple[str, str], ...], announce: bool = False,
) -> str:
    """The decided-ahead insert (see :meth:`PostgresStore.insert_ahead`): the same chain
    as :func:`_ahead_sql`, its verdict being that the locking finder met no row and the
    clock lies in the window; the row's time fields that move with the clock are taken
    from it, and every inserted value is verified in the RETURNING list."""
    spec = binding.spec
    udt = dict(types)
    columns = spec.column_names

    def intended(column: str) -> str:
        if spec.column(column).codec.base == "instant":
            # The clock as a scalar subquery: the RETURNING list sees the CTEs, not the FROM list.
            return (f"CASE WHEN (:rel_{column})::bigint IS NULL THEN {_instant(f'(:v_{column})::bigint')} "
                    f"ELSE (SELECT now FROM verdict) + (:rel_{column})::bigint * interval '1 microsecond' END")
        return f"(:v_{column})::{udt[column]}"

    def verified(column: str) -> str:
        if _as_text(binding, udt, column):
            return f"t.{column}::text IS NOT DISTINCT FROM (:v_{column})::text"
        return f"t.{column} IS NOT DISTINCT FROM {intended(column)}"

    table = qualified(schema, spec.name)
    return (
        f"WITH locked AS MATERIALIZED ({locking_select}), "
        f"{_CLOCK_AFTER_LOCKS}, "
        "verdict AS MATERIALIZED (SELECT clock.now, (clock.locked_rows = 0 AND clock.now >= :not_before "
        "AND clock.now < :not_after) AS go FROM clock), "
        f"written AS (INSERT INTO {table} AS t ({', '.join(columns)}) "
        f"SELECT {', '.join(intended(c) for c in columns)} FROM verdict WHERE verdict.go "
        f"RETURNING t.{binding.key_column}::text AS key, "
        f"1 / (CASE WHEN {' AND '.join(verified(c) for c in columns)} THEN 1 ELSE 0 END) AS verified) "
        "SELECT verdict.now, verdict.go, locked.*, NULL AS split, written.*" + (_ANNOUNCED if announce else "")
        + " FROM verdict LEFT JOIN locked ON NOT verdict.go LEFT JOIN written ON verdict.go"
    )


def _literal(text: str) -> str:
    """``text`` as an SQL string literal (standard_conforming_strings is on since
    PostgreSQL 9.1: only the quote needs doubling)."""
    return "'" + text.replace("'", "''") + "'"


def clear_statement_cache() -> None:
    """Forget the decided-ahead statements built so far (tests that replace a part of
    their SQL, such as :data:`_CLOCK_AFTER_LOCKS`, rebuild them)."""
    for built in (_ahead_sql, _ahead_one_sql, _insert_sql):
        built.cache_clear()


@dataclasses.dataclass(frozen=True, slots=True)
class Picked:
    """What :meth:`PostgresTransaction.pick_and_rewrite` saw and did: its clock, whether
    it wrote, the picked rows in pick order as they were, and as written."""

    now_us: int
    went: bool
    picked: list[Any]
    written: list[Any]


@functools.cache
def _pick_sql(
    binding: Binding, schema: str | None, pick_sql: str, order: str, blocker_sql: tuple[str, ...], check_where: str,
    rewrite: Rewrite, types: tuple[tuple[str, str], ...],
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The pick-and-rewrite statement and the command attributes it reads (with their
    array types). The clock comes first (nothing here waits for a lock: the pick skips
    locked rows); ``ready`` says whether to write: no blocker found a row and every
    picked row satisfies the check finder; ``written`` applies the rewrite, each change
    spelled from its kind (a constant, a command attribute, an increment, the clock)."""
    spec = binding.spec
    udt = dict(types)
    key = binding.key_column
    attributes: dict[str, str] = {}
    assignments = []
    for field, change in rewrite.changes:
        if field in binding.constants:
            continue  # no column holds it (the kernel's pair check below still sees it)
        column = binding.column_of(field)
        name = column.name
        if isinstance(change, SetValue):
            value = f"(:set_{name})::{udt[name]}"
        elif isinstance(change, FromCommand):
            attributes[change.attribute] = _ARRAY_TYPES[column.codec.base]
            value = f"(w.{change.attribute})::{udt[name]}"
        elif isinstance(change, Increment):
            value = f"t.{name} + {int(change.by)}"
        else:
            assert isinstance(change, AtTime)
            value = "clock.now"
            if change.plus is not None:
                attributes[change.plus] = "bigint"
                value = f"clock.now + w.{change.plus} * interval '1 microsecond'"
        assignments.append(f"{name} = {value}")
    ordered = tuple(sorted(attributes.items()))
    blocked = " OR ".join(f"EXISTS ({sql})" for sql in blocker_sql) or "false"
    unnest = ", ".join(f":a_{attribute}::{kind}[]" for attribute, kind in ordered)
    names = ", ".join(attribute for attribute, _ in ordered)
    table = qualified(schema, spec.name)
    sql = (
        "WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now), "
        f"blocked AS MATERIALIZED (SELECT {blocked} AS any), "
        f"picked AS MATERIALIZED ({pick_sql}), "
        f"numbered AS MATERIALIZED (SELECT row_number() OVER (ORDER BY {order}) AS pick, picked.* FROM picked), "
        "ready AS MATERIALIZED (SELECT NOT blocked.any AND "
        f"coalesce((SELECT bool_and({check_where}) FROM numbered), true) AS go FROM blocked), "
        f"want AS MATERIALIZED (SELECT * FROM unnest({unnest}) WITH ORDINALITY AS w({names}, pick)), "
        f"written AS (UPDATE {table} AS t SET {', '.join(assignments)} "
        f"FROM numbered n JOIN want w ON w.pick = n.pick, clock, ready WHERE ready.go AND t.{key} = n.{key} "
        f"RETURNING {', '.join(f't.{c}' for c in spec.column_names)}) "
        "SELECT clock.now, ready.go, numbered.*, written.* FROM clock CROSS JOIN ready "
        f"LEFT JOIN numbered ON true LEFT JOIN written ON written.{key} = numbered.{key} ORDER BY numbered.pick"
    )
    return sql, ordered


class PostgresTransaction(SharedPrimitives):
    """A transaction on one pooled connection (see :class:`tenure.adapters.core.store.Transaction`)."""

    capabilities = POSTGRESQL
    dialect = POSTGRESQL_DIALECT

    def __init__(self, store: PostgresStore, connection: asyncpg.Connection, deadline: float) -> None:
        self._store = store
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
            return await _call(lambda: operation(connection), self._deadline, stage)
        except BaseException:  # failed, timed out or cancelled mid-call: never reused
            self.broken = True
            raise

    async def _fetch(self, sql: str, parameters: Mapping[str, Any]) -> list[Any]:
        compiled = _compiled(sql)
        arguments = compiled.arguments(parameters)
        return list(await self.call(lambda connection: connection.fetch(compiled.sql, *arguments)))

    async def _fetch_many(self, sql: str, many: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Run one statement per parameter set, pipelined in one round trip."""
        compiled = _compiled(sql)
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

    async def _records(self, binding: Binding, sql: str, parameters: Mapping[str, Any]) -> list[Any]:
        read = self.codec(binding).read
        return [read(row, 0) for row in await self._fetch(sql, parameters)]

    async def canonical_key(self, binding: Binding, key: str) -> str:
        if (binding.spec.name, binding.key_column) not in self._store.uuid_columns:
            return key
        rows = await self.execute("SELECT $1::uuid::text", [key])
        return str(rows[0][0])

    async def locked(self, binding: Binding, finder: Finder, parameters: Mapping[str, Any]) -> list[Any]:
        compiled = self.compiled(binding, finder)
        rows = await self._fetch(_with_clock(compiled.sql), compiled.parameters(parameters))
        self._observe(rows[0][0])
        read = self.codec(binding).read
        return [read(row, 1) for row in rows if row[1] is not None]

    def _probe_sql(self, binding: Binding, probe: Probe, prefix: str, parameters: dict[str, Any]) -> str:
        """A probe's SELECT with its parameters renamed under ``prefix`` (added to
        ``parameters``) so that several probes share one statement; ``:now`` stays, for
        the statement to spell as its clock."""
        finder = probe.finder if probe.kind == "rows" else dataclasses.replace(probe.finder, lock="none")
        compiled = self.compiled(binding, finder, limited=probe.limit is not None)
        values = {**probe.parameters, "now": 0}  # :now is the clock, spelled in the SQL
        bound = compiled.parameters(values if probe.limit is None else {**values, "limit": probe.limit})
        bound.pop("now", None)
        parameters.update({f"{prefix}_{name}": value for name, value in bound.items()})
        return _PARAMETER.sub(lambda m: m.group(0) if m.group(1) == "now" else f":{prefix}_{m.group(1)}", compiled.sql)

    async def snapshot(self, binding: Binding, probes: Sequence[Probe]) -> list[Any]:
        parts: list[tuple[str, str, str | None]] = []
        parameters: dict[str, Any] = {}
        for number, probe in enumerate(probes):
            sql = self._probe_sql(binding, probe, f"p{number}", parameters)
            column = None if probe.field is None else binding.column_of(probe.field).name
            parts.append((probe.kind, sql, column))
        assert [kind for kind, _, _ in parts].count("rows") <= 1 and all(kind != "rows" for kind, _, _ in parts[:-1])
        rows = await self._fetch(_snapshot_sql(parts), parameters)
        first = rows[0]
        self._observe(first[0])
        answers: list[Any] = []
        offset = 1
        for kind, _, _ in parts:
            if kind == "rows":
                read = self.codec(binding).read
                answers.append([read(row, offset) for row in rows if row[offset] is not None])
            else:
                answers.append(bool(first[offset]) if kind == "exists" else list(first[offset]))
                offset += 1
        return answers

    async def pick_and_rewrite(
        self, binding: Binding, pick: Probe, check: Finder, blockers: Sequence[Probe], rewrite: Rewrite,
        commands: Sequence[Any],
    ) -> Picked:
        """One statement that reads the clock, picks rows (``pick``, a SKIP LOCKED finder,
        which never waits), and applies ``rewrite`` (kernel data) to the ``i``-th picked
        row with the ``i``-th command, only if no blocker finds a row and every picked
        row satisfies ``check``. Nothing is written otherwise, and the clock is then not
        this transaction's (the caller carries on the ordinary way)."""
        types = dict(self._store.column_types.get(binding.spec.name, ()))
        if not set(binding.spec.column_names) <= set(types):
            return Picked(0, False, [], [])  # the table was not (or not yet) seen whole
        parameters: dict[str, Any] = {}
        pick_sql = self._probe_sql(binding, pick, "pick", parameters)
        blocker_sql = [self._probe_sql(binding, blocker, f"block{number}", parameters) for number, blocker in enumerate(blockers)]
        compiled_check = self.compiled(binding, check)
        check_where = _PARAMETER.sub(lambda m: m.group(0) if m.group(1) == "now" else f":check_{m.group(1)}", compiled_check.where)
        check_values = compiled_check.parameters({"now": 0})
        check_values.pop("now", None)
        parameters.update({f"check_{name}": value for name, value in check_values.items()})
        order = ", ".join(binding.column_of(field).name for field in pick.finder.order)
        sql, attributes = _pick_sql(binding, self.schema, pick_sql, order, tuple(blocker_sql), check_where, rewrite,
                                    tuple(sorted(types.items())))
        for attribute, _ in attributes:
            parameters[f"a_{attribute}"] = [getattr(command, attribute) for command in commands]
        for field, change in rewrite.changes:
            if isinstance(change, SetValue) and field not in binding.constants:
                column = binding.column_of(field)
                parameters[f"set_{column.name}"] = self.dialect.value_writer(column)(change.value)
        rows = await self._fetch(sql.replace(":now", "(SELECT now FROM clock)"), parameters)
        now, went = rows[0][0], bool(rows[0][1])
        width = len(binding.spec.columns)
        read = self.codec(binding).read
        picked = [read(row, 3) for row in rows if row[2] is not None]
        written = [read(row, 3 + width) for row in rows if row[2] is not None and row[3 + width + binding.key_index] is not None]
        if went:
            self._observe(now)
        return Picked(now, went, picked, written)

    async def update_many(self, binding: Binding, pairs: Sequence[tuple[Any, Any]], *, read_back: bool) -> list[Any]:
        if not pairs:
            return []
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

    async def delete(self, binding: Binding, old: Any) -> bool:
        return bool(await self._fetch(self.statements(binding).delete, self.compare_parameters(binding, old)))

    async def lock_name(self, name: str) -> None:
        # A 64-bit hash of the name: two names sharing one only serialize more than needed.
        await self.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", [name])

    def announce(self, binding: Binding) -> None:
        self.announcements.add(announce_channel(self.schema, binding.spec.name))


class _Connections:
    """At most ``size`` open connections, reused last-in first-out.

    Measured cheaper than asyncpg's pool for tenure's one-transaction-per-call use: taking
    and returning a connection costs no event-loop round (asyncpg's pool shields its
    release in a task and re-arms timers on every call); the pool cost about 80 us of an
    850 us ``heartbeat_owned`` on this machine. It can be this simple because tenure keeps
    no session state (no LISTEN, SET or session lock; asyncpg's statement cache is safe
    to keep): a connection is only handed out again when its transaction ended cleanly
    (committed or rolled back) and it is still open; any other connection is terminated
    and replaced by a fresh one on demand. Idle connections stay open until the store is
    closed (there is no idle timeout). tests/adapters/core/test_postgres.py holds these rules.

    Waiting for a free slot and connecting run under the caller's deadline.
    """

    def __init__(self, dsn: str, size: int) -> None:
        self._dsn = dsn
        self._slots = asyncio.Semaphore(size)
        self._idle: list[asyncpg.Connection] = []
        self._closed = False

    async def take(self, deadline: float) -> asyncpg.Connection:
        await _call(self._slots.acquire, deadline, Stage.CONNECT)
        try:
            while self._idle:
                connection = self._idle.pop()
                if not connection.is_closed():
                    return connection
            return await _call(self._connect, deadline, Stage.CONNECT)
        except BaseException:
            self._slots.release()
            raise

    async def _connect(self) -> asyncpg.Connection:
        connection = await asyncpg.connect(self._dsn)
        try:
            await _count_instants_in_microseconds(connection)
        except BaseException:
            connection.terminate()
            raise
        return connection

    def give_back(self, connection: asyncpg.Connection, *, clean: bool) -> None:
        try:
            if clean and not self._closed and not connection.is_closed() and not connection.is_in_transaction():
                self._idle.append(connection)
            else:
                connection.terminate()
        finally:
            self._slots.release()

    async def close(self, deadline: float) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            try:
                await _call(connection.close, deadline, Stage.CONNECT)
            except TenureError:
                connection.terminate()


class _Listener:
    """A dedicated connection LISTENing on one channel (see :meth:`PostgresStore.listen`).
    It holds session state, so it never joins the pool."""

    def __init__(self, connection: asyncpg.Connection) -> None:
        self._connection = connection

    @property
    def alive(self) -> bool:
        return not self._connection.is_closed()

    async def close(self) -> None:
        connection = self._connection
        if connection.is_closed():
            return
        try:
            await asyncio.wait_for(connection.close(), ROLLBACK_GRACE_SECONDS)
        except (Exception, asyncio.CancelledError):
            connection.terminate()
            raise


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
    ) -> None:
        self._dsn = dsn
        self.schema = schema
        """The schema holding the queue tables (None: the connection's current schema)."""
        self._pool_size = pool_size
        self._timeout_seconds = timeout_seconds
        self._pool: _Connections | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        self.observe_time: TimeObserver | None = None
        self.uuid_columns: frozenset[tuple[str, str]] = frozenset()
        """(table, column) of every genuine uuid column in the schema (read at first use):
        keys stored there are canonicalized by the database and read back as text."""
        self.column_types: dict[str, tuple[tuple[str, str], ...]] = {}
        """Each table's columns with their PostgreSQL type names (read at first use)."""
        self._clock: tuple[int, float] | None = None
        """The last database time read, with this process's monotonic time then."""
        self.ahead = self

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self._timeout_seconds

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise ConfigValidationError("source_closed", fields=("source",), problems=("closed",))

    async def _open(self, deadline: float) -> _Connections:
        if self._pool is not None:
            return self._pool
        await _call(self._opening.acquire, deadline, Stage.CONNECT)
        try:
            if self._pool is None:
                pool = _Connections(self._dsn, self._pool_size)
                try:
                    connection = await pool.take(deadline)
                    try:
                        rows = await _call(lambda: connection.fetch(
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
        try:
            transaction = PostgresTransaction(self, connection, deadline)
            await transaction.call(lambda c: c.execute("BEGIN"))
            try:
                yield transaction
            except BaseException:
                clean = not transaction.broken and await self._rollback(connection, deadline)
                raise
            await self._commit(transaction)
            clean = True
        finally:
            pool.give_back(connection, clean=clean)

    async def listen(self, binding: Binding, wake: Callable[[], None]) -> _Listener:
        """A dedicated connection that calls ``wake`` on every notification of
        ``binding``'s channel (:func:`~tenure.adapters.core.tables.announce_channel`).
        Connecting and LISTEN run under the store's timeout; failures raise
        ``QUEUE_PERSISTENCE_FAILED`` like any call."""
        self._refuse_if_closed()
        deadline = self._deadline()
        connection = await _call(lambda: asyncpg.connect(self._dsn), deadline, Stage.CONNECT)

        def heard(*_: object) -> None:
            wake()

        try:
            await _call(lambda: connection.add_listener(announce_channel(self.schema, binding.spec.name), heard),
                        deadline, Stage.STATEMENT)
        except BaseException:
            connection.terminate()
            raise
        return _Listener(connection)

    def saw_clock(self, now_us: int) -> None:
        self._clock = (now_us, time.monotonic())

    def estimated_now_us(self) -> int | None:
        if self._clock is None:
            return None
        seen, at = self._clock
        return seen + round((time.monotonic() - at) * 1_000_000)

    async def write_ahead(
        self, binding: Binding, finder: Finder, items: Sequence[Expected], not_before_us: int, not_after_us: int,
        *, announce: bool = False,
    ) -> AheadAnswer | None:
        """One autocommit statement that locks, reads the clock after the locks, checks
        every item's expected row and the window, and writes all or nothing (see
        :func:`_ahead_sql` and :class:`tenure.adapters.core.store.AheadWriter`)."""
        self._refuse_if_closed()
        deadline = self._deadline()
        pool = await self._open(deadline)
        types = self.column_types.get(binding.spec.name, ())
        if not set(binding.spec.column_names) <= {column for column, _ in types}:
            return None  # the table was not (or not yet) seen whole: the transaction path
        codec = self.codec(binding)
        compiled = compile_finder(binding, finder, POSTGRESQL, self.schema)
        keys = [item.key for item in items]
        if len(items) == 1:
            sql = _ahead_one_sql(binding, self.schema, compiled.sql, types, announce)
            parameters = self._ahead_one_parameters(binding, codec, items[0])
        else:
            sql = _ahead_sql(binding, self.schema, compiled.sql, types, announce)
            parameters = self._ahead_parameters(binding, codec, items)
        if parameters is None:
            return None
        if announce:
            parameters["channel"] = announce_channel(self.schema, binding.spec.name)
        parameters.update(compiled.parameters({"keys": keys}))
        parameters["not_before"], parameters["not_after"] = not_before_us, not_after_us
        statement = _compiled(sql)
        rows = await self._fetch_once(pool, deadline, statement.sql, statement.arguments(parameters))
        return self._answer(binding, codec, rows)

    async def insert_ahead(
        self, binding: Binding, finder: Finder, finder_parameters: Mapping[str, Any], record: Any,
        relative: Mapping[str, int], not_before_us: int, not_after_us: int, *, announce: bool = False,
    ) -> AheadAnswer | None:
        """One autocommit statement that locks the rows ``finder`` selects, reads the
        clock after the locks, and inserts ``record`` (its ``relative`` fields at that
        clock plus their offsets) only if the finder met no row and the clock lies in the
        window. ``locked`` holds the rows met otherwise. None: this store cannot spell it
        for the table (nothing was sent)."""
        self._refuse_if_closed()
        deadline = self._deadline()
        pool = await self._open(deadline)
        types = self.column_types.get(binding.spec.name, ())
        if not set(binding.spec.column_names) <= {column for column, _ in types} or (
            (binding.spec.name, binding.key_column) in self.uuid_columns
        ):
            return None  # not seen whole, or keys the database canonicalizes: the transaction path
        codec = self.codec(binding)
        compiled = compile_finder(binding, finder, POSTGRESQL, self.schema)
        parameters = dict(compiled.parameters(finder_parameters))
        relative_columns = {binding.column_of(field).name: offset for field, offset in relative.items()}
        for column, value in codec.write(record).items():
            parameters[f"v_{column}"] = value
        for column in binding.spec.instant_names:
            parameters[f"rel_{column}"] = relative_columns.get(column)
        parameters["not_before"], parameters["not_after"] = not_before_us, not_after_us
        if announce:
            parameters["channel"] = announce_channel(self.schema, binding.spec.name)
        statement = _compiled(_insert_sql(binding, self.schema, compiled.sql, types, announce))
        arguments = statement.arguments(parameters)
        rows = await self._fetch_once(pool, deadline, statement.sql, arguments)
        return self._answer(binding, codec, rows)

    async def _fetch_once(self, pool: _Connections, deadline: float, sql: str, arguments: list[Any]) -> list[Any]:
        connection = await pool.take(deadline)
        clean = False
        try:
            rows = await _call_once(lambda: connection.fetch(sql, *arguments), deadline)
            clean = True
        finally:
            pool.give_back(connection, clean=clean)
        return list(rows)

    def _answer(self, binding: Binding, codec: RowCodec, rows: Sequence[Any]) -> AheadAnswer:
        """A decided-ahead statement's rows: (clock, went, row as locked, split, row as written)."""
        width = len(binding.spec.columns)
        now, went = rows[0][0], bool(rows[0][1])
        self.saw_clock(now)
        key_index = binding.key_index
        locked = {str(row[2 + key_index]): codec.read(row, 2) for row in rows if row[2 + key_index] is not None}
        written = frozenset(str(row[3 + width]) for row in rows if row[3 + width] is not None)
        return AheadAnswer(now, went, locked, written)

    def codec(self, binding: Binding) -> RowCodec:
        return binding.codec(POSTGRESQL_DIALECT, key_as_text=(binding.spec.name, binding.key_column) in self.uuid_columns)

    @staticmethod
    def _ahead_one_parameters(binding: Binding, codec: RowCodec, item: Expected) -> dict[str, Any] | None:
        """:func:`_ahead_one_sql`'s parameters (None: the item changes a column the
        statement does not write)."""
        spec = binding.spec
        old = codec.write(item.record) if item.known and item.record is not None else {}
        new = codec.write(item.new) if item.new is not None else {}
        if new and not _keeps_unwritten_columns(binding, old, new):
            return None
        relative = {binding.column_of(field).name: offset for field, offset in item.relative.items()}
        parameters: dict[str, Any] = {
            "present": None if not item.known else item.record is not None, "write": item.new is not None,
        }
        for c in spec.mutable_names:
            parameters[f"old_{c}"] = old.get(c)
            parameters[f"new_{c}"] = new.get(c)
            if c in spec.instant_names:
                parameters[f"rel_{c}"] = relative.get(c)
            else:
                parameters[f"check_{c}"] = new.get(c)
        return parameters

    @staticmethod
    def _ahead_parameters(binding: Binding, codec: RowCodec, items: Sequence[Expected]) -> dict[str, Any] | None:
        """The statement's arrays: one element per item, for every input column (None:
        an item changes a column the statement does not write)."""
        spec = binding.spec
        mutable = spec.mutable_names
        instants = [c for c in mutable if c in spec.instant_names]
        columns: dict[str, list[Any]] = {"w_key": [], "w_present": [], "w_write": []}
        for c in mutable:
            columns[f"w_old_{c}"], columns[f"w_new_{c}"] = [], []
        for c in instants:
            columns[f"w_rel_{c}"] = []
        for item in items:
            columns["w_key"].append(item.key)
            columns["w_present"].append(None if not item.known else item.record is not None)
            old = codec.write(item.record) if item.known and item.record is not None else {}
            new = codec.write(item.new) if item.new is not None else {}
            if new and not _keeps_unwritten_columns(binding, old, new):
                return None  # the statement writes mutable columns only: a transaction must
            columns["w_write"].append(item.new is not None)
            relative = {binding.column_of(field).name: offset for field, offset in item.relative.items()}
            for c in mutable:
                columns[f"w_old_{c}"].append(old.get(c))
                columns[f"w_new_{c}"].append(new.get(c))
            for c in instants:
                columns[f"w_rel_{c}"].append(relative.get(c))
        return columns

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
        notify = "".join(f"SELECT pg_notify({_literal(channel)}, ''); " for channel in sorted(transaction.announcements))
        status = await transaction.call(lambda c: c.execute(notify + "COMMIT"), Stage.COMMIT)
        if status != "COMMIT":  # the server rolled the transaction back instead
            transaction.broken = True
            raise persistence_failed("unavailable")

    @staticmethod
    async def _rollback(connection: asyncpg.Connection, deadline: float) -> bool:
        """ROLLBACK after a refusal; True when it was acknowledged (the connection is fit
        for reuse). Any failure only means the connection is dropped instead."""
        grace = max(deadline, asyncio.get_running_loop().time() + ROLLBACK_GRACE_SECONDS)
        try:
            await _call(lambda: connection.execute("ROLLBACK"), grace, Stage.STATEMENT)
        except TenureError:
            return False
        return True

    async def close(self) -> None:
        """Close every idle connection; calls still running end on their own connection,
        which is then terminated. Final: later calls raise ``source_closed``."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close(self._deadline())
