"""Which stored node rows the node commands meet, as data (see :mod:`tenure.kernel.core`)."""

from __future__ import annotations

from ..core import Condition, Finder, Param
from .record import NodeStatus

__all__ = ["nodes_by_keys", "expired_nodes"]

nodes_by_keys = Finder("nodes_by_keys", ((Condition("node", "in", Param("keys")),),), order=("node",), lock="wait")

expired_nodes = Finder(
    "expired_nodes",
    (
        (Condition("status", "=", NodeStatus.LIVE), Condition("lease_expires_at_us", "<=", Param("now"))),
        (Condition("status", "=", NodeStatus.TAKING_OVER), Condition("takeover_until_us", "<=", Param("now"))),
    ),
    order=("lease_expires_at_us", "node"),
    lock="none",
)
"""Nodes whose lease (or whose taker's claim) ran out by ``now``: the candidates for a
takeover, which the kernel then decides on the locked row."""
