"""Service job attempts' adapters: the attempts table, the ledger that persists the
kernel's decisions, and the runner that drives a provider through the machine."""

from __future__ import annotations

from .ledger import AttemptLedger
from .runner import AttemptRunner, EgressPolicy, ProviderDriver

__all__ = ["AttemptLedger", "AttemptRunner", "ProviderDriver", "EgressPolicy"]
