"""Which stored attempts a command meets, as data (see :mod:`tenure.kernel.queue.finders`).

``prepare`` locks every attempt of its owner job and any attempt holding its idempotency
key, then :func:`prepare_meets` says which row the command meets and what it observed
(the owner's latest other attempt, a key held elsewhere). Reconciliation pages over the
unresolved attempts, oldest created first.
"""

from __future__ import annotations

from collections.abc import Sequence

from tenure.model import UNRESOLVED_STATES, AttemptState

from ..core import Condition, Finder, Param
from .record import AttemptRow

__all__ = ["by_keys", "of_owner_or_key", "unresolved", "unresolved_after", "all_attempts", "prepare_meets"]

by_keys = Finder("by_keys", ((Condition("attempt_id", "in", Param("keys")),),), order=("attempt_id",), lock="wait")

of_owner_or_key = Finder(
    "of_owner_or_key",
    ((Condition("owner_job_id", "=", Param("owner_job_id")),), (Condition("idempotency_key", "=", Param("key")),)),
    order=("attempt_id",),
    lock="wait",
)

all_attempts = Finder("all_attempts", ((),), order=("attempt_id",), lock="none")
"""Every attempt (inspection and conformance tests)."""

_UNRESOLVED = Condition("state", "in", tuple(sorted(UNRESOLVED_STATES, key=lambda state: state.value)))

unresolved = Finder("unresolved", ((_UNRESOLVED,),), order=("created_at_us", "attempt_id"), lock="none")

unresolved_after = Finder(
    "unresolved_after",
    (
        (_UNRESOLVED, Condition("created_at_us", ">", Param("after_created"))),
        (_UNRESOLVED, Condition("created_at_us", "=", Param("after_created")),
         Condition("attempt_id", ">", Param("after_id"))),
    ),
    order=("created_at_us", "attempt_id"),
    lock="none",
)
"""Unresolved attempts after a page's last ``(created_at, attempt_id)``."""


def prepare_meets(
    rows: Sequence[AttemptRow], *, attempt_id: str, owner_job_id: str, idempotency_key: str
) -> tuple[AttemptRow | None, AttemptState | None, int, bool]:
    """(the row of this attempt ID or None, the state and generation of the owner's
    highest-generation other attempt (None and 0 when it has none), whether another
    attempt holds the idempotency key)."""
    met = next((row for row in rows if row.attempt_id == attempt_id), None)
    others = [row for row in rows if row.owner_job_id == owner_job_id and row.attempt_id != attempt_id]
    latest = max(others, key=lambda row: row.generation, default=None)
    key_held = any(row.idempotency_key == idempotency_key and row.attempt_id != attempt_id for row in rows)
    return (
        met,
        None if latest is None else latest.state,
        0 if latest is None else latest.generation,
        key_held,
    )
