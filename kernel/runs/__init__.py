"""The workflow Run machine: the pair (Run, delivery) from admission to terminal truth.

``record`` (the pair and its invariants), ``commands`` (commands, evidence, replies) and
``machine`` (the table, guards and effects). The Run's owners have machines of their
own: :mod:`tenure.kernel.consents` and :mod:`tenure.kernel.agent_jobs`.
"""

from __future__ import annotations

from .machine import RUNS

__all__ = ["RUNS"]
