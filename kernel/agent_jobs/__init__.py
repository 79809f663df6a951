"""The delegated-job machine: one AgentJob a Run delegated to a runtime.

``record`` (the row and its invariants, the commands and replies) and ``machine``.
"""

from __future__ import annotations

from .machine import AGENT_JOBS

__all__ = ["AGENT_JOBS"]
