"""Which stored consents the consent commands meet, as data (see :mod:`tenure.kernel.core`):
by key, and the deadline owner's due consents. The consents of one Run (pending, or
every one) are the Run's lookups (:mod:`tenure.kernel.runs.finders`)."""

from __future__ import annotations

from tenure.model import ConsentStatus

from ..core import Condition, Finder, Param

__all__ = ["consents_by_keys", "due_consents"]

consents_by_keys = Finder("consents_by_keys", ((Condition("consent_id", "in", Param("keys")),),),
                          order=("consent_id",), lock="wait")
"""The consents a command names, locked (a verdict decides on the locked row)."""

due_consents = Finder(
    "due_consents",
    ((Condition("status", "=", ConsentStatus.PENDING), Condition("expires_at_us", "<=", Param("now"))),),
    order=("expires_at_us", "consent_id"),
    lock="none",
)
"""Pending consents whose deadline came by ``now``, oldest deadline first: the candidates
for the deadline owner's ``expired``, which the kernel then decides on the locked row
(read unlocked; a consent decided since is refused ``already_decided``)."""
