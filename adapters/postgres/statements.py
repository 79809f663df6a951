"""The PostgreSQL store's statements: every SQL text it sends, built from kernel data and
table descriptions, with the parameters each one takes.

Nothing about a machine is spelled here: a statement is generic over a binding's
columns, and a finder (kernel data) is compiled by :mod:`tenure.adapters.core.sql`.
``specs/sql/postgresql.sql`` holds every statement as rendered for every binding
(``tests/adapters/core/test_sql_renderings.py`` fails when a change here is not
rendered there): what SQL runs for a heartbeat is a grep.

The statements, one line each:

- :func:`with_clock`: a locking finder, then the clock, read once every row lock is held;
- :func:`snapshot_sql`: the clock first, then several probes (none waits for a lock);
- :func:`decided_write`: the spine of the three decided-ahead statements (lock, clock
  after the locks, verdict, write, verified RETURNING, the row as locked or as written);
- :func:`ahead_sql` / :func:`ahead_one_sql`: a decided-ahead compare-and-set of many
  rows (arrays) or of one (scalars), comparing every mutable column;
- :func:`ahead_version_sql`: a decided-ahead write of one row known by its version
  (compares the version alone; writes, verifies and sends only the changed columns);
- :func:`insert_sql`: a decided-ahead insert;
- :func:`joined_ahead_sql`: a decided-ahead compare-and-set of a row and the one row of
  another table it meets (a Run and its current delivery);
- :func:`joined_insert_sql`: a decided-ahead insert of two such rows (an admission);
- :func:`pick_sql` / :func:`claim_statement`: the claim fast path (clock, SKIP LOCKED pick,
  the kernel's rewrite);
- :func:`probe_sql`: one probe of a snapshot or a claim, its parameters renamed;
- ``:name`` parameters become asyncpg's ``$n`` once (:func:`numbered`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from tenure.kernel.core import AtTime, Finder, FromCommand, Increment, Param, Rewrite, SetValue

from ..core.sql import POSTGRESQL, CompiledFinder, compile_finder, lock_clause, order_sql, update_sql
from ..core.sql import insert_sql as plain_insert_sql
from ..core.store import Expected, Probe
from ..core.tables import ROW_VERSION, Binding, RowCodec, qualified

__all__ = [
    "PARAMETER", "Numbered", "numbered", "with_clock", "touching", "SNAPSHOT_SEES_LOCKED", "COUNTS_UNCHANGED", "locked_joined_sql", "locked_joined_counting_sql", "write_across_sql", "guarded_write_sql", "snapshot_sql", "ARRAY_TYPES", "CLOCK_AFTER_LOCKS",
    "decided_write", "ahead_sql", "ahead_one_sql", "insert_sql", "pick_sql", "literal", "clear_statement_cache",
    "ahead_parameters", "ahead_one_parameters", "probe_sql", "claim_statement", "ClaimText", "claim_text", "bind_claim", "probe_shape", "WINDOW", "VERSION_UNCHANGED", "ahead_version_sql",
    "ahead_version_parameters", "joined_ahead_sql", "joined_ahead_parameters", "PAIR_UNCHANGED",
    "joined_insert_sql", "keyed_sql", "single",
]

PARAMETER = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
"""A ``:name`` parameter (not a ``::type`` cast)."""

class Numbered:
    """A ``:name`` statement rewritten to asyncpg's ``$n`` with its parameter order."""

    __slots__ = ("sql", "names")

    def __init__(self, sql: str) -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        self.sql = PARAMETER.sub(number, sql)
        self.names = tuple(names)

    def arguments(self, parameters: Mapping[str, Any]) -> list[Any]:
        return [parameters[name] for name in self.names]


_NUMBERED: dict[str, Numbered] = {}


def numbered(sql: str) -> Numbered:
    found = _NUMBERED.get(sql)
    if found is None:
        found = _NUMBERED[sql] = Numbered(sql)
    return found



def with_clock(locking_select: str) -> str:
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


@functools.cache
def touching(binding: Binding, locking_select: str, schema: str | None) -> str:
    """:func:`with_clock` for a finder that locks by writing (``touch``): the rows the
    locking select locked are written unchanged (their key set to itself), so a
    statement of another transaction whose snapshot predates this one's commit, locking
    such a row afterwards, locks a version its snapshot does not see
    (:data:`SNAPSHOT_SEES_LOCKED`); then the clock, read once every row is locked."""
    key, columns = binding.key_column, binding.spec.column_names
    return (
        f"WITH met AS MATERIALIZED ({locking_select}), "
        f"locked AS (UPDATE {qualified(schema, binding.spec.name)} AS t SET {key} = t.{key} FROM met "
        f"WHERE t.{key} = met.{key} RETURNING {', '.join('t.' + column for column in columns)}), "
        "clock AS MATERIALIZED (SELECT clock_timestamp() AS now, count(*) AS locked_rows FROM locked) "
        "SELECT clock.now, locked.* FROM clock LEFT JOIN locked ON true"
    )


def _probed(binding: Binding, finder: Finder) -> tuple[tuple[str, str, str], ...] | None:
    """The finder as identity probes, ``(column, operator, parameter)`` per disjunct, when
    every disjunct is one condition ``=`` or ``in`` a parameter (a lookup by identity:
    job IDs, claim tokens, a submission's identities) and the rows come in key order or
    none (the order the keyed statement locks in); else None."""
    probes = []
    for conjunction in finder.any_of:
        if len(conjunction) != 1:
            return None
        condition = conjunction[0]
        if condition.op not in ("=", "in") or not isinstance(condition.operand, Param) \
                or condition.field in binding.constants:
            return None
        probes.append((binding.column_of(condition.field).name, condition.op, condition.operand.name))
    if finder.order not in ((), (binding.key_field,)) or not probes:
        return None
    return tuple(probes)


def single(finder: Finder, values: Mapping[str, Any]) -> bool:
    """Whether every list parameter of ``finder`` (a condition ``in`` a parameter) holds
    exactly one value in ``values``: the lookup is then spelled for one key
    (:func:`keyed_sql` with ``one``)."""
    for conjunction in finder.any_of:  # plain loops: a claim asks this of each of its probes
        for condition in conjunction:
            if condition.op == "in" and isinstance(condition.operand, Param) and \
                    len(tuple(values.get(condition.operand.name) or ())) != 1:
                return False
    return True


@functools.cache
def keyed_sql(binding: Binding, finder: Finder, schema: str | None, types: tuple[tuple[str, str], ...], *,
              versioned: bool = False, limited: bool = False, one: bool = False) -> str:
    """The finder's SELECT (as :func:`~tenure.adapters.core.sql.compile_finder` spells it,
    same parameters, same rows, same locks) shaped so that every plan reads the table by
    index, cached (generic) or not, on an empty, a young or an analyzed table.

    A lookup by identity (:func:`_probed`) becomes one probe per disjunct, each an
    equality on one column (a list parameter unnested, each element probed through a
    LATERAL subquery the planner cannot flatten), whose keys, deduplicated and sorted,
    then meet the table one row at a time: each row is read (and locked, in key order)
    by its key in a LATERAL subquery that keeps the finder's whole condition, so a row
    changed while its lock was awaited is checked again as before. A generic plan can
    only probe (``= ANY($1)`` or an ``OR`` of identities let it scan the whole table of a
    young or never-analyzed one instead: issue 51). Any other finder is compiled as is.

    Every plan of a list is priced as the cached one is, so that PostgreSQL keeps the
    cached plan of a batch (issue 51): a custom plan sizes a list bound as a constant
    by its values (two keys) and a cached plan at about ten, and a batch's cached plan,
    priced five times a custom one's per-key probes, was planned again at every call.
    So the list is unnested through a scalar subquery (sized at ten in every plan), and
    the finder's condition is rechecked ``IS TRUE`` (true exactly where the condition
    is: the same rows), which the planner cannot use as an index condition: as one, its
    ``= ANY`` was priced as one index descent per element for every row locked.

    With ``one`` (every list parameter holds one value: :func:`single`), a list is
    probed as an equality on its first element (``column = ($1::type[])[1]``), not
    unnested: the planner sizes an unnested list at about ten elements, so a generic
    plan of it looked dearer than a one-key custom plan and was re-planned at every call.
    A lookup of one disjunct is then the plain ``SELECT ... WHERE column = ... FOR UPDATE``
    (one probe, nothing to deduplicate or order across probes; that equality is the
    finder's whole condition for one key, so it is the only one spelled)."""
    compiled = compile_finder(binding, finder, POSTGRESQL, schema, limited=limited, versioned=versioned)
    probes = _probed(binding, finder)
    if probes is None:
        return compiled.sql
    udt = dict(types)
    table = qualified(schema, binding.spec.name)
    key = binding.key_column

    def equal(column: str, op: str, parameter: str) -> str:
        # One key of a list: its first element, a value a generic plan looks up by index.
        return f"{column} = :{parameter}" if op == "=" else f"{column} = ((:{parameter})::{udt[column]}[])[1]"

    columns = (*binding.spec.column_names, ROW_VERSION) if versioned else binding.spec.column_names
    if one and len(probes) == 1:
        lock = lock_clause(POSTGRESQL, finder.lock)
        # The equality is the finder's whole condition for one key; its ``= ANY(:keys)`` is
        # not spelled beside it: a generic plan would price that as a probe of ten keys.
        return (f"SELECT {', '.join(columns)} FROM {table} WHERE {equal(*probes[0])} "
                f"ORDER BY {key}" + (" LIMIT :limit" if limited else "") + lock)

    def probe(column: str, op: str, parameter: str) -> str:
        if op == "=" or one:
            return f"SELECT {key} FROM {table} WHERE {equal(column, op, parameter)}"
        # OFFSET 0: a subquery the planner keeps whole, so it runs once per element, by
        # index. The list through a scalar subquery: a custom plan then sizes it as a
        # generic plan does (about ten elements), not by the values bound, so the cached
        # plan is not priced above the custom ones and PostgreSQL keeps it (issue 51).
        return (f"SELECT probe.{key} FROM unnest((SELECT (:{parameter})::{udt[column]}[])) AS element(value) "
                f"CROSS JOIN LATERAL (SELECT {key} FROM {table} WHERE {column} = element.value OFFSET 0) AS probe")

    lock = lock_clause(POSTGRESQL, finder.lock) or " OFFSET 0"  # unlocked: a subquery kept whole
    found = " UNION ALL ".join(probe(*each) for each in probes)
    return (f"SELECT {', '.join('held.' + column for column in columns)} "
            f"FROM (SELECT DISTINCT found.{key} FROM ({found}) AS found ORDER BY found.{key}) AS keyed "
            f"CROSS JOIN LATERAL (SELECT {', '.join(columns)} FROM {table} WHERE {key} = keyed.{key} "
            f"AND ({compiled.where}) IS TRUE{lock}) AS held ORDER BY held.{key}" + (" LIMIT :limit" if limited else ""))


class _LockedPair(NamedTuple):
    """The start every statement that locks a row and the one row of another table it
    meets shares (:func:`_locked_pair_ctes`)."""

    ctes: str
    """``locked``, ``joined`` and ``clock``, as the first CTEs of a ``WITH`` list."""
    columns: str
    """Every column of ``locked``, then every column of ``joined``, for a select list."""
    meets: str
    """The condition on which a row of ``joined`` meets its row of ``locked``."""


@functools.cache
def _locked_pair_ctes(binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], schema: str | None,
                      held: str = "", version: bool = False, beside: str = "") -> _LockedPair:
    """The CTEs that lock the rows of ``binding`` with the ``:keys`` (or meeting ``held``,
    an ``OR`` condition), in key order, then the rows of ``other`` whose fields
    ``on[i][1]`` equal theirs ``on[i][0]``, in key order (the lock order of every path
    that locks both), then read the clock. ``joined`` reads ``locked``, so it runs after
    it; the clock is an aggregate over both, computed only once every lock of both is
    taken (see :func:`with_clock`). One spelling for every pair statement: the lock order
    and the clock after both locks are what a pair's decision relies on. With
    ``version``, ``locked`` also carries the physical version of each row it locked
    (``locked_version``, for :data:`SNAPSHOT_SEES_LOCKED`). With ``beside`` (a locking
    select of a third table), ``beside`` locks its rows after both, before the clock."""
    ours = [binding.column_of(field).name for field, _ in on]
    theirs = [other.column_of(field).name for _, field in on]
    key, other_key = binding.key_column, other.key_column
    mine, its = binding.spec.column_names, other.spec.column_names
    locked_version = ", ctid AS locked_version" if version else ""
    locking = (f"SELECT {', '.join(mine)}{locked_version} FROM {qualified(schema, binding.spec.name)} "
               f"WHERE {key} = ANY(:keys){held} ORDER BY {key} FOR UPDATE")
    met = (f"SELECT {', '.join('b.' + column for column in its)} FROM {qualified(schema, other.spec.name)} AS b "
           f"WHERE ({', '.join('b.' + column for column in theirs)}) IN (SELECT {', '.join(ours)} FROM locked) "
           f"ORDER BY b.{other_key} FOR UPDATE OF b")
    third, every_third = (f"beside AS MATERIALIZED ({beside}), ", " UNION ALL SELECT 1 FROM beside") if beside else ("", "")
    return _LockedPair(
        ctes=(f"locked AS MATERIALIZED ({locking}), joined AS MATERIALIZED ({met}), {third}"
              "clock AS MATERIALIZED (SELECT clock_timestamp() AS now, count(*) AS locked_rows "
              f"FROM (SELECT 1 FROM locked UNION ALL SELECT 1 FROM joined{every_third}) AS every_lock)"),
        columns=f"{', '.join('locked.' + c for c in mine)}, {', '.join('joined.' + c for c in its)}",
        meets=" AND ".join(f"joined.{t} = locked.{o}" for o, t in zip(ours, theirs, strict=True)),
    )


def _locked_joined_text(binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], schema: str | None,
                        counts: tuple[str, ...]) -> str:
    """The locked pair's rows in key order after the clock, each row of ``binding`` with its
    row of ``other``, and ``counts`` (if any) as the last columns."""
    pair = _locked_pair_ctes(binding, other, on, schema)
    counted = "".join(f", {count}" for count in counts)
    return (f"WITH {pair.ctes} SELECT clock.now, {pair.columns}{counted} "
            f"FROM clock LEFT JOIN locked ON true LEFT JOIN joined ON {pair.meets} ORDER BY locked.{binding.key_column}")


@functools.cache
def locked_joined_sql(binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], schema: str | None) -> str:
    """One statement that locks the rows of ``binding`` with the ``:keys``, then the rows
    of ``other`` they meet (``on``), then reads the clock (:func:`_locked_pair_ctes`); its
    rows are the clock, then each locked row of ``binding`` with its row of ``other``
    (NULL columns when there is none; one row of NULLs when nothing was locked)."""
    return _locked_joined_text(binding, other, on, schema, ())


@functools.cache
def locked_joined_counting_sql(binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], schema: str | None,
                               counts: tuple[str, ...]) -> str:
    """:func:`locked_joined_sql` with ``counts`` (scalar subqueries, their parameters
    prefixed ``q<i>_``) as columns after the rows': the evidence counted beside the
    locked rows in the same round trip. The counts see the statement's snapshot, taken
    before its lock waits: a write made on them verifies them (:func:`guarded_write_sql`)."""
    return _locked_joined_text(binding, other, on, schema, counts)


@functools.cache
def guarded_write_sql(shape: tuple[Binding, ...], deletes: tuple[Binding, ...], counts: tuple[str, ...],
                      schema: str | None) -> str:
    """One statement that compares-and-sets one row of each binding of ``shape`` (as
    :func:`write_across_sql`, parameters ``w<i>_``) and deletes the rows of each binding
    of ``deletes`` with the keys ``:d<j>_keys``, all only while each count of ``counts``
    (parameters ``q<i>_``) equals ``:g<i>``: its one row is that verdict, then every
    written row side by side (NULL columns for an UPDATE whose row no longer matched, and
    for every one when the verdict was false: nothing was written). The counts see the
    statement's snapshot, taken after the caller's earlier lock: every write its lock
    orders committed before it."""
    verdict = " AND ".join(f"{column} = :g{i}" for i, column in enumerate(counts)) if counts else "true"
    ctes = [f"guard AS MATERIALIZED (SELECT {verdict} AS holds)"]
    gate = " AND (SELECT holds FROM guard) RETURNING "
    for i, binding in enumerate(shape):
        ctes.append(f"w{i} AS ({update_sql(binding, POSTGRESQL, schema, f'w{i}_').replace(' RETURNING ', gate, 1)})")
    for j, binding in enumerate(deletes):
        key = binding.key_column
        ctes.append(f"d{j} AS (DELETE FROM {qualified(schema, binding.spec.name)} WHERE {key} = ANY(:d{j}_keys) "
                    f"AND (SELECT holds FROM guard) RETURNING {key})")
    columns = ", ".join(["guard.holds", *(f"w{i}.{column}" for i, binding in enumerate(shape)
                                          for column in binding.spec.column_names)])
    joins = " ".join(f"LEFT JOIN w{i} ON true" for i in range(len(shape)))
    return f"WITH {', '.join(ctes)} SELECT {columns} FROM guard {joins}"


@functools.cache
def write_across_sql(shape: tuple[tuple[Binding, bool], ...], schema: str | None) -> str:
    """One statement that writes one row of each binding's table (``shape``: each binding
    and whether its row is inserted, else compare-and-set by its key), each write a
    data-modifying CTE with its parameters prefixed ``w<i>_``; its one row holds every
    returned row side by side (NULL columns for an UPDATE whose row no longer matched).
    All of them run, on one snapshot: a caller that finds one missing rolls its
    transaction back."""
    writes = ", ".join(
        f"w{i} AS ({plain_insert_sql(binding, schema, f'w{i}_') if inserted else update_sql(binding, POSTGRESQL, schema, f'w{i}_')})"
        for i, (binding, inserted) in enumerate(shape))
    columns = ", ".join(f"w{i}.{column}" for i, (binding, _) in enumerate(shape) for column in binding.spec.column_names)
    joins = " ".join(f"LEFT JOIN w{i} ON true" for i in range(len(shape)))
    return f"WITH {writes} SELECT {columns} FROM (SELECT 1) AS one {joins}"


@functools.cache
def snapshot_sql(parts: tuple[tuple[str, str, str | None], ...]) -> str:
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


ARRAY_TYPES = {"text": "text", "enum": "text", "texts": "text", "json": "text", "int": "bigint",
                "flag": "boolean", "instant": "bigint"}
"""How each codec's values travel in a decided-ahead statement's arrays (instants as
integer microseconds since the Unix epoch, JSON as its exact text)."""


def _instant(expression: str) -> str:
    """Integer microseconds since the epoch as a ``timestamptz`` (exact: whole microseconds
    stay whole through the interval arithmetic)."""
    return f"(timestamptz 'epoch' + ({expression}) * interval '1 microsecond')"


CLOCK_AFTER_LOCKS = "clock AS MATERIALIZED (SELECT clock_timestamp() AS now, count(*) AS locked_rows FROM locked)"
"""The clock, read in an aggregate over the locked rows: only once every lock is held
(tests/adapters/postgres/test_ahead_postgres.py replaces it with a clock read first and sees stale writes)."""


def _as_text(binding: Binding, udt: Mapping[str, str], column: str) -> bool:
    """Whether a column is compared as its text: JSON (``json`` has no ``=``; its text is
    what was written) and genuine ``uuid`` columns (records hold their canonical text)."""
    return binding.spec.column(column).codec.base == "json" or udt.get(column) == "uuid"


def _compared(binding: Binding, udt: Mapping[str, str], alias: str, column: str) -> str:
    """A stored column as the decided-ahead statements compare it."""
    return f"{alias}.{column}::text" if _as_text(binding, udt, column) else f"{alias}.{column}"


def keeps_unwritten_columns(binding: Binding, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a new row differs from the old one only in the mutable columns (the only
    ones a decided-ahead UPDATE writes)."""
    mutable = binding.spec.mutable_names
    return all(new[c] == old.get(c) for c in binding.spec.column_names if c not in mutable)


ANNOUNCED = ", (SELECT count(*) FROM (SELECT pg_notify(:channel, '') FROM written LIMIT 1) AS sent) AS announced"
"""The last column of a decided-ahead statement that announces: it notifies the table's
channel exactly when the statement wrote (an uncorrelated subquery runs once), in the
statement's own transaction."""


WINDOW = "clock.now >= :not_before AND clock.now < :not_after"
"""The verdict's time check: the clock read after the locks lies in the decision's window."""


VERSION_UNCHANGED = f"EXISTS (SELECT 1 FROM locked l WHERE l.{ROW_VERSION} = (:version)::bigint)"
"""The verdict's proof that the locked row is the one decided on: it still has the version
it was read or written with (tests/adapters/postgres/test_ahead_postgres.py replaces it with
``true`` and sees a write on a stale row)."""


def decided_write(
    *, before: str = "", locking_select: str, go: str, write: str, key: str, checks: Sequence[str], announce: bool,
    versioned: bool = False,
) -> str:
    """The spine every decided-ahead statement shares: a chain of CTEs, each depending on
    the one before, so that no plan can read the clock before the locks or write before
    the checks. ``before`` (CTEs ending in ``, ``) come first; ``locked`` (MATERIALIZED)
    takes the row locks; ``clock`` reads ``clock_timestamp()`` in an aggregate over
    ``locked`` (:data:`CLOCK_AFTER_LOCKS`); ``verdict`` evaluates ``go``; ``written``
    (``write``, an UPDATE or INSERT that writes only when the verdict says go) returns
    ``key`` and divides by zero unless every one of ``checks`` holds for the row as
    written (aborting the whole statement). The answer: the clock, the verdict, the rows
    as locked when nothing was written, the rows' keys as written otherwise (``versioned``:
    the locking select ends with the row version, and each written key comes with the
    version the write gave it)."""
    return (
        f"WITH {before}locked AS MATERIALIZED ({locking_select}), "
        f"{CLOCK_AFTER_LOCKS}, "
        f"verdict AS MATERIALIZED (SELECT clock.now, ({go}) AS go FROM clock), "
        f"written AS ({write} "
        f"RETURNING {key} AS key, " + (f"t.{ROW_VERSION} AS version, " if versioned else "") +
        f"1 / (CASE WHEN {' AND '.join(checks)} THEN 1 ELSE 0 END) AS verified) "
        # Rows as locked only when nothing was written (the kernel decides again on them);
        # rows as written otherwise: a statement's answer carries one of the two.
        "SELECT verdict.now, verdict.go, locked.*, NULL AS split, written.*" + (ANNOUNCED if announce else "")
        + " FROM verdict LEFT JOIN locked ON NOT verdict.go LEFT JOIN written ON verdict.go"
    )


@functools.cache
def ahead_sql(
    binding: Binding, schema: str | None, locking_select: str, types: tuple[tuple[str, str], ...], announce: bool = False,
    versioned: bool = False,
) -> str:
    """The decided-ahead compare-and-set of several rows (see
    :meth:`~tenure.adapters.postgres.store.PostgresStore.write_ahead`), on the
    :func:`decided_write` spine: ``want`` unnests the items; the verdict compares every
    locked row with its expected record column by column (generic over the table's
    mutable columns: nothing about a machine is spelled here) and the clock with the
    window; the UPDATE writes the rows locked (each found by its key from ``locked``)
    and takes relative times from the verdict's clock."""
    spec = binding.spec
    udt = dict(types)
    key = binding.key_column
    mutable = spec.mutable_names
    instants = [c for c in mutable if spec.column(c).codec.base == "instant"]

    def array_type(column: str) -> str:
        return ARRAY_TYPES[spec.column(column).codec.base]

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
        return _strictly_equal(udt, f"t.{column}", given("new_", column), column)

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
    return decided_write(
        before=f"want AS MATERIALIZED (SELECT * FROM unnest({unnest}) AS w({names})), ",
        locking_select=locking_select,
        go=f"{WINDOW} AND (SELECT bool_and({matched}) FROM want w LEFT JOIN locked l ON {stored('l', key)} = w.key)",
        # The rows written are rows locked, each met by its key from ``locked`` (one index
        # probe per locked row in every plan; ``= ANY(:keys)`` priced a cached plan at ten
        # probes and, on a never-analyzed table, hashed a scan of it: issue 51). Not by
        # ``ctid``: a row version committed after the statement began would be missed.
        write=(f"UPDATE {table} AS t SET {', '.join(f'{c} = {intended(c)}' for c in mutable)} "
               f"FROM locked l JOIN want w ON {stored('l', key)} = w.key, verdict "
               f"WHERE verdict.go AND w.write AND t.{key} = l.{key}"),
        key=stored("t", key), checks=[verified(c) for c in mutable], announce=announce, versioned=versioned,
    )


@functools.cache
def ahead_one_sql(
    binding: Binding, schema: str | None, locking_select: str, types: tuple[tuple[str, str], ...], announce: bool = False,
    versioned: bool = False,
) -> str:
    """:func:`ahead_sql` for one row, with scalar parameters: the same chain of CTEs
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
        return _one_intended(binding, udt, column)

    def verified(column: str) -> str:
        return _one_verified(binding, udt, column)

    def expected(column: str) -> str:
        if column in instants:
            return f"l.{column} IS NOT DISTINCT FROM (:old_{column})::timestamptz"
        if _as_text(binding, udt, column):
            return f"l.{column}::text IS NOT DISTINCT FROM (:old_{column})::text"
        return f"l.{column} IS NOT DISTINCT FROM (:old_{column})::{udt[column]}"

    same = " AND ".join(expected(c) for c in mutable)
    table = qualified(schema, spec.name)
    return decided_write(
        locking_select=locking_select,
        go=(f"{WINDOW} AND CASE WHEN (:present)::boolean IS NULL THEN false "
            f"WHEN (:present)::boolean THEN EXISTS (SELECT 1 FROM locked l WHERE {same}) "
            "ELSE clock.locked_rows = 0 END"),
        write=(f"UPDATE {table} AS t SET {', '.join(f'{c} = {intended(c)}' for c in mutable)} "
               f"FROM verdict WHERE verdict.go AND (:write)::boolean AND t.{key} = {_only_key(udt, key)}"),
        key=stored("t", key), checks=[verified(c) for c in mutable], announce=announce, versioned=versioned,
    )


def _only_key(udt: Mapping[str, str], key: str) -> str:
    """The one key of a one-row statement's ``:keys``, as an equality a generic plan reads
    by index (``= ANY(:keys)`` let it scan the table of a young one: issue 51)."""
    return f"((:keys)::{udt.get(key, 'text')}[])[1]"


def _one_intended(binding: Binding, udt: Mapping[str, str], column: str, prefix: str = "") -> str:
    """The value a one-row decided-ahead UPDATE writes to ``column``: a time that moves
    with the clock is the verdict's clock plus its offset (``prefix``: of the parameters,
    where one statement writes rows of several tables)."""
    if column in binding.spec.instant_names:
        return (f"CASE WHEN (:{prefix}rel_{column})::bigint IS NULL THEN (:{prefix}new_{column})::timestamptz "
                f"ELSE verdict.now + (:{prefix}rel_{column})::bigint * interval '1 microsecond' END")
    return f"(:{prefix}new_{column})::{udt[column]}"


def _one_verified(binding: Binding, udt: Mapping[str, str], column: str, prefix: str = "") -> str:
    """Whether the row as written holds the intended value in ``column``."""
    if column in binding.spec.instant_names:
        return f"t.{column} IS NOT DISTINCT FROM {_one_intended(binding, udt, column, prefix)}"
    if _as_text(binding, udt, column):
        return f"t.{column}::text IS NOT DISTINCT FROM (:{prefix}check_{column})::text"
    return _strictly_equal(udt, f"t.{column}", f"(:{prefix}new_{column})::{udt[column]}", column)


def _one_expected(binding: Binding, udt: Mapping[str, str], column: str, prefix: str = "") -> str:
    """Whether the locked row ``l`` holds the value decided on in ``column``."""
    if column in binding.spec.instant_names:
        return f"l.{column} IS NOT DISTINCT FROM (:{prefix}old_{column})::timestamptz"
    if _as_text(binding, udt, column):
        return f"l.{column}::text IS NOT DISTINCT FROM (:{prefix}old_{column})::text"
    return f"l.{column} IS NOT DISTINCT FROM (:{prefix}old_{column})::{udt[column]}"


PAIR_UNCHANGED = "EXISTS (SELECT 1 FROM {rows} l WHERE {key} AND {same})"
"""The verdict's proof that a locked row of a joined decided-ahead statement is the one
decided on: every column as decided (tests/adapters/runs/test_run_ahead.py
replaces it with ``true`` and sees a write on a stale pair)."""


SNAPSHOT_SEES_LOCKED = "EXISTS (SELECT 1 FROM {table} AS seen WHERE seen.ctid = (SELECT locked_version FROM locked))"
"""Whether the row a joined decided-ahead statement locked is the version its snapshot
sees: false when a writer that wrote it (``touch``, see :func:`touching`) committed after
the statement began, whose other rows the statement's counts, read in that snapshot,
could miss (tests/adapters/runs/test_run_ahead.py replaces it with ``true`` and sees a
Run settled beside a job its owner's opening committed meanwhile)."""

BESIDE_MET_NONE = "(SELECT count(*) FROM beside) = 0"
"""The verdict's proof that the row a joined decided-ahead statement inserts beside the pair
(a hop's task) shares no identity with a row stored (tests/adapters/runs/test_run_joined_publish.py
replaces it with ``true``, with :data:`INSERTED_WITH_PAIR`, and sees a publication recorded
where the broker refused the hop)."""

BESIDE_GATE = "verdict.go"
"""When the row beside the pair is inserted: only when the verdict writes the pair
(tests/adapters/runs/test_run_joined_publish.py replaces it with ``true``, with
:data:`INSERTED_WITH_PAIR`, and sees a hop submitted for a Run that was not published)."""

INSERTED_WITH_PAIR = "verdict.go = ((SELECT count(*) FROM wrote_c) = 1)"
"""The statement's last check: the row beside the pair was inserted exactly when the pair
was written (a row inserted meanwhile, which the snapshot could not see, makes the insert
do nothing: the statement then divides by zero and keeps nothing)."""

COUNTS_UNCHANGED = "counted.{column} = (:g{index})::bigint"
"""The verdict's proof that a count the decision was made on still holds
(tests/adapters/runs/test_run_ahead.py replaces it with ``true`` and sees a Run settled
with an open job)."""


@functools.cache
def joined_ahead_sql(
    binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], schema: str | None,
    types: tuple[tuple[str, str], ...], other_types: tuple[tuple[str, str], ...],
    counts: tuple[str, ...] = (), deletes: tuple[Binding, ...] = (),
    beside: tuple[Binding, str, tuple[tuple[str, str], ...], bool] | None = None,
) -> str:
    """The decided-ahead compare-and-set of a row and the one row of another table it
    meets (a Run and its current delivery), in one statement: lock the row of
    ``binding`` with ``:keys``, then the rows of ``other`` it meets (``on``, the lock
    order of :func:`_locked_pair_ctes`), read the clock after both (an aggregate over
    both), and write each row (parameters ``a_`` and ``b_``: old, new, offsets, whether
    to write it) only if the clock lies in the window, exactly one row of ``other`` was
    met, it has the key ``:b_key``, and both rows equal, in every column, the rows
    decided on. Every written value is verified in the RETURNING lists (a mismatch
    divides by zero: nothing kept). The answer: the clock, the verdict, how many rows
    each write wrote, and (when nothing was written) the rows as locked.

    With ``counts`` (scalar subqueries, parameters ``q<i>_``: the evidence a decision
    was made on, :data:`~tenure.kernel.runs.aggregate.COUNTED_AHEAD`) the verdict also
    needs each count equal to ``:g<i>`` (:data:`COUNTS_UNCHANGED`) and the row of
    ``binding`` locked to be the version the statement's snapshot sees, in which the
    counts were read (:data:`SNAPSHOT_SEES_LOCKED`); each of ``deletes`` deletes its
    table's rows with the keys ``:d<j>_keys`` when the verdict says go (a settled Run's
    checkpoint). The answer then ends with whether the counts are current (the snapshot
    check) and the counts.

    With ``beside`` (a third table, the locking select of the rows sharing an identity
    with the row to insert, its column types, whether to announce), those rows are locked
    after the pair's, before the clock; the verdict also needs them to be none
    (:data:`BESIDE_MET_NONE`), and the row (parameters ``c_``: values and offsets, as
    :func:`joined_insert_sql`'s) is inserted exactly when the pair is written (ON
    CONFLICT DO NOTHING, then :data:`INSERTED_WITH_PAIR`: otherwise nothing is kept).
    The answer then ends with how many rows it inserted (and, announcing, whether it
    notified the table's channel)."""
    udt_a, udt_b = dict(types), dict(other_types)
    other_key = other.key_column
    pair = _locked_pair_ctes(binding, other, on, schema, version=bool(counts), beside="" if beside is None else beside[1])

    def unchanged(side: Binding, udt: Mapping[str, str], rows: str, prefix: str, key_check: str) -> str:
        # Every column, not only the mutable ones: a value another writer changed where
        # tenure never writes (a corrupted payload) must make the statement answer the
        # row, which the transaction path would have read (and refused to decode).
        same = " AND ".join(_one_expected(side, udt, c, prefix) for c in side.spec.column_names)
        return PAIR_UNCHANGED.format(rows=rows, key=key_check, same=same)

    def write(side: Binding, udt: Mapping[str, str], prefix: str, target: str) -> str:
        mutable = side.spec.mutable_names
        checks = " AND ".join(_one_verified(side, udt, c, prefix) for c in mutable)
        return (f"UPDATE {qualified(schema, side.spec.name)} AS t "
                f"SET {', '.join(f'{c} = {_one_intended(side, udt, c, prefix)}' for c in mutable)} "
                f"FROM verdict WHERE verdict.go AND (:{prefix}write)::boolean AND t.{side.key_column} = {target} "
                f"RETURNING 1 / (CASE WHEN {checks} THEN 1 ELSE 0 END) AS verified")

    other_key_check = f"{_compared(other, udt_b, 'l', other_key)} = (:b_key)::text"
    other_target = f"(:b_key)::{udt_b.get(other_key, 'text')}"
    go = (f"{WINDOW} AND (:a_present)::boolean IS NOT NULL "
          f"AND {unchanged(binding, udt_a, 'locked', 'a_', 'true')} "
          "AND (SELECT count(*) FROM joined) = 1 "
          f"AND {unchanged(other, udt_b, 'joined', 'b_', other_key_check)}")
    counting, current, answered = "", "", ""
    if counts:
        # The counts and the snapshot check after every lock (the clock's CTE): the
        # snapshot is the statement's, but what it is checked against is the row locked.
        names = [f"c{index}" for index in range(len(counts))]
        seen = SNAPSHOT_SEES_LOCKED.format(table=qualified(schema, binding.spec.name))
        counting = (f"counted AS MATERIALIZED (SELECT {seen} AS current, "
                    f"{', '.join(f'{count} AS {name}' for count, name in zip(counts, names, strict=True))} FROM clock), ")
        go += " AND counted.current AND " + " AND ".join(
            COUNTS_UNCHANGED.format(column=name, index=index) for index, name in enumerate(names))
        current = ", counted"
        answered = ", counted.current, " + ", ".join(f"counted.{name}" for name in names)
    removals = "".join(
        f", d{index} AS (DELETE FROM {qualified(schema, table.spec.name)} WHERE {table.key_column} = ANY(:d{index}_keys) "
        f"AND (SELECT go FROM verdict) RETURNING 1)" for index, table in enumerate(deletes))
    if beside is not None:
        removals += _inserted_beside(beside[0], dict(beside[2]), schema)
        go += f" AND {BESIDE_MET_NONE}"
        answered += (f", (SELECT count(*) FROM wrote_c), 1 / (CASE WHEN {INSERTED_WITH_PAIR} THEN 1 ELSE 0 END)"
                     + (", (SELECT count(*) FROM (SELECT pg_notify(:channel, '') FROM wrote_c LIMIT 1) AS sent)"
                        if beside[3] else ""))
    return (f"WITH {pair.ctes}, "
            f"{counting}verdict AS MATERIALIZED (SELECT clock.now, ({go}) AS go FROM clock{current}), "
            f"wrote_a AS ({write(binding, udt_a, 'a_', 'ANY(:keys)')}), "
            f"wrote_b AS ({write(other, udt_b, 'b_', other_target)}){removals} "
            "SELECT verdict.now, verdict.go, (SELECT count(*) FROM wrote_a), (SELECT count(*) FROM wrote_b), "
            f"{pair.columns}{answered} "
            f"FROM verdict{current.replace(', ', ' CROSS JOIN ')} LEFT JOIN locked ON NOT verdict.go "
            f"LEFT JOIN joined ON NOT verdict.go AND {pair.meets}")


def prefixed(sql: str, prefix: str) -> str:
    """``sql`` with every ``:name`` parameter renamed ``:<prefix>name`` (a finder's
    locking select inside a statement whose own parameters it must not meet)."""
    return PARAMETER.sub(lambda match: f":{prefix}{match.group(1)}", sql)


def _inserted_beside(binding: Binding, udt: Mapping[str, str], schema: str | None) -> str:
    """The CTE ``wrote_c`` that inserts the row beside a joined pair (parameters ``c_``),
    when :data:`BESIDE_GATE` holds, verifying every value as inserted."""
    columns = binding.spec.column_names
    checks = " AND ".join(_insert_verified(binding, udt, c, "c_") for c in columns)
    return (f", wrote_c AS (INSERT INTO {qualified(schema, binding.spec.name)} AS t ({', '.join(columns)}) "
            f"SELECT {', '.join(_inserted(binding, udt, c, 'c_') for c in columns)} FROM verdict WHERE {BESIDE_GATE} "
            f"ON CONFLICT DO NOTHING RETURNING 1 / (CASE WHEN {checks} THEN 1 ELSE 0 END) AS verified)")


def _inserted(binding: Binding, udt: Mapping[str, str], column: str, prefix: str) -> str:
    """The value a decided-ahead INSERT writes to ``column``: a time that moves with the
    clock is the verdict's clock plus its offset (the clock as a scalar subquery: the
    RETURNING list sees the CTEs, not the FROM list)."""
    if binding.spec.column(column).codec.base == "instant":
        return (f"CASE WHEN (:{prefix}rel_{column})::bigint IS NULL THEN {_instant(f'(:{prefix}v_{column})::bigint')} "
                f"ELSE (SELECT now FROM verdict) + (:{prefix}rel_{column})::bigint * interval '1 microsecond' END")
    return f"(:{prefix}v_{column})::{udt[column]}"


def _insert_verified(binding: Binding, udt: Mapping[str, str], column: str, prefix: str) -> str:
    """Whether the row as inserted holds the intended value in ``column``."""
    if _as_text(binding, udt, column):
        return f"t.{column}::text IS NOT DISTINCT FROM (:{prefix}v_{column})::text"
    if binding.spec.column(column).codec.base == "instant":
        return f"t.{column} IS NOT DISTINCT FROM {_inserted(binding, udt, column, prefix)}"
    return _strictly_equal(udt, f"t.{column}", _inserted(binding, udt, column, prefix), column)


@functools.cache
def joined_insert_sql(
    binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], schema: str | None,
    types: tuple[tuple[str, str], ...], other_types: tuple[tuple[str, str], ...], holder: str | None,
) -> str:
    """The decided-ahead insert of a row and the one row of another table it meets (an
    admitted Run and its first delivery), in one statement: lock the rows of ``binding``
    with ``:keys`` or (``holder``, a column) holding ``:holder``, and the rows of
    ``other`` they meet; read the clock after every lock; insert both rows (parameters
    ``a_`` and ``b_``) only if no row was met and the clock lies in the window. A row
    that appeared meanwhile (a concurrent insert the statement's snapshot cannot see)
    makes its insert do nothing (``ON CONFLICT DO NOTHING``); both inserts must then have
    done nothing, or the statement divides by zero and keeps nothing. Every inserted
    value is verified in the RETURNING lists. The answer: the clock, the verdict, how
    many rows each insert wrote, and the rows met (when the verdict said no)."""
    udt_a, udt_b = dict(types), dict(other_types)
    held = "" if holder is None else f" OR {holder} = (:holder)::{udt_a[holder]}"
    pair = _locked_pair_ctes(binding, other, on, schema, held)

    def insert(side: Binding, udt: Mapping[str, str], prefix: str) -> str:
        columns = side.spec.column_names
        checks = " AND ".join(_insert_verified(side, udt, c, prefix) for c in columns)
        return (f"INSERT INTO {qualified(schema, side.spec.name)} AS t ({', '.join(columns)}) "
                f"SELECT {', '.join(_inserted(side, udt, c, prefix) for c in columns)} FROM verdict WHERE verdict.go "
                f"ON CONFLICT DO NOTHING RETURNING 1 / (CASE WHEN {checks} THEN 1 ELSE 0 END) AS verified")

    return (f"WITH {pair.ctes}, "
            f"verdict AS MATERIALIZED (SELECT clock.now, (clock.locked_rows = 0 AND {WINDOW}) AS go FROM clock), "
            f"wrote_a AS ({insert(binding, udt_a, 'a_')}), wrote_b AS ({insert(other, udt_b, 'b_')}) "
            "SELECT verdict.now, verdict.go, (SELECT count(*) FROM wrote_a), (SELECT count(*) FROM wrote_b), "
            f"{pair.columns}, "
            "1 / (CASE WHEN (SELECT count(*) FROM wrote_a) = (SELECT count(*) FROM wrote_b) THEN 1 ELSE 0 END) "
            f"AS both_or_neither FROM verdict LEFT JOIN locked ON NOT verdict.go "
            f"LEFT JOIN joined ON NOT verdict.go AND {pair.meets}")


@dataclasses.dataclass(frozen=True, slots=True)
class _JoinedNames:
    """The parameter names of one row of :func:`joined_ahead_sql` under one prefix, built
    once per binding and prefix (not per call): whether the row was met and is written,
    each column's old value, and each mutable column's new value with its offset from the
    clock (a time) or its check (any other)."""

    present: str
    write: str
    old: tuple[tuple[str, str], ...]
    intended: tuple[tuple[str, str, str, bool], ...]


@functools.cache
def _joined_names(binding: Binding, prefix: str) -> _JoinedNames:
    spec = binding.spec
    return _JoinedNames(
        f"{prefix}present", f"{prefix}write", tuple((c, f"{prefix}old_{c}") for c in spec.column_names),
        tuple((c, f"{prefix}new_{c}", f"{prefix}rel_{c}" if c in spec.instant_names else f"{prefix}check_{c}",
               c in spec.instant_names) for c in spec.mutable_names))


def _new_columns(codec: RowCodec, item: Expected, old: Mapping[str, Any]) -> dict[str, Any]:
    """The stored value of every column of the item's new row (empty: it writes none):
    only the columns whose record value changed are encoded again, the others are the
    old row's (``old``, already encoded)."""
    if item.new is None:
        return {}
    if not old or item.record is None:
        return codec.write(item.new)
    return {**old, **codec.changes(item.record, item.new)}


def joined_ahead_parameters(binding: Binding, codec: RowCodec, item: Expected, prefix: str) -> dict[str, Any] | None:
    """:func:`joined_ahead_sql`'s parameters for one of its two rows, under ``prefix``
    (None: the item changes a column the statement does not write). The same values as
    :func:`ahead_one_parameters`, with every column's old value (the verdict compares
    every column)."""
    old = codec.write(item.record) if item.known and item.record is not None else {}
    new = _new_columns(codec, item, old)
    if new and not keeps_unwritten_columns(binding, old, new):
        return None
    names = _joined_names(binding, prefix)
    relative = {binding.column_of(field).name: offset for field, offset in item.relative.items()}
    parameters: dict[str, Any] = {names.present: None if not item.known else item.record is not None,
                                  names.write: item.new is not None}
    for column, name in names.old:
        parameters[name] = old.get(column)
    for column, new_name, other_name, instant in names.intended:
        parameters[new_name] = value = new.get(column)
        parameters[other_name] = relative.get(column) if instant else value
    return parameters


@functools.cache
def ahead_version_sql(
    binding: Binding, schema: str | None, locking_select: str, types: tuple[tuple[str, str], ...],
    changed: tuple[str, ...], announce: bool = False,
) -> str:
    """The decided-ahead write of one row known by its version: the :func:`decided_write`
    spine with ``locking_select`` ending in the row version, whose verdict is that the
    locked row still has that version (no writer changed it since it was read: the
    database's trigger gives every row state a version of its own) and the clock lies in
    the window. It writes and verifies only the ``changed`` columns (the row's other
    columns are the ones the version vouches for) and returns the new version. One
    statement per set of changed columns, built once."""
    udt = dict(types)
    table = qualified(schema, binding.spec.name)
    return decided_write(
        locking_select=locking_select,
        go=f"{WINDOW} AND {VERSION_UNCHANGED}",
        write=(f"UPDATE {table} AS t SET {', '.join(f'{c} = {_one_intended(binding, udt, c)}' for c in changed)} "
               f"FROM verdict WHERE verdict.go AND t.{binding.key_column} = {_only_key(udt, binding.key_column)}"),
        key=_compared(binding, udt, "t", binding.key_column),
        checks=[_one_verified(binding, udt, c) for c in changed], announce=announce, versioned=True,
    )


def ahead_version_parameters(binding: Binding, codec: RowCodec, item: Expected) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    """:func:`ahead_version_sql`'s changed columns and parameters for an item that writes
    a row known by its version (None: the item does not, or changes a column the
    statement does not write)."""
    if item.version is None or not item.known or item.record is None or item.new is None:
        return None
    new = codec.changes(item.record, item.new)
    mutable = binding.spec.mutable_names
    if not new.keys() <= set(mutable):
        return None  # the statement writes mutable columns only: a transaction must
    relative = {binding.column_of(field).name: offset for field, offset in item.relative.items()}
    changed = tuple([c for c in mutable if c in new or c in relative])
    if not changed:
        return None
    if not relative.keys() <= new.keys():
        new = codec.write(item.new)  # a time that moves with the clock but equals the old one now
    parameters: dict[str, Any] = {"version": item.version}
    _bind_intended(binding, changed, new, relative, parameters)
    return changed, parameters


@functools.cache
def insert_sql(
    binding: Binding, schema: str | None, locking_select: str, types: tuple[tuple[str, str], ...], announce: bool = False,
    versioned: bool = False,
) -> str:
    """The decided-ahead insert (see :meth:`~tenure.adapters.postgres.store.PostgresStore.insert_ahead`): the same chain
    as :func:`ahead_sql`, its verdict being that the locking finder met no row and the
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
        if spec.column(column).codec.base == "instant":
            return f"t.{column} IS NOT DISTINCT FROM {intended(column)}"
        return _strictly_equal(udt, f"t.{column}", intended(column), column)

    table = qualified(schema, spec.name)
    return decided_write(
        locking_select=locking_select,
        go=f"clock.locked_rows = 0 AND {WINDOW}",
        write=(f"INSERT INTO {table} AS t ({', '.join(columns)}) "
               f"SELECT {', '.join(intended(c) for c in columns)} FROM verdict WHERE verdict.go"),
        key=f"t.{binding.key_column}::text", checks=[verified(c) for c in columns], announce=announce,
        versioned=versioned,
    )


def ahead_one_parameters(binding: Binding, codec: RowCodec, item: Expected) -> dict[str, Any] | None:
    """:func:`ahead_one_sql`'s parameters (None: the item changes a column the
    statement does not write)."""
    spec = binding.spec
    old = codec.write(item.record) if item.known and item.record is not None else {}
    new = _new_columns(codec, item, old)
    if new and not keeps_unwritten_columns(binding, old, new):
        return None
    relative = {binding.column_of(field).name: offset for field, offset in item.relative.items()}
    parameters: dict[str, Any] = {
        "present": None if not item.known else item.record is not None, "write": item.new is not None,
    }
    for c in spec.mutable_names:
        parameters[f"old_{c}"] = old.get(c)
    _bind_intended(binding, spec.mutable_names, new, relative, parameters)
    return parameters


def _bind_intended(
    binding: Binding, columns: Sequence[str], new: Mapping[str, Any], relative: Mapping[str, int],
    parameters: dict[str, Any],
) -> None:
    """The parameters :func:`_one_intended` and :func:`_one_verified` name for ``columns``:
    each new value, and a time's offset from the clock or a text-compared value's check."""
    for c in columns:
        parameters[f"new_{c}"] = new.get(c)
        if c in binding.spec.instant_names:
            parameters[f"rel_{c}"] = relative.get(c)
        else:
            parameters[f"check_{c}"] = new.get(c)

def ahead_parameters(binding: Binding, codec: RowCodec, items: Sequence[Expected]) -> dict[str, Any] | None:
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
        if new and not keeps_unwritten_columns(binding, old, new):
            return None  # the statement writes mutable columns only: a transaction must
        columns["w_write"].append(item.new is not None)
        relative = {binding.column_of(field).name: offset for field, offset in item.relative.items()}
        for c in mutable:
            columns[f"w_old_{c}"].append(old.get(c))
            columns[f"w_new_{c}"].append(new.get(c))
        for c in instants:
            columns[f"w_rel_{c}"].append(relative.get(c))
    return columns


def literal(text: str) -> str:
    """``text`` as an SQL string literal (standard_conforming_strings is on since
    PostgreSQL 9.1: only the quote needs doubling)."""
    return "'" + text.replace("'", "''") + "'"


def clear_statement_cache() -> None:
    """Forget the decided-ahead statements built so far (tests that replace a part of
    their SQL, such as :data:`CLOCK_AFTER_LOCKS`, rebuild them)."""
    for built in (ahead_sql, ahead_one_sql, ahead_version_sql, insert_sql, joined_ahead_sql, joined_insert_sql, touching, keyed_sql, _probe_text, _claim_text, claim_text, pick_sql, snapshot_sql):
        built.cache_clear()



def _strictly_equal(udt: Mapping[str, str], stored: str, intended: str, column: str) -> str:
    """Whether a stored value is exactly the intended one, as the driver would read it
    back: texts compared byte for byte (``COLLATE "C"``: a case-insensitive collation
    would let a folded value pass), a ``char(n)`` also by its padded length (``char``
    equality ignores the padding the driver returns), JSON and uuids as their text."""
    kind = udt[column]
    if kind == "bpchar":
        return (f"({stored})::text COLLATE \"C\" IS NOT DISTINCT FROM ({intended})::text COLLATE \"C\" "
                f"AND octet_length({stored}) IS NOT DISTINCT FROM octet_length({intended})")
    if kind in ("text", "varchar", "json", "jsonb", "uuid", "citext", "name"):
        return f"({stored})::text COLLATE \"C\" IS NOT DISTINCT FROM ({intended})::text COLLATE \"C\""
    return f"{stored} IS NOT DISTINCT FROM {intended}"


@functools.cache
def pick_sql(
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
    intended: dict[str, str] = {}
    for field, change in rewrite.changes:
        if field in binding.constants:
            continue  # no column holds it (the kernel's pair check below still sees it)
        column = binding.column_of(field)
        name = column.name
        if isinstance(change, SetValue):
            value = f"(:set_{name})::{udt[name]}"
        elif isinstance(change, FromCommand):
            attributes[change.attribute] = ARRAY_TYPES[column.codec.base]
            value = f"(w.{change.attribute})::{udt[name]}"
        elif isinstance(change, Increment):
            value = f"n.{name} + {int(change.by)}"  # the row as picked (and locked since)
        else:
            assert isinstance(change, AtTime)
            value = "clock.now"
            if change.plus is not None:
                attributes[change.plus] = "bigint"
                value = f"clock.now + w.{change.plus} * interval '1 microsecond'"
        assignments.append(f"{name} = {value}")
        intended[name] = value
    ordered = tuple(sorted(attributes.items()))
    versioned = (ROW_VERSION,) if ROW_VERSION in udt else ()  # each written row's new version, last
    # Every column of every written row is the rewrite's value or, untouched, the value it
    # was picked with: a trigger or a coercion that changed anything (an owner padded by a
    # CHAR column, folded by a trigger) aborts the whole statement, so the claim commits
    # alone, with no read-back to roll back.
    checks = " AND ".join(_strictly_equal(udt, f"t.{c}", intended.get(c, f"n.{c}"), c) for c in spec.column_names)
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
        f"RETURNING {', '.join(f't.{c}' for c in (*spec.column_names, *versioned))}, "
        f"1 / (CASE WHEN {checks} THEN 1 ELSE 0 END) AS verified) "
        "SELECT clock.now, ready.go, numbered.*, written.* FROM clock CROSS JOIN ready "
        f"LEFT JOIN numbered ON true LEFT JOIN written ON written.{key} = numbered.{key} ORDER BY numbered.pick"
    )
    return sql, ordered




@functools.cache
def _probe_text(binding: Binding, schema: str | None, finder: Finder, kind: str, limited: bool, one: bool,
                prefix: str, types: tuple[tuple[str, str], ...] | None = None) -> tuple[str, CompiledFinder]:
    """A probe's SELECT with its parameters renamed under ``prefix`` (``:now`` stays, for
    the statement to spell as its clock), and its compiled finder; built once per shape.
    With the table's column ``types``, a lookup by identity is spelled by :func:`keyed_sql`
    (for one key when ``one``: every list parameter of the probe holds one value)."""
    finder = finder if kind == "rows" else dataclasses.replace(finder, lock="none")
    compiled = compile_finder(binding, finder, POSTGRESQL, schema, limited=limited)
    sql = compiled.sql if types is None else keyed_sql(binding, finder, schema, types, limited=limited, one=one)
    return PARAMETER.sub(lambda m: m.group(0) if m.group(1) == "now" else f":{prefix}_{m.group(1)}", sql), compiled


def _bind(compiled: CompiledFinder, values: Mapping[str, Any], prefix: str, parameters: dict[str, Any]) -> None:
    """``values`` as ``compiled``'s driver parameters renamed under ``prefix`` (added to
    ``parameters``); ``:now`` is the statement's clock, spelled in its SQL."""
    bound = compiled.parameters({**values, "now": 0})
    bound.pop("now", None)
    parameters.update({f"{prefix}_{name}": value for name, value in bound.items()})


def probe_sql(binding: Binding, schema: str | None, probe: Probe, prefix: str, parameters: dict[str, Any]) -> str:
    """A probe's SELECT with its parameters renamed under ``prefix`` (added to
    ``parameters``) so that several probes share one statement; ``:now`` stays, for the
    statement to spell as its clock. The text is built once per probe shape: a call only
    binds the probe's values."""
    text, compiled = _probe_text(binding, schema, *_shape(probe), prefix)
    _bind(compiled, probe.parameters if probe.limit is None else {**probe.parameters, "limit": probe.limit},
          prefix, parameters)
    return text


ProbeShape = tuple[Finder, str, bool, bool]
"""What a probe's SQL depends on: its finder, its kind, whether it is limited and whether
every list parameter holds one value (:func:`single`)."""


def _shape(probe: Probe) -> ProbeShape:
    return (probe.finder, probe.kind, probe.limit is not None, single(probe.finder, probe.parameters))


@functools.cache
def _claim_text(
    binding: Binding, schema: str | None, pick: ProbeShape, check: Finder, blockers: tuple[ProbeShape, ...],
    rewrite: Rewrite, types: tuple[tuple[str, str], ...],
) -> tuple[str, tuple[tuple[str, str], ...], CompiledFinder]:
    """:func:`claim_statement`'s text, attributes and compiled check, built once per shape
    (no regular expression or string assembly on a claim's hot path)."""
    pick_select, _ = _probe_text(binding, schema, *pick, "pick")
    blocker_sql = tuple(_probe_text(binding, schema, *blocker, f"block{number}", types)[0]
                        for number, blocker in enumerate(blockers))
    compiled_check = compile_finder(binding, check, POSTGRESQL, schema)
    check_where = PARAMETER.sub(lambda m: m.group(0) if m.group(1) == "now" else f":check_{m.group(1)}", compiled_check.where)
    order = order_sql(binding, pick[0])
    sql, attributes = pick_sql(binding, schema, pick_select, order, blocker_sql, check_where, rewrite, types)
    return sql.replace(":now", "(SELECT now FROM clock)"), attributes, compiled_check


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimText:
    """The claim fast path's statement for one shape of probes: its SQL (numbered,
    ``:now`` spelled as its clock), the command attributes it reads, and each compiled
    finder whose values it binds with its prefix: the pick's, each blocker's, the check's."""

    sql: str
    """With ``:name`` parameters (:attr:`statement` numbers them for the driver)."""
    statement: Numbered
    attributes: tuple[tuple[str, str], ...]
    binders: tuple[tuple[CompiledFinder, str], ...]


@functools.cache
def claim_text(
    binding: Binding, schema: str | None, pick: ProbeShape, check: Finder, blockers: tuple[ProbeShape, ...],
    rewrite: Rewrite, types: tuple[tuple[str, str], ...],
) -> ClaimText:
    """:class:`ClaimText` for the probes' shapes (:func:`probe_shape`), built once per shape."""
    sql, attributes, compiled_check = _claim_text(binding, schema, pick, check, blockers, rewrite, types)
    binders = [(_probe_text(binding, schema, *pick, "pick")[1], "pick")]
    for number, blocker in enumerate(blockers):
        binders.append((_probe_text(binding, schema, *blocker, f"block{number}")[1], f"block{number}"))
    binders.append((compiled_check, "check"))
    return ClaimText(sql, numbered(sql), attributes, tuple(binders))


def probe_shape(probe: Probe) -> ProbeShape:
    """What a probe's SQL depends on (see :data:`ProbeShape`)."""
    return _shape(probe)


def bind_claim(text: ClaimText, pick: Probe, blockers: Sequence[Probe], check_parameters: Mapping[str, Any],
               parameters: dict[str, Any]) -> None:
    """The probes' and the check's values as ``text``'s parameters (added to ``parameters``)."""
    binders = text.binders
    _bind(binders[0][0], pick.parameters if pick.limit is None else {**pick.parameters, "limit": pick.limit},
          "pick", parameters)
    for (compiled, prefix), blocker in zip(binders[1:-1], blockers, strict=True):
        _bind(compiled, blocker.parameters if blocker.limit is None else {**blocker.parameters, "limit": blocker.limit},
              prefix, parameters)
    _bind(binders[-1][0], check_parameters, "check", parameters)


def claim_statement(
    binding: Binding, schema: str | None, pick: Probe, check: Finder, blockers: Sequence[Probe], rewrite: Rewrite,
    types: tuple[tuple[str, str], ...], parameters: dict[str, Any], check_parameters: Mapping[str, Any] | None = None,
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The claim fast path's statement (:func:`pick_sql`) for its probes and check (their
    parameters added to ``parameters``), with ``:now`` spelled as its clock, and the
    command attributes it reads (:func:`claim_text` and :func:`bind_claim`; a store keeps
    the text per shape by identity instead of hashing the shape on every claim)."""
    text = claim_text(binding, schema, _shape(pick), check, tuple(_shape(blocker) for blocker in blockers), rewrite,
                      types)
    bind_claim(text, pick, blockers, check_parameters or {}, parameters)
    return text.sql, text.attributes
