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
import datetime as dt
import functools
import hashlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from tenure.kernel.core import Applied, Decision, Refused, decide
from tenure.kernel.recovery.table import lost_and_retryable
from tenure.kernel.runs import finders
from tenure.kernel.runs.commands import (
    Admit,
    Admitted,
    BeginCancel,
    Claim,
    Claimed,
    EnterHardwareWait,
    FailHeld,
    FinishCancel,
    LeaveHardwareWait,
    Park,
    RecordPublished,
    RecordPublishError,
    Release,
    Resume,
    Resumed,
    Settled,
    Ticket,
    TimedOut,
    TimeOut,
)
from tenure.kernel.runs.aggregate import UNREAD_CONTAINMENT
from tenure.kernel.runs.machine import RUNS, RunRefusal, admitted_timeout_us
from tenure.kernel.runs.record import DeliveryRow, RunPair, RunRow, cancel_frozen_at, key_of
from tenure.model import (
    Admission,
    AgentJobRecord,
    AgentJobStatus,
    BrokerJobState,
    CancelTicket,
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
)
from tenure.model.bounds import MAX_INSTANT_US, MIN_INSTANT_US
from tenure.model.runs import (
    MAX_ERROR_CHARS,
    MAX_QUEUE_CHARS,
    MAX_RUN_TIMEOUT_S,
    check_priority,
    check_run_id,
    check_seq,
    check_text,
)
from tenure.model.validation import datetime_to_micros, micros_to_datetime, refuse

from ..agent_jobs.facade import AGENT_JOB_NAMESPACE, AgentJobs, cancelled_result, job_id_for
from ..consents.facade import Consents
from ..messages.facade import Messages
from ..core.engine import Engine
from ..core.facade import Cursor, Facade, checked_timeout, json_text, parsed_json
from ..core.failures import persistence_failed
from ..core.store import Transaction
from ..core.urls import parse_db_url
from ..nodes.leases import NodeLeases
from ..wiring.dialects import open_store
from . import recovery as _recovery
from .broker import Broker, JoinedPublisher, PinnedPublisher, fence_hop
from .checkpoints import Checkpoints, RecordedOutcome, state_text
from .recovery import RecoveryPorts, RecoveryReport
from .reports import RecoveryReports
from .steps import Steps
from .table import DELIVERIES_BINDING, RUNS_BINDING, CheckpointRow
from .engine import Inputs, RunEngine, Sent, attempt_evidence, consent_evidence, job_evidence

if TYPE_CHECKING:
    from ..attempts.ledger import AttemptLedger
    from ..core.observers import LedgerObserver

__all__ = ["RunLedger", "result_text", "RUN_KEY_NAMESPACE", "RUN_ADMISSION_NAMESPACE", "AGENT_JOB_NAMESPACE", "run_id_for",
           "legacy_run_id_for", "job_id_for",
           "admission_rows", "consent_evidence", "job_evidence", "attempt_evidence", "cancelled_result",
           "public_run", "public_delivery", "resume_and_publish", "expire_due_consents", "time_out_due_receives",
           "Unserved", "UNSERVED"]

log = logging.getLogger("tenure.runs.ledger")

RUN_KEY_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "tenure:run-key")
RUN_ADMISSION_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "tenure:run-admission")
"""The namespace of the source-scoped IDs Runs were admitted under before ``runs_v4``."""


def _served_pairs(serves: object) -> tuple[tuple[str, str], ...]:
    """``serves`` as sorted distinct ``(name, version)`` pairs of bounded text."""
    if isinstance(serves, (str, bytes)) or not isinstance(serves, Iterable):
        raise refuse("serves", "workflow_name_version_pairs_required")
    pairs = set()
    for pair in serves:
        if type(pair) is not tuple or len(pair) != 2 \
                or not all(type(part) is str and 0 < len(part) <= 100 for part in pair):
            raise refuse("serves", "workflow_name_version_pairs_required")
        pairs.add(pair)
    return tuple(sorted(pairs))


def _pin_of(pair: RunPair) -> tuple[str, str]:
    """The ``(name, version)`` a Run is pinned to (what a worker must serve to claim it)."""
    return pair.run.workflow_name, pair.run.workflow_revision


class Unserved:
    """The answer of :meth:`RunLedger.claim_served` to a worker that does not serve the
    Run's workflow (:data:`UNSERVED`, the one instance)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSERVED"


UNSERVED = Unserved()


MAX_TIMER_DELAY_S = 366 * 86_400
"""The longest delay a durable timer takes (a due time may be given for any instant)."""


def run_id_for(idempotency_key: str) -> str:
    """The Run ID an admission under ``idempotency_key`` gets (from any source)."""
    return str(uuid.uuid5(RUN_KEY_NAMESPACE, idempotency_key))


def legacy_run_id_for(source: str, idempotency_key: str) -> str:
    """The ID a Run admitted under ``idempotency_key`` from ``source`` got before
    ``runs_v4`` (it keeps it; see the module docstring)."""
    return str(uuid.uuid5(RUN_ADMISSION_NAMESPACE, f"{source}\n{idempotency_key}"))



def timeout_us_of(timeout_s: object) -> int | None:
    """A Run's timeout in whole microseconds: a finite number of seconds (an ``int`` or a
    ``float``, never a bool) more than 0 and at most 366 days, at least one microsecond
    once rounded; None for None (no deadline). ``ConfigValidationError`` otherwise."""
    if timeout_s is None:
        return None
    # The range alone refuses NaN and the infinities (every comparison with NaN is false),
    # and compares an int too large for a float exactly (math.isfinite would raise).
    if type(timeout_s) not in (int, float) or not 0 < timeout_s <= MAX_RUN_TIMEOUT_S:  # type: ignore[operator]
        raise refuse("timeout_s", "number_out_of_range")
    timeout_us = round(timeout_s * 1_000_000)  # type: ignore[operator]
    if timeout_us < 1:
        raise refuse("timeout_s", "number_out_of_range")
    return timeout_us


def _digest(document: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(document).encode("utf-8")).hexdigest()


def result_text(status: RunStatus, result: Any) -> str | None:
    """The canonical text a DONE Run keeps of its workflow's result: a JSON object of at
    most 1 MiB, or None (a FAILED Run keeps none)."""
    if result is None:
        return None
    if status is not RunStatus.DONE:
        raise refuse("result", "failed_has_no_result")
    if type(result) is not dict:
        raise refuse("result", "json_object_required")
    return json_text(result, "result")


def admission_rows(
    intent: RunIntent, workflow: WorkflowPin, queue: str, priority: int, idempotency_key: str | None, run_id: str,
    node: str | None = None, retry_of: str | None = None,
) -> tuple[RunRow, DeliveryRow]:
    """The Run and delivery 0 an admission asks the kernel to store (checked arguments;
    where they stand and their times are the kernel's)."""
    payload_json = json_text(intent.payload, "payload")
    scopes = tuple(sorted(intent.scopes))
    doctrine = intent.requested_priority if intent.requested_priority is not None else priority
    digest = _digest({
        "session_id": intent.session_id, "source": intent.source, "principal": intent.principal,
        "scopes": list(scopes), "payload": parsed_json(payload_json), "requested_priority": intent.requested_priority,
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


def public_run(row: RunRow) -> RunRecord:
    return RunRecord(
        run_id=row.run_id, status=row.status, session_id=row.session_id, source=row.source,
        principal=row.principal, scopes=frozenset(row.scopes), payload=parsed_json(row.payload_json),
        requested_priority=row.requested_priority, queue=row.queue, priority=row.priority,
        workflow=WorkflowPin(row.workflow_name, row.workflow_revision, row.workflow_digest, row.max_hop_retries),
        idempotency_key=row.idempotency_key, enqueue_seq=row.enqueue_seq, started_at=micros_to_datetime(row.started_at_us),
        node=row.node, owner_kind=row.owner_kind, owner_id=row.owner_id, error=row.error,
        created_at=micros_to_datetime(row.created_at_us), updated_at=micros_to_datetime(row.updated_at_us),
        admitted_node=row.admitted_node, result=parsed_json(row.result_json), hop_retries=row.hop_retries,
        retry_of=row.retry_of, wake_at=micros_to_datetime(row.wake_at_us),
        deadline=micros_to_datetime(row.deadline_us),
    )


def public_delivery(row: DeliveryRow) -> DeliveryRecord:
    return DeliveryRecord(row.run_id, row.enqueue_seq, row.state, row.queue, row.priority, row.resume,
                          row.publish_attempts)


def _cursor_of(row: RunRow) -> str:
    return Cursor.encode(row.created_at_us, row.run_id)


async def resume_and_publish(ledger: RunLedger, broker: Broker, run_id: str, *, owner_id: str) -> int | None:
    """Resume a waiting Run from its decided owner and publish the new hop; the sequence
    (publish failures are left to the relay, which republishes under the same key), or
    None when the Run did not resume (not waiting on that owner, or not decided yet)."""
    # The hop to publish is the decision's declared ``publish_hop`` follow-up.
    seq = (await ledger._resume(run_id, owner_id)).hop_to_publish
    if seq is not None:
        try:
            await ledger.publish(run_id, seq, broker)
        except TenureError as error:
            if error.code is not ErrorCode.RUN_BROKER_FAILED:
                raise
    return seq


class RunLedger(Facade):
    """Runs in one database (SQLite file or PostgreSQL), migrated by ``upgrade``."""

    persistence_code = ErrorCode.RUN_PERSISTENCE_FAILED

    metrics: LedgerObserver | None = None
    """An observer told of each new admission (``tenure runs worker --metrics-port`` sets
    one); None: nothing is observed."""

    def __init__(self, db_url: str, *, timeout_seconds: float = 30.0, db_schema: str | None = None) -> None:
        self._on(Engine(open_store(db_url, timeout_seconds=checked_timeout(timeout_seconds), schema=db_schema)))
        self.database = parse_db_url(db_url).kind.value
        """``sqlite`` or ``postgresql``."""

    def _on(self, engine: Engine) -> None:
        super()._on(engine)
        self.engine = RunEngine(engine)
        """The Run engine (:mod:`tenure.adapters.runs.engine`): the one entry every Run
        command goes through, and the transaction toolkit the sibling facades, recovery
        and the Run worker share (documented in ``docs/runs.md``, "The Run engine")."""

    @functools.cached_property
    def attempts(self) -> AttemptLedger:
        """The service attempts of this database, on this ledger's connections."""
        from ..attempts.ledger import AttemptLedger  # the attempt ledger imports the Run tables

        return AttemptLedger.on_engine(self._engine)

    @functools.cached_property
    def nodes(self) -> NodeLeases:
        """The node leases of this database, on this ledger's connections."""
        return NodeLeases(self.engine)

    @functools.cached_property
    def steps(self) -> Steps:
        """The step journal of this database, on this ledger's connections."""
        return Steps(self.engine, self.get)

    @functools.cached_property
    def checkpoints(self) -> Checkpoints:
        """The workflow checkpoints of this database, on this ledger's connections."""
        return Checkpoints(self.engine)

    @functools.cached_property
    def recovery_reports(self) -> RecoveryReports:
        """The latest recovery report of each node, on this ledger's connections."""
        return RecoveryReports(self.engine)

    # --- admission -----------------------------------------------------------------------

    async def admit(
        self, intent: RunIntent, *, workflow: WorkflowPin, queue: str, priority: int,
        idempotency_key: str | None = None, hold: bool = False, session_fence: bool = False,
        node: str | None = None, timeout_s: float | None = None,
    ) -> Admission:
        """Record a QUEUED Run and its delivery 0 (HELD with ``hold=True``, else PENDING) in
        one transaction, or return the stored admission of the same key and intent. It
        never publishes: publish the returned delivery when it is PENDING. ``node`` names
        the admitting node: startup recovery on a node fails only its own unreleased HELD
        admissions (without one, an admission belongs to every node, as in one
        process). A replay keeps the stored node.

        ``timeout_s`` (more than 0, at most 366 days; None: no deadline) gives the Run a
        deadline: the admission's time on the database clock plus the timeout, stored with
        it (``run.deadline``). A Run not finished by then is cancelled by the relays (or
        startup reconciliation) with proven containment, exactly as an operator's cancel,
        and keeps the reason ``timeout`` as its ``error`` (``run.timed_out``). The timeout
        is part of the admitted work: a replay under the same key with another timeout
        (or none where one was given) raises ``RUN_ADMISSION_CONFLICT``
        (``timeout_changed``)."""
        if type(intent) is not RunIntent:
            raise refuse("intent", "run_intent_required")
        if type(workflow) is not WorkflowPin:
            raise refuse("workflow", "workflow_pin_required")
        queue = check_text(queue, "queue", MAX_QUEUE_CHARS)
        priority = check_priority(priority)
        if idempotency_key is not None:
            check_text(idempotency_key, "idempotency_key", bounds.MAX_IDENTITY_CHARS)
        if type(hold) is not bool or type(session_fence) is not bool:
            raise refuse("hold" if type(hold) is not bool else "session_fence", "boolean_required")
        if session_fence and intent.session_id is None:
            raise refuse("session_fence", "session_required")
        if node is not None:
            check_text(node, "node")
        timeout_us = timeout_us_of(timeout_s)
        return await self._admit(intent, workflow=workflow, queue=queue, priority=priority,
                                 idempotency_key=idempotency_key, hold=hold, session_fence=session_fence, node=node,
                                 timeout_us=timeout_us)

    async def _admit(
        self, intent: RunIntent, *, workflow: WorkflowPin, queue: str, priority: int, idempotency_key: str | None,
        hold: bool, session_fence: bool, node: str | None, retry_of: str | None = None, timeout_us: int | None = None,
    ) -> Admission:
        run_id = run_id_for(idempotency_key) if idempotency_key is not None else str(uuid.uuid4())
        row, template = admission_rows(intent, workflow, queue, priority, idempotency_key, run_id, node, retry_of)

        command = Admit(run=row, delivery=template, hold=hold, session_busy=False, timeout_us=timeout_us)
        sent = await self.engine.send(run_id, command, Inputs(session_fence=session_fence))
        stored = sent.decision.new_record if isinstance(sent.decision, Applied) else None
        if not isinstance(stored, RunPair) or not isinstance(sent.reply, Admitted):
            raise persistence_failed("invariant_broken")
        admission = Admission(public_run(stored.run), public_delivery(stored.current), sent.reply.created)
        if admission.created and self.metrics is not None:
            self.metrics.run_admitted(admission.run)
        return admission

    async def retry(self, run_id: str, *, node: str | None = None) -> Admission | None:
        """Re-admit a Run that failed ``lost`` (its hop died with its process) as a new
        Run with the same intent, workflow pin, queue and priority, linked to it by
        ``retry_of`` and admitted with the same timeout (counted from its own admission);
        the failed Run stays as it is. Idempotent: its key is
        ``retry:<run_id>``, so asking again answers the same new Run (``created=False``).
        None when no such Run exists; a Run that did not fail ``lost`` is refused
        (``ConfigValidationError`` ``run_not_lost``). Publish the returned delivery (or
        leave it to the relays), as after :meth:`admit`."""
        key = check_run_id(run_id)

        async def body(tx: Transaction) -> list[RunRow]:
            return await tx.read(RUNS_BINDING, [key])

        found = await self.engine.read(body)
        if not found:
            return None
        old = public_run(found[0])
        if not lost_and_retryable(old):
            raise refuse("run_id", "run_not_lost")
        return await self._admit(old.intent, workflow=old.workflow, queue=old.queue, priority=old.priority,
                                 idempotency_key=f"retry:{old.run_id}", hold=False, session_fence=False, node=node,
                                 retry_of=old.run_id, timeout_us=admitted_timeout_us(found[0]))

    async def release(self, run_id: str, enqueue_seq: int) -> bool:
        """HELD -> PENDING for exactly this admission's delivery (then publish it)."""
        return await self.engine.applied(check_run_id(run_id), Release(enqueue_seq=check_seq(enqueue_seq)))

    async def fail_held(self, run_id: str, enqueue_seq: int, *, error: str) -> bool:
        """Fail exactly this HELD admission: Run FAILED, delivery SETTLED."""
        command = FailHeld(enqueue_seq=check_seq(enqueue_seq), error=check_text(error, "error", MAX_ERROR_CHARS))
        return await self.engine.applied(check_run_id(run_id), command)

    # --- delivery --------------------------------------------------------------------

    async def publish(self, run_id: str, enqueue_seq: int, broker: Broker) -> bool:
        """Publish the hop ``run:<run_id>:<seq>`` if its delivery is publishable (the Run
        QUEUED at that sequence, the delivery PENDING or PUBLISHED) and record the
        acknowledgement: True when it was recorded; False when nothing was publishable
        (nothing sent) or the hop moved on before the acknowledgement was recorded. A
        broker failure is recorded and raises RUN_BROKER_FAILED; the Run stays QUEUED
        with the same hop key for a retry."""
        key = check_run_id(run_id)
        seq = check_seq(enqueue_seq)

        pair = await self._publishable(key, seq)
        if pair is None:
            return False
        joined = await self._publish_joined(broker, key, seq, pair)
        if joined is not None:
            return joined
        delivery = pair.current
        failure: str | None = None
        try:
            if isinstance(broker, PinnedPublisher):  # only a worker of the Run's pin takes it
                await broker.publish_pinned(hop_key(key, seq), queue=delivery.queue,
                                            wire_priority=broker_priority(delivery.priority), workflow=_pin_of(pair))
            else:
                await broker.publish(hop_key(key, seq), queue=delivery.queue,
                                     wire_priority=broker_priority(delivery.priority))
        except Exception as error:  # any broker failure: recorded, then raised as ours
            failure = f"publish_failed:{type(error).__name__}"
        if failure is not None:
            # Outside the except block: the broker's exception (and its text) never rides
            # along as the context of ours, nor of a persistence failure while recording.
            await self.engine.send(key, RecordPublishError(enqueue_seq=seq, error=failure))
            raise TenureError(ErrorCode.RUN_BROKER_FAILED, "publish_failed")
        return await self.engine.applied(key, RecordPublished(enqueue_seq=seq))

    async def _publish_joined(self, broker: Broker, run_id: str, seq: int, pair: RunPair) -> bool | None:
        """Submit the hop and record its publication in one statement, where the broker
        keeps its hops in this ledger's database (:class:`JoinedPublisher`: tenure's own
        queue on the same PostgreSQL database and schema): the queue kernel decides the
        hop's task as a first submission, the Run kernel ``RECORD_PUBLISHED`` from
        ``pair``, and the statement writes both or neither. True: both written; False:
        the kernel refused the publication on the rows as locked (nothing sent, nothing
        written); None: nothing written (another broker or database, a task already
        stored under the hop's key, a stale pair the kernel still publishes on, a missed
        window): the ordinary path (the broker's publish, then the record) runs, and
        stays the reference."""
        if not isinstance(broker, JoinedPublisher):
            return None
        key = hop_key(run_id, seq)
        delivery = pair.current
        # ``workflow`` only where the broker takes pins (a JoinedPublisher of its own need not).
        pinned = {"workflow": _pin_of(pair)} if isinstance(broker, PinnedPublisher) else {}
        insertion = broker.hop_insertion(key, queue=delivery.queue, wire_priority=broker_priority(delivery.priority),
                                         store=self.engine.engine.store, **pinned)
        if insertion is None:
            return None
        sent = await self.engine.send_beside(run_id, RecordPublished(enqueue_seq=seq), pair, insertion)
        if sent is None:
            return None
        if sent.applied:
            broker.hop_inserted(key)
        return sent.applied

    async def _publishable(self, run_id: str, seq: int) -> RunPair | None:
        """The pair the kernel finds the hop ``seq`` publishable on, or None (send nothing).

        Asked first of the pair this engine last saw (on PostgreSQL: the pair the
        admission, the resume or the publication it sent just wrote), with no read; only
        when none is known, or the kernel refuses on it, is the pair read (a refusal from
        a remembered pair proves nothing: another process may have moved the Run on to
        the hop asked for). A remembered pair that is stale the other way (another
        process cancelled, claimed or settled the Run since) lets the broker be called
        for a hop nobody may run: its ``RECORD_PUBLISHED``, decided ahead from that same
        pair, finds the rows changed and is decided again on the rows as locked, where
        the kernel refuses it (nothing recorded, ``publish`` answers False, as after the
        read); the job the broker holds is then a hop whose claim the Run's fence refuses
        as stale, exactly as a republication racing the same change after the read (and
        a relay's republication) leaves one."""
        command = RecordPublished(enqueue_seq=seq)

        def publishable(pair: RunPair | None) -> bool:
            # The kernel's own answer, from the pair as known, says whether anything may be sent.
            return pair is not None and not isinstance(decide(RUNS, pair, command, pair.run.updated_at_us), Refused)

        remembered = self.engine.last_pair(run_id)
        if publishable(remembered):
            return remembered
        pair = await self.engine.read(lambda tx: self.engine.read_pair(tx, run_id))
        return pair if publishable(pair) else None

    async def claim(self, run_id: str, enqueue_seq: int, *, node: str, claimant: str | None = None) -> RunClaim | None:
        """Claim exactly this hop: QUEUED at ``enqueue_seq`` with a pending or published
        delivery becomes RUNNING with a CLAIMED delivery. None: a stale or duplicate hop.
        ``claimant``: a token the hop draws once and sends with every try of this claim
        (the delivery records it): after a ``RUN_PERSISTENCE_FAILED`` whose COMMIT applied
        unacknowledged, the same call answers the claim it made (without one, it answers
        None and the Run waits for this node's next start). A claimed Run whose stored
        intent cannot be read is settled FAILED ``corrupt_row`` and the claim raises
        ``RUN_PERSISTENCE_FAILED`` ``corrupt_row``."""
        claim = await self.claim_served(run_id, enqueue_seq, node=node, claimant=claimant, serves=None)
        return None if claim is UNSERVED else claim  # type: ignore[return-value]

    async def claim_served(self, run_id: str, enqueue_seq: int, *, node: str, claimant: str | None = None,
                           serves: Iterable[tuple[str, str]] | None) -> RunClaim | Unserved | None:
        """:meth:`claim`, by a worker that serves only the workflows ``serves`` names
        (``(name, version)`` pairs; None: any). A Run pinned to another one is left
        exactly as it was and answers :data:`UNSERVED`: its hop goes back to the broker
        for a worker that serves it, and nothing is spent (the kernel's ``not_served``)."""
        served = None if serves is None else _served_pairs(serves)
        command = Claim(enqueue_seq=check_seq(enqueue_seq), node=check_text(node, "node"),
                        claimant=None if claimant is None else check_text(claimant, "claimant"), serves=served)
        decision = (await self.engine.send(check_run_id(run_id), command)).decision
        if isinstance(decision, Refused) and decision.reason is RunRefusal.NOT_SERVED:
            return UNSERVED
        if not isinstance(decision, Applied) or not isinstance(decision.reply, Claimed):
            return None
        pair: RunPair = decision.new_record  # type: ignore[assignment]
        try:
            run = public_run(pair.run)
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
        return await self.engine.applied(check_run_id(run_id), EnterHardwareWait(enqueue_seq=check_seq(enqueue_seq)))

    async def leave_hardware_wait(self, run_id: str, enqueue_seq: int) -> bool:
        return await self.engine.applied(check_run_id(run_id), LeaveHardwareWait(enqueue_seq=check_seq(enqueue_seq)))

    async def park(self, run_id: str, enqueue_seq: int, *, kind: WaitKind, owner_id: str) -> bool:
        """Park the RUNNING hop ``enqueue_seq`` on an owner of this Run (a consent, a
        delegated job, a service attempt, a receive: ``WaitKind.MESSAGE`` with the
        receive's slot ID), settling its delivery. An owner that does not belong to this
        Run raises RUN_OWNER_MISMATCH. Hardware waits use :meth:`enter_hardware_wait`,
        timers :meth:`park_timer`."""
        if type(kind) is not WaitKind or kind in (WaitKind.HARDWARE, WaitKind.TIMER):
            raise refuse("kind", "owner_kind_required")
        owner = check_text(owner_id, "owner_id")
        key = check_run_id(run_id)
        seq = check_seq(enqueue_seq)

        return await self.engine.applied(key, Park(enqueue_seq=seq, wait=kind, owner_id=owner, owner=None))

    async def park_timer(self, run_id: str, enqueue_seq: int, *, name: str, state: Any = None,
                         wake_at: dt.datetime | None = None, delay_s: float | None = None) -> bool:
        """Park the RUNNING hop ``enqueue_seq`` on a durable timer named ``name`` (the
        owner ID its resume names), due at ``wake_at`` (an aware datetime) or ``delay_s``
        seconds after the database clock read under the Run's lock (exactly one of them).
        One transaction writes the Run's checkpoint (``state``, bound to the timer) and
        the park, so no crash leaves one without the other. The Run resumes once the
        database clock reaches the due time: a relay does it (a timer already due when it
        is set is resumed by :func:`resume_and_publish`).
        False: the hop does not hold the Run any more."""
        owner = check_text(name, "name")
        key = check_run_id(run_id)
        seq = check_seq(enqueue_seq)
        text = state_text(state)
        if (wake_at is None) == (delay_s is None):
            raise refuse("wake_at", "wake_at_or_delay_required")
        due_us = None
        if wake_at is not None:
            if type(wake_at) is not dt.datetime or wake_at.utcoffset() is None:
                raise refuse("wake_at", "aware_datetime_required")
            due_us = datetime_to_micros(wake_at)
            if not MIN_INSTANT_US <= due_us <= MAX_INSTANT_US:
                raise refuse("wake_at", "instant_out_of_range")
        elif type(delay_s) not in (int, float) or not 0 <= delay_s <= MAX_TIMER_DELAY_S:  # type: ignore[operator]
            raise refuse("delay_s", "number_out_of_range")

        # A delay is added to the clock read under the Run's lock (the aggregate's
        # ``clock``); the checkpoint is bound in the park's transaction (``bind_checkpoint``).
        delay_us = None if due_us is not None else round(delay_s * 1_000_000)  # type: ignore[operator]
        command = Park(enqueue_seq=seq, wait=WaitKind.TIMER, owner_id=owner, owner=None, wake_at_us=due_us)
        inputs = Inputs(delay_us=delay_us, checkpoint=CheckpointRow(key, seq, WaitKind.TIMER, owner, text, 0))
        return await self.engine.applied(key, command, inputs)

    async def resume(self, run_id: str, *, owner_id: str) -> int | None:
        """Resume a waiting Run from its current owner, once decided: QUEUED at the next
        sequence with a new PENDING delivery marked resume. Returns that sequence
        (publish it); None when ``owner_id`` is not the Run's current owner, the owner is
        not decided, or the Run is not waiting."""
        reply = (await self._resume(run_id, owner_id)).reply
        return reply.enqueue_seq if isinstance(reply, Resumed) else None

    async def _resume(self, run_id: str, owner_id: str) -> Sent:
        owner = check_text(owner_id, "owner_id")
        key = check_run_id(run_id)
        return await self.engine.send(key, Resume(owner_id=owner, owner=None))

    async def settle(self, run_id: str, enqueue_seq: int, status: RunStatus, *, error: str | None = None,
                     result: Any = None) -> bool:
        """Settle the claimed hop ``enqueue_seq`` DONE (with ``result``, a JSON object the
        Run keeps, or None) or FAILED (with ``error``), cancelling the Run's pending
        consents and deleting its checkpoint in the same transaction. False: a stale hop,
        a Run that is not executing, or one being cancelled. While a delegated job is open
        or LOST, or a service attempt of this Run is not terminal, raises
        RUN_CONTAINMENT_UNPROVEN: contain them first."""
        text = result_text(status, result)
        return await self.engine.settle(run_id, RecordedOutcome(enqueue_seq, status, text, error))

    # --- cancellation ------------------------------------------------------------------

    async def begin_cancel(self, run_id: str) -> CancelTicket | None:
        """Elect the cancellation: a nonterminal Run becomes CANCELLING, freezing its
        delivery generation. Re-entrant: CANCELLING returns the same ticket, CANCELLED a
        ticket with ``already_cancelled`` (repeat the sweep). None: the Run finished
        (DONE or FAILED won) or does not exist."""
        reply = (await self.engine.send(check_run_id(run_id), BeginCancel())).reply
        if isinstance(reply, Ticket):
            return CancelTicket(run_id, reply.enqueue_seq, reply.already_cancelled)
        return None

    async def finish_cancel(self, run_id: str, enqueue_seq: int, broker: Broker) -> bool:
        """Prove containment and make the Run CANCELLED: the frozen hop is aborted at the
        broker if it is live and probed again; every delegated job of the Run must be
        terminal and not LOST, every service attempt terminal. Then one transaction
        cancels pending consents, sets CANCELLED and settles the delivery (True). Raises
        RUN_CONTAINMENT_UNPROVEN otherwise (the Run stays CANCELLING). On an already
        CANCELLED Run it repeats the consent sweep and answers False."""
        key = check_run_id(run_id)
        seq = check_seq(enqueue_seq)

        seen = await self.engine.read(lambda tx: self.engine.read_pair(tx, key))
        # Unprobed is unknown (None), never "absent": a cancellation elected after this
        # read must not reach CANCELLED on a broker answer nobody asked for.
        hop: BrokerJobState | None = None
        if seen is not None and cancel_frozen_at(seen.run, seq):
            # Only a frozen generation is fenced: nothing can claim it any more.
            fenced = await fence_hop(broker, hop_key(key, seq))
            hop = None if fenced is None or type(fenced.state) is not BrokerJobState else fenced.state
        command = FinishCancel(enqueue_seq=seq, hop=hop, containment=UNREAD_CONTAINMENT)
        return isinstance((await self.engine.send(key, command)).reply, Settled)

    async def time_out(self, run_id: str) -> CancelTicket | None:
        """The deadline's owner: elect the cancellation of a Run whose deadline passed on the
        database clock (CANCELLING, with the reason ``timeout`` as its ``error``), as
        :meth:`begin_cancel` elects an operator's; finish it with :meth:`finish_cancel`.
        A Run already CANCELLING answers its ticket unchanged (its own reason kept). None:
        no such Run, no deadline, not due yet, or the Run finished. The relays (and startup
        reconciliation) call it for every Run whose deadline passed."""
        reply = (await self.engine.send(check_run_id(run_id), TimeOut())).reply
        if isinstance(reply, TimedOut | Ticket):
            return CancelTicket(run_id, reply.enqueue_seq, False)
        return None

    # --- recovery ----------------------------------------------------------------------

    async def reconcile(
        self, ports: RecoveryPorts, *, node: str, boot_cutoff: dt.datetime, page_size: int = 128,
        stale_after_s: float = 240.0,
    ) -> RecoveryReport:
        """Startup reconciliation of this node, once, before its workers and relays start:
        time out every Run whose deadline passed (:meth:`time_out`), finish every
        CANCELLING Run, clean up after terminal Runs (``delete_checkpoint``),
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

    async def recover_ended_hop(self, ports: RecoveryPorts, run_id: str, *, node: str,
                                claimed_at: dt.datetime) -> RecoveryReport:
        """Reconcile the Run ``run_id`` as its node's startup reconciliation would, for one
        hop of ``node`` claimed at ``claimed_at`` that provably ended: its workflow
        returned or raised and its settle was refused while an effect of the Run was open
        (the worker's ``unsettled``; :meth:`RunWorker.settle_unsettled`). The recovery
        table fences that hop, contains the open effects and settles the Run with the
        outcome the hop recorded (``specs/recovery.md``). The cutoff lies just after that
        claim, so a later hop of the Run is never fenced from here; a Run that moved on
        otherwise (cancelling, waiting, queued) is decided by the same table."""
        if not isinstance(claimed_at, dt.datetime) or claimed_at.utcoffset() is None:
            raise refuse("claimed_at", "aware_datetime_required")
        claimed_at_us = datetime_to_micros(claimed_at)
        return await _recovery.recover_ended_hop(self, ports, node=node, run_id=run_id, claimed_at_us=claimed_at_us)

    async def relay(self, ports: RecoveryPorts, *, cursor: str | None = None, page_size: int = 32) -> RecoveryReport:
        """One relay round: first one page of Runs whose deadline passed, each timed out
        (:meth:`time_out`) and its cancellation finished as :meth:`finish_cancel` does
        (the frozen hop fenced at ``ports.broker``, containment proven; an open effect
        leaves it CANCELLING, an issue, retried the next rounds); then at most one page
        each of QUEUED deliveries (published,
        republished under the same key, or rotated once the broker finished them) and of
        consent, delegated-job and service waits (resumed once their owner decided);
        then one page of consent deadlines that passed (:func:`expire_due_consents`,
        publishing through ``ports.broker``) and one of receive timeouts that passed
        (:func:`time_out_due_receives`); a failure there is logged and retried the
        next round, never raised. Relays never fail, re-park or settle a Run (only
        reconciliation has a boot cutoff); the only cancellations they finish are
        those of Runs whose deadline passed. Pass the report's ``cursor`` to the next
        call; safe to run from several processes at once (every write is the kernel's
        compare-and-set)."""
        report = await _recovery.relay(self, ports, cursor=cursor, page_size=page_size)
        try:
            await expire_due_consents(self, limit=page_size, broker=ports.broker)
        except Exception as error:  # noqa: BLE001 - the deadlines stay due; the next round applies them
            log.warning("relay: applying consent deadlines failed with %s", type(error).__name__)
        try:
            await time_out_due_receives(self, limit=page_size, broker=ports.broker)
        except Exception as error:  # noqa: BLE001 - the timeouts stay due; the next round applies them
            log.warning("relay: applying receive timeouts failed with %s", type(error).__name__)
        return report

    # --- reads -------------------------------------------------------------------------

    async def database_now(self) -> dt.datetime:
        """The database's clock (the clock every Run timestamp is taken from): the boot
        cutoff a lifespan captures before reconciling."""
        async def body(tx: Transaction) -> int:
            return await tx.now_us()

        micros = await self.engine.read(body)
        return micros_to_datetime(micros)

    async def get(self, run_id: str) -> RunRecord | None:
        key = check_run_id(run_id)

        async def body(tx: Transaction) -> list[RunRow]:
            return await tx.read(RUNS_BINDING, [key])

        found = await self.engine.read(body)
        return public_run(found[0]) if found else None

    async def get_delivery(self, run_id: str, enqueue_seq: int) -> DeliveryRecord | None:
        key = key_of(check_run_id(run_id), check_seq(enqueue_seq))

        async def body(tx: Transaction) -> list[DeliveryRow]:
            return await tx.read(DELIVERIES_BINDING, [key])

        found = await self.engine.read(body)
        return public_delivery(found[0]) if found else None

    async def list_runs(
        self, *, status: RunStatus | None = None, session_id: str | None = None, after: str | None = None,
        limit: int = 100,
    ) -> RunPage:
        """Runs oldest created first, optionally of one status and one session."""
        if status is not None and type(status) is not RunStatus:
            raise refuse("status", "run_status_required")
        if session_id is not None:
            check_text(session_id, "session_id")
        if not bounds.is_strict_int(limit) or not 1 <= limit <= 1000:
            raise refuse("limit", "integer_out_of_range")
        cursor = None if after is None else Cursor.parse(after, lambda key: bounds.is_bounded_text(key, 36))
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

        rows = await self.engine.read(body)
        items = tuple(public_run(row) for row in rows[:limit])
        return RunPage(items, _cursor_of(rows[limit - 1]) if len(rows) > limit else None)

    # --- consents and delegated jobs: their own facades ---------------------------------

    @functools.cached_property
    def consents(self) -> Consents:
        """The consents of this database, on this ledger's connections."""
        return Consents(self.engine)

    @functools.cached_property
    def jobs(self) -> AgentJobs:
        """The delegated jobs of this database, on this ledger's connections."""
        return AgentJobs(self.engine)

    @functools.cached_property
    def messages(self) -> Messages:
        """The messages to this database's Runs and the receives their hops wait on
        (``specs/messages.md``), on this ledger's connections. A send that fills a waiting
        receive resumes its Run through this ledger (and publishes it, given a broker)."""
        return Messages(self.engine, self._resume_owner, lambda broker: isinstance(broker, Broker))

    async def _resume_owner(self, run_id: str, owner_id: str, broker: Broker | None) -> object:
        """Resume the Run waiting on ``owner_id``: published through ``broker`` when given,
        else left PENDING for the relays to publish."""
        if broker is None:
            return await self.resume(run_id, owner_id=owner_id)
        return await resume_and_publish(self, broker, run_id, owner_id=owner_id)



async def expire_due_consents(ledger: RunLedger, *, limit: int = 32, broker: Broker | None = None) -> int:
    """:meth:`Consents.expire_due <tenure.adapters.consents.facade.Consents.expire_due>` on
    the ledger's consents: each consent it expires resumes its Run (the declared
    ``resume_run`` follow-up of a verdict) and, given a ``broker``, publishes it (without
    one, the relays publish it). The relays call it every round."""
    return await ledger.consents.expire_due(resume=_owner_resumer(ledger, limit, broker), limit=limit)


async def time_out_due_receives(ledger: RunLedger, *, limit: int = 32, broker: Broker | None = None) -> int:
    """:meth:`Messages.time_out_due <tenure.adapters.messages.facade.Messages.time_out_due>`
    on the ledger's messages: each receive it times out resumes its Run (the declared
    ``resume_run`` of ``message.time_out``) and, given a ``broker``, publishes it (without
    one, the relays publish it). The relays call it every round."""
    return await ledger.messages.time_out_due(resume=_owner_resumer(ledger, limit, broker), limit=limit)


def _owner_resumer(ledger: RunLedger, limit: object, broker: object) -> Callable[[str, str], Awaitable[object]]:
    """A deadline sweep's checked arguments and its ``resume(run_id, owner_id)``: the
    Run waiting on the owner it ended, published through ``broker`` when given."""
    if not bounds.is_strict_int(limit) or not 1 <= limit <= 1000:  # type: ignore[operator]
        raise refuse("limit", "integer_out_of_range")
    if broker is not None and not isinstance(broker, Broker):
        raise refuse("broker", "broker_required")
    return functools.partial(ledger._resume_owner, broker=broker)
