"""The node lease table, ``tenure_run_nodes`` (schema step ``runs_v5``): one row per node name."""

from __future__ import annotations

import functools

from sqlalchemy import BigInteger, DateTime, String

from tenure.kernel.nodes.machine import NODES
from tenure.kernel.nodes.record import NodeRow, NodeStatus

from ..core.tables import Binding, Codec, MachineTables, Step, TableSpec, column

__all__ = ["NODES_TABLE", "NODES_BINDING", "MACHINE_TABLES"]

_STEP = Step("runs_v5", 7)
"""The Run machine's liveness step, which brought node leases."""
_INSTANT = DateTime(timezone=True)


_column = functools.partial(column, step=_STEP)


NODES_TABLE = TableSpec(
    "tenure_run_nodes",
    (
        _column("node", Codec.TEXT, String(128), mutable=False, primary_key=True),
        _column("status", Codec.ENUM, String(20), mutable=True, choices=NodeStatus),
        _column("epoch", Codec.INT, BigInteger(), mutable=True),
        _column("booted_at", Codec.INSTANT, _INSTANT, mutable=True, field="booted_at_us"),
        _column("lease_expires_at", Codec.INSTANT, _INSTANT, mutable=True, field="lease_expires_at_us"),
        _column("taker", Codec.OPTIONAL_TEXT, String(128), mutable=True),
        _column("takeover_until", Codec.OPTIONAL_INSTANT, _INSTANT, mutable=True, field="takeover_until_us"),
        _column("updated_at", Codec.INSTANT, _INSTANT, mutable=True, field="updated_at_us"),
    ),
    created_by=_STEP,
    checks=(
        ("ck_tenure_run_nodes_status", "status IN ('live', 'taking_over', 'taken_over')"),
        ("ck_tenure_run_nodes_epoch", "epoch >= 1"),
        ("ck_tenure_run_nodes_taker",
         "(status = 'live' AND taker IS NULL AND takeover_until IS NULL) OR "
         "(status <> 'live' AND taker IS NOT NULL AND takeover_until IS NOT NULL)"),
    ),
)

NODES_BINDING = Binding("run_nodes", NODES, NODES_TABLE, NodeRow, {}, "node")

MACHINE_TABLES = MachineTables(machine=NODES, tables=(NODES_TABLE,), bindings=(NODES_BINDING,))
"""The node lease machine's table (its rows are liveness, not evidence: no guard)."""
