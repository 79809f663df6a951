"""The explorer over workflow Runs (tenure.conformance.explore.runs).

Every property holds for the real kernel in every world of ``STANDARD``, to its bound;
the state counts are printed each time. Every deliberately broken kernel of the Run,
consent, delegated-job, message, recovery and node machines (tests/support/kernel_mutants.py)
that the bounds can reach makes the explorer report a named property with a shortest
trace, printed as a table; :data:`MISSED` says why the others are out of reach. Each
mutant runs in a fresh interpreter (a mutant patches the kernel in place).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import paths
import pytest
from kernel_mutants import (
    AGENT_JOB_MUTANTS,
    CONSENT_MUTANTS,
    MESSAGE_MUTANTS,
    NODE_MUTANTS,
    RECOVERY_MUTANTS,
    RUN_MUTANTS,
)

from tenure.conformance.explore import engine
from tenure.conformance.explore.runs import STANDARD, RunModel

ROOT = paths.ROOT
STATE_GUARD = 400_000
"""``max_states`` for every exploration here: a bound cut short by it fails the test."""

CAUGHT: dict[str, tuple[str, str, int]] = {
    # mutant: (world of STANDARD, the property that names it, the shortest trace's length)
    "runs:timer_resumed_before_due": ("recovery", "wait_resumed_only_by_its_owner", 5),
    "runs:timer_due_time_moved_by_resume": ("recovery", "records_keep_their_invariants", 6),
    "runs:claim_replayed_to_any_claimant": ("recovery", "one_hop_per_run", 5),
    "runs:claim_records_the_node_not_the_claimant": ("recovery", "a_lost_claim_acknowledgement_is_answered", 4),
    "runs:result_kept_with_failure": ("recovery", "records_keep_their_invariants", 5),
    "runs:resume_without_owner_check": ("consents", "wait_resumed_only_by_its_owner", 7),
    "runs:claim_ignores_sequence": ("recovery", "a_claim_takes_only_the_hop_it_names", 6),
    "runs:settle_over_cancelling": ("recovery", "a_cancellation_ends_cancelled", 6),
    "runs:cancelled_without_containment": ("delegates", "terminal_run_has_every_effect_contained", 7),
    "runs:replay_reroutes": ("admissions", "a_run_keeps_its_identity_and_route", 3),
    "runs:rotation_loses_resume_mode": ("recovery", "a_hop_keeps_its_resume_mode", 9),
    "runs:time_out_before_the_deadline": ("deadlines", "a_run_times_out_only_past_its_deadline_and_says_so", 2),
    "runs:time_out_without_its_reason": ("deadlines", "a_run_times_out_only_past_its_deadline_and_says_so", 3),
    "runs:time_out_without_a_deadline": ("consents", "a_run_times_out_only_past_its_deadline_and_says_so", 1),
    "runs:deadline_forgotten_at_admission": ("deadlines", "decisions_keep_the_transition_rules", 1),
    "runs:time_out_of_a_finished_run": ("deadlines", "records_keep_their_invariants", 7),
    "consent:second_verdict_wins": ("consents", "the_first_verdict_wins", 6),
    "consent:expire_before_the_deadline": ("consents", "the_deadline_owner_expires_only_when_due", 5),
    "consent:expire_a_second_early": ("consents", "the_deadline_owner_expires_only_when_due", 6),
    "consent:expire_without_a_deadline": ("consents", "the_deadline_owner_expires_only_when_due", 5),
    "agent_jobs:result_adopted_twice": ("delegates", "a_delegated_result_is_adopted_once", 6),
    "agent_jobs:containment_overwrites_an_adopted_end": ("children", "a_delegated_result_is_adopted_once", 11),
    "messages:second_message_overwrites_the_first": ("messages", "a_message_is_delivered_at_most_once", 6),
    "messages:lost_hop_takes_a_message": ("messages", "decisions_keep_the_transition_rules", 6),
    "messages:timed_out_before_the_deadline": ("messages", "decisions_keep_the_transition_rules", 5),
    "messages:message_to_a_finished_run_stored": ("messages", "decisions_keep_the_transition_rules", 2),
    "messages:changed_message_replayed": ("messages", "a_message_id_names_one_message", 2),
    "recovery:reconcile_touches_other_node": ("recovery", "recovery_never_fences_a_live_hop_of_another_node", 5),
    "recovery:repark_without_snapshot_evidence": ("consents", "recovery_verdicts_keep_the_recovery_rules", 6),
    "recovery:republish_under_new_key": ("recovery", "recovery_verdicts_keep_the_recovery_rules", 3),
    "recovery:held_failed_by_relay": ("admissions", "recovery_verdicts_keep_the_recovery_rules", 2),
    "recovery:terminal_fence_of_a_live_hop": ("recovery", "recovery_verdicts_keep_the_recovery_rules", 3),
    "recovery:lost_hop_retried_without_allowance": ("recovery", "recovery_verdicts_keep_the_recovery_rules", 5),
    "recovery:timer_resumed_by_a_relay_before_due": ("recovery", "recovery_verdicts_keep_the_recovery_rules", 5),
    "recovery:retry_cancels_its_delegated_jobs_first": ("delegates", "recovery_verdicts_keep_the_recovery_rules", 6),
    "nodes:takeover_of_a_live_node": ("leases", "takeovers_only_of_lapsed_leases", 1),
    "nodes:takeover_before_expiry": ("leases", "recovery_never_fences_a_live_hop_of_another_node", 2),
    "nodes:renewal_after_expiry": ("leases", "a_lapsed_lease_returns_only_by_a_boot", 2),
    "nodes:stale_incarnation_renews": ("leases", "only_the_current_incarnation_renews", 2),
    "nodes:takeover_claim_stolen": ("takers", "one_taker_at_a_time", 3),
}

MISSED: dict[str, tuple[str, str]] = {
    # mutant: (the world that would reach it if anything did, why no interleaving does)
    "recovery:retry_beside_an_open_attempt": (
        "delegates",
        "the explorer's worlds start no service attempts (a Run's containment counts only its delegated jobs), so "
        "the retry_attempts guards never decide there: caught by tests/kernel/test_mutants.py (the recovery table's "
        "tests and its property over generated situations)"),
    "runs:retry_without_retries_left": (
        "delegates",
        "retry_lost is sent only by recovery, whose retry_left guard (REC-11) reads the same hop_retries the kernel "
        "fences on, and every retry moves the sequence, so no interleaving sends it with no retry left: the "
        "kernel's guard is defence in depth, caught by tests/kernel/test_run_properties.py"),
    "runs:claim_serves_any_workflow": (
        "recovery",
        "every worker of the explorer's worlds serves the one workflow version its Runs are pinned to (its claims "
        "name none), so the not_served guard never decides there; a worker of another version is a rolling deploy, "
        "caught by tests/kernel/test_run_properties.py, tests/adapters/runs/test_run_worker.py and "
        "tests/adapters/app/test_app_workflows.py"),
    "runs:replay_ignores_the_timeout": (
        "deadlines",
        "the explorer's callers replay with the timeout they admitted with; a replay with another one changes "
        "nothing stored whether it is refused or answered (the conflict is only the caller's answer): caught by "
        "tests/kernel/test_run_properties.py and tests/adapters/runs/test_run_timeouts.py"),
    "messages:message_wait_resumed_by_a_cancelled_receive": (
        "messages",
        "a receive is cancelled only by its Run's own terminal sweep (settle, finish_cancel), in the transaction "
        "that made the Run terminal, and a terminal Run never resumes: no interleaving meets a Run waiting on a "
        "cancelled receive, so counting a cancellation as an answer changes no decision; caught by "
        "tests/kernel/test_message_properties.py"),
    "recovery:settle_recorded_from_an_earlier_hop": (
        "recovery",
        "a recorded outcome is written only under the hop's fence (RUNNING at its sequence), removed by the "
        "settlement, and cleared by retry_lost; a hop that recorded one finished (no park), and recovery never "
        "retries it (REC-10): no reachable checkpoint holds an outcome of an earlier sequence"),
}

SCRIPT = """
import json, os, sys
import kernel_mutants
kernel_mutants.apply(os.environ["TENURE_KERNEL_MUTANT"])
from tenure.conformance.explore import engine, runs
model, depth = next((model, depth) for model, depth in runs.STANDARD if model.bounds.name == sys.argv[1])
result = engine.explore(model, max_depth=depth, max_states=int(sys.argv[2]))
found = result.violation
print(json.dumps({"states": result.states, "depth": result.depth, "violation": None if found is None else {
    "property": found.property.name, "length": len(found.trace), "table": engine.trace_table(found, model.describe)}}))
"""


def _report(text: str) -> None:
    # stderr: pytest-xdist passes a worker's stderr on (its stdout it keeps).
    sys.stderr.write(f"\n{text}\n")


def _explore_mutant(mutant: str, world: str) -> dict[str, Any]:
    environment = {**os.environ, "TENURE_KERNEL_MUTANT": mutant,
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests" / "support"),
                                                               os.environ.get("PYTHONPATH")]))}
    finished = subprocess.run([sys.executable, "-P", "-c", SCRIPT, world, str(STATE_GUARD)], cwd=ROOT,
                              env=environment, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    answer: dict[str, Any] = json.loads(finished.stdout.strip().splitlines()[-1])
    return answer


IN_THE_SUITE = [(model, depth) for model, depth in STANDARD if model.bounds.name != "hops"]
"""Every standard world but the largest (2 workers x 2 Runs to 12 actions: several minutes
of one core), which is the soak's: ``bash .ci/soak`` runs ``python -m
tenure.conformance.explore`` over every standard world, failing on any broken property."""


@pytest.mark.parametrize(("model", "depth"), IN_THE_SUITE, ids=[model.bounds.name for model, _ in IN_THE_SUITE])
def test_every_property_holds_for_the_real_kernel_at_the_standard_bound(
        model: RunModel, depth: int, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.perf_counter()
    result = engine.explore(model, max_depth=depth, max_states=STATE_GUARD)
    seconds = time.perf_counter() - started
    with capsys.disabled():
        _report(f"{model.name}: {result.states} states, {result.transitions} transitions, depth {result.depth} "
                f"of {depth}{' (exhausted)' if result.exhausted else ''}, {seconds:.1f} s")
        if result.violation is not None:
            _report(engine.trace_table(result.violation, model.describe))
    assert result.violation is None
    assert result.states < STATE_GUARD, "the state guard cut the bound short"
    assert result.depth == depth or result.exhausted


def test_every_mutant_of_the_run_side_machines_is_either_caught_or_explained() -> None:
    every = {f"{machine}:{name}" for machine, mutants in (
        ("runs", RUN_MUTANTS), ("consent", CONSENT_MUTANTS), ("agent_jobs", AGENT_JOB_MUTANTS),
        ("recovery", RECOVERY_MUTANTS), ("nodes", NODE_MUTANTS), ("messages", MESSAGE_MUTANTS))
        for name in mutants}
    assert set(CAUGHT) | set(MISSED) == every
    assert not set(CAUGHT) & set(MISSED)
    worlds = {model.bounds.name for model, _ in STANDARD}
    assert {world for world, _, _ in CAUGHT.values()} | {world for world, _ in MISSED.values()} <= worlds


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(CAUGHT))
def test_the_explorer_names_the_property_each_mutant_breaks_with_a_shortest_trace(
        mutant: str, capsys: pytest.CaptureFixture[str]) -> None:
    world, expected, length = CAUGHT[mutant]
    answer = _explore_mutant(mutant, world)
    found = answer["violation"]
    with capsys.disabled():
        if found is None:
            _report(f"{mutant} ({world}): not caught in {answer['states']} states")
        else:
            _report(f"{mutant} ({world}): {found['property']}, {found['length']} actions\n{found['table']}")
    assert found is not None, f"{mutant} was not caught in {answer['states']} states"
    assert (found["property"], found["length"]) == (expected, length)


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(MISSED))
def test_a_mutant_out_of_the_explorers_reach_stays_unreported_at_the_standard_bound(
        mutant: str, capsys: pytest.CaptureFixture[str]) -> None:
    world, why = MISSED[mutant]
    answer = _explore_mutant(mutant, world)
    with capsys.disabled():
        _report(f"{mutant} ({world}): {answer['states']} states, not reachable: {why}")
    # If this fails the model now reaches the mutant: move it to CAUGHT.
    assert answer["violation"] is None
