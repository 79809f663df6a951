"""``kernel.core.replaced``, the copy every effect makes of its record, is generated once
per record type (issue 51: "records built once, no ``dataclasses.replace`` on the hot
path"). Held here to ``dataclasses.replace`` on every machine's records: the same fields,
the very same objects where a field is not changed (the changed-field invariant check
relies on identity), a new record each time, the original untouched, an unknown field
refused as ``dataclasses.replace`` refuses it; and a broken copier is caught."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from tenure.conformance.strategies import attempts, consents, messages, nodes, queues, runs
from tenure.kernel import core
from tenure.kernel.core import copier_source, replaced, slots_of
from tenure.kernel.queue.record import QueueRow

KINDS = [
    queues.records(), attempts.attempt_records(), consents.consent_records(), messages.message_records(),
    nodes.node_records(), runs.run_records().map(lambda pair: None if pair is None else pair.run),
    runs.run_records().map(lambda pair: None if pair is None else pair.current),
]
"""A strategy per record type (each may draw None: an absent record)."""

RECORDS = st.one_of(KINDS).filter(lambda record: record is not None)


@st.composite
def records_and_changes(draw: st.DrawFn) -> tuple[Any, dict[str, Any]]:
    """A record and some of its fields given new values: another record's of the same
    type, the same value, None, or a value of another type (a copier checks nothing:
    the invariants do)."""
    kind = draw(st.sampled_from(KINDS))
    record, other = (draw(kind.filter(lambda found: found is not None)) for _ in range(2))
    names = [name for name, _ in slots_of(type(record))]
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    changes: dict[str, Any] = {}
    for name in chosen:
        how = draw(st.sampled_from(("other", "same", "none", "text")))
        changes[name] = {"other": getattr(other, name), "same": getattr(record, name), "none": None, "text": "x"}[how]
    return record, changes


def _same_copy(record: Any, changes: dict[str, Any], copy: Any) -> bool:
    expected = dataclasses.replace(record, **changes)
    return type(copy) is type(record) and copy is not record and all(
        getattr(copy, name) is (changes[name] if name in changes else getattr(record, name))
        and getattr(copy, name) == getattr(expected, name)
        for name, _ in slots_of(type(record)))


@settings(max_examples=300, deadline=None)
@given(records_and_changes())
def test_the_generated_copy_is_what_dataclasses_replace_makes(drawn: tuple[Any, dict[str, Any]]) -> None:
    record, changes = drawn
    before = dataclasses.astuple(record)
    assert _same_copy(record, changes, replaced(record, changes))
    assert dataclasses.astuple(record) == before  # the original is untouched


@settings(max_examples=50, deadline=None)
@given(RECORDS)
def test_an_unknown_field_is_refused_as_dataclasses_replace_refuses_it(record: Any) -> None:
    with pytest.raises(TypeError):
        dataclasses.replace(record, no_such_field=1)
    with pytest.raises(TypeError):
        replaced(record, {"no_such_field": 1})


def test_the_copier_sets_every_slot_in_one_straight_line() -> None:
    source = copier_source(QueueRow)
    assert source.count("(new, record.") == len(dataclasses.fields(QueueRow))
    assert source.count("for ") == 1  # only the changes are looped over


@pytest.mark.parametrize("mutant", ["a slot left unset", "changes set before the copy", "changes ignored"])
def test_a_broken_copier_is_caught(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    original = core.copier_source

    def broken(kind: type) -> str:
        source = original(kind)
        lines = source.split("\n")
        if mutant == "a slot left unset":
            return "\n".join(line for line in lines if "set_1(" not in line)
        if mutant == "changes ignored":
            return source.replace("            setter(new, value)", "            pass")
        copies = [line for line in lines if "(new, record." in line]
        rest = [line for line in lines if line not in copies]
        at = rest.index("    return new")
        return "\n".join(rest[:at] + copies + rest[at:])

    monkeypatch.setattr(core, "copier_source", broken)
    monkeypatch.setattr(core, "_COPIERS", {})

    def caught(drawn: tuple[Any, dict[str, Any]]) -> bool:
        record, changes = drawn
        try:
            return not _same_copy(record, changes, replaced(record, changes))
        except AttributeError:  # a slot left unset, read back
            return True

    find(records_and_changes(), caught, settings=settings(phases=[Phase.generate], max_examples=500, database=None))
