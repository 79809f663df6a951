"""Which stored consents the deadline owner's commands meet, as data (see :mod:`tenure.kernel.core`).

The other consent commands meet their rows through the Run ledger's finders
(:mod:`tenure.kernel.runs.finders`: by key, and the pending consents of one Run).
"""

from __future__ import annotations

from tenure.model import ConsentStatus

from ..core import Condition, Finder, Param

__all__ = ["due_consents"]

due_consents = Finder(
    "due_consents",
    ((Condition("status", "=", ConsentStatus.PENDING), Condition("expires_at_us", "<=", Param("now"))),),
    order=("expires_at_us", "consent_id"),
    lock="none",
)
"""Pending consents whose deadline came by ``now``, oldest deadline first: the candidates
for the deadline owner's ``expired``, which the kernel then decides on the locked row
(read unlocked; a consent decided since is refused ``already_decided``)."""
