"""Delegated jobs (the agent job machine, ``specs/agent_jobs.md``): their table and the
facade a Run ledger reaches them through (``RunLedger.jobs``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .facade import AgentJobs

__all__ = ["AgentJobs"]

__getattr__ = lazy_exports(__name__, {"AgentJobs": ".facade"})
