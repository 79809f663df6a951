"""Node lease commands and replies: what a caller may ask of the machine, and what an applied command answers."""

from __future__ import annotations

import dataclasses
import enum
from typing import ClassVar

__all__ = ["Ack", "Boot", "Booted", "FinishTakeover", "NodeCommand",
           "NodeCommandType", "Renew", "TakeOver", "TakingOver"]


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
