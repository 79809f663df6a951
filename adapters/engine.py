"""The queue engine: lock, read the database clock, ask the kernel, persist its decision.

Every operation is one transaction on one store. The engine finds the row the command
meets (locking it), samples the database time after the lock, calls
:func:`tenure.kernel.decide`, and writes an applied decision with a compare-and-set
that returns what was stored. The stored row must equal the decided record exactly
(a pair assertion with the kernel); a claim whose stored owner, token or generation
read back differently rolls back whole. The engine never decides anything itself: the
only branches here are on the kernel's decision.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

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

from .store import Store, Transaction, persistence_failed

__all__ = ["QueueEngine", "SWEEP_LIMIT", "PURGE_LIMIT"]

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


def _raise_if_conflict(decision: Refused) -> None:
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
        new_run_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        self.store = store
        self.queue = queue
        self.config = config
        self._new_job_id = new_job_id
        self._new_run_id = new_run_id

    # --- persisting one decision ------------------------------------------------------

    async def _persist(self, tx: Transaction, old: JobRecord | None, decision: Applied) -> JobRecord | None:
        """Write an applied decision and check that the database stored exactly it."""
        new = decision.new_record
        if new is not None:
            assert record_violations(new) == [], "the kernel produced a record breaking its invariants"
        if new is None:
            assert old is not None
            if not await tx.delete(old):
                raise persistence_failed("row_changed")
            return None
        if old is None:
            stored = await tx.insert(new)
        elif new == old:
            return old
        else:
            changed = await tx.update(old, new)
            if changed is None:
                raise persistence_failed("row_changed")
            stored = changed
        if stored != new:
            raise persistence_failed("read_back_mismatch")
        return stored

    async def _decide_and_persist(
        self, tx: Transaction, record: JobRecord | None, command: Command
    ) -> Decision:
        now = await tx.now_us()
        decision = decide(record, command, now)
        if isinstance(decision, Applied):
            await self._persist(tx, record, decision)
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

    async def _submit_owned_once(self, snapshot: SubmissionSnapshot) -> Submitted:
        authored_job_id, run_id = self._ids(snapshot.job_id, snapshot.run_id)
        async with self.store.transaction(write=True) as tx:
            job_id = await tx.canonical_job_id(self.queue, authored_job_id)
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
                payload_json=snapshot.authored_json,
            )
            # Replay first: an existing original answers before any key is touched.
            met = await tx.by_submission(self.queue, snapshot.submission_id)
            if met is None:
                met = await tx.colliding(self.queue, job_id, run_id, snapshot.idempotency_key)
            if met is None and snapshot.active_key is not None:
                holder = await tx.key_holder(self.queue, snapshot.active_key)
                if holder is not None:
                    # Rechecked under the predecessor's lock: an identical request may have
                    # committed after the first lookup.
                    met = await tx.by_submission(self.queue, snapshot.submission_id)
                    if met is None:
                        released = await self._decide_and_persist(
                            tx, holder, ReleaseKeyForOwned(force=snapshot.force)
                        )
                        if isinstance(released, Refused):
                            _raise_if_conflict(released)
            decision = await self._decide_and_persist(tx, met, command)
            if isinstance(decision, Refused):
                # Raised inside the transaction, so a predecessor released above is
                # restored: a refused submission changes nothing.
                _raise_if_conflict(decision)
                raise AssertionError("a submission is never refused with a negative outcome")
        assert isinstance(decision.reply, Submitted)
        return decision.reply

    async def _submit_legacy_once(self, request: FrozenEnvelope) -> Submitted:
        authored_job_id, run_id = self._ids(request.job_id, request.run_id)
        async with self.store.transaction(write=True) as tx:
            job_id = await tx.canonical_job_id(self.queue, authored_job_id)
            command = SubmitLegacy(
                queue=self.queue,
                job_id=job_id,
                run_id=run_id,
                fires_at_us=request.fires_at_us,
                max_attempts=self._max_attempts(request.max_attempts),
                idempotency_key=request.idempotency_key,
                active_key=request.active_key,
                payload_json=request.authored_json,
            )
            met = None
            if request.active_key is not None:
                holder = await tx.key_holder(self.queue, request.active_key)
                if holder is not None and request.force:
                    released = await self._decide_and_persist(tx, holder, ReleaseKeyForLegacy())
                    if isinstance(released, Refused):
                        _raise_if_conflict(released)
                else:
                    met = holder
            if met is None:
                met = await tx.colliding(self.queue, job_id, run_id, request.idempotency_key)
            decision = await self._decide_and_persist(tx, met, command)
            if isinstance(decision, Refused):
                _raise_if_conflict(decision)
                raise AssertionError("a submission is never refused with a negative outcome")
        assert isinstance(decision.reply, Submitted)
        return decision.reply

    # --- claims -----------------------------------------------------------------------

    async def _sweep(self, tx: Transaction, now: int) -> None:
        """Settle expired claims before claiming, so an expired row is eligible again (or
        finished) inside the same transaction."""
        for expired in await tx.expired_claims(self.queue, now, SWEEP_LIMIT):
            await self._decide_and_persist(tx, expired, ExpireLease())

    async def claim_owned(self, owner_id: str, claim_token: str) -> JobRecord | None:
        try:
            return await self._claim_owned_once(owner_id, claim_token)
        except TenureError as error:
            if error.reason != "constraint_violated":
                raise
        # Only the claim token's unique index can refuse a claim's write: a concurrent
        # claim stored the same nonce first.
        raise TenureError(ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused")

    async def _claim_owned_once(self, owner_id: str, claim_token: str) -> JobRecord | None:
        async with self.store.transaction(write=True) as tx:
            # The clock is read first because eligibility depends on it; claims lock with
            # SKIP LOCKED, which never waits, so no lock wait separates reading and deciding.
            now = await tx.now_us()
            await self._sweep(tx, now)
            command = ClaimOwned(
                owner_id=owner_id,
                claim_token=claim_token,
                nonce_already_stored=await tx.token_stored(self.queue, claim_token),
                lease_us=self.config.lease_us,
            )
            candidate = await tx.next_eligible(self.queue, now, owned=True)
            decision = decide(candidate, command, now)
            if isinstance(decision, Refused):
                _raise_if_conflict(decision)
                return None
            claimed = await self._persist_claim(tx, candidate, decision)
        return claimed

    async def _persist_claim(self, tx: Transaction, candidate: JobRecord | None, decision: Applied) -> JobRecord:
        assert candidate is not None and decision.new_record is not None
        stored = await tx.update(candidate, decision.new_record)
        if stored is None:
            raise persistence_failed("row_changed")
        # Read the identity back with a separate statement: RETURNING does not see what
        # an AFTER trigger did to the row.
        owner_id, claim_token, generation = await tx.claim_identity(self.queue, stored.job_id)
        if claim_identity_problem(decision.new_record, owner_id, claim_token, generation) or (
            stored != decision.new_record
        ):
            # Raised inside the transaction: nothing of this claim is committed.
            raise TenureError(ErrorCode.QUEUE_CLAIM_CONFLICT, "claim_identity_changed")
        return stored

    async def claim_legacy(self, owner_id: str) -> JobRecord | None:
        async with self.store.transaction(write=True) as tx:
            now = await tx.now_us()
            await self._sweep(tx, now)
            candidate = await tx.next_eligible(self.queue, now, owned=False)
            decision = decide(candidate, ClaimLegacy(owner_id=owner_id, lease_us=self.config.lease_us), now)
            if isinstance(decision, Refused):
                _raise_if_conflict(decision)
                return None
            assert candidate is not None and decision.new_record is not None
            stored = await tx.update(candidate, decision.new_record)
            if stored is None or stored != decision.new_record:
                raise persistence_failed("read_back_mismatch")
        return stored

    async def recover_owned(self, owner_id: str, claim_token: str) -> JobRecord | None:
        async with self.store.transaction(write=False) as tx:
            now = await tx.now_us()
            met = await tx.by_token(self.queue, claim_token)
            decision = decide(met, RecoverOwned(owner_id=owner_id, claim_token=claim_token), now)
        if isinstance(decision, Refused):
            return None
        return decision.new_record

    # --- writes to one row ------------------------------------------------------------

    async def _on_row(self, job_id: str, command: Command, *, write: bool = True) -> Decision:
        async with self.store.transaction(write=write) as tx:
            met = await tx.load(self.queue, job_id)  # locks the row; the clock is read after
            return await self._decide_and_persist(tx, met, command)

    async def fenced(self, fence: QueueClaimFence, make: Callable[[ClaimFence], Command], *, write: bool = True) -> Decision:
        return await self._on_row(fence.job_id, make(ClaimFence.of(fence)), write=write)

    async def heartbeat_owned(self, fence: QueueClaimFence) -> bool:
        lease_us = self.config.lease_us
        decision = await self.fenced(fence, lambda f: HeartbeatOwned(fence=f, lease_us=lease_us))
        return isinstance(decision, Applied)

    async def complete_owned(self, fence: QueueClaimFence, result_json: str | None) -> bool:
        decision = await self.fenced(fence, lambda f: CompleteOwned(fence=f, result_json=result_json))
        return isinstance(decision, Applied)

    async def fail_owned(
        self, fence: QueueClaimFence, error: str, *, retry: bool, dlq_record_id: str | None
    ) -> bool:
        config = self.config
        decision = await self.fenced(
            fence,
            lambda f: FailOwned(
                fence=f,
                error_message=error,
                retry=retry,
                dlq_record_id=dlq_record_id,
                backoff_base_ms=config.backoff_base_ms,
                backoff_max_ms=config.backoff_max_ms,
            ),
        )
        return isinstance(decision, Applied)

    async def set_pid_owned(self, fence: QueueClaimFence, pid: int) -> bool:
        decision = await self.fenced(fence, lambda f: SetPidOwned(fence=f, pid=pid))
        return isinstance(decision, Applied)

    async def read_state_owned(self, fence: QueueClaimFence) -> StreamingStateReply | None:
        decision = await self.fenced(fence, lambda f: ReadStateOwned(fence=f), write=False)
        if isinstance(decision, Applied):
            assert isinstance(decision.reply, StreamingStateReply)
            return decision.reply
        return None

    async def acknowledge_cancel_owned(self, fence: QueueClaimFence) -> bool:
        decision = await self.fenced(fence, lambda f: AcknowledgeCancelOwned(fence=f))
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
        removed = 0
        async with self.store.transaction(write=True) as tx:
            now = await tx.now_us()
            command = PurgeFinished(older_than_us=now - older_than_us)
            for row in await tx.finished_before(self.queue, command.older_than_us, PURGE_LIMIT):
                decision = await self._decide_and_persist(tx, row, command)
                removed += isinstance(decision, Applied)
        return removed

    # --- reads ------------------------------------------------------------------------

    async def get(self, job_id: str) -> JobRecord | None:
        async with self.store.transaction(write=False) as tx:
            return await tx.load(self.queue, job_id)

    async def list(self, status: JobStatus | None, limit: int) -> list[JobRecord]:
        async with self.store.transaction(write=False) as tx:
            return await tx.list_records(self.queue, status, limit)
