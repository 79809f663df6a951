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

import collections
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tenure.kernel.ahead import Ahead, at_path, decide_ahead, decide_windowed
from tenure.kernel.compiled import decider_of
from tenure.kernel.core import Applied, Decision, Finder, Invariants, Machine, Refused, decide, slots_of
from tenure.model import TenureError

from .failures import persistence_failed
from .store import AheadAnswer, AheadWriter, Beside, Count, Expected, Guard, JoinedAnswer, Store, Transaction
from .tables import Binding

AHEAD_ROUNDS = 3
"""Decided-ahead statements per call before the call falls back to a transaction: the
first decides from the row last seen (or only reads it), the next from the row the
previous one returned; a third only when the row changed between the two."""

SEEN_ROWS = 10_000
"""Rows remembered per engine (the last version this process read or wrote of each, with
its row version when the store reported one), the records the kernel decides ahead from.
A stale one costs one more round trip."""

__all__ = ["Engine", "CountedAhead", "Insertion", "require", "raise_if_conflict", "checked", "checked_by", "Parts", "Joined", "Assemble"]


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


Parts = Callable[[Any], Sequence[tuple[Binding, Any]]]
"""The stored rows a composite record consists of, each with its table's binding."""


Joined = tuple[Binding, Binding, tuple[tuple[str, str], ...]]
"""A composite record's two rows as one join: the table of the row named by its key, the
table of the one row it meets, and the fields they meet on (a Run and its current
delivery)."""

Assemble = Callable[[str, list[tuple[Any, Any]]], tuple[bool, Any]]
"""The composite record from the rows a join on its key locked: (in shape, the record or
None when no row holds the key); not in shape: the rows are not one record the kernel
can decide on (the caller's transaction path reads them its own way)."""


def moving_fields(before: Any, after: Any, reference_us: int) -> dict[str, int]:
    """The fields of one stored row that move with the time, with their offsets, read off
    the same decided row at the reference time (``before``) and a microsecond later
    (``after``): a field that moved by exactly that microsecond moves with the clock."""
    return {name: value - reference_us for name, value in vars_of(before).items()
            if type(value) is int and getattr(after, name) == value + 1}


def moving_by_row(plan: Ahead, parts: Parts, rows: Sequence[tuple[Binding, Any]], reference_us: int) -> list[dict[str, int]]:
    """:func:`moving_fields` of each stored row of a decision made ahead (``rows``: the
    ``parts`` of its new record), read off the plan's own offsets (``relative``: paths into
    the record) when each names a field of one of these rows, found by identity (no
    record moved, no row compared field by field); otherwise read off the record moved a
    microsecond later, as :func:`moving_fields` does."""
    decided = plan.decision
    assert isinstance(decided, Applied)
    found: list[dict[str, int]] = [{} for _ in rows]
    for path, offset in plan.relative.items():
        head, _, field = path.rpartition(".")
        holder = at_path(decided.new_record, head) if head else decided.new_record
        index = next((index for index, (_, row) in enumerate(rows) if row is holder), None)
        if index is None:
            later = plan.at(reference_us + 1)
            assert isinstance(later, Applied)
            return [moving_fields(row, moved, reference_us) for (_, row), (_, moved) in zip(
                rows, parts(later.new_record), strict=True)]
        found[index][field] = offset
    return found


def vars_of(row: Any) -> dict[str, Any]:
    return {name: slot.__get__(row) for name, slot in slots_of(type(row))}


@dataclasses.dataclass(frozen=True, slots=True)
class CountedAhead:
    """What a composite command that reads counts beside its record needs to be decided
    ahead (:meth:`Engine.joined_ahead`): the counts, the values the first decision starts
    from, the command completed with a set of values, the rows of other tables an applied
    decision deletes with the record, and whether a decision is one the statement does
    whole (it sets off nothing the statement does not do). The machine declares all of
    it; the caller reads it off the declaration."""

    counts: Sequence[Count]
    values: tuple[int, ...]
    complete: Callable[[Any, Sequence[int]], Any]
    deletes: Callable[[Decision], Sequence[tuple[Binding, Sequence[str]]]]
    whole: Callable[[Decision, Sequence[int]], bool]


@dataclasses.dataclass(frozen=True, slots=True)
class Insertion:
    """A command of another machine that inserts one row where ``finder`` (a waiting
    finder over the identities the row must not share, with ``parameters``) meets none:
    what :meth:`Engine.joined_ahead_beside` decides ahead on no record and inserts beside
    a composite record's write (a hop's task submitted with the Run's record of its
    publication). The machine that owns the table builds it; its kernel decides it."""

    binding: Binding
    finder: Finder
    parameters: Mapping[str, Any]
    command: Any


class Engine:
    """Kernel-driven operations on one store, for any machine's binding."""

    compiled = True
    """Decide ahead with the machine's compiled deciders where it declares them
    (:func:`tenure.kernel.compiled.decider_of`). False runs the generic interpreter they
    are proven equal to (the reference: tests run the lockstep both ways)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._seen: collections.OrderedDict[tuple[str, str], tuple[Any, int | None]] = collections.OrderedDict()

    # --- the rows last seen --------------------------------------------------------------

    def remember(self, binding: Binding, records: Sequence[Any], versions: Mapping[str, int] | None = None) -> None:
        """Keep these rows as the last versions seen, with the row versions the store
        reported for them (by key), if any: the records the next writes decide from
        before reading (ahead of a statement on PostgreSQL, inside the write transaction
        on SQLite). A row remembered that is no longer stored costs a read, never a
        wrong write: every write from a row seen compares it with the row stored."""
        seen = self._seen
        for record in records:
            key = getattr(record, binding.key_field)
            entry = (binding.name, key)
            seen[entry] = (record, None if versions is None else versions.get(key))
            seen.move_to_end(entry)
        while len(seen) > SEEN_ROWS:
            seen.popitem(last=False)

    def last_seen(self, binding: Binding, key: str) -> tuple[bool, Any, int | None]:
        """(known, the row last seen, its row version if the store reported one).

        Part of the adapters' test seam (``docs/testing.md``): a proof asks whether the
        next write of this row will be decided from the row remembered (no read in the
        write's transaction) before it plants a writer between the two."""
        found = self._seen.get((binding.name, key))
        if found is None:
            return False, None, None
        return True, *found

    def _forget(self, binding: Binding, key: str) -> None:
        self._seen.pop((binding.name, key), None)

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
        earlier items on the same row; every changed row is persisted once."""
        ahead = self.store.ahead
        if ahead is not None and write and len({key for key, _ in items}) == len(items):
            decided = await self._on_keys_ahead(ahead, binding, items, by_keys, raise_conflicts=raise_conflicts)
            if decided is not None:
                return decided

        from_seen = ahead is None and write and len({key for key, _ in items}) == len(items)
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
            self._keep(binding, key, record)
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
            known, record, _ = self.last_seen(binding, key)
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

    def _keep(self, binding: Binding, key: str, record: Any, versions: Mapping[str, int] | None = None) -> None:
        if record is None:
            self._forget(binding, key)
        else:
            self.remember(binding, [record], versions)

    def decided_ahead(self, machine: Machine, record: Any, command: Any, reference_us: int) -> Ahead | None:
        """The kernel's decision made ahead at ``reference_us``, with its window: by the
        command's compiled decider where the machine declares one (``Engine.compiled``;
        the same answer, tests/kernel/test_compiled.py), else read from the machine's
        declared time guards (:func:`decide_windowed`), else by instrumenting its
        comparisons (:func:`decide_ahead`). None: it cannot be made ahead."""
        decider = decider_of(machine, command.kind) if self.compiled else None
        if decider is not None:
            return decider(record, command, reference_us) or decide_ahead(machine, record, command, reference_us)
        return decide_windowed(machine, record, command, reference_us) or decide_ahead(
            machine, record, command, reference_us)

    def _plan(
        self, binding: Binding, key: str, command: Any, known: bool, record: Any, version: int | None,
        reference_us: int | None, raise_conflicts: bool,
    ) -> tuple[Expected, Ahead | None]:
        """What one item asks of a decided-ahead statement: the kernel's decision from
        ``record`` with its window, or (nothing known, a decision that cannot be made
        ahead, an insert or delete, a refusal that would raise) a read of the row."""
        if not known or reference_us is None:
            return Expected(key, known=False), None
        ahead = self.decided_ahead(binding.machine, record, command, reference_us)
        if ahead is None:
            return Expected(key, known=False), None
        decision = ahead.decision
        if isinstance(decision, Refused):
            if raise_conflicts and binding.machine.outcomes[decision.reason] is not None:
                return Expected(key, known=False), None  # raised only on a row read now
            return Expected(key, record), ahead
        # Invariants are checked once per decision: deciding ahead checked a record whose
        # times move with the clock at both ends of its window already.
        new = decision.new_record if ahead.invariants_checked else checked(binding, record, decision)
        if new == record and not ahead.relative:
            return Expected(key, record), ahead
        if record is None or new is None:
            return Expected(key, known=False), None  # inserts and deletes run in a transaction
        return Expected(key, record, new=new, relative=ahead.relative, version=version), ahead

    async def _on_keys_ahead(
        self, ahead: AheadWriter, binding: Binding, items: Sequence[tuple[str, Any]], by_keys: Finder, *,
        raise_conflicts: bool,
    ) -> list[Decision] | None:
        """:meth:`on_keys` for distinct keys in decided-ahead statements: one round trip
        when the rows last seen are current. None: the call needs a transaction after all
        (the caller runs it; nothing was written).

        Each round decides every item ahead and sends one statement that writes all of
        them or none. When it does not go, the rows it locked and the clock it read are
        a consistent view: decided there, items that change nothing are answered at
        that clock (the serial point of the call); otherwise the next round decides
        ahead from exactly those rows. Only the clock of the answering statement is
        reported as the call's database time.
        """
        reference = ahead.estimated_now_us()
        known = {key: self.last_seen(binding, key) for key, _ in items}
        for _ in range(AHEAD_ROUNDS):
            plans = [self._plan(binding, key, command, *known[key], reference, raise_conflicts) for key, command in items]
            # The window every decision holds in (0, 0 when none was made ahead), in a plain
            # loop: a call of one or a few items pays no generator for it.
            windows = [plan for _, plan in plans if plan is not None]
            not_before, not_after = (windows[0].not_before_us, windows[0].not_after_us) if windows else (0, 0)
            for plan in windows[1:]:
                not_before, not_after = max(not_before, plan.not_before_us), min(not_after, plan.not_after_us)
            try:
                expected = [expected for expected, _ in plans]
                announce = binding.announced([(item.record, item.new) for item in expected])
                answer = await ahead.write_ahead(binding, by_keys, expected, not_before, not_after, announce=announce)
            except TenureError as error:
                if error.reason != "read_back_mismatch":
                    raise
                # A written value did not read back as intended (a trigger, a coercion);
                # the statement kept nothing. The transaction path explains it.
                return None
            if answer is None:
                return None
            if answer.went:
                return self._answer_ahead(binding, plans, answer)
            decisions, changes = self.decide_all(
                binding, [(answer.locked.get(key), command) for key, command in items], answer.now_us
            )
            for key, _ in items:
                self._keep(binding, key, answer.locked.get(key), answer.versions)
            if not changes:
                self.observe(answer.now_us)
                if raise_conflicts:
                    for decision in decisions:
                        raise_if_conflict(binding, decision)
                return decisions
            known = {key: (True, answer.locked.get(key), answer.versions.get(key)) for key, _ in items}
            reference = answer.now_us
        return None

    def _answer_ahead(self, binding: Binding, plans: Sequence[tuple[Expected, Ahead | None]], answer: AheadAnswer) -> list[Decision]:
        """The decisions of a statement that went, at its clock. The statement verified
        every value it wrote against the decided record's, so that record is the row as
        stored now (and the row to decide from next)."""
        decisions: list[Decision] = []
        for expected, plan in plans:
            require(plan is not None)
            assert plan is not None
            decision = plan.at(answer.now_us)
            if expected.new is not None:
                if not isinstance(decision, Applied) or expected.key not in answer.written:
                    raise persistence_failed("read_back_mismatch")
                self.remember(binding, [decision.new_record], answer.versions)
            decisions.append(decision)
        self.observe(answer.now_us)
        return decisions

    async def insert_ahead(
        self, binding: Binding, finder: Finder, parameters: dict[str, Any], command: Any,
        meets: Callable[[list[Any]], Any],
    ) -> Decision | None:
        """A command that inserts a row when ``finder`` (a waiting finder over the
        identities it must not collide with) meets none, in one decided-ahead statement.
        When rows are met, ``meets`` picks the one the command meets and the kernel
        decides there at the statement's clock: a refusal or an unchanged row (a replay)
        is the answer (conflicts raise; nothing was written); anything else, and any
        store without decided-ahead statements, returns None: the caller runs its
        transaction instead."""
        ahead = self.store.ahead
        reference = None if ahead is None else ahead.estimated_now_us()
        if ahead is None or reference is None:
            return None
        plan = self.decided_ahead(binding.machine, None, command, reference)
        if plan is None or not isinstance(plan.decision, Applied) or plan.decision.new_record is None:
            return None
        new = checked(binding, None, plan.decision)
        try:
            answer = await ahead.insert_ahead(binding, finder, parameters, new, plan.relative,
                                              plan.not_before_us, plan.not_after_us,
                                              announce=binding.announced([(None, new)]))
        except TenureError as error:
            if error.reason != "read_back_mismatch":
                raise
            return None  # kept nothing; the transaction path explains it
        if answer is None:
            return None
        if answer.went:
            decision = plan.at(answer.now_us)
            if not isinstance(decision, Applied) or len(answer.written) != 1:
                raise persistence_failed("read_back_mismatch")
            self.remember(binding, [decision.new_record], answer.versions)
            self.observe(answer.now_us)
            return decision
        if not answer.locked:
            return None  # the window was missed: decide the ordinary way
        met = meets(list(answer.locked.values()))
        decision = decide(binding.machine, met, command, answer.now_us)
        if isinstance(decision, Refused):
            self.observe(answer.now_us)
            raise_if_conflict(binding, decision)
            return decision
        if met is not None and decision.new_record == met:
            self.observe(answer.now_us)
            return decision
        return None

    async def joined_ahead(
        self, machine: Machine, parts: Parts, joined: Joined, key: str, command: Any, seen: Any,
        assemble: Assemble, counted: CountedAhead | None = None,
    ) -> Decision | None:
        """Decide ``command`` on a composite record of two rows (``joined``: a row and the
        one row it meets, ``parts`` in that order) in decided-ahead statements: from
        ``seen`` (the record as last seen; None: only read it, in the same statement),
        one statement locks both rows, reads the clock after both locks and writes both
        only if both still equal the record decided on and the clock lies in the
        decision's window. Otherwise it answers the rows and the clock: a refusal or an
        unchanged record there is the answer; anything else is decided ahead again from
        those rows. None: the call needs a transaction (a decision that adds or removes
        a row, rows out of shape, rounds spent, a store without the statement); nothing
        was written. Every decision is the kernel's: this method compares nothing.

        ``counted``: the command also reads counts (see :class:`CountedAhead`): each round
        decides it completed with the counts it starts from, or those the previous
        statement read; the statement writes only while every count still has its value,
        read in a snapshot that sees the row it locked. A decision that leaves work for
        a transaction, or counts the statement could not prove current, return None."""
        ahead = self.store.ahead
        reference = None if ahead is None else ahead.estimated_now_us()
        if ahead is None:
            return None
        record = seen
        values = () if counted is None else counted.values
        for _ in range(AHEAD_ROUNDS):
            complete = command if counted is None else counted.complete(command, values)
            plan = None if record is None or reference is None else self.decided_ahead(machine, record, complete, reference)
            if plan is not None and counted is not None and not counted.whole(plan.decision, values):
                return None  # it sets off work the statement does not do
            items = self._joined_items(machine, parts, key, record, plan, reference)
            if items is None:
                return None
            window = (0, 0) if plan is None else (plan.not_before_us, plan.not_after_us)
            extra: dict[str, Any] = {}
            if counted is not None:
                extra["guards"] = list(zip(counted.counts, values, strict=True))
                if plan is not None and isinstance(plan.decision, Applied):
                    extra["deletes"] = counted.deletes(plan.decision)
            try:
                answer = await ahead.joined_ahead(*joined, items, *window, **extra)
            except TenureError as error:
                if error.reason != "read_back_mismatch":
                    raise
                return None  # a written value did not read back as intended; nothing kept
            if answer is None:
                return None
            if answer.went:
                assert plan is not None
                decision = plan.at(answer.now_us)
                written = decision.new_record if isinstance(decision, Applied) else record
                self.remember_parts(parts(written))
                self.observe(answer.now_us)
                return decision
            in_shape, locked = assemble(key, answer.joined)
            if not in_shape:
                return None
            if locked is not None:
                self.remember_parts(parts(locked))
            if counted is not None:
                if not answer.current:
                    return None  # its counts may miss what a writer of the row committed meanwhile
                values = tuple(answer.counted)
                complete = counted.complete(command, values)
            decision = decide(machine, locked, complete, answer.now_us)
            if counted is not None and not counted.whole(decision, values):
                return None
            if isinstance(decision, Refused) or decision.new_record == locked:
                self.observe(answer.now_us)
                return decision
            record, reference = locked, answer.now_us
        return None

    async def joined_ahead_beside(
        self, machine: Machine, parts: Parts, joined: Joined, key: str, command: Any, seen: Any, assemble: Assemble,
        insertion: Insertion,
    ) -> Decision | None:
        """Decide ``command`` on a composite record of two rows ahead from ``seen`` (as
        :meth:`joined_ahead`) and, in the same statement, insert the row ``insertion``'s
        machine decides on no record: both only if the pair is unchanged, no row shares an
        identity with the new one and the clock lies in both decisions' windows; neither
        otherwise. One round: when the statement does not write, a refusal the kernel
        decides on the rows it locked is the answer (nothing was inserted either); None
        for anything else (a decision that changes nothing or cannot be made ahead, the
        row met, the window missed, rows out of shape, a store without the statement):
        the caller takes its ordinary path. Every decision is the kernel's."""
        ahead = self.store.ahead
        reference = None if ahead is None else ahead.estimated_now_us()
        if ahead is None or reference is None or seen is None:
            return None
        plan = self.decided_ahead(machine, seen, command, reference)
        other = insertion.binding.machine
        row_plan = self.decided_ahead(other, None, insertion.command, reference)
        if plan is None or row_plan is None or not isinstance(row_plan.decision, Applied) \
                or row_plan.decision.new_record is None or not isinstance(plan.decision, Applied):
            return None
        items = self._joined_items(machine, parts, key, seen, plan, reference)
        if items is None or all(item.new is None for item in items):
            return None  # a write the statement does not make, or none at all
        row = checked(insertion.binding, None, row_plan.decision)
        beside = Beside(insertion.binding, insertion.finder, insertion.parameters, row, row_plan.relative,
                        announce=insertion.binding.announced([(None, row)]))
        window = (max(plan.not_before_us, row_plan.not_before_us), min(plan.not_after_us, row_plan.not_after_us))
        if window[0] >= window[1]:
            return None  # no time at which both decisions hold
        try:
            answer = await ahead.joined_ahead(*joined, items, *window, beside=beside)
        except TenureError as error:
            if error.reason != "read_back_mismatch":
                raise
            return None  # a row inserted meanwhile, or a value that did not read back: nothing kept
        if answer is None:
            return None
        if answer.went:
            decision = plan.at(answer.now_us)
            self.remember_parts(parts(decision.new_record))  # type: ignore[union-attr]
            self.observe(answer.now_us)
            return decision
        in_shape, locked = assemble(key, answer.joined)
        if not in_shape:
            return None
        if locked is not None:
            self.remember_parts(parts(locked))
        decision = decide(machine, locked, command, answer.now_us)
        if isinstance(decision, Refused):
            self.observe(answer.now_us)
            return decision
        return None

    async def joined_insert_ahead(
        self, machine: Machine, parts: Parts, joined: Joined, key: str, command: Any, assemble: Assemble,
        holder: tuple[str, Any] | None = None,
    ) -> Decision | None:
        """A command that creates a composite record of two rows (``joined``) when none
        holds ``key`` (nor, with ``holder``, a field's value), decided ahead and inserted in
        one statement. When rows are met, the kernel decides there at the statement's
        clock: a refusal or an unchanged record (a replay) is the answer. None: anything
        else (rows out of shape, rows another writer inserted meanwhile, the window
        missed, a decision that cannot be made ahead): the caller's transaction decides;
        nothing was written."""
        ahead = self.store.ahead
        reference = None if ahead is None else ahead.estimated_now_us()
        if ahead is None or reference is None:
            return None
        plan = self.decided_ahead(machine, None, command, reference)
        if plan is None or not isinstance(plan.decision, Applied) or plan.decision.new_record is None:
            return None
        new = plan.decision.new_record if plan.invariants_checked else checked_by(machine, None, plan.decision)
        news = parts(new)
        if [binding for binding, _ in news] != [joined[0], joined[1]]:
            return None
        try:
            answer = await ahead.joined_insert_ahead(
                *joined, [row for _, row in news], moving_by_row(plan, parts, news, reference),
                holder, plan.not_before_us, plan.not_after_us)
        except TenureError as error:
            if error.reason != "read_back_mismatch":
                raise
            return None  # an inserted value did not read back as intended; nothing kept
        if answer is None or answer.collided:
            return None
        if answer.went:
            decision = plan.at(answer.now_us)
            self.remember_parts(parts(decision.new_record))  # type: ignore[union-attr]
            self.observe(answer.now_us)
            return decision
        in_shape, met = assemble(key, answer.joined)
        if not in_shape or met is None:
            return None
        self.remember_parts(parts(met))
        decision = decide(machine, met, command, answer.now_us)
        if isinstance(decision, Refused) or decision.new_record == met:
            self.observe(answer.now_us)
            return decision
        return None

    def _joined_items(
        self, machine: Machine, parts: Parts, key: str, record: Any, plan: Ahead | None, reference: int | None,
    ) -> list[Expected] | None:
        """What a joined decided-ahead statement expects of each row and writes to it
        (nothing known: it only reads); None: the decision adds or removes a row, which
        the statement does not do."""
        if plan is None or reference is None:
            return [Expected(key, known=False), Expected("", known=False)]
        olds = parts(record)
        decision = plan.decision
        if not isinstance(decision, Applied) or decision.new_record == record:
            return [Expected(getattr(row, binding.key_field), row) for binding, row in olds]
        new = decision.new_record if plan.invariants_checked else checked_by(machine, record, decision)
        news = parts(new)
        if [(binding, getattr(row, binding.key_field)) for binding, row in news] != [
                (binding, getattr(row, binding.key_field)) for binding, row in olds]:
            return None
        return [Expected(getattr(old, binding.key_field), old, new=None if row == old else row, relative=moving)
                for (binding, old), (_, row), moving in zip(olds, news, moving_by_row(plan, parts, news, reference),
                                                            strict=True)]

    def remember_parts(self, rows: Sequence[tuple[Binding, Any]]) -> None:
        """Keep each row of a composite record (``parts``) as the last version seen."""
        for binding, row in rows:
            self.remember(binding, [row])

    def observe(self, now_us: int) -> None:
        """Report ``now_us`` as a call's database time (the store's time observer)."""
        if self.store.observe_time is not None:
            self.store.observe_time(now_us)
