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
from typing import ClassVar

from tenure.model import bounds
from tenure.model.runs import MAX_RUN_TEXT_CHARS


__all__ = [
    "NodeStatus",
    "NodeStep",
    "NodeRow",
    "NodeCommandType",
    "Boot",
    "Renew",
    "TakeOver",
    "FinishTakeover",
    "NodeCommand",
    "Booted",
    "TakingOver",
    "Ack",
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


class NodeCommandType(enum.Enum):
    """Every command of the node machine; values are the names the spec table uses."""

    BOOT = "boot"
    RENEW = "renew"
    TAKE_OVER = "take_over"
    FINISH_TAKEOVER = "finish_takeover"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Boot:
    """A process starts under this node name: a new incarnation, its lease from now."""

    kind: ClassVar[NodeCommandType] = NodeCommandType.BOOT
    node: str
    lease_us: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Renew:
    """The incarnation ``epoch`` extends its lease from now (its relays renew it)."""

    kind: ClassVar[NodeCommandType] = NodeCommandType.RENEW
    epoch: int
    lease_us: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TakeOver:
    """Node ``taker`` claims the orphans of incarnation ``epoch`` (the one it read) for
    ``lease_us``: only once that incarnation's lease expired, or an earlier taker's claim."""

    kind: ClassVar[NodeCommandType] = NodeCommandType.TAKE_OVER
    taker: str
    epoch: int
    lease_us: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FinishTakeover:
    """The taker reconciled every orphan of incarnation ``epoch``."""

    kind: ClassVar[NodeCommandType] = NodeCommandType.FINISH_TAKEOVER
    taker: str
    epoch: int


NodeCommand = Boot | Renew | TakeOver | FinishTakeover


@dataclasses.dataclass(frozen=True, slots=True)
class Booted:
    """The incarnation this boot made, and its cutoff: every hop this node claimed before
    it belongs to a dead incarnation."""

    epoch: int
    cutoff_us: int


@dataclasses.dataclass(frozen=True, slots=True)
class TakingOver:
    """The taker may reconcile the node's orphans: every hop it claimed before
    ``cutoff_us`` (the takeover's time) belongs to a dead incarnation."""

    epoch: int
    cutoff_us: int


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    """The exact change applied."""


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
