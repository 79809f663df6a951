"""Messages to a Run and the receives its hops wait on (the message machine,
``specs/messages.md``): their table and the facade a Run ledger reaches them through
(``RunLedger.messages``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .facade import Messages

__all__ = ["Messages"]

__getattr__ = lazy_exports(__name__, {"Messages": ".facade"})
