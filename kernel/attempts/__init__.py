"""The service-attempt machine (``ServiceJobAttempt@1``): one external effect, recorded
before it is attempted and reconciled after, never fabricated as failed, never repeated
without proof.

``record`` (the row and its invariants), ``commands``, ``machine`` (the table, guards and
effects), ``finders`` (which rows a command meets) and ``contracts`` (typed entry points
CrossHair checks).
"""

from __future__ import annotations

from .machine import ATTEMPTS

__all__ = ["ATTEMPTS"]
