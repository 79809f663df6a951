"""The shared core of every machine: rows, rules, decisions, finders, and ``decide``.

Theory of operation
-------------------
A machine is a table keyed by ``(state, command type)``. Each key holds an ordered list
of rules; the first rule whose guard holds decides, and the last guard of every list is
``always``, so the table is total. A rule either applies a named effect (a pure
function of record, command and database time producing the new record and a reply) or
refuses with a named reason; a refusal changes nothing. What each refusal means to a
caller (a negative answer, or an error code) is part of the machine too.

The table is written as a literal tuple of :class:`Row` values that mirrors the spec
table row for row (one row may list several source states, as the spec does);
:func:`table_from_rows` turns it into the lookup table and refuses a table that is not
total. :class:`Finder` values say, as data, which stored rows a command may meet: the
adapters compile them to SQL and tests hold each to exactly the rows its kernel guard
accepts.

Nothing here reads a clock, a random source or a database; everything is total.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from tenure.model import ErrorCode, bounds

__all__ = [
    "SAME",
    "Row",
    "Rule",
    "Applied",
    "Refused",
    "Decision",
    "Machine",
    "Invariants",
    "Bound",
    "fields_loaded",
    "Guard",
    "Effect",
    "table_from_rows",
    "select_rule",
    "decide",
    "Param",
    "Condition",
    "Finder",
    "Rewrite",
    "TimeGuard",
    "KeptLater",
    "SetOnce",
    "MovingField",
    "Change",
    "SetValue",
    "FromCommand",
    "Increment",
    "AtTime",
    "replaced",
    "copier_source",
    "slots_of",
    "Declarations",
    "DECLARATION_CHANGES",
]

R = TypeVar("R")

K = TypeVar("K")
V = TypeVar("V")

DECLARATION_CHANGES = [0]
"""How many times any :class:`Declarations` mapping was changed since import (one counter
for every machine): what was generated from declarations (compiled deciders) is kept with
the count it was generated at, and generated again once the count moved."""


class Declarations(dict[K, V]):
    """A machine's declarations (its table, guards, effects, time guards, moving fields) as
    a dict that counts every change in :data:`DECLARATION_CHANGES`. Reads are a dict's.
    A deliberately broken kernel in the tests patches these in place, at any time
    (``monkeypatch.setitem``); the count lets the compiled deciders see the patch, so a
    broken kernel is never hidden behind a function generated from the sound one."""

    __slots__ = ()

    def __setitem__(self, key: K, value: V) -> None:
        DECLARATION_CHANGES[0] += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: K) -> None:
        DECLARATION_CHANGES[0] += 1
        super().__delitem__(key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        DECLARATION_CHANGES[0] += 1
        super().update(*args, **kwargs)

    def pop(self, *args: Any) -> Any:
        DECLARATION_CHANGES[0] += 1
        return super().pop(*args)

    def popitem(self) -> tuple[K, V]:
        DECLARATION_CHANGES[0] += 1
        return super().popitem()

    def setdefault(self, key: K, default: Any = None) -> Any:
        DECLARATION_CHANGES[0] += 1
        return super().setdefault(key, default)

    def clear(self) -> None:
        DECLARATION_CHANGES[0] += 1
        super().clear()

    def __ior__(self, other: Any) -> Declarations[K, V]:  # type: ignore[override,misc]
        DECLARATION_CHANGES[0] += 1
        super().__ior__(other)
        return self


def fields_loaded(code: types.CodeType) -> frozenset[str]:
    """Every attribute and global name ``code`` (and any function or comprehension nested
    in it) loads: a superset of the fields a rule of :class:`Invariants` reads."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= fields_loaded(constant)
    return frozenset(names)


@dataclasses.dataclass(frozen=True)
class Bound:
    """One field's type and bound, as data: a test of the field's value alone, which
    :class:`Invariants` writes inline. ``kind``: ``text`` (a nonempty ``str`` of at most
    ``high`` characters, as :func:`tenure.model.bounds.is_bounded_text`), ``str`` (any
    ``str``), ``int`` (a real ``int``, never a bool, from ``low`` to ``high`` where given),
    ``instant`` (:func:`tenure.model.bounds.is_instant`), ``type`` (exactly of type ``of``)
    or ``test`` (``test(value)``, a function: what the others cannot say). ``optional``:
    None holds too."""

    kind: str
    optional: bool = False
    low: int | None = None
    high: int | None = None
    of: type | None = None
    test: Callable[[Any], bool] | None = None

    def expression(self, value: str, name: str) -> str:
        """The test as a Python expression over the variable ``value``; ``name`` is the
        name the generated code binds this bound's ``of`` or ``test`` to."""
        if self.kind == "text":
            held = f"type({value}) is str and 0 < len({value}) <= {self.high}"
        elif self.kind == "str":
            held = f"type({value}) is str"
        elif self.kind == "int":
            held = " and ".join([f"type({value}) is int", *([f"{self.low} <= {value}"] if self.low is not None else []),
                                 *([f"{value} <= {self.high}"] if self.high is not None else [])])
        elif self.kind == "instant":
            held = f"type({value}) is int and {bounds.MIN_INSTANT_US} <= {value} <= {bounds.MAX_INSTANT_US}"
        elif self.kind == "type":
            held = f"type({value}) is {name}"
        else:
            assert self.kind == "test", f"no bound kind {self.kind!r}"
            held = f"{name}({value})"
        return f"({value} is None or ({held}))" if self.optional else f"({held})"

    def __call__(self, value: Any) -> bool:
        """The test on its own (the generated checks inline :meth:`expression` instead)."""
        return self._holds(value)

    @functools.cached_property
    def _holds(self) -> Callable[[Any], bool]:
        names: dict[str, Any] = {"bound": self.of or self.test}
        exec(f"def holds(value):\n    return {self.expression('value', 'bound')}\n", names)  # noqa: S102 - our own source
        return names["holds"]  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True, eq=False)
class Invariants:
    """A record's invariants as data, called as its ``record_violations``.

    ``bounds``: each field's own type and bound (:class:`Bound`), reported as
    ``<bounds_name>.<field>``; ``rules``: the invariants across fields, by name, each a
    test of the whole record that reads its fields directly (``record.<field>``; the
    record is handed to nothing else, tests/kernel/test_invariants.py holds every rule
    to it), so the fields a rule reads are the field names its code loads
    (:func:`fields_loaded`). The rules are tested only once every bound holds: a rule
    may compare fields that are not even of their type otherwise.

    Both checks are generated from these declarations, as dataclasses writes an
    ``__init__`` (each bound inline, each rule one call; the sources are kept in
    ``sources`` for review): calling the object checks a record whole, and
    :meth:`kept_where_changed` checks a decision on the fields it changed alone, with the
    whole check's answer. Both mappings are read-only: a deliberately broken kernel builds
    another ``Invariants`` (and another machine), so the generated checks never go stale.
    """

    bounds_name: str
    bounds: Mapping[str, Bound]
    rules: Mapping[str, Callable[[Any], bool]]
    readers: Mapping[str, tuple[str, ...]] = dataclasses.field(init=False, repr=False)
    """For each field, the names of the rules that read it (derived from their code)."""
    sources: tuple[str, str] = dataclasses.field(init=False, repr=False)
    """The generated source of the whole check and of :meth:`kept_where_changed`."""
    _whole: Callable[[Any], list[str]] = dataclasses.field(init=False, repr=False)
    _kept: Callable[[Any, Any], bool] = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        bounds = types.MappingProxyType(dict(self.bounds))
        rules = types.MappingProxyType(dict(self.rules))
        reads = {name: self._reads(rule) & bounds.keys() for name, rule in rules.items()}
        readers = types.MappingProxyType({field: tuple(name for name in rules if field in reads[name]) for field in bounds})
        names: dict[str, Any] = {}
        for number, (field, bound) in enumerate(bounds.items()):
            names[f"bound_{number}"] = bound.of or bound.test
        for number, rule in enumerate(rules.values()):
            names[f"rule_{number}"] = rule
        rule_numbers = {name: number for number, name in enumerate(rules)}
        whole = ["def whole(record):", "    broken = []"]
        for number, (field, bound) in enumerate(bounds.items()):
            whole += [f"    value = record.{field}",
                      f"    if not {bound.expression('value', f'bound_{number}')}:",
                      f"        broken.append({f'{self.bounds_name}.{field}'!r})"]
        whole += ["    if broken:", "        return broken"]
        for name, number in rule_numbers.items():
            whole += [f"    if not rule_{number}(record):", f"        broken.append({name!r})"]
        whole.append("    return broken")
        kept = ["def kept(old, new):", "    wanted = 0"]
        for number, (field, bound) in enumerate(bounds.items()):
            mask = sum(1 << rule_numbers[name] for name in readers[field])
            kept += [f"    a = new.{field}", f"    b = old.{field}", f"    if {self._changed('a', 'b')}:",
                     f"        if not {bound.expression('a', f'bound_{number}')}:", "            return False"]
            if self._old_checked():
                kept += [f"        if not {bound.expression('b', f'bound_{number}')}:", "            return False"]
            if mask:
                kept.append(f"        wanted |= {mask}")
        if rule_numbers:
            kept += ["    try:"]
            for number in rule_numbers.values():
                kept += [f"        if wanted & {1 << number} and not rule_{number}(new):", "            return False"]
            kept += ["    except TypeError:  # a rule comparing a field out of its type (a bound old broke): not shown",
                     "        return False"]
        kept.append("    return True")
        sources = ("\n".join(whole) + "\n", "\n".join(kept) + "\n")
        for source in sources:
            exec(compile(source, f"<generated invariants {self.bounds_name}>", "exec"), names)  # noqa: S102 - our own source
        for attribute, value in (("bounds", bounds), ("rules", rules), ("readers", readers), ("sources", sources),
                                 ("_whole", names["whole"]), ("_kept", names["kept"])):
            object.__setattr__(self, attribute, value)

    def _reads(self, rule: Callable[[Any], bool]) -> frozenset[str]:
        """The names a rule loads (the fields it reads among them)."""
        return fields_loaded(rule.__code__)

    def _changed(self, new: str, old: str) -> str:
        """The test that a field changed: not the very same object (see :meth:`kept_where_changed`)."""
        return f"{new} is not {old}"

    def _old_checked(self) -> bool:
        """Whether a changed field's bound is also tested on its old value (always)."""
        return True

    def __call__(self, record: Any) -> list[str]:
        """The invariants ``record`` breaks: the bounds it breaks, else the rules."""
        return self._whole(record)

    def kept_where_changed(self, old: Any, new: Any) -> bool:
        """True when ``new``, ``old`` with some fields changed, breaks no invariant ``old``
        did not already break (what the whole check answers for the pair: ``new``'s
        broken invariants are among ``old``'s). Shown on the changed fields alone: each
        one's bound holds for its old and its new value, and every rule reading one holds
        for ``new``; the fields not changed answer every other test as they did for
        ``old``. A field is unchanged when it holds the very same object (an effect
        builds its record with ``dataclasses.replace``, which keeps every field it is not
        given); a value rebuilt equal only costs its checks. False: not shown this way;
        the caller runs the whole check."""
        return self._kept(old, new)


_SLOTS: dict[type, tuple[tuple[str, Any], ...]] = {}


def slots_of(kind: type) -> tuple[tuple[str, Any], ...]:
    """A slotted record type's slot names with their descriptors, read once per type."""
    slots = _SLOTS.get(kind)
    if slots is None:
        slots = _SLOTS[kind] = tuple((name, getattr(kind, name)) for name in getattr(kind, "__slots__"))
    return slots


def replaced(record: R, changes: Mapping[str, Any]) -> R:
    """``dataclasses.replace`` for a record (a slotted dataclass) on a decision's hot
    path: a copier generated once per record type (:func:`copier_source`) sets every slot
    in one straight line, skipping replace's per-call introspection, ``__init__`` and the
    frozen ``__setattr__`` guard (the new record is not shared until returned). A name in
    ``changes`` that is not a slot raises ``TypeError``, as ``dataclasses.replace`` does."""
    kind = type(record)
    copy = _COPIERS.get(kind)
    if copy is None:
        copy = _COPIERS[kind] = _copier(kind)
    return copy(record, changes)  # type: ignore[no-any-return]


_COPIERS: dict[type, Callable[[Any, Mapping[str, Any]], Any]] = {}


def copier_source(kind: type) -> str:
    """The copier :func:`replaced` runs for ``kind``: every slot set from ``record``, in
    slot order, then each change set by its slot's own setter."""
    lines = ["def copy(record, changes):", "    new = new_of(kind)"]
    lines += [f"    set_{index}(new, record.{name})" for index, (name, _) in enumerate(slots_of(kind))]
    lines += ["    if changes:",
              "        for name, value in changes.items():",
              "            setter = setters.get(name)",
              "            if setter is None:",
              "                raise TypeError(f'{kind.__name__} has no field {name!r}')",
              "            setter(new, value)",
              "    return new", ""]
    return "\n".join(lines)


def _copier(kind: type) -> Callable[[Any, Mapping[str, Any]], Any]:
    slots = slots_of(kind)
    names: dict[str, Any] = {"new_of": object.__new__, "kind": kind,
                             "setters": {name: slot.__set__ for name, slot in slots}}
    names.update((f"set_{index}", slot.__set__) for index, (_, slot) in enumerate(slots))
    exec(compile(copier_source(kind), f"<generated copier {kind.__qualname__}>", "exec"), names)  # noqa: S102 - our own source
    return names["copy"]  # type: ignore[no-any-return]


class _Same(enum.Enum):
    SAME = "same"


SAME = _Same.SAME
"""A row's target when the command keeps the state it met."""


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One row of a spec table: from ``sources``, if ``guard`` holds, go to ``target``
    by ``outcome`` (an effect name, or a refusal)."""

    sources: tuple[enum.Enum, ...]
    command: enum.Enum
    guard: str
    target: enum.Enum
    outcome: str | enum.Enum


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """One rule of a ``(state, command)`` list. A refusal's target is the state it met."""

    guard: str
    target: enum.Enum
    outcome: str | enum.Enum

    @property
    def refusal(self) -> bool:
        return not isinstance(self.outcome, str)


@dataclasses.dataclass(frozen=True, slots=True)
class Applied(Generic[R]):
    """The command applies: persist ``new_record`` (None deletes the row), answer ``reply``."""

    new_record: R | None
    reply: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """Nothing changes; ``reason`` says why."""

    reason: enum.Enum


Decision = Applied[Any] | Refused

Guard = Callable[[Any, Any, int], bool]
Effect = Callable[[Any, Any, int], Applied[Any]]


StateT = TypeVar("StateT", bound=enum.Enum)
CommandT = TypeVar("CommandT", bound=enum.Enum)


def table_from_rows(
    rows: Sequence[Row], states: type[StateT], commands: type[CommandT]
) -> dict[tuple[StateT, CommandT], tuple[Rule, ...]]:
    """The lookup table of ``rows``, each ``(state, command)`` list in row order.

    Raises ValueError (at import: a programmer error) unless every pair of a state and
    a command is present and every list ends with an ``always`` guard.
    """
    table: dict[tuple[Any, Any], list[Rule]] = {}
    for row in rows:
        for source in row.sources:
            target = source if row.target is SAME else row.target
            table.setdefault((source, row.command), []).append(Rule(row.guard, target, row.outcome))
    missing = [(state, command) for state in states for command in commands if (state, command) not in table]
    open_ended = [key for key, rules in table.items() if rules[-1].guard != "always"]
    if missing or open_ended:
        raise ValueError(f"the table is not total: missing {missing[:3]}, open-ended {open_ended[:3]}")
    return {key: tuple(rules) for key, rules in table.items()}


# --- rewrites: effects that are a fixed change of fields, as data ------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class SetValue:
    """The field becomes ``value``."""

    value: Any

    def new_value(self, record: Any, field: str, command: Any, now_us: int) -> Any:
        return self.value


@dataclasses.dataclass(frozen=True, slots=True)
class FromCommand:
    """The field becomes the command's ``attribute``."""

    attribute: str

    def new_value(self, record: Any, field: str, command: Any, now_us: int) -> Any:
        return getattr(command, self.attribute)


@dataclasses.dataclass(frozen=True, slots=True)
class Increment:
    """The field grows by ``by``."""

    by: int

    def new_value(self, record: Any, field: str, command: Any, now_us: int) -> Any:
        return getattr(record, field) + self.by


@dataclasses.dataclass(frozen=True, slots=True)
class AtTime:
    """The field becomes the database time, plus the command's ``plus`` attribute (a
    duration in microseconds) when one is named."""

    plus: str | None = None

    def new_value(self, record: Any, field: str, command: Any, now_us: int) -> Any:
        return now_us if self.plus is None else now_us + getattr(command, self.plus)


Change = SetValue | FromCommand | Increment | AtTime


@dataclasses.dataclass(frozen=True, slots=True)
class Rewrite:
    """An effect that sets each named field as its :data:`Change` says and keeps every
    other field. ``apply`` is the effect; adapters may also spell it in SQL."""

    name: str
    changes: tuple[tuple[str, Change], ...]
    _hash: int = dataclasses.field(init=False, repr=False, compare=False)
    """The hash, computed once (see :class:`Finder`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.name, self.changes)))

    def __hash__(self) -> int:
        return self._hash

    def apply(self, record: Any, command: Any, now_us: int, replace: Callable[..., Any]) -> Any:
        """The rewritten record (``replace(record, **fields)`` builds it)."""
        return replace(record, **{
            field: change.new_value(record, field, command, now_us) for field, change in self.changes
        })


@dataclasses.dataclass(frozen=True, slots=True)
class TimeGuard:
    """A guard that reads the database time, as data: it compares the time with one
    instant ``field`` of the record. ``holds_before`` True: the guard holds exactly when
    the field is set and ``now < field``; False: exactly when it is unset or
    ``now >= field``. A decision therefore keeps while the time stays on the same side
    of the field: the window a decision holds for is read from these declarations (see
    :func:`tenure.kernel.ahead.decide_windowed`); tests/kernel/test_ahead.py holds them
    to the guards themselves. ``field`` is a path (see :data:`MovingField`) in a record
    that nests rows."""

    field: str
    holds_before: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class KeptLater:
    """A moving field (see :attr:`Machine.moving_fields`) an effect sets to the later of
    the time and the field's value in the record decided on (a time that never moves
    backwards, a Run's ``updated_at``: ``now if now > old else old``): while the time
    is after that value the field moves with it, otherwise it keeps the value; a
    decision made ahead holds on one side of that value only, so the window ends (or
    starts) there. ``field`` is a path like :attr:`TimeGuard.field`'s."""

    field: str


@dataclasses.dataclass(frozen=True, slots=True)
class SetOnce:
    """A moving field an effect sets to the time only when the record decided on has
    none (a Run's first start, kept across hops): it moves with the time then and keeps
    its value otherwise."""

    field: str


MovingField = str | KeptLater | SetOnce
"""A field an effect sets from the time: a path (always ``now + offset``), a
:class:`KeptLater` or a :class:`SetOnce`. A path names a field of the record, or, in a
record that nests rows (the Run pair), the names and tuple indexes down to it joined
by dots (``run.updated_at_us``, ``deliveries.0.claimed_at_us``), as
:attr:`tenure.kernel.ahead.Ahead.relative` does."""


@dataclasses.dataclass(frozen=True)
class Machine:
    """Everything the shared engine, the spec checker and the tests need of a machine.

    A machine module declares its rows, guards, effects, outcomes and invariant checks
    and builds the machine with :meth:`define`, which derives the table from the rows
    and refuses an incomplete declaration at import. ``table``, ``guards`` and
    ``effects`` are the machine module's own dictionaries (a deliberately broken kernel
    in the tests patches them in place). ``outcomes`` maps each refusal to the error
    code a caller gets, or None for a negative answer.
    """

    name: str
    states: type[enum.Enum]
    commands: type[enum.Enum]
    rows: tuple[Row, ...]
    table: dict[tuple[Any, Any], tuple[Rule, ...]]
    guards: Mapping[str, Guard]
    effects: Mapping[str, Effect]
    outcomes: Mapping[Any, ErrorCode | None]
    state_of: Callable[[Any], enum.Enum]
    record_violations: Callable[[Any], list[str]]
    transition_violations: Callable[[Any, Any, int, Decision], list[str]]
    initial: enum.Enum
    """The state a missing record is in (``absent``)."""
    rewrites: Mapping[str, Rewrite] = dataclasses.field(default_factory=dict)
    """Effects that are a fixed change of fields (:class:`Rewrite`), by effect name: a
    store may apply one to rows the kernel has not seen yet (a claim in one statement),
    and the effect itself is defined by the same data, so the two cannot differ."""
    time_guards: Mapping[str, TimeGuard] | None = None
    """The guards that read the time (:class:`TimeGuard`), by name; every other guard
    ignores it. None: not declared (decisions ahead are then made by instrumenting the
    comparisons, :func:`tenure.kernel.ahead.decide_ahead`)."""
    moving_fields: Mapping[str, tuple[MovingField, ...]] | None = None
    """For each effect whose new record holds times that move with the database time
    (``now + offset``), those fields (:data:`MovingField`); an effect not listed is not
    declared (its decisions ahead are made by instrumenting). Declared with
    ``time_guards``."""
    invariants_see_moving_fields_by_bounds: bool = False
    """The record invariants read a field that moves with the time only through whether
    it is set and whether it lies within the instant bounds: a decision made ahead then
    needs its invariants checked once (at the reference time) and its moving fields'
    bounds at the window's edges (tests/kernel/test_ahead.py holds a declaring machine
    to it: shifting the moving fields never changes what the invariants say)."""
    moving_field_orders: tuple[tuple[str, str], ...] = ()
    """With ``invariants_see_moving_fields_by_bounds``: the pairs of fields (paths, as in
    :data:`MovingField`) whose order ``first <= second`` the invariants also read, where
    a field moves with the time (a Run's ``created_at <= updated_at``). Each side is
    fixed or moves at the time's own rate, so an order that holds (or fails) at both
    edges of a window does so throughout: a decision made ahead is then checked once at
    the reference time, with each order and each moving field's bounds at both edges
    (tests/kernel/test_ahead.py holds a declaring machine to it: shifting the moving
    fields changes what the invariants say only where a bound or a declared order
    changes)."""
    compiled: tuple[enum.Enum, ...] = ()
    """The commands whose decisions made ahead run as compiled deciders
    (:func:`tenure.kernel.compiled.decider_of`, generated from these declarations on first
    use); every other command is decided by the generic interpreter."""
    deciders: dict[enum.Enum, tuple[int, Any]] = dataclasses.field(default_factory=dict, init=False, compare=False,
                                                                   repr=False)
    """The compiled deciders generated so far, by command, each with the
    :data:`DECLARATION_CHANGES` count it was generated at (:func:`tenure.kernel.compiled.decider_of`'s cache)."""

    @classmethod
    def define(
        cls, *, name: str, states: type[enum.Enum], commands: type[enum.Enum], rows: tuple[Row, ...],
        guards: Mapping[str, Guard], effects: Mapping[str, Effect], outcomes: Mapping[Any, ErrorCode | None],
        state_of: Callable[[Any], enum.Enum], record_violations: Callable[[Any], list[str]],
        transition_violations: Callable[[Any, Any, int, Decision], list[str]], initial: enum.Enum,
        rewrites: Mapping[str, Rewrite] | None = None, time_guards: Mapping[str, TimeGuard] | None = None,
        moving_fields: Mapping[str, tuple[MovingField, ...]] | None = None, invariants_see_moving_fields_by_bounds: bool = False,
        moving_field_orders: tuple[tuple[str, str], ...] = (), compiled: tuple[enum.Enum, ...] = (),
    ) -> Machine:
        """The machine of these declarations. Raises ValueError (at import: a programmer
        error) unless the rows make a total table (:func:`table_from_rows`), every guard
        and effect a row names is declared, every refusal a row gives has an outcome,
        and every rewrite is the effect of the same name."""
        table = Declarations(table_from_rows(rows, states, commands))
        named_guards = {row.guard for row in rows}
        named_effects = {row.outcome for row in rows if isinstance(row.outcome, str)}
        refusals = {row.outcome for row in rows if not isinstance(row.outcome, str)}
        problems = [
            *(f"guard {guard!r} is not declared" for guard in sorted(named_guards - set(guards))),
            *(f"effect {effect!r} is not declared" for effect in sorted(named_effects - set(effects))),
            *(f"refusal {refusal} has no outcome" for refusal in refusals if refusal not in outcomes),
            *(f"rewrite {effect!r} is no effect" for effect in sorted(set(rewrites or {}) - set(effects))),
            *(f"time guard {guard!r} is no guard" for guard in sorted(set(time_guards or {}) - set(guards))),
            *(f"moving fields of {effect!r}: no such effect" for effect in sorted(set(moving_fields or {}) - set(effects))),
            *(["moving field orders need the invariants to see moving fields by bounds"]
              if moving_field_orders and not invariants_see_moving_fields_by_bounds else []),
            *(f"compiled command {kind!r} is no command of this machine" for kind in compiled if kind not in commands),
            *(["compiled commands need the time guards and moving fields declared"]
              if compiled and (time_guards is None or moving_fields is None) else []),
            *(["compiled commands need guards, effects, time guards and moving fields in Declarations mappings "
               "(a patch must reach the compiled deciders)"]
              if compiled and not all(isinstance(d, Declarations) for d in (guards, effects, time_guards, moving_fields))
              else []),
        ]
        if problems:
            raise ValueError(f"machine {name}: " + "; ".join(problems))
        return cls(name=name, states=states, commands=commands, rows=rows, table=table, guards=guards,
                   effects=effects, outcomes=outcomes, state_of=state_of, record_violations=record_violations,
                   transition_violations=transition_violations, initial=initial, rewrites=rewrites or {},
                   time_guards=time_guards, moving_fields=moving_fields,
                   invariants_see_moving_fields_by_bounds=invariants_see_moving_fields_by_bounds,
                   moving_field_orders=moving_field_orders, compiled=tuple(compiled))

    @property
    def folder(self) -> str:
        """The machine's folder, ``kernel/<folder>/`` (and ``adapters/<folder>/``): the
        package whose ``record`` module defines its states."""
        return self.states.__module__.split(".")[-2]

    def select_rule(self, record: Any, command: Any, now_us: int) -> Rule:
        """:func:`select_rule` on this machine."""
        return select_rule(self, record, command, now_us)

    def decide(self, record: Any, command: Any, now_us: int) -> Decision:
        """:func:`decide` on this machine."""
        return decide(self, record, command, now_us)


def select_rule(machine: Machine, record: Any, command: Any, now_us: int) -> Rule:
    """The first rule of the ``(state, command)`` list whose guard holds (exposed so the
    spec oracle and the tests can see which row decided, not only what it produced)."""
    guards = machine.guards
    for rule in machine.table[(machine.state_of(record), command.kind)]:
        if guards[rule.guard](record, command, now_us):
            return rule
    raise AssertionError("every rule list ends with an 'always' guard")


def decide(machine: Machine, record: Any, command: Any, now_us: int) -> Decision:
    """The decision for ``command`` meeting ``record`` at database time ``now_us``."""
    rule = select_rule(machine, record, command, now_us)
    if isinstance(rule.outcome, str):
        return machine.effects[rule.outcome](record, command, now_us)
    return Refused(rule.outcome)


# --- finders: which stored rows a command may meet, as data -----------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Param:
    """A value the caller supplies when the finder runs (``now``, a token, ...)."""

    name: str


# As in SQL, a comparison with NULL (None) on either side never holds.
_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda value, operand: value is not None and operand is not None and value == operand,
    "<": lambda value, operand: value is not None and operand is not None and value < operand,
    "<=": lambda value, operand: value is not None and operand is not None and value <= operand,
    ">": lambda value, operand: value is not None and operand is not None and value > operand,
    ">=": lambda value, operand: value is not None and operand is not None and value >= operand,
    "in": lambda value, operand: value is not None and value in operand,
    "is_null": lambda value, operand: value is None,
    "not_null": lambda value, operand: value is not None,
}


@dataclasses.dataclass(frozen=True, slots=True)
class Condition:
    """``field <op> operand`` over a record field; the operand is a constant or a Param.
    Operators: ``=`` ``<`` ``<=`` ``>`` ``>=`` ``in`` ``is_null`` ``not_null``; as in SQL, a
    comparison never holds when either side is None."""

    field: str
    op: str
    operand: Any = None
    other_field: str | None = None
    """Compare with another field of the same record instead (``attempts < max_attempts``)."""

    def holds(self, record: Any, parameters: Mapping[str, Any]) -> bool:
        operand = self.operand
        if self.other_field is not None:
            operand = getattr(record, self.other_field)
        elif isinstance(operand, Param):
            operand = parameters[operand.name]
        return _OPERATORS[self.op](getattr(record, self.field), operand)


@dataclasses.dataclass(frozen=True, slots=True)
class Finder:
    """Rows meeting every condition of one of ``any_of`` (a disjunction of conjunctions),
    in ``order`` (field names; ties broken by the fields that follow). ``lock`` says how
    a store takes the rows: ``wait`` (lock, waiting for other holders; the clock is read
    after), ``skip`` (lock, skipping rows others hold; never waits), ``touch`` (as ``wait``, and
    write each row unchanged: a concurrent statement whose snapshot predates this
    transaction's commit can tell that the row it then locks is newer than its snapshot)
    or ``none``."""

    name: str
    any_of: tuple[tuple[Condition, ...], ...]
    order: tuple[str, ...] = ()
    """Field names, each ascending, or descending when prefixed with ``-`` (``-priority``)."""
    lock: str = "wait"
    _hash: int = dataclasses.field(init=False, repr=False, compare=False)
    """The hash, computed once: the stores key their built statements by finder, and a
    finder's generated hash walks every condition on every lookup."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.name, self.any_of, self.order, self.lock)))

    def __hash__(self) -> int:
        return self._hash

    def ordering(self) -> tuple[tuple[str, bool], ...]:
        """``order`` as ``(field, descending)`` pairs."""
        return tuple((name[1:], True) if name.startswith("-") else (name, False) for name in self.order)

    def sorted(self, records: Iterable[Any]) -> list[Any]:
        """``records`` in this finder's order (stable: the sorts run from the last field)."""
        result = list(records)
        for field, descending in reversed(self.ordering()):
            result.sort(key=lambda record: getattr(record, field), reverse=descending)
        return result

    def matches(self, record: Any, parameters: Mapping[str, Any]) -> bool:
        return any(all(condition.holds(record, parameters) for condition in conjunction) for conjunction in self.any_of)

    def parameters(self) -> frozenset[str]:
        return frozenset(
            condition.operand.name
            for conjunction in self.any_of
            for condition in conjunction
            if isinstance(condition.operand, Param)
        )
