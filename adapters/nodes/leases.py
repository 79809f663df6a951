"""Node leases on a Run ledger's database: who is alive, and who takes over the Runs of
a node that is not (the node lease machine, ``specs/nodes.md``).

``tenure_run_nodes`` (schema step ``runs_v5``) holds one row per node name. Every
operation is one transaction: lock the node row, read the database clock, ask the
kernel, write its decision with a compare-and-set (the engine's). ``RunRuntime`` boots
its node's lease before it reconciles, its relays renew it and take over nodes whose
lease ran out; see :mod:`tenure.adapters.runs.runtime`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from typing import Any

from tenure.kernel.core import Applied
from tenure.kernel.nodes import finders
from tenure.kernel.nodes.commands import Boot, Booted, FinishTakeover, Renew, TakeOver, TakingOver
from tenure.kernel.nodes.record import MAX_LEASE_US, NodeRow
from tenure.model.runs import check_text
from tenure.model.validation import micros_to_datetime, refuse

from ..core.facade import Transactions
from ..core.store import Transaction
from .table import NODES_BINDING

__all__ = ["NodeLease", "Takeover", "NodeLeases", "DEFAULT_NODE_LEASE_S"]


DEFAULT_NODE_LEASE_S = 30.0
"""How long a node's lease runs after each renewal unless the runtime says otherwise."""



@dataclasses.dataclass(frozen=True, slots=True)
class NodeLease:
    """An incarnation of a node: its name, its epoch and its boot cutoff (every hop the
    node claimed before it belongs to a dead incarnation)."""

    node: str
    epoch: int
    cutoff: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class Takeover:
    """A node this process may now reconcile as if it booted: the dead incarnation and
    the takeover's cutoff."""

    node: str
    epoch: int
    cutoff: dt.datetime


_refuse = functools.partial(refuse, reason="invalid_node_lease")


def _lease_us(lease_s: object) -> int:
    if type(lease_s) not in (int, float) or not 0 < lease_s <= MAX_LEASE_US / 1_000_000:  # type: ignore[operator]
        raise _refuse("lease_s", "number_out_of_range")
    return max(1, int(lease_s * 1_000_000))  # type: ignore[operator]




class NodeLeases:
    """The node leases of one Run ledger's database, on its connections (``RunLedger.nodes``)."""

    def __init__(self, transactions: Transactions) -> None:
        self._tx = transactions

    async def send(self, node: str, command: Any) -> Any:
        """Send one node-lease kernel command to ``node``'s row, as the named operations
        do: the row locked, the database clock read, the kernel's decision written with
        its compare-and-set; returns the kernel's ``Decision``. Part of the adapters'
        test seam (``docs/testing.md``): a replay of an explorer trace sends the trace's
        own commands. Applications call :meth:`boot`, :meth:`renew`, ..."""
        engine = self._tx.engine

        async def body(tx: Transaction) -> Any:
            found = await tx.locked(NODES_BINDING, finders.nodes_by_keys, {"keys": [node]})
            return await engine.decide_one(tx, NODES_BINDING, found[0] if found else None, command)

        return await self._tx.run(body)

    async def boot(self, node: str, *, lease_s: float = DEFAULT_NODE_LEASE_S) -> NodeLease:
        """A new incarnation of ``node`` holding the lease for ``lease_s`` from now."""
        name = check_text(node, "node")
        decision = await self.send(name, Boot(node=name, lease_us=_lease_us(lease_s)))
        if not isinstance(decision, Applied) or not isinstance(decision.reply, Booted):
            raise _refuse("node", "node_cannot_boot")  # epoch exhausted: unreachable in practice
        return NodeLease(name, decision.reply.epoch, micros_to_datetime(decision.reply.cutoff_us))

    async def renew(self, lease: NodeLease, *, lease_s: float = DEFAULT_NODE_LEASE_S) -> bool:
        """Extend this incarnation's lease by ``lease_s`` from now. False: it ran out, or
        the node was taken over or booted again; the process must stop its hops and boot."""
        decision = await self.send(lease.node, Renew(epoch=lease.epoch, lease_us=_lease_us(lease_s)))
        return isinstance(decision, Applied)

    async def expired(self, *, limit: int = 16) -> list[NodeRow]:
        """Nodes whose lease (or whose taker's claim) ran out, oldest first."""
        async def body(tx: Transaction) -> list[NodeRow]:
            return await tx.find(NODES_BINDING, finders.expired_nodes, {"now": await tx.now_us()}, limit)

        rows: list[NodeRow] = await self._tx.run(body, write=False)
        return rows

    async def take_over(self, taker: str, row: NodeRow, *, lease_s: float = DEFAULT_NODE_LEASE_S) -> Takeover | None:
        """Claim the orphans of ``row``'s incarnation for ``lease_s``; None when the kernel
        refuses (its lease holds, another taker's claim holds, a newer boot, itself)."""
        name = check_text(taker, "taker")
        decision = await self.send(row.node, TakeOver(taker=name, epoch=row.epoch, lease_us=_lease_us(lease_s)))
        if not isinstance(decision, Applied) or not isinstance(decision.reply, TakingOver):
            return None
        return Takeover(row.node, decision.reply.epoch, micros_to_datetime(decision.reply.cutoff_us))

    async def finish(self, taker: str, takeover: Takeover) -> bool:
        """Record that ``taker`` reconciled every orphan of the takeover's incarnation."""
        decision = await self.send(takeover.node, FinishTakeover(taker=check_text(taker, "taker"),
                                                                    epoch=takeover.epoch))
        return isinstance(decision, Applied)

    async def get(self, node: str) -> NodeRow | None:
        name = check_text(node, "node")

        async def body(tx: Transaction) -> list[NodeRow]:
            return await tx.read(NODES_BINDING, [name])

        found: list[NodeRow] = await self._tx.run(body, write=False)
        return found[0] if found else None
