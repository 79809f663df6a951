"""The pair checks every write path of the engine runs, whatever wrote the rows.

The kernel decides; these hold its answer to what the table promises: a decided record
keeps the machine's record invariants (checks that raise, never ``assert``), a refusal
the machine maps to an error code raises it, and an answer out of shape is a
persistence failure. Both write strategies (:mod:`.transactions`, :mod:`.ahead`) and
the machines' own operations call them.
"""

from __future__ import annotations

from typing import Any

from tenure.kernel.core import Applied, Decision, Invariants, Machine, Refused
from tenure.model import TenureError

from ..failures import persistence_failed
from ..tables import Binding

__all__ = ["require", "raise_if_conflict", "checked", "checked_by"]


def require(condition: bool) -> None:
    """An always-on pair check: the kernel's answer has the shape the table promises."""
    if not condition:
        raise persistence_failed("invariant_broken")


def raise_if_conflict(binding: Binding, decision: Decision) -> None:
    """Raise the error a refusal means, if the machine maps it to one."""
    if isinstance(decision, Refused):
        code = binding.machine.outcomes[decision.reason]
        if code is not None:
            raise TenureError(code, decision.reason.value)


def checked(binding: Binding, old: Any, decision: Applied[Any]) -> Any:
    """The decided record, if it keeps the record invariants: every invariant the record
    it replaces kept (a row another client wrote may already break one; the kernel never
    adds a break)."""
    return checked_by(binding.machine, old, decision)


def checked_by(machine: Machine, old: Any, decision: Applied[Any]) -> Any:
    """:func:`checked` for a machine whose record spans several rows (a composite)."""
    new = decision.new_record
    if new is not None:
        violations = machine.record_violations
        if old is not None and isinstance(violations, Invariants) and violations.kept_where_changed(old, new):
            return new  # checked on the fields the decision changed: nothing new is broken
        broken = set(violations(new))
        if broken and not broken <= set(violations(old) if old is not None else ()):
            raise persistence_failed("invariant_broken")
    return new
