"""The runtime SQL of every store, compiled from table descriptions and kernel finders.

Statements use ``:name`` parameters (sqlite3's own style); the PostgreSQL store rewrites
them to ``$n`` once. Dialect differences are capability flags, never scattered
``if dialect == ...`` branches. A :class:`~tenure.kernel.core.Finder` (kernel data)
compiles to one SELECT: its conditions become a WHERE clause over the columns its
fields live in, its constants and parameters are encoded by those columns' codecs, and
its lock mode becomes the dialect's locking suffix. Writes are compare-and-set
statements over every mutable column of the table description. Nothing about a
machine is decided here: this module only spells what the kernel and the table
description say.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tenure.kernel.core import AtTime, Condition, Finder, Param, Rewrite, SetValue

from .tables import POSTGRESQL_DIALECT, ROW_VERSION, SQLITE_DIALECT, Binding, Dialect, qualified

__all__ = [
    "Capabilities",
    "SQLITE",
    "POSTGRESQL",
    "CompiledFinder",
    "order_sql",
    "TableStatements",
    "compile_finder",
    "lock_clause",
    "statements_for",
    "set_aside_statement",
    "delete_unreadable_statement",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Capabilities:
    """How a database spells the few things that differ."""

    name: str
    dialect: Dialect
    lock_wait: str
    """Suffix that locks the selected rows for this transaction (empty where the whole
    database is locked by the write transaction, as on SQLite)."""
    lock_skip: str
    """Suffix that locks and skips rows other transactions hold (claims)."""
    null_safe_equal: str
    """Operator comparing two values where NULL equals NULL."""
    member_of: str
    """``{column} <member_of :list>``: membership in a list parameter."""
    list_parameter: Callable[[list[Any]], Any]
    """How a list parameter travels (SQLite: a JSON array; PostgreSQL: an array)."""
    comparable_json: str
    """A JSON column as a comparable expression (PostgreSQL's ``json`` has no ``=``)."""
    stored_bytes: str | None = None
    """``{column}`` as the bytes it stores, to compare with a bytes parameter: how a key
    that is not UTF-8 text is named (SQLite keeps whatever a writer put in a TEXT column;
    None: a database whose text is always valid)."""


SQLITE = Capabilities(
    name="sqlite", dialect=SQLITE_DIALECT, lock_wait="", lock_skip="", null_safe_equal="IS",
    member_of="IN (SELECT value FROM json_each(:{}))", list_parameter=json.dumps, comparable_json="{}",
    stored_bytes="CAST({} AS BLOB)",
)
POSTGRESQL = Capabilities(
    name="postgresql",
    dialect=POSTGRESQL_DIALECT,
    lock_wait=" FOR UPDATE",
    lock_skip=" FOR UPDATE SKIP LOCKED",
    null_safe_equal="IS NOT DISTINCT FROM",
    member_of="= ANY(:{})",
    list_parameter=lambda values: values,
    comparable_json="{}::text",
)

_SQL_OPERATORS = {"=": "=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledFinder:
    """A finder's SELECT and how to turn the caller's parameters into the driver's."""

    sql: str
    """``SELECT <columns> FROM <table> WHERE ... ORDER BY ... [LIMIT :limit] <lock>``."""
    where: str
    encoders: tuple[tuple[str, Callable[[Any], Any]], ...]
    constants: Mapping[str, Any]

    def parameters(self, values: Mapping[str, Any]) -> dict[str, Any]:
        bound = dict(self.constants)
        for name, encode in self.encoders:
            bound[name] = encode(values[name])
        if "limit" in values:
            bound["limit"] = values["limit"]
        return bound


def _value_writer(binding: Binding, field: str, caps: Capabilities) -> Callable[[Any], Any]:
    column = binding.column_of(field)
    return caps.dialect.value_writer(column)


def _condition_sql(
    binding: Binding, condition: Condition, caps: Capabilities, number: int,
    encoders: dict[str, Callable[[Any], Any]], constants: dict[str, Any],
) -> str:
    column = binding.column_of(condition.field).name
    if condition.op == "is_null":
        return f"{column} IS NULL"
    if condition.op == "not_null":
        return f"{column} IS NOT NULL"
    if condition.other_field is not None:
        return f"{column} {_SQL_OPERATORS[condition.op]} {binding.column_of(condition.other_field).name}"
    write = _value_writer(binding, condition.field, caps)
    operand = condition.operand
    if condition.op == "in":
        if isinstance(operand, Param):
            encoders[operand.name] = lambda values, write=write: caps.list_parameter([write(v) for v in values])  # type: ignore[misc]
            return f"{column} {caps.member_of.format(operand.name)}"
        literals = [_literal(write(value)) for value in operand]
        if literals and all(literal is not None for literal in literals):
            return f"{column} IN ({', '.join(literals)})"  # type: ignore[arg-type]
        name = f"c{number}"
        constants[name] = caps.list_parameter([write(value) for value in operand])
        return f"{column} {caps.member_of.format(name)}"
    if isinstance(operand, Param):
        encoders[operand.name] = write
        name = operand.name
    else:
        literal = _literal(write(operand))
        if literal is not None:
            return f"{column} {_SQL_OPERATORS[condition.op]} {literal}"
        name = f"c{number}"
        constants[name] = write(operand)
    return f"{column} {_SQL_OPERATORS[condition.op]} :{name}"


_PLAIN_TEXT = re.compile(r"[A-Za-z0-9_.\-]{1,100}")


def _literal(value: object) -> str | None:
    """A finder's constant (a status, a fixed queue name: the kernel's, never a caller's) as
    an SQL literal, or None to bind it as a parameter. A literal lets PostgreSQL's cached
    (generic) plan see the value, as a custom plan does: it matches a partial index and
    estimates the rows of that status, so a hot statement's cached plan keeps its index
    and costs what a custom plan costs (otherwise PostgreSQL re-plans it on every call).
    Only plain text (no quote, no colon: ``:name`` marks a parameter here) and integers."""
    if type(value) is int:
        return str(value)
    if type(value) is str and _PLAIN_TEXT.fullmatch(value):
        return f"'{value}'"
    return None


def order_sql(binding: Binding, finder: Finder) -> str:
    """The finder's ORDER BY list (``-field``: that column descending)."""
    return ", ".join(binding.column_of(field).name + (" DESC" if descending else "")
                     for field, descending in finder.ordering())


@functools.cache
def compile_finder(
    binding: Binding, finder: Finder, caps: Capabilities, schema: str | None, *, limited: bool = False,
    versioned: bool = False,
) -> CompiledFinder:
    """The finder as one SELECT of every column of the binding's table (``versioned``: and
    its row version last, :data:`~tenure.adapters.core.tables.ROW_VERSION`)."""
    encoders: dict[str, Callable[[Any], Any]] = {}
    constants: dict[str, Any] = {}
    clauses = []
    counter = 0
    for conjunction in finder.any_of:
        parts = []
        for condition in conjunction:
            counter += 1
            parts.append(_condition_sql(binding, condition, caps, counter, encoders, constants))
        clauses.append("(" + " AND ".join(parts) + ")" if parts else "TRUE")
    where = " OR ".join(clauses) if len(clauses) > 1 else clauses[0]
    table = qualified(schema, binding.spec.name)
    columns = (*binding.spec.column_names, ROW_VERSION) if versioned else binding.spec.column_names
    sql = f"SELECT {', '.join(columns)} FROM {table}"
    if where != "TRUE":
        sql += f" WHERE {where}"
    if finder.order:
        sql += " ORDER BY " + order_sql(binding, finder)
    if limited:
        sql += " LIMIT :limit"
    sql += lock_clause(caps, finder.lock)
    return CompiledFinder(sql, where, tuple(encoders.items()), constants)


def lock_clause(caps: Capabilities, lock: str) -> str:
    """The clause a finder's ``lock`` adds to its SELECT (empty for ``none``). ``touch``
    locks as ``wait`` here; the store writes the rows it locked (see
    :class:`~tenure.kernel.core.Finder`), where its database needs it."""
    return {"wait": caps.lock_wait, "touch": caps.lock_wait, "skip": caps.lock_skip, "none": ""}[lock]


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledCounts:
    """One SELECT of how many rows each of several finders selects (see :func:`counts_sql`)."""

    sql: str
    parts: tuple[tuple[str, CompiledFinder], ...]
    """Each finder compiled, with the prefix its parameters carry in ``sql``."""
    columns: tuple[str, ...] = ()
    """Each count's scalar subquery (the columns of ``sql``), to place in another statement."""

    def parameters(self, values: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        bound: dict[str, Any] = {}
        for (prefix, compiled), given in zip(self.parts, values, strict=True):
            bound.update((prefix + name, value) for name, value in compiled.parameters(given).items())
        return bound


_PLACEHOLDER = re.compile(r"(?<![:\w]):([A-Za-z_][A-Za-z0-9_]*)")
"""A ``:name`` parameter (never the second colon of a ``::type`` cast)."""


@functools.cache
def counts_sql(
    queries: tuple[tuple[Binding, Finder, int | None], ...], caps: Capabilities, schema: str | None,
) -> CompiledCounts:
    """How many rows each ``(binding, finder, limit)`` selects (counting stops at ``limit``,
    when given), in one statement (one snapshot): a scalar subquery per finder, its
    parameters prefixed ``q<i>_`` (built once per shape)."""
    selects, parts = [], []
    for index, (binding, finder, limit) in enumerate(queries):
        compiled = compile_finder(binding, finder, caps, schema)
        prefix = f"q{index}_"
        names = {name for name, _ in compiled.encoders} | set(compiled.constants)
        where = _PLACEHOLDER.sub(lambda m: f":{prefix}{m[1]}" if m[1] in names else m[0], compiled.where)
        rows = f"FROM {qualified(schema, binding.spec.name)} WHERE {where}"
        if limit is None:
            selects.append(f"(SELECT count(*) {rows})")
        else:
            selects.append(f"(SELECT count(*) FROM (SELECT 1 {rows} LIMIT {int(limit)}) AS q{index})")
        parts.append((prefix, compiled))
    return CompiledCounts("SELECT " + ", ".join(selects), tuple(parts), tuple(selects))


@functools.cache
def joined_read_sql(
    binding: Binding, other: Binding, on: tuple[tuple[str, str], ...], caps: Capabilities, schema: str | None,
) -> str:
    """The rows of ``binding`` with these ``:keys``, each with the row of ``other`` whose
    fields ``on[i][1]`` equal its fields ``on[i][0]`` (NULL columns when there is none),
    in one statement: one snapshot of both tables on every database."""
    columns = [f"a.{c}" for c in binding.spec.column_names] + [f"b.{c}" for c in other.spec.column_names]
    joined = " AND ".join(f"b.{other.column_of(theirs).name} = a.{binding.column_of(ours).name}" for ours, theirs in on)
    key = binding.key_column
    return (f"SELECT {', '.join(columns)} FROM {qualified(schema, binding.spec.name)} AS a "
            f"LEFT JOIN {qualified(schema, other.spec.name)} AS b ON {joined} "
            f"WHERE a.{key} {caps.member_of.format('keys')} ORDER BY a.{key}")


@dataclasses.dataclass(frozen=True, slots=True)
class TableStatements:
    """The writes every store runs against one table (compare-and-set, by its key)."""

    table: str
    """The (schema-qualified) table name."""
    columns: tuple[str, ...]
    insert: str
    update: str
    update_seen: str
    """The compare-and-set of a row the kernel decided on without reading it in this
    transaction (the row last seen): every column is compared, not only the mutable
    ones, so the row written is the very row decided on."""
    delete: str
    delete_keys: str
    """Delete the rows with these ``:keys`` whatever they hold (for a caller whose lock
    every writer of those rows holds), returning their keys."""
    read_keys: str


def _compared(binding: Binding, caps: Capabilities, names: Sequence[str], prefix: str = "") -> str:
    """``<column> = :<prefix>old_<column>`` for each named column, NULL equal to NULL (a
    JSON column as its comparable expression), joined by AND."""
    spec = binding.spec
    return " AND ".join(
        f"{caps.comparable_json.format(c) if c in spec.json_names else c} {caps.null_safe_equal} :{prefix}old_{c}"
        for c in names
    )


@functools.cache
def update_sql(binding: Binding, caps: Capabilities, schema: str | None = None, prefix: str = "") -> str:
    """The compare-and-set UPDATE of one row by its key (every mutable column compared with
    ``:old_<column>``, written from ``:<column>``), returning every column; ``prefix``
    goes before every parameter name (several UPDATEs in one statement)."""
    spec = binding.spec
    compare = _compared(binding, caps, spec.mutable_names, prefix)
    assignments = ", ".join(f"{c} = :{prefix}{c}" for c in spec.mutable_names)
    return (f"UPDATE {qualified(schema, spec.name)} SET {assignments} WHERE {binding.key_column} = :{prefix}old_key "
            f"AND {compare} RETURNING {', '.join(spec.column_names)}")


@functools.cache
def insert_sql(binding: Binding, schema: str | None = None, prefix: str = "") -> str:
    """The INSERT of one row (every column from ``:<column>``), returning every column;
    ``prefix`` goes before every parameter name (several writes in one statement)."""
    columns = binding.spec.column_names
    return (f"INSERT INTO {qualified(schema, binding.spec.name)} ({', '.join(columns)}) "
            f"VALUES ({', '.join(f':{prefix}{c}' for c in columns)}) RETURNING {', '.join(columns)}")


@functools.cache
def statements_for(binding: Binding, caps: Capabilities, schema: str | None = None) -> TableStatements:
    spec = binding.spec
    table = qualified(schema, spec.name)
    columns = spec.column_names
    key = binding.key_column

    compare = _compared(binding, caps, spec.mutable_names)
    assignments = ', '.join(f'{c} = :{c}' for c in spec.mutable_names)
    return TableStatements(
        table=table,
        columns=columns,
        insert=insert_sql(binding, schema),
        update=update_sql(binding, caps, schema),
        update_seen=(
            f"UPDATE {table} SET {assignments} WHERE {key} = :old_key AND "
            f"{_compared(binding, caps, [c for c in columns if c != key])} RETURNING {', '.join(columns)}"
        ),
        delete=f"DELETE FROM {table} WHERE {key} = :old_key AND {compare} RETURNING {key}",
        delete_keys=f"DELETE FROM {table} WHERE {key} {caps.member_of.format('keys')} RETURNING {key}",
        read_keys=(
            f"SELECT {', '.join(columns)} FROM {table} WHERE {key} {caps.member_of.format('keys')} ORDER BY {key}"
        ),
    )


_CLOCK = object()
"""A set-aside's time change: the transaction's database time."""


@functools.cache
def _set_aside_text(binding: Binding, rewrite: Rewrite, guard: Finder, caps: Capabilities, schema: str | None,
                    by_bytes: bool) -> tuple[str, CompiledFinder, tuple[tuple[str, str, Any], ...]]:
    assignments: list[str] = []
    values: list[tuple[str, str, Any]] = []  # (parameter, field, the value or _CLOCK)
    for field, change in rewrite.changes:
        if field in binding.constants:
            continue  # no column of this table holds it
        column = binding.column_of(field).name
        if isinstance(change, SetValue):
            values.append((f"set_{column}", field, change.value))
        else:
            assert isinstance(change, AtTime) and change.plus is None, "a set-aside writes constants and the time"
            values.append((f"set_{column}", field, _CLOCK))
        assignments.append(f"{column} = :set_{column}")
    compiled = compile_finder(binding, guard, caps, schema)
    key = binding.key_column
    named = f"{caps.stored_bytes.format(key)} = :set_aside_key" if by_bytes and caps.stored_bytes else \
        f"{key} = :set_aside_key"
    sql = (f"UPDATE {qualified(schema, binding.spec.name)} SET {', '.join(assignments)} "
           f"WHERE {named} AND ({compiled.where}) RETURNING 1")
    return sql, compiled, tuple(values)


def delete_unreadable_statement(
    binding: Binding, guard: Finder, caps: Capabilities, schema: str | None, key: Any, parameters: Mapping[str, Any],
) -> tuple[str, dict[str, Any]] | None:
    """Delete the row tenure cannot read whose stored key is ``key`` (never decoded) if it
    still matches ``guard`` (with ``parameters``): how retention removes such a row its
    finder selected (specs/queue.md, "Rows tenure cannot read"). ``key`` that is not text
    is compared as the bytes stored; None: this database cannot name such a key. One row
    per row deleted."""
    by_bytes = type(key) is not str
    if by_bytes and caps.stored_bytes is None:
        return None
    compiled = compile_finder(binding, guard, caps, schema)
    column = binding.key_column
    named = f"{caps.stored_bytes.format(column)} = :unreadable_key" if by_bytes and caps.stored_bytes else \
        f"{column} = :unreadable_key"
    sql = f"DELETE FROM {qualified(schema, binding.spec.name)} WHERE {named} AND ({compiled.where}) RETURNING 1"
    values = compiled.parameters(parameters)
    values["unreadable_key"] = key if not by_bytes else getattr(key, "data", key)
    return sql, values


def set_aside_statement(
    binding: Binding, rewrite: Rewrite, guard: Finder, caps: Capabilities, schema: str | None, key: Any, now_us: int,
) -> tuple[str, dict[str, Any]] | None:
    """The one write to a row tenure cannot read (it is never decoded): ``rewrite``'s
    changes (constants, and the time as ``now_us``) to the row whose stored key is ``key``,
    if it still matches ``guard``, returning its key. ``key`` that is not text (SQLite:
    bytes that are not UTF-8) is compared as the bytes stored; None: this database
    cannot name such a key (then nothing can be written). It returns one row per row
    written (a constant: the key itself may not decode)."""
    by_bytes = type(key) is not str
    if by_bytes and caps.stored_bytes is None:
        return None
    sql, compiled, values = _set_aside_text(binding, rewrite, guard, caps, schema, by_bytes)
    parameters = compiled.parameters({})
    for name, field, value in values:
        write = _value_writer(binding, field, caps)
        parameters[name] = write(now_us if value is _CLOCK else value)
    parameters["set_aside_key"] = key if not by_bytes else getattr(key, "data", key)
    return sql, parameters
