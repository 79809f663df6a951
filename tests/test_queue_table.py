"""The queue kernel's table: total, equal to the spec table, structurally sound."""

from __future__ import annotations

import copy
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queue_strategies import situations
from spec_tables import SpecRow, embedded_diagram, parse_rows, read_spec, render_for
from tenure.kernel import (
    EFFECTS,
    GUARDS,
    TABLE,
    Applied,
    CommandType,
    QueueState,
    Refusal,
    Refused,
    decide,
    select_rule,
)

TERMINAL = {QueueState.COMPLETED, QueueState.FAILED, QueueState.CANCELLED}


def kernel_rows() -> list[SpecRow]:
    rows = []
    for (state, command), rules in TABLE.items():
        for rule in rules:
            refusal = isinstance(rule.outcome, Refusal)
            rows.append(
                SpecRow(
                    state.value,
                    command.value,
                    rule.guard,
                    rule.target.value,
                    rule.outcome.value if isinstance(rule.outcome, Refusal) else rule.outcome,
                    refusal,
                )
            )
    return rows


def _grouped(rows: list[SpecRow]) -> dict[tuple[str, str], list[SpecRow]]:
    grouped: dict[tuple[str, str], list[SpecRow]] = {}
    for row in rows:
        grouped.setdefault(row.key, []).append(row)
    return grouped


SPEC_ROWS = parse_rows(read_spec("queue"))


def test_every_state_and_command_pair_has_rules_ending_in_always() -> None:
    for state in QueueState:
        for command in CommandType:
            rules = TABLE[(state, command)]
            assert rules, (state, command)
            assert rules[-1].guard == "always", (state, command)
            assert all(rule.guard != "always" for rule in rules[:-1]), (state, command)


def test_every_rule_names_a_known_guard_and_a_known_effect_or_refusal() -> None:
    for rules in TABLE.values():
        for rule in rules:
            assert rule.guard in GUARDS
            assert isinstance(rule.outcome, Refusal) or rule.outcome in EFFECTS


def test_refusal_rows_keep_the_state_they_met() -> None:
    for (state, _command), rules in TABLE.items():
        for rule in rules:
            if isinstance(rule.outcome, Refusal):
                assert rule.target is state


def test_every_spec_row_is_in_the_kernel_table_in_the_same_order() -> None:
    kernel = _grouped(kernel_rows())
    for key, rows in _grouped(SPEC_ROWS).items():
        assert kernel.get(key) == rows, key


def test_every_kernel_rule_is_in_the_spec_table_in_the_same_order() -> None:
    spec = _grouped(SPEC_ROWS)
    for key, rows in _grouped(kernel_rows()).items():
        assert spec.get(key) == rows, key


def test_the_spec_names_every_guard_effect_and_refusal_it_uses_in_its_glossaries() -> None:
    text = read_spec("queue")
    for name in GUARDS:
        assert f"| `{name}`" in text or f"`{name}` /" in text or f"/ `{name}`" in text, name
    for name in EFFECTS:
        assert f"| `{name}` |" in text, name
    for reason in Refusal:
        assert f"`{reason.value}`" in text.split("## Refusals", 1)[1].split("## Transitions", 1)[0], reason


def test_the_committed_diagram_is_rendered_from_the_current_rows() -> None:
    assert embedded_diagram(read_spec("queue")) == render_for("queue"), (
        "stale diagram: run python tests/spec_tables.py --write"
    )


def _edges() -> dict[QueueState, set[QueueState]]:
    edges: dict[QueueState, set[QueueState]] = {state: set() for state in QueueState}
    for (state, _command), rules in TABLE.items():
        for rule in rules:
            if not isinstance(rule.outcome, Refusal):
                edges[state].add(rule.target)
    return edges


def _reachable(start: QueueState, edges: dict[QueueState, set[QueueState]]) -> set[QueueState]:
    seen, todo = {start}, deque([start])
    while todo:
        for nxt in edges[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_state_is_reachable_from_absent() -> None:
    assert _reachable(QueueState.ABSENT, _edges()) == set(QueueState)


def test_no_state_is_a_trap_every_live_state_can_still_finish() -> None:
    edges = _edges()
    for state in (QueueState.PENDING, QueueState.CLAIMED):
        assert _reachable(state, edges) & TERMINAL, state


def test_terminal_states_leave_only_by_delete_or_purge() -> None:
    for (state, command), rules in TABLE.items():
        if state not in TERMINAL:
            continue
        for rule in rules:
            if isinstance(rule.outcome, Refusal) or rule.target is state:
                continue
            assert rule.target is QueueState.ABSENT, (state, command, rule)
            assert command in (CommandType.DELETE_LEGACY, CommandType.PURGE_FINISHED)


@pytest.mark.parametrize("state", list(QueueState), ids=lambda s: s.value)
@pytest.mark.parametrize("kind", list(CommandType), ids=lambda c: c.value)
@settings(max_examples=25)
@given(data=st.data())
def test_decide_is_total_and_a_refusal_changes_nothing(
    state: QueueState, kind: CommandType, data: st.DataObject
) -> None:
    record, command, now_us = data.draw(situations(state, kind))
    before = copy.deepcopy(record)
    decision = decide(record, command, now_us)  # type: ignore[arg-type]
    assert isinstance(decision, (Applied, Refused))
    rule = select_rule(record, command, now_us)  # type: ignore[arg-type]
    if isinstance(decision, Refused):
        assert decision.reason is rule.outcome
        # A refusal carries no record, and the record it met is untouched.
        assert record == before
    else:
        new_state = QueueState.ABSENT if decision.new_record is None else QueueState(decision.new_record.status.value)
        assert new_state is rule.target
