"""A bounded exhaustive explorer over the kernel's machines.

Theory of operation. A *model* (one per machine: :mod:`.queue`, :mod:`.attempts`,
:mod:`.runs`) describes a small closed world: kernel records, what each actor believes
(its fence, its token, the writes it saw acknowledged), the database clock, and *ghost*
history the properties need (which completions were accepted). Its ``successors`` are
every action any actor may take next (every command each actor may send, an
acknowledgement lost on the way back, a crash that forgets everything not stored, the
clock stepping past a lease, an operator's cancel or rerun, ...), each decided by the
kernel itself: the explorer has no second model of the machine, only of its
surroundings.

:func:`explore` walks that world breadth first, every interleaving up to ``max_depth``
actions. States are canonicalised before they are hashed (the model renames
interchangeable actors and jobs in order of appearance and moves every instant relative to
the clock), so a state met again under another name is not explored twice. Every
state property is checked in every reachable state (once per canonical state: they
depend on nothing the canonical form leaves out), and every transition property on every
transition, including transitions into states already seen. Because the walk is breadth first, the first
violation found is one with a shortest trace; it is reported with that trace, each step
naming its actor, its action and the state after it.

Nothing here reads a clock, a random source or a database: the same model and bound give
the same counts and the same trace every time.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Step", "Property", "Model", "Violation", "Exploration", "explore", "trace_table"]

S = TypeVar("S")


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """One action: who took it, what it was (``claim``, ``complete (ack lost)``, ...)."""

    actor: str
    action: str
    detail: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Property(Generic[S]):
    """A named property, tied to the spec invariant or guarantee it checks. ``state``
    answers None when a state keeps it, else what is wrong; ``step`` does the same for a
    transition (before, step, after)."""

    name: str
    spec: str
    """Where the spec states it (``INV-Q2``, ``specs/queue.md#guarantees``, ...)."""
    description: str
    state: Callable[[S], str | None] | None = None
    step: Callable[[S, Step, S], str | None] | None = None


class Model(Protocol[S]):
    """What :func:`explore` needs of a model."""

    name: str
    properties: tuple[Property[S], ...]

    def initial(self) -> S: ...

    def successors(self, state: S) -> Iterator[tuple[Step, S]]: ...

    def canonical(self, state: S) -> Hashable: ...

    def describe(self, state: S) -> str: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Violation(Generic[S]):
    """A property broken, with a shortest trace to it: (step, state after) pairs from the
    initial state (the last step is the one that broke a transition property)."""

    property: Property[S]
    message: str
    initial: S
    trace: tuple[tuple[Step, S], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Exploration(Generic[S]):
    model: str
    states: int
    """Distinct canonical states reached (the initial one included)."""
    transitions: int
    """Transitions taken, into new states and into states already seen."""
    depth: int
    """The deepest level reached (actions from the initial state)."""
    max_depth: int
    exhausted: bool
    """Every reachable state was explored before the bound: no deeper state exists."""
    violation: Violation[S] | None


def _check_state(model: Model[S], state: S) -> tuple[Property[S], str] | None:
    """State properties: checked once per distinct (canonical) state."""
    for prop in model.properties:
        if prop.state is not None:
            problem = prop.state(state)
            if problem is not None:
                return prop, problem
    return None


def _check_step(model: Model[S], before: S, step: Step, after: S) -> tuple[Property[S], str] | None:
    """Transition properties: checked on every transition, into new states or not."""
    for prop in model.properties:
        if prop.step is not None:
            problem = prop.step(before, step, after)
            if problem is not None:
                return prop, problem
    return None


def explore(model: Model[S], *, max_depth: int, max_states: int | None = None) -> Exploration[S]:
    """Every interleaving of ``model`` up to ``max_depth`` actions (and at most
    ``max_states`` distinct states, if given); stops at the first violation."""
    assert max_depth >= 0
    initial = model.initial()
    start = model.canonical(initial)
    # key -> (parent key, step, the state as reached from the parent's stored state)
    parents: dict[Hashable, tuple[Hashable | None, Step | None, S]] = {start: (None, None, initial)}
    transitions = 0
    depth = 0

    def trace_to(key: Hashable) -> list[tuple[Step, S]]:
        path: list[tuple[Step, S]] = []
        current: Hashable | None = key
        while current is not None:
            parent, step, state = parents[current]
            if step is not None:
                path.append((step, state))
            current = parent
        path.reverse()
        return path

    def found(prop: Property[S], message: str, path: list[tuple[Step, S]]) -> Exploration[S]:
        return Exploration(model.name, len(parents), transitions, depth, max_depth, False,
                           Violation(prop, message, initial, tuple(path)))

    broken = _check_state(model, initial)
    if broken is not None:
        return found(*broken, [])
    frontier = collections.deque([start])
    while frontier and depth < max_depth:
        depth += 1
        next_frontier: collections.deque[Hashable] = collections.deque()
        for key in frontier:
            state = parents[key][2]
            for step, after in model.successors(state):
                transitions += 1
                broken = _check_step(model, state, step, after)
                if broken is not None:
                    return found(*broken, [*trace_to(key), (step, after)])
                after_key = model.canonical(after)
                if after_key not in parents:
                    broken = _check_state(model, after)
                    if broken is not None:
                        return found(*broken, [*trace_to(key), (step, after)])
                    parents[after_key] = (key, step, after)
                    next_frontier.append(after_key)
                    if max_states is not None and len(parents) >= max_states:
                        return Exploration(model.name, len(parents), transitions, depth, max_depth, False, None)
        frontier = next_frontier
    return Exploration(model.name, len(parents), transitions, depth, max_depth, not frontier, None)


def trace_table(violation: Violation[Any], describe: Callable[[Any], str]) -> str:
    """The violation as a readable table: one row per action (its actor, what it did,
    the state after it), then the property and what broke."""
    rows = [("#", "actor", "action", "state after")]
    rows.append(("0", "", "(initial)", describe(violation.initial)))
    for number, (step, state) in enumerate(violation.trace, start=1):
        action = step.action + (f" {step.detail}" if step.detail else "")
        rows.append((str(number), step.actor, action, describe(state)))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3]
             for row in rows]
    lines.append(f"broken: {violation.property.name} ({violation.property.spec}): {violation.message}")
    return "\n".join(line.rstrip() for line in lines)
