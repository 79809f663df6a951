"""The store primitives' conformance suite (``tenure.conformance.drivers.stores``) on every
database: each case's checks run through :func:`check_stores`, the same entry point
``tenure conform`` uses, on fresh copies of a migrated database; a failure prints the
failing example. A deliberately broken store shows the suite has teeth.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import adapter_support
import pytest
from hypothesis import settings

from tenure.conformance.drivers.stores import CASES, CHECKS, SNAPSHOT_CASES, TABLES, StoreCaseResult, check_stores

EXAMPLES = 25
"""Hypothesis examples per (case, check)."""

SEED = 0 if settings.default.derandomize else None
"""A fixed seed where the profile derandomizes (CI), else fresh examples each run."""


def _failures(results: list[StoreCaseResult]) -> str:
    return "\n\n".join(f"{result.case} / {result.check} ({result.examples} examples):\n{result.failure}"
                       for result in results if result.failure is not None)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("database", adapter_support.AVAILABLE_DATABASES)
def test_stored_records_read_back_finders_select_what_their_predicates_select_and_compare_and_sets_refuse_changed_rows(
    database: str, case: str, request: pytest.FixtureRequest
) -> None:
    adapter_support.prepare_machine_databases(database, request)
    results = check_stores(adapter_support.LockstepDatabases(database), examples=EXAMPLES, seed=SEED, cases=[case])
    expected_checks = [check for check in CHECKS if check != "snapshot_probes" or case in SNAPSHOT_CASES]
    assert [(result.case, result.check) for result in results] == [(case, check) for check in expected_checks]
    assert all(result.examples >= 1 for result in results), results
    assert not _failures(results), _failures(results)


def test_the_suite_catches_a_store_whose_update_skips_the_compare_and_set(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A mutant store whose UPDATE matches the row by key alone writes over a row that
    changed since it was read: the compare-and-set check must fail, and only it."""
    from tenure.adapters.core import store as shared_store

    adapter_support.prepare_machine_databases("sqlite", request)
    original = shared_store.statements_for

    def without_compare_and_set(binding: Any, caps: Any, schema: str | None = None) -> Any:
        statements = original(binding, caps, schema)
        update = re.sub(r"WHERE (\w+) = :old_key AND .* RETURNING", r"WHERE \1 = :old_key RETURNING", statements.update)
        assert update != statements.update
        return dataclasses.replace(statements, update=update)

    monkeypatch.setattr(shared_store, "statements_for", without_compare_and_set)
    results = check_stores(adapter_support.LockstepDatabases("sqlite"), examples=EXAMPLES, seed=0,
                           cases=["queue.validation"])
    failed = {result.check: result.failure for result in results if result.failure is not None}
    assert list(failed) == ["compare_and_set"], _failures(results)
    assert "wrote over the stored" in failed["compare_and_set"]
    assert "compare_and_set(" in failed["compare_and_set"], "the failure names its failing example"


def test_an_unknown_case_is_refused() -> None:
    with pytest.raises(ValueError, match="queue.nothing"):
        check_stores(adapter_support.LockstepDatabases("sqlite"), cases=["queue.nothing"])


def test_the_suite_covers_every_registered_table() -> None:
    from tenure.adapters.wiring.registry import BINDINGS

    assert {case.binding.name for case in TABLES.values()} == {binding.name for binding in BINDINGS}
