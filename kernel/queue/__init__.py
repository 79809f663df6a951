"""The owned-queue machine: a job row from submission to its one accepted final write.

``record`` (the row and its invariants), ``commands`` (what actors ask), ``machine`` (the
table, guards and effects), ``finders`` (which rows a command meets, as data) and
``contracts`` (typed entry points CrossHair checks).
"""

from __future__ import annotations

from .machine import QUEUE

__all__ = ["QUEUE"]
