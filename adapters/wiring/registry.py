"""The registry of machines: every machine is registered once, in
:data:`tenure.kernel.MACHINES`, and everything the migration runner and the stores'
conformance suite enumerate is read from the machines' own declarations.

A machine's table module (``adapters/<folder>/table.py``, the folder of its kernel
machine) declares ``MACHINE_TABLES`` (:class:`~tenure.adapters.core.tables.MachineTables`):
its kernel machine, its tables, its bindings and the rows that forbid removing its
schema steps. The registry imports each machine's table module by name (table modules
import only the core, so the registry closes no circle) and derives :data:`TABLES`,
:data:`BINDINGS`, :data:`STEPS` (the schema's history, in the order the runner applies
it) and :data:`RETIREMENT_GUARDS` from them. ``specs/README.md`` ("Adding a machine") gives the
whole checklist; ``tests/adapters/core/test_new_machine.py`` adds a toy machine in a
copy of the package and counts the shared lines it needs.
"""

from __future__ import annotations

import importlib

from tenure.kernel import MACHINES as KERNEL_MACHINES
from tenure.kernel.core import Machine

from ..core.tables import LEGACY_STEP, Binding, MachineTables, RetirementGuard, Step, TableSpec, schema_history

__all__ = ["MACHINES", "DECLARATIONS", "TABLES", "BINDINGS", "STEPS", "RECORDED_STEPS", "RETIREMENT_GUARDS"]

MACHINES: dict[str, Machine] = {machine.folder: machine for machine in KERNEL_MACHINES}
"""Every registered machine, by its folder: ``kernel/<folder>/`` (its decisions) and
``adapters/<folder>/`` (its table declaration and facades), in the kernel's order, which
is the order its tables take in a step that creates several (a Run's pair before its
owners')."""


def _declared(folder: str, machine: Machine) -> MachineTables:
    declared = importlib.import_module(f"tenure.adapters.{folder}.table").MACHINE_TABLES
    if not isinstance(declared, MachineTables) or declared.machine is not machine:
        raise TypeError(f"adapters/{folder}/table.py declares no MachineTables of its kernel machine")
    return declared


DECLARATIONS: dict[str, MachineTables] = {folder: _declared(folder, machine) for folder, machine in MACHINES.items()}
"""Each registered machine's table declaration, by its folder."""

TABLES: tuple[TableSpec, ...] = tuple(spec for declared in DECLARATIONS.values() for spec in declared.tables)
"""Every table the migration runner creates, adopts, checks and removes, in the
machines' order. Some have no binding (checkpoints, the step journal and the recovery
reports are evidence and diagnostics no machine decides)."""

BINDINGS: tuple[Binding, ...] = tuple(binding for declared in DECLARATIONS.values() for binding in declared.bindings)
"""Every table a machine decides, with its machine: what the stores and their
conformance suite run against."""

STEPS: tuple[Step, ...] = schema_history(TABLES)
"""Every schema step, in the order the runner applies them (the legacy step first)."""

RECORDED_STEPS: tuple[Step, ...] = tuple(step for step in STEPS if step != LEGACY_STEP)
"""The steps ``tenure_migrations`` records, in the order they are applied."""

RETIREMENT_GUARDS: dict[Step, tuple[RetirementGuard, ...]] = {
    step: guards
    for step in STEPS
    if (guards := tuple(guard for declared in DECLARATIONS.values() for guard in declared.retirement_guards
                        if guard.step == step))
}
"""What forbids removing each step (a step without an entry needs none: its columns live
on a table another step's guard keeps, or its rows are diagnostics)."""
