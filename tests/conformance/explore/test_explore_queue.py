"""The bounded exhaustive explorer over the owned queue (tenure.conformance.explore.queue).

Every property holds in every state reachable within the standard bounds, and every
queue mutant of kernel_mutants.py is caught by the property the spec says it breaks,
with a shortest trace printed as a table.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import paths
import pytest
from kernel_mutants import MUTANTS

from tenure.conformance.explore.engine import Property, explore
from tenure.conformance.explore.queue import PROPERTIES, STANDARD, QueueModel
from tenure.model import QueueKind

pytestmark = pytest.mark.slow

HANG_GUARD_S = 900
"""Each mutant's exploration ends well within this, or the test fails (never hangs)."""

CAUGHT_BY = {
    # mutant: (the standard configuration that reaches it, the property it breaks)
    "skip_owner_check": (0, "writes_only_from_the_current_fence"),
    "accept_older_generation": (0, "writes_only_from_the_current_fence"),
    "accept_lease_ending_now": (0, "writes_only_from_the_current_fence"),
    "complete_cancel_requested_stream": (0, "cancel_requests_are_honoured"),
    "promote_legacy_row": (1, "replays_keep_the_admitted_submission"),
    "reuse_generation": (0, "claims_respect_tokens_and_due_times"),
    "ignore_stored_nonce": (0, "claims_respect_tokens_and_due_times"),
    "replay_changed_content": (0, "replays_keep_the_admitted_submission"),
    "legacy_write_on_owned_claim": (1, "writes_only_from_the_current_fence"),
    "requeue_expired_cancel_request": (0, "cancel_requests_are_honoured"),
    "claim_before_due": (0, "claims_respect_tokens_and_due_times"),
    "release_spends_the_attempt": (0, "release_returns_the_attempt"),
    "release_ignores_its_delay": (0, "release_returns_the_attempt"),
    "release_without_fence": (0, "writes_only_from_the_current_fence"),
    "release_after_the_lease": (0, "writes_only_from_the_current_fence"),
    "release_cancel_requested_stream": (0, "cancel_requests_are_honoured"),
    "release_running_launch": (0, "release_returns_the_attempt"),
    "retry_completed_job": (0, "finished_jobs_stay_finished"),
    "retry_keeps_spent_attempts": (0, "finished_jobs_stay_finished"),
    "retry_failed_stream": (0, "finished_jobs_stay_finished"),
    "claim_any_task_queue": (2, "claims_respect_tokens_and_due_times"),
    "progress_without_fence": (2, "writes_only_from_the_current_fence"),
    "progress_on_any_queue": (0, "progress_only_on_tasks"),
    "jitter_beyond_half": (0, "retries_wait_their_backoff"),
    "tasks_by_lowest_priority": (2, "claims_take_the_most_urgent_task_first"),
}

SCRIPT = textwrap.dedent("""
    import sys
    import kernel_mutants
    kernel_mutants.apply(sys.argv[1])
    from tenure.conformance.explore.engine import explore, trace_table
    from tenure.conformance.explore.queue import STANDARD
    model, depth = STANDARD[int(sys.argv[2])]
    found = explore(model, max_depth=depth)
    assert found.violation is not None, f"missed: {found.states} states, depth {found.depth}"
    print(found.violation.property.name, len(found.violation.trace))
    print(trace_table(found.violation, model.describe))
""")


def test_every_queue_mutant_has_a_configuration_and_a_property() -> None:
    assert sorted(CAUGHT_BY) == sorted(MUTANTS["queue"])
    names = {prop.name for prop in PROPERTIES}
    assert {name for _, name in CAUGHT_BY.values()} <= names


@pytest.mark.parametrize("configuration", range(1, len(STANDARD)))
def test_every_property_holds_in_every_state_within_the_standard_bounds(
    configuration: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """The smaller standard worlds; the largest (3 workers x 2 jobs, several minutes of
    one core) is the soak's (``bash .ci/soak`` runs ``python -m tenure.conformance.explore``
    over every standard world and fails on any broken property). Each queue mutant is
    still caught in the largest world by the test below, whose search stops at the
    mutant's shortest trace (at most 6 actions)."""
    model, depth = STANDARD[configuration]
    found = explore(model, max_depth=depth)
    assert found.violation is None, found.violation
    assert found.depth == depth or found.exhausted
    with capsys.disabled():
        print(f"\nexplore[{found.model}]: depth {found.depth}, {found.states:,} states, "
              f"{found.transitions:,} transitions")


@pytest.mark.parametrize("mutant", sorted(CAUGHT_BY))
def test_the_explorer_catches_the_mutant_with_a_shortest_trace(mutant: str, capsys: pytest.CaptureFixture[str]) -> None:
    configuration, expected = CAUGHT_BY[mutant]
    environment = {**os.environ, "PYTHONPATH": str(paths.ROOT / "tests" / "support")}
    finished = subprocess.run([sys.executable, "-P", "-c", SCRIPT, f"queue:{mutant}", str(configuration)],
                              capture_output=True, text=True, timeout=HANG_GUARD_S, check=False, env=environment)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    caught_by, length = finished.stdout.splitlines()[0].split()
    assert caught_by == expected, finished.stdout
    assert "broken: " + expected in finished.stdout  # the trace table names the property
    with capsys.disabled():
        print(f"\nqueue:{mutant}: caught by {caught_by} in {length} actions")


@pytest.mark.parametrize("world", [((QueueKind.VALIDATION, QueueKind.STREAMING), 3, 7), ((QueueKind.TASK,) * 2, 2, 9)],
                         ids=["validation+streaming", "two tasks"])
def test_the_worlds_are_the_same_on_the_compiled_deciders(world: tuple[tuple[QueueKind, ...], int, int]) -> None:
    """The explorer's worlds decided by the compiled deciders the adapters' decided-ahead
    statements run (``QueueModel(compiled=True)``) are the generic interpreter's: the same
    transitions into the same states, every property kept (depths kept to a few seconds;
    the equality of each decider with the interpreter is tests/kernel/test_compiled.py's)."""
    kinds, workers, depth = world
    seen: dict[bool, set[tuple[Any, str, Any]]] = {}
    for compiled in (False, True):
        model = QueueModel(kinds, workers, compiled=compiled)
        steps: set[tuple[Any, str, Any]] = set()

        def record(before: Any, step: Any, after: Any, into: set[tuple[Any, str, Any]] = steps) -> None:
            into.add((before, repr(step), after))

        model.properties = [*PROPERTIES, Property("recorded", "-", "every transition", step=record)]
        found = explore(model, max_depth=depth)
        assert found.violation is None, found.violation
        seen[compiled] = steps
    assert len(seen[False]) > 1_000 and seen[True] == seen[False]
