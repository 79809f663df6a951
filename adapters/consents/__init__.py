"""Consents (the consent machine, ``specs/consent.md``): their table and the facade a Run
ledger reaches them through (``RunLedger.consents``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .facade import Consents

__all__ = ["Consents"]

__getattr__ = lazy_exports(__name__, {"Consents": ".facade"})
