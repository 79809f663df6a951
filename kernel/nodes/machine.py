"""The node lease machine: every transition of one node's lease, as one table.

Theory of operation
-------------------
Every process that runs Runs (``RunRuntime``) holds a lease on its node name. It boots
one (a new incarnation: ``epoch`` + 1, the lease running from now) before it reconciles
its own orphans, and its relays renew it while it lives; a renewal is accepted only for
the current incarnation and only while its lease has not run out, so a process that
stalled past its lease (or was replaced by a newer boot) can only come back through a
fresh boot, with a fresh cutoff. Another node's relay that finds a lease run out takes
the node over: it claims the orphans of that exact incarnation for a while of its own
(``taking_over``), reconciles them under the same rules a boot applies to its own, and
finishes (``taken_over``). A taker that dies is replaced once its claim runs out. Every
decision reads the database clock the caller sampled after the row's lock; the kernel
never reads a clock. Actors: the node itself (boot, renew), any other node's relay
(take_over, finish_takeover). Invariants: :mod:`tenure.kernel.nodes.record` and
:func:`transition_violations` (``specs/nodes.md``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from tenure.model import ErrorCode, bounds
from tenure.model.bounds import MAX_INSTANT_US

from ..core import SAME, Applied, Decision, Machine, Refused, Row
from .commands import Ack, Booted, NodeCommand, NodeCommandType, TakingOver
from .record import MAX_LEASE_US, NodeRow, NodeStatus, NodeStep, record_violations, step_of

__all__ = ["NodeRefusal", "OUTCOMES", "GUARDS", "EFFECTS", "ROWS", "NODES",
           "transition_violations"]


class NodeRefusal(enum.Enum):
    """Why a command changed nothing. Values are the names the spec table uses."""

    NOT_FOUND = "not_found"
    LEASE_OUT_OF_RANGE = "lease_out_of_range"
    EPOCH_EXHAUSTED = "epoch_exhausted"
    STALE_EPOCH = "stale_epoch"
    LEASE_EXPIRED = "lease_expired"
    NOT_LIVE = "not_live"
    LEASE_LIVE = "lease_live"
    OWN_NODE = "own_node"
    TAKEOVER_IN_PROGRESS = "takeover_in_progress"
    TAKEN_OVER = "taken_over"
    NOT_TAKER = "not_taker"
    NOT_TAKING_OVER = "not_taking_over"


R = NodeRefusal
OUTCOMES: dict[NodeRefusal, ErrorCode | None] = {reason: None for reason in NodeRefusal}
"""Every refusal is a known negative answer (False, or None where a value is returned)."""


def _lease_out_of_range(command: Any, now_us: int) -> bool:
    lease = command.lease_us
    return not (bounds.is_strict_int(lease) and 0 < lease <= MAX_LEASE_US and now_us + lease <= MAX_INSTANT_US)


GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda record, command, now_us: True,
    "lease_out_of_range": lambda record, command, now_us: _lease_out_of_range(command, now_us),
    "epoch_exhausted": lambda record, command, now_us: record is not None and record.epoch >= bounds.INT64_MAX,
    "epoch_differs": lambda record, command, now_us: command.epoch != record.epoch,
    # a lease is live strictly before its expiry instant
    "lease_expired": lambda record, command, now_us: now_us >= record.lease_expires_at_us,
    "lease_live": lambda record, command, now_us: now_us < record.lease_expires_at_us,
    "own_node": lambda record, command, now_us: command.taker == record.node,
    # a claim without an end (a row written outside tenure) holds nothing
    "claim_live": lambda record, command, now_us: record.takeover_until_us is not None
    and now_us < record.takeover_until_us,
    "other_taker": lambda record, command, now_us: command.taker != record.taker,
}


def _later(record: NodeRow | None, now_us: int) -> int:
    # updated_at never moves backwards, whatever time a caller passes.
    return now_us if record is None or now_us > record.updated_at_us else record.updated_at_us


def _boot(record: NodeRow | None, command: Any, now_us: int) -> Applied[NodeRow]:
    epoch = 1 if record is None else record.epoch + 1
    row = NodeRow(node=command.node if record is None else record.node, status=NodeStatus.LIVE, epoch=epoch,
                  booted_at_us=now_us, lease_expires_at_us=now_us + command.lease_us, taker=None,
                  takeover_until_us=None, updated_at_us=_later(record, now_us))
    return Applied(row, Booted(epoch, now_us))


def _renew(record: NodeRow, command: Any, now_us: int) -> Applied[NodeRow]:
    expires = max(record.lease_expires_at_us, now_us + command.lease_us)  # a lease never shrinks
    return Applied(dataclasses.replace(record, lease_expires_at_us=expires, updated_at_us=_later(record, now_us)),
                   Ack())


def _take_over(record: NodeRow, command: Any, now_us: int) -> Applied[NodeRow]:
    row = dataclasses.replace(record, status=NodeStatus.TAKING_OVER, taker=command.taker,
                              takeover_until_us=now_us + command.lease_us, updated_at_us=_later(record, now_us))
    return Applied(row, TakingOver(record.epoch, now_us))


EFFECTS: dict[str, Callable[[Any, Any, int], Applied[NodeRow]]] = {
    "boot": _boot,
    "renew": _renew,
    "take_over": _take_over,
    "finish_takeover": lambda record, command, now_us: Applied(
        dataclasses.replace(record, status=NodeStatus.TAKEN_OVER, updated_at_us=_later(record, now_us)), Ack()),
}

S = NodeStep
C = NodeCommandType
_PRESENT = (S.LIVE, S.TAKING_OVER, S.TAKEN_OVER)

ROWS: tuple[Row, ...] = (
    # One row per spec row of specs/nodes.md, in its order.
    Row((S.ABSENT,), C.BOOT, "lease_out_of_range", SAME, R.LEASE_OUT_OF_RANGE),
    Row((S.ABSENT,), C.BOOT, "always", S.LIVE, "boot"),
    Row(_PRESENT, C.BOOT, "lease_out_of_range", SAME, R.LEASE_OUT_OF_RANGE),
    Row(_PRESENT, C.BOOT, "epoch_exhausted", SAME, R.EPOCH_EXHAUSTED),
    Row(_PRESENT, C.BOOT, "always", S.LIVE, "boot"),

    Row((S.ABSENT,), C.RENEW, "always", SAME, R.NOT_FOUND),
    Row((S.LIVE,), C.RENEW, "lease_out_of_range", SAME, R.LEASE_OUT_OF_RANGE),
    Row((S.LIVE,), C.RENEW, "epoch_differs", SAME, R.STALE_EPOCH),
    Row((S.LIVE,), C.RENEW, "lease_expired", SAME, R.LEASE_EXPIRED),
    Row((S.LIVE,), C.RENEW, "always", SAME, "renew"),
    Row((S.TAKING_OVER, S.TAKEN_OVER), C.RENEW, "always", SAME, R.NOT_LIVE),

    Row((S.ABSENT,), C.TAKE_OVER, "always", SAME, R.NOT_FOUND),
    Row((S.LIVE, S.TAKING_OVER), C.TAKE_OVER, "lease_out_of_range", SAME, R.LEASE_OUT_OF_RANGE),
    Row((S.LIVE, S.TAKING_OVER), C.TAKE_OVER, "own_node", SAME, R.OWN_NODE),
    Row((S.LIVE, S.TAKING_OVER), C.TAKE_OVER, "epoch_differs", SAME, R.STALE_EPOCH),
    Row((S.LIVE, S.TAKING_OVER), C.TAKE_OVER, "lease_live", SAME, R.LEASE_LIVE),
    Row((S.LIVE,), C.TAKE_OVER, "always", S.TAKING_OVER, "take_over"),
    Row((S.TAKING_OVER,), C.TAKE_OVER, "claim_live", SAME, R.TAKEOVER_IN_PROGRESS),
    Row((S.TAKING_OVER,), C.TAKE_OVER, "always", SAME, "take_over"),
    Row((S.TAKEN_OVER,), C.TAKE_OVER, "always", SAME, R.TAKEN_OVER),

    Row((S.ABSENT,), C.FINISH_TAKEOVER, "always", SAME, R.NOT_FOUND),
    Row((S.TAKING_OVER,), C.FINISH_TAKEOVER, "epoch_differs", SAME, R.STALE_EPOCH),
    Row((S.TAKING_OVER,), C.FINISH_TAKEOVER, "other_taker", SAME, R.NOT_TAKER),
    Row((S.TAKING_OVER,), C.FINISH_TAKEOVER, "always", S.TAKEN_OVER, "finish_takeover"),
    Row((S.LIVE, S.TAKEN_OVER), C.FINISH_TAKEOVER, "always", SAME, R.NOT_TAKING_OVER),
)


def transition_violations(record: NodeRow | None, command: NodeCommand, now_us: int, decision: Decision) -> list[str]:
    """The transition rules (TR-N1 ... TR-N4 in specs/nodes.md) a decision breaks."""
    if isinstance(decision, Refused):
        return []
    new = decision.new_record
    if new is None:
        return ["TR-N1"]  # nodes are never deleted
    broken = []
    kind = command.kind
    if record is not None and new.node != record.node:
        broken.append("TR-N1")  # a node's name never changes
    old_epoch = 0 if record is None else record.epoch
    if (new.epoch != old_epoch) != (kind is NodeCommandType.BOOT) or (
            kind is NodeCommandType.BOOT and new.epoch != old_epoch + 1):
        broken.append("TR-N2")  # only a boot makes an incarnation, one more each time
    if kind is NodeCommandType.RENEW and record is not None and not (
        record.status is NodeStatus.LIVE and getattr(command, "epoch", None) == record.epoch
        and now_us < record.lease_expires_at_us
    ):
        broken.append("TR-N3")  # a lease is renewed only by its incarnation, before it expired
    if new.status is not NodeStatus.LIVE and (record is None or record.status is NodeStatus.LIVE) and not (
        record is not None and kind is NodeCommandType.TAKE_OVER and now_us >= record.lease_expires_at_us
        and getattr(command, "epoch", None) == record.epoch and getattr(command, "taker", None) != record.node
    ):
        broken.append("TR-N4")  # a node is taken over only once its incarnation's lease expired
    if (record is not None and record.status is NodeStatus.TAKING_OVER and kind is NodeCommandType.TAKE_OVER
            and record.takeover_until_us is not None and now_us < record.takeover_until_us):
        broken.append("TR-N4")  # a live takeover claim is never taken from its taker
    if new.status is NodeStatus.TAKEN_OVER and (record is None or record.status is not NodeStatus.TAKEN_OVER) and not (
        record is not None and record.status is NodeStatus.TAKING_OVER and kind is NodeCommandType.FINISH_TAKEOVER
        and getattr(command, "taker", None) == record.taker
    ):
        broken.append("TR-N4")  # only the taker finishes a takeover
    return broken


NODES = Machine.define(
    name="nodes",
    states=NodeStep,
    commands=NodeCommandType,
    rows=ROWS,
    guards=GUARDS,
    effects=EFFECTS,
    outcomes=OUTCOMES,
    state_of=step_of,
    record_violations=record_violations,
    transition_violations=transition_violations,
    initial=NodeStep.ABSENT,
)
"""The node lease machine: ``NODES.decide(record, command, now_us)``."""
