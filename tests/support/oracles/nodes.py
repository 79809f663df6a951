"""The machine under test for the node lease (``specs/nodes.md``): its guard glossary written
again, independently of the kernel, and what the shared table, oracle, property and
mutant tests need of it (``tests/support/machines.py`` reads ``UNDER_TEST``)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from machines import INT64_MAX, MachineUnderTest
from tenure.conformance.strategies.nodes import node_situations
from tenure.kernel import NODES
from tenure.kernel.nodes.commands import NodeCommandType
from tenure.kernel.nodes.record import NodeStep

# --- the node lease machine's guards, from specs/nodes.md's glossary ------------------------

NODE_ORACLE_GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda r, c, n: True,
    "lease_out_of_range": lambda r, c, n: type(c.lease_us) is not int or c.lease_us < 1
    or c.lease_us > 3_600_000_000 or n + c.lease_us > 253402300799999999,
    "epoch_exhausted": lambda r, c, n: r.epoch == INT64_MAX,
    "epoch_differs": lambda r, c, n: c.epoch != r.epoch,
    "lease_expired": lambda r, c, n: not n < r.lease_expires_at_us,
    "lease_live": lambda r, c, n: r.lease_expires_at_us > n,
    "own_node": lambda r, c, n: c.taker == r.node,
    "claim_live": lambda r, c, n: r.takeover_until_us is not None and r.takeover_until_us > n,
    "other_taker": lambda r, c, n: c.taker != r.taker,
}


def _node_state(record: Any) -> enum.Enum:
    return NodeStep.ABSENT if record is None else NodeStep(record.status.value)


UNDER_TEST = MachineUnderTest(
    name="nodes",
    machine=NODES,
    situations=lambda state=None, kind=None: node_situations(state, kind),
    # A taken-over incarnation is finished; only a new boot under the name leaves it.
    terminal=frozenset({NodeStep.TAKEN_OVER}),
    live=frozenset({NodeStep.LIVE, NodeStep.TAKING_OVER}),
    terminal_exit_allowed=lambda state, command, rule: command is NodeCommandType.BOOT
    and rule.target is NodeStep.LIVE,
    state_of_record=_node_state,
    oracle_guards=NODE_ORACLE_GUARDS,
    decides_every_change_ahead=False,
)
