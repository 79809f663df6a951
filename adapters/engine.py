"""The one engine loop every machine runs on: lock, read the clock, decide, persist, check.

A machine's operations (``adapters/<machine>/``) say which rows a command meets (kernel
finders) and which commands to send; this module does the rest the same way for every
machine: it reads the database time after the locks, calls the kernel's ``decide``,
refuses a decided record that breaks the machine's record invariants (always: these are
checks that raise, never ``assert``), writes applied decisions with compare-and-set
statements, and holds the stored rows equal to the decided ones (a pair check with the
kernel). A refusal whose reason the machine maps to an error code raises it, inside the
transaction, so nothing is kept. The engine never decides anything itself: the only
branches here are on the kernel's decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tenure.kernel.core import Applied, Decision, Refused, decide
from tenure.model import TenureError

from .failures import persistence_failed
from .store import Store, Transaction
from .tables import Binding

__all__ = ["Engine", "require", "raise_if_conflict", "checked"]


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
    new = decision.new_record
    if new is not None:
        violations = binding.machine.record_violations
        broken = set(violations(new))
        if broken and not broken <= set(violations(old) if old is not None else ()):
            raise persistence_failed("invariant_broken")
    return new


class Engine:
    """Kernel-driven operations on one store, for any machine's binding."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def persist(self, tx: Transaction, binding: Binding, changes: Sequence[tuple[Any, Any]]) -> None:
        """Write ``(old, new)`` changes; the stored rows must equal the decided ones."""
        updates = [(old, new) for old, new in changes if old is not None and new is not None and old != new]
        for old, new in changes:
            if new is None and old is not None and not await tx.delete(binding, old):
                raise persistence_failed("row_changed")
            if old is None and new is not None and await tx.insert(binding, new) != new:
                raise persistence_failed("read_back_mismatch")
        stored = await tx.update_many(binding, updates, read_back=False)
        if stored != [new for _, new in updates]:
            raise persistence_failed("read_back_mismatch")

    async def decide_one(self, tx: Transaction, binding: Binding, record: Any, command: Any) -> Decision:
        """Decide a command on one met row at the transaction's time and persist it."""
        decision = decide(binding.machine, record, command, await tx.now_us())
        if isinstance(decision, Applied):
            await self.persist(tx, binding, [(record, checked(binding, record, decision))])
        return decision

    def decide_all(self, binding: Binding, met: Sequence[tuple[Any, Any]], now_us: int) -> tuple[list[Decision], list[tuple[Any, Any]]]:
        """Decide each ``(record, command)`` at ``now_us``; the changes to persist."""
        decisions: list[Decision] = []
        changes: list[tuple[Any, Any]] = []
        for record, command in met:
            decision = decide(binding.machine, record, command, now_us)
            decisions.append(decision)
            if isinstance(decision, Applied):
                changes.append((record, checked(binding, record, decision)))
        return decisions, changes

    async def on_keys(
        self, binding: Binding, items: Sequence[tuple[str, Any]], by_keys: Any, *, write: bool = True,
        raise_conflicts: bool = False,
    ) -> list[Decision]:
        """Decide each ``(key, command)`` in order on the rows ``by_keys`` (a waiting
        finder over ``keys``) locks, in one transaction: an item sees the effect of
        earlier items on the same row; every changed row is persisted once."""
        async with self.store.transaction(write=write) as tx:
            keys = sorted({key for key, _ in items})
            found = await tx.locked(binding, by_keys, {"keys": keys})
            now = await tx.now_us()
            current: dict[str, Any] = {key: None for key in keys}
            current.update({getattr(record, binding.key_field): record for record in found})
            original = dict(current)
            decisions = []
            for key, command in items:
                decision = decide(binding.machine, current[key], command, now)
                if raise_conflicts:
                    raise_if_conflict(binding, decision)
                if isinstance(decision, Applied):
                    current[key] = checked(binding, current[key], decision)
                decisions.append(decision)
            await self.persist(tx, binding, [(original[key], current[key]) for key in keys if original[key] != current[key]])
        return decisions
