"""The lockstep model: the three queues as dictionaries of kernel records.

Each operation is written here again, from the spec's "met row" column, over plain
dictionaries: which row a command meets, in which order rows are swept and claimed,
and what a refusal means to the caller. It shares only the kernel with the adapter.
Every operation runs on a staged copy that becomes the new state only if the operation
succeeds, as a database transaction would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tenure.adapters.queue.table import stored_payload
from tenure.kernel import QUEUE, Applied, Decision, Refused
from tenure.kernel.queue.commands import (
    AcknowledgeCancelOwned,
    CancelAdmin,
    ClaimFence,
    ClaimLegacy,
    ClaimOwned,
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
    SubmitLegacy,
    SubmitOwned,
)
from tenure.kernel.queue.machine import OUTCOMES, QueueRefusal
from tenure.kernel.queue.record import QueueRow
from tenure.model import DEFAULT_MAX_ATTEMPTS, FrozenEnvelope, JobStatus, QueueKind, SubmissionSnapshot, WorkerConfig

__all__ = ["Model", "Conflict", "Result", "SWEEP_LIMIT", "PURGE_LIMIT", "TERMINAL"]

SWEEP_LIMIT = 64
PURGE_LIMIT = 1000
TERMINAL = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)

Result = tuple[Any, ...]
"""("ok", value) or ("error", code value, reason)."""


class Conflict(Exception):
    def __init__(self, refused: Refused) -> None:
        assert isinstance(refused.reason, QueueRefusal)
        error_code = OUTCOMES[refused.reason]
        assert error_code is not None
        code = error_code.value
        super().__init__(code, refused.reason.value)
        self.result: Result = ("error", code, refused.reason.value)


def _raise_if_conflict(decision: Decision) -> None:
    if isinstance(decision, Refused):
        assert isinstance(decision.reason, QueueRefusal)
        if OUTCOMES[decision.reason] is not None:
            raise Conflict(decision)


class Model:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.rows: dict[QueueKind, dict[str, QueueRow]] = {queue: {} for queue in QueueKind}

    # --- transactions over staged copies --------------------------------------------

    def _transaction(self, queue: QueueKind, body: Callable[[dict[str, QueueRow]], Any]) -> Result:
        staged = dict(self.rows[queue])
        try:
            value = body(staged)
        except Conflict as conflict:
            return conflict.result
        self.rows[queue] = staged
        return ("ok", value)

    @staticmethod
    def _apply(staged: dict[str, QueueRow], old: QueueRow | None, decision: Decision) -> None:
        if not isinstance(decision, Applied):
            return
        new = decision.new_record
        if new is None:
            assert old is not None
            del staged[old.job_id]
        else:
            staged[new.job_id] = new

    def _decide(self, staged: dict[str, QueueRow], met: QueueRow | None, command: Any, now: int) -> Decision:
        decision = QUEUE.decide(met, command, now)
        self._apply(staged, met, decision)
        return decision

    def _max_attempts(self, queue: QueueKind, authored: int | None) -> int:
        if authored is not None:
            return authored
        return self.config.max_attempts or DEFAULT_MAX_ATTEMPTS[queue]

    # --- finding the met row ------------------------------------------------------------

    @staticmethod
    def _first(rows: Any) -> QueueRow | None:
        ordered = sorted(rows, key=lambda record: record.job_id)
        return ordered[0] if ordered else None

    def _colliding(self, staged: dict[str, QueueRow], job_id: str, run_id: str | None, key: str | None) -> QueueRow | None:
        return self._first(
            record
            for record in staged.values()
            if record.job_id == job_id
            or (run_id is not None and record.run_id == run_id)
            or (key is not None and record.idempotency_key == key)
        )

    @staticmethod
    def _by(staged: dict[str, QueueRow], **wanted: Any) -> QueueRow | None:
        found = [r for r in staged.values() if all(getattr(r, name) == value for name, value in wanted.items())]
        assert len(found) <= 1
        return found[0] if found else None

    # --- operations -------------------------------------------------------------------

    def submit_owned(self, snap: SubmissionSnapshot, new_job_id: str, new_run_id: str, now: int) -> Result:
        queue = snap.queue
        job_id = snap.job_id or new_job_id
        run_id = (snap.run_id or new_run_id) if queue is QueueKind.PIPELINE else None
        command = SubmitOwned(
            queue=queue, submission_id=snap.submission_id, fingerprint=snap.fingerprint, job_id=job_id,
            run_id=run_id, fires_at_us=snap.fires_at_us, max_attempts=self._max_attempts(queue, snap.max_attempts),
            idempotency_key=snap.idempotency_key, active_key=snap.active_key, payload=stored_payload(queue, snap.field_texts),
            queue_name=snap.queue_name, task_name=snap.task_name, priority=snap.priority, delay_us=snap.delay_us,
        )

        def body(staged: dict[str, QueueRow]) -> str:
            met = self._by(staged, submission_id=snap.submission_id)
            if met is None:
                met = self._colliding(staged, job_id, run_id, snap.idempotency_key)
            if met is None and snap.active_key is not None:
                holder = self._by(staged, active_key=snap.active_key)
                if holder is not None:
                    _raise_if_conflict(self._decide(staged, holder, ReleaseKeyForOwned(force=snap.force), now))
            decision = self._decide(staged, met, command, now)
            _raise_if_conflict(decision)
            assert isinstance(decision, Applied), "every refused submission is an error to the caller"
            reply = decision.reply
            submitted: str = reply.run_id if queue is QueueKind.PIPELINE else reply.job_id
            return submitted

        return self._transaction(queue, body)

    def submit_legacy(self, frozen: FrozenEnvelope, new_job_id: str, new_run_id: str, now: int) -> Result:
        queue = frozen.queue
        job_id = frozen.job_id or new_job_id
        run_id = (frozen.run_id or new_run_id) if queue is QueueKind.PIPELINE else None
        command = SubmitLegacy(
            queue=queue, job_id=job_id, run_id=run_id, fires_at_us=frozen.fires_at_us,
            max_attempts=self._max_attempts(queue, frozen.max_attempts), idempotency_key=frozen.idempotency_key,
            active_key=frozen.active_key, payload=stored_payload(queue, frozen.field_texts),
            queue_name=frozen.queue_name, task_name=frozen.task_name, priority=frozen.priority,
            delay_us=frozen.delay_us,
        )

        def body(staged: dict[str, QueueRow]) -> str:
            met = None
            if frozen.active_key is not None:
                holder = self._by(staged, active_key=frozen.active_key)
                if holder is not None and frozen.force:
                    _raise_if_conflict(self._decide(staged, holder, ReleaseKeyForLegacy(), now))
                else:
                    met = holder
            if met is None:
                met = self._colliding(staged, job_id, run_id, frozen.idempotency_key)
            decision = self._decide(staged, met, command, now)
            _raise_if_conflict(decision)
            assert isinstance(decision, Applied), "every refused submission is an error to the caller"
            reply = decision.reply
            submitted: str = reply.run_id if queue is QueueKind.PIPELINE else reply.job_id
            return submitted

        return self._transaction(queue, body)

    def _sweep(self, staged: dict[str, QueueRow], now: int) -> None:
        expired = sorted(
            (r for r in staged.values() if r.status is JobStatus.CLAIMED and r.lease_expires_at_us is not None and r.lease_expires_at_us <= now),
            key=lambda r: (r.lease_expires_at_us, r.job_id),
        )[:SWEEP_LIMIT]
        for record in expired:
            self._decide(staged, record, ExpireLease(), now)

    @staticmethod
    def _next_eligible(staged: dict[str, QueueRow], now: int, *, owned: bool) -> QueueRow | None:
        eligible = [
            r for r in staged.values()
            if r.status is JobStatus.PENDING and r.fires_at_us <= now and r.attempts < r.max_attempts
            and (owned or not r.fence_required)
        ]
        return min(eligible, key=lambda r: (r.fires_at_us, r.job_id), default=None)

    def claim_owned(
        self, queue: QueueKind, owner: str, tokens: list[str], now: int, queue_names: tuple[str, ...] | None = None,
    ) -> Result:
        """Claim with each token in turn: token i meets the i-th eligible row (or none).
        Rows are taken by priority (highest first; 0 on pycharter's queues), then due
        time, then job ID; a task claim takes only the queues it names."""
        def body(staged: dict[str, QueueRow]) -> list[QueueRow]:
            self._sweep(staged, now)
            stored = {r.claim_token for r in staged.values()}
            eligible = sorted(
                (r for r in staged.values()
                 if r.status is JobStatus.PENDING and r.fires_at_us <= now and r.attempts < r.max_attempts
                 and (queue_names is None or r.queue_name in queue_names)),
                key=lambda r: (-r.priority, r.fires_at_us, r.job_id),
            )[: len(tokens)]
            claimed: list[QueueRow] = []
            for index, token in enumerate(tokens):
                met = eligible[index] if index < len(eligible) else None
                command = ClaimOwned(owner_id=owner, claim_token=token, nonce_already_stored=token in stored,
                                     lease_us=self.config.lease_us, queue_names=queue_names)
                decision = self._decide(staged, met, command, now)
                _raise_if_conflict(decision)
                if isinstance(decision, Applied):
                    assert decision.new_record is not None
                    claimed.append(decision.new_record)
            return claimed

        return self._transaction(queue, body)

    def claim_legacy(self, queue: QueueKind, owner: str, now: int) -> Result:
        def body(staged: dict[str, QueueRow]) -> QueueRow | None:
            self._sweep(staged, now)
            candidate = self._next_eligible(staged, now, owned=False)
            decision = self._decide(staged, candidate, ClaimLegacy(owner_id=owner, lease_us=self.config.lease_us), now)
            _raise_if_conflict(decision)
            return decision.new_record if isinstance(decision, Applied) else None

        return self._transaction(queue, body)

    def recover(self, queue: QueueKind, owner: str, token: str, now: int) -> Result:
        met = self._by(self.rows[queue], claim_token=token)
        decision = QUEUE.decide(met, RecoverOwned(owner_id=owner, claim_token=token), now)
        return ("ok", decision.new_record if isinstance(decision, Applied) else None)

    def on_row(self, queue: QueueKind, job_id: str, command: Any, now: int) -> Result:
        def body(staged: dict[str, QueueRow]) -> Any:
            return self._decide(staged, staged.get(job_id), command, now)

        return self._transaction(queue, body)

    def _fenced_command(self, fence: Any, kind: str, arguments: dict[str, Any]) -> Any:
        parts = ClaimFence.of(fence)
        config = self.config
        commands: dict[str, Callable[[], Any]] = {
            "heartbeat": lambda: HeartbeatOwned(fence=parts, lease_us=config.lease_us),
            "complete": lambda: CompleteOwned(fence=parts, result_json=arguments.get("result_json")),
            "fail": lambda: FailOwned(
                fence=parts, error_message=arguments["error"], retry=arguments["retry"],
                dlq_record_id=arguments.get("dlq_record_id"),
                backoff_base_ms=arguments.get("backoff_base_ms", config.backoff_base_ms),
                backoff_max_ms=arguments.get("backoff_max_ms", config.backoff_max_ms),
                jitter_per_mille=arguments.get("jitter_per_mille", 0),
            ),
            "progress": lambda: ProgressOwned(fence=parts, progress_json=arguments["progress_json"]),
            "set_pid": lambda: SetPidOwned(fence=parts, pid=arguments["pid"]),
            "read_state": lambda: ReadStateOwned(fence=parts),
            "acknowledge_cancel": lambda: AcknowledgeCancelOwned(fence=parts),
            "release": lambda: ReleaseOwned(fence=parts, delay_us=arguments.get("delay_us", 0)),
        }
        return commands[kind]()

    def fenced(self, queue: QueueKind, fence: Any, kind: str, now: int, **arguments: Any) -> Result:
        return self.on_row(queue, fence.job_id, self._fenced_command(fence, kind, arguments), now)

    def fenced_many(self, queue: QueueKind, kind: str, items: list[tuple[Any, dict[str, Any]]], now: int) -> Result:
        """One transaction, items in order; each sees what earlier items did to its row."""
        def body(staged: dict[str, QueueRow]) -> list[bool]:
            answers = []
            for fence, arguments in items:
                command = self._fenced_command(fence, kind, arguments)
                answers.append(isinstance(self._decide(staged, staged.get(fence.job_id), command, now), Applied))
            return answers

        return self._transaction(queue, body)

    def legacy(self, queue: QueueKind, job_id: str, kind: str, now: int, **arguments: Any) -> Result:
        config = self.config
        commands: dict[str, Callable[[], Any]] = {
            "heartbeat": lambda: HeartbeatLegacy(owner_id=arguments["owner"], lease_us=config.lease_us),
            "complete": lambda: CompleteLegacy(result_json=arguments.get("result_json")),
            "fail": lambda: FailLegacy(
                error_message=arguments["error"], retry=arguments["retry"], dlq_record_id=None,
                backoff_base_ms=config.backoff_base_ms, backoff_max_ms=config.backoff_max_ms,
            ),
            "set_pid": lambda: SetPidLegacy(pid=arguments["pid"]),
            "delete": lambda: DeleteLegacy(),
            "request_cancel": lambda: RequestCancel(),
            "cancel_admin": lambda: CancelAdmin(),
            "retry_failed": lambda: RetryFailed(),
        }
        return self.on_row(queue, job_id, commands[kind](), now)

    def purge(self, queue: QueueKind, older_than_us: int, now: int) -> Result:
        def body(staged: dict[str, QueueRow]) -> int:
            command = PurgeFinished(older_than_us=now - older_than_us)
            finished = sorted(
                (r for r in staged.values() if r.status in TERMINAL and r.completed_at_us is not None
                 and r.completed_at_us < command.older_than_us and not r.fence_required),
                key=lambda r: (r.completed_at_us, r.job_id),
            )[:PURGE_LIMIT]
            return sum(isinstance(self._decide(staged, r, command, now), Applied) for r in finished)

        return self._transaction(queue, body)

    def move_lease(self, queue: QueueKind, job_id: str, by_us: int) -> None:
        record = self.rows[queue][job_id]
        assert record.lease_expires_at_us is not None
        self.rows[queue][job_id] = dataclasses.replace(record, lease_expires_at_us=record.lease_expires_at_us - by_us)

    def set_lease(self, queue: QueueKind, job_id: str, lease_expires_at_us: int) -> None:
        """What a holder that moved the lease while it held the row lock leaves behind."""
        record = self.rows[queue][job_id]
        self.rows[queue][job_id] = dataclasses.replace(record, lease_expires_at_us=lease_expires_at_us)

    def interfere(self, queue: QueueKind, job_id: str, marker: str) -> None:
        """What a privileged write between a read and a write leaves behind."""
        record = self.rows[queue][job_id]
        self.rows[queue][job_id] = dataclasses.replace(record, error_message=marker)
