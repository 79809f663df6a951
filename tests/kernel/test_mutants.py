"""Every deliberately broken kernel in kernel_mutants.py makes the behavioural suite fail.

Each mutant runs the guarantee and property tests in a process of its own with
TENURE_KERNEL_MUTANT set (conftest.py applies it), forked from an interpreter that has
already imported pytest, Hypothesis and the kernel (forked_pytest.py says why). The
spec-table comparison is left out on purpose: it would catch every table edit, but the
point is that the tests of behaviour catch the bug.
"""

from __future__ import annotations

import os

import paths
import pytest
from forked_pytest import run_pytest
from kernel_mutants import BEHAVIOURAL_TESTS, MUTANTS

pytestmark = pytest.mark.slow

ROOT = paths.ROOT
CASES = [f"{machine}:{mutant}" for machine, mutants in sorted(MUTANTS.items()) for mutant in sorted(mutants)]


@pytest.mark.parametrize("mutant", CASES)
def test_the_suite_catches_the_mutant(mutant: str) -> None:
    environment = {**os.environ, "TENURE_KERNEL_MUTANT": mutant}
    machine = mutant.partition(":")[0]
    finished = run_pytest(["-x", "-q", "-p", "no:cacheprovider", *BEHAVIOURAL_TESTS[machine]],
                          environment=environment, directory=ROOT, timeout_s=600)
    # Exit code 1 means tests ran and some failed (2+ would be an error in the harness,
    # -9 a run killed by the hang guard).
    assert finished.returncode == 1, finished.output[-6000:]
    assert " failed" in finished.output
