"""The consent machine: one request for a principal's verdict that a Run waits on.

``record`` (the row and its invariants, the commands and replies) and ``machine``.
"""

from __future__ import annotations

from .machine import CONSENTS

__all__ = ["CONSENTS"]
