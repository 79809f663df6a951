"""The queue engine: lock, read the database clock, ask the kernel, persist its decision.

Every operation is one transaction on one store. The engine finds the rows the command
meets (locking them), reads the database time after the locks, calls
:func:`tenure.kernel.decide`, and writes applied decisions with compare-and-set
statements whose stored rows must equal the decided records exactly (a pair assertion
with the kernel). A claim whose stored owner, token or generation read back differently
rolls back whole. The engine never decides anything itself: the only branches here are
on the kernel's decisions and on which row a command meets.

Batched operations (``claim_batch_owned``, ``complete_many_owned``,
``heartbeat_many_owned``) run the same kernel decision for every item, in order, in one
transaction: their only difference from single calls is fewer round trips.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from tenure.kernel import (
    REFUSAL_OUTCOMES,
    AcknowledgeCancelOwned,
    Applied,
    CancelAdmin,
    ClaimFence,
    ClaimLegacy,
    ClaimOwned,
    Command,
    CompleteLegacy,
    CompleteOwned,
    Decision,
    DeleteLegacy,
    ExpireLease,
    FailLegacy,
    FailOwned,
    HeartbeatLegacy,
    HeartbeatOwned,
    JobRecord,
    Outcome,
    PurgeFinished,
    ReadStateOwned,
    RecoverOwned,
    Refused,
    ReleaseKeyForLegacy,
    ReleaseKeyForOwned,
    RequestCancel,
    SetPidLegacy,
    SetPidOwned,
    StreamingStateReply,
    SubmitLegacy,
    Submitted,
    SubmitOwned,
    claim_identity_problem,
    decide,
    record_violations,
)
from tenure.model import (
    DEFAULT_MAX_ATTEMPTS,
    ErrorCode,
    FrozenEnvelope,
    JobStatus,
    QueueClaimFence,
    QueueKind,
    SubmissionSnapshot,
    TenureError,
    WorkerConfig,
)

from .queue_table import stored_payload
from .store import Store, Transaction, persistence_failed

Presented = TypeVar("Presented")

__all__ = ["QueueEngine", "SWEEP_LIMIT", "PURGE_LIMIT", "SUBMIT_ATTEMPTS"]

SWEEP_LIMIT = 64
"""Expired claims settled per claim transaction (earliest lease first)."""

PURGE_LIMIT = 1000
"""Rows removed per retention transaction."""

SUBMIT_ATTEMPTS = 3
"""Transactions a submission may take when concurrent submissions race on a unique key."""

_CONFLICT_CODES = {
    Outcome.SUBMISSION_CONFLICT: ErrorCode.QUEUE_SUBMISSION_CONFLICT,
    Outcome.CLAIM_CONFLICT: ErrorCode.QUEUE_CLAIM_CONFLICT,
}


def _require(condition: bool) -> None:
    """An always-on pair check: the kernel's answer has the shape the table promises."""
    if not condition:
        raise persistence_failed("invariant_broken")


def _submitted(decision: Decision) -> Submitted:
    reply = decision.reply if isinstance(decision, Applied) else None
    if not isinstance(reply, Submitted):
        raise persistence_failed("invariant_broken")
    return reply


def _raise_if_conflict(decision: Decision) -> None:
    if isinstance(decision, Refused):
        outcome = REFUSAL_OUTCOMES[decision.reason]
        if outcome is not Outcome.NEGATIVE:
            raise TenureError(_CONFLICT_CODES[outcome], decision.reason.value)


class QueueEngine:
    """Kernel-driven operations on one queue table of one store."""

    def __init__(
        self,
        store: Store,
        queue: QueueKind,
        config: WorkerConfig,
        *,
        new_job_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        # Twelve hex digits, as pycharter makes them (its run history column is 12 wide).
        new_run_id: Callable[[], str] = lambda: uuid.uuid4().hex[:12],
    ) -> None:
        self.store = store
        self.queue = queue
        self.config = config
        self._new_job_id = new_job_id
        self._new_run_id = new_run_id

    # --- persisting decisions -----------------------------------------------------------

    @staticmethod
    def _checked(old: JobRecord | None, decision: Applied) -> JobRecord | None:
        """The decided record, if it keeps the record invariants: every invariant the
        record it replaces kept (a row another client wrote may already break one; the
        kernel never adds a break). Always on: a break raises, never under ``-O`` passes."""
        new = decision.new_record
        if new is not None:
            broken = set(record_violations(new))
            if broken and not broken <= set(record_violations(old) if old is not None else ()):
                raise persistence_failed("invariant_broken")
        return new

    async def _persist(self, tx: Transaction, changes: Sequence[tuple[JobRecord | None, JobRecord | None]]) -> None:
        """Write ``(old, new)`` changes; the stored rows must equal the decided ones."""
        updates = [(old, new) for old, new in changes if old is not None and new is not None and old != new]
        for old, new in changes:
            if new is None and old is not None and not await tx.delete(old):
                raise persistence_failed("row_changed")
            if old is None and new is not None and await tx.insert(new) != new:
                raise persistence_failed("read_back_mismatch")
        stored = await tx.update_many(updates, read_back=False)
        if stored != [new for _, new in updates]:
            raise persistence_failed("read_back_mismatch")

    async def _decide_one(self, tx: Transaction, record: JobRecord | None, command: Command) -> Decision:
        """Decide a command on one met row and persist an applied decision."""
        decision = decide(record, command, await tx.now_us())
        if isinstance(decision, Applied):
            await self._persist(tx, [(record, self._checked(record, decision))])
        return decision

    def _max_attempts(self, authored: int | None) -> int:
        if authored is not None:
            return authored
        if self.config.max_attempts is not None:
            return self.config.max_attempts
        return DEFAULT_MAX_ATTEMPTS[self.queue]

    # --- submission -------------------------------------------------------------------

    async def submit_owned(self, snapshot: SubmissionSnapshot) -> Submitted:
        return await self._retrying(lambda: self._submit_owned_once(snapshot))

    async def submit_legacy(self, request: FrozenEnvelope) -> Submitted:
        return await self._retrying(lambda: self._submit_legacy_once(request))

    @staticmethod
    async def _retrying(attempt: Callable[[], Awaitable[Submitted]]) -> Submitted:
        """Run a submission again when a concurrent transaction won a race on a unique
        key or a deadlock was broken: the retry sees the winner and replays, conflicts or
        proceeds. Any other failure, or the last one, surfaces."""
        for remaining in range(SUBMIT_ATTEMPTS - 1, -1, -1):
            try:
                return await attempt()
            except TenureError as error:
                if remaining == 0 or error.reason not in ("constraint_violated", "deadlock"):
                    raise
        raise AssertionError("unreachable")

    def _ids(self, job_id: str | None, run_id: str | None) -> tuple[str, str | None]:
        chosen_job_id = job_id if job_id is not None else self._new_job_id()
        chosen_run_id = None
        if self.queue is QueueKind.PIPELINE:
            chosen_run_id = run_id if run_id is not None else self._new_run_id()
        return chosen_job_id, chosen_run_id

    @staticmethod
    def _colliding(rows: Sequence[JobRecord], job_id: str, run_id: str | None, key: str | None) -> JobRecord | None:
        """The row (smallest job ID first) sharing the job ID, run ID or idempotency key."""
        for row in rows:  # rows come ordered by job ID
            if row.job_id == job_id or (run_id is not None and row.run_id == run_id) or (
                key is not None and row.idempotency_key == key
            ):
                return row
        return None

    @staticmethod
    def _holder(rows: Sequence[JobRecord], active_key: str | None) -> JobRecord | None:
        if active_key is None:
            return None
        return next((row for row in rows if row.active_key == active_key), None)

    async def _submit_owned_once(self, snapshot: SubmissionSnapshot) -> Submitted:
        authored_job_id, run_id = self._ids(snapshot.job_id, snapshot.run_id)
        async with self.store.transaction(write=True) as tx:
            job_id = await tx.canonical_job_id(self.queue, authored_job_id)
            # Every row sharing an identity with the request, locked at once; the clock is
            # read after the locks (so also after a predecessor's lock wait).
            rows = await tx.locate_submission(
                self.queue, submission_id=snapshot.submission_id, job_id=job_id, run_id=run_id,
                idempotency_key=snapshot.idempotency_key, active_key=snapshot.active_key,
            )
            command = SubmitOwned(
                queue=self.queue,
                submission_id=snapshot.submission_id,
                fingerprint=snapshot.fingerprint,
                job_id=job_id,
                run_id=run_id,
                fires_at_us=snapshot.fires_at_us,
                max_attempts=self._max_attempts(snapshot.max_attempts),
                idempotency_key=snapshot.idempotency_key,
                active_key=snapshot.active_key,
                payload=stored_payload(self.queue, snapshot.field_texts),
            )
            # Replay first: an existing original answers before any key is touched.
            met = next((row for row in rows if row.submission_id == snapshot.submission_id), None)
            if met is None:
                met = self._colliding(rows, job_id, run_id, snapshot.idempotency_key)
            if met is None:
                holder = self._holder(rows, snapshot.active_key)
                if holder is not None:
                    _raise_if_conflict(await self._decide_one(tx, holder, ReleaseKeyForOwned(force=snapshot.force)))
            decision = await self._decide_one(tx, met, command)
            # Raised inside the transaction, so a predecessor released above is restored:
            # a refused submission changes nothing.
            _raise_if_conflict(decision)
        return _submitted(decision)

    async def _submit_legacy_once(self, request: FrozenEnvelope) -> Submitted:
        authored_job_id, run_id = self._ids(request.job_id, request.run_id)
        async with self.store.transaction(write=True) as tx:
            job_id = await tx.canonical_job_id(self.queue, authored_job_id)
            rows = await tx.locate_submission(
                self.queue, submission_id=None, job_id=job_id, run_id=run_id,
                idempotency_key=request.idempotency_key, active_key=request.active_key,
            )
            command = SubmitLegacy(
                queue=self.queue,
                job_id=job_id,
                run_id=run_id,
                fires_at_us=request.fires_at_us,
                max_attempts=self._max_attempts(request.max_attempts),
                idempotency_key=request.idempotency_key,
                active_key=request.active_key,
                payload=stored_payload(self.queue, request.field_texts),
            )
            met = None
            holder = self._holder(rows, request.active_key)
            if holder is not None and request.force:
                released = await self._decide_one(tx, holder, ReleaseKeyForLegacy())
                _raise_if_conflict(released)
                released_record = released.new_record if isinstance(released, Applied) else None
                _require(released_record is not None)
                # The successor meets the predecessor as it is now (released), should it
                # collide with it on its job ID.
                rows = [released_record if row.job_id == holder.job_id else row for row in rows]  # type: ignore[misc]
            elif holder is not None:
                met = holder
            if met is None:
                met = self._colliding(rows, job_id, run_id, request.idempotency_key)
            decision = await self._decide_one(tx, met, command)
            _raise_if_conflict(decision)
        return _submitted(decision)

    # --- claims -----------------------------------------------------------------------

    async def claim_owned(
        self, owner_id: str, claim_tokens: Sequence[str], present: Callable[[JobRecord], Presented]
    ) -> list[Presented]:
        """Claim up to ``len(claim_tokens)`` jobs, token ``i`` for the ``i``-th eligible row,
        each decided by the kernel exactly as a single claim. ``present`` turns each
        claimed record into what the caller returns, inside the transaction: a row whose
        envelope cannot be read (``corrupt_row``) rolls the claim back."""
        try:
            return await self._claim(owner_id, claim_tokens, present, owned=True)
        except TenureError as error:
            if error.reason != "constraint_violated":
                raise
        # Only the claim token's unique index can refuse a claim's write: a concurrent
        # claim stored the same nonce first.
        raise TenureError(ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused")

    async def claim_legacy(self, owner_id: str, present: Callable[[JobRecord], Presented]) -> Presented | None:
        claimed = await self._claim(owner_id, [""], present, owned=False)
        return claimed[0] if claimed else None

    async def _claim(
        self, owner_id: str, claim_tokens: Sequence[str], present: Callable[[JobRecord], Presented], *, owned: bool
    ) -> list[Presented]:
        limit = len(claim_tokens)
        lease_us = self.config.lease_us
        async with self.store.transaction(write=True) as tx:
            # The clock is read first because eligibility depends on it; candidates are
            # locked with SKIP LOCKED, which never waits, so no lock wait separates reading
            # the clock from deciding.
            view = await tx.claim_view(self.queue, limit=limit, tokens=claim_tokens if owned else [], owned=owned)
            now = await tx.now_us()
            candidates = view.candidates
            if view.sweep_needed:
                # Settle expired claims first, so an expired row is eligible again (or
                # finished) within this claim, then pick the candidates again.
                expired = await tx.expired_claims(self.queue, now, SWEEP_LIMIT)
                changes = []
                for record in expired:
                    decision = decide(record, ExpireLease(), now)
                    if isinstance(decision, Applied):
                        changes.append((record, self._checked(record, decision)))
                await self._persist(tx, changes)
                candidates = await tx.pick_eligible(self.queue, now, limit, owned=owned)
            claims: list[tuple[JobRecord, JobRecord]] = []
            for index, token in enumerate(claim_tokens):
                met = candidates[index] if index < len(candidates) else None
                command: Command = (
                    ClaimOwned(owner_id=owner_id, claim_token=token,
                               nonce_already_stored=token in view.stored_tokens, lease_us=lease_us)
                    if owned else ClaimLegacy(owner_id=owner_id, lease_us=lease_us)
                )
                decision = decide(met, command, now)
                _raise_if_conflict(decision)  # inside the transaction: nothing is kept
                if isinstance(decision, Refused):
                    continue  # no eligible row for this token (its nonce stays unused)
                claimed = self._checked(met, decision)
                _require(met is not None and claimed is not None)
                claims.append((met, claimed))  # type: ignore[arg-type]
            stored = await tx.update_many(claims, read_back=True)
            for (_, decided), found in zip(claims, stored, strict=True):
                # The identity must read back exactly: a coercion or a trigger that changed
                # the owner, token or generation rolls the whole claim back.
                if owned and claim_identity_problem(decided, found.owner_id, found.claim_token, found.generation):
                    raise TenureError(ErrorCode.QUEUE_CLAIM_CONFLICT, "claim_identity_changed")
                if found != decided:
                    raise persistence_failed("read_back_mismatch")
            presented = [present(record) for record in stored]
        return presented

    async def recover_owned(self, owner_id: str, claim_token: str) -> JobRecord | None:
        async with self.store.transaction(write=False) as tx:
            met = await tx.by_token(self.queue, claim_token)
            decision = decide(met, RecoverOwned(owner_id=owner_id, claim_token=claim_token), await tx.now_us())
        if isinstance(decision, Refused):
            return None
        return decision.new_record

    # --- writes to rows by ID ---------------------------------------------------------

    async def _on_rows(self, items: Sequence[tuple[str, Command]], *, write: bool = True) -> list[Decision]:
        """Decide each ``(job ID, command)`` in order on the locked rows (an item sees the
        effect of earlier items on the same row) and persist every changed row."""
        async with self.store.transaction(write=write) as tx:
            found = await tx.lock_rows(self.queue, sorted({job_id for job_id, _ in items}))
            now = await tx.now_us()
            current: dict[str, JobRecord | None] = {job_id: found.get(job_id) for job_id, _ in items}
            original = dict(current)
            decisions = []
            for job_id, command in items:
                decision = decide(current[job_id], command, now)
                if isinstance(decision, Applied):
                    current[job_id] = self._checked(current[job_id], decision)
                decisions.append(decision)
            await self._persist(tx, [(original[job_id], current[job_id]) for job_id in original if original[job_id] != current[job_id]])
        return decisions

    async def _on_row(self, job_id: str, command: Command, *, write: bool = True) -> Decision:
        return (await self._on_rows([(job_id, command)], write=write))[0]

    def _heartbeat(self, fence: QueueClaimFence) -> tuple[str, Command]:
        return fence.job_id, HeartbeatOwned(fence=ClaimFence.of(fence), lease_us=self.config.lease_us)

    async def heartbeat_owned(self, fences: Sequence[QueueClaimFence]) -> list[bool]:
        decisions = await self._on_rows([self._heartbeat(fence) for fence in fences])
        return [isinstance(decision, Applied) for decision in decisions]

    async def complete_owned(self, items: Sequence[tuple[QueueClaimFence, str | None]]) -> list[bool]:
        decisions = await self._on_rows(
            [(fence.job_id, CompleteOwned(fence=ClaimFence.of(fence), result_json=result)) for fence, result in items]
        )
        return [isinstance(decision, Applied) for decision in decisions]

    async def fail_owned(
        self, fence: QueueClaimFence, error: str, *, retry: bool, dlq_record_id: str | None
    ) -> bool:
        command = FailOwned(
            fence=ClaimFence.of(fence),
            error_message=error,
            retry=retry,
            dlq_record_id=dlq_record_id,
            backoff_base_ms=self.config.backoff_base_ms,
            backoff_max_ms=self.config.backoff_max_ms,
        )
        return isinstance(await self._on_row(fence.job_id, command), Applied)

    async def set_pid_owned(self, fence: QueueClaimFence, pid: int) -> bool:
        return isinstance(await self._on_row(fence.job_id, SetPidOwned(fence=ClaimFence.of(fence), pid=pid)), Applied)

    async def read_state_owned(self, fence: QueueClaimFence) -> StreamingStateReply | None:
        decision = await self._on_row(fence.job_id, ReadStateOwned(fence=ClaimFence.of(fence)), write=False)
        if isinstance(decision, Applied):
            _require(isinstance(decision.reply, StreamingStateReply))
            return decision.reply  # type: ignore[return-value]
        return None

    async def acknowledge_cancel_owned(self, fence: QueueClaimFence) -> bool:
        decision = await self._on_row(fence.job_id, AcknowledgeCancelOwned(fence=ClaimFence.of(fence)))
        return isinstance(decision, Applied)

    async def request_cancel(self, job_id: str) -> bool:
        return isinstance(await self._on_row(job_id, RequestCancel()), Applied)

    async def cancel_admin(self, job_id: str) -> bool:
        return isinstance(await self._on_row(job_id, CancelAdmin()), Applied)

    async def heartbeat_legacy(self, job_id: str, owner_id: str) -> bool:
        command = HeartbeatLegacy(owner_id=owner_id, lease_us=self.config.lease_us)
        return isinstance(await self._on_row(job_id, command), Applied)

    async def complete_legacy(self, job_id: str, result_json: str | None) -> bool:
        return isinstance(await self._on_row(job_id, CompleteLegacy(result_json=result_json)), Applied)

    async def fail_legacy(self, job_id: str, error: str, *, retry: bool, dlq_record_id: str | None) -> bool:
        command = FailLegacy(
            error_message=error,
            retry=retry,
            dlq_record_id=dlq_record_id,
            backoff_base_ms=self.config.backoff_base_ms,
            backoff_max_ms=self.config.backoff_max_ms,
        )
        return isinstance(await self._on_row(job_id, command), Applied)

    async def set_pid_legacy(self, job_id: str, pid: int) -> bool:
        return isinstance(await self._on_row(job_id, SetPidLegacy(pid=pid)), Applied)

    async def delete(self, job_id: str) -> bool:
        return isinstance(await self._on_row(job_id, DeleteLegacy()), Applied)

    async def purge_finished(self, older_than_us: int) -> int:
        """Delete unprotected finished rows that finished more than ``older_than_us`` ago."""
        async with self.store.transaction(write=True) as tx:
            now = await tx.now_us()
            command = PurgeFinished(older_than_us=now - older_than_us)
            changes: list[tuple[JobRecord | None, JobRecord | None]] = []
            for row in await tx.finished_before(self.queue, command.older_than_us, PURGE_LIMIT):
                decision = decide(row, command, now)
                if isinstance(decision, Applied):
                    changes.append((row, self._checked(row, decision)))
            await self._persist(tx, changes)
        return len(changes)

    # --- reads ------------------------------------------------------------------------

    async def get(self, job_id: str) -> JobRecord | None:
        async with self.store.transaction(write=False) as tx:
            found = await tx.read_rows(self.queue, [job_id])
        return found[0] if found else None

    async def list(self, status: JobStatus | None, limit: int) -> list[JobRecord]:
        async with self.store.transaction(write=False) as tx:
            return await tx.list_records(self.queue, status, limit)
