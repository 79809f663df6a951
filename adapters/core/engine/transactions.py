"""The reference write path: one transaction, rows compared and set.

Lock the rows a command meets, read the database clock after the locks, ask the kernel,
check its answer (:mod:`.checks`) and write every changed row with a compare-and-set
statement whose stored result must equal the decided row. Every store offers it; it is
the path the decided-ahead statements fall back to, and the one that explains a
refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tenure.kernel.core import Applied, Decision, Machine, decide

from ..failures import persistence_failed
from ..store import Guard, Store, Transaction
from ..tables import Binding
from .checks import checked, checked_by, raise_if_conflict
from .seen import RowsSeen

__all__ = ["CompareAndSet", "Parts"]

Parts = Callable[[Any], Sequence[tuple[Binding, Any]]]
"""The stored rows a composite record consists of, each with its table's binding."""


class CompareAndSet:
    """Decisions persisted in transactions of ``store``, compared and set row by row."""

    def __init__(self, store: Store, seen: RowsSeen) -> None:
        self.store, self.seen = store, seen

    async def persist(self, tx: Transaction, binding: Binding, changes: Sequence[tuple[Any, Any]]) -> None:
        """Write ``(old, new)`` changes; the stored rows must equal the decided ones."""
        # Deletes, then updates, then inserts: a row that gives up a unique value (a
        # delivery settling, a key released) does so before a new row takes it.
        updates = [(old, new) for old, new in changes if old is not None and new is not None and old != new]
        for old, new in changes:
            if new is None and old is not None and not await tx.delete(binding, old):
                raise persistence_failed("row_changed")
        stored = await tx.update_many(binding, updates, read_back=False)
        if stored != [new for _, new in updates]:
            raise persistence_failed("read_back_mismatch")
        inserts = [new for old, new in changes if old is None and new is not None]
        if inserts and await tx.insert_many(binding, inserts) != inserts:
            raise persistence_failed("read_back_mismatch")
        if binding.announced(changes):
            tx.announce(binding)

    async def decide_one(self, tx: Transaction, binding: Binding, record: Any, command: Any) -> Decision:
        """Decide a command on one met row at the transaction's time and persist it."""
        decision = decide(binding.machine, record, command, await tx.now_us())
        if isinstance(decision, Applied):
            await self.persist(tx, binding, [(record, checked(binding, record, decision))])
        return decision

    async def decide_composite(
        self, tx: Transaction, machine: Machine, parts: Parts, record: Any, command: Any, *,
        deletes: Callable[[Decision], Sequence[tuple[Binding, Sequence[str]]]] | None = None,
        guards: Sequence[Guard] = (),
    ) -> Decision | None:
        """Decide a command on a record that spans several rows (a Run and its
        deliveries) at the transaction's time, and persist every row that changed:
        rows the new record no longer holds are deleted, new ones inserted, changed ones
        compared-and-set; every stored row must equal the decided one. ``deletes`` (of an
        applied decision): rows of other tables deleted by key with that write (a
        settled Run's checkpoint); ``guards``: counts the decision was made on, verified
        with the write (:meth:`~tenure.adapters.core.store.Transaction.write_guarded`).
        None: a guard's count moved, nothing was written (read the counts again and
        decide again)."""
        decision = decide(machine, record, command, await tx.now_us())
        if isinstance(decision, Applied):
            new = checked_by(machine, record, decision)
            removed = [] if deletes is None else deletes(decision)
            if not await self.persist_parts(tx, [] if record is None else parts(record),
                                            [] if new is None else parts(new), deletes=removed, guards=guards):
                return None
        return decision

    async def persist_parts(
        self, tx: Transaction, old_parts: Sequence[tuple[Binding, Any]], new_parts: Sequence[tuple[Binding, Any]], *,
        deletes: Sequence[tuple[Binding, Sequence[str]]] = (), guards: Sequence[Guard] = (),
    ) -> bool:
        """Write the difference between two versions of a composite record, table by
        table in the order the parts are listed (the lock order), with ``deletes`` and
        only while ``guards`` hold (see :meth:`decide_composite`): False when a guard
        failed and nothing was written."""
        def keyed(parts: Sequence[tuple[Binding, Any]]) -> dict[tuple[str, str], tuple[Binding, Any]]:
            return {(binding.name, getattr(row, binding.key_field)): (binding, row) for binding, row in parts}

        old_rows, new_rows = keyed(old_parts), keyed(new_parts)
        changes: dict[str, tuple[Binding, list[tuple[Any, Any]]]] = {}
        for entry in [*new_rows, *(entry for entry in old_rows if entry not in new_rows)]:
            binding, row = new_rows[entry] if entry in new_rows else old_rows[entry]
            old = old_rows[entry][1] if entry in old_rows else None
            new = new_rows[entry][1] if entry in new_rows else None
            if old != new:
                changes.setdefault(binding.name, (binding, []))[1].append((old, new))
        writes = [(binding, *pairs[0]) for binding, pairs in changes.values() if len(pairs) == 1 and pairs[0][1] is not None]
        if len(writes) == len(changes) > 1:
            # One row inserted or changed in each of several tables (a Run and its
            # delivery): one statement where the store allows it, with the deletes and
            # the guards; every stored row must equal the decided one.
            if deletes or guards:
                stored = await tx.write_guarded(writes, deletes, guards)
                if stored is None:
                    return False
            else:
                stored = await tx.write_across(writes)
            if stored != [new for _, _, new in writes]:
                raise persistence_failed("read_back_mismatch")
            for binding, old, new in writes:
                if binding.announced([(old, new)]):
                    tx.announce(binding)
            return True
        if (deletes or guards) and await tx.write_guarded([], deletes, guards) is None:
            return False
        for binding, pairs in changes.values():
            await self.persist(tx, binding, pairs)
        return True

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
        earlier items on the same row; every changed row is persisted once. On a store
        without decided-ahead statements, a write of distinct keys is first decided from
        the rows last seen inside the transaction (:meth:`_on_seen`)."""
        from_seen = self.store.ahead is None and write and len({key for key, _ in items}) == len(items)
        kept: dict[str, Any] = {}
        """The rows to remember once the transaction has committed (by key; None: forget).
        The body may run in another thread (SQLite's connection thread), so it only
        collects them: the memory is touched by the event loop alone."""

        async def body(tx: Transaction) -> list[Decision]:
            kept.clear()
            if from_seen:
                decided = await self._on_seen(tx, binding, items, kept)
                if decided is not None:
                    return decided
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
            kept.update(current)
            return decisions

        decisions = await self.store.run(body, write=write)
        for key, record in kept.items():
            self.seen.keep(binding, key, record)
        return decisions

    async def _on_seen(
        self, tx: Transaction, binding: Binding, items: Sequence[tuple[str, Any]], kept: dict[str, Any],
    ) -> list[Decision] | None:
        """:meth:`on_keys` for distinct keys inside a write transaction (a store without
        decided-ahead statements, where the transaction already holds the write lock and
        its clock), deciding from the rows last seen instead of reading them: the kernel
        decides each at the transaction's time, and every row is written only if it
        still equals, column by column, the row decided on. None: a row was not seen,
        a decision refuses or writes nothing new, or a row is no longer as seen; nothing
        was written, and the caller reads the rows and decides again. The rows written go
        into ``kept``, remembered by the caller once the transaction has committed."""
        now = await tx.now_us()
        decisions: list[Decision] = []
        pairs: list[tuple[Any, Any]] = []
        for key, command in items:
            known, record, _ = self.seen.last_seen(binding, key)
            if not known or record is None:
                return None
            decision = decide(binding.machine, record, command, now)
            if not isinstance(decision, Applied) or decision.new_record is None:
                return None  # a refusal is only ever answered from the row read now
            new = checked(binding, record, decision)
            if new == record:
                return None
            decisions.append(decision)
            pairs.append((record, new))
        stored = await tx.update_seen(binding, pairs)
        if stored is None:
            return None
        if stored != [new for _, new in pairs]:
            raise persistence_failed("read_back_mismatch")
        if binding.announced(pairs):
            tx.announce(binding)
        kept.update((getattr(row, binding.key_field), row) for row in stored)
        return decisions
