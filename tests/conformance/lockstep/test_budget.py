"""The lockstep budget loop (``run_lockstep``): a step target, and with ``every_rule_by`` a
run that goes on past it until every rule has run, up to that cap.

Hypothesis's runner is replaced by a scripted one (every example ten steps of the ``common``
rule, and from step 500 on also the ``rare`` one), so what is tested is the loop's
arithmetic alone, with no database and no luck.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis.stateful import RULE_MARKER

from tenure.conformance.lockstep import harness
from tenure.conformance.lockstep.harness import COUNTERS, run_lockstep

RARE_FROM_STEP = 500


class Scripted:
    """A machine as the loop sees it: a key and two rules."""

    @classmethod
    def key(cls) -> str:
        return "scripted:none"


setattr(Scripted, "common", lambda self: None)
setattr(Scripted.common, RULE_MARKER, object())  # type: ignore[attr-defined]
setattr(Scripted, "rare", lambda self: None)
setattr(Scripted.rare, RULE_MARKER, object())  # type: ignore[attr-defined]


def scripted_runs(machine: Any, settings: Any) -> None:
    counter = COUNTERS[machine.key()]
    for _ in range(settings.max_examples):
        counter.examples += 1
        counter.steps += 10
        counter.rules["common"] = counter.rules.get("common", 0) + 10
        if counter.steps >= RARE_FROM_STEP:
            counter.rules["rare"] = counter.rules.get("rare", 0) + 1


@pytest.fixture(autouse=True)
def scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "run_state_machine_as_test", scripted_runs)


def test_the_rules_of_the_scripted_machine_are_what_the_loop_waits_for() -> None:
    assert harness.rule_names(Scripted) == ["common", "rare"]  # type: ignore[arg-type]


def test_without_a_cap_the_runs_stop_at_the_target_even_if_a_rule_never_ran() -> None:
    run_lockstep(Scripted, 100, step_count=10)  # type: ignore[arg-type]
    counter = COUNTERS[Scripted.key()]
    assert 100 <= counter.steps < RARE_FROM_STEP and "rare" not in counter.rules


def test_with_a_cap_the_runs_go_on_past_the_target_until_every_rule_ran() -> None:
    run_lockstep(Scripted, 100, step_count=10, every_rule_by=2_000)  # type: ignore[arg-type]
    counter = COUNTERS[Scripted.key()]
    assert "rare" in counter.rules and RARE_FROM_STEP <= counter.steps < 2_000


def test_the_cap_bounds_the_runs_when_a_rule_never_comes() -> None:
    run_lockstep(Scripted, 100, step_count=10, every_rule_by=300)  # type: ignore[arg-type]
    counter = COUNTERS[Scripted.key()]
    assert 300 <= counter.steps < RARE_FROM_STEP and "rare" not in counter.rules


def test_a_target_beyond_the_cap_is_still_reached() -> None:
    run_lockstep(Scripted, 1_000, step_count=10, every_rule_by=300)  # type: ignore[arg-type]
    assert COUNTERS[Scripted.key()].steps >= 1_000


@pytest.mark.parametrize("derandomized", [True, False])
def test_every_batch_after_the_first_runs_new_examples_under_a_derandomized_profile(
    monkeypatch: pytest.MonkeyPatch, derandomized: bool
) -> None:
    """Under a derandomized profile Hypothesis derives a call's seed from the machine, so
    the loop seeds each later batch itself (else a batch replays the first one's runs);
    under a random profile every call draws a fresh seed and the loop leaves it alone."""
    seeds: list[int] = []
    monkeypatch.setattr(harness, "seeded", lambda value: seeds.append(value) or (lambda machine: machine))
    settings = harness.settings
    before = settings.get_current_profile_name()
    settings.register_profile(f"budget-{derandomized}", settings.get_profile(before), derandomize=derandomized)
    settings.load_profile(f"budget-{derandomized}")
    try:
        batches = batches_of_a_run(monkeypatch)
    finally:
        settings.load_profile(before)
    assert len(batches) > 2, "the script takes several batches to reach the rare rule"
    if derandomized:
        assert seeds == list(range(1, len(batches)))
    else:
        assert seeds == []


def batches_of_a_run(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The examples of each batch ``run_lockstep`` ran, for the scripted machine."""
    batches: list[int] = []

    def counting(machine: Any, settings: Any) -> None:
        batches.append(settings.max_examples)
        scripted_runs(machine, settings)

    monkeypatch.setattr(harness, "run_state_machine_as_test", counting)
    run_lockstep(Scripted, 100, step_count=40, every_rule_by=2_000)  # type: ignore[arg-type]
    return batches
