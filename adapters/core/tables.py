"""Table descriptions: one declaration per table that generates its DDL, its statements'
column lists and both directions of its row mapping, for every database.

A :class:`TableSpec` lists :class:`ColumnSpec` values in the table's column order. Each
column names the record field it holds (or one part of a tuple field), its codec (how a
record value is stored and read back), its SQLAlchemy type (for DDL), whether a decision
may change it (``mutable``: written and compared by the compare-and-set) and which
schema step adds it (``legacy``: the tables as other clients created them; ``owned``:
tenure's additive migration).

Codecs differ by database only in how instants and JSON travel, and that difference is a
:class:`Dialect` value, never a branch elsewhere:

* instants are integer microseconds in every record; SQLite stores them as SQLAlchemy's
  ``DATETIME`` text (``YYYY-MM-DD HH:MM:SS.ffffff``, UTC, what SQLAlchemy and its users
  write), PostgreSQL as ``timestamptz`` (sent and received as integer microseconds);
* JSON values are records' canonical text; both databases keep the text as written
  (PostgreSQL ``json``, SQLite text, or on SQLite a BLOB of the text of a bare number,
  which a column declared JSON would otherwise convert: :func:`json_to_sqlite`), and
  PostgreSQL compares ``json`` as text.

Values are checked, never coerced: a stored value of the wrong type or shape raises
``corrupt_row``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import json
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import CheckConstraint, Column, Index, MetaData, Table, UniqueConstraint, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect as SqlDialect
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.types import TypeEngine

from tenure.kernel.core import Machine, slots_of
from tenure.model import ErrorCode, TenureError
from tenure.model.bounds import MAX_INSTANT_US, MIN_INSTANT_US
from tenure.model.json_values import load_json

__all__ = [
    "json_column",
    "column",
    "one_of",
    "Binding",
    "Codec",
    "Step",
    "LEGACY_STEP",
    "VERSIONS_STEP",
    "schema_history",
    "RetirementGuard",
    "MachineTables",
    "ROW_VERSION",
    "ColumnSpec",
    "IndexSpec",
    "TableSpec",
    "Dialect",
    "SQLITE_DIALECT",
    "POSTGRESQL_DIALECT",
    "RowCodec",
    "row_codec",
    "corrupt",
    "Unreadable",
    "UndecodableText",
    "shown_key",
    "record_or_unreadable",
    "instant_to_sqlite_text",
    "instant_from_sqlite_text",
    "qualified",
    "sql_dialect",
]


def json_column(text: str | None, code: ErrorCode = ErrorCode.QUEUE_PERSISTENCE_FAILED) -> Any:
    """A stored JSON column as a value (None stays None): the one reader of every JSON
    text column. Text that is not JSON, or nests deeper than tenure reads, is a row
    written outside tenure: ``TenureError(code, "corrupt_row")``, raised outside the
    parser's handler (its message would quote the text). ``code`` is the reading
    facade's, for records built outside its error boundary."""
    if text is None:
        return None
    value: Any = _UNREADABLE
    try:
        value = load_json(text)
    except ValueError:  # JsonProblem
        pass
    if value is _UNREADABLE:
        raise TenureError(code, "corrupt_row")
    return value


_UNREADABLE = object()


def corrupt() -> TenureError:
    return TenureError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "corrupt_row")


class UndecodableText:
    """A stored text value that is not UTF-8 (SQLite keeps whatever bytes a writer put in
    a TEXT column): what a tolerant read gets instead of a ``str``, so the codec refuses
    it like any value of the wrong type and the row reads as :class:`Unreadable`."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UndecodableText) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        return f"UndecodableText({self.data!r})"


def shown_key(key: object) -> str:
    """A stored key as a report or a page may print it: the text itself, or (a key that
    is not text, or not UTF-8) its bytes with the undecodable ones escaped."""
    if type(key) is str:
        return key
    data = key.data if isinstance(key, UndecodableText) else key if isinstance(key, bytes) else str(key).encode()
    return data.decode("utf-8", "backslashreplace")


@dataclasses.dataclass(frozen=True, slots=True)
class Unreadable:
    """A stored row tenure cannot read, written outside tenure: a column holds a value of
    the wrong type or shape (text in an integer column, a date that is no date, a status
    outside the enum, text that is not UTF-8). Reads that must not stop at one (claims,
    lists, pages, Run recovery) get this marker in its place
    (:func:`record_or_unreadable`); a claim also sets aside, as this marker, a row the
    kernel's decision on which would break the record invariants (a negative generation).

    ``key`` is the row's key as stored (a ``str``; on SQLite possibly
    :class:`UndecodableText` or ``bytes``): what a write to this row names. ``fields``
    holds the record fields whose columns could be read, by field name, for pages to
    show and recovery to page on."""

    key: Any
    fields: Mapping[str, Any]

    @property
    def shown_key(self) -> str:
        """The key as a report or a page prints it."""
        return shown_key(self.key)


class Codec(enum.Enum):
    """How one record value is stored."""

    TEXT = "text"
    OPTIONAL_TEXT = "text?"
    INT = "int"
    OPTIONAL_INT = "int?"
    FLAG = "flag"
    INSTANT = "instant"
    OPTIONAL_INSTANT = "instant?"
    JSON = "json"
    OPTIONAL_JSON = "json?"
    ENUM = "enum"
    """Text holding one value of the column's ``choices`` enum."""
    OPTIONAL_ENUM = "enum?"
    TEXTS = "texts"
    """A tuple of strings in the record; its canonical JSON array as text in the table."""

    @property
    def optional(self) -> bool:
        return self.value.endswith("?")

    @property
    def base(self) -> str:
        return self.value.rstrip("?")


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """One schema step: ``value``, the name ``tenure_migrations`` records, and
    ``number``, its place in the schema's history (steps apply in increasing number; a
    new step takes the next free one). A machine's table module declares the steps its
    tables use; a step the tables of two machines share is declared alike by each (a
    value: :func:`schema_history` refuses two steps of one name or one number that
    differ). The core owns two: :data:`LEGACY_STEP` and :data:`VERSIONS_STEP`."""

    value: str
    number: int


LEGACY_STEP = Step("legacy", 0)
"""The tables as other clients created them (pycharter's own queue tables): created
where missing, never recorded, never removed."""

VERSIONS_STEP = Step("versions_v1", 11)
"""A ``row_version`` on every table, kept by the database (:data:`ROW_VERSION`). A table
that a later step creates gets its row version from that step's run (the runner keeps
every table versioned)."""


ROW_VERSION = "row_version"
"""The column every machine table gets from step ``versions_v1``: a ``BIGINT NOT NULL
DEFAULT 0`` that a trigger changes on every write by any writer (tenure, pycharter's
own code, a plain SQL statement), so that a row changed since it was read never shows
the version it was read with. On PostgreSQL every INSERT and UPDATE takes the next value
of one sequence per schema: a version names one state of one row for good (a key
deleted and inserted again, or a write rolled back, never brings an old version back),
which is what lets the decided-ahead statements compare it instead of the whole
pre-image. On SQLite every UPDATE raises it (a per-row count; tenure decides every
SQLite write inside its write transaction and never compares it). It is not part of any
record (no ``ColumnSpec``): the kernel never sees it. Writers that disable triggers
(``session_replication_role = replica``, ``ALTER TABLE ... DISABLE TRIGGER``) are outside
the guarantee; the upgrade puts back a dropped or disabled trigger."""


@dataclasses.dataclass(frozen=True, slots=True)
class ColumnSpec:
    """One stored column and the record value it holds."""

    name: str
    field: str
    """The record field; with ``part`` set, a position in that tuple field."""
    codec: Codec
    sql_type: TypeEngine[Any]
    nullable: bool
    mutable: bool
    step: Step = LEGACY_STEP
    part: int | None = None
    primary_key: bool = False
    default_sql: str | None = None
    """A server default (owned columns only: ``0``, ``false``)."""
    admission: str = ""
    """For owned columns: what the migration requires (``identity``, ``generation``,
    ``flag``, ``text``, ``document``)."""
    choices: type[enum.Enum] | None = None
    """For ENUM columns: the enum whose values the column stores."""


def column(
    name: str, codec: Codec, sql_type: Any, *, step: Step, mutable: bool = False, field: str | None = None, **more: Any
) -> ColumnSpec:
    """The one column constructor of the machines' table modules: the record field is the
    column's name unless ``field`` says otherwise, and the column is nullable exactly when
    its codec is optional. A table module binds its schema step once
    (``functools.partial(column, step=...)``)."""
    return ColumnSpec(name, field or name, codec, sql_type, codec.optional, mutable, step=step, **more)


def one_of(name: str, values: type[enum.Enum]) -> str:
    """A CHECK condition holding column ``name`` to the values of an enum."""
    return f"{name} IN ({', '.join(repr(member.value) for member in values)})"


@dataclasses.dataclass(frozen=True, slots=True)
class IndexSpec:
    name: str
    columns: tuple[str, ...]
    """Column names, in order; ``-name`` indexes that column descending."""
    unique: bool = False
    step: Step = LEGACY_STEP
    where: str | None = None
    """A partial index's condition (SQL both databases read the same way)."""


@dataclasses.dataclass(frozen=True)  # not slotted: cached_property keeps derived lists
class TableSpec:
    """A table: its columns in order, its indexes and its unique constraints."""

    name: str
    columns: tuple[ColumnSpec, ...]
    indexes: tuple[IndexSpec, ...] = ()
    unique_columns: tuple[str, ...] = ()
    """Columns with an unnamed UNIQUE constraint in CREATE TABLE (legacy step)."""
    created_by: Step = LEGACY_STEP
    """The step that creates the table (when missing)."""
    exact_unique_columns: tuple[str, ...] = ()
    """Identity columns that need one full unique index of their own comparing exactly
    (checked by the migration's admission)."""
    checks: tuple[tuple[str, str], ...] = ()
    """Named CHECK constraints created with the table: ``(name, condition)``."""
    checks_replaced_by: Step | None = None
    """The step that re-creates the checks of a table created before it (a check that
    grew: a new status the old condition refuses). PostgreSQL replaces each constraint;
    SQLite, which cannot alter a constraint, rebuilds the table."""
    probe_row: Callable[[Dialect, str, str, int], Mapping[str, Any]] | None = None
    """For a table other clients create, whose :attr:`exact_unique_columns` tenure adds:
    ``(dialect, suffix, identity, now_us) -> row`` (column name to stored value), a
    finished row whose identity columns hold ``identity``, for the migration's native
    probe that identities differing only by case or a trailing space stay distinct (on
    SQLite; rolled back). None: no probe."""

    @functools.cached_property
    def column_names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    @functools.cached_property
    def mutable_names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns if column.mutable)

    def column(self, name: str) -> ColumnSpec:
        return next(column for column in self.columns if column.name == name)

    def columns_of(self, step: Step) -> tuple[ColumnSpec, ...]:
        return tuple(column for column in self.columns if column.step == step)

    def indexes_of(self, step: Step) -> tuple[IndexSpec, ...]:
        return tuple(index for index in self.indexes if index.step == step)

    @functools.cached_property
    def steps(self) -> frozenset[Step]:
        """Every step that creates or changes this table."""
        named = {self.created_by, *(column.step for column in self.columns), *(index.step for index in self.indexes)}
        return frozenset(named | ({self.checks_replaced_by} if self.checks_replaced_by is not None else set()))

    @functools.cached_property
    def instant_names(self) -> frozenset[str]:
        return frozenset(column.name for column in self.columns if column.codec.base == "instant")

    @functools.cached_property
    def json_names(self) -> frozenset[str]:
        return frozenset(column.name for column in self.columns if column.codec.base == "json")

    def sqlalchemy_table(self, schema: str | None, *, steps: frozenset[Step]) -> Table:
        """The table as SQLAlchemy Core declares it (for DDL), with the given steps."""
        return _sqlalchemy_table(self, schema, steps)

    def create_ddl(self, dialect: SqlDialect, schema: str | None) -> list[str]:
        """CREATE TABLE IF NOT EXISTS and CREATE INDEX IF NOT EXISTS for the step that
        creates the table (its columns and indexes of that step only)."""
        table = self.sqlalchemy_table(schema, steps=frozenset({self.created_by}))
        statements = [str(CreateTable(table, if_not_exists=True).compile(dialect=dialect)).strip()]
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            statements.append(str(CreateIndex(index, if_not_exists=True).compile(dialect=dialect)).strip())
        return statements


@functools.cache
def _sqlalchemy_table(spec: TableSpec, schema: str | None, steps: frozenset[Step]) -> Table:
    metadata = MetaData()
    columns = [
        Column(
            column.name,
            column.sql_type,
            primary_key=column.primary_key,
            nullable=column.nullable,
            server_default=None if column.default_sql is None else text(column.default_sql),
        )
        for column in spec.columns
        if column.step in steps
    ]
    constraints: list[Any] = [UniqueConstraint(name) for name in spec.unique_columns]
    if spec.created_by in steps:
        constraints += [CheckConstraint(text(condition), name=name) for name, condition in spec.checks]
    table = Table(spec.name, metadata, *columns, *constraints, schema=schema)
    for index in spec.indexes:
        if index.step in steps:
            where: dict[str, Any] = {} if index.where is None else {
                "postgresql_where": text(index.where), "sqlite_where": text(index.where)
            }
            # ``-column``: that column descending (a claim that orders by it scans the index in order).
            parts = [table.c[name[1:]].desc() if name.startswith("-") else table.c[name] for name in index.columns]
            Index(index.name, *parts, unique=index.unique, **where)
    return table


def sql_dialect(name: str) -> SqlDialect:
    return postgresql.dialect() if name == "postgresql" else sqlite.dialect()  # type: ignore[no-untyped-call]


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def qualified(schema: str | None, name: str) -> str:
    """``"schema".name`` (the schema quoted), or the bare name without a schema."""
    if schema is None:
        return name
    assert _IDENTIFIER.fullmatch(schema), "schema names are checked when configured"
    return f'"{schema}".{name}'


# --- SQLite's DATETIME text ------------------------------------------------------------

_DATETIME_TEXT = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6})")
_DAY_US = 86_400_000_000


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = (year if year >= 0 else year - 399) // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    days += 719_468
    era = (days if days >= 0 else days - 146_096) // 146_097
    day_of_era = days - era * 146_097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    month_index = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * month_index + 2) // 5 + 1
    month = month_index + (3 if month_index < 10 else -9)
    return year_of_era + era * 400 + (month <= 2), month, day


_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def instant_to_sqlite_text(micros: int) -> str:
    """Microseconds since the epoch as SQLAlchemy's SQLite DATETIME text (UTC)."""
    days, rest = divmod(micros, _DAY_US)
    year, month, day = _civil_from_days(days)
    seconds, fraction = divmod(rest, 1_000_000)
    hour, seconds = divmod(seconds, 3600)
    minute, second = divmod(seconds, 60)
    return f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}.{fraction:06d}"


def instant_from_sqlite_text(value: object) -> int:
    """The instant a DATETIME text names, read as UTC; anything else is ``corrupt_row``."""
    match = _DATETIME_TEXT.fullmatch(value) if type(value) is str else None
    if match is None:
        raise corrupt()
    year, month, day, hour, minute, second, fraction = (int(part) for part in match.groups())
    leap = month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if not (1 <= year and 1 <= month <= 12 and 1 <= day <= _DAYS_IN_MONTH[month - 1] + leap
            and hour < 24 and minute < 60 and second < 60):
        raise corrupt()
    return (_days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second) * 1_000_000 + fraction


# --- SQLite's JSON text -----------------------------------------------------------------

_JSON_NUMBER_STARTS = frozenset("-0123456789")
"""The first characters of a JSON text that is a bare number (and of no other JSON text)."""


def json_to_sqlite(text: str) -> str | bytes:
    """JSON text as SQLite keeps it exactly. A column declared ``JSON`` has NUMERIC
    affinity: SQLite would store the text of a bare number as an INTEGER or a REAL
    (``1.0`` becomes the integer 1, a 20-digit integer a rounded REAL), which would no
    longer read back as the text written. So a bare number (a task's result may be one)
    travels as a BLOB of its UTF-8 text, which no affinity converts; every other JSON
    text (an object, an array, a string, true, false, null) is stored as text."""
    return text.encode("utf-8") if text[:1] in _JSON_NUMBER_STARTS else text


def json_from_sqlite(value: object) -> str:
    """The JSON text SQLite holds: text, or a BLOB of UTF-8 text (see :func:`json_to_sqlite`)."""
    if type(value) is str:
        return value
    text = None
    if type(value) is bytes:
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            pass  # raised below, outside the handler
    if text is None:
        raise corrupt()
    return text


def _json_text(value: object) -> str:
    if type(value) is not str:
        raise corrupt()
    return value


# --- dialects --------------------------------------------------------------------------


def _postgres_instant(value: object) -> int:
    # PostgreSQL's infinities and far dates arrive outside the kernel's bounds: corrupt.
    if type(value) is not int or not MIN_INSTANT_US <= value <= MAX_INSTANT_US:
        raise corrupt()
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class Dialect:
    """How one database stores the codecs that differ (instants, JSON comparison)."""

    name: str
    instant_to_stored: Callable[[int], Any]
    instant_from_stored: Callable[[object], int]
    comparable_json: str
    """``{column}`` as a comparable expression for a JSON column."""
    json_to_stored: Callable[[str], Any]
    json_from_stored: Callable[[object], str]

    def value_writer(self, column: ColumnSpec) -> Callable[[Any], Any]:
        """How one record value of this column travels to the database."""
        return _writer(column.codec, self)


SQLITE_DIALECT = Dialect("sqlite", instant_to_sqlite_text, instant_from_sqlite_text, "{}", json_to_sqlite,
                         json_from_sqlite)
POSTGRESQL_DIALECT = Dialect("postgresql", lambda micros: micros, _postgres_instant, "{}::text", lambda text: text,
                             _json_text)


# --- the row mapping -------------------------------------------------------------------


def _flag(value: object) -> bool:
    # SQLite stores booleans as 0/1 integers, PostgreSQL returns bool.
    if value is True or (type(value) is int and value == 1):
        return True
    if value is False or (type(value) is int and value == 0):
        return False
    raise corrupt()


def _reader(column: ColumnSpec, dialect: Dialect) -> Callable[[object], Any]:
    """Check (and for instants and enums convert) one stored value."""
    codec = column.codec
    base = codec.base
    optional = codec.optional  # read once: an enum's property costs a read of every None three calls
    if base == "enum":
        assert column.choices is not None, "an ENUM column names its enum"
        members: dict[object, Any] = {member.value: member for member in column.choices}

        def read_member(value: object) -> Any:
            if value is None and optional:
                return None
            member = members.get(value) if type(value) is str else None
            if member is None:
                raise corrupt()
            return member

        return read_member
    if base == "flag":
        return _flag
    if base == "texts":
        return _texts_from_stored
    if base == "instant":
        read_instant = dialect.instant_from_stored
        if optional:
            return lambda value: None if value is None else read_instant(value)
        return read_instant
    if base == "json":
        read_json = dialect.json_from_stored
        if optional:
            return lambda value: None if value is None else read_json(value)
        return read_json
    kind = int if base == "int" else str

    def read(value: object) -> Any:
        if value is None:
            if optional:
                return None
            raise corrupt()
        if type(value) is not kind:
            raise corrupt()
        return value

    return read


def _texts_from_stored(value: object) -> tuple[str, ...]:
    parsed: Any = None
    if type(value) is str:
        try:
            parsed = load_json(value)
        except ValueError:  # JsonProblem: not JSON, or nested deeper than tenure reads
            parsed = None  # raised below, outside the handler
    if type(parsed) is not list or not all(type(item) is str for item in parsed):
        raise corrupt()
    return tuple(parsed)


def _texts_to_stored(value: tuple[str, ...]) -> str:
    return json.dumps(list(value), ensure_ascii=False, separators=(",", ":"))


_ENCODED_BASES = frozenset({"texts", "enum", "instant", "json"})
"""The codec bases :func:`_writer` encodes; every other is stored as the record holds it."""


def _writer(codec: Codec, dialect: Dialect) -> Callable[[Any], Any]:
    if codec.base not in _ENCODED_BASES:
        return lambda value: value
    if codec.base == "texts":
        return _texts_to_stored
    if codec.base == "enum":
        # ``_value_``: the member's value as the enum stores it (``.value`` is a property: a call)
        return lambda value: None if value is None else value._value_
    if codec.base == "instant":
        write_instant = dialect.instant_to_stored
        return lambda value: None if value is None else write_instant(value)
    write_json = dialect.json_to_stored  # "json", the last of the encoded bases
    return lambda value: None if value is None else write_json(value)


@dataclasses.dataclass(frozen=True, slots=True)
class RowCodec:
    """Both directions of one table's row mapping on one database.

    ``read(values, offset)`` builds a record from the stored values in column order (from
    ``offset``), slot by slot: the stores' hot path. ``write(record)`` gives the stored
    value of every column, by name. ``constants`` fill record fields no column holds.
    """

    spec: TableSpec
    read: Callable[[Sequence[Any], int], Any]
    write: Callable[[Any], dict[str, Any]]
    stored_instant: Callable[[int], Any]
    changes: Callable[[Any, Any], dict[str, Any]]
    """``changes(old, new)``: the stored value of every column whose record value differs
    between the two records (only those are encoded: a fenced write's hot path)."""
    salvage: Callable[[Sequence[Any], int], dict[str, Any]]
    """``salvage(values, offset)``: the record fields of a row ``read`` refused whose own
    columns can be read (a tuple field only when all of its parts can), by field name."""
    interpreted_read: Callable[[Sequence[Any], int], Any]
    """``read`` as an interpreter of the column readers, one call per column: the
    reference ``read`` (:func:`generated_reader`) is held equal to
    (tests/adapters/core/test_generated_reader.py)."""


def row_codec(
    spec: TableSpec,
    dialect: Dialect,
    record_type: type[Any],
    constants: Mapping[str, Any],
    *,
    prepare: Callable[[list[Any]], None] | None = None,
) -> RowCodec:
    """The row mapping of ``spec`` on ``dialect`` into ``record_type`` (a slotted
    dataclass). ``prepare`` may adjust the raw values in place first (a uuid column's
    value to text, say)."""
    slots = dict(slots_of(record_type))
    plain: list[tuple[Any, int, Callable[[object], Any]]] = []
    tuples: dict[str, list[tuple[int, int, Callable[[object], Any]]]] = {}
    for index, column in enumerate(spec.columns):
        reader = _reader(column, dialect)
        if column.part is None:
            plain.append((slots[column.field].__set__, index, reader))
        else:
            tuples.setdefault(column.field, []).append((column.part, index, reader))
    tuple_plans = [
        (slots[field].__set__, tuple((index, reader) for _, index, reader in sorted(parts)))
        for field, parts in tuples.items()
    ]
    fixed = [(slots[field].__set__, value) for field, value in constants.items()]
    width = len(spec.columns)

    def read(values: Sequence[Any], offset: int = 0) -> Any:
        if prepare is not None:
            values = list(values[offset:offset + width])
            prepare(values)
            offset = 0
        record = object.__new__(record_type)
        for set_slot, index, reader in plain:
            set_slot(record, reader(values[offset + index]))
        for set_slot, parts in tuple_plans:
            set_slot(record, tuple([reader(values[offset + index]) for index, reader in parts]))
        for set_slot, value in fixed:
            set_slot(record, value)
        return record

    writers = [
        (column.name, column.field, column.part, _writer(column.codec, dialect)) for column in spec.columns
    ]
    # Every column's field read in one C call, in column order; a column stored as the
    # record holds it is not passed through a writer (the hot path: a decided-ahead
    # statement encodes each row it compares).
    fields_of = operator.attrgetter(*(column.field for column in spec.columns))
    encoders = [(column.name, column.part, writer if column.codec.base in _ENCODED_BASES else None)
                for column, (_, _, _, writer) in zip(spec.columns, writers, strict=True)]

    def write(record: Any) -> dict[str, Any]:
        values = fields_of(record)
        if len(encoders) == 1:
            values = (values,)
        row: dict[str, Any] = {}
        for (name, part, writer), value in zip(encoders, values):
            if part is not None:
                value = value[part]
            row[name] = value if writer is None else writer(value)
        return row

    def changes(old: Any, new: Any) -> dict[str, Any]:
        befores, afters = fields_of(old), fields_of(new)
        if len(encoders) == 1:
            befores, afters = (befores,), (afters,)
        row: dict[str, Any] = {}
        for (name, part, writer), before, after in zip(encoders, befores, afters):
            if before is after:
                continue
            if part is not None:
                before, after = before[part], after[part]
            if before != after:
                row[name] = after if writer is None else writer(after)
        return row

    named = [(column.field, index, _reader(column, dialect)) for index, column in enumerate(spec.columns)
             if column.part is None]
    parted = [(field, tuple((index, reader) for _, index, reader in sorted(parts))) for field, parts in tuples.items()]

    def salvage(values: Sequence[Any], offset: int = 0) -> dict[str, Any]:
        if prepare is not None:
            values = list(values[offset:offset + width])
            prepare(values)
            offset = 0
        fields: dict[str, Any] = {}
        for field, index, reader in named:
            with contextlib.suppress(TenureError):
                fields[field] = reader(values[offset + index])
        for field, indexed in parted:
            with contextlib.suppress(TenureError):
                fields[field] = tuple(reader(values[offset + index]) for index, reader in indexed)
        fields.update(constants)
        return fields

    return RowCodec(spec, generated_reader(spec, dialect, record_type, constants, prepare=prepare), write,
                    dialect.instant_to_stored, changes, salvage, read)


def record_or_unreadable(codec: RowCodec, key_index: int, row: Sequence[Any], offset: int = 0) -> Any:
    """The record ``row`` holds (from ``offset``), or :class:`Unreadable` when the codec
    refuses it (``corrupt_row``)."""
    try:
        return codec.read(row, offset)
    except TenureError:  # corrupt_row: the one failure a codec raises
        pass
    key = row[offset + key_index]
    if key is not None and not isinstance(key, (str, bytes, UndecodableText)):
        key = str(key)  # a genuine uuid key column's value
    return Unreadable(key, codec.salvage(row, offset))


def generated_reader(
    spec: TableSpec, dialect: Dialect, record_type: type[Any], constants: Mapping[str, Any], *,
    prepare: Callable[[list[Any]], None] | None = None,
) -> Callable[[Sequence[Any], int], Any]:
    """``RowCodec.read`` as one straight-line function written for this table and
    database, as dataclasses writes a class's ``__init__``: each column's check inlined
    (a type test, an enum member looked up, PostgreSQL's instant bounds), only the
    readers that parse (SQLite's instants and JSON, text arrays) called. It reads the
    columns in the order the interpreted reader does and refuses exactly the rows it
    refuses (``corrupt_row``): tests/adapters/core/test_generated_reader.py holds the two
    equal. A read is the stores' hot path: a claim decodes every row it picks and writes."""
    slots = dict(slots_of(record_type))
    names: dict[str, Any] = {"record_type": record_type, "new": object.__new__, "corrupt": corrupt,
                             "prepare": prepare, "MIN_INSTANT_US": MIN_INSTANT_US, "MAX_INSTANT_US": MAX_INSTANT_US}
    lines = ["def read(values, offset=0):"]
    if prepare is not None:
        lines += [f"    values = list(values[offset:offset + {len(spec.columns)}])", "    prepare(values)", "    offset = 0"]
    lines.append("    record = new(record_type)")

    def value_lines(index: int, column: ColumnSpec, target: str) -> list[str]:
        base, optional = column.codec.base, column.codec.optional
        out = [f"{target} = values[offset + {index}]"]
        unless_none = f"{target} is not None and " if optional else ""
        if base == "enum":
            assert column.choices is not None, "an ENUM column names its enum"
            names[f"members_{index}"] = {member.value: member for member in column.choices}
            out += [f"if type({target}) is str and {target} in members_{index}:",
                    f"    {target} = members_{index}[{target}]",
                    f"elif {target} is not None:" if optional else "else:", "    raise corrupt()"]
        elif base == "flag":
            out += [f"if {target} is True or (type({target}) is int and {target} == 1):", f"    {target} = True",
                    f"elif {target} is False or (type({target}) is int and {target} == 0):", f"    {target} = False",
                    "else:", "    raise corrupt()"]
        elif base == "texts":
            names["texts_from_stored"] = _texts_from_stored
            out.append(f"{target} = texts_from_stored({target})")
        elif base == "instant" and dialect.instant_from_stored is _postgres_instant:
            out += [f"if {unless_none}(type({target}) is not int or not MIN_INSTANT_US <= {target} <= MAX_INSTANT_US):"
                    if optional else
                    f"if type({target}) is not int or not MIN_INSTANT_US <= {target} <= MAX_INSTANT_US:",
                    "    raise corrupt()"]
        elif base == "json" and dialect.json_from_stored is _json_text:
            out += [f"if {unless_none}type({target}) is not str:", "    raise corrupt()"]
        elif base in ("instant", "json"):
            names[f"read_{index}"] = dialect.instant_from_stored if base == "instant" else dialect.json_from_stored
            out += [f"if {target} is not None:", f"    {target} = read_{index}({target})"] if optional else \
                [f"{target} = read_{index}({target})"]
        else:
            kind = "int" if base == "int" else "str"
            out += [f"if {unless_none}type({target}) is not {kind}:", "    raise corrupt()"]
        return out

    tuples: dict[str, list[tuple[int, int, ColumnSpec]]] = {}
    for index, column in enumerate(spec.columns):
        if column.part is None:
            names[f"set_{index}"] = slots[column.field].__set__
            lines += [f"    {line}" for line in value_lines(index, column, "v")]
            lines.append(f"    set_{index}(record, v)")
        else:
            tuples.setdefault(column.field, []).append((column.part, index, column))
    for number, (field, parts) in enumerate(tuples.items()):
        targets = []
        for _, index, column in sorted(parts, key=lambda part: (part[0], part[1])):
            lines += [f"    {line}" for line in value_lines(index, column, f"p{index}")]
            targets.append(f"p{index}")
        names[f"set_tuple_{number}"] = slots[field].__set__
        lines.append(f"    set_tuple_{number}(record, ({', '.join(targets)},))")
    for number, (field, value) in enumerate(constants.items()):
        names[f"set_constant_{number}"], names[f"constant_{number}"] = slots[field].__set__, value
        lines.append(f"    set_constant_{number}(record, constant_{number})")
    lines.append("    return record")
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<generated reader {spec.name} {dialect.name}>", "exec"), names)  # noqa: S102 - our own source
    read: Callable[[Sequence[Any], int], Any] = names["read"]
    read.__doc__ = source
    return read


# --- a machine's table -----------------------------------------------------------------


def announce_channel(schema: str | None, table: str) -> str:
    """The PostgreSQL notification channel on which writes to ``table`` announce new
    work (channels are database-wide, so the schema is part of the name; None: the
    connection's current schema, spelled as an empty part)."""
    return f"tenure:{schema or ''}:{table}"


def _key_as_text(index: int) -> Callable[[list[Any]], None]:
    def prepare(values: list[Any]) -> None:
        # A genuine uuid key column: asyncpg returns its own UUID subclass; records keep
        # the canonical text.
        if values[index] is not None and not isinstance(values[index], str):
            values[index] = str(values[index])

    return prepare


@dataclasses.dataclass(frozen=True, eq=False)
class Binding:
    """One machine's records in one table: what the shared engine, the stores and the
    store conformance suite need to persist them. ``constants`` fill record fields no
    column holds; ``key_field`` is the record field of the primary key."""

    name: str
    machine: Any
    """The kernel's :class:`~tenure.kernel.core.Machine`."""
    spec: TableSpec
    record_type: type[Any]
    constants: Mapping[str, Any]
    key_field: str
    announces: Callable[[Any, Any], bool] | None = None
    """``(old, new) -> bool``: the change makes work available that an idle worker
    should hear of (the queue: a row that became pending). The stores announce such a
    change in the transaction that writes it (PostgreSQL: ``pg_notify`` on
    :func:`announce_channel`); None: the table announces nothing."""

    def announced(self, changes: Iterable[tuple[Any, Any]]) -> bool:
        """Whether any ``(old, new)`` change is one this table announces."""
        announces = self.announces
        if announces is not None:
            for old, new in changes:
                if new is not None and announces(old, new):
                    return True
        return False

    @functools.cached_property
    def _columns_by_field(self) -> dict[str, ColumnSpec]:
        return {column.field: column for column in self.spec.columns if column.part is None}

    def column_of(self, field: str) -> ColumnSpec:
        """The column holding a record field."""
        return self._columns_by_field[field]

    @functools.cached_property
    def key_column(self) -> str:
        return self.column_of(self.key_field).name

    @functools.cached_property
    def key_index(self) -> int:
        return self.spec.column_names.index(self.key_column)

    def codec(self, dialect: Dialect, *, key_as_text: bool = False) -> RowCodec:
        """Both directions of the row mapping on ``dialect`` (``key_as_text``: the key
        column is a uuid the driver returns as an object)."""
        return _binding_codec(self, dialect, key_as_text)


@functools.cache
def _binding_codec(binding: Binding, dialect: Dialect, key_as_text: bool) -> RowCodec:
    prepare = _key_as_text(binding.key_index) if key_as_text else None
    return row_codec(binding.spec, dialect, binding.record_type, binding.constants, prepare=prepare)


@dataclasses.dataclass(frozen=True, slots=True)
class RetirementGuard:
    """Rows that forbid removing ``step``: ``SELECT count(*) FROM table WHERE condition``
    must be zero (``condition`` has one positional parameter, ``True``, when it says ``?``)."""

    step: Step
    table: str
    subject: str
    requirement: str
    condition: str
    problem: str


@dataclasses.dataclass(frozen=True, slots=True)
class MachineTables:
    """What one machine's table module declares (``adapters/<machine>/table.py``,
    ``MACHINE_TABLES``), all the wiring's registry needs of it: the kernel machine, its
    tables in the order a step creates them, its bindings, and the rows that forbid
    removing its steps. Its schema steps are the ones its tables name."""

    machine: Machine
    tables: tuple[TableSpec, ...]
    bindings: tuple[Binding, ...]
    retirement_guards: tuple[RetirementGuard, ...] = ()


def schema_history(tables: Iterable[TableSpec]) -> tuple[Step, ...]:
    """Every step these tables name, with the core's own, in the order they apply (by
    number). Raises ValueError (at import: a programmer error) when two steps share a
    name or a number but differ."""
    steps = {LEGACY_STEP, VERSIONS_STEP, *(step for spec in tables for step in spec.steps)}
    for attribute in ("value", "number"):
        seen: dict[object, Step] = {}
        for step in sorted(steps, key=lambda step: (step.number, step.value)):
            other = seen.setdefault(getattr(step, attribute), step)
            if other != step:
                raise ValueError(f"two schema steps share a {attribute}: {other} and {step}")
    return tuple(sorted(steps, key=lambda step: step.number))
