"""The Run kernels and the RunLedger in lockstep on the test servers
(:mod:`tenure.conformance.lockstep.runs` holds the machine and its model).
"""

from __future__ import annotations

import adapter_support
import pytest

from tenure.conformance.lockstep.harness import budget, machine_for, run_lockstep
from tenure.conformance.lockstep.runs import RunLockstep

LOCKSTEP_STEPS = budget({"sqlite": 6_000, "postgresql": 6_000})
"""Steps CI runs per database (``TENURE_LOCKSTEP_STEPS=N`` overrides; see docs/testing.md).
Lowered from 10_000 (SQLite) and 10_000 (PostgreSQL) when CI began to run
``tenure conform`` (the same machines, about 1,200 more steps each on SQLite, PostgreSQL
and PgBouncer) and the explorer (every interleaving of the kernel to 12 actions)."""


@pytest.mark.slow
@pytest.mark.parametrize("database", adapter_support.AVAILABLE_DATABASES)
def test_the_run_kernels_and_the_ledger_stay_in_lockstep(
    database: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    adapter_support.prepare_machine_databases(database, request)
    summary = run_lockstep(machine_for(RunLockstep, adapter_support.LockstepDatabases(database)), LOCKSTEP_STEPS[database], step_count=150)
    with capsys.disabled():
        print("\n" + summary)
