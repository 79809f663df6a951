"""Hypothesis strategies for Run pairs and Run commands (see attempts.py).

Records keep every invariant (INV-R1 ... INV-R9) and look like pairs the kernel itself
writes: a Run that was claimed remembers its first start and its node, a CANCELLING Run
froze whatever it was doing, a finished one settled its delivery. Commands come from
small pools with near misses (the hop's sequence one either side, the Run's owner or
another, evidence from this Run or another, containment with zero or one open effect)
so that equal and almost-equal values meet.
"""

from __future__ import annotations

import hashlib
from typing import Any

from hypothesis import strategies as st

from tenure.kernel.runs.commands import (
    Admit,
    BeginCancel,
    Claim,
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
    RetryLost,
    Rotate,
    RunCommandType,
    Settle,
    TimeOut,
)
from tenure.kernel.runs.record import DeliveryRow, RunPair, RunRow, RunStep, key_of
from tenure.model import (
    AgentJobStatus,
    AttemptState,
    BrokerJobState,
    ConsentStatus,
    DeliveryState,
    MessageStatus,
    RunStatus,
    WaitKind,
)

from .pools import BOOLEANS, integers, maybe, optional, sampled

__all__ = [
    "NOW",
    "RUN_ID",
    "OWNER_STATUSES",
    "run_records",
    "run_commands",
    "run_situations",
    "base_run",
    "delivery_for",
    "owner_evidence",
]

NOW = 1_800_000_000_000_000
RUN_ID = "run-1"
OTHER_RUN_ID = "run-2"
NODES = ["node-a", "node-b"]
OWNER_IDS = {WaitKind.CONSENT: "consent-1", WaitKind.DELEGATE: "job-1", WaitKind.SERVICE: "attempt-1",
             WaitKind.TIMER: "timer-1", WaitKind.MESSAGE: "slot-1"}
OTHER_OWNER = "owner-9"
DIGESTS = ["sha256:" + hashlib.sha256(name.encode()).hexdigest() for name in ("intent-1", "intent-2")]
OWNER_STATUSES: dict[WaitKind, list[str]] = {
    WaitKind.CONSENT: [status.value for status in ConsentStatus],
    WaitKind.DELEGATE: [status.value for status in AgentJobStatus],
    WaitKind.SERVICE: [state.value for state in AttemptState],
    WaitKind.MESSAGE: [status.value for status in MessageStatus],
    WaitKind.HARDWARE: ["busy"],
}
"""Every status an owner row of each kind can report (hardware and timers have no owner rows)."""
_OWNED_KINDS = [WaitKind.CONSENT, WaitKind.DELEGATE, WaitKind.SERVICE, WaitKind.MESSAGE]
TIMEOUTS_US = (1, 1_000_000, 3_600_000_000)
"""Timeouts a Run is admitted with: a microsecond, a second, an hour."""

instants = st.integers(NOW - 3, NOW + 3) | st.integers(NOW - 10**12, NOW + 10**12)

_WAIT_OF_STATUS = {
    RunStatus.AWAITING_CONSENT: WaitKind.CONSENT,
    RunStatus.AWAITING_DELEGATE: WaitKind.DELEGATE,
    RunStatus.AWAITING_SERVICE: WaitKind.SERVICE,
    RunStatus.AWAITING_TIMER: WaitKind.TIMER,
    RunStatus.AWAITING_MESSAGE: WaitKind.MESSAGE,
}


def base_run(**changes: Any) -> RunRow:
    """A QUEUED Run at sequence 0 that never ran, with ``changes`` applied."""
    fields: dict[str, Any] = dict(
        run_id=RUN_ID, status=RunStatus.QUEUED, session_id="session-1", source="api", principal="alice",
        scopes=("read", "write"), payload_json='{"prompt":"hi"}', requested_priority=None,
        intent_digest=DIGESTS[0], idempotency_key="key-1", queue="runs", priority=50, workflow_name="answer",
        workflow_revision="r1", workflow_digest="sha256:workflow", enqueue_seq=0, started_at_us=None, node=None,
        owner_kind=None, owner_id=None, error=None, created_at_us=NOW - 100, updated_at_us=NOW - 100,
    )
    fields.update(changes)
    return RunRow(**fields)


def delivery_for(run: RunRow, state: DeliveryState, **changes: Any) -> DeliveryRow:
    """The current delivery of ``run`` in ``state``, with the evidence that state needs."""
    claimed = state is DeliveryState.CLAIMED or changes.pop("was_claimed", False)
    fields: dict[str, Any] = dict(
        delivery_id=key_of(run.run_id, run.enqueue_seq), run_id=run.run_id, enqueue_seq=run.enqueue_seq,
        state=state, queue=run.queue, priority=run.priority, resume=run.enqueue_seq > 0, publish_attempts=0,
        last_error=None, claimed_by=run.node if claimed else None,
        published_at_us=NOW - 90 if state is DeliveryState.PUBLISHED else None,
        claimed_at_us=NOW - 80 if claimed else None,
        settled_at_us=NOW - 70 if state is DeliveryState.SETTLED else None, created_at_us=run.updated_at_us,
    )
    fields.update(changes)
    return DeliveryRow(**fields)


def _identity(draw: st.DrawFn) -> dict[str, Any]:
    priority = draw(sampled([0, 50, 100]))
    created = draw(instants)
    # A deadline now and then: a microsecond, a second or an hour after the admission.
    timeout = draw(optional(sampled(TIMEOUTS_US)))
    return dict(
        deadline_us=None if timeout is None else created + timeout,
        session_id=draw(maybe("session-1")),
        scopes=draw(sampled([(), ("read",), ("read", "write")])),
        requested_priority=draw(maybe(priority)), priority=priority,
        intent_digest=DIGESTS[0], idempotency_key=draw(maybe("key-1")),
        created_at_us=created, updated_at_us=created + draw(integers(0, 10)),
        max_hop_retries=draw(sampled([0, 0, 1, 2])),
    )


def _queued(draw: st.DrawFn, run: RunRow, seq: int) -> tuple[RunRow, DeliveryRow]:
    if seq == 0:
        state = draw(sampled([DeliveryState.HELD, DeliveryState.PENDING, DeliveryState.PUBLISHED]))
    else:
        state = draw(sampled([DeliveryState.PENDING, DeliveryState.PUBLISHED]))
    run = _ran(run, seq) if seq else run
    attempts = 0 if state is DeliveryState.HELD else draw(integers(0, 3))
    if state is DeliveryState.PUBLISHED:
        attempts = max(attempts, 1)
    error = "publish_failed:Timeout" if attempts and draw(BOOLEANS) else None
    return run, delivery_for(run, state, publish_attempts=attempts, last_error=error)


def _ran(run: RunRow, seq: int, node: str = NODES[0]) -> RunRow:
    return RunRow(**{**_fields(run), "enqueue_seq": seq, "started_at_us": run.created_at_us, "node": node})


def _fields(run: RunRow) -> dict[str, Any]:
    return {name: getattr(run, name) for name in RunRow.__dataclass_fields__}


def _with(run: RunRow, **changes: Any) -> RunRow:
    return RunRow(**{**_fields(run), **changes})


def _before_cancel(draw: st.DrawFn, run: RunRow, seq: int) -> tuple[RunRow, DeliveryRow]:
    """What a CANCELLING or CANCELLED Run froze: a queued, executing or waiting hop."""
    frozen = draw(sampled([RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.AWAITING_HARDWARE,
                           RunStatus.AWAITING_CONSENT, RunStatus.AWAITING_DELEGATE,
                           RunStatus.AWAITING_SERVICE, RunStatus.AWAITING_TIMER, RunStatus.AWAITING_MESSAGE]))
    return _in_status(draw, run, frozen, seq)


def _in_status(draw: st.DrawFn, run: RunRow, status: RunStatus, seq: int) -> tuple[RunRow, DeliveryRow]:
    if status is RunStatus.QUEUED:
        run, delivery = _queued(draw, run, seq)
        return _with(run, status=status), delivery
    run = _with(_ran(run, seq, draw(sampled(NODES))), status=status)
    if status in (RunStatus.RUNNING, RunStatus.AWAITING_HARDWARE):
        # Claimed by the node, or by a hop's claimant token (what a worker sends).
        return run, delivery_for(run, DeliveryState.CLAIMED, publish_attempts=draw(integers(0, 2)),
                                 claimed_by=draw(sampled([run.node, "claimant-1"])))
    kind = _WAIT_OF_STATUS[status]
    run = _with(run, owner_kind=kind, owner_id=OWNER_IDS[kind],
                wake_at_us=draw(instants) if kind is WaitKind.TIMER else None)
    return run, delivery_for(run, DeliveryState.SETTLED, was_claimed=True)


@st.composite
def run_records(draw: st.DrawFn, step: RunStep | None = None) -> RunPair | None:
    """A pair keeping every invariant (INV-R1 ... INV-R9), or None for ``absent``. Like
    every pair a command meets, it holds the Run and its current delivery only (two
    deliveries appear only in the decision of a resume, which the ledger writes)."""
    if step is None:
        step = draw(sampled(RunStep))
    if step is RunStep.ABSENT:
        return None
    status = RunStatus(step.value)
    run = base_run(**_identity(draw))
    run = _with(run, hop_retries=draw(integers(0, run.max_hop_retries)))
    seq = draw(sampled([0, 0, 1, 2]))
    if status in (RunStatus.CANCELLING, RunStatus.CANCELLED):
        run, delivery = _before_cancel(draw, run, seq)
        # A Run with a deadline may have been cancelled for it (the reason ``timeout``).
        reason = "timeout" if run.deadline_us is not None and draw(BOOLEANS) else None
        run = _with(run, status=status, error=reason)
        if status is RunStatus.CANCELLED and delivery.state is not DeliveryState.SETTLED:
            delivery = delivery_for(run, DeliveryState.SETTLED, was_claimed=delivery.claimed_by is not None,
                                    publish_attempts=delivery.publish_attempts, last_error=delivery.last_error)
    elif status in (RunStatus.DONE, RunStatus.FAILED):
        held_failure = status is RunStatus.FAILED and draw(BOOLEANS)
        if held_failure:  # fail_held: an admission that never ran
            run = _with(run, status=status, error="retention_failed")
            delivery = delivery_for(run, DeliveryState.SETTLED)
        else:
            result = draw(sampled([None, '{"answer":42}'])) if status is RunStatus.DONE else None
            run = _with(_ran(run, seq), status=status, error="boom" if status is RunStatus.FAILED else None,
                        result_json=result)
            delivery = delivery_for(run, DeliveryState.SETTLED, was_claimed=True)
    else:
        run, delivery = _in_status(draw, run, status, seq)
    return RunPair(run, (delivery,))


def owner_evidence(draw: st.DrawFn, run_id: str, kind: WaitKind | None, owner_id: str | None) -> OwnerEvidence | None:
    """An owner row as the ledger would read it: usually the one named, else missing, of
    another kind, with another ID or of another Run; in any status its kind has, complete
    or not."""
    miss = draw(sampled(["none", "exact", "exact", "exact", "kind", "id", "run"]))
    if miss == "none":
        return None
    if kind is None or kind not in _OWNED_KINDS or miss == "kind":
        kind = draw(sampled(_OWNED_KINDS))
    if owner_id is None or miss == "id":
        owner_id = draw(st.sampled_from([OWNER_IDS[kind], OTHER_OWNER]))
    run = draw(sampled([OTHER_RUN_ID, None])) if miss == "run" else run_id
    status = draw(st.sampled_from(OWNER_STATUSES[kind]))
    return OwnerEvidence(kind, owner_id, run, status, draw(sampled([True, True, True, False])))


def _containment(draw: st.DrawFn) -> Containment:
    if draw(BOOLEANS):
        return Containment(0, 0)
    return Containment(draw(integers(0, 2)), draw(integers(0, 2)))


def _admit(draw: st.DrawFn, record: RunPair | None) -> Admit:
    stored = record.run if record is not None else base_run()
    changed: dict[str, Any] = {}
    variation = draw(sampled(["same", "same", "other_key", "other_intent", "rerouted"]))
    if variation == "other_key":
        changed["idempotency_key"] = draw(sampled([None, "key-2"]))
    elif variation == "other_intent":
        changed["intent_digest"] = DIGESTS[1]
    elif variation == "rerouted":  # the router would choose another route today
        changed["queue"] = "runs-fast"
        if stored.requested_priority is None:
            changed["priority"] = 90
    # The timeout the stored Run was admitted with, or another (none, a near miss, one out
    # of range): a timeout is part of the admitted work.
    stored_timeout = None if stored.deadline_us is None else stored.deadline_us - stored.created_at_us
    timeout = draw(sampled([stored_timeout, stored_timeout, None, *TIMEOUTS_US, 0, -1, 366 * 86_400_000_000 + 1]))
    changed["deadline_us"] = None
    # The command's row is the identity as the ledger built it, never the stored progress.
    row = _with(stored, status=RunStatus.QUEUED, enqueue_seq=0, started_at_us=None, node=None, owner_kind=None,
                owner_id=None, error=None, created_at_us=0, updated_at_us=0, **changed)
    template = delivery_for(row, DeliveryState.PENDING, created_at_us=0)
    return Admit(run=row, delivery=template, hold=draw(BOOLEANS), session_busy=draw(BOOLEANS), timeout_us=timeout)


def _seq_near(draw: st.DrawFn, record: RunPair | None) -> int:
    seq = record.run.enqueue_seq if record is not None else 0
    return max(0, seq + draw(sampled([0, 0, 0, -1, 1])))


@st.composite
def run_commands(draw: st.DrawFn, kind: RunCommandType, record: RunPair | None) -> object:
    C = RunCommandType
    if kind is C.ADMIT:
        return _admit(draw, record)
    if kind is C.BEGIN_CANCEL:
        return BeginCancel()
    if kind is C.TIME_OUT:
        return TimeOut()
    if kind is C.RESUME:
        run = record.run if record is not None else None
        owner_id = run.owner_id if run is not None and run.owner_id is not None and draw(integers(0, 4)) else (
            draw(sampled([*OWNER_IDS.values(), OTHER_OWNER])))
        evidence = owner_evidence(draw, RUN_ID, run.owner_kind if run else None, run.owner_id if run else None)
        return Resume(owner_id=owner_id, owner=evidence)
    seq = _seq_near(draw, record)
    if kind is C.RELEASE:
        return Release(enqueue_seq=seq)
    if kind is C.FAIL_HELD:
        return FailHeld(enqueue_seq=seq, error="retention_failed")
    if kind is C.RECORD_PUBLISHED:
        return RecordPublished(enqueue_seq=seq)
    if kind is C.RECORD_PUBLISH_ERROR:
        return RecordPublishError(enqueue_seq=seq, error="publish_failed:Timeout")
    if kind is C.CLAIM:
        # No claimant, the one the record's claim holds (its repeat), or another.
        claimant = draw(sampled([None, "claimant-1", "claimant-2"]))
        # Any worker, one serving the Run's version, or one serving only another version.
        serves = draw(sampled([None, (("answer", "r1"),), (("answer", "r2"),)]))
        return Claim(enqueue_seq=seq, node=draw(sampled(NODES)), claimant=claimant, serves=serves)
    if kind is C.ENTER_HARDWARE_WAIT:
        return EnterHardwareWait(enqueue_seq=seq)
    if kind is C.LEAVE_HARDWARE_WAIT:
        return LeaveHardwareWait(enqueue_seq=seq)
    if kind is C.PARK:
        wait = draw(sampled(WaitKind))
        owner_id = OWNER_IDS.get(wait, "gpu-0") if draw(integers(0, 3)) else OTHER_OWNER
        # A timer names its due time (now and then none, or one no record can hold);
        # another kind names none (now and then one it must not carry).
        wake = draw(st.one_of(instants, instants, st.none(), sampled([-(2**62), 2**62])))
        if wait is not WaitKind.TIMER and draw(integers(0, 4)):
            wake = None
        # A timer has no owner row (now and then it carries one it must not).
        owner = None if wait is WaitKind.TIMER and draw(integers(0, 3)) else owner_evidence(draw, RUN_ID, wait, owner_id)
        return Park(enqueue_seq=seq, wait=wait, owner_id=owner_id, owner=owner, wake_at_us=wake)
    if kind is C.SETTLE:
        status = draw(sampled([RunStatus.DONE, RunStatus.FAILED]))
        error = "boom" if status is RunStatus.FAILED else None
        result = draw(sampled([None, '{"answer":42}'])) if status is RunStatus.DONE else None
        return Settle(enqueue_seq=seq, status=status, error=error, containment=_containment(draw), result_json=result)
    hop = draw(optional(sampled(BrokerJobState)))
    if kind is C.ROTATE:
        return Rotate(enqueue_seq=seq, hop=hop)
    if kind is C.RETRY_LOST:
        return RetryLost(enqueue_seq=seq, hop=hop, containment=_containment(draw))
    return FinishCancel(enqueue_seq=seq, hop=hop, containment=_containment(draw))


@st.composite
def run_situations(
    draw: st.DrawFn, step: RunStep | None = None, kind: RunCommandType | None = None
) -> tuple[RunPair | None, object, int]:
    record = draw(run_records(step))
    command = draw(run_commands(kind or draw(sampled(RunCommandType)), record))
    if record is not None and record.run.wake_at_us is not None and draw(BOOLEANS):
        now = record.run.wake_at_us + draw(integers(-1, 1))  # where a timer falls due
    elif record is not None and record.run.deadline_us is not None and draw(BOOLEANS):
        now = record.run.deadline_us + draw(integers(-1, 1))  # where a deadline passes
    elif record is not None and draw(BOOLEANS):
        now = record.run.updated_at_us + draw(integers(-1, 1))  # where updated_at stops moving
    else:
        now = draw(instants)
    return record, command, now
