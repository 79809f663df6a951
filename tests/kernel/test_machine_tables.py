"""Every machine's kernel table: total, equal to its spec table (both directions, in
order), structurally sound, and deciding like an independent interpretation of the spec
rows built with `transitions`. One suite, parameterized by machine (tests/support/machines.py)."""

from __future__ import annotations

import copy
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from machines import MACHINES, MachineUnderTest
from spec_tables import SpecRow, embedded_diagram, parse_rows, read_spec, render_for
from transitions import Machine as TransitionsMachine

from tenure.kernel.core import Applied, Refused, decide, select_rule

MACHINE_NAMES = sorted(MACHINES)


@pytest.fixture(params=MACHINE_NAMES)
def under_test(request: pytest.FixtureRequest) -> MachineUnderTest:
    return MACHINES[request.param]


def kernel_rows(under_test: MachineUnderTest) -> list[SpecRow]:
    rows = []
    for (state, command), rules in under_test.machine.table.items():
        for rule in rules:
            rows.append(SpecRow(
                state.value, command.value, rule.guard, rule.target.value,
                rule.outcome if isinstance(rule.outcome, str) else rule.outcome.value, rule.refusal,
            ))
    return rows


def _grouped(rows: list[SpecRow]) -> dict[tuple[str, str], list[SpecRow]]:
    grouped: dict[tuple[str, str], list[SpecRow]] = {}
    for row in rows:
        grouped.setdefault(row.key, []).append(row)
    return grouped


def test_every_state_and_command_pair_has_rules_ending_in_always(under_test: MachineUnderTest) -> None:
    machine = under_test.machine
    for state in machine.states:
        for command in machine.commands:
            rules = machine.table[(state, command)]
            assert rules and rules[-1].guard == "always", (state, command)
            assert all(rule.guard != "always" for rule in rules[:-1]), (state, command)


def test_every_rule_names_a_known_guard_and_a_known_effect_or_refusal(under_test: MachineUnderTest) -> None:
    machine = under_test.machine
    for rules in machine.table.values():
        for rule in rules:
            assert rule.guard in machine.guards
            assert rule.refusal or rule.outcome in machine.effects
            assert not rule.refusal or rule.outcome in machine.outcomes


def test_every_guard_and_effect_is_used_and_every_refusal_has_an_outcome(under_test: MachineUnderTest) -> None:
    machine = under_test.machine
    used_guards = {rule.guard for rules in machine.table.values() for rule in rules}
    used_effects = {rule.outcome for rules in machine.table.values() for rule in rules if not rule.refusal}
    assert used_guards == set(machine.guards)
    assert used_effects == set(machine.effects)
    refusal_type = type(next(iter(machine.outcomes)))
    assert set(machine.outcomes) == set(refusal_type)


def test_refusal_rows_keep_the_state_they_met(under_test: MachineUnderTest) -> None:
    for (state, _command), rules in under_test.machine.table.items():
        for rule in rules:
            if rule.refusal:
                assert rule.target is state


def test_every_spec_row_is_in_the_kernel_table_in_the_same_order(under_test: MachineUnderTest) -> None:
    kernel = _grouped(kernel_rows(under_test))
    for key, rows in _grouped(parse_rows(read_spec(under_test.name))).items():
        assert kernel.get(key) == rows, key


def test_every_kernel_rule_is_in_the_spec_table_in_the_same_order(under_test: MachineUnderTest) -> None:
    spec = _grouped(parse_rows(read_spec(under_test.name)))
    for key, rows in _grouped(kernel_rows(under_test)).items():
        assert spec.get(key) == rows, key


def test_the_spec_names_every_guard_effect_and_refusal_in_its_glossaries(under_test: MachineUnderTest) -> None:
    text = read_spec(under_test.name)
    guards = text.split("## Guards", 1)[1].split("## Effects", 1)[0]
    effects = text.split("## Effects", 1)[1].split("## Refusals", 1)[0]
    refusals = text.split("## Refusals", 1)[1].split("## Transitions", 1)[0]
    for name in under_test.machine.guards:
        assert f"`{name}`" in guards, name
    for name in under_test.machine.effects:
        assert f"`{name}`" in effects, name
    for reason in under_test.machine.outcomes:
        assert f"`{reason.value}`" in refusals, reason


def test_the_committed_diagram_is_rendered_from_the_current_rows(under_test: MachineUnderTest) -> None:
    assert embedded_diagram(read_spec(under_test.name)) == render_for(under_test.name), (
        "stale diagram: run python tests/support/spec_tables.py --write"
    )


def _edges(under_test: MachineUnderTest) -> dict[Any, set[Any]]:
    edges: dict[Any, set[Any]] = {state: set() for state in under_test.machine.states}
    for (state, _command), rules in under_test.machine.table.items():
        for rule in rules:
            if not rule.refusal:
                edges[state].add(rule.target)
    return edges


def _reachable(start: Any, edges: dict[Any, set[Any]]) -> set[Any]:
    seen, todo = {start}, deque([start])
    while todo:
        for nxt in edges[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_state_is_reachable_from_the_initial_state(under_test: MachineUnderTest) -> None:
    assert _reachable(under_test.machine.initial, _edges(under_test)) == set(under_test.machine.states)


def test_no_state_is_a_trap_every_live_state_can_still_finish(under_test: MachineUnderTest) -> None:
    edges = _edges(under_test)
    for state in under_test.live:
        assert _reachable(state, edges) & under_test.terminal, state


def test_terminal_states_leave_only_as_the_spec_allows(under_test: MachineUnderTest) -> None:
    for (state, command), rules in under_test.machine.table.items():
        if state not in under_test.terminal:
            continue
        for rule in rules:
            if rule.refusal or rule.target is state:
                continue
            assert under_test.terminal_exit_allowed(state, command, rule), (state, command, rule)


def _pairs() -> list[tuple[str, Any, Any]]:
    return [
        (name, state, command)
        for name in MACHINE_NAMES
        for state in MACHINES[name].machine.states
        for command in MACHINES[name].machine.commands
    ]


@pytest.mark.parametrize(("name", "state", "kind"), _pairs(), ids=lambda value: getattr(value, "value", value))
@settings(max_examples=25)
@given(data=st.data())
def test_decide_is_total_and_a_refusal_changes_nothing(name: str, state: Any, kind: Any, data: st.DataObject) -> None:
    under_test = MACHINES[name]
    record, command, now_us = data.draw(under_test.situations(state, kind))
    before = copy.deepcopy(record)
    decision = decide(under_test.machine, record, command, now_us)
    assert isinstance(decision, (Applied, Refused))
    rule = select_rule(under_test.machine, record, command, now_us)
    if isinstance(decision, Refused):
        assert decision.reason is rule.outcome
        assert record == before  # a refusal carries no record, and the record it met is untouched
    else:
        assert under_test.state_of_record(decision.new_record) is rule.target


@pytest.mark.parametrize(("name", "state", "kind"), _pairs(), ids=lambda value: getattr(value, "value", value))
@settings(max_examples=25)
@given(data=st.data())
def test_every_decision_keeps_the_transition_rules_and_a_valid_record_stays_valid(
    name: str, state: Any, kind: Any, data: st.DataObject
) -> None:
    under_test = MACHINES[name]
    machine = under_test.machine
    record, command, now_us = data.draw(under_test.situations(state, kind))
    decision = decide(machine, record, command, now_us)
    assert machine.transition_violations(record, command, now_us, decision) == []
    if isinstance(decision, Applied) and decision.new_record is not None and (
        record is None or not machine.record_violations(record)
    ):
        assert machine.record_violations(decision.new_record) == []


# --- an independent interpretation of the spec rows ------------------------------------------


class Oracle:
    """A machine's spec rows as a `transitions` machine; ``fired`` records the row that ran."""

    def __init__(self, under_test: MachineUnderTest) -> None:
        self.fired: tuple[str, str, bool] | None = None
        self.initial = under_test.machine.initial.value
        rows = parse_rows(read_spec(under_test.name))
        states = sorted({row.source for row in rows} | {row.target for row in rows})
        self.machine = TransitionsMachine(
            model=self, states=states, initial=self.initial, auto_transitions=False, send_event=True,
            ignore_invalid_triggers=False,
        )
        for row in rows:
            guard = under_test.oracle_guards[row.guard]
            self.machine.add_transition(
                trigger=row.command,
                source=row.source,
                dest=None if row.refusal else row.target,
                conditions=[lambda event, guard=guard: guard(event.kwargs["record"], event.kwargs["command"], event.kwargs["now"])],
                after=[self._note(row.target, row.outcome, row.refusal)],
            )
        self.state_of = under_test.state_of_record

    def _note(self, target: str, outcome: str, refusal: bool) -> Any:
        def note(event: Any) -> None:
            self.fired = (target, outcome, refusal)

        return note

    def run(self, record: Any, command: Any, now: int) -> tuple[str, str, bool]:
        self.fired = None
        self.machine.set_state(self.state_of(record).value)
        self.trigger(command.kind.value, record=record, command=command, now=now)  # type: ignore[attr-defined]
        assert self.fired is not None, "no spec row fired: the table is not total"
        return self.fired


ORACLES = {name: Oracle(under_test) for name, under_test in MACHINES.items()}


@pytest.mark.parametrize("name", MACHINE_NAMES)
@settings(max_examples=3000)
@given(data=st.data())
def test_the_transitions_oracle_picks_the_same_row_as_the_kernel(name: str, data: st.DataObject) -> None:
    under_test = MACHINES[name]
    record, command, now_us = data.draw(under_test.situations())
    rule = select_rule(under_test.machine, record, command, now_us)
    kernel_choice = (rule.target.value, rule.outcome if isinstance(rule.outcome, str) else rule.outcome.value, rule.refusal)
    assert ORACLES[name].run(record, command, now_us) == kernel_choice
