"""The suite's own machinery: the order that starts the long tests first (long_tests.py)
and the stress mode's burners (stress.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import long_tests
import paths
import pytest
import stress


def test_every_long_test_entry_names_collected_tests() -> None:
    collected = subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=paths.ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    node_ids = [line for line in collected.stdout.splitlines() if "::" in line]
    assert len(node_ids) > 1000, collected.stdout[-2000:] + collected.stderr[-2000:]
    unmatched = [prefix for prefix in long_tests.LONG_TESTS if not any(node.startswith(prefix) for node in node_ids)]
    assert unmatched == [], "entries of LONG_TESTS that match no test (renamed?)"


def test_the_long_tests_head_every_workers_share_longest_first_and_balanced(monkeypatch: pytest.MonkeyPatch) -> None:
    node_ids = [f"tests/a.py::short_{n}" for n in range(40)]
    long_ids = {
        "tests/kernel/test_recovery_table.py::test_every_verdict_keeps_the_recovery_rules": 90,
        "tests/processes/test_chaos.py::test_sqlite_workers_x": 100,
        "tests/processes/test_chaos.py::test_postgresql_workers_x": 120,
        "tests/conformance/command/test_conform.py::test_a_store_that_reads_the_clock_before_its_last_lock_x": 360,
    }
    monkeypatch.setattr(long_tests, "LONG_TESTS", long_ids)  # the deal, apart from the suite's own figures
    node_ids[5:5] = list(long_ids)  # collected in the middle
    order = long_tests.ordered(node_ids, node_ids, workers=3)
    assert sorted(order) == sorted(node_ids)  # every test once
    sizes = long_tests.shares(len(node_ids), 3)
    first, second, third = order[:sizes[0]], order[sizes[0]:sizes[0] + sizes[1]], order[sizes[0] + sizes[1]:]
    # Longest first, each to the lightest share: 360 | 120 | 100 then 90 (the lightest).
    assert [first[0], second[0], third[0]] == [
        "tests/conformance/command/test_conform.py::test_a_store_that_reads_the_clock_before_its_last_lock_x",
        "tests/processes/test_chaos.py::test_postgresql_workers_x", "tests/processes/test_chaos.py::test_sqlite_workers_x"]
    assert third[1] == "tests/kernel/test_recovery_table.py::test_every_verdict_keeps_the_recovery_rules"
    short = [node for node in order if node.startswith("tests/a.py")]
    assert short == [f"tests/a.py::short_{n}" for n in range(40)]  # the short tests keep their order


def test_worksteal_shares_split_the_tests_as_pytest_xdist_does() -> None:
    assert long_tests.shares(10, 4) == [2, 2, 3, 3]
    assert sum(long_tests.shares(4_321, 4)) == 4_321


def test_a_stress_burner_spins_until_it_is_stopped() -> None:
    burners = stress.start(1)
    try:
        time.sleep(0.5)
        assert burners[0].poll() is None  # still spinning
    finally:
        stress.stop(burners)
    assert burners[0].returncode is not None
