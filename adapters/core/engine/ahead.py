"""The decided-ahead write path: one statement, decided before it is sent.

The kernel decides a command from the row last seen (:mod:`.seen`) at an estimate of the
database time, with the window of times its decision holds in (by the machine's compiled
decider, its declared time guards, or its comparisons instrumented: :class:`~tenure.adapters.core.engine.Engine`
picks which); one autocommit statement then locks the rows, reads the clock after the
locks, and writes the decided rows only if the rows still equal the ones decided on and
the clock lies in the window, verifying every value it wrote. When it does not write,
the rows and clock it read are decided on again (a refusal or an unchanged row there is
the answer) or the call falls back to a transaction (:mod:`.transactions`). Every
decision is the kernel's: this module compares nothing. Offered by stores with
decided-ahead statements (PostgreSQL: ``store.ahead``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from tenure.kernel.ahead import Ahead, at_path
from tenure.kernel.core import Applied, Decision, Finder, Machine, Refused, decide, slots_of
from tenure.model import TenureError

from ..failures import persistence_failed
from ..store import AheadAnswer, AheadWriter, Beside, Count, Expected
from ..tables import Binding
from .checks import checked, checked_by, raise_if_conflict, require
from .deciders import decided_ahead
from .seen import RowsSeen
from .transactions import CompareAndSet, Parts

AHEAD_ROUNDS = 3
"""Decided-ahead statements per call before the call falls back to a transaction: the
first decides from the row last seen (or only reads it), the next from the row the
previous one returned; a third only when the row changed between the two."""

__all__ = ["DecidedAhead", "CountedAhead", "Insertion", "Joined", "Assemble", "Front", "AHEAD_ROUNDS"]



class Front(Protocol):
    """What the decided-ahead path reads of the engine it serves: which deciders to
    decide with (:func:`.deciders.decided_ahead`), read at every decision (a test may
    switch them on the class), and where a call's database time is reported."""

    compiled: bool

    def observe(self, now_us: int) -> None: ...

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


class DecidedAhead:
    """Decisions persisted in decided-ahead statements of ``writer``; what they cannot do
    is left to ``transactions`` (the caller falls back when a method answers None)."""

    def __init__(self, writer: AheadWriter, seen: RowsSeen, transactions: CompareAndSet, front: Front) -> None:
        self.writer, self.seen, self.transactions, self.front = writer, seen, transactions, front
        self.observe = front.observe
        self.claim = writer.claim_ahead
        """A claim in one statement (:meth:`AheadWriter.claim_ahead`), the writer's own
        (bound here: a claim pays no call for this path). The caller's kernel decides
        the same claims on the picked rows, holds the written ones equal to them, and
        only then remembers them and reports the clock."""

    def _plan(
        self, binding: Binding, key: str, command: Any, known: bool, record: Any, version: int | None,
        reference_us: int | None, raise_conflicts: bool,
    ) -> tuple[Expected, Ahead | None]:
        """What one item asks of a decided-ahead statement: the kernel's decision from
        ``record`` with its window, or (nothing known, a decision that cannot be made
        ahead, an insert or delete, a refusal that would raise) a read of the row."""
        if not known or reference_us is None:
            return Expected(key, known=False), None
        ahead = decided_ahead(binding.machine, record, command, reference_us, compiled=self.front.compiled)
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

    async def on_keys(
        self, binding: Binding, items: Sequence[tuple[str, Any]], by_keys: Finder, *, raise_conflicts: bool,
    ) -> list[Decision] | None:
        """:meth:`Engine.on_keys` for distinct keys in decided-ahead statements: one round trip
        when the rows last seen are current. None: the call needs a transaction after all
        (the caller runs it; nothing was written).

        Each round decides every item ahead and sends one statement that writes all of
        them or none. When it does not go, the rows it locked and the clock it read are
        a consistent view: decided there, items that change nothing are answered at
        that clock (the serial point of the call); otherwise the next round decides
        ahead from exactly those rows. Only the clock of the answering statement is
        reported as the call's database time.
        """
        ahead = self.writer
        reference = ahead.estimated_now_us()
        known = {key: self.seen.last_seen(binding, key) for key, _ in items}
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
                return self._answer(binding, plans, answer)
            decisions, changes = self.transactions.decide_all(
                binding, [(answer.locked.get(key), command) for key, command in items], answer.now_us
            )
            for key, _ in items:
                self.seen.keep(binding, key, answer.locked.get(key), answer.versions)
            if not changes:
                self.observe(answer.now_us)
                if raise_conflicts:
                    for decision in decisions:
                        raise_if_conflict(binding, decision)
                return decisions
            known = {key: (True, answer.locked.get(key), answer.versions.get(key)) for key, _ in items}
            reference = answer.now_us
        return None

    def _answer(self, binding: Binding, plans: Sequence[tuple[Expected, Ahead | None]], answer: AheadAnswer) -> list[Decision]:
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
                self.seen.remember(binding, [decision.new_record], answer.versions)
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
        is the answer (conflicts raise; nothing was written); anything else, returns None: the caller runs its
        transaction instead."""
        ahead = self.writer
        reference = ahead.estimated_now_us()
        if reference is None:
            return None
        plan = decided_ahead(binding.machine, None, command, reference, compiled=self.front.compiled)
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
            self.seen.remember(binding, [decision.new_record], answer.versions)
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
        a row, rows out of shape, rounds spent, a statement the store cannot spell); nothing
        was written. Every decision is the kernel's: this method compares nothing.

        ``counted``: the command also reads counts (see :class:`CountedAhead`): each round
        decides it completed with the counts it starts from, or those the previous
        statement read; the statement writes only while every count still has its value,
        read in a snapshot that sees the row it locked. A decision that leaves work for
        a transaction, or counts the statement could not prove current, return None."""
        ahead = self.writer
        reference = ahead.estimated_now_us()
        record = seen
        values = () if counted is None else counted.values
        for _ in range(AHEAD_ROUNDS):
            complete = command if counted is None else counted.complete(command, values)
            plan = None if record is None or reference is None else decided_ahead(
                machine, record, complete, reference, compiled=self.front.compiled)
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
                self.seen.remember_parts(parts(written))
                self.observe(answer.now_us)
                return decision
            in_shape, locked = assemble(key, answer.joined)
            if not in_shape:
                return None
            if locked is not None:
                self.seen.remember_parts(parts(locked))
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
        row met, the window missed, rows out of shape, a statement the store cannot spell):
        the caller takes its ordinary path. Every decision is the kernel's."""
        ahead = self.writer
        reference = ahead.estimated_now_us()
        if reference is None or seen is None:
            return None
        plan = decided_ahead(machine, seen, command, reference, compiled=self.front.compiled)
        other = insertion.binding.machine
        row_plan = decided_ahead(other, None, insertion.command, reference, compiled=self.front.compiled)
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
            self.seen.remember_parts(parts(decision.new_record))  # type: ignore[union-attr]
            self.observe(answer.now_us)
            return decision
        in_shape, locked = assemble(key, answer.joined)
        if not in_shape:
            return None
        if locked is not None:
            self.seen.remember_parts(parts(locked))
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
        ahead = self.writer
        reference = ahead.estimated_now_us()
        if reference is None:
            return None
        plan = decided_ahead(machine, None, command, reference, compiled=self.front.compiled)
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
            self.seen.remember_parts(parts(decision.new_record))  # type: ignore[union-attr]
            self.observe(answer.now_us)
            return decision
        in_shape, met = assemble(key, answer.joined)
        if not in_shape or met is None:
            return None
        self.seen.remember_parts(parts(met))
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
