"""Compiled deciders: one straight-line function per (machine, command), generated from
the machine's own declarations.

Theory of operation
-------------------
:func:`tenure.kernel.ahead.decide_windowed` interprets a machine: it looks the
``(state, command)`` rule list up in the table, calls each guard through the guards
mapping, reads the window from the declared :class:`~tenure.kernel.core.TimeGuard`
values, calls the effect, reads the moving fields' offsets from the declared
:data:`~tenure.kernel.core.MovingField` values and holds the new record to the record
invariants. For one command kind every one of those lookups has the same answer on
every call. :func:`source_of` answers them once, as dataclasses answers a class's fields
once to write its ``__init__``, and writes the Python source of one function,
``decide_<command>(record, command, now_us, span_us=DEFAULT_SPAN_US)``, that returns
exactly what ``decide_windowed(machine, record, command, now_us, span_us=span_us)``
returns (the same :class:`~tenure.kernel.ahead.Ahead`: decision, reply, new record,
refusal reason, window, offsets, ``invariants_checked``; or None where it declines):

* the states meeting the command become ``if``/``elif`` branches on ``state_of(record)``
  (states whose rule lists are the same share one branch);
* each state's rules, in table order, become one ``if <guard>: return ...`` each, the
  last (``always``) the fall-through. A guard declared as a
  :class:`~tenure.kernel.core.TimeGuard` is written out from its declaration (the
  record's instant against the time), and the window is narrowed right there, as
  ``decide_windowed`` narrows it for every time guard tried; ``always`` is no test at
  all; every other guard is a call of the machine's own guard function
  (``machine.guards[name]``), so the rules stay the kernel's, never a second copy;
* a refusal returns the window and a shared ``Refused`` (immutable, so one per reason);
* an effect is a call of the machine's own effect function (``machine.effects[name]``);
  its declared moving fields become one read each of the new record, their offsets, and
  the instant bounds at the window's edges; then the record invariants
  (``machine.record_violations``) are checked on every decision ``decide_windowed``
  checks them on, never skipped (a decision whose record moves with no field the
  reference leaves unchecked, ``invariants_checked`` False, for its caller, and so does
  the compiled one). Where the machine declares them as data
  (:class:`~tenure.kernel.core.Invariants`) they are checked first on the fields the
  effect changed, and the whole check runs whenever that does not show nothing new broken. What the declarations cannot say statically (a
  :class:`~tenure.kernel.core.KeptLater` or :class:`~tenure.kernel.core.SetOnce` field,
  a declared order, invariants that see more than bounds) is a call of the same helper
  ``decide_windowed`` calls.

The function is built by ``exec`` of that source in a namespace of named bindings
(:class:`Binding`: the guard, effect, refusal and state objects the source names);
:func:`render` writes the same source, with those bindings spelled as assignments, into
a file reviewers read beside the spec and the SQL renderings (``specs/compiled/``: not
imported at runtime; tests/support/compiled_renderings.py re-renders it, and a test
fails while it is stale). The generic interpreter stays the reference:
tests/kernel/test_compiled.py holds every compiled function equal to ``decide_windowed``
and holds a set of broken generators (a guard dropped, two guards swapped, the window
from the wrong guard, the invariant check left out) to being caught by that equality.

A function compiled from a machine sees the rule lists, time guards and moving fields
as they were when it was generated; guards and effects are bound then too. A machine
patched later (a deliberately broken kernel in the tests) needs its deciders generated
again (:func:`compile_decider`).

Pure and stdlib only: no clock, no I/O; ``exec`` runs only source this module wrote.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any

from tenure.model.bounds import is_instant

from . import ahead
from .ahead import DEFAULT_SPAN_US, Ahead
from .core import DECLARATION_CHANGES, Invariants, Machine, Refused, Rule

__all__ = ["Binding", "Compiled", "compile_decider", "compile_deciders", "decider_of", "render", "source_of",
           "function_name"]

Decider = Callable[..., Ahead | None]


@dataclasses.dataclass(frozen=True, slots=True)
class Binding:
    """A name the generated source uses: its value, and how the rendered file spells it
    (an expression over ``machine`` and the imports the rendering opens with)."""

    name: str
    value: Any
    spelled: str


@dataclasses.dataclass(frozen=True, slots=True)
class Compiled:
    """The source of one decider and the names it needs."""

    name: str
    source: str
    bindings: tuple[Binding, ...]


def function_name(kind: enum.Enum) -> str:
    """``decide_<command>``: the command kind's value (``heartbeat_owned``)."""
    return f"decide_{kind.value}"


class _Names:
    """The bindings one generated function collects, each under one name."""

    def __init__(self) -> None:
        self.bindings: dict[str, Binding] = {}

    def bind(self, name: str, value: Any, spelled: str) -> str:
        known = self.bindings.get(name)
        assert known is None or known.value is value, f"two values for {name}"
        self.bindings[name] = Binding(name, value, spelled)
        return name

    def member(self, prefix: str, member: enum.Enum) -> str:
        return self.bind(f"{prefix}_{member.name}", member, f"{type(member).__qualname__}.{member.name}")

    def refusal(self, reason: enum.Enum) -> str:
        name = f"REFUSED_{reason.name}"
        if name in self.bindings:
            return name
        return self.bind(name, Refused(reason), f"Refused({type(reason).__qualname__}.{reason.name})")

    def guard(self, machine: Machine, name: str) -> str:
        return self.bind(f"guard_{name}", machine.guards[name], f"machine.guards[{name!r}]")

    def effect(self, machine: Machine, name: str) -> str:
        return self.bind(f"effect_{name}", machine.effects[name], f"machine.effects[{name!r}]")


# --- what the generator reads of the machine (small functions: the tests' broken
# generators replace one each) -------------------------------------------------------


def _rules_of(machine: Machine, state: enum.Enum, kind: enum.Enum) -> tuple[Rule, ...]:
    """The rule list of ``(state, kind)``, in table order."""
    return machine.table[(state, kind)]


def _time_guard_of(machine: Machine, guard: str) -> Any:
    """The guard's :class:`~tenure.kernel.core.TimeGuard` declaration, or None."""
    return (machine.time_guards or {}).get(guard)


def _unshown_by_changed_fields(machine: Machine) -> str | None:
    """Where the machine declares its invariants as data
    (:class:`~tenure.kernel.core.Invariants`), the test under which a new record still
    needs the whole check: it was not shown, on the fields its effect changed, to break
    nothing new. None: the whole check runs every time."""
    if not isinstance(machine.record_violations, Invariants):
        return None
    return "record is None or not record_violations.kept_where_changed(record, new)"


def _checks_invariants(machine: Machine) -> bool:
    """Whether a decision whose record moves with the time is held to the record
    invariants (always: a generator that says otherwise is broken)."""
    return True


# --- the source ------------------------------------------------------------------------


def _field_read(variable: str, path: str) -> str:
    """The expression reading ``path`` (a field, or a dotted path: see
    :data:`~tenure.kernel.core.MovingField`) of ``variable``."""
    if "." not in path:
        return f"{variable}.{path}"
    return f"at_path({variable}, {path!r})"


def _ahead(decision: str, relative: str = "{}", checked: bool = False) -> str:
    tail = ", True" if checked else ""
    return f"Ahead({decision}, start, end, {relative}, start, end{tail})"


def _time_guard_lines(declared: Any, held: str) -> list[str]:
    """The window narrowed as ``decide_windowed`` narrows it for a time guard tried, then
    the guard's test, from its declaration, bound to ``held``."""
    read = _field_read("record", declared.field)
    test = "instant is not None and now_us < instant" if declared.holds_before else "instant is None or now_us >= instant"
    return [
        f"instant = {read}",
        "if instant is not None:",
        "    if now_us < instant:",
        "        if instant < end:",
        "            end = instant",
        "    elif instant > start:",
        "        start = instant",
        f"{held} = {test}",
    ]


def _applied_lines(machine: Machine, effect: str, names: _Names) -> list[str]:
    """The lines of a rule whose outcome is ``effect``: what ``decide_windowed`` does
    after its guard held."""
    moving = (machine.moving_fields or {}).get(effect)
    if moving is None:
        return ["return None  # the effect declares no moving fields: decided by instrumenting"]
    lines = [f"decided = {names.effect(machine, effect)}(record, command, now_us)"]
    if not moving:
        # Nothing moves with the time: the reference keeps the decision as made and leaves
        # its record to the caller's invariant check (invariants_checked False).
        return [*lines, f"return {_ahead('decided')}"]
    lines += ["new = decided.new_record", "if new is None:", f"    return {_ahead('decided')}"]
    plain = all(isinstance(field, str) for field in moving)
    if not plain:
        names.bind("offsets", ahead.moving_offsets, "ahead.moving_offsets")
        names.bind("kept_throughout", ahead.kept_throughout, "ahead.kept_throughout")
        names.bind("moving", moving, f"machine.moving_fields[{effect!r}]")
        lines += [
            "moved_by = offsets(moving, record, new, now_us, start, end)",
            "if moved_by is None:",
            "    return None",
            "relative, not_before, not_after = moved_by",
        ]
        names.bind("machine", machine, "machine")
        kept = "return kept_throughout(machine, record, Ahead(decided, not_before, not_after, relative, start, end))"
        if machine.invariants_see_moving_fields_by_bounds:
            lines += ["if not relative:", f"    {kept}"]
            return lines + _bounded_lines(machine, names, "not_before", "not_after")
        return [*lines, kept]
    offsets: dict[str, str] = {}
    for path in moving:
        assert isinstance(path, str)
        offset = f"offset_{len(offsets)}"
        lines += [f"{offset} = {_field_read('new', path)}", f"if type({offset}) is not int:",
                  "    return None  # declared as moving, yet not a time here: decided by instrumenting",
                  f"{offset} -= now_us"]
        offsets[path] = offset  # a path declared twice is read twice, as decide_windowed does
    lines.append(f"relative = {{{', '.join(f'{path!r}: {offset}' for path, offset in offsets.items())}}}")
    if machine.invariants_see_moving_fields_by_bounds:
        return lines + _bounded_lines(machine, names, "start", "end", tuple(offsets.values()))
    names.bind("kept_throughout", ahead.kept_throughout, "ahead.kept_throughout")
    names.bind("machine", machine, "machine")
    return [*lines, f"return kept_throughout(machine, record, {_ahead('decided', 'relative')})"]


def _bounded_lines(
    machine: Machine, names: _Names, not_before: str, not_after: str, offsets: tuple[str, ...] | None = None
) -> list[str]:
    """The invariants of a machine that sees its moving fields only through their bounds
    (and its declared orders): each moving field's bounds at both edges of the window,
    each order, then the invariants once, at the reference time. ``offsets``: the
    variables holding each offset, where the source knows them (else read from ``relative``)."""
    if offsets is None:
        lines = ["for offset in relative.values():",
                 f"    if not (is_instant({not_before} + offset) and is_instant({not_after} - 1 + offset)):",
                 "        return None"]
    else:
        lines = [line for offset in offsets for line in (
            f"if not (is_instant({not_before} + {offset}) and is_instant({not_after} - 1 + {offset})):",
            "    return None  # a moving field leaves the instant bounds inside the window")]
    if machine.moving_field_orders:
        names.bind("orders_kept", ahead.orders_kept, "ahead.orders_kept")
        names.bind("kept_throughout", ahead.kept_throughout, "ahead.kept_throughout")
        names.bind("machine", machine, "machine")
        lines += [
            f"if not orders_kept(machine.moving_field_orders, new, relative, now_us, ({not_before}, {not_after} - 1)):",
            f"    return kept_throughout(machine, record, Ahead(decided, {not_before}, {not_after}, relative, start, end))",
        ]
    if _checks_invariants(machine):
        names.bind("record_violations", machine.record_violations, "machine.record_violations")
        whole = [
            "broken = record_violations(new)",
            "if broken and (record is None or not set(broken) <= set(record_violations(record))):",
            "    return None  # the new record breaks an invariant the record decided on kept",
        ]
        unshown = _unshown_by_changed_fields(machine)
        if unshown is None:
            lines += whole
        else:
            # The fields the effect changed, checked alone (the whole check's answer when
            # it shows nothing new broken; otherwise the whole check decides).
            lines += [f"if {unshown}:", *(f"    {line}" for line in whole)]
    return [*lines, f"return Ahead(decided, {not_before}, {not_after}, relative, start, end, True)"]


def _rule_lines(machine: Machine, rules: Sequence[Rule], names: _Names) -> list[str]:
    """One state's rules, in table order: each an ``if`` that returns, ``always`` the
    fall-through."""
    lines: list[str] = []
    for rule in rules:
        outcome = rule.outcome
        if isinstance(outcome, str):
            then = _applied_lines(machine, outcome, names)
            said = f"# {rule.guard} -> {outcome}"
        else:
            assert isinstance(outcome, enum.Enum)
            then = [f"return {_ahead(names.refusal(outcome))}"]
            said = f"# {rule.guard} -> refused: {outcome.value}"
        declared = _time_guard_of(machine, rule.guard)
        if declared is not None:
            lines += [f"{said} (time guard on {declared.field})", *_time_guard_lines(declared, "held"), "if held:"]
        elif rule.guard == "always":
            lines += [said, *then]
            return lines
        else:
            lines += [said, f"if {names.guard(machine, rule.guard)}(record, command, now_us):"]
        lines += [f"    {line}" for line in then]
    lines.append('raise AssertionError("every rule list ends with an \'always\' guard")')
    return lines


def source_of(machine: Machine, kind: enum.Enum) -> Compiled:
    """The source of ``decide_<kind>`` for ``machine`` (see the module docstring).

    Raises ValueError (a programmer error) for a machine that declares no time guards or
    moving fields: ``decide_windowed`` declines every decision of such a machine."""
    if machine.time_guards is None or machine.moving_fields is None:
        raise ValueError(f"machine {machine.name} declares no time guards: nothing to compile")
    names = _Names()
    names.bind("state_of", machine.state_of, "machine.state_of")
    groups: dict[tuple[tuple[str, Any], ...], list[enum.Enum]] = {}
    rules_by_key: dict[tuple[tuple[str, Any], ...], tuple[Rule, ...]] = {}
    for state in machine.states:
        rules = _rules_of(machine, state, kind)
        # What decides is each rule's guard and outcome (a rule's target is not part of the decision).
        key = tuple((rule.guard, rule.outcome) for rule in rules)
        groups.setdefault(key, []).append(state)
        rules_by_key[key] = rules
    # The branches that apply an effect first: the hot path meets them.
    ordered = sorted(groups, key=lambda key: not any(isinstance(outcome, str) for _, outcome in key))
    name = function_name(kind)
    body = [
        f"def {name}(record, command, now_us, span_us=DEFAULT_SPAN_US):",
        f'    """{machine.name}: {kind.value}, compiled from the rows, guards, time guards and moving fields."""',
        "    start = now_us - span_us",
        "    end = now_us + span_us",
        "    state = state_of(record)",
    ]
    for position, key in enumerate(ordered):
        states = [names.member("STATE", state) for state in groups[key]]
        test = " or ".join(f"state is {state}" for state in states)
        body.append(f"    {'if' if position == 0 else 'elif'} {test}:")
        body += [f"        {line}" for line in _rule_lines(machine, rules_by_key[key], names)]
    body.append("    raise AssertionError(\"every state has a rule list\")")
    return Compiled(name, "\n".join(body) + "\n", tuple(sorted(names.bindings.values(), key=lambda b: b.name)))


_COMMON = {"Ahead": Ahead, "DEFAULT_SPAN_US": DEFAULT_SPAN_US, "is_instant": is_instant, "at_path": ahead.at_path}
"""The names every generated function may use besides its bindings (the rendering imports them)."""


def compile_decider(machine: Machine, kind: enum.Enum) -> Decider:
    """``decide_<kind>`` for ``machine``, built from :func:`source_of` (``exec`` of source
    this module wrote)."""
    compiled = source_of(machine, kind)
    namespace: dict[str, Any] = {**_COMMON, **{binding.name: binding.value for binding in compiled.bindings}}
    exec(compile(compiled.source, f"<compiled {machine.name}.{compiled.name}>", "exec"), namespace)  # noqa: S102
    decider: Decider = namespace[compiled.name]
    return decider


def compile_deciders(machine: Machine, kinds: Sequence[enum.Enum]) -> dict[enum.Enum, Decider]:
    """A compiled decider for each command kind of ``kinds``."""
    return {kind: compile_decider(machine, kind) for kind in kinds}


def decider_of(machine: Machine, kind: enum.Enum) -> Decider | None:
    """The compiled decider of ``kind`` if the machine declares it compiled
    (:attr:`~tenure.kernel.core.Machine.compiled`), generated on first use and kept in
    :attr:`~tenure.kernel.core.Machine.deciders` with the declaration count it was
    generated at; None otherwise (the caller runs :func:`~tenure.kernel.ahead.decide_windowed`,
    which it equals). A compiled machine's declarations are
    :class:`~tenure.kernel.core.Declarations`: a deliberately broken kernel patched in at
    any time moves :data:`~tenure.kernel.core.DECLARATION_CHANGES`, and the next call
    generates the decider again from the patched declarations."""
    entry = machine.deciders.get(kind)
    if entry is not None and entry[0] == DECLARATION_CHANGES[0]:
        return entry[1]  # type: ignore[no-any-return]
    # Generated first, or again after a declaration changed (a broken kernel patched in).
    changes = DECLARATION_CHANGES[0]
    decider = compile_decider(machine, kind) if kind in machine.compiled else None
    machine.deciders[kind] = (changes, decider)
    return decider


def render(machine: Machine, kinds: Sequence[enum.Enum], *, machine_import: str, rerender: str) -> str:
    """The rendered file reviewers read: the imports and bindings the functions use,
    spelled as Python, then each function's source. ``machine_import`` is the import
    line that names the machine ``machine``; ``rerender`` the command that writes the
    file again."""
    compiled = [source_of(machine, kind) for kind in kinds]
    bindings: dict[str, Binding] = {}
    for one in compiled:
        bindings.update({binding.name: binding for binding in one.bindings})
    enums = {type(value.reason if isinstance(value, Refused) else value) for value in
             (binding.value for binding in bindings.values()) if isinstance(value, enum.Enum | Refused)}
    enum_imports = sorted(f"from {kind.__module__} import {kind.__qualname__}" for kind in enums)
    header = [
        f'"""The {machine.name} machine\'s compiled deciders, as tenure.kernel.compiled generates them.',
        "",
        "Rendered for review, not imported: tenure builds the same source when first asked. Each",
        "function returns exactly what tenure.kernel.ahead.decide_windowed returns for its command",
        "(tests/kernel/test_compiled.py). Do not edit; re-render:",
        "",
        f"    {rerender}",
        '"""',
        "",
        "# ruff: noqa",
        "from tenure.kernel import ahead",
        "from tenure.kernel.ahead import DEFAULT_SPAN_US, Ahead, at_path",
        "from tenure.kernel.core import Refused",
        "from tenure.model.bounds import is_instant",
        *enum_imports,
        machine_import,
        "",
    ]
    assignments = [f"{binding.name} = {binding.spelled}" for binding in sorted(bindings.values(), key=lambda b: b.name)
                   if binding.name != "machine"]
    functions = "\n\n".join(one.source for one in compiled)
    return "\n".join([*header, *assignments]) + "\n\n\n" + functions
