"""Which stored consents the consent commands meet, as data (see :mod:`tenure.kernel.core`):
by key, and the deadline owner's due consents. The consents of one Run (pending, or
every one) are the Run's lookups (:mod:`tenure.kernel.runs.finders`)."""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping

from tenure.model import ConsentStatus

from ..core import Condition, Finder, Param

__all__ = ["consents_by_keys", "due_consents", "pending_page", "decided_page", "PENDING_PARAMETERS"]

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


_PENDING = Condition("status", "=", Param("pending"))
"""Pending, compared with the parameter ``pending`` (which the caller sets to
``ConsentStatus.PENDING``, :data:`PENDING_PARAMETERS`) rather than a constant: both halves
of a page's position test then name the same value, so a database takes the test out of
the OR and reads one range of the index ``(status, created_at, consent_id)`` in the page's
order (two constants compile to two parameters no planner can tell are equal)."""

PENDING_PARAMETERS: Mapping[str, ConsentStatus] = types.MappingProxyType({"pending": ConsentStatus.PENDING})
"""The parameter every :func:`pending_page` finder reads besides the page's position."""

_DECIDED = (Condition("decided_at_us", "not_null"),)
"""Decided: granted, denied, expired or cancelled, by a verdict (or the Run's end), which
says who and when. A consent has its ``decided_at`` exactly when it is not pending
(INV-C2, and the table's ``ck_tenure_consents_decision``), so the test is on that column:
a database reads the decided consents from the index ``(decided_at, consent_id)`` in the
page's order (a list of statuses keeps no order across its values)."""


@functools.cache
def pending_page(*, after: bool = False) -> Finder:
    """Pending consents, the longest waiting first (``created_at``, then the consent ID),
    past a page's last position (parameters ``after_created``, ``after_id``) when
    ``after``, with :data:`PENDING_PARAMETERS`: an operator's inbox (``tenure console``).
    Read unlocked, one range of the index ``(status, created_at, consent_id)``; a verdict
    is then decided on the locked row as always. Both halves of the position test also say
    ``created_at >= after_created`` (implied, so the rows are the same): a database that
    takes the conditions common to every half out of the OR starts at the position."""
    order = ("created_at_us", "consent_id")
    if not after:
        return Finder("pending_page", ((_PENDING,),), order=order, lock="none")
    bound = Condition("created_at_us", ">=", Param("after_created"))
    return Finder(
        "pending_page_after",
        (
            (_PENDING, bound, Condition("created_at_us", ">", Param("after_created"))),
            (_PENDING, bound, Condition("created_at_us", "=", Param("after_created")),
             Condition("consent_id", ">", Param("after_id"))),
        ),
        order=order,
        lock="none",
    )


@functools.cache
def decided_page(*, after: bool = False) -> Finder:
    """Decided consents (granted, denied, expired or cancelled), the latest decision first
    (``decided_at``, then the consent ID, both descending), past a page's last position
    (parameters ``after_decided``, ``after_id``) when ``after``: who decided what, and
    when. One range of the index ``(decided_at, consent_id)``, read backwards. Both halves
    of the position test also say ``decided_at <= after_decided`` (implied), so a database
    that factors it out of the OR starts at the position."""
    order = ("-decided_at_us", "-consent_id")
    if not after:
        return Finder("decided_page", (_DECIDED,), order=order, lock="none")
    bound = Condition("decided_at_us", "<=", Param("after_decided"))
    return Finder(
        "decided_page_after",
        (
            (*_DECIDED, bound, Condition("decided_at_us", "<", Param("after_decided"))),
            (*_DECIDED, bound, Condition("decided_at_us", "=", Param("after_decided")),
             Condition("consent_id", "<", Param("after_id"))),
        ),
        order=order,
        lock="none",
    )
