"""The registry derives every list of machines, tables, bindings, steps and retirement
guards from the machines' own declarations (``adapters/wiring/registry.py``)."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import String

import tenure.kernel
from tenure.adapters.core.tables import (
    LEGACY_STEP,
    VERSIONS_STEP,
    Codec,
    ColumnSpec,
    Step,
    TableSpec,
    schema_history,
)
from tenure.adapters.wiring import registry


def _table(name: str, step: Step) -> TableSpec:
    return TableSpec(name, (ColumnSpec("id", "id", Codec.TEXT, String(36), nullable=False, mutable=False,
                                       primary_key=True, step=step),), created_by=step)


def test_every_registered_machine_is_read_from_its_own_table_declaration() -> None:
    assert [machine.folder for machine in tenure.kernel.MACHINES] == list(registry.DECLARATIONS)
    assert registry.TABLES == tuple(spec for declared in registry.DECLARATIONS.values() for spec in declared.tables)
    assert registry.BINDINGS == tuple(binding for declared in registry.DECLARATIONS.values()
                                      for binding in declared.bindings)
    assert {id(binding.machine) for binding in registry.BINDINGS} == {id(machine) for machine in tenure.kernel.MACHINES}
    assert all(declared.machine is machine
               for declared, machine in zip(registry.DECLARATIONS.values(), tenure.kernel.MACHINES, strict=True))


def test_the_schema_history_is_every_step_the_tables_name_in_number_order() -> None:
    named = {step for spec in registry.TABLES for step in spec.steps}
    assert set(registry.STEPS) == named | {LEGACY_STEP, VERSIONS_STEP}
    assert [step.number for step in registry.STEPS] == sorted(step.number for step in registry.STEPS)
    assert registry.STEPS[0] == LEGACY_STEP and LEGACY_STEP not in registry.RECORDED_STEPS
    # The history as it stands (tenure_migrations holds these names: they never change).
    assert [step.value for step in registry.RECORDED_STEPS] == [
        "owned_v2", "attempts_v1", "runs_v1", "runs_v2", "runs_v3", "runs_v4", "runs_v5", "tasks_v1", "runs_v6",
        "console_v1", "versions_v1", "attempts_v2", "runs_v7", "runs_v8", "workers_v1"]


def test_a_step_declared_alike_by_two_machines_is_one_step() -> None:
    shared = Step("runs_v1", 3)
    assert schema_history([_table("a", shared), _table("b", dataclasses.replace(shared))]).count(shared) == 1


@pytest.mark.parametrize("other", [Step("runs_v1", 4), Step("runs_v9", 3)], ids=["one name", "one number"])
def test_two_different_steps_of_one_name_or_one_number_are_refused(other: Step) -> None:
    with pytest.raises(ValueError, match="two schema steps share"):
        schema_history([_table("a", Step("runs_v1", 3)), _table("b", other)])


def test_every_retirement_guard_names_a_registered_table_and_its_step() -> None:
    names = {spec.name for spec in registry.TABLES}
    for step, guards in registry.RETIREMENT_GUARDS.items():
        assert step in registry.RECORDED_STEPS
        assert all(guard.step == step and guard.table in names for guard in guards)
