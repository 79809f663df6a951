"""Which stored consents the consent commands meet, as data (see :mod:`tenure.kernel.core`):
by key, and the deadline owner's due consents. The consents of one Run (pending, or
every one) are the Run's lookups (:mod:`tenure.kernel.runs.finders`)."""

from __future__ import annotations

import functools

from tenure.model import ConsentStatus

from ..core import Condition, Finder, Param

__all__ = ["consents_by_keys", "due_consents", "pending_page", "decided_page"]

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


_PENDING = Condition("status", "=", ConsentStatus.PENDING)
_DECIDED = Condition("status", "in", (ConsentStatus.CANCELLED, ConsentStatus.DENIED, ConsentStatus.EXPIRED,
                                      ConsentStatus.GRANTED))
"""Every status but pending: a verdict (or the Run's end) decided it, and says who and when."""


@functools.cache
def pending_page(*, after: bool = False) -> Finder:
    """Pending consents, the longest waiting first (``created_at``, then the consent ID),
    past a page's last position (parameters ``after_created``, ``after_id``) when
    ``after``: an operator's inbox (``tenure console``). Read unlocked; the status index
    ``(status, expires_at, consent_id)`` finds them (pending consents are few: each one
    parks a Run), a verdict is then decided on the locked row as always."""
    if not after:
        return Finder("pending_page", ((_PENDING,),), order=("created_at_us", "consent_id"), lock="none")
    return Finder(
        "pending_page_after",
        (
            (_PENDING, Condition("created_at_us", ">", Param("after_created"))),
            (_PENDING, Condition("created_at_us", "=", Param("after_created")),
             Condition("consent_id", ">", Param("after_id"))),
        ),
        order=("created_at_us", "consent_id"),
        lock="none",
    )


@functools.cache
def decided_page(*, after: bool = False) -> Finder:
    """Decided consents (granted, denied, expired or cancelled), the latest decision first
    (``decided_at``, then the consent ID, both descending), past a page's last position
    (parameters ``after_decided``, ``after_id``) when ``after``: who decided what, and
    when. Both halves of the position test also say ``decided_at <= after_decided``
    (implied), so a database that factors it out of the OR starts at the position."""
    order = ("-decided_at_us", "-consent_id")
    if not after:
        return Finder("decided_page", ((_DECIDED,),), order=order, lock="none")
    bound = Condition("decided_at_us", "<=", Param("after_decided"))
    return Finder(
        "decided_page_after",
        (
            (_DECIDED, bound, Condition("decided_at_us", "<", Param("after_decided"))),
            (_DECIDED, bound, Condition("decided_at_us", "=", Param("after_decided")),
             Condition("consent_id", "<", Param("after_id"))),
        ),
        order=order,
        lock="none",
    )
