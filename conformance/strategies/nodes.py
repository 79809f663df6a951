"""Hypothesis strategies for node leases and their commands (see attempts.py).

Records keep INV-N1 ... INV-N3. Times are drawn around each record's lease and
takeover claim, so every guard (before, at and after an expiry) is met; commands name
the stored epoch or a neighbouring one, the node itself or another taker.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tenure.kernel.nodes.commands import Boot, FinishTakeover, NodeCommandType, Renew, TakeOver
from tenure.kernel.nodes.record import MAX_LEASE_US, NodeRow, NodeStatus, NodeStep

from .pools import integers, sampled

__all__ = ["NOW", "NODE", "node_row", "node_records", "node_commands", "node_situations"]

NOW = 1_800_000_000_000_000
NODE = "node-a"
TAKERS = ["node-b", "node-c"]
LEASE = 30_000_000


def node_row(**changes: Any) -> NodeRow:
    """node-a live at epoch 1, booted 100 µs ago with a 30 s lease, with ``changes``."""
    fields: dict[str, Any] = dict(
        node=NODE, status=NodeStatus.LIVE, epoch=1, booted_at_us=NOW - 100, lease_expires_at_us=NOW - 100 + LEASE,
        taker=None, takeover_until_us=None, updated_at_us=NOW - 100,
    )
    fields.update(changes)
    return NodeRow(**fields)


@st.composite
def node_records(draw: st.DrawFn, step: NodeStep | None = None) -> NodeRow | None:
    if step is None:
        step = draw(sampled(NodeStep))
    if step is NodeStep.ABSENT:
        return None
    booted = NOW - draw(integers(0, 2 * LEASE))
    row = node_row(epoch=draw(integers(1, 5)), booted_at_us=booted, lease_expires_at_us=booted + LEASE,
                   updated_at_us=booted + draw(integers(0, LEASE)))
    if step is NodeStep.LIVE:
        return row
    taken = row.lease_expires_at_us + draw(integers(0, LEASE))
    return node_row(**{**{name: getattr(row, name) for name in NodeRow.__dataclass_fields__},
                       "status": NodeStatus(step.value), "taker": draw(sampled(TAKERS)),
                       "takeover_until_us": taken + LEASE, "updated_at_us": max(row.updated_at_us, taken)})


@st.composite
def node_commands(draw: st.DrawFn, kind: NodeCommandType, record: NodeRow | None) -> object:
    epoch = (record.epoch if record is not None else 1) + draw(sampled([0, 0, 0, -1, 1]))
    lease = draw(sampled([LEASE, 1, MAX_LEASE_US, 0, -1, MAX_LEASE_US + 1]))
    if kind is NodeCommandType.BOOT:
        return Boot(node=NODE, lease_us=lease)
    if kind is NodeCommandType.RENEW:
        return Renew(epoch=epoch, lease_us=lease)
    taker = draw(sampled([*TAKERS, NODE]))
    if kind is NodeCommandType.TAKE_OVER:
        return TakeOver(taker=taker, epoch=epoch, lease_us=lease)
    return FinishTakeover(taker=taker, epoch=epoch)


@st.composite
def node_situations(
    draw: st.DrawFn, step: NodeStep | None = None, kind: NodeCommandType | None = None
) -> tuple[NodeRow | None, object, int]:
    record = draw(node_records(step))
    command = draw(node_commands(kind or draw(sampled(NodeCommandType)), record))
    if record is None:
        now = NOW + draw(integers(-LEASE, LEASE))
    else:
        marks = [record.lease_expires_at_us, record.updated_at_us]
        if record.takeover_until_us is not None:
            marks.append(record.takeover_until_us)
        now = draw(sampled(marks)) + draw(sampled([-1, 0, 1, -LEASE // 2, LEASE // 2]))
    return record, command, now
