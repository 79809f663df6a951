"""The suite's long tests, and the order that starts them first under pytest-xdist.

With ``-n N --dist worksteal`` (as ``.ci/test-all.sh`` runs the suite) pytest-xdist hands
each worker a contiguous share of the collected tests, in order, and an idle worker then
steals the second half of the longest queue. A test of several minutes that sits late in
a share starts late and ends the run alone, the other workers idle. :func:`ordered`
therefore deals the long tests out first: longest first, each to the share whose long
tests add up to the least (the classic longest-processing-time rule), at the front of its
share, so that every worker starts on its long tests and steals only short ones.

:data:`LONG_TESTS` holds rough figures (seconds on a loaded 2-core machine, from
``--durations``), used only to order and spread: a wrong figure costs minutes of wall
time, never a result. ``tests/test_suite_schedule.py`` fails when an entry matches no
test (a renamed test would silently lose its place).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TypeVar

__all__ = ["LONG_TESTS", "weight", "shares", "ordered"]

LONG_TESTS: dict[str, float] = {
    # The teeth: a broken store or kernel must fail.
    "tests/conformance/command/test_conform.py::test_a_store_that_reads_the_clock_before_its_last_lock": 60,
    "tests/conformance/command/test_plugin.py::test_the_plugin_fails_a_broken_store": 15,
    "tests/kernel/test_contracts.py::test_crosshair_finds_a_counterexample": 10,
    "tests/kernel/test_mutants.py::test_the_suite_catches_the_mutant": 25,
    # tenure conform and its plugin on every database.
    "tests/conformance/command/test_plugin.py::test_the_plugin_runs_against_postgresql": 130,
    "tests/conformance/command/test_plugin.py::test_a_selection_picks": 50,
    "tests/conformance/command/test_conform.py::test_conform_through_pgbouncer": 60,
    "tests/conformance/command/test_conform.py::test_conform_on_postgresql": 50,
    # Processes killed, frozen and restarted.
    "tests/processes/test_chaos.py::test_postgresql_workers": 100,
    "tests/processes/test_chaos.py::test_sqlite_workers": 80,
    "tests/processes/test_task_chaos.py::": 70,
    "tests/processes/test_run_chaos.py::": 50,
    "tests/processes/test_run_outage.py::": 40,
    # Lockstep runs at CI's budgets.
    "tests/adapters/queue/test_lockstep.py::test_kernel_model_and_database_stay_in_lockstep[postgresql]": 80,
    "tests/adapters/queue/test_lockstep.py::test_kernel_model_and_database_stay_in_lockstep[sqlite]": 30,
    "tests/adapters/attempts/test_lockstep_attempts.py::test_the_attempt_kernel_and_the_ledger_stay_in_lockstep": 35,
    "tests/adapters/runs/test_lockstep_runs.py::test_the_run_kernels_and_the_ledger_stay_in_lockstep": 45,
    # Large property runs and explorations.
    "tests/kernel/test_recovery_table.py::test_every_verdict_keeps_the_recovery_rules": 90,
    "tests/kernel/test_machine_tables.py::test_the_transitions_oracle_picks_the_same_row_as_the_kernel": 55,
    "tests/conformance/explore/test_explore_replay_attempts.py::test_a_mutants_attempt_trace_replays": 40,
    "tests/conformance/explore/test_explore_replay_runs.py::test_a_mutants_run_trace_replays": 40,
    "tests/conformance/explore/test_explore_replay_runs.py::test_the_command_line_writes_a_run_replay": 45,
    "tests/conformance/explore/test_explore_runs.py::test_every_property_holds_for_the_real_kernel": 30,
    "tests/conformance/explore/test_explore_queue.py::test_every_property_holds_in_every_state": 30,
    "tests/conformance/explore/test_explore_attempts.py::test_every_property_holds_for_the_kernel": 30,
}
"""Test ID prefix (path relative to the repository, ``::``, the start of the test's name)
-> rough seconds. The longest matching prefix gives a test its figure; the others are 0."""

Item = TypeVar("Item")


def weight(node_id: str) -> float:
    """A test's figure in :data:`LONG_TESTS` (0 for a short test)."""
    matches = [prefix for prefix in LONG_TESTS if node_id.startswith(prefix)]
    return LONG_TESTS[max(matches, key=len)] if matches else 0.0


def shares(count: int, workers: int) -> list[int]:
    """How many tests worksteal hands each worker first: the pending tests split evenly
    among the idle workers, one after the other (pytest-xdist's ``check_schedule``)."""
    sizes = []
    left = count
    for index in range(workers):
        size = left // (workers - index)
        sizes.append(size)
        left -= size
    return sizes


def ordered(items: Sequence[Item], node_ids: Sequence[str], workers: int) -> list[Item]:
    """``items`` (whose IDs are ``node_ids``) in the order that starts the long tests first
    on every one of ``workers``; the short tests keep their collection order."""
    weights = [weight(node_id) for node_id in node_ids]
    long_first = sorted((index for index, figure in enumerate(weights) if figure > 0),
                        key=lambda index: (-weights[index], index))
    bins: list[list[int]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for index in long_first:
        lightest = loads.index(min(loads))
        bins[lightest].append(index)
        loads[lightest] += weights[index]
    short = iter(index for index, figure in enumerate(weights) if figure == 0)
    order: list[int] = []
    for size, long_ones in zip(shares(len(items), workers), bins):
        order.extend(long_ones)
        order.extend(itertools.islice(short, max(0, size - len(long_ones))))
    order.extend(short)  # none left unless a share held more long tests than its size
    return [items[index] for index in order]
