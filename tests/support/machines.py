"""The machines under test: what the shared table, oracle, property and mutant tests need
of each registered machine (``tenure.kernel.MACHINES``). Each machine's is its own file,
``tests/support/oracles/<folder>.py`` (``UNDER_TEST``: its spec's guard glossary written
again, its strategies, its terminal states); the shared tests then run for it unchanged,
and a registered machine without one stops the collection here."""

from __future__ import annotations

import dataclasses
import enum
import importlib
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import strategies as st

import tenure.kernel
from tenure.kernel.core import Machine, Rule

INT64_MAX = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class MachineUnderTest:
    name: str
    """The machine's name and spec file (``specs/<name>.md``)."""
    machine: Machine
    situations: Callable[..., st.SearchStrategy[tuple[Any, Any, int]]]
    """``situations(state=None, kind=None)``: (record, command, now) triples."""
    terminal: frozenset[enum.Enum]
    live: frozenset[enum.Enum]
    """States from which a terminal state must stay reachable (no traps)."""
    terminal_exit_allowed: Callable[[enum.Enum, enum.Enum, Rule], bool]
    """Which state-changing rules may leave a terminal state."""
    state_of_record: Callable[[Any], enum.Enum]
    oracle_guards: Mapping[str, Callable[[Any, Any, int], bool]]
    """The spec's guard glossary written again, independently of the kernel."""
    decides_every_change_ahead: bool = True
    """Whether :func:`tenure.kernel.ahead.decide_ahead` can make every decision ahead.
    A machine whose record nests rows (the Run pair), or whose replies carry the decision
    time (node leases: a boot and a takeover answer with their instant, which a window
    cannot move), makes only the decisions that leave the record unchanged ahead; the
    others are made the ordinary way (node leases are written once per relay interval,
    never on a hot path)."""


def _under_test(machine: Machine) -> MachineUnderTest:
    under_test = importlib.import_module(f"oracles.{machine.folder}").UNDER_TEST
    assert isinstance(under_test, MachineUnderTest) and under_test.machine is machine, machine.folder
    return under_test


MACHINES: dict[str, MachineUnderTest] = {machine.name: _under_test(machine) for machine in tenure.kernel.MACHINES}
"""Every registered machine under test, by its name (its spec file's)."""
