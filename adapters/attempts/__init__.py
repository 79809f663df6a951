"""Service job attempts' adapters: the attempts table, the ledger that persists the
kernel's decisions, and the runner that drives a provider through the machine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .ledger import AttemptLedger
    from .runner import AttemptRunner, EgressPolicy, ProviderDriver

__all__ = ["AttemptLedger", "AttemptRunner", "ProviderDriver", "EgressPolicy"]

__getattr__ = lazy_exports(__name__, {
    "AttemptLedger": ".ledger",
    "AttemptRunner": ".runner", "EgressPolicy": ".runner", "ProviderDriver": ".runner",
})
