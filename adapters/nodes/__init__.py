"""Node leases (the node lease machine, ``specs/nodes.md``): who is alive, and who takes
over the Runs of a node that is not. ``RunLedger.nodes`` is the facade."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .leases import DEFAULT_NODE_LEASE_S, NodeLease, NodeLeases, Takeover

__all__ = ["NodeLeases", "NodeLease", "Takeover", "DEFAULT_NODE_LEASE_S"]

__getattr__ = lazy_exports(__name__, {
    "DEFAULT_NODE_LEASE_S": ".leases", "NodeLease": ".leases", "NodeLeases": ".leases", "Takeover": ".leases",
})
