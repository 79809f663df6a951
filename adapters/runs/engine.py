"""The Run engine: the one entry every Run command goes through.

:meth:`RunEngine.send` takes a Run command and, in one transaction, reads what the
kernel's aggregate declaration (:mod:`tenure.kernel.runs.aggregate`) names for it (the
Run and its current delivery always, then the evidence: owner rows, containment counts,
a busy session, the clock for a timer's delay), completes the command with that
evidence, asks the Run machine, persists the decided pair with compare-and-set writes on
the Run and every delivery it touches, runs the declared in-transaction follow-ups
(sweep consents, delete or bind the checkpoint, clear a lost hop's outcome) and returns
the decision with the follow-ups its caller runs after commit (publish the opened hop).
Nothing here looks at where a Run stands: the readers and follow-ups are tables keyed
by the declaration's names.

On a store with decided-ahead statements (PostgreSQL), the commands the declaration
names ``DECIDED_AHEAD`` (they read only the pair and write its two rows in place) and an
admission without the session fence (``ADMITTED_AHEAD``) go first through
:meth:`RunEngine.send_ahead`: the kernel decides from the pair this engine last saw (or
from no record, for an admission) with the window of database time its decision holds
for, and one statement checks both rows and the window after the locks and writes both
(:meth:`~tenure.adapters.core.engine.Engine.joined_ahead`,
:meth:`~tenure.adapters.core.engine.Engine.joined_insert_ahead`). A command that also
reads counts (``COUNTED_AHEAD``: a hop's settle) is decided ahead the same way on the
counts the declaration starts from, which the statement counts after its locks and
verifies, with the checkpoint delete written with the pair (:func:`_counted_ahead`).
Whatever that cannot settle takes the transaction above, which stays the reference.

``RunEngine`` is also the Run side's transaction toolkit (one per ledger, reached as
``RunLedger.engine``): :meth:`run` and :meth:`read` (one transaction behind the Run
ledger's error boundary), :meth:`locked_pair` / :meth:`read_pair`, :meth:`containment`
and :meth:`owner` (the readers recovery's page visits share). It is public and
documented in ``docs/runs.md`` ("The Run engine") because recovery, the console's
reads and the conformance replays use it; an application uses ``RunLedger``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from tenure.kernel.agent_jobs.record import AgentJobRow, job_complete
from tenure.kernel.attempts.record import AttemptRow
from tenure.kernel.consents.commands import CancelPending
from tenure.kernel.consents.record import ConsentRow
from tenure.kernel.messages.commands import CancelPending as CancelPendingReceive
from tenure.kernel.messages.record import MessageRow, answer_complete
from tenure.kernel.core import Applied, Decision, Finder, Refused, decide
from tenure.kernel.runs import finders
from tenure.kernel.runs.aggregate import (
    ADMITTED_AHEAD,
    COUNTED_AHEAD,
    COUNTED_WITH_PAIR,
    DECIDED_AHEAD,
    FILLS,
    IDLE_WHEN_NONE_COUNTED,
    READS,
    WRITTEN_WITH_PAIR,
    UNREAD_CONTAINMENT,
    Evidence,
    FollowUp,
    after_commit,
    in_transaction,
    left_for_transaction,
    on_refusal,
)
from tenure.kernel.runs.commands import Containment, OwnerEvidence, RunCommand, RunCommandType, Settle
from tenure.kernel.runs.machine import RUNS, RunRefusal, consent_sweep
from tenure.kernel.runs.record import DeliveryRow, RunPair, RunRow, key_of
from tenure.model import ConfigValidationError, ErrorCode, RunStatus, WaitKind
from tenure.model.runs import MAX_ERROR_CHARS, MAX_RUN_DOCUMENT_BYTES, check_run_id, check_seq, check_text
from tenure.model.validation import refuse

from ..agent_jobs.table import AGENT_JOBS_BINDING
from ..attempts.table import ATTEMPTS_BINDING
from ..consents.table import CONSENTS_BINDING
from ..messages.table import MESSAGES_BINDING
from ..core.engine import CountedAhead, Engine, Insertion, Joined, raise_if_conflict
from ..core.facade import persistence_as
from ..core.failures import persistence_failed
from ..core.store import Count, Guard, Transaction
from ..core.tables import Binding
from .checkpoints import RecordedOutcome, clear_outcome_in, delete_in, put_in, record_outcome_in, stored_in
from .table import CHECKPOINTS_BINDING, CURRENT_DELIVERY, DELIVERIES_BINDING, RUNS_BINDING, CheckpointRow

__all__ = ["RunEngine", "Inputs", "Sent", "NO_INPUTS", "COUNTS", "consent_evidence", "job_evidence", "attempt_evidence",
           "message_evidence",
           "current_pair", "PathObserver", "AHEAD", "FALLBACK"]

AHEAD = "ahead"
"""A command decided ahead: one statement decided it, with or without writing
(:meth:`RunEngine.send_ahead` answered)."""

FALLBACK = "fallback"
"""A command with a decided-ahead form that the statement could not decide (rows out of
shape, an insert that collided, rounds spent, a missed window): it took the transaction
path after all (the reference). Nothing was written ahead."""

PathObserver = Callable[[RunCommandType, str], None]
"""Told, for every command :meth:`RunEngine.send` may decide ahead on this store, which
path decided it (:data:`AHEAD` or :data:`FALLBACK`); the commands and stores without a
decided-ahead form (SQLite) take the transaction and tell it nothing."""

T = TypeVar("T")


def consent_evidence(row: ConsentRow) -> OwnerEvidence:
    return OwnerEvidence(WaitKind.CONSENT, row.consent_id, row.run_id, row.status.value,
                         row.decided_by is not None and row.decided_at_us is not None)


def job_evidence(row: AgentJobRow) -> OwnerEvidence:
    return OwnerEvidence(WaitKind.DELEGATE, row.job_id, row.run_id, row.status.value, job_complete(row))


def attempt_evidence(row: AttemptRow) -> OwnerEvidence:
    return OwnerEvidence(WaitKind.SERVICE, row.attempt_id, row.run_id, row.state.value, True)


def message_evidence(row: MessageRow) -> OwnerEvidence:
    """A receive (a message slot) as the owner a Run waits on: decided once it has its
    answer (a message, or its timeout), complete when that answer has its parts."""
    return OwnerEvidence(WaitKind.MESSAGE, row.slot_id, row.run_id, row.status.value, answer_complete(row))


def _parts(pair: RunPair) -> list[tuple[Any, Any]]:
    """The rows of the aggregate the engine compares and sets, in the lock order (the Run,
    then its deliveries)."""
    return [(RUNS_BINDING, pair.run), *((DELIVERIES_BINDING, delivery) for delivery in pair.deliveries)]


PAIR_JOIN: Joined = (RUNS_BINDING, DELIVERIES_BINDING, CURRENT_DELIVERY)
"""The Run and its current delivery as one join (the lock order: the Run first)."""


def _assembled(run_id: str, joined: list[tuple[RunRow, DeliveryRow | None]]) -> tuple[bool, RunPair | None]:
    """The pair a joined statement locked (in shape, the pair or None: no such Run); not in
    shape when the join did not find the delivery the Run's sequence names (the
    transaction path reads it by key: see :meth:`RunEngine.locked_pair`)."""
    if not joined:
        return True, None
    found = current_pair(run_id, joined)
    return (False, None) if found is None else (True, RunPair(found[0], (found[1],)))


def current_pair(run_id: str, joined: list[tuple[RunRow, DeliveryRow | None]]) -> tuple[RunRow, DeliveryRow] | None:
    """The Run with its current delivery from a join on :data:`CURRENT_DELIVERY`, when the
    join found exactly one Run and the delivery its sequence's key names; None when it
    did not (rows out of shape, or a delivery the join could not see: read it by key)."""
    if len(joined) != 1:
        return None
    run, delivery = joined[0]
    if delivery is None or delivery.delivery_id != key_of(run_id, run.enqueue_seq):
        return None
    return run, delivery


@dataclasses.dataclass(frozen=True, slots=True)
class Inputs:
    """What a caller hands the engine beside the command, for the readings and follow-ups
    the declaration names: the session fence an admission asked for, a timer's delay (its
    due time is the clock read under the lock plus this), and the checkpoint a timer's
    park binds (``bind_checkpoint``; its ``saved_at_us`` is the clock's), and the outcome
    a worker's settle records when the kernel refuses it for unproven containment
    (``record_outcome``)."""

    session_fence: bool = False
    delay_us: int | None = None
    checkpoint: CheckpointRow | None = None
    outcome: RecordedOutcome | None = None


NO_INPUTS = Inputs()


@dataclasses.dataclass(frozen=True, slots=True)
class Sent:
    """The kernel's decision on a command, as persisted, and the follow-ups the caller runs
    after commit (:data:`~tenure.kernel.runs.aggregate.AFTER_COMMIT`)."""

    decision: Decision
    after_commit: tuple[FollowUp, ...]

    @property
    def applied(self) -> bool:
        return isinstance(self.decision, Applied)

    @property
    def reply(self) -> object:
        return self.decision.reply if isinstance(self.decision, Applied) else None

    @property
    def hop_to_publish(self) -> int | None:
        """The sequence of the hop the caller publishes after commit (the declared
        ``publish_hop``: the Run's current sequence as decided), or None."""
        if FollowUp.PUBLISH_HOP not in self.after_commit:
            return None
        pair: RunPair = self.decision.new_record  # type: ignore[union-attr,assignment]
        return pair.run.enqueue_seq


@dataclasses.dataclass(slots=True)
class _Aggregate:
    """What one send read so far: the Run it names, the pair met, the command's fields."""

    run_id: str
    command: Any
    inputs: Inputs
    pair: RunPair | None = None
    fills: dict[str, Any] = dataclasses.field(default_factory=dict)
    counted: dict[Evidence, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    """The counts read with the pair (:data:`COUNTED_WITH_PAIR`), by evidence."""
    guards: list[Guard] = dataclasses.field(default_factory=list)
    """Those counts as the pair's write verifies them (empty once counted again after the lock)."""
    written: set[FollowUp] = dataclasses.field(default_factory=set)
    """The follow-ups written with the pair (:data:`WRITTEN_WITH_PAIR`)."""


_Reader = Callable[["RunEngine", Transaction, _Aggregate], Awaitable[Any]]
_Step = Callable[["RunEngine", Transaction, _Aggregate, Decision], Awaitable[None]]


class RunEngine:
    """The Run side's one engine entry and transaction toolkit (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.path_observer: PathObserver | None = None
        """Part of the adapters' test seam (``docs/testing.md``): told which path each
        command that may be decided ahead took (the Run lockstep counts them, so a run
        in which one path never ran fails). It only watches; None: nothing is told."""

    # --- the one boundary --------------------------------------------------------------

    def errors(self) -> contextlib.AbstractAsyncContextManager[None]:
        """A persistence failure of the shared stores becomes the Run ledger's code."""
        return persistence_as(ErrorCode.RUN_PERSISTENCE_FAILED)

    async def run(self, body: Callable[[Transaction], Awaitable[T]], *, write: bool = True) -> T:
        """``body`` in one transaction, behind :meth:`errors`."""
        async with self.errors():
            return await self.engine.store.run(body, write=write)

    async def read(self, body: Callable[[Transaction], Awaitable[T]]) -> T:
        """A pure read (``get``, lists, the clock) in one read-only transaction."""
        return await self.run(body, write=False)

    # --- the engine entry ----------------------------------------------------------------

    async def send(self, run_id: str, command: RunCommand, inputs: Inputs = NO_INPUTS) -> Sent:
        """``command`` to the Run ``run_id``: decided ahead in one statement where the
        declaration allows it (:data:`~tenure.kernel.runs.aggregate.DECIDED_AHEAD`, a
        store with decided-ahead statements: :meth:`send_ahead`), else in a transaction of
        its own (:meth:`send_in`, the reference and the fallback). Part of the adapters'
        test seam (``docs/testing.md``): the Run replay sends a trace's commands here. A
        refusal that set off follow-ups commits them, then raises the error the refusal
        maps to, if any."""
        if self.engine.store.ahead is not None and (
                (inputs == NO_INPUTS and (command.kind in DECIDED_AHEAD or command.kind in ADMITTED_AHEAD))
                # The outcome a worker's settle hands over is written only by a refusal's
                # follow-up (record_outcome), which a decided-ahead statement never does:
                # such a decision takes the transaction below, with the outcome.
                or (command.kind in COUNTED_AHEAD and dataclasses.replace(inputs, outcome=None) == NO_INPUTS)):
            sent = await self.send_ahead(run_id, command)
            if sent is not None:
                return sent
            if self.path_observer is not None:
                self.path_observer(command.kind, FALLBACK)
        aggregate: list[_Aggregate] = []
        sent = await self.run(lambda tx: self._send_in(tx, run_id, command, inputs, aggregate))
        if self.engine.store.ahead is not None:
            # Committed: the pair as it now stands is what the next command decides from.
            pair = sent.decision.new_record if isinstance(sent.decision, Applied) else aggregate[-1].pair
            if pair is not None:
                self.engine.remember_parts(_parts(pair))
        # A refusal that set off follow-ups (:func:`~tenure.kernel.runs.aggregate.on_refusal`:
        # a settle refused for containment records its outcome) committed them; its error,
        # if any, is raised now.
        raise_if_conflict(RUNS_BINDING, sent.decision)
        return sent

    async def send_ahead(self, run_id: str, command: RunCommand) -> Sent | None:
        """``command`` decided ahead from the pair this engine last saw (or read in the
        same statement), in one statement per round (:meth:`Engine.joined_ahead`); None:
        it needs the transaction path after all (nothing was written)."""
        async with self.errors():
            if command.kind in ADMITTED_AHEAD:
                key = command.run.idempotency_key  # type: ignore[union-attr]
                decision = await self.engine.joined_insert_ahead(
                    RUNS, _parts, PAIR_JOIN, run_id, command, _assembled,
                    None if key is None else ("idempotency_key", key))
            else:
                counted = _counted_ahead(run_id, command) if command.kind in COUNTED_AHEAD else None
                decision = await self.engine.joined_ahead(
                    RUNS, _parts, PAIR_JOIN, run_id, command, self.last_pair(run_id), _assembled, counted)
        if decision is None:
            return None
        if self.path_observer is not None:
            self.path_observer(command.kind, AHEAD)
        raise_if_conflict(RUNS_BINDING, decision)
        return Sent(decision, after_commit(command.kind, decision.reply) if isinstance(decision, Applied) else ())

    async def send_beside(self, run_id: str, command: RunCommand, pair: RunPair, insertion: Insertion) -> Sent | None:
        """``command`` (one the declaration decides ahead) decided from ``pair`` and written
        in one statement with the row ``insertion``'s machine decides (a hop's task):
        both or neither (:meth:`Engine.joined_ahead_beside`). The decision applied, or a
        refusal on the rows as locked (nothing written, nothing inserted); None: nothing
        was written, take the ordinary path."""
        if command.kind not in DECIDED_AHEAD:
            return None
        async with self.errors():
            decision = await self.engine.joined_ahead_beside(RUNS, _parts, PAIR_JOIN, run_id, command, pair, _assembled,
                                                             insertion)
        if decision is None:
            return None
        raise_if_conflict(RUNS_BINDING, decision)
        return Sent(decision, after_commit(command.kind, decision.reply) if isinstance(decision, Applied) else ())

    def last_pair(self, run_id: str) -> RunPair | None:
        """The Run and its current delivery as this engine last saw them (None: not both
        seen): the pair a command decided ahead is decided from."""
        known, run, _ = self.engine.last_seen(RUNS_BINDING, run_id)
        if not known or run is None:
            return None
        known, delivery, _ = self.engine.last_seen(DELIVERIES_BINDING, key_of(run_id, run.enqueue_seq))
        return RunPair(run, (delivery,)) if known and delivery is not None else None

    async def send_in(self, tx: Transaction, run_id: str, command: RunCommand, inputs: Inputs = NO_INPUTS) -> Sent:
        """Inside ``tx``: read what the declaration names (in its order), complete the
        command, decide, persist with compare-and-set, run the in-transaction follow-ups."""
        return await self._send_in(tx, run_id, command, inputs, [])

    async def _send_in(
        self, tx: Transaction, run_id: str, command: RunCommand, inputs: Inputs, read: list[_Aggregate],
    ) -> Sent:
        """:meth:`send_in`, leaving what it read in ``read`` (the pair it met)."""
        aggregate = _Aggregate(run_id, command, inputs)
        read.append(aggregate)
        for evidence in READS[command.kind]:
            value = await READERS[evidence](self, tx, aggregate)
            field = FILLS[evidence]
            if field is not None and value is not _NOTHING:
                aggregate.fills[field] = value
        decision = await self._decide(tx, aggregate)
        if decision is None or (isinstance(decision, Refused) and aggregate.guards):
            # A count moved between the pair's snapshot and its lock (nothing written), or
            # a refusal was decided on counts no write verified (they may predate a job
            # that closed meanwhile): counted again after the lock, decided again.
            await self._count_again(tx, aggregate)
            decision = await self._decide(tx, aggregate)
            if decision is None:
                raise persistence_failed("invariant_broken")  # unguarded: it cannot be refused
        if isinstance(decision, Refused):
            refused = on_refusal(command.kind, RunRefusal(decision.reason.value))
            if not refused:
                raise_if_conflict(RUNS_BINDING, decision)
            for step in refused:
                await FOLLOW_UP_STEPS[step](self, tx, aggregate, decision)
            return Sent(decision, ())  # a refusal's error, if any, is raised after commit (send)
        if not isinstance(decision, Applied):
            return Sent(decision, ())
        for step in in_transaction(command.kind, decision.reply):
            if step not in aggregate.written:
                await FOLLOW_UP_STEPS[step](self, tx, aggregate, decision)
        return Sent(decision, after_commit(command.kind, decision.reply))

    async def _decide(self, tx: Transaction, aggregate: _Aggregate) -> Decision | None:
        """Complete the command, decide, and write the pair with the follow-ups written
        with it (deletes by the Run's key), verifying the counts read with the pair's
        lock: None when one moved (nothing written)."""
        command = aggregate.command
        complete = dataclasses.replace(command, **aggregate.fills) if aggregate.fills else command
        with_pair: list[FollowUp] = []

        def deletes(decision: Decision) -> list[tuple[Any, list[str]]]:
            with_pair[:] = [step for step in in_transaction(command.kind, decision.reply)  # type: ignore[union-attr]
                            if step in WRITTEN_WITH_PAIR]
            return [(DELETED_WITH_PAIR[step], [_run_of(decision)]) for step in with_pair]

        decision = await self.engine.decide_composite(tx, RUNS, _parts, aggregate.pair, complete, deletes=deletes,
                                                      guards=aggregate.guards)
        if decision is not None:
            aggregate.written = set(with_pair) if isinstance(decision, Applied) else set()
        return decision

    async def _count_again(self, tx: Transaction, aggregate: _Aggregate) -> None:
        """The counts read with the pair, read again in a statement of their own (after the
        Run's lock: current), and the fields they fill; no guard left to verify."""
        aggregate.guards = []
        for evidence in list(aggregate.counted):
            aggregate.counted[evidence] = tuple(await tx.count_each(_counts(evidence, aggregate.run_id)))
            value = await READERS[evidence](self, tx, aggregate)
            field = FILLS[evidence]
            if field is not None and value is not _NOTHING:
                aggregate.fills[field] = value

    async def applied(self, run_id: str, command: RunCommand, inputs: Inputs = NO_INPUTS) -> bool:
        """:meth:`send`: whether the kernel's decision applied (and was persisted)."""
        return (await self.send(run_id, command, inputs)).applied

    async def settle(self, run_id: str, outcome: RecordedOutcome, *, record: bool = False) -> bool:
        """Settle the Run's hop with an outcome in its stored form (a DONE hop's result as
        canonical JSON text, a FAILED hop's error): the worker's settle of its finished
        hop, and recovery's ``settle_recorded`` action. ``RunLedger.settle`` is the
        public settle; this is the one it and they share.

        ``record`` (the worker's): when the kernel refuses because containment is
        unproven, the outcome is recorded in the Run's checkpoint row in the same
        transaction (the declared ``record_outcome``), then ``RUN_CONTAINMENT_UNPROVEN``
        is raised; recovery settles the Run with that outcome once contained. One
        transaction either way: the Run settled (checkpoint deleted, consents swept),
        or its outcome recorded, or (the hop no longer holds the Run) nothing written
        and False."""
        if not isinstance(outcome, RecordedOutcome):
            raise refuse("outcome", "recorded_outcome_required")
        status, error = outcome.status, outcome.error
        if status not in (RunStatus.DONE, RunStatus.FAILED):
            raise ConfigValidationError("invalid_status", fields=("status",), problems=("done_or_failed_required",))
        if status is RunStatus.FAILED:
            error = check_text(error, "error", MAX_ERROR_CHARS)
        elif error is not None:
            raise ConfigValidationError("invalid_error", fields=("error",), problems=("done_has_no_error",))
        if outcome.result_json is not None and (type(outcome.result_json) is not str
                                                or len(outcome.result_json.encode()) > MAX_RUN_DOCUMENT_BYTES):
            raise refuse("result_json", "document_too_large")
        command = Settle(enqueue_seq=check_seq(outcome.enqueue_seq), status=status, error=error,
                         containment=UNREAD_CONTAINMENT, result_json=outcome.result_json)
        inputs = Inputs(outcome=RecordedOutcome(command.enqueue_seq, status, outcome.result_json, error)) \
            if record else NO_INPUTS
        return await self.applied(check_run_id(run_id), command, inputs)

    # --- reading under the Run's lock ----------------------------------------------------

    @staticmethod
    async def locked_pair(tx: Transaction, run_id: str) -> RunPair | None:
        """The Run and its current delivery, locked in that order (None: no such Run): one
        statement when it finds the delivery the Run's sequence names by its columns.
        Otherwise (rows another writer left out of shape, or, on PostgreSQL, a Run lock
        that waited behind a hop rotation: the new delivery is then invisible to the
        statement's snapshot) the delivery is locked by its key in a second statement.
        The clock stays the first statement's, read after the Run's lock: every path that
        locks a delivery holds its Run's lock first, so that second lock cannot wait."""
        joined: list[tuple[RunRow, DeliveryRow | None]] = await tx.locked_joined(
            RUNS_BINDING, [run_id], DELIVERIES_BINDING, CURRENT_DELIVERY)
        if not joined:
            return None
        found = current_pair(run_id, joined)
        if found is not None:
            return RunPair(found[0], (found[1],))
        run = joined[0][0]
        deliveries = await tx.locked(DELIVERIES_BINDING, finders.deliveries_by_keys,
                                     {"keys": [key_of(run_id, run.enqueue_seq)]})
        if not deliveries:
            raise persistence_failed("delivery_missing")
        return RunPair(run, (deliveries[0],))

    @staticmethod
    async def locked_pair_counting(tx: Transaction, run_id: str, counts: list[Count]) -> tuple[RunPair | None, list[int]]:
        """:meth:`locked_pair` with ``counts`` read in the same statement (see
        :meth:`~tenure.adapters.core.store.Transaction.locked_joined_counting`: on
        PostgreSQL they may predate the lock, and the pair's write verifies them)."""
        joined: list[tuple[RunRow, DeliveryRow | None]]
        joined, values = await tx.locked_joined_counting(RUNS_BINDING, [run_id], DELIVERIES_BINDING, CURRENT_DELIVERY,
                                                         counts)
        if not joined:
            return None, values
        found = current_pair(run_id, joined)
        if found is not None:
            return RunPair(found[0], (found[1],)), values
        return await RunEngine.locked_pair(tx, run_id), values

    @staticmethod
    async def read_pair(tx: Transaction, run_id: str) -> RunPair | None:
        """The Run and its current delivery, read without a lock (None: no such Run): one
        statement (one snapshot) when the rows are in shape, as :meth:`locked_pair`."""
        joined: list[tuple[RunRow, DeliveryRow | None]] = await tx.read_joined(
            RUNS_BINDING, [run_id], DELIVERIES_BINDING, CURRENT_DELIVERY)
        if not joined:
            return None
        found = current_pair(run_id, joined)
        if found is not None:
            return RunPair(found[0], (found[1],))
        runs = await tx.read(RUNS_BINDING, [run_id])
        if not runs:
            return None
        deliveries = await tx.read(DELIVERIES_BINDING, [key_of(run_id, runs[0].enqueue_seq)])
        if not deliveries:
            raise persistence_failed("delivery_missing")
        return RunPair(runs[0], (deliveries[0],))

    @staticmethod
    async def containment(tx: Transaction, run_id: str) -> Containment:
        """How many delegated jobs and service attempts of the Run are still open."""
        jobs, attempts = await tx.count_each([
            (AGENT_JOBS_BINDING, finders.open_jobs_of_run, {"run_id": run_id}, None),
            (ATTEMPTS_BINDING, finders.open_attempts_of_run, {"run_id": run_id}, None),
        ])
        return Containment(open_jobs=jobs, open_attempts=attempts)

    @staticmethod
    async def owner(tx: Transaction, kind: WaitKind | None, owner_id: str | None) -> OwnerEvidence | None:
        """The owner row of ``kind`` and ``owner_id`` as evidence (None: none such)."""
        if kind is None or owner_id is None:
            return None
        reader = _OWNER_READERS.get(kind)
        return None if reader is None else await reader(tx, owner_id)

    async def sweep_consents(self, tx: Transaction, run_id: str, decided_by: str) -> None:
        """Cancel the Run's pending consents (in the Run's own transaction)."""
        await self._sweep(tx, CONSENTS_BINDING, finders.pending_consents_of_run, run_id,
                          CancelPending(decided_by=decided_by))

    async def sweep_receives(self, tx: Transaction, run_id: str, decided_by: str) -> None:
        """Cancel the Run's pending receives (in the Run's own transaction)."""
        await self._sweep(tx, MESSAGES_BINDING, finders.pending_receives_of_run, run_id,
                          CancelPendingReceive(decided_by=decided_by))

    async def _sweep(self, tx: Transaction, binding: Binding, finder: Finder, run_id: str, command: object) -> None:
        """Send ``command`` to each row of the Run that ``finder`` locks; persist what applied."""
        pending = await tx.locked(binding, finder, {"run_id": run_id})
        if not pending:
            return
        now = await tx.now_us()
        changes = []
        for row in pending:
            decision = decide(binding.machine, row, command, now)
            if isinstance(decision, Applied):
                changes.append((row, decision.new_record))
        await self.engine.persist(tx, binding, changes)


# --- owner rows as evidence, by kind ---------------------------------------------------------


async def _consent_owner(tx: Transaction, owner_id: str) -> OwnerEvidence | None:
    rows: list[ConsentRow] = await tx.read(CONSENTS_BINDING, [owner_id])
    return consent_evidence(rows[0]) if rows else None


async def _job_owner(tx: Transaction, owner_id: str) -> OwnerEvidence | None:
    rows: list[AgentJobRow] = await tx.read(AGENT_JOBS_BINDING, [owner_id])
    return job_evidence(rows[0]) if rows else None


async def _attempt_owner(tx: Transaction, owner_id: str) -> OwnerEvidence | None:
    rows: list[AttemptRow] = await tx.find(ATTEMPTS_BINDING, finders.attempts_by_keys, {"keys": [owner_id]})
    return attempt_evidence(rows[0]) if rows else None


async def _message_owner(tx: Transaction, owner_id: str) -> OwnerEvidence | None:
    rows: list[MessageRow] = await tx.read(MESSAGES_BINDING, [owner_id])
    return message_evidence(rows[0]) if rows else None


_OWNER_READERS: Mapping[WaitKind, Callable[[Transaction, str], Awaitable[OwnerEvidence | None]]] = {
    WaitKind.CONSENT: _consent_owner,
    WaitKind.DELEGATE: _job_owner,
    WaitKind.SERVICE: _attempt_owner,
    WaitKind.MESSAGE: _message_owner,
}
"""A timer and a hardware wait have no owner row: their evidence is None."""


# --- the readers the declaration names ---------------------------------------------------------

_NOTHING = object()
"""A reading with nothing to fill (a lock, the pair itself, a reading that did not apply)."""


async def _admission_locks(engine: RunEngine, tx: Transaction, aggregate: _Aggregate) -> object:
    # Named locks first, always in this order: same-key admissions and one session's
    # fenced admissions then decide one after another.
    run = aggregate.command.run
    if run.idempotency_key is not None:
        await tx.lock_name(f"tenure:run:{aggregate.run_id}")
    if aggregate.inputs.session_fence:
        await tx.lock_name(f"tenure:run-session:{run.session_id}")
    return _NOTHING


async def _pair(engine: RunEngine, tx: Transaction, aggregate: _Aggregate) -> object:
    counted = [evidence for evidence in READS[aggregate.command.kind] if evidence in COUNTED_WITH_PAIR]
    if not counted:
        aggregate.pair = await engine.locked_pair(tx, aggregate.run_id)
        return _NOTHING
    queries = [query for evidence in counted for query in _counts(evidence, aggregate.run_id)]
    aggregate.pair, values = await engine.locked_pair_counting(tx, aggregate.run_id, queries)
    position = 0
    for evidence in counted:
        size = len(_counts(evidence, aggregate.run_id))
        aggregate.counted[evidence] = tuple(values[position:position + size])
        position += size
    if not tx.counts_current:
        aggregate.guards = list(zip(queries, values, strict=True))
    return _NOTHING


async def _key_holder(engine: RunEngine, tx: Transaction, aggregate: _Aggregate) -> object:
    """The stored Run an admission under this key meets when none holds its derived ID: a
    Run admitted before ``runs_v4`` (source-scoped ID), or one another writer stored. Of
    several (the same key once admitted from several sources), the one from this source,
    else the oldest: the kernel then replays it or refuses the reuse."""
    run = aggregate.command.run
    if aggregate.pair is not None or run.idempotency_key is None:
        return _NOTHING
    holders = await tx.find(RUNS_BINDING, finders.runs_by_admission_key, {"key": run.idempotency_key}, 16)
    if holders:
        chosen = next((holder for holder in holders if holder.source == run.source), holders[0])
        aggregate.pair = await engine.locked_pair(tx, chosen.run_id)
    return _NOTHING


async def _session(engine: RunEngine, tx: Transaction, aggregate: _Aggregate) -> object:
    if not aggregate.inputs.session_fence or aggregate.pair is not None:
        return False
    session = aggregate.command.run.session_id
    return bool(await tx.find(RUNS_BINDING, finders.session_open, {"session_id": session}, 1))


async def _named_owner(engine: RunEngine, tx: Transaction, aggregate: _Aggregate) -> object:
    if aggregate.pair is None:
        return _NOTHING
    return await engine.owner(tx, aggregate.command.wait, aggregate.command.owner_id)


async def _run_owner(engine: RunEngine, tx: Transaction, aggregate: _Aggregate) -> object:
    if aggregate.pair is None:
        return _NOTHING
    return await engine.owner(tx, aggregate.pair.run.owner_kind, aggregate.pair.run.owner_id)


async def _containment(engine: RunEngine, tx: Transaction, aggregate: _Aggregate) -> object:
    if aggregate.pair is None:
        return _NOTHING
    counted = aggregate.counted.get(Evidence.CONTAINMENT)
    if counted is None:
        return await engine.containment(tx, aggregate.pair.run.run_id)
    return FROM_COUNTS[Evidence.CONTAINMENT](counted)


async def _pending_consents(engine: RunEngine, tx: Transaction, aggregate: _Aggregate) -> object:
    # The count is kept beside the aggregate (read with the pair): the sweep reads it.
    return _NOTHING


async def _pending_receives(engine: RunEngine, tx: Transaction, aggregate: _Aggregate) -> object:
    # As the pending consents: counted with the pair, read by the sweep.
    return _NOTHING


async def _clock(engine: RunEngine, tx: Transaction, aggregate: _Aggregate) -> object:
    delay = aggregate.inputs.delay_us
    return _NOTHING if delay is None else await tx.now_us() + delay


READERS: dict[Evidence, _Reader] = {
    Evidence.ADMISSION_LOCKS: _admission_locks,
    Evidence.PAIR: _pair,
    Evidence.KEY_HOLDER: _key_holder,
    Evidence.SESSION: _session,
    Evidence.NAMED_OWNER: _named_owner,
    Evidence.RUN_OWNER: _run_owner,
    Evidence.CONTAINMENT: _containment,
    Evidence.PENDING_CONSENTS: _pending_consents,
    Evidence.PENDING_RECEIVES: _pending_receives,
    Evidence.CLOCK: _clock,
}
"""How each piece of evidence the declaration names is read. The pair's readings after it
read nothing for a Run that does not exist (the kernel refuses ``not_found`` on its own);
the key holder and the session only matter to an admission that met no Run."""


# --- the follow-ups inside the transaction -------------------------------------------------------


def _run_of(decision: Decision) -> str:
    pair: RunPair = decision.new_record  # type: ignore[union-attr,assignment]
    return pair.run.run_id


def _sweep_step(follow_up: FollowUp, sweep: Callable[[RunEngine, Transaction, str, str], Awaitable[None]]) -> _Step:
    # The Run's terminal truth cancels its waiting receives as it does its pending
    # consents, with the same ``decided_by``.
    async def step(engine: RunEngine, tx: Transaction, aggregate: _Aggregate, decision: Decision) -> None:
        decided_by = consent_sweep(decision.reply)  # type: ignore[union-attr]
        counted = aggregate.counted.get(IDLE_WHEN_NONE_COUNTED[follow_up])
        if counted is not None and not any(counted):
            return  # none pending, counted with the pair (and verified by its write)
        if decided_by is not None:
            await sweep(engine, tx, _run_of(decision), decided_by)
    return step


async def _delete_checkpoint(engine: RunEngine, tx: Transaction, aggregate: _Aggregate, decision: Decision) -> None:
    await delete_in(tx, _run_of(decision))  # terminal now: the snapshot's debt is paid


async def _clear_outcome(engine: RunEngine, tx: Transaction, aggregate: _Aggregate, decision: Decision) -> None:
    await clear_outcome_in(tx, _run_of(decision))  # the lost hop's outcome belongs to it


async def _bind_checkpoint(engine: RunEngine, tx: Transaction, aggregate: _Aggregate, decision: Decision) -> None:
    row = aggregate.inputs.checkpoint
    if row is not None:
        run_id = _run_of(decision)
        stored = await stored_in(tx, run_id)
        await put_in(tx, dataclasses.replace(row, run_id=run_id, saved_at_us=await tx.now_us()), stored)


async def _record_outcome(engine: RunEngine, tx: Transaction, aggregate: _Aggregate, decision: Decision) -> None:
    # A refusal for unproven containment: the kernel refused a hop that does not hold the
    # Run before it looked at containment, so this hop holds it (the record's fence).
    outcome = aggregate.inputs.outcome
    if outcome is not None:
        await record_outcome_in(tx, aggregate.run_id, outcome, await tx.now_us())


DELETED_WITH_PAIR: dict[FollowUp, Any] = {FollowUp.DELETE_CHECKPOINT: CHECKPOINTS_BINDING}
"""The table each follow-up written with the pair (:data:`WRITTEN_WITH_PAIR`) deletes the
Run's row of, by its key (the checkpoint: every writer of it holds the Run's lock)."""


def _counts(evidence: Evidence, run_id: str) -> list[Count]:
    """The counts a piece of evidence read with the pair is made of."""
    return [(binding, finder, {"run_id": run_id}, None) for binding, finder in COUNTS[evidence]]


COUNTS: dict[Evidence, tuple[tuple[Any, Any], ...]] = {
    Evidence.CONTAINMENT: ((AGENT_JOBS_BINDING, finders.open_jobs_of_run), (ATTEMPTS_BINDING, finders.open_attempts_of_run)),
    Evidence.PENDING_CONSENTS: ((CONSENTS_BINDING, dataclasses.replace(finders.pending_consents_of_run, lock="none")),),
    Evidence.PENDING_RECEIVES: ((MESSAGES_BINDING, dataclasses.replace(finders.pending_receives_of_run, lock="none")),),
}
"""The finders each counted evidence (:data:`COUNTED_WITH_PAIR`) counts, by the Run's ID
(a count takes no lock: the sweep locks the pending consents it cancels)."""


FROM_COUNTS: dict[Evidence, Callable[[tuple[int, ...]], Any]] = {
    Evidence.CONTAINMENT: lambda counted: Containment(open_jobs=counted[0], open_attempts=counted[1]),
}
"""The value a counted evidence fills its command field with (:data:`FILLS`), from its
counts (:data:`COUNTS`, in that order)."""


def _counted_ahead(run_id: str, command: RunCommand) -> CountedAhead:
    """What deciding ``command`` ahead on its counted evidence needs, read off the
    declaration (:data:`~tenure.kernel.runs.aggregate.COUNTED_AHEAD`): the counts of each
    evidence in the order the command reads them, the values it starts from, the command
    completed with values, the deletes written with the pair and whether a decision sets
    off anything the statement does not do."""
    kind = command.kind
    evidences = [evidence for evidence in READS[kind] if evidence in COUNTED_WITH_PAIR]
    start = COUNTED_AHEAD[kind]
    sizes = [len(COUNTS[evidence]) for evidence in evidences]

    def by_evidence(values: Sequence[int]) -> dict[Evidence, tuple[int, ...]]:
        ends = [sum(sizes[:index + 1]) for index in range(len(sizes))]
        return {evidence: tuple(values[end - size:end]) for evidence, size, end in zip(evidences, sizes, ends, strict=True)}

    def complete(plain: Any, values: Sequence[int]) -> Any:
        counted = by_evidence(values)
        fills = {FILLS[evidence]: FROM_COUNTS[evidence](counted[evidence])
                 for evidence in evidences if FILLS[evidence] is not None}
        return dataclasses.replace(plain, **fills)  # type: ignore[arg-type]

    def deletes(decision: Decision) -> list[tuple[Any, list[str]]]:
        return [(DELETED_WITH_PAIR[step], [run_id]) for step in in_transaction(kind, decision.reply)  # type: ignore[union-attr]
                if step in WRITTEN_WITH_PAIR]

    def whole(decision: Decision, values: Sequence[int]) -> bool:
        if isinstance(decision, Refused):
            return not left_for_transaction(kind, None, {}, refused=RunRefusal(decision.reason.value))
        return not left_for_transaction(kind, decision.reply, by_evidence(values))

    counts = [count for evidence in evidences for count in _counts(evidence, run_id)]
    return CountedAhead(counts, tuple(value for evidence in evidences for value in start[evidence]), complete, deletes,
                        whole)


FOLLOW_UP_STEPS: dict[FollowUp, _Step] = {
    FollowUp.SWEEP_CONSENTS: _sweep_step(FollowUp.SWEEP_CONSENTS, RunEngine.sweep_consents),
    FollowUp.SWEEP_RECEIVES: _sweep_step(FollowUp.SWEEP_RECEIVES, RunEngine.sweep_receives),
    FollowUp.RECORD_OUTCOME: _record_outcome,
    FollowUp.DELETE_CHECKPOINT: _delete_checkpoint,
    FollowUp.CLEAR_OUTCOME: _clear_outcome,
    FollowUp.BIND_CHECKPOINT: _bind_checkpoint,
}
"""How each in-transaction follow-up is done (the after-commit ones are the caller's)."""
