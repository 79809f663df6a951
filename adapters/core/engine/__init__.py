"""The one engine every machine runs on: lock, read the clock, decide, persist, check.

A machine's operations (``adapters/<machine>/``) say which rows a command meets (kernel
finders) and which commands to send, and ask this :class:`Engine`; the engine does the
rest the same way for every machine, through its write strategies:

- :mod:`.transactions` (:class:`CompareAndSet`, every store): lock the rows, read the
  database time after the locks, call the kernel's ``decide``, write applied decisions
  with compare-and-set statements and hold the stored rows equal to the decided ones;
- :mod:`.ahead` (:class:`DecidedAhead`, a store with decided-ahead statements:
  PostgreSQL): decide from the row last seen and send one statement that writes only
  where the rows and the clock still agree with that decision, falling back to a
  transaction when it cannot;
- the deciders the ahead path decides with (:mod:`.deciders`): the machine's compiled
  deciders (``Engine.compiled``), else the generic interpreter they are proven equal
  to.

:mod:`.checks` holds what every path checks (a decided record keeps the machine's record
invariants: checks that raise, never ``assert``; a refusal the machine maps to an error
code raises it, inside the transaction, so nothing is kept), and :mod:`.seen` the rows
last seen. The engine picks its strategies when it is built, from what the store offers;
the operations never call a strategy, nor the store's statements, themselves. The engine
never decides anything itself: the only branches here are on the kernel's decisions and
on which path answered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .ahead import AHEAD_ROUNDS, Assemble, CountedAhead, DecidedAhead, Insertion, Joined
    from .checks import checked, checked_by, raise_if_conflict, require
    from .engine import Engine
    from .seen import SEEN_ROWS, RowsSeen
    from .transactions import CompareAndSet, Parts

__all__ = ["Engine", "CountedAhead", "Insertion", "require", "raise_if_conflict", "checked", "checked_by", "Parts",
           "Joined", "Assemble", "CompareAndSet", "DecidedAhead", "RowsSeen", "AHEAD_ROUNDS", "SEEN_ROWS"]

__getattr__ = lazy_exports(__name__, {
    "Engine": ".engine", "CompareAndSet": ".transactions", "Parts": ".transactions",
    "DecidedAhead": ".ahead", "CountedAhead": ".ahead", "Insertion": ".ahead", "Joined": ".ahead", "Assemble": ".ahead",
    "AHEAD_ROUNDS": ".ahead", "require": ".checks", "raise_if_conflict": ".checks", "checked": ".checks",
    "checked_by": ".checks", "RowsSeen": ".seen", "SEEN_ROWS": ".seen",
})
