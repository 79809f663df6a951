"""The generated row reader (tables.generated_reader) reads exactly what the interpreted
one reads: for every binding of every machine, on both databases, with and without a
uuid key's preparation, a row of stored values (each one a value its column holds, a
value of another column or a wrong one) gives the same record from both, or the same
refusal; broken generators (a check dropped, an optional column taken as required, the
parts of a tuple field in the wrong order) are caught by the same comparison."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from tenure.adapters.core import tables
from tenure.adapters.core.tables import POSTGRESQL_DIALECT, SQLITE_DIALECT, Binding, ColumnSpec, Dialect
from tenure.adapters.wiring.registry import BINDINGS
from tenure.model import TenureError

DIALECTS = (SQLITE_DIALECT, POSTGRESQL_DIALECT)
ODD = (None, "", "x", "pending", 0, 1, -1, 2, True, False, 1.5, 10**20, b"bytes", b"\xff", ["list"], (),
       uuid.UUID(int=7), "2026-01-01 00:00:00.000000", "2026-13-01 00:00:00.000000", '{"a":1}', "[1]", '["a","b"]',
       tables.MAX_INSTANT_US, tables.MIN_INSTANT_US, tables.MAX_INSTANT_US + 1)
"""Stored values of every kind: in and out of each codec's type and bounds, SQLite
instant text good and bad, JSON and text-array text, a driver's uuid object."""


def _plausible(column: ColumnSpec, dialect: Dialect) -> list[Any]:
    """Values the column may well hold on ``dialect`` (so most rows read whole)."""
    base = column.codec.base
    values: list[Any] = [None] if column.codec.optional else []
    if base == "enum":
        assert column.choices is not None
        values += [member.value for member in column.choices]
    elif base == "instant":
        values += [dialect.instant_to_stored(micros) for micros in (0, 1_700_000_000_000_000)]
    elif base == "flag":
        values += [True, False, 0, 1]
    elif base == "int":
        values += [0, 3]
    elif base == "texts":
        values += ['["a","b"]', "[]"]
    else:
        values += ["text", '{"a":1}']
    return values


@st.composite
def rows(draw: st.DrawFn, binding: Binding, dialect: Dialect) -> tuple[list[Any], int]:
    """A row of ``binding``'s table from ``offset``: mostly plausible values, some odd."""
    offset = draw(st.integers(0, 2))
    values = ["before"] * offset
    for column in binding.spec.columns:
        choices = _plausible(column, dialect)
        values.append(draw(st.sampled_from(choices)) if draw(st.integers(0, 19)) else draw(st.sampled_from(ODD)))
    return values, offset


def _outcome(read: Any, values: list[Any], offset: int) -> tuple[str, Any]:
    try:
        return "read", read(values, offset)
    except TenureError as error:
        return "refused", (error.code, error.reason)
    except Exception as error:  # noqa: BLE001 - compared: both must fail alike
        return "raised", type(error)


CASES = [(binding, dialect, key_as_text) for binding in BINDINGS for dialect in DIALECTS
         for key_as_text in ((False, True) if dialect is POSTGRESQL_DIALECT else (False,))]


@pytest.mark.parametrize(("binding", "dialect", "key_as_text"), CASES,
                         ids=lambda value: value.name if isinstance(value, (Binding, Dialect)) else str(value))
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_generated_reader_reads_what_the_interpreted_one_reads(
    binding: Binding, dialect: Dialect, key_as_text: bool, data: st.DataObject,
) -> None:
    codec = binding.codec(dialect, key_as_text=key_as_text)
    assert codec.read is not codec.interpreted_read
    values, offset = data.draw(rows(binding, dialect))
    assert _outcome(codec.read, values, offset) == _outcome(codec.interpreted_read, values, offset)


def test_the_rows_drawn_both_read_and_are_refused() -> None:
    """Not vacuous: across the bindings most rows read whole and some are refused."""
    seen: set[str] = set()
    for binding, dialect, _ in CASES[:6]:
        codec = binding.codec(dialect)

        @settings(max_examples=60, database=None, suppress_health_check=[HealthCheck.too_slow])
        @given(row=rows(binding, dialect))
        def meet(row: tuple[list[Any], int]) -> None:
            seen.add(_outcome(codec.read, *row)[0])  # noqa: B023 - run before the loop moves on

        meet()
    assert seen == {"read", "refused"}


READER_MUTANTS = {
    "a required enum column's refusal dropped": lambda source: re.sub(
        r"(v = members_\d+\[v\])\n    else:\n        raise corrupt\(\)", r"\1", source),
    "an optional column taken as required": lambda source: source.replace(
        "if v is not None and type(v) is not str:", "if type(v) is not str:", 1),
    "a tuple field's parts in the wrong order": lambda source: _swap_parts(source),
    "an instant's bounds left out": lambda source: source.replace(
        "not MIN_INSTANT_US <= v <= MAX_INSTANT_US", "False"),
}


def _swap_parts(source: str) -> str:
    """The first two parts of the first tuple field of two or more parts swapped."""
    for line in source.splitlines():
        found = re.search(r"set_tuple_\d+\(record, \((p\d+), (p\d+)", line)
        if found is not None:
            first, second = found.groups()
            return source.replace(line, line.replace(f"({first}, {second}", f"({second}, {first}", 1))
    return source


@pytest.mark.parametrize("mutant", sorted(READER_MUTANTS))
def test_a_broken_reader_generator_is_caught_by_the_comparison(mutant: str) -> None:
    edit = READER_MUTANTS[mutant]
    changed = 0
    for binding, dialect, key_as_text in CASES:
        codec = binding.codec(dialect, key_as_text=key_as_text)
        source = codec.read.__doc__
        broken_source = edit(source)
        if broken_source == source:
            continue
        changed += 1
        names = dict(codec.read.__globals__)
        exec(compile(broken_source, "<broken reader>", "exec"), names)  # noqa: S102 - the test's own edit
        broken = names["read"]
        try:
            find(rows(binding, dialect),
                 lambda row, broken=broken, codec=codec: _outcome(broken, *row) != _outcome(codec.interpreted_read, *row),
                 settings=settings(max_examples=1_000, database=None, phases=[Phase.generate], suppress_health_check=[HealthCheck.too_slow]))
        except NoSuchExample:
            pytest.fail(f"the comparison missed the broken reader ({mutant}) on {binding.name} ({dialect.name})")
        return
    assert changed, f"the mutant edits no reader: {mutant}"


def test_the_generated_source_inlines_the_checks_and_calls_only_the_parsers() -> None:
    binding = next(binding for binding in BINDINGS if binding.name == "queue.validation_jobs")
    postgres = binding.codec(POSTGRESQL_DIALECT).read.__doc__
    sqlite = binding.codec(SQLITE_DIALECT).read.__doc__
    assert "MIN_INSTANT_US <= v <= MAX_INSTANT_US" in postgres and "read_" not in postgres
    assert "read_" in sqlite  # SQLite's instant text is parsed by its reader
