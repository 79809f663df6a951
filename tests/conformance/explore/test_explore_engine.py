"""The explorer's engine on worlds small enough to count by hand."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterator

from tenure.conformance.explore.engine import Property, Step, explore, trace_table


@dataclasses.dataclass(frozen=True)
class Counters:
    """Two counters anyone may bump by 1 or 2; interchangeable, so (a, b) is (b, a)."""

    values: tuple[int, int] = (0, 0)
    last_bump: int = 0


class CountersModel:
    name = "counters"

    def __init__(self, forbidden: int | None = None, largest_bump: int | None = None) -> None:
        self.properties: tuple[Property[Counters], ...] = tuple(
            prop for prop in (
                None if forbidden is None else Property(
                    "never_the_forbidden_sum", "toy", "the counters never sum to the forbidden value",
                    state=lambda world: "forbidden sum" if sum(world.values) == forbidden else None),
                None if largest_bump is None else Property(
                    "bumps_stay_small", "toy", "no bump is larger than allowed",
                    step=lambda before, step, after: "too large" if after.last_bump > largest_bump else None),
            ) if prop is not None
        )

    def initial(self) -> Counters:
        return Counters()

    def successors(self, world: Counters) -> Iterator[tuple[Step, Counters]]:
        for index in (0, 1):
            for bump in (1, 2):
                values = list(world.values)
                values[index] += bump
                yield Step(f"c{index}", f"+{bump}"), Counters((values[0], values[1]), bump)

    def canonical(self, world: Counters) -> Hashable:
        return tuple(sorted(world.values))  # the last bump is ghost: not part of the state

    def describe(self, world: Counters) -> str:
        return f"{world.values[0]},{world.values[1]}"


def test_states_are_counted_once_under_their_canonical_form() -> None:
    found = explore(CountersModel(), max_depth=2)
    reachable = {tuple(sorted(values)) for values in _sums_within(2)}  # {0,0} {0,1} {0,2} {1,1} {1,2} {0,3} ...
    assert found.states == len(reachable) == 8
    assert found.transitions == 4 + 4 * 2  # every transition counted, into new states or not
    assert found.depth == 2 and found.violation is None and not found.exhausted


def _sums_within(actions: int) -> set[tuple[int, int]]:
    worlds = {(0, 0)}
    frontier = {(0, 0)}
    for _ in range(actions):
        frontier = {(a + da, b + db) for a, b in frontier for da, db in ((1, 0), (2, 0), (0, 1), (0, 2))}
        worlds |= frontier
    return worlds


def test_the_first_violation_found_has_a_shortest_trace() -> None:
    found = explore(CountersModel(forbidden=5), max_depth=6)
    assert found.violation is not None
    assert found.violation.property.name == "never_the_forbidden_sum"
    assert len(found.violation.trace) == 3  # 5 = 2 + 2 + 1: no two actions reach it
    assert sum(found.violation.trace[-1][1].values) == 5
    table = trace_table(found.violation, CountersModel().describe)
    assert table.splitlines()[0].split() == ["#", "actor", "action", "state", "after"]
    assert table.splitlines()[-1] == "broken: never_the_forbidden_sum (toy): forbidden sum"


def test_a_transition_property_is_checked_into_states_already_seen() -> None:
    found = explore(CountersModel(largest_bump=1), max_depth=3)
    assert found.violation is not None and found.violation.property.name == "bumps_stay_small"
    assert [step.action for step, _ in found.violation.trace] == ["+2"]


def test_a_world_smaller_than_the_bound_is_reported_exhausted() -> None:
    class Finite(CountersModel):
        def successors(self, world: Counters) -> Iterator[tuple[Step, Counters]]:
            for step, after in super().successors(world):
                if max(after.values) <= 2:
                    yield step, after

    found = explore(Finite(), max_depth=10)
    assert found.exhausted and found.states == 6 and found.depth < 10  # {0,0} {0,1} {0,2} {1,1} {1,2} {2,2}
