"""The replay table: total, the same as specs/replay.md both ways, and every verdict keeps
the replay rules (REPLAY-1 ... REPLAY-5) over generated situations."""

from __future__ import annotations

import dataclasses
import itertools
import re

import paths
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure.kernel.replay import table
from tenure.kernel.replay.table import (
    NOTHING,
    Action,
    Case,
    Parked,
    Situation,
    Verdict,
    case_of,
    decide,
    verdict_violations,
)

SPEC = paths.ROOT / "specs" / "replay.md"
RULES = ("REPLAY-1", "REPLAY-2", "REPLAY-3", "REPLAY-4", "REPLAY-5")


def _spec_rows() -> list[tuple[str, str, str, str]]:
    rows = []
    for line in SPEC.read_text().splitlines():
        cells = [cell.strip().replace("`", "") for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and line.startswith("| `"):
            rows.append(tuple(cells))
    return rows  # type: ignore[return-value]


def _kernel_rows() -> list[tuple[str, str, str, str]]:
    return [(case.value, rule.guard, rule.action.value, rule.held.value)
            for case, rules in table.ROWS for rule in rules]


def test_the_spec_rules_are_the_kernel_rules_in_the_same_order() -> None:
    assert _spec_rows() == _kernel_rows()


def test_every_case_has_rules_ending_in_always_and_every_name_is_in_the_spec() -> None:
    assert [case for case, _ in table.ROWS] == list(Case)
    for case in Case:
        rules = table.TABLE[case]
        assert rules and rules[-1].guard == "always", case
    assert {rule.guard for rules in table.TABLE.values() for rule in rules} == set(table.GUARDS)
    spec = SPEC.read_text()
    for name in [*table.GUARDS, *(case.value for case in Case), *(action.value for action in Action)]:
        assert re.search(rf"`{name}`", spec), name
    for rule_name in RULES:
        assert f"**{rule_name}**" in spec


# --- the rules over generated situations ----------------------------------------------------

CALLS = ("step:reserve", "step:weigh", "consent:ship_order", "sleep", "delegate:agent/refunds")
_CALLS = st.sampled_from(CALLS) | st.text(max_size=6)
_POSITIONS = st.integers(0, 5)
_PARKED = st.none() | st.builds(Parked, _POSITIONS, _CALLS)


@st.composite
def situations(draw: st.DrawFn) -> Situation:
    asked = draw(_CALLS)
    # The recorded call is often the asked one (the replay agrees), sometimes another.
    recorded = draw(st.none() | st.just(asked) | _CALLS)
    parked = draw(_PARKED)
    position = draw(_POSITIONS | (st.just(parked.position) if parked is not None else _POSITIONS))
    if parked is not None and draw(st.booleans()):
        parked = dataclasses.replace(parked, call=asked)
    return Situation(position=position, asked=asked, recorded=recorded, parked=parked)


@settings(max_examples=2000, deadline=None)
@given(situations())
def test_every_verdict_keeps_the_replay_rules(situation: Situation) -> None:
    verdict = decide(situation)
    assert verdict_violations(situation, verdict) == []


def test_every_situation_of_a_small_world_gets_one_verdict_that_keeps_the_rules() -> None:
    # Exhaustive over three positions and two calls: every combination of recorded call,
    # parked wait and asked call (the property above draws wider worlds).
    calls = ("step:a", "consent:a")
    parks = [None, *(Parked(position, call) for position in range(3) for call in calls)]
    seen = set()
    for position, asked, recorded, parked in itertools.product(range(3), calls, (None, *calls), parks):
        situation = Situation(position=position, asked=asked, recorded=recorded, parked=parked)
        verdict = decide(situation)
        assert verdict_violations(situation, verdict) == [], situation
        seen.add((case_of(situation), verdict.action))
    assert {action for _, action in seen} == set(Action)
    assert {case for case, _ in seen} == set(Case)


# --- each rule, on the situations a workflow meets ----------------------------------------------


def test_a_recorded_call_answers_from_the_journal_and_another_call_diverges_naming_both() -> None:
    same = Situation(position=0, asked="step:reserve", recorded="step:reserve")
    assert decide(same) == Verdict(Action.ANSWER_RECORDED, 0, "step:reserve", "step:reserve")
    # A changed body under the same version: the journal holds reserve, the code asks weigh.
    changed = dataclasses.replace(same, asked="step:weigh")
    assert decide(changed) == Verdict(Action.DIVERGED, 0, "step:reserve", "step:weigh")
    # The journal wins over the resumed wait: its owner's answer was recorded already.
    recorded_at_wait = dataclasses.replace(same, parked=Parked(0, "step:reserve"))
    assert decide(recorded_at_wait).action is Action.ANSWER_RECORDED
    assert decide(dataclasses.replace(changed, parked=Parked(0, "step:weigh"))) == decide(changed)
    # An entry after the wait is checked too (a resumed hop that died after recording it).
    after_wait = Situation(position=3, asked="step:weigh", recorded="step:reserve", parked=Parked(1, "sleep"))
    assert decide(after_wait) == Verdict(Action.DIVERGED, 3, "step:reserve", "step:weigh")


def test_a_position_before_the_resumed_wait_that_the_journal_lacks_diverges_naming_nothing() -> None:
    skipped = Situation(position=1, asked="consent:publish", parked=Parked(2, "consent:publish"))
    assert decide(skipped) == Verdict(Action.DIVERGED, 1, NOTHING, "consent:publish")
    assert decide(dataclasses.replace(skipped, position=0)) == Verdict(Action.DIVERGED, 0, NOTHING, "consent:publish")


def test_the_resumed_wait_answers_only_at_its_own_position_with_its_own_call() -> None:
    resumed = Situation(position=2, asked="consent:publish", parked=Parked(2, "consent:publish"))
    assert decide(resumed) == Verdict(Action.ANSWER_OWNER, 2, "consent:publish", "consent:publish")
    other_call = dataclasses.replace(resumed, asked="sleep")
    assert decide(other_call) == Verdict(Action.DIVERGED, 2, "consent:publish", "sleep")
    past = dataclasses.replace(resumed, position=3)
    assert decide(past).action is Action.RUN  # never the owner's answer at another position


def test_a_position_past_the_wait_runs_for_real_only_where_the_journal_holds_nothing() -> None:
    past = Situation(position=4, asked="step:weigh", parked=Parked(2, "consent:publish"))
    assert decide(past) == Verdict(Action.RUN, 4, NOTHING, "step:weigh")
    assert decide(dataclasses.replace(past, recorded="step:weigh")).action is Action.ANSWER_RECORDED
    fresh = Situation(position=0, asked="step:weigh")
    assert decide(fresh) == Verdict(Action.RUN, 0, NOTHING, "step:weigh")
    assert decide(dataclasses.replace(fresh, recorded="step:reserve")).action is Action.DIVERGED


def test_the_rules_name_each_broken_verdict() -> None:
    situation = Situation(position=1, asked="step:weigh", recorded="step:reserve", parked=Parked(2, "sleep"))
    assert verdict_violations(situation, Verdict(Action.ANSWER_RECORDED, 1, "step:reserve", "step:weigh")) == [
        "REPLAY-1", "REPLAY-3"]
    assert verdict_violations(situation, Verdict(Action.DIVERGED, 1, NOTHING, "step:weigh")) == ["REPLAY-5"]
    assert verdict_violations(situation, Verdict(Action.DIVERGED, 0, "step:reserve", "step:weigh")) == ["REPLAY-5"]
    lacking = Situation(position=1, asked="step:weigh", parked=Parked(2, "sleep"))
    assert verdict_violations(lacking, Verdict(Action.RUN, 1, NOTHING, "step:weigh")) == ["REPLAY-3", "REPLAY-4"]
    at_wait = Situation(position=2, asked="step:weigh", parked=Parked(2, "sleep"))
    assert verdict_violations(at_wait, Verdict(Action.ANSWER_OWNER, 2, "sleep", "step:weigh")) == [
        "REPLAY-2", "REPLAY-3"]
