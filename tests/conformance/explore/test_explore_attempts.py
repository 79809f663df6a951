"""The explorer over the service-attempt machine in its surroundings (conformance/explore/attempts.py).

Every interleaving of two senders, a reconciler, the operator, the provider and the clock
around one attempt, at the standard bounds: every property holds for the kernel, and
each attempt mutant of kernel_mutants.py is caught by a property of the world (what the
provider truly did, what the Run and the generations show), with a shortest trace.
Run with ``-s`` to see the state counts and the traces.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

import paths
import pytest
from kernel_mutants import ATTEMPT_MUTANTS

from tenure.kernel.attempts.commands import AttemptCommand
from tenure.kernel.attempts.machine import ATTEMPTS
from tenure.kernel.attempts.record import AttemptRow
from tenure.kernel.core import Applied, Decision, Refused
from tenure.conformance.explore.attempts import (
    KERNEL_CHECKS,
    PROPERTIES,
    STANDARD,
    WORLD_PROPERTIES,
    AttemptModel,
    Configuration,
    World,
)
from tenure.conformance.explore.engine import Exploration, explore, trace_table


def _counts(result: Exploration[Any]) -> str:
    return (f"{result.model}: {result.states} states, {result.transitions} transitions, depth {result.depth}"
            f" of {result.max_depth}, exhausted={result.exhausted}")


@pytest.mark.parametrize(("model", "max_depth"), STANDARD, ids=[model.name for model, _ in STANDARD])
def test_every_property_holds_for_the_kernel_at_the_standard_bounds(
    model: AttemptModel, max_depth: int, capsys: pytest.CaptureFixture[str]
) -> None:
    result = explore(model, max_depth=max_depth)
    with capsys.disabled():
        print(f"\n{_counts(result)}")
        if result.violation is not None:
            print(trace_table(result.violation, model.describe))
    assert result.violation is None
    # The bound is never what stops it: every reachable state of the world was visited.
    assert result.exhausted and result.depth < max_depth
    assert max_depth >= 12


def test_the_standard_bounds_run_every_provider_kind_and_every_property() -> None:
    assert {model.configuration.provider for model, _ in STANDARD} == {"replay", "lookup_only", "neither", "lying"}
    assert all(model.configuration.senders == 2 for model, _ in STANDARD)
    assert any(model.configuration.generations == 2 for model, _ in STANDARD)
    assert all(model.properties == PROPERTIES for model, _ in STANDARD)
    assert PROPERTIES == WORLD_PROPERTIES + KERNEL_CHECKS
    assert len({prop.name for prop in PROPERTIES}) == len(PROPERTIES)
    assert all(prop.spec for prop in PROPERTIES)


def test_the_standard_worlds_let_in_every_surrounding() -> None:
    """Stale reports, a rejection beside another transmission in flight and stale lookups
    are all possible in every standard world: the kernel assumes none of them away (until
    December 2026 it needed all three left out; the mutants that put each defect back are
    caught below)."""
    for model, _ in STANDARD:
        configuration = model.configuration
        assert configuration.stale_reports and configuration.rejections_beside_another_in_flight
        assert configuration.stale_lookups


# --- the canonical key forgets only what no decision reads ----------------------------------

_PAST_US = 3_600_000_000


def _untimed(row: AttemptRow, now_us: int) -> tuple[Any, ...]:
    """A row as the canonical key sees it: no evidence, instants relative to now, past ones alike."""
    values = []
    for field in dataclasses.fields(row):
        value = getattr(row, field.name)
        if field.name == "evidence":
            continue
        if field.name.endswith("_us") and value is not None:
            value = max(value - now_us, 0)
        values.append(value)
    return tuple(values)


class _ProbedModel(AttemptModel):
    """Decides every command twice: on the row, and on the row with another evidence log and
    its past instants further in the past; the two decisions must agree but for those."""

    probes = 0

    def _decide(self, state: World, generation: int, command: AttemptCommand) -> tuple[Decision, World]:
        decision, after = super()._decide(state, generation, command)
        row = state.rows[generation]
        if row is not None:
            now = state.now_us
            lease = row.submit_lease_expires_at_us
            other_row = dataclasses.replace(
                row, evidence=("probe",), created_at_us=row.created_at_us - _PAST_US,
                updated_at_us=row.updated_at_us - _PAST_US,
                submit_lease_expires_at_us=lease - _PAST_US if lease is not None and lease <= now else lease,
            )
            # A lookup's instant is in the past too (or now): it moves back with the others.
            other_command: Any = command
            for field in ("looked_up_at_us", "proof_looked_up_at_us"):
                if getattr(command, field, None) is not None:
                    other_command = dataclasses.replace(other_command, **{field: getattr(command, field) - _PAST_US})
            other = ATTEMPTS.decide(other_row, other_command, now)
            if isinstance(decision, Refused):
                assert isinstance(other, Refused) and other.reason is decision.reason, (row, command)
            else:
                assert isinstance(decision, Applied) and isinstance(other, Applied), (row, command)
                assert other.reply == decision.reply
                assert decision.new_record is not None and other.new_record is not None
                assert _untimed(other.new_record, now) == _untimed(decision.new_record, now), (row, command)
            _ProbedModel.probes += 1
        return decision, after


@pytest.mark.parametrize("configuration", [model.configuration for model, _ in STANDARD[:3]],
                         ids=[model.name for model, _ in STANDARD[:3]])
def test_no_decision_of_a_reachable_world_reads_what_the_canonical_key_leaves_out(
    configuration: Configuration,
) -> None:
    _ProbedModel.probes = 0
    result = explore(_ProbedModel(configuration), max_depth=32)
    assert result.violation is None and result.exhausted
    assert _ProbedModel.probes > result.transitions


def test_interchangeable_senders_share_one_canonical_state() -> None:
    model = STANDARD[0][0]
    start = model.initial()
    firsts = {step.actor: after for step, after in model.successors(start) if step.action == "prepare g1"}
    assert set(firsts) == {"sender-1", "sender-2"}
    granted = [
        after for prepared in firsts.values() for step, after in model.successors(prepared)
        if step.action == "begin_submit g1" and not step.detail.endswith("lost")
    ]
    assert len(granted) == 4 and granted[0] != granted[1]
    # Sender 1 or sender 2 holding the grant is one state to the explorer.
    assert len({model.canonical(world) for world in granted}) == 1


# --- teeth: every attempt mutant is caught by a property of the world -----------------------

CAUGHT_BY = {
    "fabricate_failure_on_timeout": ("replay", "no_fabricated_failure"),
    "resubmit_without_proof": ("lookup_only", "at_most_one_transmission_without_proof_of_no_effect"),
    "accept_second_identity": ("lying", "identity_recorded_once"),
    "release_while_indeterminate": ("replay", "reservation_kept_until_contained"),
    "new_generation_over_open_one": ("neither", "new_generation_only_over_a_failed_or_cancelled_one"),
    "not_found_during_lease_proves_no_effect": ("lookup_only", "at_most_one_transmission_without_proof_of_no_effect"),
    "rejection_of_any_transmission_fails": ("replay", "no_fabricated_failure"),
    "rejection_beside_an_earlier_one_fails": ("replay", "no_fabricated_failure"),
    "not_found_judged_when_decided": ("lookup_only", "at_most_one_transmission_without_proof_of_no_effect"),
    "prepare_ignores_closed_run": ("replay", "closed_run_has_no_open_attempt"),
    "cancelled_on_request": ("replay", "cancel_contained_only_when_resolved"),
}
"""Which standard world (by provider) and which property of the world catch each mutant
(the kernel's own record and transition checkers are left out, so that the catch is what
the world sees). The expected world is explored first, then the others in order: a
mutant caught in none of them fails."""

_SCRIPT = """
import json, sys
sys.path.insert(0, "tests/support")
import kernel_mutants
kernel_mutants.apply("attempts:" + sys.argv[1])
from tenure.conformance.explore.attempts import STANDARD, WORLD_PROPERTIES, AttemptModel
from tenure.conformance.explore.engine import explore, trace_table
first = [pair for pair in STANDARD if pair[0].configuration.provider == sys.argv[2]]
for standard, max_depth in first + [pair for pair in STANDARD if pair not in first]:
    model = AttemptModel(standard.configuration, WORLD_PROPERTIES)
    result = explore(model, max_depth=max_depth)
    if result.violation is not None:
        print(json.dumps({"world": model.name, "property": result.violation.property.name,
                          "actions": len(result.violation.trace), "states": result.states,
                          "table": trace_table(result.violation, model.describe)}))
        break
"""


def test_every_attempt_mutant_has_its_expected_catch() -> None:
    assert set(CAUGHT_BY) == set(ATTEMPT_MUTANTS)
    assert {prop for _, prop in CAUGHT_BY.values()} <= {prop.name for prop in WORLD_PROPERTIES}
    assert {world for world, _ in CAUGHT_BY.values()} <= {model.configuration.provider for model, _ in STANDARD}


@pytest.mark.parametrize("mutant", sorted(ATTEMPT_MUTANTS))
def test_the_explorer_catches_the_attempt_mutant_with_a_shortest_trace(
    mutant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A mutant patches the kernel's tables in place: each runs in its own interpreter.
    world, expected = CAUGHT_BY[mutant]
    finished = subprocess.run([sys.executable, "-P", "-c", _SCRIPT, mutant, world], cwd=paths.ROOT, capture_output=True,
                              text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert finished.stdout.strip(), f"no standard world catches {mutant}"
    caught = json.loads(finished.stdout.strip().splitlines()[-1])
    with capsys.disabled():
        print(f"\n{mutant}: caught by {caught['property']} in {caught['world']} after {caught['actions']} actions"
              f" ({caught['states']} states)\n{caught['table']}")
    assert caught["property"] == expected and caught["world"].startswith(f"attempts:{world} ")
