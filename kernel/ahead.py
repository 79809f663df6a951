"""Deciding ahead: one decision that holds for a whole window of database time.

Theory of operation
-------------------
A write normally costs a lock, a clock read after the lock, the kernel's decision and a
compare-and-set. To fit it in one statement, the kernel decides *before* the statement,
from the record the caller last saw, and says for which database times its decision
holds: :func:`decide_ahead` returns the decision, a validity window
``[not_before_us, not_after_us)`` and, for every instant field of the new record that
depends on the time (a lease of ``now + lease``, a completion time of ``now``), its
offset from the time of the write. The database then locks the row, reads its clock
after the lock, and writes only if the row still equals the record decided on and the
clock lies inside the window; otherwise it answers with the row and the clock, and the
kernel decides again. The adapters check the pre-image and the window generically: no
machine rule is ever spelled in SQL.

The window is derived from the guards themselves, in one place: :class:`Moment`. The
kernel's guards and effects receive the database time as a plain-looking ``int``; when
deciding ahead they receive a :class:`Moment` instead, an ``int`` equal to the reference
time that records every comparison made with it. A comparison ``now < x`` that held at
the reference time means the decision rests on ``now < x``: the window's end becomes
``x``; one that failed means ``now >= x``: the window's start becomes ``x``. Adding a
constant keeps the dependency (``now + lease`` is a Moment with an offset); anything else
that would hide it (multiplying, formatting, subtracting the time from a constant) is
refused, and the caller decides the ordinary way instead. ``tests/kernel/test_ahead.py`` holds
every machine to this: at every instant of the window the ordinary decision equals the
window's decision, and at the edges of the guards' window the guards flip.

A machine may also declare, as data, the guards that read the time
(:class:`~tenure.kernel.core.TimeGuard`: each compares it with one instant of the record)
and the fields each effect moves with it; :func:`decide_windowed` then makes the plain
decision and reads its window from those declarations, with no Moment at all (the hot
path: the queue declares them). The instrumented :func:`decide_ahead` stays the
reference: tests/kernel/test_ahead.py holds every declaring machine's decisions,
windows and offsets equal to it.

Decisions are total and pure as ever: this module reads no clock. The window is also
bounded to ``reference +- span_us`` (a decision made far ahead is not worth keeping) and
the new record must keep the machine's record invariants at both ends of the window;
every invariant compares instants that move with the time at the same rate or not at
all, so holding at both ends means holding throughout (the property test checks inside
too).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from tenure.model.bounds import is_instant

from .core import Applied, Decision, KeptLater, Machine, MovingField, Refused, SetOnce, replaced, select_rule, slots_of

__all__ = ["Moment", "Window", "Ahead", "AheadUnsupported", "decide_ahead", "decide_windowed", "moved", "at_path",
           "DEFAULT_SPAN_US", "kept_throughout", "moving_offsets", "orders_kept"]

DEFAULT_SPAN_US = 600_000_000
"""How far from the reference time a decision made ahead may be used: ten minutes."""


class AheadUnsupported(Exception):
    """The decision used the time in a way a window cannot describe; decide the ordinary way."""


class Window:
    """The database times ``[start, end)`` for which every comparison seen so far holds."""

    __slots__ = ("start", "end")

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end

    def at_least(self, instant: int) -> None:
        if instant > self.start:
            self.start = instant

    def before(self, instant: int) -> None:
        if instant < self.end:
            self.end = instant


def _unsupported(*_: object) -> Any:
    raise AheadUnsupported


class Moment(int):
    """The database time ``now + offset`` as seen while deciding ahead: an ``int`` whose
    value is the reference time plus ``offset``, recording every comparison in ``window``.

    Only comparisons, adding or subtracting a plain integer, and subtracting another
    Moment (a duration, which no longer depends on the time) are allowed.
    """

    offset: int
    window: Window

    def __new__(cls, value: int, offset: int, window: Window) -> Moment:
        moment = super().__new__(cls, value)
        moment.offset = offset
        moment.window = window
        return moment

    def _threshold(self, other: object) -> int | None:
        """``now`` compared with ``other - offset``; None when no constraint arises."""
        if type(other) is not int:
            return None
        return other - self.offset

    # now + offset < other  <=>  now < other - offset
    def __lt__(self, other: object) -> bool:
        if isinstance(other, Moment):
            return self.offset < other.offset
        threshold = self._threshold(other)
        if threshold is None:
            return NotImplemented
        holds = int(self) < other  # type: ignore[operator]
        (self.window.before if holds else self.window.at_least)(threshold)
        return holds

    def __le__(self, other: object) -> bool:
        if isinstance(other, Moment):
            return self.offset <= other.offset
        threshold = self._threshold(other)
        if threshold is None:
            return NotImplemented
        holds = int(self) <= other  # type: ignore[operator]
        (self.window.before if holds else self.window.at_least)(threshold + 1)
        return holds

    def __gt__(self, other: object) -> bool:
        if isinstance(other, Moment):
            return self.offset > other.offset
        threshold = self._threshold(other)
        if threshold is None:
            return NotImplemented
        holds = int(self) > other  # type: ignore[operator]
        (self.window.at_least if holds else self.window.before)(threshold + 1)
        return holds

    def __ge__(self, other: object) -> bool:
        if isinstance(other, Moment):
            return self.offset >= other.offset
        threshold = self._threshold(other)
        if threshold is None:
            return NotImplemented
        holds = int(self) >= other  # type: ignore[operator]
        (self.window.at_least if holds else self.window.before)(threshold)
        return holds

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Moment):
            return self.offset == other.offset
        threshold = self._threshold(other)
        if threshold is None:
            return False
        holds = int(self) == other
        if holds:
            self.window.at_least(threshold)
            self.window.before(threshold + 1)
        elif threshold < int(self) - self.offset:
            self.window.at_least(threshold + 1)
        else:
            self.window.before(threshold)
        return holds

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = int.__hash__

    def __int__(self) -> int:
        return int.__int__(self)

    def __add__(self, other: object) -> Moment:
        if type(other) is not int:
            raise AheadUnsupported
        return Moment(int(self) + other, self.offset + other, self.window)

    __radd__ = __add__

    def __sub__(self, other: object) -> Any:
        if isinstance(other, Moment):
            return self.offset - other.offset
        if type(other) is not int:
            raise AheadUnsupported
        return Moment(int(self) - other, self.offset - other, self.window)

    # Anything else would carry the time into a value that no longer shows it.
    __rsub__ = __mul__ = __rmul__ = __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = _unsupported
    __mod__ = __rmod__ = __divmod__ = __rdivmod__ = __pow__ = __rpow__ = __neg__ = __pos__ = _unsupported
    __abs__ = __invert__ = __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _unsupported
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = __index__ = __float__ = __round__ = _unsupported
    __trunc__ = __floor__ = __ceil__ = __str__ = __format__ = __bool__ = _unsupported

    def __repr__(self) -> str:
        return f"Moment(now{self.offset:+d})"


@dataclasses.dataclass(frozen=True, slots=True)
class Ahead:
    """A decision that holds for every database time in ``[not_before_us, not_after_us)``.

    ``decision`` is the decision at the reference time. ``relative`` names each field of
    the new record that moves with the time, with its offset: at time ``t`` the field is
    ``t + offset``; every other field is as in ``decision``. ``rule_not_before_us`` /
    ``rule_not_after_us`` are the window the guards alone imply (the effect and the
    invariants may narrow it further, never widen it). ``invariants_checked``: the new
    record was held to the machine's record invariants at both ends of the window (so
    throughout it; done whenever a field moves with the time): the caller need not check
    it again.
    """

    decision: Decision
    not_before_us: int
    not_after_us: int
    relative: Mapping[str, int]
    rule_not_before_us: int
    rule_not_after_us: int
    invariants_checked: bool = False

    def at(self, now_us: int) -> Decision:
        """The decision at ``now_us`` (which must lie in the window)."""
        decision = self.decision
        if not self.relative or not isinstance(decision, Applied) or decision.new_record is None:
            return decision
        return Applied(moved(decision.new_record, self.relative, now_us), decision.reply)


_FLAT = frozenset({str, int, bool, float, type(None)})
"""Types whose values hold no Moment inside (a Moment is its own type, never one of these)."""


def _plain(value: Any, relative: dict[str, int], old: Any = None, path: str = "") -> Any:
    """``value`` (a decided record) with every Moment field replaced by its value at the
    reference time, noting its offset in ``relative`` under its path: the field's name,
    or, in a record that nests rows (the Run pair: a Run and a tuple of deliveries),
    the names and tuple indexes down to it joined by dots (``run.updated_at_us``,
    ``deliveries.0.claimed_at_us``). Raises AheadUnsupported when a Moment sits
    anywhere else (a list, a mapping). A field that still holds the very object of
    ``old`` (the record decided on, read from the database: it holds no Moment) is not
    looked into."""
    if value is None or not dataclasses.is_dataclass(value):
        return value
    carried = old is not None and type(old) is type(value)
    changes: dict[str, Any] = {}
    for name, slot in slots_of(type(value)):
        item = slot.__get__(value)
        before = slot.__get__(old) if carried else None
        if carried and item is before:
            continue
        kind = type(item)
        if kind is Moment:
            relative[path + name] = item.offset
            changes[name] = int(item)
        elif kind in _FLAT or isinstance(item, enum.Enum):
            continue
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            plain = _plain(item, relative, before, f"{path}{name}.")
            if plain is not item:
                changes[name] = plain
        elif kind is tuple and any(dataclasses.is_dataclass(part) for part in item):
            olds = before if type(before) is tuple else ()
            parts = tuple(_plain(part, relative, olds[index] if index < len(olds) else None, f"{path}{name}.{index}.")
                          for index, part in enumerate(item))
            if any(new is not part for new, part in zip(parts, item, strict=True)):
                changes[name] = parts
        elif _holds_moment(item):
            raise AheadUnsupported
    return replaced(value, changes) if changes else value


def moved(record: Any, relative: Mapping[str, int], now_us: int) -> Any:
    """``record`` with each field ``relative`` names (a path, see :func:`_plain`) at
    ``now_us`` plus its offset."""
    flat: dict[str, Any] = {}
    deeper: dict[str, dict[str, int]] = {}
    for path, offset in relative.items():
        head, _, rest = path.partition(".")
        if rest:
            deeper.setdefault(head, {})[rest] = offset
        else:
            flat[head] = now_us + offset
    for head, inner in deeper.items():
        value = getattr(record, head)
        if type(value) is tuple:
            by_index: dict[int, dict[str, int]] = {}
            for path, offset in inner.items():
                index, _, rest = path.partition(".")
                by_index.setdefault(int(index), {})[rest] = offset
            flat[head] = tuple(moved(part, by_index[index], now_us) if index in by_index else part
                               for index, part in enumerate(value))
        else:
            flat[head] = moved(value, inner, now_us)
    return replaced(record, flat)


def _holds_moment(value: Any) -> bool:
    kind = type(value)
    if kind is Moment:
        return True
    if kind in _FLAT or isinstance(value, enum.Enum):
        return False
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_holds_moment(getattr(value, field.name)) for field in dataclasses.fields(value))
    if isinstance(value, tuple):
        return any(_holds_moment(item) for item in value)
    return False


def decide_ahead(
    machine: Machine, record: Any, command: Any, reference_us: int, *, span_us: int = DEFAULT_SPAN_US
) -> Ahead | None:
    """The decision for ``command`` meeting ``record``, valid for a window of database
    time around ``reference_us``; None when the decision cannot be made ahead (it uses the
    time in a way a window cannot describe, or its record would break an invariant
    somewhere in the window): the caller then decides the ordinary way."""
    window = Window(reference_us - span_us, reference_us + span_us)
    now = Moment(reference_us, 0, window)
    try:
        rule = select_rule(machine, record, command, now)
        rule_window = (window.start, window.end)
        decided: Decision
        if isinstance(rule.outcome, str):
            decided = machine.effects[rule.outcome](record, command, now)
        else:
            decided = Refused(rule.outcome)
    except AheadUnsupported:
        return None
    relative: dict[str, int] = {}
    if isinstance(decided, Applied):
        if _holds_moment(decided.reply):
            return None
        try:
            decided = Applied(_plain(decided.new_record, relative, record), decided.reply)
        except AheadUnsupported:
            return None
    if window.start >= window.end:
        return None
    return kept_throughout(machine, record, Ahead(decided, window.start, window.end, relative, *rule_window))


def kept_throughout(machine: Machine, record: Any, ahead: Ahead) -> Ahead | None:
    """``ahead``, its new record held to the machine's record invariants at both ends of
    its window when a field moves with the time (so throughout it: see the module
    docstring); None when it breaks one there that ``record`` did not already break."""
    decided = ahead.decision
    if not (isinstance(decided, Applied) and decided.new_record is not None and ahead.relative):
        return ahead
    for edge in (ahead.not_before_us, ahead.not_after_us - 1):
        at_edge = ahead.at(edge)
        assert isinstance(at_edge, Applied)
        if _breaks_anew(machine, record, at_edge.new_record):
            return None
    return dataclasses.replace(ahead, invariants_checked=True)


def _breaks_anew(machine: Machine, record: Any, new: Any) -> bool:
    """Whether ``new`` breaks a record invariant that ``record``, the record it replaces,
    did not already break (computed only when ``new`` breaks one: the common case has
    none)."""
    broken = set(machine.record_violations(new))
    return bool(broken) and not broken <= (set(machine.record_violations(record)) if record is not None else set())


def at_path(record: Any, path: str) -> Any:
    """The field ``path`` names in ``record`` (a field's name, or names and tuple indexes
    joined by dots: ``deliveries.0.claimed_at_us``, see :data:`~tenure.kernel.core.MovingField`)."""
    if "." not in path:
        return getattr(record, path)
    for step in path.split("."):
        record = record[int(step)] if step.isdigit() else getattr(record, step)
    return record


def decide_windowed(
    machine: Machine, record: Any, command: Any, reference_us: int, *, span_us: int = DEFAULT_SPAN_US
) -> Ahead | None:
    """:func:`decide_ahead` read from declarations instead of instrumented comparisons,
    for a machine that declares the guards that read the time
    (:attr:`~tenure.kernel.core.Machine.time_guards`) and the fields its effects move
    with the time (:attr:`~tenure.kernel.core.Machine.moving_fields`): the plain
    decision at the reference time; its window, where every declared guard tried (those
    that failed before the deciding one, and that one) keeps its answer, that is, where
    the time stays on the same side of each guard's instant, narrowed where a
    :class:`~tenure.kernel.core.KeptLater` field would stop (or start) moving; and each
    moving field's offset from the reference time. None: nothing is declared for this
    machine or for the deciding effect, or the new record breaks an invariant at an edge
    of the window (the caller decides ahead by instrumenting, which finds the same, or
    the ordinary way). tests/kernel/test_ahead.py holds every declaring machine to
    :func:`decide_ahead`: the same decision, window and offsets."""
    time_guards, moving = machine.time_guards, machine.moving_fields
    if time_guards is None or moving is None:
        return None
    start, end = reference_us - span_us, reference_us + span_us
    guards = machine.guards
    for rule in machine.table[(machine.state_of(record), command.kind)]:
        declared = time_guards.get(rule.guard)
        if declared is not None and record is not None:
            instant = at_path(record, declared.field)
            if instant is not None:
                if reference_us < instant:
                    end = min(end, instant)
                else:
                    start = max(start, instant)
        if guards[rule.guard](record, command, reference_us):
            break
    else:
        raise AssertionError("every rule list ends with an 'always' guard")
    outcome = rule.outcome
    if not isinstance(outcome, str):
        return Ahead(Refused(outcome), start, end, {}, start, end)
    fields = moving.get(outcome)
    if fields is None:
        return None
    decided = machine.effects[outcome](record, command, reference_us)
    new = decided.new_record
    moved_by = moving_offsets(fields, record, new, reference_us, start, end) if new is not None else ({}, start, end)
    if moved_by is None:
        return None
    relative, not_before, not_after = moved_by
    ahead = Ahead(decided, not_before, not_after, relative, start, end)
    if not relative or not machine.invariants_see_moving_fields_by_bounds:
        return kept_throughout(machine, record, ahead)
    # The invariants see the moving fields only through their bounds and the declared
    # orders: checked once, at the reference time, with each moving field's bounds and
    # each order at both edges of the window (so throughout it, see Machine.moving_field_orders).
    edges = (not_before, not_after - 1)
    if any(not is_instant(edge + offset) for offset in relative.values() for edge in edges):
        return None
    if not orders_kept(machine.moving_field_orders, new, relative, reference_us, edges):
        return kept_throughout(machine, record, ahead)  # an order flips inside the window: check both edges whole
    if _breaks_anew(machine, record, new):
        return None
    return Ahead(decided, not_before, not_after, relative, start, end, invariants_checked=True)


def orders_kept(
    orders: tuple[tuple[str, str], ...], new: Any, relative: Mapping[str, int], reference_us: int,
    edges: tuple[int, int],
) -> bool:
    """Whether each declared order (``first <= second``) of ``new``, decided at
    ``reference_us``, says the same at both ``edges`` as at the reference time (a field
    ``relative`` names at the edge plus its offset, any other as decided)."""
    for first, second in orders:
        at_reference = (at_path(new, first), at_path(new, second))
        if at_reference[0] is None or at_reference[1] is None:
            continue  # an unset time is unset at every edge: the order is not compared
        holds = at_reference[0] <= at_reference[1]
        for edge in edges:
            shift = edge - reference_us
            low = at_reference[0] + shift if first in relative else at_reference[0]
            high = at_reference[1] + shift if second in relative else at_reference[1]
            if (low <= high) is not holds:
                return False
    return True


def moving_offsets(
    fields: tuple[MovingField, ...], record: Any, new: Any, reference_us: int, start: int, end: int
) -> tuple[dict[str, int], int, int] | None:
    """Each declared field of ``new`` that moves with the time here, with its offset from
    the reference time, and the window ``[start, end)`` narrowed to where each
    :class:`~tenure.kernel.core.KeptLater` field keeps moving (or keeps its value). None:
    a field declared as moving is not a time here (decide by instrumenting)."""
    relative: dict[str, int] = {}
    for field in fields:
        if isinstance(field, str):
            path = field
        else:
            path = field.field
            before = None if record is None else at_path(record, path)
            if type(field) is SetOnce:
                if before is not None:
                    continue  # kept: the record decided on has it already
            elif type(field) is KeptLater and before is not None:
                # ``now > before`` decided whether the field moves: the decision holds on that side.
                if reference_us > before:
                    start = max(start, before + 1)
                else:
                    end = min(end, before + 1)
                    continue
        try:
            instant = at_path(new, path)
        except (IndexError, AttributeError):
            return None
        if type(instant) is not int:
            return None  # declared as moving, yet not a time here: decide by instrumenting
        relative[path] = instant - reference_us
    return relative, start, end
