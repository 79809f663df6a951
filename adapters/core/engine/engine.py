"""The engine's front: the one object a machine's operations ask (see the package's
docstring). It picks its write strategies when it is built, from what the store offers,
and answers every call by the first that can: decided ahead, then a transaction."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tenure.kernel.core import Decision, Finder, Machine, Rewrite

from ..store import Picked, Probe, Store
from ..tables import Binding
from .ahead import Assemble, CountedAhead, DecidedAhead, Insertion, Joined
from .seen import RowsSeen
from .transactions import CompareAndSet, Parts

__all__ = ["Engine"]


class Engine:
    """Kernel-driven operations on one store, for any machine's binding."""

    compiled = True
    """Decide ahead with the machine's compiled deciders where it declares them
    (:func:`tenure.kernel.compiled.decider_of`). False runs the generic interpreter they
    are proven equal to (the reference: tests run the lockstep both ways)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.seen = RowsSeen()
        """The rows last seen, shared by both write paths."""
        self.transactions = CompareAndSet(store, self.seen)
        """The reference path, on every store."""
        self.statements: DecidedAhead | None = None if store.ahead is None else DecidedAhead(
            store.ahead, self.seen, self.transactions, self)
        """The decided-ahead path, where the store offers its statements."""
        # The calls the reference path and the memory answer alone, bound here so that a
        # write pays no extra call for the engine (each documented where it is defined).
        transactions, seen = self.transactions, self.seen
        self.persist = transactions.persist
        self.decide_one = transactions.decide_one
        self.decide_composite = transactions.decide_composite
        self.persist_parts = transactions.persist_parts
        self.decide_all = transactions.decide_all
        self.remember = seen.remember
        self.last_seen = seen.last_seen
        """(known, the row last seen, its row version): part of the adapters' test seam
        (``docs/testing.md``): a proof asks whether the next write of this row will be
        decided from the row remembered before it plants a writer between the two."""
        self.remember_parts = seen.remember_parts

    def observe(self, now_us: int) -> None:
        """Report ``now_us`` as a call's database time (the store's time observer)."""
        if self.store.observe_time is not None:
            self.store.observe_time(now_us)

    # --- by key: ahead first, then a transaction --------------------------------------------

    async def on_keys(
        self, binding: Binding, items: Sequence[tuple[str, Any]], by_keys: Any, *, write: bool = True,
        raise_conflicts: bool = False,
    ) -> list[Decision]:
        """Decide each ``(key, command)`` in order on the rows ``by_keys`` (a waiting
        finder over ``keys``) locks: an item sees the effect of earlier items on the same
        row; every changed row is persisted once. Distinct keys written go out as one
        decided-ahead statement where the store has them (one round trip when the rows
        last seen are current); otherwise, or when it cannot, one transaction."""
        statements = self.statements
        if statements is not None and write and len({key for key, _ in items}) == len(items):
            decided = await statements.on_keys(binding, items, by_keys, raise_conflicts=raise_conflicts)
            if decided is not None:
                return decided
        return await self.transactions.on_keys(binding, items, by_keys, write=write, raise_conflicts=raise_conflicts)

    # --- decided ahead only (None: the caller runs its transaction) ---------------------------

    async def insert_ahead(
        self, binding: Binding, finder: Finder, parameters: dict[str, Any], command: Any,
        meets: Callable[[list[Any]], Any],
    ) -> Decision | None:
        """:meth:`DecidedAhead.insert_ahead`; None on a store without the statements."""
        if self.statements is None:
            return None
        return await self.statements.insert_ahead(binding, finder, parameters, command, meets)

    async def claim_ahead(
        self, binding: Binding, pick: Probe, check: Finder, blockers: Sequence[Probe], rewrite: Rewrite,
        commands: Sequence[Any], check_parameters: Mapping[str, Any] | None = None,
    ) -> Picked | None:
        """:attr:`DecidedAhead.claim`; None on a store without the statements."""
        if self.statements is None:
            return None
        return await self.statements.claim(binding, pick, check, blockers, rewrite, commands, check_parameters)

    async def joined_ahead(
        self, machine: Machine, parts: Parts, joined: Joined, key: str, command: Any, seen: Any,
        assemble: Assemble, counted: CountedAhead | None = None,
    ) -> Decision | None:
        """:meth:`DecidedAhead.joined_ahead`; None on a store without the statements."""
        if self.statements is None:
            return None
        return await self.statements.joined_ahead(machine, parts, joined, key, command, seen, assemble, counted)

    async def joined_ahead_beside(
        self, machine: Machine, parts: Parts, joined: Joined, key: str, command: Any, seen: Any, assemble: Assemble,
        insertion: Insertion,
    ) -> Decision | None:
        """:meth:`DecidedAhead.joined_ahead_beside`; None on a store without the statements."""
        if self.statements is None:
            return None
        return await self.statements.joined_ahead_beside(machine, parts, joined, key, command, seen, assemble,
                                                         insertion)

    async def joined_insert_ahead(
        self, machine: Machine, parts: Parts, joined: Joined, key: str, command: Any, assemble: Assemble,
        holder: tuple[str, Any] | None = None,
    ) -> Decision | None:
        """:meth:`DecidedAhead.joined_insert_ahead`; None on a store without the statements."""
        if self.statements is None:
            return None
        return await self.statements.joined_insert_ahead(machine, parts, joined, key, command, assemble, holder)
