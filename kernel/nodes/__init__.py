"""The node lease machine: which Run-executing process is alive, and who takes over the
orphans of one that is not.

``record`` (the row, its invariants, the commands and replies) and ``machine``.
"""

from __future__ import annotations

from .machine import NODES

__all__ = ["NODES"]
