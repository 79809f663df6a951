"""The Run ledger: workflow Runs, their deliveries, consents and delegated jobs on SQLite or
PostgreSQL, in the same database as the queues and the service attempts.

Every method is one transaction on the shared engine (``publish`` and ``finish_cancel``
call the broker outside any transaction, then record what it said in one). A Run
operation locks the Run row, then its current delivery, then (where it sweeps them) the
Run's pending consents; it reads the owner rows and containment counts it needs after
the Run's lock, asks the Run kernel, and persists the decided pair with compare-and-set
writes in the same transaction. The answer law is the job sources': True (or a value)
means the exact change applied; False (or None) means stale, ineligible or already
applied, and nothing changed; a conflict raises ``TenureError`` with its ``RUN_*`` or
``JOB_REQUEST_CONFLICT`` code; a database failure raises ``RUN_PERSISTENCE_FAILED`` with
the job sources' reason words; invalid input raises ``ConfigValidationError`` before any
database work. No message echoes an ID, a key or a payload.

Derived identities: an admission with an idempotency key gets the Run ID
``uuid5(RUN_KEY_NAMESPACE, key)``: the key alone names the admission, so reusing a key
for different work (another source included) is a conflict, never a second Run. Runs
admitted before schema step ``runs_v4`` have the ID ``uuid5(RUN_ADMISSION_NAMESPACE,
f"{source}\\n{key}")``, which they keep: an admission that meets no Run at its derived
ID looks its key up (indexed by ``runs_v4``) and meets the stored Run holding it, so a
replay finds the old Run and a reuse from another source is refused. A delegated job
gets ``uuid5(AGENT_JOB_NAMESPACE, request_id)``.
"""

from __future__ import annotations

import contextlib
import functools
import datetime as dt
import hashlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from tenure.kernel.agent_jobs.record import (
    AdoptResult,
    AdvanceJob,
    AgentJobRow,
    RecordCancelled,
    SubmitJob,
    result_problem,
)
from tenure.kernel.attempts.record import AttemptRow
from tenure.kernel.consents import finders as consent_finders
from tenure.kernel.consents.machine import DEADLINE_OWNER
from tenure.kernel.consents.record import MAX_DEADLINE_US, CancelPending, ConsentRow, CreateConsent, DecideConsent
from tenure.kernel.core import Applied, Decision, Refused, decide
from tenure.kernel.recovery.table import LOST_ERROR
from tenure.kernel.queue.record import MAX_INSTANT_US, MIN_INSTANT_US
from tenure.kernel.runs import finders
from tenure.kernel.runs.commands import (
    Admit,
    Admitted,
    BeginCancel,
    Claim,
    Claimed,
    Containment,
    EnterHardwareWait,
    FailHeld,
    FinishCancel,
    LeaveHardwareWait,
    OwnerEvidence,
    Park,
    RecordPublished,
    RecordPublishError,
    Release,
    Resume,
    Resumed,
    RetryLost,
    Rotated,
    RunCommand,
    Settle,
    Settled,
    Swept,
    Ticket,
)
from tenure.kernel.runs.machine import RUNS
from tenure.kernel.runs.record import DeliveryRow, RunPair, RunRow, key_of
from tenure.model import (
    TERMINAL_AGENT_JOB_STATUSES,
    AgentJobRecord,
    AgentJobStatus,
    Admission,
    BrokerJobState,
    CancelTicket,
    ConfigValidationError,
    ConsentRecord,
    ConsentStatus,
    DeliveryRecord,
    DeliveryState,
    ErrorCode,
    RunClaim,
    RunIntent,
    RunPage,
    RunRecord,
    RunStatus,
    TenureError,
    WaitKind,
    WorkflowPin,
    bounds,
    broker_priority,
    canonical_json,
    hop_key,
    load_json,
)
from tenure.model.runs import MAX_ERROR_CHARS, MAX_QUEUE_CHARS, MAX_RUN_DOCUMENT_BYTES, check_document, check_priority, check_text

from ..attempts.table import ATTEMPTS_BINDING
from ..dialects import open_store
from ..urls import parse_db_url
from ..engine import Engine, raise_if_conflict
from ..failures import persistence_failed
from ..store import Transaction
from . import recovery as _recovery
from .broker import Broker, fence_hop
from .checkpoints import Checkpoints, RecordedOutcome
from .checkpoints import CheckpointRow, clear_outcome_in, put_in, state_text
from .nodes import NodeLeases
from .steps import Steps
from .checkpoints import delete_in as delete_checkpoint_in
from .recovery import RecoveryPorts, RecoveryReport

if TYPE_CHECKING:
    from ..attempts.ledger import AttemptLedger
from .table import AGENT_JOBS_BINDING, CONSENTS_BINDING, DELIVERIES_BINDING, RUNS_BINDING

__all__ = ["RunLedger", "result_text", "RUN_KEY_NAMESPACE", "RUN_ADMISSION_NAMESPACE", "AGENT_JOB_NAMESPACE", "run_id_for",
           "legacy_run_id_for", "job_id_for",
           "admission_rows", "consent_evidence", "job_evidence", "attempt_evidence", "cancelled_result"]

log = logging.getLogger("tenure.runs.ledger")

RUN_KEY_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "tenure:run-key")
RUN_ADMISSION_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "tenure:run-admission")
"""The namespace of the source-scoped IDs Runs were admitted under before ``runs_v4``."""
AGENT_JOB_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "tenure:agent-job")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


MAX_TIMER_DELAY_S = 366 * 86_400
"""The longest delay a durable timer takes (a due time may be given for any instant)."""


def run_id_for(idempotency_key: str) -> str:
    """The Run ID an admission under ``idempotency_key`` gets (from any source)."""
    return str(uuid.uuid5(RUN_KEY_NAMESPACE, idempotency_key))


def legacy_run_id_for(source: str, idempotency_key: str) -> str:
    """The ID a Run admitted under ``idempotency_key`` from ``source`` got before
    ``runs_v4`` (it keeps it; see the module docstring)."""
    return str(uuid.uuid5(RUN_ADMISSION_NAMESPACE, f"{source}\n{idempotency_key}"))


def job_id_for(request_id: str) -> str:
    """The job ID a delegated job with ``request_id`` gets."""
    return str(uuid.uuid5(AGENT_JOB_NAMESPACE, request_id))


def _refuse(field: str, problem: str) -> ConfigValidationError:
    return ConfigValidationError(f"invalid_{field}", fields=(field,), problems=(problem,))


def _deadline_us(seconds: object) -> int | None:
    """A consent's deadline in microseconds from its creation (None: no deadline)."""
    if seconds is None:
        return None
    if type(seconds) not in (int, float) or not 0 < seconds <= MAX_DEADLINE_US / 1_000_000:  # type: ignore[operator]
        raise _refuse("expires_in_s", "number_out_of_range")
    return max(1, round(seconds * 1_000_000))  # type: ignore[operator]


def _seq(value: object) -> int:
    if not bounds.is_strict_int(value) or not 0 <= value <= bounds.INT32_MAX:  # type: ignore[operator]
        raise _refuse("enqueue_seq", "integer_out_of_range")
    return value  # type: ignore[return-value]


def _run_id(value: object) -> str:
    return check_text(value, "run_id", 36)


def _json_text(value: Any, field: str) -> str:
    check_document(value, field)
    text = canonical_json(value)
    if len(text.encode("utf-8")) > MAX_RUN_DOCUMENT_BYTES:
        raise _refuse(field, "payload_too_large")
    return text


def _instant(micros: int | None) -> dt.datetime | None:
    return None if micros is None else _EPOCH + dt.timedelta(microseconds=micros)


def _parsed(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return load_json(text)
    except ValueError:  # JsonProblem: not JSON, or nested deeper than tenure reads
        # The Run ledger's own code: public records are built outside the transaction.
        raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, "corrupt_row") from None


def _digest(document: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(document).encode("utf-8")).hexdigest()


def result_text(status: RunStatus, result: Any) -> str | None:
    """The canonical text a DONE Run keeps of its workflow's result: a JSON object of at
    most 1 MiB, or None (a FAILED Run keeps none)."""
    if result is None:
        return None
    if status is not RunStatus.DONE:
        raise _refuse("result", "failed_has_no_result")
    if type(result) is not dict:
        raise _refuse("result", "json_object_required")
    return _json_text(result, "result")


def admission_rows(
    intent: RunIntent, workflow: WorkflowPin, queue: str, priority: int, idempotency_key: str | None, run_id: str,
    node: str | None = None, retry_of: str | None = None,
) -> tuple[RunRow, DeliveryRow]:
    """The Run and delivery 0 an admission asks the kernel to store (checked arguments;
    where they stand and their times are the kernel's)."""
    payload_json = _json_text(intent.payload, "payload")
    scopes = tuple(sorted(intent.scopes))
    doctrine = intent.requested_priority if intent.requested_priority is not None else priority
    digest = _digest({
        "session_id": intent.session_id, "source": intent.source, "principal": intent.principal,
        "scopes": list(scopes), "payload": _parsed(payload_json), "requested_priority": intent.requested_priority,
    })
    row = RunRow(
        run_id=run_id, status=RunStatus.QUEUED, session_id=intent.session_id, source=intent.source,
        principal=intent.principal, scopes=scopes, payload_json=payload_json,
        requested_priority=intent.requested_priority, intent_digest=digest, idempotency_key=idempotency_key,
        queue=queue, priority=doctrine, workflow_name=workflow.name, workflow_revision=workflow.revision,
        workflow_digest=workflow.digest, enqueue_seq=0, started_at_us=None, node=None, owner_kind=None,
        owner_id=None, error=None, created_at_us=0, updated_at_us=0, admitted_node=node,
        max_hop_retries=workflow.max_hop_retries, retry_of=retry_of,
    )
    template = DeliveryRow(
        delivery_id=key_of(run_id, 0), run_id=run_id, enqueue_seq=0, state=DeliveryState.PENDING, queue=queue,
        priority=doctrine, resume=False, publish_attempts=0, last_error=None, claimed_by=None,
        published_at_us=None, claimed_at_us=None, settled_at_us=None, created_at_us=0,
    )
    return row, template


def consent_evidence(row: ConsentRow) -> OwnerEvidence:
    return OwnerEvidence(WaitKind.CONSENT, row.consent_id, row.run_id, row.status.value,
                         row.decided_by is not None and row.decided_at_us is not None)


def job_evidence(row: AgentJobRow) -> OwnerEvidence:
    return OwnerEvidence(WaitKind.DELEGATE, row.job_id, row.run_id, row.status.value, _job_complete(row))


def attempt_evidence(row: AttemptRow) -> OwnerEvidence:
    return OwnerEvidence(WaitKind.SERVICE, row.attempt_id, row.run_id, row.state.value, True)


def cancelled_result(job_id: str) -> str:
    """The result ``record_job_cancelled`` stores: containment returned."""
    return canonical_json({"job_id": job_id, "status": AgentJobStatus.CANCELLED.value, "contained": True})


def _public_run(row: RunRow) -> RunRecord:
    return RunRecord(
        run_id=row.run_id, status=row.status, session_id=row.session_id, source=row.source,
        principal=row.principal, scopes=frozenset(row.scopes), payload=_parsed(row.payload_json),
        requested_priority=row.requested_priority, queue=row.queue, priority=row.priority,
        workflow=WorkflowPin(row.workflow_name, row.workflow_revision, row.workflow_digest, row.max_hop_retries),
        idempotency_key=row.idempotency_key, enqueue_seq=row.enqueue_seq, started_at=_instant(row.started_at_us),
        node=row.node, owner_kind=row.owner_kind, owner_id=row.owner_id, error=row.error,
        created_at=_instant(row.created_at_us), updated_at=_instant(row.updated_at_us),  # type: ignore[arg-type]
        admitted_node=row.admitted_node, result=_parsed(row.result_json), hop_retries=row.hop_retries,
        retry_of=row.retry_of, wake_at=_instant(row.wake_at_us),
    )


def _public_delivery(row: DeliveryRow) -> DeliveryRecord:
    return DeliveryRecord(row.run_id, row.enqueue_seq, row.state, row.queue, row.priority, row.resume,
                          row.publish_attempts)


def _public_consent(row: ConsentRow) -> ConsentRecord:
    return ConsentRecord(
        consent_id=row.consent_id, run_id=row.run_id, tool_name=row.tool_name, tool_call_id=row.tool_call_id,
        payload=_parsed(row.payload_json), status=row.status, decided_by=row.decided_by,
        decided_at=_instant(row.decided_at_us), preauthorized_by=row.preauthorized_by,
        created_at=_instant(row.created_at_us),  # type: ignore[arg-type]
        expires_at=_instant(row.expires_at_us),
    )


def _public_job(row: AgentJobRow) -> AgentJobRecord:
    return AgentJobRecord(
        job_id=row.job_id, request_id=row.request_id, run_id=row.run_id, runtime=row.runtime, profile=row.profile,
        status=row.status, request=_parsed(row.request_json), result=_parsed(row.result_json),
        runtime_job_id=row.runtime_job_id, created_at=_instant(row.created_at_us),  # type: ignore[arg-type]
        updated_at=_instant(row.updated_at_us),  # type: ignore[arg-type]
    )


def _parts(pair: RunPair) -> list[tuple[Any, Any]]:
    """The rows of a pair, in the lock order (the Run, then its deliveries)."""
    return [(RUNS_BINDING, pair.run), *((DELIVERIES_BINDING, delivery) for delivery in pair.deliveries)]


def _job_complete(row: AgentJobRow) -> bool:
    if row.status not in TERMINAL_AGENT_JOB_STATUSES or row.result_json is None:
        return False
    try:
        result = load_json(row.result_json)
    except ValueError:
        return False
    return result_problem(result, row.job_id, row.status) is None


def _cursor_of(row: RunRow) -> str:
    return f"{row.created_at_us}:{row.run_id}"


_CURSOR_INSTANT = re.compile(r"-?[0-9]{1,19}")


def _parse_cursor(cursor: object) -> tuple[int, str]:
    if type(cursor) is str and ":" in cursor:
        created, _, run_id = cursor.partition(":")
        # ASCII digits only ("²".isdigit() is True, int() refuses it), within the instants
        # a row can hold (a larger one overflows the database's timestamp).
        if _CURSOR_INSTANT.fullmatch(created) and bounds.is_bounded_text(run_id, 36):
            instant = int(created)
            if MIN_INSTANT_US <= instant <= MAX_INSTANT_US:
                return instant, run_id
    raise _refuse("after", "cursor_required")


class RunLedger:
    """Runs in one database (SQLite file or PostgreSQL), migrated by ``upgrade``."""

    def __init__(self, db_url: str, *, timeout_seconds: float = 30.0, db_schema: str | None = None) -> None:
        if type(timeout_seconds) not in (int, float) or not 0 < timeout_seconds <= bounds.MAX_TIMEOUT_SECONDS:
            raise _refuse("timeout_seconds", "number_out_of_range")
        self._engine = Engine(open_store(db_url, timeout_seconds=float(timeout_seconds), schema=db_schema))
        self.store = self._engine.store
        self.database = parse_db_url(db_url).kind.value
        """``sqlite`` or ``postgresql``."""

    @functools.cached_property
    def attempts(self) -> AttemptLedger:
        """The service attempts of this database, on this ledger's connections."""
        from ..attempts.ledger import AttemptLedger  # the attempt ledger imports the Run tables

        return AttemptLedger.on_engine(self._engine)

    @functools.cached_property
    def nodes(self) -> NodeLeases:
        """The node leases of this database, on this ledger's connections."""
        return NodeLeases(self)

    @functools.cached_property
    def steps(self) -> Steps:
        """The step journal of this database, on this ledger's connections."""
        return Steps(self)

    @functools.cached_property
    def checkpoints(self) -> Checkpoints:
        """The workflow checkpoints of this database, on this ledger's connections."""
        return Checkpoints(self)

    async def close(self) -> None:
        """Close the ledger's connections. Final: later calls raise ``source_closed``."""
        await self.store.close()

    async def __aenter__(self) -> RunLedger:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- the one boundary --------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _run_errors(self) -> AsyncIterator[None]:
        """A persistence failure of the shared stores becomes this ledger's code."""
        try:
            yield
        except TenureError as error:
            if error.code is not ErrorCode.QUEUE_PERSISTENCE_FAILED:
                raise
            reason = error.reason
        else:
            return
        # Ours replaces the shared store's error: a traceback shows one error, not two.
        raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, reason) from None

    async def _in_transaction(self, body: Any, *, write: bool = True) -> Any:
        async with self._run_errors():
            return await self.store.run(body, write=write)

    @staticmethod
    async def _locked_pair(tx: Transaction, run_id: str) -> RunPair | None:
        """The Run and its current delivery, locked in that order (None: no such Run)."""
        runs = await tx.locked(RUNS_BINDING, finders.runs_by_keys, {"keys": [run_id]})
        if not runs:
            return None
        run = runs[0]
        deliveries = await tx.locked(DELIVERIES_BINDING, finders.deliveries_by_keys,
                                     {"keys": [key_of(run_id, run.enqueue_seq)]})
        if not deliveries:
            raise persistence_failed("delivery_missing")
        return RunPair(run, (deliveries[0],))

    @staticmethod
    async def _read_pair(tx: Transaction, run_id: str) -> RunPair | None:
        runs = await tx.read(RUNS_BINDING, [run_id])
        if not runs:
            return None
        deliveries = await tx.read(DELIVERIES_BINDING, [key_of(run_id, runs[0].enqueue_seq)])
        if not deliveries:
            raise persistence_failed("delivery_missing")
        return RunPair(runs[0], (deliveries[0],))

    async def _sweep_consents(self, tx: Transaction, run_id: str, decided_by: str) -> None:
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
        await self._engine.persist(tx, CONSENTS_BINDING, changes)

    @staticmethod
    async def _containment(tx: Transaction, run_id: str) -> Containment:
        jobs = await tx.find(AGENT_JOBS_BINDING, finders.open_jobs_of_run, {"run_id": run_id})
        attempts = await tx.find(ATTEMPTS_BINDING, finders.open_attempts_of_run, {"run_id": run_id})
        return Containment(open_jobs=len(jobs), open_attempts=len(attempts))

    @staticmethod
    async def _owner(tx: Transaction, kind: WaitKind | None, owner_id: str | None) -> OwnerEvidence | None:
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

    async def _run_command(self, tx: Transaction, pair: RunPair | None, command: RunCommand) -> Decision:
        decision = await self._engine.decide_composite(tx, RUNS, _parts, pair, command)
        raise_if_conflict(RUNS_BINDING, decision)
        if isinstance(decision, Applied) and isinstance(decision.reply, Settled | Swept) and pair is not None:
            await self._sweep_consents(tx, pair.run.run_id, decision.reply.decided_by)
        return decision

    async def _decide(self, run_id: str, command: RunCommand) -> Decision:
        async def body(tx: Transaction) -> Decision:
            return await self._run_command(tx, await self._locked_pair(tx, run_id), command)

        decision: Decision = await self._in_transaction(body)
        return decision

    # --- admission -----------------------------------------------------------------------

    async def admit(
        self, intent: RunIntent, *, workflow: WorkflowPin, queue: str, priority: int,
        idempotency_key: str | None = None, hold: bool = False, session_fence: bool = False,
        node: str | None = None,
    ) -> Admission:
        """Record a QUEUED Run and its delivery 0 (HELD with ``hold=True``, else PENDING) in
        one transaction, or return the stored admission of the same key and intent. It
        never publishes: publish the returned delivery when it is PENDING. ``node`` names
        the admitting node: startup recovery on a node fails only its own unreleased HELD
        admissions (without one, an admission belongs to every node, as in one
        process). A replay keeps the stored node."""
        if type(intent) is not RunIntent:
            raise _refuse("intent", "run_intent_required")
        if type(workflow) is not WorkflowPin:
            raise _refuse("workflow", "workflow_pin_required")
        queue = check_text(queue, "queue", MAX_QUEUE_CHARS)
        priority = check_priority(priority)
        if idempotency_key is not None:
            check_text(idempotency_key, "idempotency_key", bounds.MAX_IDENTITY_CHARS)
        if type(hold) is not bool or type(session_fence) is not bool:
            raise _refuse("hold" if type(hold) is not bool else "session_fence", "boolean_required")
        if session_fence and intent.session_id is None:
            raise _refuse("session_fence", "session_required")
        if node is not None:
            check_text(node, "node")
        return await self._admit(intent, workflow=workflow, queue=queue, priority=priority,
                                 idempotency_key=idempotency_key, hold=hold, session_fence=session_fence, node=node)

    async def _admit(
        self, intent: RunIntent, *, workflow: WorkflowPin, queue: str, priority: int, idempotency_key: str | None,
        hold: bool, session_fence: bool, node: str | None, retry_of: str | None = None,
    ) -> Admission:
        run_id = run_id_for(idempotency_key) if idempotency_key is not None else str(uuid.uuid4())
        row, template = admission_rows(intent, workflow, queue, priority, idempotency_key, run_id, node, retry_of)

        async def body(tx: Transaction) -> Admission:
            # Named locks first, always in this order: same-key admissions and one
            # session's fenced admissions then decide one after another.
            if idempotency_key is not None:
                await tx.lock_name(f"tenure:run:{run_id}")
            if session_fence:
                await tx.lock_name(f"tenure:run-session:{intent.session_id}")
            pair = await self._locked_pair(tx, run_id)
            if pair is None and idempotency_key is not None:
                pair = await self._pair_holding_key(tx, idempotency_key, intent.source)
            busy = False
            if session_fence and pair is None:
                open_runs = await tx.find(RUNS_BINDING, finders.session_open, {"session_id": intent.session_id}, 1)
                busy = bool(open_runs)
            decision = await self._run_command(
                tx, pair, Admit(run=row, delivery=template, hold=hold, session_busy=busy)
            )
            stored = decision.new_record if isinstance(decision, Applied) else None
            if not isinstance(stored, RunPair) or not isinstance(decision.reply, Admitted):  # type: ignore[union-attr]
                raise persistence_failed("invariant_broken")
            return Admission(_public_run(stored.run), _public_delivery(stored.current), decision.reply.created)  # type: ignore[union-attr]

        return await self._in_transaction(body)  # type: ignore[no-any-return]

    async def retry(self, run_id: str, *, node: str | None = None) -> Admission | None:
        """Re-admit a Run that failed ``lost`` (its hop died with its process) as a new
        Run with the same intent, workflow pin, queue and priority, linked to it by
        ``retry_of``; the failed Run stays as it is. Idempotent: its key is
        ``retry:<run_id>``, so asking again answers the same new Run (``created=False``).
        None when no such Run exists; a Run that did not fail ``lost`` is refused
        (``ConfigValidationError`` ``run_not_lost``). Publish the returned delivery (or
        leave it to the relays), as after :meth:`admit`."""
        old = await self.get(_run_id(run_id))
        if old is None:
            return None
        if old.status is not RunStatus.FAILED or old.error != LOST_ERROR:
            raise _refuse("run_id", "run_not_lost")
        key = f"retry:{old.run_id}"
        return await self._admit(old.intent, workflow=old.workflow, queue=old.queue, priority=old.priority,
                                 idempotency_key=key, hold=False, session_fence=False, node=node,
                                 retry_of=old.run_id)

    async def _pair_holding_key(self, tx: Transaction, idempotency_key: str, source: str) -> RunPair | None:
        """The stored Run an admission under this key meets when none holds its derived
        ID: a Run admitted before ``runs_v4`` (source-scoped ID), or one another writer
        stored. Of several (the same key once admitted from several sources), the one from
        this source, else the oldest: the kernel then replays it or refuses the reuse."""
        holders = await tx.find(RUNS_BINDING, finders.runs_by_admission_key, {"key": idempotency_key}, 16)
        if not holders:
            return None
        chosen = next((run for run in holders if run.source == source), holders[0])
        return await self._locked_pair(tx, chosen.run_id)

    async def release(self, run_id: str, enqueue_seq: int) -> bool:
        """HELD -> PENDING for exactly this admission's delivery (then publish it)."""
        return await self._changed(run_id, Release(enqueue_seq=_seq(enqueue_seq)))

    async def fail_held(self, run_id: str, enqueue_seq: int, *, error: str) -> bool:
        """Fail exactly this HELD admission: Run FAILED, delivery SETTLED."""
        command = FailHeld(enqueue_seq=_seq(enqueue_seq), error=check_text(error, "error", MAX_ERROR_CHARS))
        return await self._changed(run_id, command)

    async def _changed(self, run_id: object, command: RunCommand) -> bool:
        decision = await self._decide(_run_id(run_id), command)
        return isinstance(decision, Applied)

    # --- delivery --------------------------------------------------------------------

    async def publish(self, run_id: str, enqueue_seq: int, broker: Broker) -> bool:
        """Publish the hop ``run:<run_id>:<seq>`` if its delivery is publishable (the Run
        QUEUED at that sequence, the delivery PENDING or PUBLISHED) and record the
        acknowledgement: True when it was recorded; False when nothing was publishable
        (nothing sent) or the hop moved on before the acknowledgement was recorded. A
        broker failure is recorded and raises RUN_BROKER_FAILED; the Run stays QUEUED
        with the same hop key for a retry."""
        key = _run_id(run_id)
        seq = _seq(enqueue_seq)

        async def read(tx: Transaction) -> RunPair | None:
            return await self._read_pair(tx, key)

        pair = await self._in_transaction(read, write=False)
        # The kernel's own answer, from the row as read, says whether anything may be sent.
        if pair is None or isinstance(decide(RUNS, pair, RecordPublished(enqueue_seq=seq), pair.run.updated_at_us),
                                      Refused):
            return False
        delivery = pair.current
        failure: str | None = None
        try:
            await broker.publish(hop_key(key, seq), queue=delivery.queue, wire_priority=broker_priority(delivery.priority))
        except Exception as error:  # any broker failure: recorded, then raised as ours
            failure = f"publish_failed:{type(error).__name__}"
        if failure is not None:
            # Outside the except block: the broker's exception (and its text) never rides
            # along as the context of ours, nor of a persistence failure while recording.
            await self._decide(key, RecordPublishError(enqueue_seq=seq, error=failure))
            raise TenureError(ErrorCode.RUN_BROKER_FAILED, "publish_failed")
        return await self._changed(key, RecordPublished(enqueue_seq=seq))

    async def claim(self, run_id: str, enqueue_seq: int, *, node: str, claimant: str | None = None) -> RunClaim | None:
        """Claim exactly this hop: QUEUED at ``enqueue_seq`` with a pending or published
        delivery becomes RUNNING with a CLAIMED delivery. None: a stale or duplicate hop.
        ``claimant``: a token the hop draws once and sends with every try of this claim
        (the delivery records it): after a ``RUN_PERSISTENCE_FAILED`` whose COMMIT applied
        unacknowledged, the same call answers the claim it made (without one, it answers
        None and the Run waits for this node's next start). A claimed Run whose stored
        intent cannot be read is settled FAILED ``corrupt_row`` and the claim raises
        ``RUN_PERSISTENCE_FAILED`` ``corrupt_row``."""
        command = Claim(enqueue_seq=_seq(enqueue_seq), node=check_text(node, "node"),
                        claimant=None if claimant is None else check_text(claimant, "claimant"))
        decision = await self._decide(_run_id(run_id), command)
        if not isinstance(decision, Applied) or not isinstance(decision.reply, Claimed):
            return None
        pair: RunPair = decision.new_record  # type: ignore[assignment]
        try:
            run = _public_run(pair.run)
        except TenureError as error:
            if error.reason != "corrupt_row":
                raise
            # The hop holds a Run whose stored intent cannot be read (written outside
            # tenure): no workflow can run it, and a redelivery would meet it again, so
            # the hop ends it (a fenced settle, like any) and reports the row.
            with contextlib.suppress(TenureError):
                await self.settle(pair.run.run_id, pair.run.enqueue_seq, RunStatus.FAILED, error="corrupt_row")
            raise
        return RunClaim(run, decision.reply.enqueue_seq, decision.reply.resume, run.workflow)

    async def enter_hardware_wait(self, run_id: str, enqueue_seq: int) -> bool:
        return await self._changed(run_id, EnterHardwareWait(enqueue_seq=_seq(enqueue_seq)))

    async def leave_hardware_wait(self, run_id: str, enqueue_seq: int) -> bool:
        return await self._changed(run_id, LeaveHardwareWait(enqueue_seq=_seq(enqueue_seq)))

    async def park(self, run_id: str, enqueue_seq: int, *, kind: WaitKind, owner_id: str) -> bool:
        """Park the RUNNING hop ``enqueue_seq`` on an owner of this Run (a consent, a
        delegated job, a service attempt), settling its delivery. An owner that does not
        belong to this Run raises RUN_OWNER_MISMATCH. Hardware waits use
        :meth:`enter_hardware_wait`."""
        if type(kind) is not WaitKind or kind in (WaitKind.HARDWARE, WaitKind.TIMER):
            raise _refuse("kind", "owner_kind_required")
        owner = check_text(owner_id, "owner_id")
        key = _run_id(run_id)
        seq = _seq(enqueue_seq)

        async def body(tx: Transaction) -> Decision:
            pair = await self._locked_pair(tx, key)
            evidence = await self._owner(tx, kind, owner)
            return await self._run_command(tx, pair, Park(enqueue_seq=seq, wait=kind, owner_id=owner, owner=evidence))

        return isinstance(await self._in_transaction(body), Applied)

    async def park_timer(self, run_id: str, enqueue_seq: int, *, name: str, state: Any = None,
                         wake_at: dt.datetime | None = None, delay_s: float | None = None) -> bool:
        """Park the RUNNING hop ``enqueue_seq`` on a durable timer named ``name`` (the
        owner ID its resume names), due at ``wake_at`` (an aware datetime) or ``delay_s``
        seconds after the database clock read under the Run's lock (exactly one of them).
        One transaction writes the Run's checkpoint (``state``, bound to the timer) and
        the park, so no crash leaves one without the other. The Run resumes once the
        database clock reaches the due time: a relay does it (a timer already due when it
        is set is resumed by :func:`~tenure.adapters.runs.workflows.resume_and_publish`).
        False: the hop does not hold the Run any more."""
        owner = check_text(name, "name")
        key = _run_id(run_id)
        seq = _seq(enqueue_seq)
        text = state_text(state)
        if (wake_at is None) == (delay_s is None):
            raise _refuse("wake_at", "wake_at_or_delay_required")
        due_us = None
        if wake_at is not None:
            if type(wake_at) is not dt.datetime or wake_at.utcoffset() is None:
                raise _refuse("wake_at", "aware_datetime_required")
            due_us = (wake_at - _EPOCH) // dt.timedelta(microseconds=1)
            if not MIN_INSTANT_US <= due_us <= MAX_INSTANT_US:
                raise _refuse("wake_at", "instant_out_of_range")
        elif type(delay_s) not in (int, float) or not 0 <= delay_s <= MAX_TIMER_DELAY_S:  # type: ignore[operator]
            raise _refuse("delay_s", "number_out_of_range")

        async def body(tx: Transaction) -> Decision:
            pair = await self._locked_pair(tx, key)
            now = await tx.now_us()
            wake = due_us if due_us is not None else now + round(delay_s * 1_000_000)  # type: ignore[operator]
            command = Park(enqueue_seq=seq, wait=WaitKind.TIMER, owner_id=owner, owner=None, wake_at_us=wake)
            decision = await self._run_command(tx, pair, command)
            if isinstance(decision, Applied):
                await put_in(tx, CheckpointRow(key, seq, WaitKind.TIMER, owner, text, now))
            return decision

        return isinstance(await self._in_transaction(body), Applied)

    async def resume(self, run_id: str, *, owner_id: str) -> int | None:
        """Resume a waiting Run from its current owner, once decided: QUEUED at the next
        sequence with a new PENDING delivery marked resume. Returns that sequence
        (publish it); None when ``owner_id`` is not the Run's current owner, the owner is
        not decided, or the Run is not waiting."""
        owner = check_text(owner_id, "owner_id")
        key = _run_id(run_id)

        async def body(tx: Transaction) -> Decision:
            pair = await self._locked_pair(tx, key)
            evidence = None if pair is None else await self._owner(tx, pair.run.owner_kind, pair.run.owner_id)
            return await self._run_command(tx, pair, Resume(owner_id=owner, owner=evidence))

        decision = await self._in_transaction(body)
        if isinstance(decision, Applied) and isinstance(decision.reply, Resumed):
            return decision.reply.enqueue_seq
        return None

    async def settle(self, run_id: str, enqueue_seq: int, status: RunStatus, *, error: str | None = None,
                     result: Any = None) -> bool:
        """Settle the claimed hop ``enqueue_seq`` DONE (with ``result``, a JSON object the
        Run keeps, or None) or FAILED (with ``error``), cancelling the Run's pending
        consents and deleting its checkpoint in the same transaction. False: a stale hop,
        a Run that is not executing, or one being cancelled. While a delegated job is open
        or LOST, or a service attempt of this Run is not terminal, raises
        RUN_CONTAINMENT_UNPROVEN: contain them first."""
        return await self._settle(run_id, enqueue_seq, status, error=error, result_json=result_text(status, result))

    async def _settle(self, run_id: str, enqueue_seq: int, status: RunStatus, *, error: str | None,
                      result_json: str | None) -> bool:
        if status not in (RunStatus.DONE, RunStatus.FAILED):
            raise _refuse("status", "done_or_failed_required")
        if status is RunStatus.FAILED:
            error = check_text(error, "error", MAX_ERROR_CHARS)
        elif error is not None:
            raise _refuse("error", "done_has_no_error")
        key = _run_id(run_id)
        seq = _seq(enqueue_seq)

        async def body(tx: Transaction) -> Decision:
            pair = await self._locked_pair(tx, key)
            containment = Containment(0, 0) if pair is None else await self._containment(tx, key)
            command = Settle(enqueue_seq=seq, status=status, error=error, containment=containment,
                             result_json=result_json)
            decision = await self._run_command(tx, pair, command)
            if isinstance(decision, Applied):
                await delete_checkpoint_in(tx, key)  # terminal now: the snapshot's debt is paid
            return decision

        return isinstance(await self._in_transaction(body), Applied)

    async def settle_recorded(self, run_id: str, outcome: RecordedOutcome) -> bool:
        """Settle the Run's hop from the outcome its checkpoint records (recovery's
        ``settle_recorded``: the hop finished, then died before it settled)."""
        if not isinstance(outcome, RecordedOutcome):
            raise _refuse("outcome", "recorded_outcome_required")
        return await self._settle(run_id, outcome.enqueue_seq, outcome.status, error=outcome.error,
                                  result_json=outcome.result_json)

    # --- cancellation ------------------------------------------------------------------

    async def begin_cancel(self, run_id: str) -> CancelTicket | None:
        """Elect the cancellation: a nonterminal Run becomes CANCELLING, freezing its
        delivery generation. Re-entrant: CANCELLING returns the same ticket, CANCELLED a
        ticket with ``already_cancelled`` (repeat the sweep). None: the Run finished
        (DONE or FAILED won) or does not exist."""
        decision = await self._decide(_run_id(run_id), BeginCancel())
        if isinstance(decision, Applied) and isinstance(decision.reply, Ticket):
            return CancelTicket(run_id, decision.reply.enqueue_seq, decision.reply.already_cancelled)
        return None

    async def finish_cancel(self, run_id: str, enqueue_seq: int, broker: Broker) -> bool:
        """Prove containment and make the Run CANCELLED: the frozen hop is aborted at the
        broker if it is live and probed again; every delegated job of the Run must be
        terminal and not LOST, every service attempt terminal. Then one transaction
        cancels pending consents, sets CANCELLED and settles the delivery (True). Raises
        RUN_CONTAINMENT_UNPROVEN otherwise (the Run stays CANCELLING). On an already
        CANCELLED Run it repeats the consent sweep and answers False."""
        key = _run_id(run_id)
        seq = _seq(enqueue_seq)

        async def read(tx: Transaction) -> RunPair | None:
            return await self._read_pair(tx, key)

        seen = await self._in_transaction(read, write=False)
        # Unprobed is unknown (None), never "absent": a cancellation elected after this
        # read must not reach CANCELLED on a broker answer nobody asked for.
        hop: BrokerJobState | None = None
        if seen is not None and seen.run.status is RunStatus.CANCELLING and seen.run.enqueue_seq == seq:
            # Only a frozen generation is fenced: nothing can claim it any more.
            fenced = await fence_hop(broker, hop_key(key, seq))
            hop = None if fenced is None or type(fenced.state) is not BrokerJobState else fenced.state
        return await self._finish_cancel_on(key, seq, hop)

    async def _finish_cancel_on(self, run_id: str, enqueue_seq: int, hop: BrokerJobState | None) -> bool:
        """The finishing transaction, on the hop state the caller's fence observed."""
        async def body(tx: Transaction) -> Decision:
            pair = await self._locked_pair(tx, run_id)
            containment = Containment(0, 0) if pair is None else await self._containment(tx, run_id)
            return await self._run_command(tx, pair, FinishCancel(enqueue_seq=enqueue_seq, hop=hop,
                                                                  containment=containment))

        decision = await self._in_transaction(body)
        return isinstance(decision, Applied) and isinstance(decision.reply, Settled)

    async def _retry_lost_on(self, run_id: str, enqueue_seq: int, hop: BrokerJobState | None) -> int | None:
        """Recovery's retry of a lost hop (the Run machine's ``retry_lost``), on the hop
        state its fence observed: the new sequence, or None when refused."""
        async def body(tx: Transaction) -> Decision:
            pair = await self._locked_pair(tx, run_id)
            containment = Containment(0, 0) if pair is None else await self._containment(tx, run_id)
            decision = await self._run_command(tx, pair, RetryLost(enqueue_seq=enqueue_seq, hop=hop,
                                                                   containment=containment))
            if isinstance(decision, Applied):
                # The lost hop's recorded outcome, if any, belongs to it: the retry starts clean.
                await clear_outcome_in(tx, run_id)
            return decision

        decision = await self._in_transaction(body)
        if isinstance(decision, Applied) and isinstance(decision.reply, Rotated):
            return decision.reply.enqueue_seq
        return None

    # --- recovery ----------------------------------------------------------------------

    async def reconcile(
        self, ports: RecoveryPorts, *, node: str, boot_cutoff: dt.datetime, page_size: int = 128,
        stale_after_s: float = 240.0,
    ) -> RecoveryReport:
        """Startup reconciliation of this node, once, before its workers and relays start:
        finish every CANCELLING Run, clean up after terminal Runs (``delete_checkpoint``),
        fence this node's hops claimed before ``boot_cutoff`` and re-park or fail them,
        repair every QUEUED Run's delivery (failing this node's HELD admissions of an
        earlier boot), resume decided waits and publish what they opened. Each step is
        the recovery table's (``specs/recovery.md``). Never call it from a broker job or
        while this node's workers run: its cutoff says every hop this node claimed
        before it is dead. Runs claimed by another node, or after the cutoff, are never
        touched; a QUEUED Run's active broker job is fenced only when it started more
        than ``stale_after_s`` before the cutoff."""
        return await _recovery.reconcile(self, ports, node=node, boot_cutoff=boot_cutoff, page_size=page_size,
                                         stale_after_s=stale_after_s)

    async def relay(self, ports: RecoveryPorts, *, cursor: str | None = None, page_size: int = 32) -> RecoveryReport:
        """One relay round: at most one page each of QUEUED deliveries (published,
        republished under the same key, or rotated once the broker finished them) and of
        consent, delegated-job and service waits (resumed once their owner decided);
        then one page of consent deadlines that passed (:meth:`expire_due_consents`,
        publishing through ``ports.broker``; a failure there is logged and retried the
        next round, never raised). Relays never fail, re-park or finish a Run (only
        reconciliation has a boot cutoff). Pass the report's ``cursor`` to the next
        call; safe to run from several processes at once (every write is the kernel's
        compare-and-set)."""
        report = await _recovery.relay(self, ports, cursor=cursor, page_size=page_size)
        try:
            await self.expire_due_consents(limit=page_size, broker=ports.broker)
        except Exception as error:  # noqa: BLE001 - the deadlines stay due; the next round applies them
            log.warning("relay: applying consent deadlines failed with %s", type(error).__name__)
        return report

    # --- reads -------------------------------------------------------------------------

    async def database_now(self) -> dt.datetime:
        """The database's clock (the clock every Run timestamp is taken from): the boot
        cutoff a lifespan captures before reconciling."""
        async def body(tx: Transaction) -> int:
            return await tx.now_us()

        micros = await self._in_transaction(body, write=False)
        return _EPOCH + dt.timedelta(microseconds=micros)

    async def get(self, run_id: str) -> RunRecord | None:
        key = _run_id(run_id)

        async def body(tx: Transaction) -> list[RunRow]:
            return await tx.read(RUNS_BINDING, [key])

        found = await self._in_transaction(body, write=False)
        return _public_run(found[0]) if found else None

    async def get_delivery(self, run_id: str, enqueue_seq: int) -> DeliveryRecord | None:
        key = key_of(_run_id(run_id), _seq(enqueue_seq))

        async def body(tx: Transaction) -> list[DeliveryRow]:
            return await tx.read(DELIVERIES_BINDING, [key])

        found = await self._in_transaction(body, write=False)
        return _public_delivery(found[0]) if found else None

    async def list_runs(
        self, *, status: RunStatus | None = None, session_id: str | None = None, after: str | None = None,
        limit: int = 100,
    ) -> RunPage:
        """Runs oldest created first, optionally of one status and one session."""
        if status is not None and type(status) is not RunStatus:
            raise _refuse("status", "run_status_required")
        if session_id is not None:
            check_text(session_id, "session_id")
        if not bounds.is_strict_int(limit) or not 1 <= limit <= 1000:
            raise _refuse("limit", "integer_out_of_range")
        cursor = None if after is None else _parse_cursor(after)
        finder = finders.runs_page(status=status is not None, session=session_id is not None, after=cursor is not None)
        parameters: dict[str, Any] = {}
        if status is not None:
            parameters["status"] = status
        if session_id is not None:
            parameters["session_id"] = session_id
        if cursor is not None:
            parameters.update(after_created=cursor[0], after_id=cursor[1])

        async def body(tx: Transaction) -> list[RunRow]:
            return await tx.find(RUNS_BINDING, finder, parameters, limit + 1)

        rows = await self._in_transaction(body, write=False)
        items = tuple(_public_run(row) for row in rows[:limit])
        return RunPage(items, _cursor_of(rows[limit - 1]) if len(rows) > limit else None)

    # --- consents ----------------------------------------------------------------------

    async def create_consent(
        self, run_id: str, *, tool_name: str, tool_call_id: str, payload: Any, preauthorized_by: str | None = None,
        expires_in_s: float | None = None,
    ) -> ConsentRecord:
        """A pending consent for one tool call of a RUNNING Run (granted at once with
        ``preauthorized_by``). A Run that is missing or not RUNNING raises
        RUN_OWNER_MISMATCH. ``expires_in_s`` (more than 0, at most 30 days) gives it a
        deadline, ``created_at + expires_in_s`` on the database clock, which the relays
        apply: once it passed, :meth:`expire_due_consents` decides it EXPIRED."""
        expires_in_us = _deadline_us(expires_in_s)
        key = _run_id(run_id)
        row = ConsentRow(
            consent_id=str(uuid.uuid4()), run_id=key, tool_name=check_text(tool_name, "tool_name"),
            tool_call_id=check_text(tool_call_id, "tool_call_id"), payload_json=_json_text(payload, "payload"),
            status=ConsentStatus.PENDING, decided_by=None, decided_at_us=None,
            preauthorized_by=None if preauthorized_by is None else check_text(preauthorized_by, "preauthorized_by"),
            created_at_us=0,
        )

        async def body(tx: Transaction) -> ConsentRow:
            runs = await tx.locked(RUNS_BINDING, finders.runs_by_keys, {"keys": [key]})
            running = bool(runs) and runs[0].status is RunStatus.RUNNING
            decision = await self._engine.decide_one(
                tx, CONSENTS_BINDING, None, CreateConsent(row=row, run_running=running, expires_in_us=expires_in_us))
            raise_if_conflict(CONSENTS_BINDING, decision)
            if not isinstance(decision, Applied) or not isinstance(decision.new_record, ConsentRow):
                raise persistence_failed("invariant_broken")
            return decision.new_record

        return _public_consent(await self._in_transaction(body))

    async def decide_consent(self, consent_id: str, verdict: ConsentStatus, *, decided_by: str) -> bool:
        """Record a verdict (GRANTED, DENIED or EXPIRED); the first verdict wins (False
        for any later one). Expiry is a verdict like the others, never derived from a clock."""
        if verdict not in (ConsentStatus.GRANTED, ConsentStatus.DENIED, ConsentStatus.EXPIRED):
            raise _refuse("verdict", "verdict_required")
        command = DecideConsent(verdict=verdict, decided_by=check_text(decided_by, "decided_by", bounds.MAX_IDENTITY_CHARS))
        key = check_text(consent_id, "consent_id", 36)
        async with self._run_errors():
            decisions = await self._engine.on_keys(CONSENTS_BINDING, [(key, command)], finders.consents_by_keys,
                                                   raise_conflicts=True)
        return isinstance(decisions[0], Applied)

    async def expire_due_consents(self, *, limit: int = 32, broker: Broker | None = None) -> int:
        """The deadline owner's round: every pending consent whose deadline passed (at most
        ``limit``, oldest deadline first) is decided EXPIRED by ``tenure:deadline``, one
        consent per transaction on the same path as :meth:`decide_consent`, and its Run
        resumed and, given a ``broker``, published, as a principal's verdict resumes it
        (without one, the relays publish it). Returns how many consents this call expired;
        a consent decided meanwhile is left as it was. The relays call it every round."""
        if not bounds.is_strict_int(limit) or not 1 <= limit <= 1000:
            raise _refuse("limit", "integer_out_of_range")
        if broker is not None and not isinstance(broker, Broker):
            raise _refuse("broker", "broker_required")
        from .workflows import resume_and_publish  # the workflows module names this ledger

        async def body(tx: Transaction) -> list[ConsentRow]:
            return await tx.find(CONSENTS_BINDING, consent_finders.due_consents, {"now": await tx.now_us()}, limit)

        due = await self._in_transaction(body, write=False)
        expire = DecideConsent(verdict=ConsentStatus.EXPIRED, decided_by=DEADLINE_OWNER)
        expired = 0
        for row in due:
            async with self._run_errors():
                decisions = await self._engine.on_keys(CONSENTS_BINDING, [(row.consent_id, expire)],
                                                       finders.consents_by_keys, raise_conflicts=True)
            if not isinstance(decisions[0], Applied):
                continue  # decided (or not due, on this clock) since the page was read
            expired += 1
            if broker is not None:
                await resume_and_publish(self, broker, row.run_id, owner_id=row.consent_id)
            else:
                await self.resume(row.run_id, owner_id=row.consent_id)
        return expired

    async def get_consent(self, consent_id: str) -> ConsentRecord | None:
        key = check_text(consent_id, "consent_id", 36)

        async def body(tx: Transaction) -> list[ConsentRow]:
            return await tx.read(CONSENTS_BINDING, [key])

        found = await self._in_transaction(body, write=False)
        return _public_consent(found[0]) if found else None

    # --- delegated jobs ----------------------------------------------------------------

    async def submit_job(self, run_id: str, *, request_id: str, runtime: str, profile: str, request: Any) -> AgentJobRecord:
        """Record a delegated job of a RUNNING Run, once per ``request_id``: the same request
        again returns the stored job; changed content raises JOB_REQUEST_CONFLICT; a Run
        that is missing or not RUNNING raises RUN_OWNER_MISMATCH."""
        key = _run_id(run_id)
        request_key = check_text(request_id, "request_id")
        job_id = job_id_for(request_key)
        row = AgentJobRow(
            job_id=job_id, request_id=request_key, run_id=key, runtime=check_text(runtime, "runtime"),
            profile=check_text(profile, "profile"), request_json=_json_text(request, "request"),
            status=AgentJobStatus.QUEUED, result_json=None, runtime_job_id=None, created_at_us=0, updated_at_us=0,
        )

        async def body(tx: Transaction) -> AgentJobRow:
            await tx.lock_name(f"tenure:agent-job:{job_id}")
            runs = await tx.locked(RUNS_BINDING, finders.runs_by_keys, {"keys": [key]})
            running = bool(runs) and runs[0].status is RunStatus.RUNNING
            jobs = await tx.locked(AGENT_JOBS_BINDING, finders.jobs_by_keys, {"keys": [job_id]})
            met = jobs[0] if jobs else None
            decision = await self._engine.decide_one(tx, AGENT_JOBS_BINDING, met, SubmitJob(row=row, run_running=running))
            raise_if_conflict(AGENT_JOBS_BINDING, decision)
            if not isinstance(decision, Applied) or not isinstance(decision.new_record, AgentJobRow):
                raise persistence_failed("invariant_broken")
            return decision.new_record

        return _public_job(await self._in_transaction(body))

    async def _job_command(self, job_id: object, command: Any) -> bool:
        key = check_text(job_id, "job_id", 36)
        async with self._run_errors():
            decisions = await self._engine.on_keys(AGENT_JOBS_BINDING, [(key, command)], finders.jobs_by_keys,
                                                   raise_conflicts=True)
        return isinstance(decisions[0], Applied)

    async def advance_job(self, job_id: str, status: AgentJobStatus, *, runtime_job_id: str | None = None) -> bool:
        """Move an open job one step on (ADMITTED, PREPARING, RUNNING), recording the
        runtime's job identity once (a different one raises JOB_REQUEST_CONFLICT)."""
        if status not in (AgentJobStatus.ADMITTED, AgentJobStatus.PREPARING, AgentJobStatus.RUNNING):
            raise _refuse("status", "open_status_required")
        identity = None if runtime_job_id is None else check_text(runtime_job_id, "runtime_job_id")
        return await self._job_command(job_id, AdvanceJob(status=status, runtime_job_id=identity))

    async def adopt_job_result(self, job_id: str, result: Any) -> bool:
        """Adopt a job's one result: a JSON object whose ``job_id`` is this job and whose
        ``status`` is terminal (succeeded carries no ``error``; failed, timed_out and
        lost carry one). False when the job already ended. An ambiguous start (the
        runtime may have begun) is adopted ``lost``, never ``failed``."""
        key = check_text(job_id, "job_id", 36)
        text = _json_text(result, "result")
        # Compared only as text: a status of any other JSON type (a list, an object) is
        # not hashable and is simply not a terminal status.
        terminal = {member.value: member for member in TERMINAL_AGENT_JOB_STATUSES}
        stated = result.get("status") if type(result) is dict else None
        status = terminal.get(stated) if type(stated) is str else None
        if type(result) is not dict:
            problem: str | None = "json_object_required"
        else:
            problem = "result_status_mismatch" if status is None else result_problem(result, key, status)
        if problem is not None:
            raise _refuse("result", problem)
        return await self._job_command(key, AdoptResult(status=status, result_json=text))  # type: ignore[arg-type]

    async def record_job_cancelled(self, job_id: str) -> bool:
        """Record CANCELLED for an open or LOST job, after the runtime's containment
        operation returned (never before: LOST is not evidence that anything stopped)."""
        key = check_text(job_id, "job_id", 36)
        return await self._job_command(key, RecordCancelled(result_json=cancelled_result(key)))

    async def get_job(self, job_id: str) -> AgentJobRecord | None:
        key = check_text(job_id, "job_id", 36)

        async def body(tx: Transaction) -> list[AgentJobRow]:
            return await tx.read(AGENT_JOBS_BINDING, [key])

        found = await self._in_transaction(body, write=False)
        return _public_job(found[0]) if found else None

    async def list_jobs(self, run_id: str) -> Sequence[AgentJobRecord]:
        """Every delegated job of a Run that is open or LOST (what blocks its containment)."""
        key = _run_id(run_id)

        async def body(tx: Transaction) -> list[AgentJobRow]:
            return await tx.find(AGENT_JOBS_BINDING, finders.open_jobs_of_run, {"run_id": key})

        return tuple(_public_job(row) for row in await self._in_transaction(body, write=False))
