"""Typed entry points to the node lease kernel's ``decide``, one per command, carrying its
contract (checked by CrossHair like the other machines' contracts). The shared
postcondition is the list of transition rules (TR-N1 ... TR-N4 in ``specs/nodes.md``);
the commands add what matters most: a renewal only by the current incarnation before its
lease ran out, a takeover only of the exact incarnation whose lease ran out.
"""

from __future__ import annotations

from tenure.model.bounds import MIN_INSTANT_US  # noqa: F401

# Names used only inside the pre/post lines below: CrossHair evaluates those lines in
# this module's namespace.
from ..core import Decision, Refused  # noqa: F401
from ..queue.commands import MAX_NOW_US  # noqa: F401
from .commands import Boot, FinishTakeover, Renew, TakeOver  # noqa: F401
from .machine import NODES, transition_violations  # noqa: F401
from .record import NodeRow, NodeStatus  # noqa: F401

__all__ = ["decide_boot", "decide_renew", "decide_take_over", "decide_finish_takeover"]


def decide_boot(record: NodeRow | None, command: Boot, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or __return__.new_record.status is NodeStatus.LIVE
    """
    return NODES.decide(record, command, now_us)


def decide_renew(record: NodeRow | None, command: Renew, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (command.epoch == record.epoch and now_us < record.lease_expires_at_us)
    """
    return NODES.decide(record, command, now_us)


def decide_take_over(record: NodeRow | None, command: TakeOver, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (command.epoch == record.epoch and now_us >= record.lease_expires_at_us and command.taker != record.node)
    """
    return NODES.decide(record, command, now_us)


def decide_finish_takeover(record: NodeRow | None, command: FinishTakeover, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (record.status is NodeStatus.TAKING_OVER and command.taker == record.taker)
    """
    return NODES.decide(record, command, now_us)
