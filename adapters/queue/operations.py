"""The queue's operations on the shared engine: which rows each command meets, and which
commands it sends.

Every operation is one transaction on one store. The rows a command meets come from the
kernel's queue finders (:mod:`tenure.kernel.queue.finders`), located and locked by the
store; the engine (:mod:`tenure.adapters.core.engine`) reads the database time after the
locks, asks the kernel, checks and persists. A claim whose stored owner, token or
generation read back differently rolls back whole. Nothing here decides a transition.

Batched operations (``claim_batch_owned``, ``complete_many_owned``,
``heartbeat_many_owned``) run the same kernel decision for every item, in order, in one
transaction: their only difference from single calls is fewer round trips.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from tenure.kernel.core import Applied, Decision, Finder, Refused
from tenure.kernel.queue import finders
from tenure.kernel.queue.commands import (
    AcknowledgeCancelOwned,
    CancelAdmin,
    ClaimFence,
    ClaimLegacy,
    ClaimOwned,
    Command,
    CompleteLegacy,
    CompleteOwned,
    DeleteLegacy,
    ExpireLease,
    FailLegacy,
    FailOwned,
    HeartbeatLegacy,
    HeartbeatOwned,
    ProgressOwned,
    PurgeFinished,
    ReadStateOwned,
    RecoverOwned,
    ReleaseKeyForLegacy,
    ReleaseKeyForOwned,
    ReleaseOwned,
    RequestCancel,
    RetryFailed,
    SetPidLegacy,
    SetPidOwned,
    StreamingStateReply,
    SubmitLegacy,
    SubmitOwned,
    Submitted,
)
from tenure.kernel.queue.machine import (
    CLAIM_LEGACY_REWRITE,
    CLAIM_OWNED_REWRITE,
    QUEUE,
    SET_ASIDE,
    UNREADABLE_ROW_ERROR,
    claim_identity_problem,
)
from tenure.kernel.queue.record import QueueRow
from tenure.model import (
    DEFAULT_MAX_ATTEMPTS,
    ConfigValidationError,
    ErrorCode,
    FrozenEnvelope,
    JobStatus,
    QueueClaimFence,
    QueueKind,
    SubmissionSnapshot,
    TenureError,
    WorkerConfig,
)
from tenure.model.validation import is_queue_name

from ..core.engine import Engine, Insertion, checked, raise_if_conflict, require
from ..core.failures import persistence_failed
from ..core.store import Probe, Store, Transaction
from ..core.tables import Binding, Unreadable
from .table import binding_for, stored_payload

Presented = TypeVar("Presented")
Answer = TypeVar("Answer")

log = logging.getLogger("tenure.queue")

__all__ = ["QueueOperations", "SWEEP_LIMIT", "PURGE_LIMIT", "SUBMIT_ATTEMPTS", "UNREADABLE_ERROR", "UNREADABLE_ROUNDS",
           "SET_ASIDE_ROUNDS"]

UNREADABLE_ERROR = "corrupt_row: the stored payload could not be read"
"""The error stored on a job a claim met but could not read (see ``claim_owned``)."""

UNREADABLE_ROUNDS = 8
"""How many times one legacy claim call fails the unreadable jobs it claimed and claims
again; past that it raises ``corrupt_row`` (the next call goes on failing them)."""

SWEEP_LIMIT = 64
"""Expired claims settled per claim transaction (earliest lease first)."""

PURGE_LIMIT = 1000
"""Rows removed per retention transaction."""

SUBMIT_ATTEMPTS = 3
"""Transactions a submission may take when concurrent submissions race on a unique key."""


def _submitted(decision: Decision) -> Submitted:
    reply = decision.reply if isinstance(decision, Applied) else None
    if not isinstance(reply, Submitted):
        raise persistence_failed("invariant_broken")
    return reply


class _Staged:
    """The rows a batch of task submissions may meet (those located, then those the batch
    itself decided to insert), found by identity: a request meets only a row sharing its
    submission ID or its job ID (tasks have no run ID or key), so the kernel's
    :func:`finders.submission_meets` is asked about those rows alone, and a batch of any
    length is decided in linear time. Both identities are unique in the table."""

    __slots__ = ("_by_submission", "_by_job")

    def __init__(self, rows: Sequence[QueueRow]) -> None:
        self._by_submission: dict[str, QueueRow] = {}
        self._by_job: dict[str, QueueRow] = {}
        for row in rows:
            self.add(row)

    def add(self, row: QueueRow) -> None:
        if row.submission_id is not None:
            self._by_submission.setdefault(row.submission_id, row)
        self._by_job.setdefault(row.job_id, row)

    def sharing(self, submission_id: str | None, job_id: str) -> list[QueueRow]:
        found = [] if submission_id is None else [self._by_submission.get(submission_id)]
        found.append(self._by_job.get(job_id))
        return list({id(row): row for row in found if row is not None}.values())


class QueueOperations:
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
        binding: Binding | None = None,
    ) -> None:
        self.store = store
        self.queue = queue
        self.config = config
        # Another table of the same queue's shape (the Run hops' table) may stand in.
        self.binding = binding_for(queue) if binding is None else binding
        self.engine = Engine(store)
        self.unreadable_failed = 0
        """Jobs a claim met but could not read, and failed or set aside (see
        :meth:`claim_owned`), since these operations were made: a Worker that sees it grow
        claims again at once."""
        self._new_job_id = new_job_id
        self._new_run_id = new_run_id

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
    async def _retrying(attempt: Callable[[], Awaitable[Answer]]) -> Answer:
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

    async def _locate(self, tx: Transaction, submission_id: str | None, job_id: str, run_id: str | None, key: str | None) -> list[QueueRow]:
        # Every row sharing an identity with the request, locked at once; the clock is read
        # after the locks (so also after a predecessor's lock wait).
        parameters = {"submission_id": submission_id, "job_id": job_id, "run_id": run_id, "key": key}
        return await tx.locked(self.binding, finders.locate(self.queue), parameters)

    def _owned_command(self, snapshot: SubmissionSnapshot, job_id: str, run_id: str | None) -> SubmitOwned:
        return SubmitOwned(
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
            queue_name=snapshot.queue_name,
            task_name=snapshot.task_name,
            priority=snapshot.priority,
            delay_us=snapshot.delay_us,
        )

    def owned_insertion(self, snapshot: SubmissionSnapshot) -> Insertion:
        """An owned submission as a row another machine's decided-ahead statement inserts
        beside its own write (:meth:`~tenure.adapters.core.engine.Engine.joined_ahead_beside`),
        where no row shares an identity with it: the queue kernel decides it there as
        :meth:`submit_owned` decides a first submission. A row met (a replay, a conflict)
        makes that statement write nothing; :meth:`submit_owned` then decides it."""
        job_id, run_id = self._ids(snapshot.job_id, snapshot.run_id)
        key = snapshot.active_key if snapshot.active_key is not None else snapshot.idempotency_key
        return Insertion(self.binding, finders.locate(self.queue),
                         {"submission_id": snapshot.submission_id, "job_id": job_id, "run_id": run_id, "key": key},
                         self._owned_command(snapshot, job_id, run_id))

    async def _submit_owned_once(self, snapshot: SubmissionSnapshot) -> Submitted:
        authored_job_id, run_id = self._ids(snapshot.job_id, snapshot.run_id)
        binding = self.binding
        key = snapshot.active_key if snapshot.active_key is not None else snapshot.idempotency_key

        def command_for(job_id: str) -> SubmitOwned:
            return self._owned_command(snapshot, job_id, run_id)

        def meets(rows: Sequence[QueueRow], job_id: str) -> QueueRow | None:
            return finders.submission_meets(
                rows, submission_id=snapshot.submission_id, job_id=job_id, run_id=run_id, key=snapshot.idempotency_key
            )

        # One statement when no row shares an identity with the submission (or it meets a
        # replay or a conflict); the transaction below otherwise.
        decided = await self.engine.insert_ahead(
            binding, finders.locate(self.queue),
            {"submission_id": snapshot.submission_id, "job_id": authored_job_id, "run_id": run_id, "key": key},
            command_for(authored_job_id), lambda rows: meets(rows, authored_job_id),
        )
        if decided is not None:
            return _submitted(decided)

        async def body(tx: Transaction) -> Decision:
            job_id = await tx.canonical_key(binding, authored_job_id)
            rows = await self._locate(tx, snapshot.submission_id, job_id, run_id, key)
            command = command_for(job_id)
            met = meets(rows, job_id)
            if met is None:
                holder = finders.key_holder(rows, snapshot.active_key)
                if holder is not None:
                    released = await self.engine.decide_one(tx, binding, holder, ReleaseKeyForOwned(force=snapshot.force))
                    raise_if_conflict(binding, released)
            decision = await self.engine.decide_one(tx, binding, met, command)
            # Raised inside the transaction, so a predecessor released above is restored:
            # a refused submission changes nothing.
            raise_if_conflict(binding, decision)
            return decision

        return _submitted(await self.store.run(body, write=True))

    async def submit_many(self, requests: Sequence[SubmissionSnapshot | FrozenEnvelope]) -> list[Submitted]:
        """Tasks: submit a batch in one transaction (one lock-and-clock statement, one
        pipelined insert), each request decided exactly as alone, in order (a later one
        meets what an earlier one wrote). Snapshots are owned submissions, frozen
        envelopes legacy ones. A conflict raises and writes nothing of the batch. No
        length is enforced here (a source bounds its own calls; ``defer_many`` sends
        any number as one batch)."""
        require(self.queue is QueueKind.TASK)
        return await self._retrying(lambda: self._submit_many_once(requests))

    async def _submit_many_once(self, requests: Sequence[SubmissionSnapshot | FrozenEnvelope]) -> list[Submitted]:
        return await self.store.run(self._submissions(requests), write=True)

    async def submit_many_in(self, tx: Transaction, requests: Sequence[SubmissionSnapshot | FrozenEnvelope]) -> list[Submitted]:
        """:meth:`submit_many` inside a transaction the caller holds (``defer(using=...)``):
        no retry (a statement that failed has ended the caller's transaction)."""
        require(self.queue is QueueKind.TASK)
        return await self._submissions(requests)(tx)

    def _submissions(
        self, requests: Sequence[SubmissionSnapshot | FrozenEnvelope]
    ) -> Callable[[Transaction], Awaitable[list[Submitted]]]:
        binding = self.binding
        authored = [request.job_id if request.job_id is not None else self._new_job_id() for request in requests]

        def command_for(request: SubmissionSnapshot | FrozenEnvelope, job_id: str) -> Command:
            fields: dict[str, Any] = dict(
                queue=self.queue, job_id=job_id, run_id=None, fires_at_us=request.fires_at_us,
                max_attempts=self._max_attempts(request.max_attempts), idempotency_key=None, active_key=None,
                payload=stored_payload(self.queue, request.field_texts), queue_name=request.queue_name,
                task_name=request.task_name, priority=request.priority, delay_us=request.delay_us,
            )
            if isinstance(request, SubmissionSnapshot):
                return SubmitOwned(submission_id=request.submission_id, fingerprint=request.fingerprint, **fields)
            return SubmitLegacy(**fields)

        async def body(tx: Transaction) -> list[Submitted]:
            keys = [await tx.canonical_key(binding, job_id) for job_id in authored]
            submission_ids = [request.submission_id for request in requests if isinstance(request, SubmissionSnapshot)]
            # One statement locks every row the batch may meet, however long the batch:
            # both lists travel as one parameter each (a JSON array on SQLite, an array on
            # PostgreSQL), so no statement limit on parameters applies.
            rows = await tx.locked(binding, finders.located_batch, {"submission_ids": submission_ids, "keys": keys})
            now = await tx.now_us()
            staged = _Staged(rows)
            changes: list[tuple[QueueRow | None, QueueRow]] = []
            answers: list[Submitted] = []
            for request, job_id in zip(requests, keys, strict=True):
                submission_id = request.submission_id if isinstance(request, SubmissionSnapshot) else None
                met = finders.submission_meets(staged.sharing(submission_id, job_id), submission_id=submission_id,
                                               job_id=job_id, run_id=None, key=None)
                decision = QUEUE.decide(met, command_for(request, job_id), now)
                raise_if_conflict(binding, decision)
                if not isinstance(decision, Applied):  # every submission refusal is a conflict
                    raise persistence_failed("invariant_broken")
                new = checked(binding, met, decision)
                if new is not None and new != met:
                    require(met is None)  # a submission only inserts or replays
                    changes.append((None, new))
                    staged.add(new)
                answers.append(_submitted(decision))
            # Every request is decided before anything is written: a conflict anywhere in
            # the batch raises with nothing of it written, even in a caller's transaction.
            await self.engine.persist(tx, binding, changes)
            return answers

        return body

    async def _submit_legacy_once(self, request: FrozenEnvelope) -> Submitted:
        authored_job_id, run_id = self._ids(request.job_id, request.run_id)
        binding = self.binding

        async def body(tx: Transaction) -> Decision:
            job_id = await tx.canonical_key(binding, authored_job_id)
            key = request.active_key if request.active_key is not None else request.idempotency_key
            rows = await self._locate(tx, None, job_id, run_id, key)
            command = SubmitLegacy(
                queue=self.queue,
                job_id=job_id,
                run_id=run_id,
                fires_at_us=request.fires_at_us,
                max_attempts=self._max_attempts(request.max_attempts),
                idempotency_key=request.idempotency_key,
                active_key=request.active_key,
                payload=stored_payload(self.queue, request.field_texts),
                queue_name=request.queue_name,
                task_name=request.task_name,
                priority=request.priority,
                delay_us=request.delay_us,
            )
            met = None
            holder = finders.key_holder(rows, request.active_key)
            if holder is not None and request.force:
                released = await self.engine.decide_one(tx, binding, holder, ReleaseKeyForLegacy())
                raise_if_conflict(binding, released)
                released_record = released.new_record if isinstance(released, Applied) else None
                require(released_record is not None)
                # The successor meets the predecessor as it is now (released), should it
                # collide with it on its job ID.
                rows = [released_record if row.job_id == holder.job_id else row for row in rows]  # type: ignore[misc]
            elif holder is not None:
                met = holder
            if met is None:
                met = finders.submission_meets(
                    rows, submission_id=None, job_id=job_id, run_id=run_id, key=request.idempotency_key
                )
            decision = await self.engine.decide_one(tx, binding, met, command)
            raise_if_conflict(binding, decision)
            return decision

        return _submitted(await self.store.run(body, write=True))

    # --- claims -----------------------------------------------------------------------

    async def claim_owned(
        self, owner_id: str, claim_tokens: Sequence[str], present: Callable[[QueueRow], Presented],
        queue_names: Sequence[str] | None = None,
    ) -> list[Presented]:
        """Claim up to ``len(claim_tokens)`` jobs, token ``i`` for the ``i``-th eligible row,
        each decided by the kernel exactly as a single claim; ``present`` turns each
        claimed (committed) record into what the caller gets. A job tenure cannot read
        (written outside tenure) is never handed out, and never fails the claim: a row
        whose columns cannot be read, or whose claim would break the record invariants,
        is set aside by the claim itself (``SET_ASIDE``: failed with
        ``UNREADABLE_ROW_ERROR``, see specs/queue.md "Rows tenure cannot read"); a row
        whose envelope cannot be read is failed at once through the claim just made (no
        retry, :data:`UNREADABLE_ERROR`). Either is logged with its job ID and counted in
        :attr:`unreadable_failed`; a nonce a claim wrote to such a row is spent. Left
        pending, such a job would be met first by every claim and stop the queue behind
        it. Tasks: ``queue_names`` are the task queues served."""
        try:
            claimed = await self._claim(owner_id, claim_tokens, owned=True, queue_names=queue_names)
        except TenureError as error:
            if error.reason != "constraint_violated":
                raise
            # Only the claim token's unique index can refuse a claim's write: a concurrent
            # claim stored the same nonce first.
            raise TenureError(ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused") from None
        presented, unreadable = _presented(claimed, present)
        for record in unreadable:
            fence = QueueClaimFence(record.queue, record.job_id, record.owner_id,  # type: ignore[arg-type]
                                    record.generation, record.claim_token)  # type: ignore[arg-type]
            await self._fail_unreadable(record.job_id,
                                        self.fail_owned(fence, UNREADABLE_ERROR, retry=False, dlq_record_id=None))
        return presented

    async def claim_legacy(self, owner_id: str, present: Callable[[QueueRow], Presented]) -> Presented | None:
        """The legacy claim (no nonce). A job it cannot read is failed by its ID at once
        (legacy semantics, no retry), or set aside, and the claim goes on to the next, up
        to :data:`UNREADABLE_ROUNDS` times; past that it raises ``corrupt_row``."""
        for _ in range(UNREADABLE_ROUNDS):
            set_aside_before = self.unreadable_failed
            presented, unreadable = _presented(await self._claim(owner_id, [""], owned=False), present)
            if presented:
                return presented[0]
            if not unreadable and self.unreadable_failed == set_aside_before:
                return None  # nothing eligible (a claim that set a row aside claims on)
            for record in unreadable:
                await self._fail_unreadable(record.job_id, self.fail_legacy(record.job_id, UNREADABLE_ERROR,
                                                                             retry=False, dlq_record_id=None))
        raise persistence_failed("corrupt_row")

    async def _fail_unreadable(self, job_id: str, failure: Awaitable[object]) -> None:
        """Run ``failure``, the fail of a job just claimed whose envelope cannot be read
        (the kernel decides it, as any failure). It is best effort: when the write fails,
        the claim's lease runs out and the next claim that meets the job fails it."""
        log.warning("job %s was claimed but its envelope could not be read (written outside tenure): failed with %r",
                    job_id, UNREADABLE_ERROR, extra={"job_id": job_id})
        self.unreadable_failed += 1
        with contextlib.suppress(TenureError):
            await failure

    async def _claim(
        self, owner_id: str, claim_tokens: Sequence[str], *, owned: bool, queue_names: Sequence[str] | None = None,
    ) -> list[QueueRow]:
        """The claimed records, committed: one autocommit statement on a store that can
        claim ahead (verified in SQL), otherwise (or when that statement does not go) the
        reference transaction (:class:`_Claim`). Rows the claim could not read were set
        aside meanwhile (:data:`~tenure.kernel.queue.machine.SET_ASIDE`); each is reported
        here, once it is committed."""
        served = self._served(queue_names)
        one_queue = served is not None and len(served) == 1
        eligible, claimable = finders.claim_finders(self.queue, owned=owned, one_queue=one_queue)
        chosen: dict[str, Any] = {} if served is None else {"queue": served[0]} if one_queue else {"queues": served}
        claim = _Claim(self, owner_id, tuple(claim_tokens), owned, None if served is None else tuple(served),
                       eligible, claimable, chosen)
        claimed = await claim.in_one_statement()
        if claimed is None:
            claimed = await self.store.run(claim.body, write=True)
            # The fenced writes to follow decide ahead from these (remembered only once
            # the claim committed: an uncommitted version would vouch for a row that never was).
            self.engine.remember(self.binding, claimed)
        # Reported once committed (a claim that raised rolled its set-asides back).
        self._report_set_aside(claim)
        return claimed

    def _report_set_aside(self, claim: _Claim) -> None:
        """Log each row the claim set aside (its ID, once: it is never met again) and
        count it in :attr:`unreadable_failed`; and each it met but could not set aside."""
        for entry in claim.set_aside:
            self.unreadable_failed += 1
            log.warning("job %s could not be read (written outside tenure): set aside, failed with %r",
                        entry.shown_key, UNREADABLE_ROW_ERROR, extra={"job_id": entry.shown_key})
        for entry in claim.passed:
            log.warning("job %s could not be read and could not be set aside (changed meanwhile): passed over",
                        entry.shown_key, extra={"job_id": entry.shown_key})

    def _served(self, queue_names: Sequence[str] | None) -> list[str] | None:
        """The task queues a claim serves, checked: a task claim must name at least one
        queue (each an identifier); other queues' claims name none."""
        if self.queue is not QueueKind.TASK:
            if queue_names is not None:
                raise ConfigValidationError("invalid_queue_names", fields=("queue_names",), problems=("tasks_only",))
            return None
        names = list(queue_names) if queue_names is not None and not isinstance(queue_names, str) else None
        if not names or not all(is_queue_name(name) for name in names):
            raise ConfigValidationError("invalid_queue_names", fields=("queue_names",),
                                        problems=("identifiers_required",))
        return list(dict.fromkeys(names))

    async def recover_owned(self, owner_id: str, claim_token: str) -> QueueRow | None:
        async def body(tx: Transaction) -> Decision:
            found = await tx.locked(self.binding, finders.by_token, {"claim_token": claim_token})
            met = found[0] if found else None
            return QUEUE.decide(met, RecoverOwned(owner_id=owner_id, claim_token=claim_token), await tx.now_us())

        decision = await self.store.run(body, write=False)
        if isinstance(decision, Refused):
            return None
        return decision.new_record

    # --- writes to rows by ID ---------------------------------------------------------

    async def _on_rows(self, items: Sequence[tuple[str, Command]], *, write: bool = True) -> list[Decision]:
        return await self.engine.on_keys(self.binding, items, finders.by_keys, write=write)

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
        self, fence: QueueClaimFence, error: str, *, retry: bool, dlq_record_id: str | None,
        backoff: tuple[int, int, int] | None = None,
    ) -> JobStatus | None:
        """The job's status after the failure (pending: sent back for a retry; failed:
        finished), or None when the fenced write was refused. ``backoff``: ``(base_ms,
        max_ms, jitter_per_mille)`` instead of the config's backoff (a task's own policy)."""
        base_ms, max_ms, jitter = (self.config.backoff_base_ms, self.config.backoff_max_ms, 0) if backoff is None \
            else backoff
        command = FailOwned(
            fence=ClaimFence.of(fence),
            error_message=error,
            retry=retry,
            dlq_record_id=dlq_record_id,
            backoff_base_ms=base_ms,
            backoff_max_ms=max_ms,
            jitter_per_mille=jitter,
        )
        decision = await self._on_row(fence.job_id, command)
        if not isinstance(decision, Applied):
            return None
        record = decision.new_record
        require(record is not None)
        assert record is not None
        return record.status  # type: ignore[no-any-return]

    async def progress_owned(self, fence: QueueClaimFence, progress_json: str) -> bool:
        """Record a task's progress report on its live claim (fenced)."""
        command = ProgressOwned(fence=ClaimFence.of(fence), progress_json=progress_json)
        return isinstance(await self._on_row(fence.job_id, command), Applied)

    async def set_pid_owned(self, fence: QueueClaimFence, pid: int) -> bool:
        return isinstance(await self._on_row(fence.job_id, SetPidOwned(fence=ClaimFence.of(fence), pid=pid)), Applied)

    async def read_state_owned(self, fence: QueueClaimFence) -> StreamingStateReply | None:
        decision = await self._on_row(fence.job_id, ReadStateOwned(fence=ClaimFence.of(fence)), write=False)
        if isinstance(decision, Applied):
            require(isinstance(decision.reply, StreamingStateReply))
            return decision.reply  # type: ignore[no-any-return]
        return None

    async def acknowledge_cancel_owned(self, fence: QueueClaimFence) -> bool:
        decision = await self._on_row(fence.job_id, AcknowledgeCancelOwned(fence=ClaimFence.of(fence)))
        return isinstance(decision, Applied)

    async def release_owned(self, fences: Sequence[QueueClaimFence], *, delay_us: int = 0) -> list[bool]:
        """Give each claim back (its attempt returned), due at once or ``delay_us`` after
        the database time."""
        decisions = await self._on_rows([(fence.job_id, ReleaseOwned(fence=ClaimFence.of(fence), delay_us=delay_us))
                                         for fence in fences])
        return [isinstance(decision, Applied) for decision in decisions]

    async def request_cancel(self, job_id: str) -> bool:
        return isinstance(await self._on_row(job_id, RequestCancel()), Applied)

    async def cancel_admin(self, job_id: str) -> bool:
        return isinstance(await self._on_row(job_id, CancelAdmin()), Applied)

    async def retry_failed(self, job_id: str) -> bool:
        return isinstance(await self._on_row(job_id, RetryFailed()), Applied)

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

    async def purge_finished(self, older_than_us: int, status: JobStatus | None = None) -> int:
        """Delete unprotected finished rows (of ``status`` only, if given) that finished
        more than ``older_than_us`` ago. A row the finder selects but tenure cannot read
        (written outside tenure) is deleted too, by its stored key: the database itself
        read it as finished, unprotected and past the cutoff, and retention must not stop
        at it (specs/queue.md, "Rows tenure cannot read"); each is logged with its ID."""
        binding = self.binding
        finder = finders.finished_before if status is None else finders.finished_before_with_status
        chosen = {} if status is None else {"status": status}

        async def body(tx: Transaction) -> tuple[int, list[Unreadable]]:
            now = await tx.now_us()
            command = PurgeFinished(older_than_us=now - older_than_us)
            parameters = {**chosen, "cutoff": command.older_than_us}
            found = await tx.find_or_unreadable(binding, finder, parameters, PURGE_LIMIT)
            rows = [row for row in found if not isinstance(row, Unreadable)]
            _, changes = self.engine.decide_all(binding, [(row, command) for row in rows], now)
            await self.engine.persist(tx, binding, changes)
            # The retention finder is the guard of each delete: the database's own reading
            # of the row, never a decoded record.
            unreadable = [row for row in found if isinstance(row, Unreadable)
                          and await tx.delete_unreadable(binding, row.key, finder, parameters)]
            return len(changes) + len(unreadable), unreadable

        purged, unreadable = await self.store.run(body, write=True)
        for row in unreadable:
            log.warning("job %s could not be read (written outside tenure): purged as a finished row",
                        row.shown_key, extra={"job_id": row.shown_key})
        return purged

    # --- reads ------------------------------------------------------------------------

    async def get(self, job_id: str) -> QueueRow | None:
        found = await self.get_many([job_id])
        return found[0] if found else None

    async def get_many(self, job_ids: Sequence[str]) -> list[QueueRow]:
        """The rows of these IDs that exist, in one read (a worker's cancel watch, :meth:`get`)."""
        async def body(tx: Transaction) -> list[QueueRow]:
            return await tx.read(self.binding, list(job_ids))

        found: list[QueueRow] = await self.store.run(body, write=False)
        return found

    async def get_or_unreadable(self, job_id: str) -> QueueRow | Unreadable | None:
        """:meth:`get`, a row tenure cannot read answered as an ``Unreadable`` (operator tools)."""
        async def body(tx: Transaction) -> list[QueueRow | Unreadable]:
            return await tx.read_or_unreadable(self.binding, [job_id])

        found = await self.store.run(body, write=False)
        return found[0] if found else None

    async def list_or_unreadable(self, status: JobStatus | None, limit: int, *, queue_name: str | None = None,
                                 task_name: str | None = None, newest_first: bool = False,
                                 ) -> list[QueueRow | Unreadable]:
        """:meth:`list`, a row tenure cannot read answered as an ``Unreadable`` in its
        place (operator tools: one such row stops no listing)."""
        return await self._listed(status, limit, queue_name, task_name, newest_first, unreadable=True)

    async def _listed(self, status: JobStatus | None, limit: int, queue_name: str | None, task_name: str | None,
                      newest_first: bool, *, unreadable: bool) -> list[Any]:
        wanted = {"status": status, "queue_name": queue_name, "task_name": task_name}
        parameters = {field: value for field, value in wanted.items() if value is not None}
        finder = finders.listed(**{field: True for field in parameters}, newest_first=newest_first)

        async def body(tx: Transaction) -> list[Any]:
            if unreadable:
                return await tx.find_or_unreadable(self.binding, finder, parameters, limit)
            return await tx.find(self.binding, finder, parameters, limit)

        return await self.store.run(body, write=False)

    async def list(self, status: JobStatus | None, limit: int, *, queue_name: str | None = None,
                   task_name: str | None = None, newest_first: bool = False) -> list[QueueRow]:
        """Rows in creation order, or the reverse (tasks: optionally of one task queue and
        one task name)."""
        return await self._listed(status, limit, queue_name, task_name, newest_first, unreadable=False)


def _presented(claimed: Sequence[QueueRow], present: Callable[[QueueRow], Presented]) -> tuple[list[Presented], list[QueueRow]]:
    """Each claimed record as the caller gets it, and the records whose envelope cannot be
    read (``corrupt_row``), apart."""
    presented: list[Presented] = []
    unreadable: list[QueueRow] = []
    for record in claimed:
        try:
            presented.append(present(record))
        except TenureError as error:
            if error.reason != "corrupt_row":
                raise
            unreadable.append(record)
    return presented, unreadable


SET_ASIDE_ROUNDS = 8
"""How many times one claim transaction picks candidates again after meeting rows it
could not read (each round sets those aside and claims the readable ones); past that
it returns what it claimed, and the next claim goes on (a Worker claims again at once
when a claim set rows aside)."""


def _key_of(entry: QueueRow | Unreadable) -> Any:
    return entry.key if isinstance(entry, Unreadable) else entry.job_id


def _unreadable(record: QueueRow) -> Unreadable:
    """A readable row the kernel cannot move (its decision would break the record
    invariants), as the claim sets it aside."""
    return Unreadable(record.job_id, {field.name: getattr(record, field.name) for field in dataclasses.fields(record)})


class _Claim:
    """One claim call: which rows it picks, the kernel's claim of each, and the rows it
    could not read, set aside (:data:`~tenure.kernel.queue.machine.SET_ASIDE`, in the
    claim's own transaction, or in one right after the statement of a store that claims
    ahead) or passed over (the set-aside found the row changed). A row it cannot read is
    never handed out and never fails the claim as a whole."""

    def __init__(self, operations: QueueOperations, owner_id: str, tokens: tuple[str, ...], owned: bool,
                 served: tuple[str, ...] | None, eligible: Finder, claimable: Finder, chosen: dict[str, Any]) -> None:
        self.operations, self.binding = operations, operations.binding
        self.owner_id, self.tokens, self.owned, self.served = owner_id, tokens, owned, served
        self.eligible, self.claimable, self.chosen = eligible, claimable, chosen
        self.lease_us = operations.config.lease_us
        self.set_aside: list[Unreadable] = []
        self.passed: list[Unreadable] = []

    def command_for(self, token: str, stored_tokens: Sequence[str | None]) -> Command:
        if self.owned:
            return ClaimOwned(owner_id=self.owner_id, claim_token=token, nonce_already_stored=token in stored_tokens,
                              lease_us=self.lease_us, queue_names=self.served)
        return ClaimLegacy(owner_id=self.owner_id, lease_us=self.lease_us, queue_names=self.served)

    def claims_of(self, pairs: Sequence[tuple[QueueRow | None, str]], stored_tokens: Sequence[str | None], now: int,
                  ) -> tuple[list[tuple[QueueRow, QueueRow]], set[int], list[QueueRow]]:
        """The kernel's claim of each ``(candidate, token)``; the indexes of the pairs
        claimed; the candidates whose claim would break the record invariants (to set
        aside). A refused pair claims nothing (its nonce stays unused)."""
        binding = self.binding
        claims: list[tuple[QueueRow, QueueRow]] = []
        used: set[int] = set()
        unmovable: list[QueueRow] = []
        for index, (met, token) in enumerate(pairs):
            decision = QUEUE.decide(met, self.command_for(token, stored_tokens), now)
            raise_if_conflict(binding, decision)
            if isinstance(decision, Refused):
                continue  # no eligible row for this token
            try:
                claimed = checked(binding, met, decision)
            except TenureError as error:
                if error.reason != "invariant_broken" or met is None:
                    raise
                unmovable.append(met)
                continue
            require(met is not None and claimed is not None)
            claims.append((met, claimed))  # type: ignore[arg-type]
            used.add(index)
        return claims, used, unmovable

    def verified(self, claims: Sequence[tuple[QueueRow, QueueRow]], stored: Sequence[QueueRow]) -> list[QueueRow]:
        if len(stored) != len(claims):
            raise persistence_failed("read_back_mismatch")
        for (_, decided), found in zip(claims, stored, strict=True):
            # The identity must read back exactly: a coercion or a trigger that changed
            # the owner, token or generation rolls the whole claim back.
            if self.owned and claim_identity_problem(decided, found.owner_id, found.claim_token, found.generation):
                raise TenureError(ErrorCode.QUEUE_CLAIM_CONFLICT, "claim_identity_changed")
            if found != decided:
                raise persistence_failed("read_back_mismatch")
        return list(stored)

    async def put_aside(self, tx: Transaction, entries: Sequence[QueueRow | Unreadable]) -> list[QueueRow]:
        """Set aside every ``Unreadable`` among ``entries`` (without reading it); the
        records, in order."""
        records: list[QueueRow] = []
        for entry in entries:
            if not isinstance(entry, Unreadable):
                records.append(entry)
            elif await tx.set_aside(self.binding, entry.key, SET_ASIDE, finders.set_aside_guard):
                self.set_aside.append(entry)
            else:
                self.passed.append(entry)
        return records

    async def in_one_statement(self) -> list[QueueRow] | None:
        """The claim in one statement, or None (nothing kept: the transaction decides)."""
        operations, binding = self.operations, self.binding
        if operations.engine.statements is None:
            return None  # a store without decided-ahead statements: the transaction claims
        # One statement: the clock, the pick (SKIP LOCKED) and the kernel's claim
        # rewrite, written only when no expired claim waits to be settled, no token is
        # stored already and every picked row is one the claim rule takes
        # (``claimable``), with every written value verified in SQL (anything else
        # aborts it, and the transaction explains why). The kernel then decides the same
        # claims on the picked rows: the statement wrote exactly them.
        blockers = [Probe(finders.expired, {}, "exists", limit=1)]
        if self.owned:
            blockers.append(Probe(finders.tokens_stored, {"tokens": list(self.tokens)}, "exists", limit=1))
        try:
            picked = await operations.engine.claim_ahead(
                binding, Probe(self.eligible, self.chosen, "rows", limit=len(self.tokens)), self.claimable, blockers,
                CLAIM_OWNED_REWRITE if self.owned else CLAIM_LEGACY_REWRITE,
                [self.command_for(token, ()) for token in self.tokens], self.chosen,
            )
        except TenureError as error:
            if error.reason != "read_back_mismatch":
                raise
            return None  # kept nothing
        if picked is None or not picked.went:
            return None
        if len(picked.written) != len(picked.picked):
            raise persistence_failed("read_back_mismatch")
        stored = await self.settle_ahead(picked.picked, picked.written, picked.now_us)
        operations.engine.remember(binding, stored, picked.versions)
        operations.engine.observe(picked.now_us)
        return stored

    async def settle_ahead(self, picked: Sequence[QueueRow | Unreadable], written: Sequence[QueueRow | Unreadable],
                           now: int) -> list[QueueRow]:
        """The statement claimed every picked row, row ``i`` with token ``i``: the
        readable ones must read back as the kernel claims them; the others (a row it
        cannot read, or one whose claim breaks the invariants) are set aside now, their
        nonces spent."""
        pairs = [(row, token) for row, token in zip(picked, self.tokens) if not isinstance(row, Unreadable)]
        indexes = [index for index, row in enumerate(picked) if not isinstance(row, Unreadable)]
        claims, used, unmovable = self.claims_of(pairs, (), now)
        moved = {record.job_id for record in unmovable}
        if len(used) + len(moved) != len(pairs):
            raise persistence_failed("read_back_mismatch")  # it wrote a row the kernel refused
        stored = self.verified(claims, [written[indexes[position]] for position in sorted(used)])  # type: ignore[misc]
        aside = [row if isinstance(row, Unreadable) else _unreadable(row)
                 for index, row in enumerate(written)
                 if isinstance(picked[index], Unreadable) or _key_of(picked[index]) in moved]
        if aside:

            async def body(tx: Transaction) -> None:
                await self.put_aside(tx, aside)

            kept = len(self.set_aside), len(self.passed)
            try:
                await self.operations.store.run(body, write=True)
            except TenureError:  # left claimed: its lease runs out, and the sweep meets it
                del self.set_aside[kept[0]:], self.passed[kept[1]:]
        return stored

    async def body(self, tx: Transaction) -> list[QueueRow]:
        """The reference claim transaction. The clock is read first because eligibility
        depends on it; candidates are locked with SKIP LOCKED, which never waits, so no
        lock wait separates reading the clock from deciding."""
        binding, limit = self.binding, len(self.tokens)
        sweep_needed, stored_tokens, candidates = await tx.snapshot(binding, [
            Probe(finders.expired, {}, "exists", limit=1),
            Probe(finders.tokens_stored, {"tokens": list(self.tokens) if self.owned else []}, "values",
                  field="claim_token"),
            Probe(self.eligible, self.chosen, "rows", limit=limit),
        ])
        now = await tx.now_us()
        if sweep_needed:
            # Settle expired claims first, so an expired row is eligible again (or
            # finished) within this claim, then pick the candidates again. (Rows picked
            # with the snapshot stay locked meanwhile; they may not be the ones to claim.)
            await self.sweep(tx, now)
            candidates = await tx.find_or_unreadable(binding, self.eligible, {**self.chosen, "now": now}, limit)
        stored: list[QueueRow] = []
        tokens = list(self.tokens)
        for _ in range(SET_ASIDE_ROUNDS):
            passed = {_key_of(entry) for entry in self.passed}
            fresh = [entry for entry in candidates if _key_of(entry) not in passed]
            readable = await self.put_aside(tx, fresh)
            pairs = [(readable[index] if index < len(readable) else None, token) for index, token in enumerate(tokens)]
            claims, used, unmovable = self.claims_of(pairs, stored_tokens, now)
            await self.put_aside(tx, [_unreadable(record) for record in unmovable])
            if claims:
                stored += self.verified(claims, await tx.update_many(binding, claims, read_back=True))
            tokens = [token for index, token in enumerate(tokens) if index not in used]
            if not tokens or (len(readable) == len(fresh) and not unmovable):
                break  # nothing unreadable met: the candidates were all there is
            # Rows were set aside: pick again, past the ones passed over.
            candidates = await tx.find_or_unreadable(binding, self.eligible, {**self.chosen, "now": now},
                                                     len(tokens) + len(self.passed))
        return stored

    async def sweep(self, tx: Transaction, now: int) -> None:
        """Settle up to :data:`SWEEP_LIMIT` expired claims (``expire_lease``), setting
        aside those it cannot read or move."""
        binding, engine = self.binding, self.operations.engine
        expired = await self.put_aside(tx, await tx.find_or_unreadable(binding, finders.expired, {"now": now},
                                                                        SWEEP_LIMIT))
        changes: list[tuple[Any, Any]] = []
        unmovable: list[QueueRow] = []
        for record in expired:
            try:
                changes += engine.decide_all(binding, [(record, ExpireLease())], now)[1]
            except TenureError as error:
                if error.reason != "invariant_broken":
                    raise
                unmovable.append(record)
        await self.put_aside(tx, [_unreadable(record) for record in unmovable])
        await engine.persist(tx, binding, changes)
