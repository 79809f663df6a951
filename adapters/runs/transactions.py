"""The Run machine's transactions: what the Run ledger and its sibling facades share.

``RunLedger`` is the Run API; its consents, delegated jobs, checkpoints, steps and node
leases are facades of their own, and recovery and the Run worker drive Runs through
the same kernel. They all need the same few things inside one transaction: the error
boundary that makes a persistence failure ``RUN_PERSISTENCE_FAILED``, the Run and its
current delivery locked in the ledger's lock order, the owner rows and containment
counts the kernel takes as evidence, and a Run command decided and persisted with the
engine's compare-and-set. ``RunTransactions`` is that toolkit, one per ledger
(``RunLedger.transactions``); everything here is named openly because those modules use
it, and none of it is meant for an application (use the facades).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tenure.kernel.agent_jobs.record import AgentJobRow, job_complete
from tenure.kernel.attempts.record import AttemptRow
from tenure.kernel.consents.commands import CancelPending
from tenure.kernel.consents.record import ConsentRow
from tenure.kernel.core import Applied, Decision, decide
from tenure.kernel.runs import finders
from tenure.kernel.runs.commands import (
    Containment,
    FinishCancel,
    OwnerEvidence,
    RetryLost,
    Rotated,
    RunCommand,
    Settle,
    Settled,
)
from tenure.kernel.runs.machine import RUNS, consent_sweep
from tenure.kernel.runs.record import DeliveryRow, RunPair, RunRow, key_of
from tenure.model import (
    BrokerJobState,
    ConfigValidationError,
    ErrorCode,
    RunStatus,
    WaitKind,
)
from tenure.model.runs import (
    MAX_ERROR_CHARS,
    check_run_id,
    check_seq,
    check_text,
)

from ..agent_jobs.table import AGENT_JOBS_BINDING
from ..attempts.table import ATTEMPTS_BINDING
from ..consents.table import CONSENTS_BINDING
from ..core.engine import Engine, raise_if_conflict
from ..core.facade import persistence_as
from ..core.failures import persistence_failed
from ..core.store import Transaction
from .checkpoints import clear_outcome_in, delete_in
from .table import CURRENT_DELIVERY, DELIVERIES_BINDING, RUNS_BINDING

__all__ = ["RunTransactions", "consent_evidence", "job_evidence", "attempt_evidence"]

T = TypeVar("T")


def consent_evidence(row: ConsentRow) -> OwnerEvidence:
    return OwnerEvidence(WaitKind.CONSENT, row.consent_id, row.run_id, row.status.value,
                         row.decided_by is not None and row.decided_at_us is not None)


def job_evidence(row: AgentJobRow) -> OwnerEvidence:
    return OwnerEvidence(WaitKind.DELEGATE, row.job_id, row.run_id, row.status.value, job_complete(row))


def attempt_evidence(row: AttemptRow) -> OwnerEvidence:
    return OwnerEvidence(WaitKind.SERVICE, row.attempt_id, row.run_id, row.state.value, True)


def _parts(pair: RunPair) -> list[tuple[Any, Any]]:
    """The rows of a pair, in the lock order (the Run, then its deliveries)."""
    return [(RUNS_BINDING, pair.run), *((DELIVERIES_BINDING, delivery) for delivery in pair.deliveries)]


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


class RunTransactions:
    """The Run machine's transaction toolkit on one engine (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # --- the one boundary --------------------------------------------------------------

    def errors(self) -> contextlib.AbstractAsyncContextManager[None]:
        """A persistence failure of the shared stores becomes the Run ledger's code."""
        return persistence_as(ErrorCode.RUN_PERSISTENCE_FAILED)

    async def run(self, body: Callable[[Transaction], Awaitable[T]], *, write: bool = True) -> T:
        """``body`` in one transaction, behind :meth:`errors`."""
        async with self.errors():
            return await self.engine.store.run(body, write=write)

    # --- reading under the Run's lock ----------------------------------------------------

    @staticmethod
    async def locked_pair(tx: Transaction, run_id: str) -> RunPair | None:
        """The Run and its current delivery, locked in that order (None: no such Run): one
        statement when it finds the delivery the Run's sequence names by its columns.
        Otherwise (rows another writer left out of shape, or, on PostgreSQL, a Run lock
        that waited behind a hop rotation: the new delivery is then invisible to the
        statement's snapshot) the delivery is locked by its key in a second statement.
        The clock stays the first statement's, read after the Run's lock, as the
        two-statement lock always had it: every path that locks a delivery holds its
        Run's lock first, so that second lock cannot wait."""
        joined: list[tuple[RunRow, DeliveryRow | None]] = await tx.locked_joined(
            RUNS_BINDING, [run_id], DELIVERIES_BINDING, CURRENT_DELIVERY)
        if not joined:
            return None
        found = current_pair(run_id, joined)
        if found is not None:
            return RunPair(found[0], (found[1],))
        # The current delivery is the one its key names. The Run is locked, and every
        # path that locks a delivery locks its Run first.
        run = joined[0][0]
        deliveries = await tx.locked(DELIVERIES_BINDING, finders.deliveries_by_keys,
                                     {"keys": [key_of(run_id, run.enqueue_seq)]})
        if not deliveries:
            raise persistence_failed("delivery_missing")
        return RunPair(run, (deliveries[0],))

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
        if kind is WaitKind.CONSENT:
            consents: list[ConsentRow] = await tx.read(CONSENTS_BINDING, [owner_id])
            return consent_evidence(consents[0]) if consents else None
        if kind is WaitKind.DELEGATE:
            jobs: list[AgentJobRow] = await tx.read(AGENT_JOBS_BINDING, [owner_id])
            return job_evidence(jobs[0]) if jobs else None
        if kind is WaitKind.SERVICE:
            attempts: list[AttemptRow] = await tx.find(ATTEMPTS_BINDING, finders.attempts_by_keys, {"keys": [owner_id]})
            return attempt_evidence(attempts[0]) if attempts else None
        return None

    # --- sending commands ---------------------------------------------------------------

    async def sweep_consents(self, tx: Transaction, run_id: str, decided_by: str) -> None:
        """Cancel the Run's pending consents (in the Run's own transaction)."""
        pending = await tx.locked(CONSENTS_BINDING, finders.pending_consents_of_run, {"run_id": run_id})
        if not pending:
            return
        now = await tx.now_us()
        changes = []
        for consent in pending:
            decision = decide(CONSENTS_BINDING.machine, consent, CancelPending(decided_by=decided_by), now)
            if isinstance(decision, Applied):
                changes.append((consent, decision.new_record))
        await self.engine.persist(tx, CONSENTS_BINDING, changes)

    async def run_command(self, tx: Transaction, pair: RunPair | None, command: RunCommand) -> Decision:
        """Decide ``command`` on the locked pair and persist it; when the kernel's
        :func:`~tenure.kernel.runs.machine.consent_sweep` names a sweep for the decision,
        the Run's pending consents are cancelled in the same transaction."""
        decision = await self.engine.decide_composite(tx, RUNS, _parts, pair, command)
        raise_if_conflict(RUNS_BINDING, decision)
        swept_by = consent_sweep(decision.reply) if isinstance(decision, Applied) else None
        if swept_by is not None and pair is not None:
            await self.sweep_consents(tx, pair.run.run_id, swept_by)
        return decision

    async def send(self, run_id: str, command: RunCommand) -> Decision:
        """Send ``command`` to the Run in a transaction of its own: the Run and its current
        delivery locked, the clock read, the kernel's decision persisted
        (:meth:`run_command`); returns that decision. (``decide`` is the kernel's word:
        here the kernel decides and this writes what it decided.) Part of the adapters'
        test seam (``docs/testing.md``): the Run replay sends a trace's commands here."""
        async def body(tx: Transaction) -> Decision:
            return await self.run_command(tx, await self.locked_pair(tx, run_id), command)

        return await self.run(body)

    async def applied(self, run_id: object, command: RunCommand) -> bool:
        """:meth:`send` ``command`` to the Run (after checking its ID): whether the kernel's
        decision applied (and was persisted)."""
        return isinstance(await self.send(check_run_id(run_id), command), Applied)

    async def settle(self, run_id: str, enqueue_seq: int, status: RunStatus, *, error: str | None,
                     result_json: str | None) -> bool:
        """Settle the hop DONE (with the canonical text of its result) or FAILED (with its
        error), deleting the Run's checkpoint in the same transaction."""
        if status not in (RunStatus.DONE, RunStatus.FAILED):
            raise ConfigValidationError("invalid_status", fields=("status",), problems=("done_or_failed_required",))
        if status is RunStatus.FAILED:
            error = check_text(error, "error", MAX_ERROR_CHARS)
        elif error is not None:
            raise ConfigValidationError("invalid_error", fields=("error",), problems=("done_has_no_error",))
        key = check_run_id(run_id)
        seq = check_seq(enqueue_seq)

        async def body(tx: Transaction) -> Decision:
            pair = await self.locked_pair(tx, key)
            containment = Containment(0, 0) if pair is None else await self.containment(tx, key)
            command = Settle(enqueue_seq=seq, status=status, error=error, containment=containment,
                             result_json=result_json)
            decision = await self.run_command(tx, pair, command)
            if isinstance(decision, Applied):
                await delete_in(tx, key)  # terminal now: the snapshot's debt is paid
            return decision

        return isinstance(await self.run(body), Applied)

    async def finish_cancel_on(self, run_id: str, enqueue_seq: int, hop: BrokerJobState | None) -> bool:
        """The transaction that finishes a cancellation, on the hop state the caller's
        fence observed (None: not observed)."""
        async def body(tx: Transaction) -> Decision:
            pair = await self.locked_pair(tx, run_id)
            containment = Containment(0, 0) if pair is None else await self.containment(tx, run_id)
            return await self.run_command(tx, pair, FinishCancel(enqueue_seq=enqueue_seq, hop=hop,
                                                                 containment=containment))

        decision = await self.run(body)
        return isinstance(decision, Applied) and isinstance(decision.reply, Settled)

    async def retry_lost_on(self, run_id: str, enqueue_seq: int, hop: BrokerJobState | None) -> int | None:
        """Recovery's retry of a lost hop (the Run machine's ``retry_lost``), on the hop
        state its fence observed: the new sequence, or None when refused."""
        async def body(tx: Transaction) -> Decision:
            pair = await self.locked_pair(tx, run_id)
            containment = Containment(0, 0) if pair is None else await self.containment(tx, run_id)
            decision = await self.run_command(tx, pair, RetryLost(enqueue_seq=enqueue_seq, hop=hop,
                                                                  containment=containment))
            if isinstance(decision, Applied):
                # The lost hop's recorded outcome, if any, belongs to it: the retry starts clean.
                await clear_outcome_in(tx, run_id)
            return decision

        decision = await self.run(body)
        if isinstance(decision, Applied) and isinstance(decision.reply, Rotated):
            return decision.reply.enqueue_seq
        return None
