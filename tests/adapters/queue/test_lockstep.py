"""The owned queue's kernel-backed model and real databases in lockstep
(:mod:`tenure.conformance.lockstep.queue` holds the machine; these tests run it on the test
servers, with the budget CI gives it, and hold its teeth to account with mutant stores).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import adapter_support
import pytest

from tenure.conformance.lockstep.harness import LockstepBase, budget, run_lockstep
from tenure.conformance.lockstep.harness import machine_for as harness_machine_for
from tenure.adapters.core.engine import deciders
from tenure.adapters.core.engine import Engine
from tenure.conformance.lockstep.queue import LockstepMachine
from tenure.kernel.compiled import decider_of
from tenure.kernel.queue.commands import QueueCommandType as C


def machine_for(database: str, *, only: frozenset[str] | None = None) -> type[LockstepBase]:
    return harness_machine_for(LockstepMachine, adapter_support.LockstepDatabases(database), only=only)


LOCKSTEP_STEPS = budget({"sqlite": 2_500, "postgresql": 1_500})
"""Steps CI runs per database (``TENURE_LOCKSTEP_STEPS=N`` overrides; see docs/testing.md).
Every rule has run by step 31 on either database (measured December 2026), so these
budgets keep a wide margin on that count; the long runs (20,000 steps on each) are
``.ci/soak``'s. Lowered from 4,000 and 2,500, then from 12,000 and 8,000, when CI had to
fit in 20 minutes (issue 48), and before that from 20,000 and 10,000; a run that has not
yet chosen every rule goes on (``EVERY_RULE_BY``)."""


EVERY_RULE_BY = 8_000
"""How far a run goes past :data:`LOCKSTEP_STEPS` for a rule that has not run yet (the
rules a run chooses depend on the database's answers; then ``every_rule_ran`` fails it)."""


GENERIC_PATH_STEPS = budget({"postgresql": 400})
"""Steps of the PostgreSQL lockstep run on the generic interpreter the compiled deciders
are proven equal to (the reference; the full budget runs on the compiled path)."""


@pytest.mark.slow
@pytest.mark.parametrize("database", adapter_support.AVAILABLE_DATABASES)
def test_kernel_model_and_database_stay_in_lockstep(
    database: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    adapter_support.prepare_machine_databases(database, request)
    used = compiled_deciders_counted(monkeypatch)
    machine = machine_for(database)
    summary = run_lockstep(machine, LOCKSTEP_STEPS[database], every_rule_by=EVERY_RULE_BY)
    with capsys.disabled():
        print("\n" + summary)
    adapter_support.every_rule_ran(machine)
    if database == "postgresql":
        # Its decided-ahead statements ran on the compiled deciders (the lockstep's fenced
        # writes reach them when their row was remembered: heartbeats and releases, mostly).
        assert used[C.HEARTBEAT_OWNED] and used[C.RELEASE_OWNED], used


@pytest.mark.parametrize("database", ["postgresql"])
def test_the_lockstep_holds_on_the_generic_path_the_compiled_deciders_replace(
    database: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    adapter_support.prepare_machine_databases(database, request)
    monkeypatch.setattr(Engine, "compiled", False)
    used = compiled_deciders_counted(monkeypatch)
    run_lockstep(machine_for(database), GENERIC_PATH_STEPS[database], every_rule_by=EVERY_RULE_BY)
    assert not any(used.values()), used


def compiled_deciders_counted(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[Any]:
    """How often the engine's decided-ahead statements ran each compiled decider."""
    used: collections.Counter[Any] = collections.Counter()

    def counting(machine: Any, kind: Any) -> Any:
        decider = decider_of(machine, kind)
        if decider is None:
            return None

        def counted(*args: Any, **kwargs: Any) -> Any:
            used[kind] += 1
            return decider(*args, **kwargs)

        return counted

    monkeypatch.setattr(deciders, "decider_of", counting)
    return used


@pytest.mark.parametrize("database", adapter_support.AVAILABLE_DATABASES)
def test_the_lockstep_catches_an_adapter_that_skips_the_compare_and_set(
    database: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A mutant store whose UPDATE matches the row by ID alone (no compare-and-set) must
    make the lockstep fail: the racing-write rule exposes the lost update."""
    import re

    from tenure.adapters.core import store as shared_store

    adapter_support.prepare_machine_databases(database, request)
    module = shared_store  # every store takes its statements through SharedFinders
    original = module.statements_for

    def without_compare_and_set(binding: Any, caps: Any, schema: str | None = None) -> Any:
        statements = original(binding, caps, schema)
        update, update_seen = (re.sub(r"WHERE id = :old_key AND .* RETURNING", "WHERE id = :old_key RETURNING", sql)
                               for sql in (statements.update, statements.update_seen))
        assert update != statements.update and update_seen != statements.update_seen
        return dataclasses.replace(statements, update=update, update_seen=update_seen)

    monkeypatch.setattr(module, "statements_for", without_compare_and_set)
    # A SQLite heartbeat on a row its source has seen is written from that row, by the
    # from-seen compare-and-set, which the mutant drops too: the racing write is then
    # overwritten and the stored row departs from the model.
    expected = "QueueKind|adapter"
    if database == "postgresql":
        # A heartbeat is one decided-ahead statement there: its compare-and-set is the
        # pre-image comparison, which the mutant drops too. The racing write is then
        # overwritten by a decision made on the row last seen, and the stored row (or
        # the reply) departs from the model.
        from tenure.adapters.postgres import statements

        original_ahead = statements.ahead_sql.__wrapped__
        original_one = statements.ahead_one_sql.__wrapped__

        def without_pre_image(*arguments: Any) -> str:
            sql = original_ahead(*arguments)
            blind = re.sub(r"WHEN w\.present THEN l\.(\w+) IS NOT NULL AND .*? ELSE", r"WHEN w.present THEN l.\1 IS NOT NULL ELSE", sql)
            assert blind != sql
            return blind

        def one_without_pre_image(*arguments: Any) -> str:
            sql = original_one(*arguments)
            blind = re.sub(r"EXISTS \(SELECT 1 FROM locked l WHERE .*?\) ELSE", "EXISTS (SELECT 1 FROM locked l) ELSE", sql)
            assert blind != sql
            return blind

        monkeypatch.setattr(statements, "ahead_sql", without_pre_image)
        monkeypatch.setattr(statements, "ahead_one_sql", one_without_pre_image)
    findings = adapter_support.lockstep_findings(machine_for(database), max_examples=300, step_count=30)
    assert any(re.search(expected, finding) for finding in findings), findings


@pytest.mark.parametrize("database", ["postgresql"])
def test_the_lockstep_catches_a_batch_that_reads_the_clock_before_its_last_row_lock(
    database: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A mutant store that reads the clock as soon as the first row is locked (the shape
    tenure shipped before: the clock in the projection over the locked rows) must make
    the lockstep fail: the lock-contention rule sees a database time from before the
    batch's last lock was released. (SQLite has no such mutant: its write lock covers
    every row at once, before the clock is read.)"""
    adapter_support.prepare_machine_databases(database, request)
    from tenure.adapters.postgres import statements as module

    def clock_at_the_first_lock(locking_select: str) -> str:
        return (
            f"WITH locked AS MATERIALIZED ({locking_select}) "
            "SELECT clock_timestamp() AS now, locked.* FROM (SELECT 1) AS one LEFT JOIN locked ON true"
        )

    monkeypatch.setattr(module, "with_clock", clock_at_the_first_lock)
    # Batches are decided-ahead statements: their clock read before the locks, too.
    monkeypatch.setattr(module, "CLOCK_AFTER_LOCKS", "clock AS MATERIALIZED (SELECT clock_timestamp() AS now, (SELECT count(*) FROM locked) AS locked_rows)")
    module.clear_statement_cache()  # statements built with the clock are cached
    request.addfinalizer(module.clear_statement_cache)
    focused = machine_for(database, only=frozenset({"submit_owned", "claim_owned", "batch_waits_for_a_row_locked_elsewhere"}))
    findings = adapter_support.lockstep_findings(focused, max_examples=200, step_count=40)
    assert any("read before the batch's last row lock" in finding for finding in findings), findings
