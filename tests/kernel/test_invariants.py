"""Record invariants declared as data (tenure.kernel.core.Invariants): checking a new
record on the fields a decision changed answers what the whole check answers.

``kept_where_changed(old, new)`` is a shortcut the compiled deciders and the engine
take before the whole check: True must mean ``new`` breaks no invariant ``old`` kept.
The property below changes records (kept and broken, from the queue's own strategy)
in a few fields, to values of every kind (of the right type and not, in bounds and
not, equal but not identical), and holds every True to the whole check; broken
versions of the shortcut (rules read from no field, a bound checked on the new value
alone, fields compared by equality) are caught by it. A rule's fields are read from its
code, so a rule must hand its record to nothing but attribute reads: held here too."""

from __future__ import annotations

import dataclasses
import dis
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from tenure.conformance.strategies import queues
from tenure.kernel.core import Bound, Invariants
from tenure.kernel.queue.machine import QUEUE
from tenure.kernel.queue.record import MAX_INSTANT_US, MIN_INSTANT_US, QueueRow, record_violations
from tenure.model import bounds

FIELDS = tuple(field.name for field in dataclasses.fields(QueueRow))

ODD_VALUES = (None, True, False, 0, 1, 0.0, 1.0, -1, 2, 10**20, -(10**20), "", "x", "x" * 300, (), ("a",), (1,))
"""Values of every kind a field might be changed to: bools beside the ints equal to them
(``True == 1``, ``0.0 == 0``: equal yet of another type), out-of-range numbers,
over-long text."""


def _invariant_machines() -> list[Any]:
    return [machine for machine in (QUEUE,) if isinstance(machine.record_violations, Invariants)]


def _rebuilt(value: Any) -> Any:
    """``value`` as a new object where the type allows (large ints, longer text)."""
    if type(value) is int:
        return value + 1 - 1
    if type(value) is str:
        return (value + "a")[:-1]
    return value


@st.composite
def changes(draw: st.DrawFn) -> tuple[QueueRow, QueueRow]:
    """A queue record (kept, or with one or two fields already odd or taken from another
    record: a bound or a rule broken) and that record with up to four fields changed:
    often one it broke mended, the others to another record's value of the field, an
    odd value, an equal value built anew, or a bool for an equal int."""
    old = draw(queues.records().filter(lambda record: record is not None))
    other = draw(queues.records().filter(lambda record: record is not None))
    changed: dict[str, Any] = {}
    if draw(st.booleans()):  # a record that already breaks something: a bound, a rule, or both
        kept = old
        spoiled = draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=2, unique=True))
        # another record's value (in bounds, perhaps breaking a rule) as often as an odd one
        old = dataclasses.replace(old, **{field: draw(st.one_of(st.just(getattr(other, field)), st.sampled_from(ODD_VALUES)))
                                          for field in spoiled})
        if draw(st.booleans()):  # the change mends one of them
            mended = draw(st.sampled_from(spoiled))
            changed[mended] = getattr(kept, mended)
    for field in draw(st.lists(st.sampled_from(FIELDS), min_size=0 if changed else 1, max_size=3, unique=True)):
        value = getattr(old, field)
        changed[field] = draw(st.sampled_from([
            getattr(other, field), draw(st.sampled_from(ODD_VALUES)),
            # equal, not identical (a new object): equality alone must not count as unchanged
            _rebuilt(value),
            True if value == 1 and type(value) is int else value,
            False if value == 0 and type(value) is int else value,
        ]))
    return old, dataclasses.replace(old, **changed)


def _claims_wrongly(invariants: Invariants, pair: tuple[QueueRow, QueueRow]) -> bool:
    """``invariants`` says the change broke nothing new, and the whole check disagrees."""
    old, new = pair
    try:
        kept = invariants.kept_where_changed(old, new)
    except Exception:  # noqa: BLE001 - a shortcut that raises is broken too
        return True
    return kept and not set(record_violations(new)) <= set(record_violations(old))


@settings(max_examples=1_000, suppress_health_check=[HealthCheck.too_slow])
@given(pair=changes())
def test_a_change_the_shortcut_passes_breaks_nothing_the_record_kept(pair: tuple[QueueRow, QueueRow]) -> None:
    assert not _claims_wrongly(record_violations, pair)


def test_the_shortcut_passes_and_refuses_changes_both_kept_and_broken() -> None:
    """The property is not vacuous: the shortcut passes kept changes, refuses changes
    that break an invariant, and refuses some the whole check accepts (then it runs)."""
    seen: set[tuple[bool, bool]] = set()

    @settings(max_examples=600, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(pair=changes())
    def meet(pair: tuple[QueueRow, QueueRow]) -> None:
        old, new = pair
        whole = set(record_violations(new)) <= set(record_violations(old))
        seen.add((record_violations.kept_where_changed(old, new), whole))

    meet()
    assert seen == {(True, True), (False, False), (False, True)}


class _ReadingNoField(Invariants):
    def _reads(self, rule: Any) -> frozenset[str]:
        return frozenset()


class _NewValueOnly(Invariants):
    def _old_checked(self) -> bool:
        return False


class _ByEquality(Invariants):
    def _changed(self, new: str, old: str) -> str:
        return f"{new} != {old}"


SHORTCUT_MUTANTS = {
    "rules read from no field": _ReadingNoField,
    "a changed field's bound checked on its new value only": _NewValueOnly,
    "fields compared by equality, not identity": _ByEquality,
}


@pytest.mark.parametrize("mutant", sorted(SHORTCUT_MUTANTS))
def test_a_broken_shortcut_is_caught_by_the_property(mutant: str) -> None:
    sound = record_violations
    broken = SHORTCUT_MUTANTS[mutant](sound.bounds_name, sound.bounds, sound.rules)
    assert broken.sources[1] != sound.sources[1], "the mutant changes the generated check"
    try:
        find(changes(), lambda pair: _claims_wrongly(broken, pair),
             settings=settings(max_examples=3_000, database=None, phases=[Phase.generate], suppress_health_check=[HealthCheck.too_slow]))
    except NoSuchExample:
        pytest.fail(f"the property missed the broken shortcut: {mutant}")


@pytest.mark.parametrize("machine", _invariant_machines(), ids=lambda machine: machine.name)
def test_every_rule_hands_its_record_to_attribute_reads_alone(machine: Any) -> None:
    """A rule's fields are the names its code loads; a rule passing its record to a
    function (or keeping it in another name) would read fields no one sees."""
    for name, rule in machine.record_violations.rules.items():
        code = rule.__code__
        assert code.co_argcount == 1 and not code.co_cellvars and not code.co_freevars, name
        instructions = list(dis.get_instructions(code))
        argument = code.co_varnames[0]
        for at, instruction in enumerate(instructions):
            if instruction.opname.startswith("LOAD_FAST") and instruction.argval == argument:
                assert instructions[at + 1].opname in ("LOAD_ATTR", "LOAD_METHOD"), f"{name} hands its record on"
            assert not (instruction.opname.startswith("STORE") and instruction.argval == argument), name


@pytest.mark.parametrize("machine", _invariant_machines(), ids=lambda machine: machine.name)
def test_every_field_has_a_bound_and_every_rule_reads_some(machine: Any) -> None:
    invariants = machine.record_violations
    assert set(invariants.bounds) == set(FIELDS)
    read = {rule for readers in invariants.readers.values() for rule in readers}
    assert read == set(invariants.rules)
    # INV-Q2 reads the lease: a heartbeat's renewed lease is checked against it.
    assert "INV-Q2" in invariants.readers["lease_expires_at_us"]


BOUND_VALUES = (None, True, False, 0, 1, -1, 2, 2**31, 2**63, MIN_INSTANT_US - 1, MIN_INSTANT_US, MAX_INSTANT_US,
                MAX_INSTANT_US + 1, 1.0, "", "x", "x" * 36, "x" * 37, "x" * 300, (), ("a",), (None, "a"), (1,), b"x")


@pytest.mark.parametrize("optional", [False, True])
def test_each_bound_written_inline_answers_what_the_models_bounds_answer(optional: bool) -> None:
    """The generated checks inline each :class:`Bound` (its ``expression``): every kind
    agrees with the model's own bound functions on values of every kind."""
    cases = [
        (Bound("text", optional=optional, high=36), lambda value: bounds.is_bounded_text(value, 36)),
        (Bound("str", optional=optional), lambda value: type(value) is str),
        (Bound("int", optional=optional, low=0), lambda value: bounds.is_strict_int(value) and value >= 0),
        (Bound("int", optional=optional, low=1, high=bounds.INT32_MAX),
         lambda value: bounds.is_strict_int(value) and 1 <= value <= bounds.INT32_MAX),
        (Bound("instant", optional=optional), bounds.is_instant),
        (Bound("type", optional=optional, of=bool), lambda value: type(value) is bool),
        (Bound("test", optional=optional, test=bounds.is_identity), bounds.is_identity),
    ]
    for bound, model in cases:
        for value in BOUND_VALUES:
            expected = (value is None and optional) or model(value)
            assert bound(value) is expected, (bound, value)
            # and as the generated whole check writes it, inside a record
            assert (Invariants("B", {"field": bound}, {})(_Holder(value)) == []) is expected, (bound, value)


@dataclasses.dataclass
class _Holder:
    field: Any


def test_the_declared_invariants_are_read_only() -> None:
    with pytest.raises(TypeError):
        record_violations.rules["INV-Q2"] = lambda record: True  # type: ignore[index]
    with pytest.raises(TypeError):
        record_violations.bounds["status"] = lambda value: True  # type: ignore[index]
