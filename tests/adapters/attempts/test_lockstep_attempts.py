"""The attempt kernel and the ledger in lockstep on the test servers
(:mod:`tenure.conformance.lockstep.attempts` holds the machine), and a mutant ledger it must catch.
"""

from __future__ import annotations

from typing import Any

import adapter_support
import pytest

from tenure.conformance.lockstep.attempts import AttemptLockstep
from tenure.conformance.lockstep.harness import budget, run_lockstep
from tenure.conformance.lockstep.harness import machine_for as harness_machine_for
from tenure.kernel.attempts import finders


def machine_for(base: Any, database: str, *, only: frozenset[str] | None = None) -> Any:
    return harness_machine_for(base, adapter_support.LockstepDatabases(database), only=only)


LOCKSTEP_STEPS = budget({"sqlite": 2_000, "postgresql": 2_000})
"""Steps CI runs per database (``TENURE_LOCKSTEP_STEPS=N`` overrides; see docs/testing.md).
Every rule has run by step 327 (measured December 2026): more than three times that;
the long runs (20,000 steps on each) are ``.ci/soak``'s. Lowered from 6,000 when CI had
to fit in 20 minutes (issue 48), and before that from 10,000."""


EVERY_RULE_BY = 4_000
"""How far a run goes past :data:`LOCKSTEP_STEPS` for a rule that has not run yet (the
rules a run chooses depend on the database's answers; then ``every_rule_ran`` fails it)."""


@pytest.mark.slow
@pytest.mark.parametrize("database", adapter_support.AVAILABLE_DATABASES)
def test_the_attempt_kernel_and_the_ledger_stay_in_lockstep(
    database: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    adapter_support.prepare_machine_databases(database, request)
    machine = machine_for(AttemptLockstep, database)
    summary = run_lockstep(machine, LOCKSTEP_STEPS[database], step_count=40, every_rule_by=EVERY_RULE_BY)
    with capsys.disabled():
        print("\n" + summary)
    adapter_support.every_rule_ran(machine)


@pytest.mark.parametrize("database", ["postgresql"])
def test_the_lockstep_catches_a_ledger_that_decides_without_locking_the_attempt(
    database: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A mutant whose attempt finder takes no row lock lets two concurrent calls decide on
    the same record: the racing rules must find that no serial order explains it. (SQLite
    has no such mutant: its write lock serializes whole transactions.)"""
    import dataclasses

    adapter_support.prepare_machine_databases(database, request)
    monkeypatch.setattr(finders, "by_keys", dataclasses.replace(finders.by_keys, lock="none"))
    # The ledger's writes run as transactions here (the path every fallback takes), whose
    # unlocked read leaves a wide window between the read and the write. The one-statement
    # path's window is a few microseconds inside one statement, too narrow to race
    # reliably; its lock is held to account by tests/adapters/postgres/test_ahead_postgres.py instead (the
    # same unlocked finder writes after a lease ran out behind a lock wait).
    from tenure.adapters.core.engine import DecidedAhead

    async def no_statement_ahead(*arguments: Any, **keywords: Any) -> None:
        return None

    monkeypatch.setattr(DecidedAhead, "on_keys", no_statement_ahead)
    focused = machine_for(AttemptLockstep, database, only=frozenset({"prepare", "concurrent_first_submissions",
                                                                     "racing_observations", "begin_submit"}))
    findings = adapter_support.lockstep_findings(focused, max_examples=300, step_count=30)
    assert any("no serial order explains" in finding for finding in findings), findings
