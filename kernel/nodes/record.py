"""The node lease record: one row per node name, its commands and its replies.

A node is one process that runs Runs (``RunRuntime``) under a name. Its row holds the
incarnation (``epoch``, one more at every boot), when that incarnation booted, and until
when its lease runs (``lease_expires_at_us``, on the database clock). While another node
takes the orphans over, the row names the taker and until when its takeover claim holds.
Instants are integer microseconds on the database clock.
"""

from __future__ import annotations

import dataclasses
import enum

from tenure.model import bounds
from tenure.model.runs import MAX_RUN_TEXT_CHARS

__all__ = [
    "NodeStatus",
    "NodeStep",
    "NodeRow",
    "step_of",
    "record_violations",
    "MAX_LEASE_US",
]

MAX_LEASE_US = 3_600_000_000
"""The longest lease or takeover claim a command may ask for: one hour."""


class NodeStatus(enum.Enum):
    """Where a node stands; the values are the stored column values."""

    LIVE = "live"
    TAKING_OVER = "taking_over"
    TAKEN_OVER = "taken_over"


class NodeStep(enum.Enum):
    """The state a node command meets: the row's status, or ``absent``."""

    ABSENT = "absent"
    LIVE = "live"
    TAKING_OVER = "taking_over"
    TAKEN_OVER = "taken_over"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeRow:
    """One node. ``taker`` and ``takeover_until_us`` are set exactly while another node
    takes its orphans over (and kept once it has)."""

    node: str
    status: NodeStatus
    epoch: int
    booted_at_us: int
    lease_expires_at_us: int
    taker: str | None
    takeover_until_us: int | None
    updated_at_us: int


_STEP_OF_STATUS = {status: NodeStep(status.value) for status in NodeStatus}


def step_of(record: NodeRow | None) -> NodeStep:
    """The table key for a row: its status, or ABSENT."""
    return NodeStep.ABSENT if record is None else _STEP_OF_STATUS[record.status]


_instant = bounds.is_instant


def record_violations(record: NodeRow) -> list[str]:
    """The invariants (``INV-N1`` ... ``INV-N3`` in specs/nodes.md) this row breaks."""
    types = {
        "node": bounds.is_bounded_text(record.node, MAX_RUN_TEXT_CHARS),
        "status": type(record.status) is NodeStatus,
        "epoch": bounds.is_strict_int(record.epoch) and 1 <= record.epoch <= bounds.INT64_MAX,
        "instants": _instant(record.booted_at_us) and _instant(record.lease_expires_at_us)
        and _instant(record.updated_at_us)
        and (record.takeover_until_us is None or _instant(record.takeover_until_us)),
        "taker": record.taker is None or bounds.is_bounded_text(record.taker, MAX_RUN_TEXT_CHARS),
    }
    broken = [f"INV-N1.{name}" for name, ok in types.items() if not ok]
    if broken:
        return broken
    rules = {
        # INV-N2: a live node has no taker; one being (or once) taken over has its taker
        # and the end of the taker's claim, and is never its own taker.
        "INV-N2": (record.status is NodeStatus.LIVE) == (record.taker is None)
        and (record.taker is None) == (record.takeover_until_us is None)
        and record.taker != record.node,
        # INV-N3: a lease starts at its boot; time runs forward.
        "INV-N3": record.booted_at_us <= record.lease_expires_at_us and record.booted_at_us <= record.updated_at_us,
    }
    return [name for name, ok in rules.items() if not ok]
