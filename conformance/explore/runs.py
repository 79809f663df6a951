"""Workflow Runs in their surroundings, for the explorer (:mod:`.engine`).

Theory of operation. A world (:class:`Bounds`) is a few Runs, the node processes that run
their hops (one worker each), the broker that holds each hop under its hop key, the
owners a parked Run waits on (durable timers, consents, delegated jobs), the node lease
rows, and the database clock. Every stored row changes only by the kernel's own
decisions: ``RUNS.decide`` (:mod:`tenure.kernel.runs.machine`) for the pair (Run, current
delivery), the consent, delegated-job and node machines for their rows, and
:func:`tenure.kernel.recovery.table.decide` for what a relay or a reconciliation does next
with one Run, in the ledger's visit loop (gather the evidence the verdict asks for; never
execute a verdict that breaks the recovery rules; write through the Run machine; read
again; at most six writes). What a command meets and carries follows the spec's "met
row" rules: the Run with its current delivery; a park's owner row read under the Run's
lock; a resume's *persisted* owner row, whatever owner the caller names; containment
counted from the Run's delegated jobs; a claim names the sequence of the broker job the
worker took, and the worker then runs the sequence the answer names.

Each actor knows only what it was told. A worker knows the broker job it took, its hop
attempt's claimant token, the sequence its claim answered, whether its claim went
unacknowledged, and the owner it created to park on; a crash forgets all of it (the
broker finishes its job failed). A hop's writes are fenced by the ledger, not by what
the hop last read: a settlement or a park already on its way is sent whether or not the
Run moved on (a checkpoint write, the first step of each, has its own fence,
:func:`tenure.kernel.runs.record.hop_holds`). Ghost fields are history the properties
need (whether a Run was ever resumed; which claim took its current hop) and, for
transition properties only, what the last step asked the kernels and what recovery
decided (``last``, ``judged``: left out of the canonical key).

Actions: a caller admits (held or not), releases or fails its held admission, and a
replay arrives with today's route; a publisher publishes a pending hop (acknowledged, or
stored by the broker with the acknowledgement lost); the broker loses a queued job; a
worker takes a queued job (or the same job again: a redelivery), claims it with its
sequence fence (acknowledged or not) and claims again with the same token; a hop records
its outcome and settles (done or failed), parks on a timer, or asks a consent / delegates
a job, writes its checkpoint naming it and parks on it, or lets go once the Run moved on;
a process crashes, restarts (a boot, then its reconciliation with the boot's time as
cutoff), or a second process boots under a live node's name; the last node renews its
lease and the other nodes' relays take it over (reconciling it as that node) and finish;
a principal grants or denies a consent and the deadline owner expires it; a runtime
reports a delegated job's result or its containment; anyone resumes a wait naming its
owner (or another consent); the operator begins a cancel and finishes it with the
broker's word; the deadline owner times a Run out (sent at any time, to any Run: the
kernel decides whether its deadline passed) and finishes that cancellation; a relay
round times out the Runs whose deadline passed and finishes their cancellations, then
visits the queued Runs, then the waits (a reconciliation times them out first too); the
clock steps to just before, and to, each instant a guard compares with (a timer's due
time, a consent's deadline, a Run's deadline, a receive's deadline, a lease's end, a
takeover claim's end). Messages (:mod:`tenure.kernel.messages`): a sender sends the next
message of one topic to a Run (under the Run's lock it fills the oldest waiting receive,
whose Run it then resumes, or is stored), sends the latest again, or another message
under its ID; a hop receives under a key (a new one, or one already stored: a replay),
takes a stored message at once or waits (with or without a timeout), then checkpoints
and parks on its receive; the deadline owner times a receive out at any time, the relays
time out the due ones and resume their Runs, and a Run's terminal sweep cancels its
pending receives. Child Runs (``Bounds.children``): Run 1's hop starts Run 2 as its child
(``WorkflowContext.start_child``: a delegated job of runtime ``tenure:workflow`` submitted
under the parent's lock, the child admitted, the job advanced naming it), checkpoints and
parks on the job; the adopter (``App.settle_children``) adopts an ended child's end into
the job and resumes the parent; a cancelling parent's child is cancelled (begun, then
finished) and, once it ended, its job recorded cancelled (``App.contain_child``).

Not modelled: hardware waits, service-attempt owners (the attempts model,
:mod:`.attempts`, explores those), lost acknowledgements of settlements and parks (a hop
that retries one finds its own result; the kernel sees a refused repeat), broker probes
that fail, consents granted by a preauthorization, the stale queued-hop fence (the clock
never moves ``stale_after``), and the interleavings inside one recovery visit and between
a hop's checkpoint and its timer park (each is one action); in the children world, crashes,
relays and recovery's containment of a child's job (``contain_child`` through the relays:
the world's operator cascade is its one path), a child that starts its own children, a
crash between a child's submission, admission and the job's advance (one action), and
a resumed parent's replay of ``start_child`` (it finds the job and the child it recorded).

The worlds (:data:`STANDARD`, :data:`SOAK`) and the properties (:data:`PROPERTIES`, each
named with the spec text it checks) are at the end. Nothing here reads a clock or a random
source: the same bounds give the same counts and the same traces.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from tenure.model import (
    ANSWERED_MESSAGE_STATUSES,
    DECIDED_CONSENT_STATUSES,
    LIVE_BROKER_STATES,
    TERMINAL_AGENT_JOB_STATUSES,
    TERMINAL_RUN_STATUSES,
    WAIT_STATUSES,
    AgentJobStatus,
    BrokerJobState,
    ConsentStatus,
    DeliveryState,
    MessageStatus,
    RunStatus,
    WaitKind,
)

from tenure.kernel.agent_jobs import machine as job_machine
from tenure.kernel.agent_jobs.commands import AdoptResult, AdvanceJob, RecordCancelled, SubmitJob
from tenure.kernel.agent_jobs.record import AgentJobRow, job_complete
from tenure.kernel.consents import machine as consent_machine
from tenure.kernel.consents.commands import CancelPending, CreateConsent, DecideConsent
from tenure.kernel.consents.record import ConsentRow
from tenure.kernel.messages import machine as message_machine
from tenure.kernel.messages.commands import CancelPending as CancelPendingReceive
from tenure.kernel.messages.commands import Delivered, ReceiveMessage, SendMessage
from tenure.kernel.messages.commands import TimeOut as TimeOutReceive
from tenure.kernel.messages.record import MESSAGE_STATUSES, MessageRow, answer_complete
from tenure.kernel.core import Applied, replaced
from tenure.kernel.nodes import machine as node_machine
from tenure.kernel.nodes.commands import Boot, Booted, FinishTakeover, Renew, TakeOver, TakingOver
from tenure.kernel.nodes.record import NodeRow, NodeStatus
from tenure.kernel.recovery import table as recovery
from tenure.kernel.runs import machine as run_machine
from tenure.kernel.runs.commands import (
    Admit,
    BeginCancel,
    Claim,
    Claimed,
    Containment,
    FailHeld,
    FinishCancel,
    OwnerEvidence,
    Park,
    RecordPublished,
    RecordPublishError,
    Release,
    Resume,
    Resumed,
    RetryLost,
    Rotate,
    Settle,
    Settled,
    Swept,
    Ticket,
    TimedOut,
    TimeOut,
)
from tenure.kernel.runs.finders import OPEN_JOB_STATUSES
from tenure.kernel.runs.record import HOP_STATUSES, DeliveryRow, RunPair, RunRow, hop_holds, key_of
from .engine import Property, Step

__all__ = [
    "Bounds",
    "Worker",
    "Process",
    "BrokerJob",
    "Checkpoint",
    "Decided",
    "Visit",
    "Judged",
    "RunWorld",
    "RunModel",
    "PROPERTIES",
    "HOPS",
    "ADMISSIONS",
    "CONSENTS",
    "DELEGATES",
    "LEASES",
    "RECOVERY",
    "TAKERS",
    "DEADLINES",
    "MESSAGES",
    "CHILDREN",
    "STANDARD",
    "SOAK",
]

START_US = 1_800_000_000_000_000
TIMER_US = 1_000_000
"""A timer's delay: due one second after its park."""
DEADLINE_US = 60_000_000
"""A consent's deadline, when it is asked with one."""
RUN_TIMEOUT_US = 30_000_000
"""A Run's timeout, in the worlds whose Runs are admitted with one (``Bounds.timeout_us``)."""
RECEIVE_TIMEOUT_US = 10_000_000
"""A receive's timeout, when a hop receives with one."""
TOPIC = "review"
"""The one topic the sender writes to (order is per topic)."""
CHILD_RUNTIME = "tenure:workflow"
"""The runtime of the delegated job that stands for a child Run in its parent
(``tenure.adapters.runs.replay.CHILD_RUNTIME``)."""
CHILD_JOB_STATUS = {RunStatus.DONE: AgentJobStatus.SUCCEEDED, RunStatus.FAILED: AgentJobStatus.FAILED,
                    RunStatus.CANCELLED: AgentJobStatus.CANCELLED}
"""The status a child's end is adopted into its job with (``App.adopt_child``)."""
STALE_AFTER_US = 240_000_000
"""Recovery's ``stale_after`` (the ledger's default)."""
NODE_NAMES = ("node-a", "node-b", "node-c")
QUEUE, PRIORITY = "runs", 50
"""Every Run's admitted route; a replay arrives with today's router choice instead."""
REPLAY_QUEUE, REPLAY_PRIORITY = "rites", 10
DIGEST = "sha256:" + hashlib.sha256(b"tenure explorer intent").hexdigest()
PRINCIPAL = "principal-p"
OWNED_WAITS = frozenset({RunStatus.AWAITING_CONSENT, RunStatus.AWAITING_DELEGATE, RunStatus.AWAITING_SERVICE,
                         RunStatus.AWAITING_MESSAGE})


# --- the world ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Bounds:
    """One closed world: how many of each actor, which actions they may take, and the
    budgets of rare events (crashes, restarts, lost broker jobs, replacements)."""

    name: str
    runs: int = 2
    workers: tuple[int, ...] = (0, 1)
    """The node of each worker (one worker per node process)."""
    nodes: int = 2
    admitted: bool = True
    """The Runs are admitted (pending) in the initial state; else the caller admits them."""
    hold: bool = False
    """Admissions hold the caller's context (``held``) until it releases or fails them."""
    replays: bool = False
    lost_publications: bool = True
    """A publication's acknowledgement may be lost (the broker stored the job)."""
    timers: bool = False
    consents: int = 0
    """Consents each Run's hops may ask."""
    delegates: int = 0
    """Delegated jobs each Run's hops may submit."""
    outcomes: bool = False
    """A hop records its outcome and settles in two steps (others may act between them);
    else the two come as one action."""
    cancel: bool = False
    crashes: int = 0
    restarts: int = 0
    broker_losses: int = 0
    redelivery: bool = False
    relay: bool = False
    leases: bool = False
    """Lease renewals, takeovers and lease ends (else leases outlast the bound)."""
    replacements: int = 0
    """A second process booted under a live node's name (the first one frozen, then back)."""
    takeovers: int = 0
    """Takeovers the other nodes' relays attempt (the last node is the one taken over)."""
    renewals: int = 0
    """Renewals the last node's processes send (each moves its lease end on)."""
    lease_us: int = 3_600_000_000
    max_hop_retries: int = 0
    claimed: bool = False
    """Run 1 starts claimed by the last worker (its broker job active)."""
    timeout_us: int | None = None
    """The timeout every Run is admitted with (its deadline: admission time plus this)."""
    deadlines: bool = False
    """The deadline owner acts on its own, besides the relays: it sends ``time_out`` to any
    Run at any time (the kernel decides) and finishes the cancellations it elected; with
    ``receives``, it also times out any pending receive at any time (the kernel decides)."""
    messages: int = 0
    """Messages the sender sends to each Run (one topic); it may also send the latest one
    again (a replay) and another message under its ID (a conflict)."""
    receives: int = 0
    """Receives each Run's hops may make (keys ``r1``, ``r2``, ...; a hop may name a key
    again: the replay of a resumed hop)."""
    children: bool = False
    """Run 2 is Run 1's child: Run 1's hop starts it (a delegated job of runtime
    ``tenure:workflow`` submitted, the child admitted, the job naming it) and parks on the
    job; the children relay adopts the child's end into the job and resumes the parent;
    the parent's cancel cancels the child and records the job cancelled once it ended.
    Run 2's hops only finish; no other owner is asked (``delegates`` must be 1)."""

    @property
    def symmetric(self) -> bool:
        """Whether the Runs are interchangeable (renamed in the canonical form)."""
        return self.runs > 1 and not self.claimed and not self.children


@dataclasses.dataclass(frozen=True, slots=True)
class Worker:
    """What one worker knows (a crash forgets it)."""

    process: int
    key: str | None = None
    """The broker job (hop key) it took: it waits at its claim gate or runs that hop."""
    token: str | None = None
    """The claimant token of this hop attempt."""
    seq: int | None = None
    """The sequence its claim answered: it runs hop (Run, seq)."""
    unacknowledged: bool = False
    """It sent its claim and never heard back (the claim may have applied)."""
    owner: str | None = None
    """The owner its hop created (a consent or a delegated job) to park on."""
    checkpointed: bool = False
    """Its checkpoint names that owner."""


@dataclasses.dataclass(frozen=True, slots=True)
class Process:
    """One process under a node name: its incarnation, whether it lives, and the takeover
    claim it believes it holds (node, epoch, until)."""

    node: int
    epoch: int
    alive: bool = True
    takeover: tuple[int, int, int] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerJob:
    """One job the broker holds under ``key``; ``taker`` is the worker it was last handed to."""

    key: str
    state: BrokerJobState
    queue: str
    wire_priority: int
    taker: int | None = None
    started_us: int | None = None
    abort_requested: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    """A Run's checkpoint row: the owner its hop parks on, the outcome a finished hop
    recorded (status, sequence)."""

    owner: str | None = None
    outcome: tuple[RunStatus, int] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Decided:
    """One kernel decision of the last step (ghost: for transition properties)."""

    machine: str
    slot: int
    command: Any
    before: Any
    decision: Any
    now_us: int
    actor: str


@dataclasses.dataclass(frozen=True, slots=True)
class Visit:
    """Who runs a recovery pass: the process, the node it reconciles as (None: a relay),
    and, for a takeover, the node row as the takeover met it."""

    phase: recovery.Pass
    process: int
    as_node: int | None
    cutoff_us: int | None
    met: NodeRow | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Judged:
    """One recovery verdict of the last step, with the world it was decided in (ghost)."""

    situation: recovery.Situation
    verdict: recovery.Verdict
    world: RunWorld
    visit: Visit
    broken: tuple[str, ...]
    """The recovery rules the verdict breaks, as the ledger's check found them."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunWorld:
    """One state: the stored rows (Runs with their current delivery, consents, delegated
    jobs, checkpoints, node leases), the broker's jobs, the processes and what each worker
    knows, the database clock, and ghost history."""

    now_us: int
    runs: tuple[RunPair | None, ...]
    consents: tuple[ConsentRow | None, ...]
    jobs: tuple[AgentJobRow | None, ...]
    checkpoints: tuple[Checkpoint, ...]
    nodes: tuple[NodeRow | None, ...]
    processes: tuple[Process, ...]
    workers: tuple[Worker, ...]
    broker: tuple[BrokerJob, ...]
    callers: tuple[bool, ...]
    """Per Run: its admitting caller still holds admission context."""
    spent: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)
    """Crashes, restarts, lost broker jobs, replacements, takeovers and renewals so far."""
    resumed: tuple[bool, ...] = ()
    """Ghost history: the Run was resumed at least once (its hops resume from a checkpoint)."""
    claims: tuple[tuple[int, str] | None, ...] = ()
    """Ghost history: per Run, the (sequence, claimant token) of the claim that took its
    current hop."""
    last: tuple[Decided, ...] = ()
    judged: tuple[Judged, ...] = ()
    mail: tuple[MessageRow, ...] = ()
    """The message slots of every Run, in the order they were stored."""


def _run_id(slot: int) -> str:
    return f"run-{slot + 1}"


def _slot_of_run(run_id: str) -> int:
    return int(run_id.rsplit("-", 1)[1]) - 1


def _parse_key(key: str) -> tuple[int, int] | None:
    """The (Run slot, sequence) a hop key names, or None for a key that is no hop key."""
    parts = key.split(":")
    if len(parts) != 3 or parts[0] != "run" or not parts[2].isdigit():
        return None
    return _slot_of_run(parts[1]), int(parts[2])


def _owner_slot(owner_id: str) -> tuple[str, int, int]:
    kind, run, index = owner_id.split("-")
    return kind, int(run) - 1, int(index) - 1


def _admission(slot: int, bounds: Bounds, *, route: tuple[str, int] = (QUEUE, PRIORITY), hold: bool = False) -> Admit:
    run_id = _run_id(slot)
    queue, priority = route
    row = RunRow(
        run_id=run_id, status=RunStatus.QUEUED, session_id=None, source="api", principal="alice", scopes=("read",),
        payload_json='{"n":1}', requested_priority=None, intent_digest=DIGEST, idempotency_key=f"key-{slot + 1}",
        queue=queue, priority=priority, workflow_name="review", workflow_revision="r1",
        workflow_digest="sha256:workflow", enqueue_seq=0, started_at_us=None, node=None, owner_kind=None,
        owner_id=None, error=None, created_at_us=0, updated_at_us=0, admitted_node=NODE_NAMES[0],
        max_hop_retries=bounds.max_hop_retries,
    )
    delivery = DeliveryRow(
        delivery_id=key_of(run_id, 0), run_id=run_id, enqueue_seq=0, state=DeliveryState.PENDING, queue=queue,
        priority=priority, resume=False, publish_attempts=0, last_error=None, claimed_by=None, published_at_us=None,
        claimed_at_us=None, settled_at_us=None, created_at_us=0,
    )
    return Admit(run=row, delivery=delivery, hold=hold, session_busy=False, timeout_us=bounds.timeout_us)


def _due(pair: RunPair | None, now_us: int) -> bool:
    """Whether the Run is open and its deadline passed: what the relays' finder selects."""
    return pair is not None and pair.run.status not in TERMINAL_RUN_STATUSES and pair.run.deadline_us is not None \
        and now_us >= pair.run.deadline_us


def _consent_evidence(row: ConsentRow) -> OwnerEvidence:
    return OwnerEvidence(WaitKind.CONSENT, row.consent_id, row.run_id, row.status.value,
                         row.decided_by is not None and row.decided_at_us is not None)


def _job_evidence(row: AgentJobRow) -> OwnerEvidence:
    return OwnerEvidence(WaitKind.DELEGATE, row.job_id, row.run_id, row.status.value, job_complete(row))


def _job_result(job_id: str, status: AgentJobStatus) -> str:
    error = '' if status is AgentJobStatus.SUCCEEDED else ',"error":"it ' + status.value + '"'
    return '{"job_id":"' + job_id + '","status":"' + status.value + '"' + error + "}"


def _child_result(job_id: str, child: RunRow) -> str:
    """What a child's end is adopted with (``replay.child_job_result``): its result when
    DONE, else its error (or its status)."""
    status = CHILD_JOB_STATUS[child.status].value
    tail = ',"result":' + (child.result_json or "null") if status == "succeeded" \
        else ',"error":"' + (child.error or status) + '"'
    return '{"job_id":"' + job_id + '","status":"' + status + '"' + tail + "}"


def _cancelled_result(job_id: str) -> str:
    return '{"contained":true,"job_id":"' + job_id + '","status":"cancelled"}'


def _with(world: RunWorld, **changes: Any) -> RunWorld:
    """The world with ``changes`` (the kernel's fast replace of a slotted record)."""
    return replaced(world, changes)


def _at(items: tuple[Any, ...], index: int, value: Any) -> tuple[Any, ...]:
    return (*items[:index], value, *items[index + 1:])

def _decided_in(world: RunWorld, field: str, machine: str, decide: Any, index: int, command: Any,
                actor: str) -> tuple[RunWorld, Any]:
    """The world after ``decide`` (a consent, delegated-job or node kernel) rules on record
    ``index`` of ``field``: the decision logged in ``last``, the record replaced when it applies."""
    records = getattr(world, field)
    before = records[index]
    decision = decide(before, command, world.now_us)
    world = _with(world, last=(*world.last, Decided(machine, index, command, before, decision, world.now_us, actor)))
    if isinstance(decision, Applied):
        world = _with(world, **{field: _at(records, index, decision.new_record)})
    return world, decision



class RunModel:
    """Workflow Runs, their hops, owners, recovery and node leases (see the module)."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.name = f"runs/{bounds.name}: {len(bounds.workers)} workers x {bounds.runs} Runs"
        self.properties = PROPERTIES
        self._orders = (list(itertools.permutations(range(bounds.runs))) if bounds.symmetric
                        else [tuple(range(bounds.runs))])
        self._names: dict[tuple[int, ...], dict[str, str]] = {}
        self._run_forms: dict[tuple[int, int, tuple[int, ...]], tuple[RunPair, tuple[Any, ...]]] = {}
        """A Run's form, by the pair's identity, the clock and the renaming (the pair is
        kept with it, so its identity is not reused): worlds share the pairs they kept."""

    # --- the initial world --------------------------------------------------------------

    def initial(self) -> RunWorld:
        _CHECKED.clear()
        self._run_forms.clear()
        b = self.bounds
        now = START_US
        nodes: list[NodeRow | None] = []
        for index in range(b.nodes):
            booted = node_machine.NODES.decide(None, Boot(node=NODE_NAMES[index], lease_us=b.lease_us), now)
            assert isinstance(booted, Applied)
            nodes.append(booted.new_record)
        world = RunWorld(
            now_us=now, runs=(None,) * b.runs, consents=(None,) * (b.runs * b.consents),
            jobs=(None,) * (b.runs * b.delegates), checkpoints=(Checkpoint(),) * b.runs, nodes=tuple(nodes),
            processes=tuple(Process(node, 1) for node in range(b.nodes)),
            workers=tuple(Worker(process=node) for node in b.workers), broker=(), callers=(False,) * b.runs,
            resumed=(False,) * b.runs, claims=(None,) * b.runs,
        )
        if b.admitted:
            for slot in range(1 if b.children else b.runs):  # a child is admitted by its parent's hop
                world, _ = self._run(world, slot, _admission(slot, b, hold=b.hold), "caller")
                world = _with(world, callers=_at(world.callers, slot, b.hold))
        if b.claimed:
            worker = len(b.workers) - 1
            world = self._publish(world, 0, acknowledged=True)
            world = self._take(world, worker, key_of(_run_id(0), 0))
            world, _ = self._claim(world, worker, "claim")
        return _with(world, last=(), judged=())

    # --- kernel decisions -----------------------------------------------------------------

    def _run(self, world: RunWorld, slot: int, command: Any, actor: str) -> tuple[RunWorld, Any]:
        """The world after the Run machine decides ``command`` on Run ``slot`` (with the
        consent sweep and the checkpoint's removal a terminal decision brings)."""
        before = world.runs[slot]
        decision = run_machine.RUNS.decide(before, command, world.now_us)
        last = (*world.last, Decided("runs", slot, command, before, decision, world.now_us, actor))
        if not isinstance(decision, Applied):
            return _with(world, last=last), decision
        new = decision.new_record
        assert new is not None
        changes: dict[str, Any] = {"last": last, "runs": _at(world.runs, slot, RunPair(new.run, (new.current,)))}
        if before is None or new.run.enqueue_seq != before.run.enqueue_seq:
            changes["claims"] = _at(world.claims, slot, None)
        if isinstance(command, Claim) and isinstance(decision.reply, Claimed) and before is not None \
                and before.run.status is RunStatus.QUEUED and command.claimant is not None:
            changes["claims"] = _at(world.claims, slot, (new.run.enqueue_seq, command.claimant))
        if isinstance(decision.reply, Resumed):
            changes["resumed"] = _at(world.resumed, slot, True)
        if new.run.status in TERMINAL_RUN_STATUSES:
            changes["checkpoints"] = _at(world.checkpoints, slot, Checkpoint())
        world = replaced(world, changes)
        if isinstance(decision.reply, Settled | Swept):
            for index in self._consent_slots(slot):
                if world.consents[index] is not None:
                    world, _ = self._consent(world, index, CancelPending(decided_by=decision.reply.decided_by),
                                             "ledger (sweep)")
            for index, row in enumerate(world.mail):
                if row.run_id == _run_id(slot) and row.status is MessageStatus.PENDING:
                    world, _ = self._message(world, index, CancelPendingReceive(decided_by=decision.reply.decided_by),
                                             "ledger (sweep)")
        return world, decision

    def _message(self, world: RunWorld, index: int | None, command: Any, actor: str) -> tuple[RunWorld, Any]:
        """The world after the message machine rules on slot ``index`` of ``mail`` (None: the
        command met no slot; an applied one appends the new slot)."""
        before = None if index is None else world.mail[index]
        decision = message_machine.MESSAGES.decide(before, command, world.now_us)
        world = _with(world, last=(*world.last, Decided("messages", -1 if index is None else index, command, before,
                                                         decision, world.now_us, actor)))
        if isinstance(decision, Applied) and decision.new_record is not None and decision.new_record != before:
            mail = (*world.mail, decision.new_record) if index is None else _at(world.mail, index,
                                                                                 decision.new_record)
            world = _with(world, mail=mail)
        return world, decision

    def _consent(self, world: RunWorld, index: int, command: Any, actor: str) -> tuple[RunWorld, Any]:
        return _decided_in(world, "consents", "consent", consent_machine.CONSENTS.decide, index, command, actor)

    def _job(self, world: RunWorld, index: int, command: Any, actor: str) -> tuple[RunWorld, Any]:
        return _decided_in(world, "jobs", "agent_jobs", job_machine.AGENT_JOBS.decide, index, command, actor)

    def _node(self, world: RunWorld, index: int, command: Any, actor: str) -> tuple[RunWorld, Any]:
        return _decided_in(world, "nodes", "nodes", node_machine.NODES.decide, index, command, actor)

    # --- what the ledger reads ------------------------------------------------------------------

    def _consent_slots(self, slot: int) -> range:
        return range(slot * self.bounds.consents, (slot + 1) * self.bounds.consents)

    def _job_slots(self, slot: int) -> range:
        return range(slot * self.bounds.delegates, (slot + 1) * self.bounds.delegates)

    def _owner_row(self, world: RunWorld, owner_id: str | None) -> ConsentRow | AgentJobRow | MessageRow | None:
        if owner_id is None or owner_id.count("-") != 2:
            return None
        kind, run, index = _owner_slot(owner_id)
        if kind == "consent" and index < self.bounds.consents:
            return world.consents[run * self.bounds.consents + index]
        if kind == "job" and index < self.bounds.delegates:
            return world.jobs[run * self.bounds.delegates + index]
        if kind == "mail":
            return next((row for row in world.mail if row.slot_id == owner_id), None)
        return None

    def _evidence(self, world: RunWorld, kind: WaitKind | None, owner_id: str | None) -> OwnerEvidence | None:
        row = self._owner_row(world, owner_id)
        if kind is WaitKind.CONSENT and isinstance(row, ConsentRow):
            return _consent_evidence(row)
        if kind is WaitKind.DELEGATE and isinstance(row, AgentJobRow):
            return _job_evidence(row)
        if kind is WaitKind.MESSAGE and isinstance(row, MessageRow):
            return OwnerEvidence(WaitKind.MESSAGE, row.slot_id, row.run_id, row.status.value, answer_complete(row))
        return None

    def _containment(self, world: RunWorld, slot: int) -> Containment:
        jobs = [world.jobs[index] for index in self._job_slots(slot)]
        return Containment(open_jobs=sum(1 for job in jobs if job is not None and job.status in OPEN_JOB_STATUSES),
                           open_attempts=0)

    @staticmethod
    def _job_of(world: RunWorld, key: str) -> int | None:
        for index, job in enumerate(world.broker):
            if job.key == key:
                return index
        return None

    def _live_worker(self, world: RunWorld, worker: int) -> bool:
        return world.processes[world.workers[worker].process].alive

    # --- the broker -------------------------------------------------------------------------

    def _broker_put(self, world: RunWorld, job: BrokerJob) -> RunWorld:
        index = self._job_of(world, job.key)
        jobs = list(world.broker)
        if index is None:
            jobs.append(job)
        else:
            jobs[index] = job
        return _with(world, broker=tuple(sorted(jobs, key=lambda item: item.key)))

    def _probe(self, world: RunWorld, key: str) -> recovery.Probe:
        index = self._job_of(world, key)
        if index is None:
            return recovery.Probe(BrokerJobState.ABSENT)
        job = world.broker[index]
        started = job.started_us if job.state is BrokerJobState.ACTIVE else None
        return recovery.Probe(job.state, started, queue=job.queue, wire_priority=job.wire_priority)

    def _abort(self, world: RunWorld, key: str, *, terminal: bool) -> RunWorld:
        """Abort a live job: a queued one stops; an active one stops at once when terminal
        or when its worker is gone, else once its worker lets go (it counts live till then)."""
        index = self._job_of(world, key)
        if index is None:
            return world
        job = world.broker[index]
        if job.state is BrokerJobState.QUEUED or (job.state is BrokerJobState.ACTIVE and (
                terminal or job.taker is None or not self._holds_job(world, job.taker, key))):
            return self._broker_put(world, dataclasses.replace(job, state=BrokerJobState.ABORTED))
        if job.state is BrokerJobState.ACTIVE:
            return self._broker_put(world, dataclasses.replace(job, abort_requested=True))
        return world

    def _holds_job(self, world: RunWorld, worker: int, key: str) -> bool:
        return self._live_worker(world, worker) and world.workers[worker].key == key

    def _finish_job(self, world: RunWorld, key: str, state: BrokerJobState, worker: int) -> RunWorld:
        """The job ends when the worker it was last handed to ends its hop (a holder whose
        broker claim lapsed, the job handed to another, cannot finish it)."""
        index = self._job_of(world, key)
        if index is None or world.broker[index].state is not BrokerJobState.ACTIVE \
                or world.broker[index].taker != worker:
            return world
        job = world.broker[index]
        ended = BrokerJobState.ABORTED if job.abort_requested else state
        return self._broker_put(world, dataclasses.replace(job, state=ended))

    def _publish(self, world: RunWorld, slot: int, *, acknowledged: bool) -> RunWorld:
        """The ledger's ``publish``: asked of the kernel from the pair as read, then the
        broker under the hop key, then the acknowledgement (or the failure) recorded."""
        pair = world.runs[slot]
        assert pair is not None
        seq = pair.run.enqueue_seq
        key = key_of(_run_id(slot), seq)
        if self._job_of(world, key) is None:
            world = self._broker_put(world, BrokerJob(key, BrokerJobState.QUEUED, pair.current.queue,
                                                      100 - pair.current.priority))
        command: Any = RecordPublished(enqueue_seq=seq) if acknowledged else RecordPublishError(
            enqueue_seq=seq, error="publish_failed:BrokerUnavailable")
        world, _ = self._run(world, slot, command, "publisher")
        return world

    def _take(self, world: RunWorld, worker: int, key: str) -> RunWorld:
        index = self._job_of(world, key)
        assert index is not None
        job = world.broker[index]
        world = self._broker_put(world, dataclasses.replace(job, state=BrokerJobState.ACTIVE, taker=worker,
                                                            started_us=world.now_us))
        token = f"w{worker + 1}.{world.workers[worker].process}.{key}"
        return self._set_worker(world, worker, Worker(process=world.workers[worker].process, key=key, token=token))

    def _set_worker(self, world: RunWorld, worker: int, value: Worker) -> RunWorld:
        return _with(world, workers=_at(world.workers, worker, value))

    def _drop(self, world: RunWorld, worker: int, state: BrokerJobState = BrokerJobState.COMPLETE) -> RunWorld:
        """The worker's hop task ends: its broker job finishes (aborted if an abort was asked)."""
        key = world.workers[worker].key
        if key is not None:
            world = self._finish_job(world, key, state, worker)
        return self._set_worker(world, worker, Worker(process=world.workers[worker].process))

    # --- successors -----------------------------------------------------------------------------

    def successors(self, world: RunWorld) -> Iterator[tuple[Step, RunWorld]]:
        for step, after in self._actions(_with(world, last=(), judged=())):
            # A step whose every decision its actor asked for was refused says so in its row.
            actor = step.actor.split("#")[0]
            own = [last for last in after.last if last.actor.split(" ")[0] == actor]
            if own and not any(isinstance(last.decision, Applied) for last in own):
                reason = own[0].decision.reason.value
                step = Step(step.actor, step.action, f"{step.detail} (refused: {reason})".lstrip())
            yield step, after

    def _actions(self, world: RunWorld) -> Iterator[tuple[Step, RunWorld]]:
        yield from self._callers(world)
        yield from self._publishers(world)
        for worker in range(len(world.workers)):
            if self._live_worker(world, worker):
                yield from self._worker(world, worker)
        yield from self._owners(world)
        yield from self._sender(world)
        yield from self._children(world)
        yield from self._operator(world)
        yield from self._deadline_owner(world)
        yield from self._relays(world)
        yield from self._processes(world)
        yield from self._clock(world)

    def _callers(self, world: RunWorld) -> Iterator[tuple[Step, RunWorld]]:
        b = self.bounds
        caller_alive = world.processes[self._current_process(world, 0)].alive
        for slot in range(1 if b.children else b.runs):
            pair = world.runs[slot]
            name = _run_id(slot)
            if pair is None:
                if caller_alive:
                    after, decision = self._run(world, slot, _admission(slot, b, hold=b.hold), "caller")
                    held = b.hold and isinstance(decision, Applied)
                    yield Step("caller", "admit (held)" if b.hold else "admit", name), _with(
                        after, callers=_at(after.callers, slot, held))
                continue
            if b.replays:
                replay = _admission(slot, b, route=(REPLAY_QUEUE, REPLAY_PRIORITY))
                after, _ = self._run(world, slot, replay, "caller (replay)")
                yield Step("caller", "replay with today's route", name), after
            if world.callers[slot] and caller_alive:
                seq = pair.run.enqueue_seq
                for action, command in (("release", Release(enqueue_seq=seq)),
                                        ("fail its held admission", FailHeld(enqueue_seq=seq, error="context lost"))):
                    after, _ = self._run(world, slot, command, "caller")
                    yield Step("caller", action, name), _with(
                        after, callers=_at(after.callers, slot, False))

    def _publishers(self, world: RunWorld) -> Iterator[tuple[Step, RunWorld]]:
        for slot, pair in enumerate(world.runs):
            if pair is None or pair.run.status is not RunStatus.QUEUED \
                    or pair.current.state is not DeliveryState.PENDING:
                continue
            name = f"{_run_id(slot)}/{pair.run.enqueue_seq}"
            yield Step("publisher", "publish", name), self._publish(world, slot, acknowledged=True)
            if self.bounds.lost_publications:
                yield Step("publisher", "publish (ack lost)", name), self._publish(world, slot, acknowledged=False)
        if world.spent[2] < self.bounds.broker_losses:
            for job in world.broker:
                if job.state is BrokerJobState.QUEUED:
                    after = _with(world, broker=tuple(item for item in world.broker if item != job),
                                                spent=_spend(world.spent, 2))
                    yield Step("broker", "loses a queued job", job.key), after

    # --- a worker ---------------------------------------------------------------------------------

    def _worker(self, world: RunWorld, worker: int) -> Iterator[tuple[Step, RunWorld]]:
        me = world.workers[worker]
        name = f"w{worker + 1}"
        if me.key is None:
            for job in world.broker:
                redelivered = job.state is BrokerJobState.ACTIVE and job.taker != worker and self.bounds.redelivery
                if job.state is BrokerJobState.QUEUED or redelivered:
                    action = "takes the same job again (redelivery)" if redelivered else "takes a job"
                    yield Step(name, action, job.key), self._take(world, worker, job.key)
            return
        if me.seq is None:
            action = "claim again (same token)" if me.unacknowledged else "claim"
            after, claimed = self._claim(world, worker, action)
            yield Step(name, action, me.key), after
            if claimed and not me.unacknowledged:
                lost = self._set_worker(after, worker, dataclasses.replace(me, unacknowledged=True))
                yield Step(name, f"{action} (ack lost)", me.key), lost
            return
        parsed = _parse_key(me.key)
        assert parsed is not None
        slot = parsed[0]
        pair = world.runs[slot]
        assert pair is not None
        hop = f"{_run_id(slot)}/{me.seq}"
        holds = hop_holds(pair.run, me.seq)
        if not holds:
            yield Step(name, "lets go (the Run moved on)", hop), self._drop(world, worker)
        # The hop's writes are fenced by the ledger, not by what the hop last read: one
        # already on its way is sent whether or not the Run moved on meanwhile.
        yield from self._hop(world, worker, slot, me, name, hop, holds)

    def _claim(self, world: RunWorld, worker: int, action: str) -> tuple[RunWorld, bool]:
        """The worker's claim of the hop its broker job names; answered: it runs the hop the
        answer names; refused: the hop is skipped (its task ends)."""
        me = world.workers[worker]
        assert me.key is not None and me.token is not None
        parsed = _parse_key(me.key)
        assert parsed is not None
        slot, seq = parsed
        node = NODE_NAMES[world.processes[me.process].node]
        after, decision = self._run(world, slot, Claim(enqueue_seq=seq, node=node, claimant=me.token), f"w{worker + 1}")
        if isinstance(decision, Applied) and isinstance(decision.reply, Claimed):
            return self._set_worker(after, worker, dataclasses.replace(
                me, seq=decision.reply.enqueue_seq, unacknowledged=False)), True
        return self._drop(after, worker), False

    def _hop(self, world: RunWorld, worker: int, slot: int, me: Worker, name: str, hop: str, holds: bool
             ) -> Iterator[tuple[Step, RunWorld]]:
        """A running hop finishes (its outcome recorded in its checkpoint, under the
        checkpoint's fence, then settled), parks on a timer (its checkpoint, then the park)
        or on an owner it creates."""
        b = self.bounds
        assert me.seq is not None
        seq = me.seq
        recorded = world.checkpoints[slot].outcome
        if recorded is not None and recorded[1] == seq:
            yield from self._settle(world, worker, slot, seq, recorded[0], name, hop)
            return
        if not holds:
            if me.checkpointed:
                yield from self._owned_waits(world, worker, slot, me, name, hop)  # its park is on its way
            elif me.owner is None and b.receives:
                yield from self._receives(world, worker, slot, me, name)  # a receive is fenced in its own transaction
            return  # every other write of the hop begins with a checkpoint the fence refuses: it stops
        for status in (RunStatus.DONE, RunStatus.FAILED):
            checkpoint = _with(world, checkpoints=_at(world.checkpoints, slot, Checkpoint(
                world.checkpoints[slot].owner, (status, seq))))
            if b.outcomes:
                yield Step(name, f"records its outcome ({status.value})", hop), checkpoint
            else:
                yield from self._settle(checkpoint, worker, slot, seq, status, name, hop)
        if b.timers:
            park = Park(enqueue_seq=seq, wait=WaitKind.TIMER, owner_id=f"sleep:{seq}", owner=None,
                        wake_at_us=world.now_us + TIMER_US)
            after, _ = self._run(world, slot, park, name)
            yield Step(name, "parks on a timer (+1 s)", hop), self._drop(after, worker)
        yield from self._owned_waits(world, worker, slot, me, name, hop)

    def _settle(self, world: RunWorld, worker: int, slot: int, seq: int, status: RunStatus, name: str, hop: str
                ) -> Iterator[tuple[Step, RunWorld]]:
        settle = Settle(enqueue_seq=seq, status=status, error=None if status is RunStatus.DONE else "it broke",
                        containment=self._containment(world, slot),
                        result_json='{"ok":true}' if status is RunStatus.DONE else None)
        after, _ = self._run(world, slot, settle, name)
        yield Step(name, f"settles ({status.value})", hop), self._drop(after, worker)

    def _owned_waits(self, world: RunWorld, worker: int, slot: int, me: Worker, name: str, hop: str
                     ) -> Iterator[tuple[Step, RunWorld]]:
        b = self.bounds
        assert me.seq is not None
        pair = world.runs[slot]
        assert pair is not None
        running = pair.run.status is RunStatus.RUNNING
        if me.owner is None and b.children:
            if slot == 0 and world.jobs[0] is None:
                yield from self._start_child(world, worker, me, name, running)
            return  # a child's hops only finish
        if me.owner is None:
            free = [index for index in self._consent_slots(slot) if world.consents[index] is None]
            if free:
                index = free[0]
                consent_id = f"consent-{slot + 1}-{index - slot * b.consents + 1}"
                row = ConsentRow(consent_id=consent_id, run_id=_run_id(slot), tool_name="shell",
                                 tool_call_id=f"call-{index}", payload_json='{"command":"ls"}',
                                 status=ConsentStatus.PENDING, decided_by=None, decided_at_us=None,
                                 preauthorized_by=None, created_at_us=0)
                for label, expires in (("with a deadline", DEADLINE_US), ("without a deadline", None)):
                    after, decision = self._consent(world, index, CreateConsent(
                        row=row, run_running=running, expires_in_us=expires), name)
                    owned = consent_id if isinstance(decision, Applied) else None
                    yield Step(name, f"asks a consent {label}", consent_id), self._set_worker(
                        after, worker, dataclasses.replace(me, owner=owned))
            free = [index for index in self._job_slots(slot) if world.jobs[index] is None]
            if free:
                index = free[0]
                job_id = f"job-{slot + 1}-{index - slot * b.delegates + 1}"
                job = AgentJobRow(job_id=job_id, request_id=f"request-{index}", run_id=_run_id(slot),
                                  runtime="runtime-r", profile="profile-p", request_json='{"task":1}',
                                  status=AgentJobStatus.QUEUED, result_json=None, runtime_job_id=None,
                                  created_at_us=0, updated_at_us=0)
                after, decision = self._job(world, index, SubmitJob(row=job, run_running=running), name)
                owned = job_id if isinstance(decision, Applied) else None
                yield Step(name, "delegates a job", job_id), self._set_worker(
                    after, worker, dataclasses.replace(me, owner=owned))
            if b.receives:
                yield from self._receives(world, worker, slot, me, name)
            return
        if not me.checkpointed:
            if not hop_holds(pair.run, me.seq):
                return  # the checkpoint's own fence: written only while the hop holds its Run
            checkpoint = dataclasses.replace(world.checkpoints[slot], owner=me.owner)
            after = _with(world, checkpoints=_at(world.checkpoints, slot, checkpoint))
            yield Step(name, "writes its checkpoint naming", me.owner), self._set_worker(
                after, worker, dataclasses.replace(me, checkpointed=True))
            return
        kind = {"consent": WaitKind.CONSENT, "job": WaitKind.DELEGATE, "mail": WaitKind.MESSAGE}[me.owner.split("-")[0]]
        park = Park(enqueue_seq=me.seq, wait=kind, owner_id=me.owner, owner=self._evidence(world, kind, me.owner))
        after, _ = self._run(world, slot, park, name)
        yield Step(name, f"parks on its {kind.value}", me.owner), self._drop(after, worker)

    # --- owners, the operator --------------------------------------------------------------

    def _owners(self, world: RunWorld) -> Iterator[tuple[Step, RunWorld]]:
        for index, consent in enumerate(world.consents):
            if consent is None:
                continue
            for actor, action, verdict in (
                (PRINCIPAL, "grants", DecideConsent(verdict=ConsentStatus.GRANTED, decided_by=PRINCIPAL)),
                (PRINCIPAL, "denies", DecideConsent(verdict=ConsentStatus.DENIED, decided_by=PRINCIPAL)),
                ("deadline owner", "expires",
                 DecideConsent(verdict=ConsentStatus.EXPIRED, decided_by=consent_machine.DEADLINE_OWNER)),
            ):
                after, _ = self._consent(world, index, verdict, actor)
                yield Step(actor, action, consent.consent_id), after
        for index, job in enumerate(world.jobs):
            if job is None or job.runtime == CHILD_RUNTIME:  # a child's job follows its child (see _children)
                continue
            for status in (AgentJobStatus.SUCCEEDED, AgentJobStatus.FAILED, AgentJobStatus.LOST):
                command: Any = AdoptResult(status=status, result_json=_job_result(job.job_id, status))
                after, _ = self._job(world, index, command, "runtime")
                yield Step("runtime", f"reports {status.value}", job.job_id), after
            if job.status in OPEN_JOB_STATUSES:
                command = RecordCancelled(result_json=_cancelled_result(job.job_id))
                after, _ = self._job(world, index, command, "runtime")
                yield Step("runtime", "containment returned", job.job_id), after
        for slot, pair in enumerate(world.runs):
            if pair is None or pair.run.status not in WAIT_STATUSES:
                continue
            owners = [pair.run.owner_id]
            owners += [row.consent_id for row in (world.consents[i] for i in self._consent_slots(slot))
                       if row is not None and row.consent_id != pair.run.owner_id]
            for owner_id in owners:
                assert owner_id is not None
                evidence = self._evidence(world, pair.run.owner_kind, pair.run.owner_id)
                after, _ = self._run(world, slot, Resume(owner_id=owner_id, owner=evidence), "resumer")
                yield Step("resumer", "resumes naming", f"{_run_id(slot)} by {owner_id}"), after

    # --- child Runs -------------------------------------------------------------------------

    def _start_child(self, world: RunWorld, worker: int, me: Worker, name: str, running: bool
                     ) -> Iterator[tuple[Step, RunWorld]]:
        """``WorkflowContext.start_child``: the job submitted under the parent's lock (refused
        unless the parent runs), the child admitted (idempotently, by its key), then the job
        advanced to ADMITTED naming the child Run."""
        job = AgentJobRow(job_id="job-1-1", request_id="run-1@1", run_id=_run_id(0), runtime=CHILD_RUNTIME,
                          profile="review", request_json='{"key":"child:run-1@1","workflow":"review"}',
                          status=AgentJobStatus.QUEUED, result_json=None, runtime_job_id=None,
                          created_at_us=0, updated_at_us=0)
        after, decision = self._job(world, 0, SubmitJob(row=job, run_running=running), name)
        owned = None
        if isinstance(decision, Applied):
            after, _ = self._run(after, 1, _admission(1, self.bounds), name)
            after, _ = self._job(after, 0, AdvanceJob(status=AgentJobStatus.ADMITTED, runtime_job_id=_run_id(1)),
                                 name)
            owned = job.job_id
        yield Step(name, "starts a child", f"{_run_id(1)} as {job.job_id}"), self._set_worker(
            after, worker, dataclasses.replace(me, owner=owned))

    def _children(self, world: RunWorld) -> Iterator[tuple[Step, RunWorld]]:
        """The children relay (``App.settle_children``): a child's end adopted into its job
        and the parent waiting on it resumed; a cancelling parent's child cancelled (begun,
        then finished as ``finish_cancel`` does) and, once it ended, its job recorded
        cancelled (``App.contain_child``)."""
        if not self.bounds.children or world.jobs[0] is None or world.runs[1] is None:
            return
        job, child, parent = world.jobs[0], world.runs[1].run, world.runs[0]
        assert parent is not None
        ended = child.status in TERMINAL_RUN_STATUSES
        if ended and job.status in OPEN_JOB_STATUSES:
            status = CHILD_JOB_STATUS[child.status]
            adopt = AdoptResult(status=status, result_json=_child_result(job.job_id, child))
            after, _ = self._job(world, 0, adopt, "adopter")
            if parent.run.status is RunStatus.AWAITING_DELEGATE and parent.run.owner_id == job.job_id:
                after, _ = self._run(after, 0, Resume(owner_id=job.job_id, owner=self._evidence(
                    after, WaitKind.DELEGATE, job.job_id)), "adopter")
            yield Step("adopter", "adopts the child's end", f"{child.status.value} into {job.job_id}"), after
        if parent.run.status is not RunStatus.CANCELLING:
            return
        if not ended:
            after, _ = self._run(world, 1, BeginCancel(), "operator (cascade)")
            if after.runs[1] is not None and after.runs[1].run.status is RunStatus.CANCELLING:
                after, _ = self._finish_cancel(after, 1, after.runs[1].run.enqueue_seq, "operator (cascade)")
            yield Step("operator", "cancels the child", _run_id(1)), after
        else:  # ``contain_child`` records the job cancelled once the child ended (refused when its end was adopted)
            after, _ = self._job(world, 0, RecordCancelled(result_json=_cancelled_result(job.job_id)),
                                 "operator (cascade)")
            yield Step("operator", "records the child's job cancelled", job.job_id), after

    # --- messages ---------------------------------------------------------------------------

    def _slots_of(self, world: RunWorld, slot: int) -> list[int]:
        return [index for index, row in enumerate(world.mail) if row.run_id == _run_id(slot)]

    def _send(self, world: RunWorld, slot: int, message_id: str, text: str) -> RunWorld:
        """``Messages.send``: under the Run's lock, the slot holding the message ID (a
        replay), else the oldest pending receive of the topic; a delivery then resumes the
        Run (the declared resume after commit, naming the receive)."""
        pair = world.runs[slot]
        mine = self._slots_of(world, slot)
        met = next((index for index in mine if world.mail[index].message_id == message_id), None)
        if met is None:
            pending = [index for index in mine if world.mail[index].status is MessageStatus.PENDING]
            met = min(pending, key=lambda index: (world.mail[index].created_at_us, world.mail[index].slot_id),
                      default=None)
        sequences = [world.mail[index].sequence or 0 for index in mine]
        row = MessageRow(slot_id=f"mail-{slot + 1}-{len(mine) + 1}", run_id=_run_id(slot), topic=TOPIC,
                         status=MessageStatus.SENT, message_id=message_id, message_json=text, sequence=None,
                         sent_at_us=None, receive_key=None, expires_at_us=None, created_at_us=0, decided_at_us=None,
                         decided_by=None)
        command = SendMessage(row=row, run_status=None if pair is None else pair.run.status,
                              sequence=max(sequences, default=0) + 1)
        world, decision = self._message(world, met, command, "sender")
        if isinstance(decision, Applied) and isinstance(decision.reply, Delivered) and met is not None:
            receive = world.mail[met]
            world, _ = self._run(world, slot, Resume(owner_id=receive.slot_id, owner=self._evidence(
                world, WaitKind.MESSAGE, receive.slot_id)), "sender")
        return world

    def _sender(self, world: RunWorld) -> Iterator[tuple[Step, RunWorld]]:
        """The sender's next message to each Run, its latest one again, and another message
        under the latest one's ID."""
        for slot, pair in enumerate(world.runs):
            if pair is None or not self.bounds.messages:
                continue
            sent = sorted({world.mail[index].message_id or "" for index in self._slots_of(world, slot)} - {""})
            if len(sent) < self.bounds.messages:
                message_id = f"m{len(sent) + 1}"
                yield Step("sender", "sends", f"{message_id} to {_run_id(slot)}"), self._send(
                    world, slot, message_id, '{"n":' + str(len(sent) + 1) + "}")
            if sent:
                latest = sent[-1]
                yield Step("sender", "sends again", f"{latest} to {_run_id(slot)}"), self._send(
                    world, slot, latest, '{"n":' + latest[1:] + "}")
                yield Step("sender", "sends another message under the ID", f"{latest} to {_run_id(slot)}"), \
                    self._send(world, slot, latest, '{"n":0}')

    def _receives(self, world: RunWorld, worker: int, slot: int, me: Worker, name: str
                  ) -> Iterator[tuple[Step, RunWorld]]:
        """``RunContext.receive`` under each key the hop may name (one already stored: a
        replay; the next one): under the Run's lock, fenced by the hop holding its Run, the
        slot holding the key, else the first undelivered message of the topic, else a new
        pending receive (with or without a timeout) the hop then checkpoints and parks on.
        An answered receive lets the hop go on; a refused one (the hop lost its Run) ends it."""
        assert me.seq is not None
        pair = world.runs[slot]
        assert pair is not None
        mine = self._slots_of(world, slot)
        keys = sorted({world.mail[index].receive_key or "" for index in mine} - {""})
        if len(keys) < self.bounds.receives:
            keys.append(f"r{len(keys) + 1}")
        holds = hop_holds(pair.run, me.seq)
        for key in keys:
            met = next((index for index in mine if world.mail[index].receive_key == key), None)
            if met is None:
                sent = [index for index in mine if world.mail[index].status is MessageStatus.SENT]
                met = min(sent, key=lambda index: world.mail[index].sequence or 0, default=None)
            row = MessageRow(slot_id=f"mail-{slot + 1}-{len(mine) + 1}", run_id=_run_id(slot), topic=TOPIC,
                             status=MessageStatus.PENDING, message_id=None, message_json=None, sequence=None,
                             sent_at_us=None, receive_key=key, expires_at_us=None, created_at_us=0,
                             decided_at_us=None, decided_by=None)
            timeouts = ((" (10 s timeout)", RECEIVE_TIMEOUT_US), ("", None)) if met is None and self.bounds.deadlines \
                else (("", None),)
            for label, expires in timeouts:
                command = ReceiveMessage(row=row, hop_holds=holds, expires_in_us=expires)
                after, decision = self._message(world, met, command, name)
                if not isinstance(decision, Applied):
                    yield Step(name, "receives", f"{key}{label}"), self._drop(after, worker)
                    continue
                stored = after.mail[len(after.mail) - 1 if met is None else met]
                if stored.status is MessageStatus.PENDING:
                    yield Step(name, "receives and waits", f"{key}{label}"), self._set_worker(
                        after, worker, dataclasses.replace(me, owner=stored.slot_id))
                else:
                    yield Step(name, f"receives ({stored.status.value})", key), after

    def _receive_deadlines(self, world: RunWorld, actor: str, *, due_only: bool, resume: bool) -> RunWorld:
        """``Messages.time_out_due``: each pending receive whose deadline came timed out,
        then its Run resumed naming it."""
        for index, row in enumerate(world.mail):
            if row.status is not MessageStatus.PENDING or row.expires_at_us is None \
                    or (due_only and world.now_us < row.expires_at_us):
                continue
            world, decision = self._message(world, index, TimeOutReceive(), actor)
            if resume and isinstance(decision, Applied):
                slot = _slot_of_run(row.run_id)
                world, _ = self._run(world, slot, Resume(owner_id=row.slot_id, owner=self._evidence(
                    world, WaitKind.MESSAGE, row.slot_id)), actor)
        return world

    def _operator(self, world: RunWorld) -> Iterator[tuple[Step, RunWorld]]:
        if not self.bounds.cancel:
            return
        for slot, pair in enumerate(world.runs):
            if pair is None:
                continue
            status = pair.run.status
            if status not in TERMINAL_RUN_STATUSES and status is not RunStatus.CANCELLING:
                after, _ = self._run(world, slot, BeginCancel(), "operator")
                yield Step("operator", "begins a cancel", _run_id(slot)), after
            if status is RunStatus.CANCELLING:
                after, said = self._finish_cancel(world, slot, pair.run.enqueue_seq, "operator")
                yield Step("operator", "finishes the cancel", f"{_run_id(slot)} (broker: {said})"), after

    def _finish_cancel(self, world: RunWorld, slot: int, seq: int, actor: str) -> tuple[RunWorld, str]:
        """``RunLedger.finish_cancel``: the frozen hop aborted if live and probed again, then
        the Run machine's ``finish_cancel`` with the broker's word and the containment."""
        key = key_of(_run_id(slot), seq)
        fenced = world
        if self._probe(world, key).state in LIVE_BROKER_STATES:
            fenced = self._abort(world, key, terminal=False)
        hop = self._probe(fenced, key).state
        command = FinishCancel(enqueue_seq=seq, hop=hop, containment=self._containment(fenced, slot))
        after, _ = self._run(fenced, slot, command, actor)
        return after, "could not say" if hop is None else hop.value

    def _time_out(self, world: RunWorld, slot: int, actor: str, *, finish: bool) -> RunWorld:
        """``time_out`` sent to Run ``slot`` (and, with ``finish``, the cancellation it answers a
        ticket for finished as ``finish_cancel`` does): the relays' step for each due Run."""
        world, decision = self._run(world, slot, TimeOut(), actor)
        if finish and isinstance(decision, Applied) and isinstance(decision.reply, TimedOut | Ticket):
            world, _ = self._finish_cancel(world, slot, decision.reply.enqueue_seq, actor)
        return world

    def _deadline_owner(self, world: RunWorld) -> Iterator[tuple[Step, RunWorld]]:
        if not self.bounds.deadlines:
            return
        for slot, pair in enumerate(world.runs):
            if pair is None:
                continue
            yield Step("deadline owner", "times out", _run_id(slot)), self._time_out(world, slot, "deadline owner",
                                                                                      finish=False)
            if pair.run.status is RunStatus.CANCELLING:
                after, said = self._finish_cancel(world, slot, pair.run.enqueue_seq, "deadline owner")
                yield Step("deadline owner", "finishes the cancel", f"{_run_id(slot)} (broker: {said})"), after
        for index, row in enumerate(world.mail):
            if row.status is MessageStatus.PENDING:  # sent at any time: the kernel decides whether it is due
                after, _ = self._message(world, index, TimeOutReceive(), "deadline owner")
                yield Step("deadline owner", "times out the receive", row.slot_id), after

    # --- recovery -------------------------------------------------------------------------------

    def _relays(self, world: RunWorld) -> Iterator[tuple[Step, RunWorld]]:
        if not self.bounds.relay:
            return
        alive = [index for index, process in enumerate(world.processes) if process.alive]
        if not alive:
            return
        # One relay round, as the ledger pages it: the queued deliveries, then the waits, each
        # Run visited once (the interleavings between two Runs' visits are left to the next round).
        visit = Visit(recovery.Pass.RELAY, alive[0], None, None)
        after = world
        for slot, pair in enumerate(world.runs):  # deadlines first, each cancellation finished
            if _due(pair, world.now_us):
                after = self._time_out(after, slot, "relay", finish=True)
        after = self._receive_deadlines(after, "relay", due_only=True, resume=True)
        for kinds in ((RunStatus.QUEUED,), WAIT_STATUSES):
            for slot, pair in enumerate(world.runs):
                if pair is not None and pair.run.status in kinds:
                    after = self._visit(after, slot, visit)
        yield Step("relay", "a relay round"), after

    def _reconcile(self, world: RunWorld, visit: Visit) -> RunWorld:
        """Startup reconciliation (or a takeover's) over every Run, in the ledger's order:
        deadlines that passed timed out, then cancelling, terminal, hops, queued, waits,
        queued again."""
        actor = f"reconcile as {NODE_NAMES[visit.as_node or 0]}"
        for slot, pair in enumerate(world.runs):
            if _due(pair, world.now_us):
                world = self._time_out(world, slot, actor, finish=False)
        groups: tuple[Callable[[RunStatus], bool], ...] = (
            lambda status: status is RunStatus.CANCELLING,
            lambda status: status in TERMINAL_RUN_STATUSES,
            lambda status: status in HOP_STATUSES,
            lambda status: status is RunStatus.QUEUED,
            lambda status: status in WAIT_STATUSES,
            lambda status: status is RunStatus.QUEUED,
        )
        for group in groups:
            for slot in range(len(world.runs)):
                pair = world.runs[slot]
                if pair is not None and group(pair.run.status):
                    world = self._visit(world, slot, visit)
        return world

    def _situation(self, world: RunWorld, slot: int, visit: Visit) -> recovery.Situation | None:
        pair = world.runs[slot]
        if pair is None:
            return None
        run = pair.run
        needs = recovery.evidence_for(run.status)
        consents = tuple(row for row in (world.consents[i] for i in self._consent_slots(slot)) if row is not None)
        jobs = tuple(row for row in (world.jobs[i] for i in self._job_slots(slot)) if row is not None)
        return recovery.Situation(
            phase=visit.phase, run=run, delivery=pair.current,
            node=None if visit.as_node is None else NODE_NAMES[visit.as_node], cutoff_us=visit.cutoff_us,
            stale_after_us=STALE_AFTER_US, queue_known=True,
            owner=self._evidence(world, run.owner_kind, run.owner_id) if recovery.Evidence.OWNER in needs else None,
            containment=(self._containment(world, slot) if recovery.Evidence.CONTAINMENT in needs
                         else Containment(0, 0)),
            latest_owner=(recovery.latest_owner(consents, jobs, (), tuple(
                row for row in world.mail if row.run_id == run.run_id))
                if recovery.Evidence.LATEST_OWNER in needs else None),
            now_us=world.now_us if recovery.Evidence.CLOCK in needs else None,
        )

    def _visit(self, world: RunWorld, slot: int, visit: Visit) -> RunWorld:
        """The ledger's visit of one Run: decide, gather evidence or write, read again."""
        actor = "relay" if visit.phase is recovery.Pass.RELAY else f"reconcile as {NODE_NAMES[visit.as_node or 0]}"
        situation = self._situation(world, slot, visit)
        writes = 0
        for _ in range(24):
            if situation is None:
                return world
            verdict = recovery.decide(situation)
            broken = tuple(recovery.verdict_violations(situation, verdict))
            seen = _with(world, last=(), judged=())
            world = _with(world, judged=(*world.judged, Judged(situation, verdict, seen, visit, broken)))
            if broken:
                return world  # the ledger never executes a verdict that breaks the recovery rules
            action = verdict.action
            if action in (recovery.Action.KEEP, recovery.Action.LEAVE, recovery.Action.REPORT,
                          recovery.Action.CLEANUP, recovery.Action.OBSERVE):
                return world
            if action in (recovery.Action.PROBE, recovery.Action.FENCE, recovery.Action.ASK_CHECKPOINT,
                          recovery.Action.CONTAIN, recovery.Action.CONTAIN_ATTEMPTS):
                world, situation = self._gather(world, slot, situation, verdict, actor)
                continue
            world = self._write(world, slot, situation, verdict, actor)
            writes += 1
            if writes >= 6:
                return world
            situation = self._situation(world, slot, visit)
        return world

    def _gather(self, world: RunWorld, slot: int, s: recovery.Situation, verdict: recovery.Verdict, actor: str
                ) -> tuple[RunWorld, recovery.Situation]:
        action = verdict.action
        if action is recovery.Action.PROBE:
            assert verdict.key is not None
            return world, dataclasses.replace(s, probe=self._probe(world, verdict.key))
        if action is recovery.Action.FENCE:
            assert verdict.key is not None
            if self._probe(world, verdict.key).state in LIVE_BROKER_STATES:
                world = self._abort(world, verdict.key, terminal=verdict.terminal)
            return world, dataclasses.replace(s, probe=self._probe(world, verdict.key), fenced=True)
        if action is recovery.Action.ASK_CHECKPOINT:
            checkpoint = world.checkpoints[slot]
            return world, dataclasses.replace(s, checkpoint_asked=True, checkpoint_owner=checkpoint.owner,
                                              outcome=checkpoint.outcome)
        # contain: each open or LOST delegated job through the runtime's containment (it returns);
        # a retry's containment (contain_attempts) carries the jobs into the hop that runs again.
        for index in self._job_slots(slot) if action is recovery.Action.CONTAIN else ():
            job = world.jobs[index]
            if job is not None and job.status in OPEN_JOB_STATUSES:
                world, _ = self._job(world, index, RecordCancelled(result_json=_cancelled_result(job.job_id)), actor)
        return world, dataclasses.replace(s, containment=self._containment(world, slot), contained=True)

    def _write(self, world: RunWorld, slot: int, s: recovery.Situation, verdict: recovery.Verdict, actor: str
               ) -> RunWorld:
        run = s.run
        seq = run.enqueue_seq
        action = verdict.action
        A = recovery.Action
        command: Any
        if action in (A.PUBLISH, A.REPUBLISH):
            pair = world.runs[slot]
            assert pair is not None
            if isinstance(run_machine.RUNS.decide(pair, RecordPublished(enqueue_seq=seq), world.now_us), Applied):
                return self._publish(world, slot, acknowledged=True)
            return world
        if action is A.MARK_PUBLISHED:
            command = RecordPublished(enqueue_seq=seq)
        elif action is A.ROTATE:
            assert s.probe is not None
            command = Rotate(enqueue_seq=seq, hop=s.probe.state)
        elif action is A.FAIL_HELD:
            command = FailHeld(enqueue_seq=seq, error=recovery.HELD_ERROR)
        elif action is A.REPARK:
            assert verdict.owner is not None
            kind, owner_id = verdict.owner
            command = Park(enqueue_seq=seq, wait=kind, owner_id=owner_id, owner=self._evidence(world, kind, owner_id))
        elif action is A.SETTLE_RECORDED:
            outcome = world.checkpoints[slot].outcome
            if outcome is None or outcome[1] != seq:
                return world
            done = outcome[0] is RunStatus.DONE
            command = Settle(enqueue_seq=seq, status=outcome[0], error=None if done else "it broke",
                             containment=self._containment(world, slot), result_json='{"ok":true}' if done else None)
        elif action is A.RETRY_LOST:
            assert s.probe is not None
            command = RetryLost(enqueue_seq=seq, hop=s.probe.state, containment=self._containment(world, slot))
        elif action is A.FAIL_LOST:
            command = Settle(enqueue_seq=seq, status=RunStatus.FAILED, error=recovery.LOST_ERROR,
                             containment=self._containment(world, slot))
        elif action is A.RESUME:
            assert run.owner_id is not None
            command = Resume(owner_id=run.owner_id, owner=self._evidence(world, run.owner_kind, run.owner_id))
        else:
            assert action is A.FINISH_CANCEL and s.probe is not None
            command = FinishCancel(enqueue_seq=seq, hop=s.probe.state, containment=self._containment(world, slot))
        world, decision = self._run(world, slot, command, actor)
        if action is A.RETRY_LOST and isinstance(decision, Applied):
            # The lost hop's recorded outcome belongs to it: the retry starts clean.
            world = _with(world, checkpoints=_at(world.checkpoints, slot, dataclasses.replace(
                world.checkpoints[slot], outcome=None)))
        return world

    # --- processes and node leases -----------------------------------------------------------

    def _current_process(self, world: RunWorld, node: int) -> int:
        return max(index for index, process in enumerate(world.processes) if process.node == node)

    def _processes(self, world: RunWorld) -> Iterator[tuple[Step, RunWorld]]:
        b = self.bounds
        for index, process in enumerate(world.processes):
            if process.alive and world.spent[0] < b.crashes:
                yield Step(NODE_NAMES[process.node], "crashes"), self._crash(
                    _with(world, spent=_spend(world.spent, 0)), index)
            if process.alive and b.leases:
                yield from self._lease_actions(world, index, process)
        for node in range(b.nodes):
            current = world.processes[self._current_process(world, node)]
            if not current.alive and world.spent[1] < b.restarts:
                yield Step(NODE_NAMES[node], "restarts (boot, reconcile)"), self._boot(
                    _with(world, spent=_spend(world.spent, 1)), node, restart=True)
            if current.alive and world.spent[3] < b.replacements:
                yield Step(NODE_NAMES[node], "a second process boots under its name"), self._boot(
                    _with(world, spent=_spend(world.spent, 3)), node, restart=False)

    def _crash(self, world: RunWorld, index: int) -> RunWorld:
        """The process dies: its workers forget (their broker jobs finish failed) and its
        callers' admission context is gone."""
        world = _with(world, processes=_at(world.processes, index, dataclasses.replace(
            world.processes[index], alive=False, takeover=None)))
        for worker, state in enumerate(world.workers):
            if state.process == index:
                world = self._drop(world, worker, BrokerJobState.FAILED)
        if world.processes[index].node == 0:
            world = _with(world, callers=(False,) * len(world.callers))
        return world

    def _boot(self, world: RunWorld, node: int, *, restart: bool) -> RunWorld:
        """A process starts under the node's name: a boot (a new incarnation, its time the
        cutoff, a microsecond after everything before it), then the reconciliation."""
        world = _with(world, now_us=world.now_us + 1)
        world, decision = self._node(world, node, Boot(node=NODE_NAMES[node], lease_us=self.bounds.lease_us),
                                     NODE_NAMES[node])
        if not isinstance(decision, Applied) or not isinstance(decision.reply, Booted):
            return world
        index = len(world.processes)
        world = _with(world, processes=(*world.processes, Process(node, decision.reply.epoch)))
        if restart:
            workers = tuple(Worker(process=index) if world.processes[state.process].node == node else state
                            for state in world.workers)
            world = _with(world, workers=workers)
        return self._reconcile(world, Visit(recovery.Pass.RECONCILE, index, node, decision.reply.cutoff_us))

    def _lease_actions(self, world: RunWorld, index: int, process: Process) -> Iterator[tuple[Step, RunWorld]]:
        """The last node's processes renew its lease; the other nodes' relays take it over
        (and reconcile it as that node) and finish their takeover."""
        b = self.bounds
        name = NODE_NAMES[process.node]
        taken = b.nodes - 1
        if process.node == taken:
            if world.spent[5] < b.renewals:
                spent = _with(world, spent=_spend(world.spent, 5))
                after, decision = self._node(spent, taken, Renew(epoch=process.epoch, lease_us=b.lease_us), name)
                if not isinstance(decision, Applied):
                    # A refusal means the process must stop its hops and boot again.
                    after = self._crash(after, index)
                yield Step(f"{name}#{process.epoch}", "renews its lease"), after
            return
        row = world.nodes[taken]
        # A relay takes over a node it does not already hold a takeover claim of.
        if world.spent[4] < b.takeovers and row is not None and row.status is not NodeStatus.TAKEN_OVER \
                and (process.takeover is None or process.takeover[0] != taken):
            spent = _with(world, spent=_spend(world.spent, 4))
            command = TakeOver(taker=name, epoch=row.epoch, lease_us=b.lease_us)
            after, decision = self._node(spent, taken, command, name)
            if isinstance(decision, Applied) and isinstance(decision.reply, TakingOver):
                claim = (taken, row.epoch, world.now_us + b.lease_us)
                after = _with(after, processes=_at(after.processes, index, dataclasses.replace(
                    after.processes[index], takeover=claim)))
                after = self._reconcile(after, Visit(recovery.Pass.RECONCILE, index, taken,
                                                     decision.reply.cutoff_us, met=row))
            yield Step(name, "takes over", NODE_NAMES[taken]), after
        if process.takeover is not None:
            node, epoch, _ = process.takeover
            after, decision = self._node(world, node, FinishTakeover(taker=name, epoch=epoch), name)
            after = _with(after, processes=_at(after.processes, index, dataclasses.replace(
                after.processes[index], takeover=None)))
            yield Step(name, "finishes its takeover of", NODE_NAMES[node]), after

    # --- the clock -----------------------------------------------------------------------------

    def _clock(self, world: RunWorld) -> Iterator[tuple[Step, RunWorld]]:
        moments: set[tuple[int, str]] = set()
        for pair in world.runs:
            if pair is not None and pair.run.wake_at_us is not None and pair.run.status is RunStatus.AWAITING_TIMER:
                moments.add((pair.run.wake_at_us, "a timer's due time"))
            if pair is not None and pair.run.deadline_us is not None \
                    and pair.run.status not in TERMINAL_RUN_STATUSES:
                moments.add((pair.run.deadline_us, "a Run's deadline"))
        for consent in world.consents:
            if consent is not None and consent.status is ConsentStatus.PENDING and consent.expires_at_us is not None:
                moments.add((consent.expires_at_us, "a consent's deadline"))
        for receive in world.mail:
            if receive.status is MessageStatus.PENDING and receive.expires_at_us is not None:
                moments.add((receive.expires_at_us, "a receive's deadline"))
        if self.bounds.leases:
            for row in world.nodes[-1:]:
                if row is None:
                    continue
                if row.status is NodeStatus.LIVE:
                    moments.add((row.lease_expires_at_us, f"{row.node}'s lease end"))
                if row.status is NodeStatus.TAKING_OVER and row.takeover_until_us is not None:
                    moments.add((row.takeover_until_us, f"{row.taker}'s takeover claim end"))
        for moment, why in sorted(moments):
            for at, how in ((moment - 1, "just before"), (moment, "to")):
                if at > world.now_us:
                    yield Step("clock", f"steps {how} {why}", f"(+{(at - world.now_us) / 1e6:g} s)"), \
                        _with(world, now_us=at)

    # --- canonical form and description ---------------------------------------------------------

    def canonical(self, world: RunWorld) -> Hashable:
        """The smallest form of the world over every renaming of interchangeable Runs, with
        instants relative to the clock and the ghost of the last step left out."""
        if len(self._orders) == 1:
            return self._form(world, self._orders[0])
        # The Runs in the order of a signature no renaming changes (their forms without the
        # names that carry Run IDs, and their ghosts); only Runs alike in it need both orders.
        signatures = [hash((None if form is None else (form[:5], form[6:16], form[17:]), world.callers[slot],
                            world.resumed[slot], world.claims[slot] is not None))
                      for slot, form in enumerate(self._run_form(world, slot, self._orders[0])
                                                  for slot in range(len(world.runs)))]
        if len(set(signatures)) == len(signatures):
            order = tuple(sorted(range(len(signatures)), key=lambda slot: signatures[slot]))
            return self._form(world, order)
        forms = [self._form(world, order) for order in self._orders]
        # The same choice for every renaming of one state: the form with the smallest
        # hash (forms of one state are equal as sets), ties broken by their text.
        hashes = [hash(form) for form in forms]
        if len(set(hashes)) == len(hashes):
            return forms[hashes.index(min(hashes))]
        return min(forms, key=lambda form: (hash(form), repr(form)))

    def _renamed(self, order: tuple[int, ...]) -> Callable[[str | None], str | None]:
        """Run IDs inside keys, tokens and owner IDs, renamed by ``order`` (memoised)."""
        memo = self._names.setdefault(order, {})
        rename = {old: new for new, old in enumerate(order)}

        def name(text: str | None) -> str | None:
            if text is None:
                return None
            found = memo.get(text)
            if found is None:
                found = text
                for old, new in rename.items():
                    found = found.replace(f"run-{old + 1}:", f"R{new + 1}:").replace(f"-{old + 1}-", f"-R{new + 1}-")
                memo[text] = found
            return found

        return name

    def _run_form(self, world: RunWorld, slot: int, order: tuple[int, ...]) -> tuple[Any, ...] | None:
        """Run ``slot``'s form with instants relative to the clock and Run IDs renamed by
        ``order`` (memoised by the pair's identity: worlds share the pairs they kept)."""
        pair = world.runs[slot]
        if pair is None:
            return None
        now = world.now_us
        key = (id(pair), now, order)
        cached = self._run_forms.get(key)
        if cached is not None and cached[0] is pair:
            return cached[1]
        name = self._renamed(order)

        def at(value: int | None) -> int | None:
            return None if value is None else value - now

        run, current = pair.run, pair.current
        form = (
            run.status._value_, run.enqueue_seq, at(run.started_at_us), run.node,
            None if run.owner_kind is None else run.owner_kind._value_, name(run.owner_id),
            run.error, at(run.created_at_us), at(run.updated_at_us), run.result_json, run.hop_retries,
            at(run.wake_at_us), run.queue, run.priority, current.state._value_, current.resume,
            name(current.claimed_by), at(current.published_at_us), at(current.claimed_at_us),
            at(current.settled_at_us), at(current.created_at_us), current.queue, current.priority,
            at(run.deadline_us),
        )
        self._run_forms[key] = (pair, form)
        return form

    def _form(self, world: RunWorld, order: tuple[int, ...]) -> tuple[Any, ...]:
        now = world.now_us
        name = self._renamed(order)

        def at(value: int | None) -> int | None:
            return None if value is None else value - now

        runs = [self._run_form(world, old, order) for old in order]
        consents: list[Any] = []
        jobs: list[Any] = []
        for old in order:
            for row in (world.consents[i] for i in self._consent_slots(old)):
                consents.append(None if row is None else (
                    row.status._value_, row.decided_by, at(row.decided_at_us), at(row.created_at_us),
                    at(row.expires_at_us)))
            for job in (world.jobs[i] for i in self._job_slots(old)):
                jobs.append(None if job is None else (job.status._value_, job.result_json, at(job.created_at_us),
                                                      at(job.updated_at_us)))
        checkpoints = tuple((name(checkpoint.owner), None if checkpoint.outcome is None else (
            checkpoint.outcome[0]._value_, checkpoint.outcome[1]))
            for checkpoint in (world.checkpoints[old] for old in order))
        nodes = tuple(None if row is None else (
            row.status._value_, row.epoch, at(row.booted_at_us), at(row.lease_expires_at_us), row.taker,
            at(row.takeover_until_us), at(row.updated_at_us)) for row in world.nodes)
        processes = tuple((process.node, process.epoch, process.alive,
                           None if process.takeover is None else (*process.takeover[:2], at(process.takeover[2])))
                          for process in world.processes)
        workers = tuple((worker.process, name(worker.key), name(worker.token), worker.seq, worker.unacknowledged,
                         name(worker.owner), worker.checkpointed) for worker in world.workers)
        broker = tuple(sorted((name(job.key) or "", job.state._value_, job.queue, job.wire_priority, job.taker,
                               at(job.started_us), job.abort_requested) for job in world.broker))
        claims = tuple(None if claim is None else (claim[0], name(claim[1]))
                       for claim in (world.claims[old] for old in order))
        ghosts = (tuple(world.callers[old] for old in order), tuple(world.resumed[old] for old in order), claims)
        mail = tuple(sorted((name(row.slot_id) or "", row.status._value_, row.message_id, row.message_json,
                             row.sequence, at(row.sent_at_us), row.receive_key, at(row.expires_at_us),
                             at(row.created_at_us), at(row.decided_at_us), row.decided_by) for row in world.mail))
        return (tuple(runs), tuple(consents), tuple(jobs), checkpoints, nodes, processes, workers, broker, ghosts,
                world.spent, mail)

    def describe(self, world: RunWorld) -> str:
        parts = [f"t+{(world.now_us - START_US) / 1e6:g}s"]
        for slot, pair in enumerate(world.runs):
            if pair is None:
                parts.append(f"{_run_id(slot)} absent")
                continue
            run = pair.run
            text = f"{_run_id(slot)} {run.status.value}@{run.enqueue_seq} ({pair.current.state.value}"
            text += ", resume)" if pair.current.resume else ")"
            if run.owner_id is not None and run.status in WAIT_STATUSES:
                text += f" on {run.owner_id}"
            parts.append(text)
        for consent in world.consents:
            if consent is not None:
                parts.append(f"{consent.consent_id} {consent.status.value}")
        for delegated in world.jobs:
            if delegated is not None:
                parts.append(f"{delegated.job_id} {delegated.status.value}")
        for held in world.mail:
            names = "+".join(part for part in (held.message_id, held.receive_key) if part is not None)
            parts.append(f"{held.slot_id} {names} {held.status.value}")
        for index, worker in enumerate(world.workers):
            if not self._live_worker(world, index):
                continue
            if worker.seq is not None and worker.key is not None:
                parsed = _parse_key(worker.key)
                parts.append(f"w{index + 1} runs {_run_id(parsed[0]) if parsed else worker.key}/{worker.seq}")
            elif worker.key is not None:
                parts.append(f"w{index + 1} {'claim unacked' if worker.unacknowledged else 'took'} {worker.key}")
        for job in world.broker:
            parts.append(f"[{job.key} {job.state.value}{'' if job.taker is None else f' w{job.taker + 1}'}]")
        for process in world.processes:
            if not process.alive:
                parts.append(f"{NODE_NAMES[process.node]}#{process.epoch} down")
        if self.bounds.leases:
            for node in world.nodes:
                if node is not None:
                    parts.append(f"{node.node} {node.status.value} e{node.epoch} lease "
                                 f"{(node.lease_expires_at_us - world.now_us) / 1e6:+g}s")
        return "; ".join(parts)


def _spend(spent: tuple[int, int, int, int, int, int], which: int) -> tuple[int, int, int, int, int, int]:
    values = list(spent)
    values[which] += 1
    return values[0], values[1], values[2], values[3], values[4], values[5]


# --- properties --------------------------------------------------------------------------------


def _executing(world: RunWorld, slot: int) -> list[int]:
    """The live workers that run a hop of Run ``slot`` at its current sequence."""
    pair = world.runs[slot]
    if pair is None:
        return []
    found = []
    for index, worker in enumerate(world.workers):
        if worker.seq is None or worker.key is None or not world.processes[worker.process].alive:
            continue
        parsed = _parse_key(worker.key)
        if parsed is not None and parsed[0] == slot and worker.seq == pair.run.enqueue_seq:
            found.append(index)
    return found


def _one_hop_per_run(world: RunWorld) -> str | None:
    for slot, pair in enumerate(world.runs):
        if pair is None or pair.run.status not in HOP_STATUSES:
            continue
        running = _executing(world, slot)
        if len(running) > 1:
            names = ", ".join(f"w{index + 1}" for index in running)
            return f"{names} all run {_run_id(slot)}'s hop {pair.run.enqueue_seq}"
    return None


def _claims_take_only_the_hop_they_name(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for last in after.last:
        if last.machine != "runs" or not isinstance(last.command, Claim) or not isinstance(last.decision, Applied):
            continue
        reply, met, command = last.decision.reply, last.before, last.command
        if not isinstance(reply, Claimed) or met is None:
            continue
        if command.enqueue_seq != met.run.enqueue_seq or reply.enqueue_seq != command.enqueue_seq:
            return f"a claim of hop {command.enqueue_seq} was answered while the Run is at {met.run.enqueue_seq}"
        if met.run.status is not RunStatus.QUEUED and not (
                met.current.claimed_by == command.claimant and last.decision.new_record == met):
            return f"a claim by {command.claimant} took a hop claimed by {met.current.claimed_by}"
    return None


def _lost_claim_acknowledgements_are_answered(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for last in after.last:
        if last.machine != "runs" or not isinstance(last.command, Claim) or last.before is None:
            continue
        met, command = last.before, last.command
        mine = before.claims[last.slot] == (command.enqueue_seq, command.claimant)
        if mine and met.run.status is RunStatus.RUNNING and met.run.enqueue_seq == command.enqueue_seq and not (
                isinstance(last.decision, Applied) and isinstance(last.decision.reply, Claimed)):
            return f"the claim {command.claimant} made, sent again after its lost acknowledgement, was refused"
    return None


def _owner_decided(world: RunWorld, run: RunRow, now_us: int) -> bool:
    """Written from the specs, not from the guards: a consent decided with its principal
    and time (never cancelled), a delegated job ended with a valid result, a timer due."""
    if run.status is RunStatus.AWAITING_TIMER:
        return run.wake_at_us is not None and now_us >= run.wake_at_us
    for row in world.consents:
        if row is not None and row.consent_id == run.owner_id:
            return (row.run_id == run.run_id and row.status in DECIDED_CONSENT_STATUSES
                    and row.decided_by is not None and row.decided_at_us is not None)
    for job in world.jobs:
        if job is not None and job.job_id == run.owner_id:
            return job.run_id == run.run_id and job.status in TERMINAL_AGENT_JOB_STATUSES and job_complete(job)
    for slot in world.mail:
        if slot.slot_id == run.owner_id:  # a receive: its message, or its timeout (never its cancellation)
            return slot.run_id == run.run_id and slot.status in ANSWERED_MESSAGE_STATUSES and answer_complete(slot)
    return False


def _messages_delivered_once(world: RunWorld) -> str | None:
    seen: set[tuple[str, str]] = set()
    for row in world.mail:
        if row.message_id is not None:
            if (row.run_id, row.message_id) in seen:
                return f"{row.run_id}'s message {row.message_id} is stored in two slots"
            seen.add((row.run_id, row.message_id))
    return None


def _messages_kept_once_delivered(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for old, new in zip(before.mail, after.mail):
        if old.status in MESSAGE_STATUSES and (new.message_id, new.message_json, new.sequence) != (
                old.message_id, old.message_json, old.sequence):
            return f"{old.slot_id} held {old.message_id} (#{old.sequence}) and now holds {new.message_id} " \
                   f"(#{new.sequence})"
    return _messages_delivered_once(after)


def _receives_answered_once(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for old, new in zip(before.mail, after.mail):
        if old.status in (MessageStatus.RECEIVED, MessageStatus.TIMED_OUT, MessageStatus.CANCELLED) and new != old:
            return f"{old.slot_id}'s receive {old.receive_key} was {old.status.value} and was answered again " \
                   f"({new.status.value})"
    return None


def _messages_in_order(world: RunWorld) -> str | None:
    for run_id in sorted({row.run_id for row in world.mail}):
        rows = [row for row in world.mail if row.run_id == run_id and row.topic == TOPIC]
        waiting = [row.sequence for row in rows if row.status is MessageStatus.SENT and row.sequence is not None]
        received = sorted((row.receive_key or "", row.sequence or 0) for row in rows
                          if row.status is MessageStatus.RECEIVED)
        for key, sequence in received:
            if any(earlier < sequence for earlier in waiting):
                return f"{run_id}'s receive {key} got message #{sequence} while #{min(waiting)} waits undelivered"
        sequences = [sequence for _, sequence in received]
        if sequences != sorted(sequences):
            return f"{run_id}'s receives got its messages out of order ({', '.join(map(str, sequences))})"
    return None


def _message_ids_name_one_message(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for last in after.last:
        if last.machine != "messages" or not isinstance(last.command, SendMessage) or last.before is None \
                or not isinstance(last.decision, Applied):
            continue
        met, sent = last.before, last.command.row
        if met.message_id == sent.message_id and met.message_json != sent.message_json:
            return f"another message under the ID {sent.message_id} was answered as {met.slot_id}'s"
    return None


def _waits_resumed_only_by_their_owner(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for slot, (old, new) in enumerate(zip(before.runs, after.runs)):
        if old is None or new is None or old.run.status not in WAIT_STATUSES or new.run.status is old.run.status:
            continue
        if new.run.status in (RunStatus.CANCELLING, RunStatus.CANCELLED):
            continue  # a cancel (a relay elects and finishes a deadline's in one round)
        # A send that fills a waiting receive resumes its Run in the same action: a receive's
        # answer is read after it (only an answered receive counts, never a cancelled one).
        # So does the children relay's adoption of a child's end into its job.
        owner_id = old.run.owner_id or ""
        same_action = owner_id.startswith("mail-") or any(
            job is not None and job.job_id == owner_id and job.runtime == CHILD_RUNTIME for job in after.jobs)
        decided_in = after if same_action else before
        if not _owner_decided(decided_in, old.run, after.now_us):
            return f"{_run_id(slot)} left {old.run.status.value} though its owner {old.run.owner_id} has not decided"
    return None


def _terminal_runs_contain_every_effect(world: RunWorld) -> str | None:
    for slot, pair in enumerate(world.runs):
        if pair is None or pair.run.status not in TERMINAL_RUN_STATUSES:
            continue
        for job in world.jobs:
            if job is not None and job.run_id == _run_id(slot) and job.status in OPEN_JOB_STATUSES:
                return f"{_run_id(slot)} is {pair.run.status.value} with {job.job_id} {job.status.value}"
    return None


def _recovery_spares_live_hops_of_other_nodes(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for judged in after.judged:
        verdict, world, visit = judged.verdict, judged.world, judged.visit
        if verdict.action is not recovery.Action.FENCE:
            continue
        slot = _slot_of_run(judged.situation.run.run_id)
        key = key_of(judged.situation.run.run_id, judged.situation.run.enqueue_seq)
        # A hop is its claim's; a queued hop's is the worker waiting with its job at the claim
        # gate, unless the job started more than stale_after before the cutoff (recovery.md
        # multi-node rules: a live worker claims well within it, so such a job is a dead one's).
        holders = set(_executing(world, slot))
        probe, cutoff = judged.situation.probe, judged.situation.cutoff_us
        stale = probe is not None and probe.started_at_us is not None and cutoff is not None \
            and probe.started_at_us < cutoff - judged.situation.stale_after_us
        if judged.situation.run.status is RunStatus.QUEUED and not stale:
            holders |= {index for index, worker in enumerate(world.workers)
                        if worker.key == key and world.processes[worker.process].alive}
        own = world.processes[visit.process].node
        for worker in sorted(holders):
            node = world.processes[world.workers[worker].process].node
            if node == own:
                continue  # the same node name: its own hop (a replaced or earlier incarnation)
            ran_out = visit.met is not None and visit.as_node == node and visit.met.lease_expires_at_us <= world.now_us
            if ran_out:
                continue  # taken over after its lease ran out on the database clock
            if judged.situation.run.status is RunStatus.CANCELLING and not verdict.terminal:
                continue  # asking a cancelled hop to stop, and waiting for it, is anyone's to do
            kind = "terminally " if verdict.terminal else ""
            who = "a relay" if visit.as_node is None else (
                f"{NODE_NAMES[own]}'s reconciliation as {NODE_NAMES[visit.as_node]}")
            return f"{who} fenced {kind}{key}, run by w{worker + 1} of {NODE_NAMES[node]}, which is alive"
    return None


def _cancellations_end_cancelled(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for slot, (old, new) in enumerate(zip(before.runs, after.runs)):
        if old is not None and new is not None and old.run.status is RunStatus.CANCELLING \
                and new.run.status not in (RunStatus.CANCELLING, RunStatus.CANCELLED):
            return f"{_run_id(slot)} was being cancelled and became {new.run.status.value}"
    return None


def _cancellations_say_who_elected_them(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for last in after.last:
        if last.machine != "runs" or last.before is None or not isinstance(last.decision, Applied) \
                or last.decision.new_record is None:
            continue
        met, new = last.before.run, last.decision.new_record.run
        if met.status is RunStatus.CANCELLING or new.status is not RunStatus.CANCELLING:
            continue
        if isinstance(last.command, TimeOut):
            if met.deadline_us is None:
                return f"{met.run_id}, admitted without a timeout, was timed out"
            if last.now_us < met.deadline_us:
                return f"{met.run_id} was timed out {(met.deadline_us - last.now_us) / 1e6:g} s before its deadline"
            if new.error != "timeout":
                return f"{met.run_id} was timed out but records the reason {new.error!r}"
        elif new.error is not None:
            return f"{met.run_id}'s cancellation by {last.actor} records the reason {new.error!r}"
    return None


def _runs_keep_their_route(world: RunWorld) -> str | None:
    for slot, pair in enumerate(world.runs):
        if pair is None:
            continue
        run = pair.run
        admitted = (_run_id(slot), DIGEST, f"key-{slot + 1}", QUEUE, PRIORITY, "review", NODE_NAMES[0])
        if (run.run_id, run.intent_digest, run.idempotency_key, run.queue, run.priority, run.workflow_name,
                run.admitted_node) != admitted or (pair.current.queue, pair.current.priority) != (QUEUE, PRIORITY):
            return f"{_run_id(slot)} no longer carries its admitted identity and route ({run.queue}, {run.priority})"
    return None


def _hops_keep_their_mode(world: RunWorld) -> str | None:
    for slot, pair in enumerate(world.runs):
        if pair is not None and pair.current.resume != world.resumed[slot]:
            expected = "resume" if world.resumed[slot] else "start afresh"
            return f"{_run_id(slot)}'s hop {pair.run.enqueue_seq} does not {expected}"
    return None


def _parked_runs_have_their_checkpoint(world: RunWorld) -> str | None:
    for slot, pair in enumerate(world.runs):
        if pair is not None and pair.run.status in OWNED_WAITS and world.checkpoints[slot].owner != pair.run.owner_id:
            named = world.checkpoints[slot].owner
            return f"{_run_id(slot)} waits on {pair.run.owner_id} but its checkpoint names {named}"
    return None


def _held_admissions_fail_only_without_their_caller(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for last in after.last:
        if last.machine != "runs" or last.before is None or last.actor == "caller":
            continue
        met = last.before
        new = last.decision.new_record if isinstance(last.decision, Applied) else None
        if met.current.state is DeliveryState.HELD and new is not None and new.run.status is RunStatus.FAILED \
                and before.callers[last.slot]:
            return f"{last.actor} failed {_run_id(last.slot)}'s held admission while its caller still holds it"
    return None


def _first_verdicts_win(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for old, new in zip(before.consents, after.consents):
        if old is not None and old.status is not ConsentStatus.PENDING and new != old:
            return f"{old.consent_id} was {old.status.value} and became {'absent' if new is None else new.status.value}"
    return None


def _deadline_owner_expires_only_when_due(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for last in after.last:
        command = last.command
        if last.machine != "consent" or not isinstance(command, DecideConsent) \
                or not isinstance(last.decision, Applied):
            continue
        if command.decided_by != consent_machine.DEADLINE_OWNER:
            continue
        row = last.before
        if command.verdict is not ConsentStatus.EXPIRED or row is None or row.expires_at_us is None \
                or last.now_us < row.expires_at_us:
            due = "no deadline" if row is None or row.expires_at_us is None else \
                f"its deadline {(row.expires_at_us - last.now_us) / 1e6:+g} s away"
            return f"the deadline owner's {command.verdict.value} was taken with {due}"
    return None


def _child_of(world: RunWorld, job: AgentJobRow | None) -> RunRow | None:
    """The child Run a child's job names (None: no child job, or no child yet)."""
    if job is None or job.runtime != CHILD_RUNTIME or job.runtime_job_id is None:
        return None
    pair = world.runs[_slot_of_run(job.runtime_job_id)]
    return None if pair is None else pair.run


def _parents_resume_only_from_an_ended_child(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for slot, (old, new) in enumerate(zip(before.runs, after.runs)):
        if old is None or new is None or old.run.status is not RunStatus.AWAITING_DELEGATE \
                or new.run.status in (RunStatus.AWAITING_DELEGATE, RunStatus.CANCELLING, RunStatus.CANCELLED):
            continue
        job = next((row for row in after.jobs if row is not None and row.job_id == old.run.owner_id), None)
        if job is None or job.runtime != CHILD_RUNTIME:
            continue
        child = _child_of(after, job)
        if child is None or child.status not in TERMINAL_RUN_STATUSES:
            return f"{_run_id(slot)} resumed from {job.job_id} while its child {job.runtime_job_id} had not ended"
        if job.status not in TERMINAL_AGENT_JOB_STATUSES:
            return f"{_run_id(slot)} resumed from {job.job_id} before the job held its child's end ({job.status.value})"
    return None


_ADOPTED_AS = {RunStatus.DONE: AgentJobStatus.SUCCEEDED, RunStatus.FAILED: AgentJobStatus.FAILED,
               RunStatus.CANCELLED: AgentJobStatus.CANCELLED}
"""How a child's end is adopted (docs: a child's job ends as its child did), restated here
so the property does not read the model's own table."""


def _adopted_result(job: AgentJobRow) -> str | None:
    """The child's result a succeeded child's job carries, as JSON text (None: none)."""
    result = json.loads(job.result_json or "{}").get("result")
    return None if result is None else json.dumps(result, separators=(",", ":"), sort_keys=True)


def _child_jobs_end_as_their_child(world: RunWorld) -> str | None:
    for job in world.jobs:
        if job is None or job.runtime != CHILD_RUNTIME or job.status not in TERMINAL_AGENT_JOB_STATUSES:
            continue
        child = _child_of(world, job)
        if child is None or child.status not in TERMINAL_RUN_STATUSES:
            return f"{job.job_id} ended {job.status.value} while its child had not ended"
        if job.status is _ADOPTED_AS[child.status] and (
                job.status is not AgentJobStatus.SUCCEEDED or _adopted_result(job) == child.result_json):
            continue
        parent = world.runs[_slot_of_run(job.run_id)]
        cancelling = parent is not None and parent.run.status in (RunStatus.CANCELLING, RunStatus.CANCELLED)
        if job.status is AgentJobStatus.CANCELLED and cancelling:
            continue  # contained: the parent's cancel records the job cancelled once its child ended
        return f"{job.job_id} ended {job.status.value} ({job.result_json}) though its child ended {child.status.value}"
    return None


def _parent_cancellations_wait_for_their_child(world: RunWorld) -> str | None:
    for job in world.jobs:
        if job is None or job.runtime != CHILD_RUNTIME:
            continue
        parent = world.runs[_slot_of_run(job.run_id)]
        if parent is None or parent.run.status is not RunStatus.CANCELLED:
            continue
        child = _child_of(world, job)
        if child is None or child.status not in TERMINAL_RUN_STATUSES:
            return f"{job.run_id} was cancelled while its child {job.runtime_job_id} had not ended"
        if job.status not in TERMINAL_AGENT_JOB_STATUSES:
            return f"{job.run_id} was cancelled while its child's job {job.job_id} was {job.status.value}"
    return None


def _delegated_results_adopted_once(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for old, new in zip(before.jobs, after.jobs):
        if old is None or old.status not in TERMINAL_AGENT_JOB_STATUSES or new == old:
            continue
        if old.status is AgentJobStatus.LOST and new is not None and new.status is AgentJobStatus.CANCELLED:
            continue
        return f"{old.job_id} ended {old.status.value} and became {'absent' if new is None else new.status.value}"
    return None


def _lapsed_leases_return_only_by_a_boot(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for old, new in zip(before.nodes, after.nodes):
        if old is None or new is None or old.status is not NodeStatus.LIVE or new.epoch != old.epoch:
            continue
        if before.now_us >= old.lease_expires_at_us and new.status is NodeStatus.LIVE \
                and new.lease_expires_at_us > after.now_us:
            return f"{old.node}'s lease ran out and holds again without a boot"
    return None


def _only_the_current_incarnation_renews(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for last in after.last:
        if last.machine == "nodes" and isinstance(last.command, Renew) and isinstance(last.decision, Applied) \
                and last.before is not None and last.command.epoch != last.before.epoch:
            return (f"incarnation {last.command.epoch} of {last.before.node} renewed incarnation "
                    f"{last.before.epoch}'s lease")
    return None


def _one_taker_at_a_time(world: RunWorld) -> str | None:
    for node in range(len(world.nodes)):
        takers = [index for index, process in enumerate(world.processes) if process.alive
                  and process.takeover is not None and process.takeover[0] == node
                  and world.now_us < process.takeover[2]]
        if len(takers) > 1:
            names = ", ".join(NODE_NAMES[world.processes[index].node] for index in takers)
            return f"{names} all hold a live takeover claim of {NODE_NAMES[node]}"
    return None


def _takeovers_only_of_lapsed_leases(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for old, new in zip(before.nodes, after.nodes):
        if old is not None and new is not None and old.status is NodeStatus.LIVE \
                and new.status is NodeStatus.TAKING_OVER and after.now_us < old.lease_expires_at_us:
            return (f"{old.node} was taken over {(old.lease_expires_at_us - after.now_us) / 1e6:g} s before its "
                    "lease ran out")
    return None


def _recovery_verdicts_keep_the_rules(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for judged in after.judged:
        broken = judged.broken
        if broken:
            return (f"{judged.verdict.action.value} of {judged.situation.run.run_id} "
                    f"({judged.situation.run.status.value}) breaks {', '.join(broken)}")
    return None


_RECORD_CHECKS: dict[str, Callable[[Any], list[str]]] = {
    "runs": run_machine.RUNS.record_violations, "consent": consent_machine.CONSENTS.record_violations,
    "agent_jobs": job_machine.AGENT_JOBS.record_violations, "nodes": node_machine.NODES.record_violations,
    "messages": message_machine.MESSAGES.record_violations,
}
_CHECKED: dict[int, tuple[Any, list[str]]] = {}
"""Record invariants already checked, by the record's identity (the record is kept with its
answer, so its identity is never reused while the answer stands): worlds share the
records they did not change."""


def _violations(machine: str, record: Any) -> list[str]:
    found = _CHECKED.get(id(record))
    if found is None or found[0] is not record:
        found = _CHECKED[id(record)] = (record, _RECORD_CHECKS[machine](record))
    return found[1]


def _stored_records_keep_their_invariants(world: RunWorld) -> str | None:
    rows: tuple[Any, ...]
    for rows, machine in ((world.runs, "runs"), (world.consents, "consent"), (world.jobs, "agent_jobs"),
                          (world.nodes, "nodes"), (world.mail, "messages")):
        for row in rows:
            if row is not None:
                broken = _violations(machine, row)
                if broken:
                    return f"a stored {machine} record breaks {', '.join(broken)}"
    return None


def _decided_records_keep_their_invariants(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for last in after.last:
        if isinstance(last.decision, Applied) and last.decision.new_record is not None:
            broken = _violations(last.machine, last.decision.new_record)
            if broken:
                return f"a {last.machine} decision made a record that breaks {', '.join(broken)}"
    return None


_MACHINES: dict[str, Any] = {
    "runs": run_machine.RUNS, "consent": consent_machine.CONSENTS, "agent_jobs": job_machine.AGENT_JOBS,
    "nodes": node_machine.NODES, "messages": message_machine.MESSAGES}


def _decisions_keep_the_transition_rules(before: RunWorld, step: Step, after: RunWorld) -> str | None:
    for last in after.last:
        broken = _MACHINES[last.machine].transition_violations(last.before, last.command, last.now_us, last.decision)
        if broken:
            return f"{type(last.command).__name__} on {last.machine} breaks {', '.join(broken)}"
    return None


def _everywhere(check: Callable[[RunWorld], str | None]) -> dict[str, Any]:
    """A state property checked after every transition too (so that, on the transition
    that breaks it, it is named before the transition rules that break with it)."""
    return {"state": check, "step": lambda before, step, after: check(after)}


PROPERTIES: tuple[Property[RunWorld], ...] = (
    Property("one_hop_per_run", "specs/runs.md running, claim; INV-R2",
             "at most one live worker runs a hop of a Run under its current sequence", **_everywhere(_one_hop_per_run)),
    Property("wait_resumed_only_by_its_owner", "specs/runs.md TR-R6, resume; consent.md; agent_jobs.md; messages.md",
             "a wait ends only when its own owner decided (a consent's verdict with its principal and time, a "
             "delegated job's valid result, a receive's message or timeout, never its cancellation, a timer's due "
             "time on the database clock), or by a cancel",
             step=_waits_resumed_only_by_their_owner),
    Property("terminal_run_has_every_effect_contained", "specs/runs.md Containment, TR-R7; agent_jobs.md lost",
             "a done, failed or cancelled Run has no delegated job open or lost (service attempts: see the attempts "
             "model)", **_everywhere(_terminal_runs_contain_every_effect)),
    Property("recovery_never_fences_a_live_hop_of_another_node", "specs/recovery.md REC-2, REC-9, Multi-node "
             "rules; nodes.md Liveness by lease",
             "recovery fences a hop run by a live process of another node only when it took that node over after "
             "its lease ran out, or (a cancel) without the terminal authority",
             step=_recovery_spares_live_hops_of_other_nodes),
    Property("a_claim_takes_only_the_hop_it_names", "specs/runs.md claim, Executing hops (a hop trusts only the "
             "run ID and sequence); TR-R4",
             "a claim is answered only for the Run's current sequence, of a queued Run or as the same claimant's "
             "repeat", step=_claims_take_only_the_hop_they_name),
    Property("a_lost_claim_acknowledgement_is_answered", "specs/runs.md claim (caller column)",
             "a claim whose COMMIT applied unacknowledged, sent again with its token, is answered, not stranded",
             step=_lost_claim_acknowledgements_are_answered),
    Property("a_cancellation_ends_cancelled", "specs/runs.md Cancellation; TR-R7",
             "a cancelling Run ends only cancelled: no hop settles over it", step=_cancellations_end_cancelled),
    Property("a_run_times_out_only_past_its_deadline_and_says_so", "specs/runs.md time_out; TR-R11; "
             "docs/runs.md Timeouts",
             "a Run is cancelled for its deadline only at or after it, with the reason timeout; an operator's "
             "cancel records no reason", step=_cancellations_say_who_elected_them),
    Property("a_run_keeps_its_identity_and_route", "specs/runs.md A replay keeps the stored route; TR-R1",
             "a Run and its deliveries keep the identity and route they were admitted with",
             **_everywhere(_runs_keep_their_route)),
    Property("a_hop_keeps_its_resume_mode", "specs/runs.md Rotation, resume, retry_lost; TR-R9, TR-R10",
             "a Run's hop resumes exactly when the Run was resumed before (rotations and retries keep the mode)",
             **_everywhere(_hops_keep_their_mode)),
    Property("a_parked_run_has_its_checkpoint", "specs/runs.md Checkpoints are the resume's evidence; "
             "recovery.md REC-5",
             "a Run waits on an owner only when its checkpoint names that owner",
             **_everywhere(_parked_runs_have_their_checkpoint)),
    Property("a_message_is_delivered_at_most_once", "specs/messages.md TR-M2, TR-M3, INV-M2",
             "a message is stored in one slot of its Run and, once stored, keeps its ID, text and sequence: it goes "
             "to at most one receive", state=_messages_delivered_once, step=_messages_kept_once_delivered),
    Property("messages_are_delivered_in_order", "specs/messages.md send, receive (sending order per topic)",
             "a receive gets a Run's messages of a topic in sending order: none while an earlier one waits, and "
             "later receives get later messages", **_everywhere(_messages_in_order)),
    Property("a_receive_is_answered_once", "specs/messages.md TR-M3",
             "a received, timed-out or cancelled receive never changes: the first answer wins",
             step=_receives_answered_once),
    Property("a_message_id_names_one_message", "specs/messages.md send (message_changed)",
             "a send under a stored message ID with another message is refused, never answered as the stored one",
             step=_message_ids_name_one_message),
    Property("a_held_admission_fails_only_without_its_caller", "specs/recovery.md REC-3, REC-7; runs.md fail_held",
             "a held admission is failed by someone else only once its caller's process died",
             step=_held_admissions_fail_only_without_their_caller),
    Property("the_first_verdict_wins", "specs/consent.md TR-C2",
             "a decided or cancelled consent never changes", step=_first_verdicts_win),
    Property("the_deadline_owner_expires_only_when_due", "specs/consent.md TR-C4, tenure owns the deadlines",
             "the deadline owner's verdict is taken only as expired, at or after the consent's deadline",
             step=_deadline_owner_expires_only_when_due),
    Property("a_delegated_result_is_adopted_once", "specs/agent_jobs.md TR-J2",
             "an ended job never changes, except lost to cancelled when containment returned",
             step=_delegated_results_adopted_once),
    Property("a_parent_resumes_from_its_child_only_after_the_child_ended",
             "docs/runs (child Runs); specs/runs.md TR-R6; agent_jobs.md",
             "a Run waiting on a child Run's job resumes only once the child ended and the job holds its end",
             step=_parents_resume_only_from_an_ended_child),
    Property("a_child_job_ends_as_its_child_ended", "docs/runs (child Runs); specs/agent_jobs.md adopt, contain",
             "a child's job ends only after its child: succeeded with its result (DONE), failed (FAILED), "
             "cancelled (CANCELLED, or any end when its parent's cancel contained it)",
             **_everywhere(_child_jobs_end_as_their_child)),
    Property("a_parent_cancellation_waits_for_its_child", "specs/runs.md Containment, TR-R7; docs/runs (child Runs)",
             "a cancelled parent's child Run ended and its job is terminal",
             **_everywhere(_parent_cancellations_wait_for_their_child)),
    Property("a_lapsed_lease_returns_only_by_a_boot", "specs/nodes.md renew, theory (a stalled process comes back "
             "only through a fresh boot); TR-N3",
             "a lease that ran out on the database clock never holds again for the same incarnation",
             step=_lapsed_leases_return_only_by_a_boot),
    Property("only_the_current_incarnation_renews", "specs/nodes.md renew (a refusal means: stop and boot again); "
             "TR-N3", "a renewal is acknowledged only to the node's current incarnation",
             step=_only_the_current_incarnation_renews),
    Property("takeovers_only_of_lapsed_leases", "specs/nodes.md take_over, Liveness by lease; TR-N4",
             "a live node is taken over only once its lease ran out on the database clock",
             step=_takeovers_only_of_lapsed_leases),
    Property("one_taker_at_a_time", "specs/nodes.md take_over; TR-N4",
             "at most one live process holds a live takeover claim of a node", **_everywhere(_one_taker_at_a_time)),
    Property("recovery_verdicts_keep_the_recovery_rules", "specs/recovery.md REC-1..REC-13",
             "every verdict recovery reaches in context keeps the rules every verdict keeps",
             step=_recovery_verdicts_keep_the_rules),
    Property("records_keep_their_invariants", "INV-R1..R9, INV-C1..C3, INV-J1..J3, INV-N1..N3, INV-M1..M5",
             "every stored and every decided record keeps its machine's invariants",
             state=_stored_records_keep_their_invariants, step=_decided_records_keep_their_invariants),
    Property("decisions_keep_the_transition_rules", "TR-R1..R10, TR-C1..C4, TR-J1..J3, TR-N1..N4, TR-M1..M5",
             "every decision in context keeps its machine's transition rules",
             step=_decisions_keep_the_transition_rules),
)


# --- the bounds -----------------------------------------------------------------------------------

HOPS = Bounds("hops", runs=2, workers=(0, 1), nodes=2, timers=True, crashes=1, restarts=1, redelivery=True,
              relay=True, lost_publications=False)
"""The issue's standard world: 2 workers (one on each node) x 2 Runs, a relay and a reboot
(one crash, one restart). Publication, a hop taken twice (redelivery), claims with their
sequence fence and their lost acknowledgements, settlements, timer waits and their
resumes, relay rounds, and the restarted node's reconciliation of both Runs."""

RECOVERY = Bounds("recovery", runs=1, workers=(0, 1), nodes=2, timers=True, outcomes=True, cancel=True, crashes=1,
                  restarts=1, broker_losses=1, redelivery=True, relay=True)
"""2 workers x 1 Run, every recovery path: everything of ``HOPS`` plus lost publication
acknowledgements, the broker losing a queued job, a process dying between a hop's
recorded outcome and its settlement, and the operator's cancel (begun, finished with the
broker's word) racing hops, relays and the reconciliation."""

ADMISSIONS = Bounds("admissions", runs=1, workers=(1,), nodes=2, admitted=False, hold=True, replays=True,
                    crashes=1, restarts=1, relay=True)
"""One Run admitted held by node-a's caller (who releases it, fails it, or dies with its
process), replayed with today's route, published, relayed, and reconciled after a restart."""

CONSENTS = Bounds("consents", runs=1, workers=(0,), nodes=2, consents=2, cancel=True, crashes=1, restarts=1,
                  relay=True, deadlines=True)
"""One worker x one Run whose hops ask consents (with and without a deadline), write their
checkpoint and park; principals and the deadline owner decide; anyone resumes naming the
Run's owner or another consent; the relay resumes; the operator cancels; a crash between
the consent and the park is reconciled. The Run has no timeout: the deadline owner's
``time_out`` is always refused."""

DELEGATES = Bounds("delegates", runs=1, workers=(0,), nodes=2, delegates=1, cancel=True, crashes=1, restarts=1,
                   relay=True, max_hop_retries=1)
"""One worker x one Run whose hop delegates a job (adopted once, lost, contained), parks on
it or settles over it; the operator's cancel needs containment; a crash and restart
retries the lost hop, which keeps the job (REC-13: the workflow allows one retry), and
contains it before a Run fails lost."""

LEASES = Bounds("leases", runs=1, workers=(1,), nodes=2, leases=True, replacements=1, lease_us=30_000_000,
                claimed=True, takeovers=1, renewals=2)
"""Node-b's lease (two renewals, its end on the database clock, a second process booted
under its name while the first lives on) and node-a's takeover of it, around one Run
claimed by node-b's worker: the takeover reconciles node-b's hops."""

DEADLINES = Bounds("deadlines", runs=1, workers=(0,), nodes=2, admitted=False, timers=True, cancel=True, crashes=1,
                   restarts=1, relay=True, timeout_us=RUN_TIMEOUT_US, deadlines=True)
"""One worker x one Run the caller admits with a timeout, whose hops park on a timer (or
finish first); the clock steps to just before and to its deadline; the deadline owner
times it out at any time (the kernel refuses it before the deadline) and finishes the
cancellation, the relays time it out once due and finish it, a reconciliation after a
crash times it out before it finishes cancellations; the operator's cancel races it."""

MESSAGES = Bounds("messages", runs=1, workers=(0,), nodes=2, messages=2, receives=2, cancel=True, crashes=1,
                  restarts=1, relay=True, deadlines=True)
"""One worker x one Run whose hops receive (keys r1, r2: a message taken at once, or a wait
with or without a 10 s timeout, checkpointed and parked on), while a sender sends two
messages of one topic (a send fills the oldest waiting receive and resumes the Run), sends
the latest again and another message under its ID; the deadline owner times a receive out
at any time (the kernel decides), the relays time out due receives and resume their Runs;
the operator's cancel sweeps a pending receive; a hop that lost its Run still sends its
receive (fenced in the receive's transaction); a crash between a receive and its park is
reconciled (the receive is the Run's latest owner)."""

CHILDREN = Bounds("children", runs=2, workers=(0, 1), nodes=2, delegates=1, children=True, cancel=True,
                  lost_publications=False)
"""One worker, a parent Run (run-1) and its child (run-2): the parent's hop starts the
child (its job submitted, the child admitted, the job naming it), checkpoints and parks
on the job; the child's hop finishes DONE or FAILED; the operator may cancel either Run
at any time; the adopter adopts the child's end into the job and resumes the parent; the
parent's cancel cancels the child and records the job cancelled once the child ended."""

TAKERS = Bounds("takers", runs=0, workers=(), nodes=3, leases=True, lease_us=30_000_000, takeovers=2, renewals=1)
"""Node-c's lease and two takers (node-a, node-b) racing to take it over, their claims' ends."""

STANDARD: list[tuple[RunModel, int]] = [
    (RunModel(HOPS), 12),
    (RunModel(RECOVERY), 12),
    (RunModel(ADMISSIONS), 12),
    (RunModel(CONSENTS), 12),
    (RunModel(DEADLINES), 10),
    (RunModel(MESSAGES), 12),
    (RunModel(CHILDREN), 14),
    (RunModel(DELEGATES), 12),
    (RunModel(LEASES), 16),
    (RunModel(TAKERS), 16),
]
"""The standard bounds (``python -m tenure.conformance.explore``; ``bash .ci/soak`` runs them all).
``HOPS`` is the issue's 2 workers x 2 Runs + a relay + a reboot, to 12 actions (about
226,000 states, two minutes of one core; its two Runs interleave, about 2.5 times more
states per action than one Run; at 10 actions it is 42,185 states, 84,672 transitions):
enough for both Runs to be published, taken, claimed and parked or settled around a
crash, a restart and a relay round, and for a redelivered hop to meet a resumed one. The
test suite runs the other worlds (under a minute together); ``.ci/soak`` all. ``RECOVERY`` gives one Run every recovery path to 12 actions
(35,469 states); ``CONSENTS`` (10,953) and ``DELEGATES`` (4,355) go to 12; ``ADMISSIONS``
and the lease worlds are explored to exhaustion (their budgets bound them: 155, 12,242
and 222 states); ``DEADLINES`` goes to 10 (12,161 states, a few seconds); ``MESSAGES``
goes to 12 (18,589 states, about 7 s of one core; 32,063 at 14); ``CHILDREN`` goes to 14
(2,812 states, under a second; 3,656 at 18). Every mutant the bounds reach is caught within 9 actions (the longest:
a rotation that loses the resume mode needs a park, a due timer, a resume, a crash and
a relay); ``SOAK`` goes further."""

SOAK: list[tuple[RunModel, int]] = [
    (RunModel(HOPS), 14),
    (RunModel(RECOVERY), 16),
    (RunModel(dataclasses.replace(CONSENTS, workers=(0, 1), redelivery=True)), 14),
    (RunModel(dataclasses.replace(DELEGATES, delegates=2)), 16),
    (RunModel(dataclasses.replace(LEASES, takeovers=2, renewals=3)), 24),
    (RunModel(dataclasses.replace(TAKERS, takeovers=3, renewals=2)), 24),
]
"""Larger bounds for a soak (measured on this machine, one core): ``HOPS`` to 14 actions;
``RECOVERY`` to 16 (about 194,000 states, 80 s); consents with a second worker and
redeliveries to 14 (about 293,000 states, 170 s); two delegated jobs to 16; the lease
worlds with more renewals and takeovers, to exhaustion."""
