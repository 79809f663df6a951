"""The message machine: one message slot of a Run (a message, a receive waiting for one,
or both once delivered).

``record`` (the row, its states and invariants), ``commands`` (the commands and replies),
``machine``, ``contracts`` (CrossHair) and ``finders`` (the slots a command meets).
"""

from __future__ import annotations

from .machine import MESSAGES

__all__ = ["MESSAGES"]
