"""The public job sources: validation, pipeline and streaming queues, and tasks, on SQLite or PostgreSQL.

A source checks every request at the boundary (``ConfigValidationError`` for anything
invalid, before any database work), hands the engine plain values, and turns the
kernel's answer into the documented return: True when the exact write applied, False
(or None) for a known refusal, a ``TenureError`` for a conflict or a persistence failure.

``submit_owned`` validates and snapshots its request synchronously, before returning the
awaitable: mutating the request's dictionaries after the call changes nothing.
Constructing a source neither connects to nor migrates the database (see
:func:`tenure.adapters.upgrade`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from tenure.kernel.queue.record import QueueRow, cancelled_while_claimed
from tenure.model import (
    ClaimedJob,
    ClaimedPipelineJob,
    ClaimedStreamingJob,
    ClaimedTask,
    ErrorCode,
    JobInfo,
    JobState,
    JobStatus,
    OwnedStreamingState,
    QueueClaimFence,
    QueueKind,
    TaskJob,
    TenureError,
    WorkerConfig,
    bounds,
    canonical_json,
    check_pid,
    freeze_envelope,
    json_problem,
    snapshot_submission,
    text_problem,
)
from tenure.model.validation import backoff_seconds, is_queue_name, micros_to_datetime, refuse

from ..core.facade import Facade
from ..core.failures import persistence_failed
from ..core.tables import Unreadable, json_column
from ..wiring.dialects import open_store
from .operations import QueueOperations
from .presence import WorkerPresence, WorkerView, list_workers
from .table import envelope_of

__all__ = ["ValidationJobSource", "PipelineJobSource", "StreamingJobSource", "TaskSource", "JobSource"]


Claimed = TypeVar("Claimed", ClaimedJob, ClaimedPipelineJob, ClaimedStreamingJob, ClaimedTask)



def _text(value: object, field: str, max_chars: int) -> str:
    if type(value) is not str:
        raise refuse(field, "string_required")
    if not value:
        raise refuse(field, "string_empty")
    if len(value) > max_chars:
        raise refuse(field, "string_too_long")
    problem = text_problem(value)
    if problem is not None:
        raise refuse(field, problem)
    return value


def _identity(value: object, field: str) -> str:
    return _text(value, field, bounds.MAX_IDENTITY_CHARS)


def _job_id(value: object) -> str:
    return _text(value, "job_id", bounds.MAX_JOB_ID_CHARS)


def _fence(value: object) -> QueueClaimFence:
    if type(value) is not QueueClaimFence:
        raise refuse("fence", "queue_claim_fence_required")
    return value


def _bool(value: object, field: str) -> bool:
    if type(value) is not bool:
        raise refuse(field, "boolean_required")
    return value


def _within(text: str, max_bytes: int, field: str) -> str:
    """``text`` if its UTF-8 encoding fits ``max_bytes`` (WorkerConfig.max_payload_bytes)."""
    # A character takes at most 4 bytes: most texts are cleared without encoding them.
    if len(text) * 4 > max_bytes and len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise refuse(field, "payload_too_large")
    return text


def result_json(result: object, max_bytes: int, *, any_value: bool = False) -> str | None:
    """A result's stored text: a JSON object of finite built-in values (pycharter's
    ``dict``), or with ``any_value`` (a task's result) any such JSON value: a string, a
    number, a boolean, an array. None stores no result. (A bare number keeps its text on
    SQLite too: the codec stores it as a BLOB, which no column affinity converts.)"""
    if result is None:
        return None
    if type(result) is not dict and not any_value:
        raise refuse("result", "json_object_required")
    problem = json_problem(result)
    if problem is not None:
        raise refuse("result", problem)
    return _within(canonical_json(result), max_bytes, "result")


def _error_text(error: object, max_bytes: int) -> str:
    if type(error) is not str:
        raise refuse("error", "string_required")
    problem = text_problem(error)
    if problem is not None:
        raise refuse("error", problem)
    return _within(error, max_bytes, "error")


def _dlq_record_id(value: object) -> str | None:
    if value is None:
        return None
    return _text(value, "dlq_record_id", bounds.MAX_DLQ_ID_CHARS)


def _backoff(policy: object, jitter_per_mille: object) -> tuple[int, int, int] | None:
    """A task's retry policy as the kernel's backoff inputs (None: the config's)."""
    if policy is None:
        return None
    if type(policy) is not tuple or len(policy) != 3:
        raise refuse("policy", "retry_policy_required")
    base_ms, max_ms, jitter = policy
    for value in (base_ms, max_ms):
        if not bounds.is_strict_int(value) or not 0 <= value <= bounds.MAX_BACKOFF_MS:
            raise refuse("policy", "integer_out_of_range")
    if base_ms > max_ms:
        raise refuse("policy", "base_above_max")
    if not bounds.is_strict_int(jitter_per_mille) or not 0 <= jitter_per_mille <= 500:  # type: ignore[operator]
        raise refuse("jitter_per_mille", "integer_out_of_range")
    return base_ms, max_ms, jitter_per_mille if _bool(jitter, "policy") else 0  # type: ignore[return-value]


MAX_BATCH = 1000
"""The most items one batched call accepts."""

MAX_RETENTION = dt.timedelta(days=100 * 366)
"""The longest ``purge_finished`` age (a century keeps every cutoff a 64-bit instant)."""


def _release_delay_us(delay_s: object) -> int:
    """A release's delay in whole microseconds (0 to the longest backoff, 366 days)."""
    return min(round(backoff_seconds(delay_s, "delay_s") * 1_000_000), bounds.MAX_BACKOFF_MS * 1000)


def _batch(items: object, field: str, *, allow_empty: bool = False) -> list[Any]:
    if not isinstance(items, (list, tuple)) or type(items) not in (list, tuple):
        raise refuse(field, "list_required")
    if not allow_empty and not items:
        raise refuse(field, "list_empty")
    if len(items) > MAX_BATCH:
        raise refuse(field, "list_too_long")
    return list(items)




class JobSource(Facade, Generic[Claimed]):
    """What the three sources share. Use the concrete classes.

    A source is a facade on the shared shell (:class:`~tenure.adapters.core.facade.Facade`:
    ``close``, ``async with``, the store); its own code is the store's
    (``QUEUE_PERSISTENCE_FAILED``), so its error boundary changes nothing."""

    persistence_code = ErrorCode.QUEUE_PERSISTENCE_FAILED
    queue: ClassVar[QueueKind]
    _claimed_type: ClassVar[type[Any]]

    def __init__(self, db_url: str, config: WorkerConfig | None = None, **operations: Any) -> None:
        """``operations``: what the queue operations take beyond the store, of which the
        ID factories ``new_job_id`` and ``new_run_id`` (each a callable returning the next
        ID; default random UUIDs, time-ordered IDs for tasks) are the adapters' test seam
        (``docs/testing.md``): a proof names the IDs its model expects."""
        if config is None:
            config = WorkerConfig(db_url)
        elif type(config) is not WorkerConfig:
            raise refuse("config", "worker_config_required")
        elif config.db_url != db_url:
            raise refuse("config", "db_url_mismatch")
        self.config = config
        store = open_store(db_url, timeout_seconds=config.timeout_seconds, schema=config.db_schema)
        self._operations = QueueOperations(store, self.queue, config, **operations)
        self._on(self._operations.engine)

    @property
    def operations(self) -> QueueOperations:
        """The queue operations this source runs on (the worker listens on their store)."""
        return self._operations

    # --- owned submission ---------------------------------------------------------------

    def submit_owned(self, job: Any, *, submission_id: str) -> Awaitable[str]:
        """Submit one original request under a caller-known ``submission_id``.

        Returns (an awaitable of) the job ID (pipeline: the run ID). An exact replay
        returns the original ID in any status; changed content under the same
        submission ID raises ``QUEUE_SUBMISSION_CONFLICT``. The request is validated and
        frozen before this method returns.
        """
        snapshot = snapshot_submission(self.queue, job, submission_id)
        _within(snapshot.authored_json, self.config.max_payload_bytes, "job")
        return self._submit_owned(snapshot)

    async def _submit_owned(self, snapshot: Any) -> str:
        submitted = await self._operations.submit_owned(snapshot)
        return self._returned_id(submitted.job_id, submitted.run_id)

    results_any_json = False
    """Whether a result may be any JSON value (tasks) or only an object (pycharter's queues)."""

    def result_text(self, result: object) -> str | None:
        """``result`` as a completion stores it (see :func:`result_json`: a JSON object,
        any JSON value for tasks, or None), else ``ConfigValidationError`` naming
        ``result``."""
        return result_json(result, self.config.max_payload_bytes, any_value=self.results_any_json)

    def _returned_id(self, job_id: str, run_id: str | None) -> str:
        return job_id

    # --- owned claims -------------------------------------------------------------------

    async def _claim_next_owned(self, owner_id: object, claim_token: object, queues: object = None) -> Claimed | None:
        owner = _identity(owner_id, "owner_id")
        token = _identity(claim_token, "claim_token")
        claimed = await self._operations.claim_owned(owner, [token], self.claimed_view, self._queues(queues))
        return claimed[0] if claimed else None

    async def _claim_batch_owned(self, owner_id: object, claim_tokens: object, queues: object = None) -> list[Claimed]:
        owner = _identity(owner_id, "owner_id")
        tokens = _batch(claim_tokens, "claim_tokens")
        checked = [_identity(token, "claim_tokens") for token in tokens]
        if len(set(checked)) != len(checked):
            raise refuse("claim_tokens", "duplicate_claim_token")
        return await self._operations.claim_owned(owner, checked, self.claimed_view, self._queues(queues))

    def _queues(self, queues: object) -> list[str] | None:
        """The task queues a claim serves (tasks only; checked by the operations)."""
        if queues is None:
            return None
        return _batch(queues, "queues")

    async def _recover_owned_claim(self, owner_id: object, claim_token: object) -> Claimed | None:
        owner = _identity(owner_id, "owner_id")
        token = _identity(claim_token, "claim_token")
        record = await self._operations.recover_owned(owner, token)
        return None if record is None else self.claimed_view(record)

    def claimed_view(self, record: QueueRow) -> Claimed:
        """The claim this source answers for a stored row (what a claim, a recovery or a
        legacy claim of that row returns). Part of the adapters' test seam
        (``docs/testing.md``): a proof turns the row its model expects into the reply it
        expects."""
        fence = None
        if record.claim_token is not None:
            if record.owner_id is None:  # INV-Q7: only a row written outside tenure
                raise persistence_failed("corrupt_row")
            fence = QueueClaimFence(
                record.queue, record.job_id, record.owner_id, record.generation, record.claim_token
            )
        fields: dict[str, Any] = dict(
            job_id=record.job_id,
            attempt=record.attempts,
            job=envelope_of(record),
            claim_fence=fence,
            due_at_us=record.fires_at_us,
            claimed_at_us=record.claimed_at_us,
        )
        if record.queue is QueueKind.PIPELINE:
            fields["run_id"] = record.run_id
        return self._claimed_type(**fields)  # type: ignore[no-any-return]

    def presence(self, worker_id: str, *, queues: Sequence[str], tasks: Sequence[str],
                 concurrency: int) -> WorkerPresence:
        """A worker's record of itself on this source's database (``tenure workers``)."""
        return WorkerPresence(self._operations.store, worker_id=worker_id, queues=queues, tasks=tasks,
                              concurrency=concurrency)

    async def workers(self) -> list[WorkerView]:
        """Every worker that recorded itself on this database, live ones first (see
        :mod:`tenure.adapters.queue.presence`)."""
        return await list_workers(self._operations.store)

    async def cancelled_claims(self, fences: Sequence[QueueClaimFence]) -> list[QueueClaimFence]:
        """The claims among these that a cancel ended (the row is CANCELLED at the claim's
        own generation: ``tenure jobs cancel``, the console, the API), in one read by
        primary key. Matched claim by claim: a stale claim and a newer claim of the same
        job are told apart by their generations. A worker's cancel watch asks this about
        its claims in flight; a claim taken over is the heartbeat's to find."""
        checked = [_fence(fence) for fence in fences]
        if not checked:
            return []
        rows = {row.job_id: row for row in await self._operations.get_many(sorted({f.job_id for f in checked}))}
        return [fence for fence in checked
                if fence.job_id in rows and cancelled_while_claimed(rows[fence.job_id], fence.generation)]

    # --- fenced writes ------------------------------------------------------------------

    async def heartbeat_owned(self, fence: QueueClaimFence) -> bool:
        """Renew the exact current live claim. False: missing, stale, expired or finished."""
        return (await self._operations.heartbeat_owned([_fence(fence)]))[0]

    async def complete_owned(self, fence: QueueClaimFence, result: Any = None) -> bool:
        """Complete the exact current live claim with a JSON ``result``. A repeat returns False."""
        checked = _fence(fence)
        return (await self._operations.complete_owned([(checked, self.result_text(result))]))[0]

    async def heartbeat_many_owned(self, fences: Sequence[QueueClaimFence]) -> list[bool]:
        """``heartbeat_owned`` for each fence, in one transaction: one answer per fence,
        in order, each exactly what the single call would answer (a stale fence refuses
        only itself)."""
        checked = [_fence(fence) for fence in _batch(fences, "fences", allow_empty=True)]
        return await self._operations.heartbeat_owned(checked) if checked else []

    async def complete_many_owned(self, items: Sequence[tuple[QueueClaimFence, Any]]) -> list[bool]:
        """``complete_owned`` for each ``(fence, result)``, in one transaction and in order:
        one answer per item, each exactly what the single call would answer."""
        checked = []
        for item in _batch(items, "items", allow_empty=True):
            if type(item) is not tuple or len(item) != 2:
                raise refuse("items", "fence_result_pair_required")
            checked.append((_fence(item[0]), self.result_text(item[1])))
        return await self._operations.complete_owned(checked) if checked else []

    async def release_owned(self, fence: QueueClaimFence, *, delay_s: float = 0) -> bool:
        """Give the exact current live claim back unfinished: the job is pending again at
        once, in its place, and the attempt the claim spent is returned (a worker that
        stops a handler at shutdown); with ``delay_s``, due that many seconds after the
        database time instead (a worker that cannot run it gives it to another one).
        False: missing, stale, expired or finished, or a launch with a cancel request
        (acknowledge it instead)."""
        delay_us = _release_delay_us(delay_s)
        return (await self._operations.release_owned([_fence(fence)], delay_us=delay_us))[0]

    async def release_many_owned(self, fences: Sequence[QueueClaimFence], *, delay_s: float = 0) -> list[bool]:
        """``release_owned`` for each fence, in one transaction: one answer per fence, in
        order, each exactly what the single call would answer."""
        delay_us = _release_delay_us(delay_s)
        checked = [_fence(fence) for fence in _batch(fences, "fences", allow_empty=True)]
        return await self._operations.release_owned(checked, delay_us=delay_us) if checked else []

    async def fail_owned_status(
        self, fence: QueueClaimFence, error: str, *, retry: bool, dlq_record_id: str | None = None,
        policy: tuple[int, int, bool] | None = None, jitter_per_mille: int = 0,
    ) -> JobStatus | None:
        """``fail_owned``, answering the job's status after it (pending: sent back for a
        retry; failed: finished) or None when refused. The worker counts retries by it
        (the boolean ``fail_owned`` is what applications call). ``policy``: a task's
        ``(retry_base_ms, retry_max_ms, retry_jitter)``, see :meth:`TaskSource.fail_owned`."""
        checked = _fence(fence)
        return await self._operations.fail_owned(
            checked, _error_text(error, self.config.max_payload_bytes), retry=_bool(retry, "retry"),
            dlq_record_id=_dlq_record_id(dlq_record_id), backoff=_backoff(policy, jitter_per_mille),
        )

    # --- legacy, unfenced API -----------------------------------------------------------

    async def submit(self, job: Any) -> str:
        """Legacy submission: no fingerprint, no protection; a repeated idempotency key
        returns the existing ID without comparing content (legacy semantics)."""
        frozen = freeze_envelope(self.queue, job)
        _within(frozen.authored_json, self.config.max_payload_bytes, "job")
        submitted = await self._operations.submit_legacy(frozen)
        return self._returned_id(submitted.job_id, submitted.run_id)

    async def _claim_next(self, owner_id: object) -> Claimed | None:
        return await self._operations.claim_legacy(_identity(owner_id, "owner_id"), self.claimed_view)

    async def heartbeat(self, job_id: str, worker_id: str) -> bool:
        """Legacy heartbeat by ID and owner; never touches protected or owned work."""
        return await self._operations.heartbeat_legacy(_job_id(job_id), _identity(worker_id, "worker_id"))

    async def complete(self, job_id: str, result: Any = None) -> bool:
        """Legacy completion by ID; never touches protected or owned work."""
        checked = _job_id(job_id)
        return await self._operations.complete_legacy(checked, self.result_text(result))

    async def get_job(self, job_id: str) -> JobInfo | None:
        """The job's current state (never its claim token), or None."""
        record = await self._operations.get(_job_id(job_id))
        return None if record is None else _info(record)

    async def list_jobs(self, status: JobStatus | None = None, limit: int = 100) -> list[JobInfo]:
        """Jobs in creation order, optionally of one status (never their claim tokens). A
        stored row tenure cannot read raises ``corrupt_row`` (:meth:`list_entries` lists
        it instead)."""
        return await self._list(status, limit)

    async def get_entry(self, job_id: str) -> JobInfo | Unreadable | None:
        """:meth:`get_job` for operator tools: a row tenure cannot read (written outside
        tenure: a column, its envelope or its result out of shape) is answered as an
        :class:`~tenure.adapters.core.tables.Unreadable` (its key and the fields that
        could be read) instead of raising ``corrupt_row``."""
        entry = await self._operations.get_or_unreadable(_job_id(job_id))
        return None if entry is None else info_or_unreadable(entry)

    async def list_entries(self, status: JobStatus | None = None, limit: int = 100) -> list[JobInfo | Unreadable]:
        """:meth:`list_jobs` for operator tools (``tenure jobs list``): each row tenure
        cannot read is an ``Unreadable`` in its place, so one such row hides no other."""
        return await self._list(status, limit, unreadable=True)

    async def _list(self, status: object, limit: object, *, unreadable: bool = False,
                    **filters: Any) -> list[Any]:
        if status is not None and type(status) is not JobStatus:
            raise refuse("status", "job_status_required")
        if not bounds.is_strict_int(limit) or not 1 <= limit <= 10_000:  # type: ignore[operator]
            raise refuse("limit", "integer_out_of_range")
        if unreadable:
            entries = await self._operations.list_or_unreadable(status, limit, **filters)  # type: ignore[arg-type]
            return [info_or_unreadable(entry) for entry in entries]
        return [_info(record) for record in await self._operations.list(status, limit, **filters)]  # type: ignore[arg-type]

    async def purge_finished(self, older_than: dt.timedelta, *, status: JobStatus | None = None) -> int:
        """Retention: delete unprotected finished jobs (of one finished ``status`` only,
        if given) that finished longer ago than ``older_than`` (database time); protected
        submissions are kept. At most 1,000 per call; returns the count."""
        if status is not None and status not in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED):
            raise refuse("status", "finished_status_required")
        if type(older_than) is not dt.timedelta or older_than < dt.timedelta(0):
            raise refuse("older_than", "non_negative_timedelta_required")
        if older_than > MAX_RETENTION:
            raise refuse("older_than", "timedelta_out_of_range")
        micros = (older_than.days * 86_400 + older_than.seconds) * 1_000_000 + older_than.microseconds
        return await self._operations.purge_finished(micros, status)


def info_or_unreadable(entry: QueueRow | Unreadable) -> JobInfo | Unreadable:
    """A stored row as an operator tool shows it: its :class:`JobInfo`, or, when it cannot
    be read (its columns, or its envelope, result or progress), an ``Unreadable``."""
    if isinstance(entry, Unreadable):
        return entry
    try:
        return _info(entry)
    except TenureError as error:
        if error.reason != "corrupt_row":
            raise
    return Unreadable(entry.job_id, {field.name: getattr(entry, field.name) for field in dataclasses.fields(entry)})


def job_state(record: QueueRow) -> JobState:
    """A stored row's :class:`JobState`, read from its columns alone (what it carries,
    envelope, result and progress, is not read here, so a row another client wrote in a
    shape tenure does not read still has its state shown)."""
    fires_at = micros_to_datetime(record.fires_at_us)
    created_at = micros_to_datetime(record.created_at_us)
    assert fires_at is not None and created_at is not None  # the codec reads both as required
    return JobState(
        queue=record.queue,
        job_id=record.job_id,
        run_id=record.run_id,
        status=record.status,
        attempt=record.attempts,
        max_attempts=record.max_attempts,
        generation=record.generation,
        owner_id=record.owner_id,
        protected=record.fence_required,
        submission_id=record.submission_id,
        fires_at=fires_at,
        created_at=created_at,
        claimed_at=micros_to_datetime(record.claimed_at_us),
        lease_expires_at=micros_to_datetime(record.lease_expires_at_us),
        completed_at=micros_to_datetime(record.completed_at_us),
        cancel_requested=record.cancel_requested,
        pid=record.pid,
        error=record.error_message,
        dlq_record_id=record.dlq_record_id,
    )


def _info(record: QueueRow) -> JobInfo:
    state = job_state(record)
    return JobInfo(
        **{field.name: getattr(state, field.name) for field in dataclasses.fields(JobState)},
        result=json_column(record.result_json),  # pycharter stores a missing result as JSON null
        job=envelope_of(record),
        progress=json_column(record.progress_json),
    )


class _FiniteQueueSource(JobSource[Claimed]):
    """Validation and pipeline queues: failures may carry a DLQ correlation ID."""

    async def claim_next_owned(self, worker_id: str, *, claim_token: str) -> Claimed | None:
        """Claim the next eligible job with a fresh caller nonce, or None.

        A nonce already stored raises ``QUEUE_CLAIM_CONFLICT``; after an uncertain
        outcome use :meth:`recover_owned_claim` with the same nonce instead.
        """
        return await self._claim_next_owned(worker_id, claim_token)

    async def recover_owned_claim(self, worker_id: str, *, claim_token: str) -> Claimed | None:
        """The live claim made with this owner and nonce, or None. Never claims or renews."""
        return await self._recover_owned_claim(worker_id, claim_token)

    async def claim_batch_owned(self, worker_id: str, *, claim_tokens: Sequence[str]) -> list[Claimed]:
        """Claim up to ``len(claim_tokens)`` eligible jobs in one transaction: the ``i``-th
        claimed job gets ``claim_tokens[i]`` and its own fence, each decided exactly as a
        single claim. Any token already stored raises ``QUEUE_CLAIM_CONFLICT`` and claims
        nothing; tokens left over (fewer eligible jobs) stay unused."""
        return await self._claim_batch_owned(worker_id, claim_tokens)

    async def fail_owned(
        self, fence: QueueClaimFence, error: str, *, retry: bool, dlq_record_id: str | None = None
    ) -> bool:
        """Fail the exact current live claim: back to pending after the configured backoff
        when ``retry`` and attempts remain, else finished as failed. ``dlq_record_id`` is
        kept as correlation only (no DLQ write happens here)."""
        return await self.fail_owned_status(fence, error, retry=retry, dlq_record_id=dlq_record_id) is not None

    async def claim_next(self, worker_id: str) -> Claimed | None:
        """Legacy claim (no fence); never takes a protected submission."""
        return await self._claim_next(worker_id)

    async def fail(
        self, job_id: str, error: str, *, retry: bool, dlq_record_id: str | None = None
    ) -> bool:
        """Legacy failure by ID; never touches protected or owned work."""
        return await self._operations.fail_legacy(
            _job_id(job_id), _error_text(error, self.config.max_payload_bytes), retry=_bool(retry, "retry"), dlq_record_id=_dlq_record_id(dlq_record_id)
        )

    async def cancel(self, job_id: str) -> bool:
        """Administrative cancel of a pending or claimed job. It voids any live fence
        (the claim's next write returns False) and keeps the submission identity."""
        return await self._operations.cancel_admin(_job_id(job_id))

    async def delete_job(self, job_id: str) -> bool:
        """Delete a job by ID. Protected submissions and owned claims are kept (False)."""
        return await self._operations.delete(_job_id(job_id))

    async def retry_failed(self, job_id: str) -> bool:
        """Administrative retry of a failed job: pending again at once with a fresh attempt
        budget, keeping its ID, submission identity and last error. False when missing or
        not failed (a completed or cancelled job's outcome stands)."""
        return await self._operations.retry_failed(_job_id(job_id))


class ValidationJobSource(_FiniteQueueSource[ClaimedJob]):
    """The validation queue: ``ValidationJob`` in, ``ClaimedJob`` out."""

    queue = QueueKind.VALIDATION
    _claimed_type = ClaimedJob


class PipelineJobSource(_FiniteQueueSource[ClaimedPipelineJob]):
    """The pipeline queue. ``submit_owned`` returns the run ID; fences carry the job ID."""

    queue = QueueKind.PIPELINE
    _claimed_type = ClaimedPipelineJob

    def _returned_id(self, job_id: str, run_id: str | None) -> str:
        assert run_id is not None
        return run_id


class StreamingJobSource(JobSource[ClaimedStreamingJob]):
    """The streaming launch queue: one active launch per ``config_name@config_version``."""

    queue = QueueKind.STREAMING
    _claimed_type = ClaimedStreamingJob

    async def claim_next_owned(self, launcher_id: str, *, claim_token: str) -> ClaimedStreamingJob | None:
        """Claim the next eligible launch with a fresh caller nonce, or None."""
        return await self._claim_next_owned(launcher_id, claim_token)

    async def recover_owned_claim(self, launcher_id: str, *, claim_token: str) -> ClaimedStreamingJob | None:
        """The live claim made with this launcher and nonce, or None (read-only)."""
        return await self._recover_owned_claim(launcher_id, claim_token)

    async def claim_batch_owned(self, launcher_id: str, *, claim_tokens: Sequence[str]) -> list[ClaimedStreamingJob]:
        """Claim up to ``len(claim_tokens)`` launches in one transaction (see the validation
        source's ``claim_batch_owned``)."""
        return await self._claim_batch_owned(launcher_id, claim_tokens)

    async def fail_owned(self, fence: QueueClaimFence, error: str, *, retry: bool) -> bool:
        """Fail the exact current live claim (refused while a cancel request stands)."""
        return await self.fail_owned_status(fence, error, retry=retry) is not None

    async def set_pid_owned(self, fence: QueueClaimFence, pid: int) -> bool:
        """Record the launched process ID (refused while a cancel request stands)."""
        checked = _fence(fence)
        return await self._operations.set_pid_owned(checked, check_pid(pid))

    async def get_owned_state(self, fence: QueueClaimFence) -> OwnedStreamingState | None:
        """A snapshot of the live claim's cancel request and PID, or None when the fence
        is not the current live claim. Not authority for any later action."""
        reply = await self._operations.read_state_owned(_fence(fence))
        return None if reply is None else OwnedStreamingState(reply.cancel_requested, reply.pid)

    async def acknowledge_cancel_owned(self, fence: QueueClaimFence) -> bool:
        """Record that the launch stopped after a cancel request: cancelled, lease and PID
        cleared, active key released. It does not prove the process stopped."""
        return await self._operations.acknowledge_cancel_owned(_fence(fence))

    async def request_cancel(self, job_id: str) -> bool:
        """Administrative: a pending launch is cancelled at once; a claimed one gets a
        cancel request its launcher must acknowledge. False when missing or finished."""
        return await self._operations.request_cancel(_job_id(job_id))

    async def cancel(self, job_id: str) -> bool:
        """The same as :meth:`request_cancel`: a running launch must acknowledge."""
        return await self.request_cancel(job_id)

    async def claim_next(self, launcher_id: str) -> ClaimedStreamingJob | None:
        """Legacy claim (no fence); never takes a protected submission."""
        return await self._claim_next(launcher_id)

    async def fail(self, job_id: str, error: str, *, retry: bool) -> bool:
        """Legacy failure by ID; never touches protected or owned work."""
        return await self._operations.fail_legacy(
            _job_id(job_id), _error_text(error, self.config.max_payload_bytes), retry=_bool(retry, "retry"), dlq_record_id=None
        )

    async def set_pid(self, job_id: str, pid: int) -> bool:
        """Legacy PID write by ID; never touches protected or owned work."""
        return await self._operations.set_pid_legacy(_job_id(job_id), check_pid(pid))

    async def delete_job(self, job_id: str) -> bool:
        """Delete a launch by ID. Protected submissions and owned claims are kept (False)."""
        return await self._operations.delete(_job_id(job_id))



class TaskSource(JobSource[ClaimedTask]):
    """General tasks (``tenure_tasks``): ``TaskJob`` in, ``ClaimedTask`` out.

    The owned API of the other sources, with the task queues named: a claim serves the
    queues it names (at least one) and takes the highest priority first, then the
    earliest due, then the earliest deferred (job IDs are time-ordered). ``submit_owned``
    is replay-safe under its submission ID (and protected from retention); ``submit``
    (no submission ID) is not, and retention may purge it once finished. No legacy claim
    is offered (no other client writes this table); the by-ID writes every source
    inherits (``heartbeat``, ``complete``, ``delete_job``) are decided by the kernel as
    anywhere: never on an owned submission or a claim made with a token.
    """

    queue = QueueKind.TASK
    _claimed_type = ClaimedTask
    results_any_json = True
    """A task's result is any JSON value (its handler may return a string, a number, ...)."""

    def __init__(self, db_url: str, config: WorkerConfig | None = None, **operations: Any) -> None:
        super().__init__(db_url, config, **{"new_job_id": time_ordered_id, **operations})

    def submit_many(self, jobs: Sequence[TaskJob], *, submission_ids: Sequence[str] | None = None) -> Awaitable[list[str]]:
        """Submit up to 1,000 tasks in one transaction: one answer (the job ID) per task,
        in order, each exactly what ``submit_owned`` (with ``submission_ids[i]``) or
        ``submit`` (without) would answer alone. A conflict raises and writes none of
        them. Every task is validated and frozen before this method returns."""
        return self._submit_many(self._requests(jobs, submission_ids))

    def _requests(self, jobs: object, submission_ids: object) -> list[Any]:
        """Each task validated and frozen now (owned when it has a submission ID)."""
        checked = _batch(jobs, "jobs")
        if submission_ids is None:
            requests: list[Any] = [freeze_envelope(self.queue, job) for job in checked]
        else:
            ids = _batch(submission_ids, "submission_ids")
            if len(ids) != len(checked):
                raise refuse("submission_ids", "one_per_job_required")
            if len(set(ids)) != len(ids):
                raise refuse("submission_ids", "duplicate_submission_id")
            requests = [snapshot_submission(self.queue, job, submission_id) for job, submission_id in zip(checked, ids)]
        for request in requests:
            _within(request.authored_json, self.config.max_payload_bytes, "job")
        return requests

    async def _submit_many(self, requests: list[Any]) -> list[str]:
        return [submitted.job_id for submitted in await self._operations.submit_many(requests)]

    def prepared(self, jobs: Sequence[TaskJob], submission_ids: Sequence[str] | None = None) -> list[Any]:
        """Up to 1,000 tasks validated and frozen for :meth:`write_many` /
        :meth:`write_using` (a caller that validates several batches, then writes them
        together)."""
        return self._requests(jobs, submission_ids)

    async def write_many(self, prepared: list[Any]) -> list[str]:
        """``submit_many`` of tasks :meth:`prepared` already checked: any number of them
        (several prepared batches, concatenated) in one transaction. No two may share a
        submission ID (the caller checks it across its batches)."""
        return await self._submit_many(prepared)

    async def write_using(self, using: Any, prepared: list[Any]) -> list[str]:
        """``submit_using`` of tasks :meth:`prepared` already checked (any number, as
        for :meth:`write_many`)."""
        return await self._submit_using(using, prepared)

    def submit_using(self, using: Any, jobs: Sequence[TaskJob], *,
                     submission_ids: Sequence[str] | None = None) -> Awaitable[list[str]]:
        """``submit_many`` inside the caller's own open transaction (``using``: an asyncpg
        or aiosqlite connection, or a SQLAlchemy ``AsyncConnection`` or ``AsyncSession``
        on either): the tasks commit or roll back with the caller's data, and a worker
        can claim them only once the caller commits. Nothing is retried here: a failed
        statement ends the caller's transaction, which the caller rolls back."""
        requests = self._requests(jobs, submission_ids)
        return self._submit_using(using, requests)

    async def _submit_using(self, using: Any, requests: list[Any]) -> list[str]:
        connection, restore = await driver_connection(using)
        borrowed = self._operations.store.borrowed
        async with (borrowed(connection) if restore is None else borrowed(connection, restore=restore)) as tx:  # type: ignore[call-arg]
            return [submitted.job_id for submitted in await self._operations.submit_many_in(tx, requests)]

    async def claim_next_owned(self, worker_id: str, *, claim_token: str, queues: Sequence[str]) -> ClaimedTask | None:
        """Claim the next eligible task of ``queues`` with a fresh caller nonce, or None."""
        return await self._claim_next_owned(worker_id, claim_token, queues)

    async def claim_batch_owned(
        self, worker_id: str, *, claim_tokens: Sequence[str], queues: Sequence[str]
    ) -> list[ClaimedTask]:
        """Claim up to ``len(claim_tokens)`` tasks of ``queues`` in one transaction (see
        the validation source's ``claim_batch_owned``)."""
        return await self._claim_batch_owned(worker_id, claim_tokens, queues)

    async def recover_owned_claim(self, worker_id: str, *, claim_token: str) -> ClaimedTask | None:
        """The live claim made with this owner and nonce, or None. Never claims or renews."""
        return await self._recover_owned_claim(worker_id, claim_token)

    async def fail_owned(self, fence: QueueClaimFence, error: str, *, retry: bool,
                         policy: tuple[int, int, bool] | None = None, jitter_per_mille: int = 0) -> bool:
        """Fail the exact current live claim: back to pending after the backoff when
        ``retry`` and attempts remain, else failed. ``policy`` is the task's
        ``(retry_base_ms, retry_max_ms, retry_jitter)`` (None: the config's backoff);
        ``jitter_per_mille`` (0..500, drawn by the caller) shortens a jittered delay."""
        return await self.fail_owned_status(fence, error, retry=retry, policy=policy,
                                            jitter_per_mille=jitter_per_mille) is not None

    async def progress_owned(self, fence: QueueClaimFence, progress: Any) -> bool:
        """Record a progress report (a JSON object, bounded like a result) on the exact
        current live claim. False: missing, stale, expired or finished."""
        checked = _fence(fence)
        text = result_json(progress, min(self.config.max_payload_bytes, MAX_PROGRESS_BYTES))
        if text is None:
            raise refuse("progress", "json_object_required")
        return await self._operations.progress_owned(checked, text)

    async def cancel(self, job_id: str) -> bool:
        """Administrative cancel of a pending or claimed task; it voids any live fence."""
        return await self._operations.cancel_admin(_job_id(job_id))

    async def retry_failed(self, job_id: str) -> bool:
        """Administrative retry of a failed task (see the validation source's)."""
        return await self._operations.retry_failed(_job_id(job_id))

    async def list_tasks(self, status: JobStatus | None = None, limit: int = 100, *, queue_name: str | None = None,
                         task_name: str | None = None, newest_first: bool = False) -> list[JobInfo]:
        """Tasks in creation order (``newest_first``: the reverse), optionally of one
        status, task queue and task name (never their claim tokens)."""
        filters = _task_filters(queue_name, task_name, newest_first)
        return await self._list(status, limit, **filters)

    async def list_entries(self, status: JobStatus | None = None, limit: int = 100, *,
                           queue_name: str | None = None, task_name: str | None = None,
                           newest_first: bool = False) -> list[JobInfo | Unreadable]:
        """:meth:`list_tasks` for operator tools (``tenure jobs list``): each row tenure
        cannot read is an ``Unreadable`` in its place, so one such row hides no other."""
        filters = _task_filters(queue_name, task_name, newest_first)
        return await self._list(status, limit, unreadable=True, **filters)

    async def delete_job(self, job_id: str) -> bool:
        """Delete a task by ID. Protected submissions and owned claims are kept (False)."""
        return await self._operations.delete(_job_id(job_id))


def _task_filters(queue_name: object, task_name: object, newest_first: object) -> dict[str, Any]:
    """A task listing's filters, checked."""
    if queue_name is not None and not is_queue_name(queue_name):
        raise refuse("queue_name", "identifier_required")
    if task_name is not None:
        _text(task_name, "task_name", bounds.MAX_TASK_NAME_CHARS)
    return {"queue_name": queue_name, "task_name": task_name, "newest_first": _bool(newest_first, "newest_first")}


async def driver_connection(using: object) -> tuple[Any, Callable[[], Awaitable[None]] | None]:
    """The driver's connection under ``using``, and how to put back the connection's own
    codecs after tenure's statements (None: the store's default): a SQLAlchemy
    ``AsyncSession`` or ``AsyncConnection`` gives the asyncpg or aiosqlite connection it
    runs on (the session's current transaction's), and on asyncpg SQLAlchemy's own JSON
    codec setup; a driver connection is itself. SQLAlchemy is only asked when the object
    is one of its own."""
    module = type(using).__module__
    if not module.startswith("sqlalchemy."):
        return using, None
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(using, AsyncSession):
        using = await using.connection()
    if not isinstance(using, AsyncConnection):
        raise refuse("using", "connection_or_session_required", reason="invalid_using")
    if not using.in_transaction():
        raise refuse("using", "open_transaction_required", reason="invalid_using")
    # SQLAlchemy begins the driver's transaction at its first statement: a deferral that
    # comes first in the caller's transaction makes it begin now (asyncpg's adapter sends
    # BEGIN with it; pysqlite begins only before a write, so SQLite is begun below).
    await using.exec_driver_sql("SELECT 1")
    fairy = await using.get_raw_connection()
    dialect: Any = using.dialect
    adapted = fairy.dbapi_connection
    driver: Any = fairy.driver_connection
    if dialect.name == "sqlite" and not driver.in_transaction:
        await driver.execute("BEGIN")  # the caller's SQLAlchemy transaction, at the driver
    restore = None
    if hasattr(dialect, "setup_asyncpg_json_codec"):
        async def restore() -> None:
            await dialect.setup_asyncpg_json_codec(adapted)
            await dialect.setup_asyncpg_jsonb_codec(adapted)
    return driver, restore


MAX_PROGRESS_BYTES = 64 * 1024
"""A progress report is a small document: at most 64 KiB."""


_last_id = [0]
_id_lock = threading.Lock()


def time_ordered_id() -> str:
    """A UUID-shaped job ID whose first 48 bits are the milliseconds since the epoch and
    whose rest is random, strictly increasing within a process (an ID made in the same
    millisecond as the last is the last plus one), so tasks of equal priority and due time
    are claimed in the order they were deferred (across processes: to the millisecond)."""
    fresh = (time.time_ns() // 1_000_000) << 80 | secrets.randbits(80)
    with _id_lock:
        value = fresh if fresh > _last_id[0] else _last_id[0] + 1
        _last_id[0] = value
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
