"""The Run kernels as the model and the RunLedger on every database, in lockstep.

The same command stream goes to the ledger and to a model that keeps kernel records
(Runs, deliveries, consents, delegated jobs, message slots) in dictionaries and decides
with the Run, consent, job and message kernels at the database time the ledger's
transaction read; every answer and every stored row of the tables must agree after
every step (a message's send and a hop's receive included, and the relays' timeout of
receives). Racing
rules run two ledgers at once (two claimers of one hop, two resumers of one wait,
cancellation against completion, a deadline against completion, release against
fail_held, two admissions under one key): the database must then have done what one serial order of the two does.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from tenure.adapters import InMemoryBroker, RunLedger
from tenure.adapters.agent_jobs.facade import cancelled_result, job_id_for, public_job
from tenure.adapters.agent_jobs.table import AGENT_JOBS_BINDING
from tenure.adapters.consents.facade import public_consent
from tenure.adapters.consents.table import CONSENTS_BINDING
from tenure.adapters.messages.facade import public_message
from tenure.adapters.messages.table import MESSAGES_BINDING
from tenure.adapters.runs.ledger import (
    UNSERVED, Unserved, admission_rows, public_delivery, public_run, resume_and_publish, run_id_for,
)
from tenure.adapters.runs.table import CHECKPOINTS_BINDING, DELIVERIES_BINDING, RUNS_BINDING, CheckpointRow
from tenure.adapters.runs.engine import AHEAD, FALLBACK, NO_INPUTS, Inputs, consent_evidence, job_evidence, message_evidence
from tenure.conformance.lockstep import raw
from tenure.conformance.lockstep.harness import Counter, LockstepBase, outcome
from tenure.kernel.agent_jobs import machine as job_machine
from tenure.kernel.agent_jobs.commands import AdoptResult, AdvanceJob, RecordCancelled, SubmitJob
from tenure.kernel.agent_jobs.record import AgentJobRow
from tenure.kernel.consents import machine as consent_machine
from tenure.kernel.consents.commands import CancelPending, CreateConsent, DecideConsent
from tenure.kernel.consents.record import ConsentRow
from tenure.kernel.core import Applied, Decision, Finder, Refused
from tenure.kernel.messages import machine as message_machine
from tenure.kernel.messages.commands import CancelPending as CancelPendingReceive
from tenure.kernel.messages.commands import Delivered, ReceiveMessage, SendMessage
from tenure.kernel.messages.commands import TimeOut as TimeOutReceive
from tenure.kernel.messages.record import MessageRow
from tenure.kernel.runs import finders
from tenure.kernel.runs.aggregate import ADMITTED_AHEAD, COUNTED_AHEAD, DECIDED_AHEAD, UNREAD_CONTAINMENT
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
    Park,
    RecordPublished,
    RecordPublishError,
    Release,
    Resume,
    Resumed,
    RunCommand,
    RunCommandType,
    Settle,
    Settled,
    Swept,
    Ticket,
    TimedOut,
    TimeOut,
)
from tenure.kernel.runs.machine import RUNS, RunRefusal
from tenure.kernel.runs.record import HOP_STATUSES, DeliveryRow, hop_holds, RunPair, RunRow, key_of, record_violations
from tenure.model import (
    TERMINAL_RUN_STATUSES,
    AgentJobStatus,
    BrokerJobState,
    CancelTicket,
    ConsentStatus,
    DeliveryState,
    MessageStatus,
    RunClaim,
    RunIntent,
    RunStatus,
    TenureError,
    WaitKind,
    WorkflowPin,
    hop_key,
)

__all__ = ["RunLockstep", "RunModel", "AHEAD_KINDS", "BEHIND_A_ROTATION", "MESSAGE_EVENTS", "missing_paths"]

WORKFLOW = WorkflowPin("review", "r1", "sha256:workflow")
SESSIONS = [None, "session-1", "session-2"]
KEYS = [None, None, None, "key-1", "key-2"]
"""Admission keys, mostly none: an admission under a taken key with another intent is
refused, and with a key two times in three most admissions were (few Runs to act on)."""
NODES = ["node-a", "node-b"]
QUEUES = ["runs", "rites"]
REQUESTS = ["request-1", "request-2", "request-3"]
TIMERS = ["sleep:0", "sleep:1"]
TIMEOUTS_S = [None, None, None, 0.000_001, 3600]
"""Admission timeouts, mostly none: a deadline a microsecond after the admission (passed
for every later command) or an hour after it (never passed in a run)."""
TOPICS = ["go", "stop"]
MESSAGE_IDS = [None, "m-1", "m-2"]
"""A fresh message ID (the ledger draws a UUID), or one a later send replays or changes."""
RECEIVE_KEYS = ["@1", "@2", "@3"]
TERMINAL_RESULTS = [AgentJobStatus.SUCCEEDED, AgentJobStatus.FAILED, AgentJobStatus.CANCELLED,
                    AgentJobStatus.TIMED_OUT, AgentJobStatus.LOST]
_ALL = Finder("all", ((),), lock="none")
T = TypeVar("T")

AHEAD_KINDS: frozenset[RunCommandType] = DECIDED_AHEAD | ADMITTED_AHEAD | frozenset(COUNTED_AHEAD)
"""The Run commands that have a decided-ahead form (the kernel's declaration): on a store
with decided-ahead statements the lockstep must see each of them both decided ahead and
fallen back to the transaction (:func:`missing_paths`)."""

BEHIND_A_ROTATION: dict[RunCommandType, Callable[[int], RunCommand]] = {
    RunCommandType.RELEASE: lambda seq: Release(enqueue_seq=seq),
    RunCommandType.FAIL_HELD: lambda seq: FailHeld(enqueue_seq=seq, error="context lost"),
    RunCommandType.RECORD_PUBLISHED: lambda seq: RecordPublished(enqueue_seq=seq),
    RunCommandType.RECORD_PUBLISH_ERROR: lambda seq: RecordPublishError(enqueue_seq=seq,
                                                                        error="publish_failed:BrokerUnavailable"),
    RunCommandType.CLAIM: lambda seq: Claim(enqueue_seq=seq, node="node-a"),
    RunCommandType.ENTER_HARDWARE_WAIT: lambda seq: EnterHardwareWait(enqueue_seq=seq),
    RunCommandType.LEAVE_HARDWARE_WAIT: lambda seq: LeaveHardwareWait(enqueue_seq=seq),
    RunCommandType.BEGIN_CANCEL: lambda seq: BeginCancel(),
    RunCommandType.SETTLE: lambda seq: Settle(enqueue_seq=seq, status=RunStatus.DONE, error=None,
                                              containment=UNREAD_CONTAINMENT),
}
"""The commands :meth:`RunLockstep.decided_ahead_behind_a_rotation` sends (by kind, for a
sequence): every command on the pair that a store may decide ahead (the admission has a
rule of its own), and the settle (it reads counted evidence: the engine fills it)."""


MESSAGE_EVENTS: dict[str, collections.Counter[str]] = {}
"""By machine key: how often a send was stored (``Queued``), filled a waiting receive
(``Delivered``) or replayed (``Replayed``), a receive took a message (``Taken``), started
waiting (``Waiting``) or replayed, and how many receives a relay round timed out
(``TimedOut``), as the model decided them (a focused run asserts it reached each)."""


def missing_paths(counter: Counter) -> list[tuple[str, str]]:
    """The (command kind, engine path) pairs a lockstep run never took, for every command
    kind with a decided-ahead form (:data:`AHEAD_KINDS`): empty when each was decided
    both ahead and by the fallback."""
    return [(kind.value, path) for kind in sorted(AHEAD_KINDS, key=lambda kind: kind.value)
            for path in (AHEAD, FALLBACK) if not counter.paths.get(kind.value, {}).get(path)]


def _raise_if_coded(machine: Any, decision: Any) -> None:
    if isinstance(decision, Refused):
        code = machine.outcomes[decision.reason]
        if code is not None:
            raise TenureError(code, decision.reason.value)


def _result(job_id: str, status: AgentJobStatus) -> dict[str, Any]:
    error = None if status in (AgentJobStatus.SUCCEEDED, AgentJobStatus.CANCELLED) else f"{status.value} happened"
    return {"job_id": job_id, "status": status.value, "error": error, "output": {"n": 1}}


class RunModel:
    """Kernel records in dictionaries, decided at the database's own times, gathered the
    way the ledger gathers them."""

    def __init__(self) -> None:
        self.runs: dict[str, RunRow] = {}
        self.deliveries: dict[str, DeliveryRow] = {}
        self.consents: dict[str, ConsentRow] = {}
        self.jobs: dict[str, AgentJobRow] = {}
        self.checkpoints: dict[str, CheckpointRow] = {}
        """The Runs' checkpoints, as the engine's follow-ups leave them: a timer's park
        binds one, a settle deletes it (not the kernel's: the model keeps them by hand,
        so a follow-up the aggregate declaration lost shows as a row that differs)."""
        self.messages: dict[str, MessageRow] = {}
        """The Runs' message slots (messages and receives), by slot ID."""

    def snapshot(self) -> tuple[dict[str, Any], ...]:
        return (dict(self.runs), dict(self.deliveries), dict(self.consents), dict(self.jobs), dict(self.checkpoints),
                dict(self.messages))

    def restore(self, saved: tuple[dict[str, Any], ...]) -> None:
        (self.runs, self.deliveries, self.consents, self.jobs, self.checkpoints,
         self.messages) = (dict(part) for part in saved)

    def pair(self, run_id: str) -> RunPair | None:
        run = self.runs.get(run_id)
        return None if run is None else RunPair(run, (self.deliveries[key_of(run_id, run.enqueue_seq)],))

    def containment(self, run_id: str) -> Containment:
        open_jobs = [job for job in self.jobs.values() if job.run_id == run_id and job.status in finders.OPEN_JOB_STATUSES]
        return Containment(open_jobs=len(open_jobs), open_attempts=0)

    def evidence(self, kind: WaitKind | None, owner_id: str | None) -> Any:
        if kind is WaitKind.CONSENT and owner_id in self.consents:
            return consent_evidence(self.consents[owner_id])
        if kind is WaitKind.DELEGATE and owner_id in self.jobs:
            return job_evidence(self.jobs[owner_id])
        if kind is WaitKind.MESSAGE and owner_id in self.messages:
            return message_evidence(self.messages[owner_id])
        return None

    def run_command(self, run_id: str, command: Any, now: int, pair: Any = "load") -> Any:
        met = self.pair(run_id) if pair == "load" else pair
        decision = RUNS.decide(met, command, now)
        _raise_if_coded(RUNS, decision)
        if isinstance(decision, Applied):
            new = decision.new_record
            assert new is not None, "no Run command deletes a Run"
            self.runs[new.run.run_id] = new.run
            for delivery in new.deliveries:
                self.deliveries[delivery.delivery_id] = delivery
            if isinstance(command, Settle):
                self.checkpoints.pop(run_id, None)  # terminal: the snapshot's debt is paid
            if isinstance(decision.reply, Settled | Swept):
                for consent in sorted(self.consents.values(), key=lambda row: row.consent_id):
                    if consent.run_id == run_id:
                        swept = consent_machine.CONSENTS.decide(consent, CancelPending(decided_by=decision.reply.decided_by), now)
                        if isinstance(swept, Applied):
                            assert swept.new_record is not None
                            self.consents[consent.consent_id] = swept.new_record
                for slot in sorted(self.messages.values(), key=lambda row: row.slot_id):
                    if slot.run_id == run_id:
                        cancel = CancelPendingReceive(decided_by=decision.reply.decided_by)
                        ended = message_machine.MESSAGES.decide(slot, cancel, now)
                        if isinstance(ended, Applied):
                            assert ended.new_record is not None
                            self.messages[slot.slot_id] = ended.new_record
        return decision

    # --- the ledger's operations, as the model answers them ----------------------------------

    def admit(self, intent: RunIntent, queue: str, priority: int, key: str | None, hold: bool, fence: bool,
              fresh_id: str | None, now: int, timeout_us: int | None = None) -> Any:
        run_id = run_id_for(key) if key is not None else (fresh_id or "run-never-stored")
        row, template = admission_rows(intent, WORKFLOW, queue, priority, key, run_id)
        pair = self.pair(run_id)
        busy = fence and pair is None and any(
            run.session_id == intent.session_id and run.status not in TERMINAL_RUN_STATUSES for run in self.runs.values()
        )
        admit = Admit(run=row, delivery=template, hold=hold, session_busy=busy, timeout_us=timeout_us)
        decision = self.run_command(run_id, admit, now, pair)
        stored = decision.new_record
        assert isinstance(decision.reply, Admitted)
        return (public_run(stored.run), public_delivery(stored.current), decision.reply.created)

    def applied(self, run_id: str, command: Any, now: int) -> bool:
        """Whether the kernel applied ``command`` (as ``RunEngine.applied`` answers)."""
        return isinstance(self.run_command(run_id, command, now), Applied)

    def claim(self, run_id: str, seq: int, node: str, now: int, claimant: str | None = None,
              serves: tuple[tuple[str, str], ...] | None = None) -> RunClaim | Unserved | None:
        decision = self.run_command(run_id, Claim(enqueue_seq=seq, node=node, claimant=claimant, serves=serves), now)
        if isinstance(decision, Refused) and decision.reason is RunRefusal.NOT_SERVED:
            return UNSERVED
        if not isinstance(decision, Applied) or not isinstance(decision.reply, Claimed):
            return None
        assert decision.new_record is not None
        run = public_run(decision.new_record.run)
        return RunClaim(run, decision.reply.enqueue_seq, decision.reply.resume, run.workflow)

    def park(self, run_id: str, seq: int, kind: WaitKind, owner_id: str, now: int) -> bool:
        command = Park(enqueue_seq=seq, wait=kind, owner_id=owner_id, owner=self.evidence(kind, owner_id))
        return isinstance(self.run_command(run_id, command, now), Applied)

    def park_timer(self, run_id: str, seq: int, name: str, wake_at_us: int, now: int) -> bool:
        command = Park(enqueue_seq=seq, wait=WaitKind.TIMER, owner_id=name, owner=None, wake_at_us=wake_at_us)
        applied = isinstance(self.run_command(run_id, command, now), Applied)
        if applied:  # the park and its checkpoint (the state, none here) in one transaction
            self.checkpoints[run_id] = CheckpointRow(run_id, seq, WaitKind.TIMER, name, "null", now)
        return applied

    def save_checkpoint(self, run_id: str, seq: int, state_json: str, owner_id: str | None, now: int) -> bool:
        """``Checkpoints.save``: written only while the hop holds its Run; a save without
        an owner keeps the one the stored snapshot binds."""
        run = self.runs.get(run_id)
        if run is None or not hop_holds(run, seq):
            return False
        kind: WaitKind | None = None if owner_id is None else WaitKind.CONSENT
        stored = self.checkpoints.get(run_id)
        if owner_id is None and stored is not None:
            kind, owner_id = stored.owner_kind, stored.owner_id
        self.checkpoints[run_id] = CheckpointRow(run_id, seq, kind, owner_id, state_json, now)
        return True

    def resume(self, run_id: str, owner_id: str, now: int) -> int | None:
        pair = self.pair(run_id)
        evidence = None if pair is None else self.evidence(pair.run.owner_kind, pair.run.owner_id)
        decision = self.run_command(run_id, Resume(owner_id=owner_id, owner=evidence), now)
        return decision.reply.enqueue_seq if isinstance(decision, Applied) and isinstance(decision.reply, Resumed) else None

    def settle(self, run_id: str, seq: int, status: RunStatus, now: int) -> bool:
        error = "it broke" if status is RunStatus.FAILED else None
        command = Settle(enqueue_seq=seq, status=status, error=error, containment=self.containment(run_id))
        return isinstance(self.run_command(run_id, command, now), Applied)

    def begin_cancel(self, run_id: str, now: int) -> CancelTicket | None:
        decision = self.run_command(run_id, BeginCancel(), now)
        if isinstance(decision, Applied) and isinstance(decision.reply, Ticket):
            return CancelTicket(run_id, decision.reply.enqueue_seq, decision.reply.already_cancelled)
        return None

    def time_out(self, run_id: str, now: int) -> CancelTicket | None:
        decision = self.run_command(run_id, TimeOut(), now)
        if isinstance(decision, Applied) and isinstance(decision.reply, TimedOut | Ticket):
            return CancelTicket(run_id, decision.reply.enqueue_seq, False)
        return None

    def finish_cancel(self, run_id: str, seq: int, hop: BrokerJobState | None, now: int) -> bool:
        command = FinishCancel(enqueue_seq=seq, hop=hop, containment=self.containment(run_id))
        decision = self.run_command(run_id, command, now)
        return isinstance(decision, Applied) and isinstance(decision.reply, Settled)

    def create_consent(self, row: ConsentRow, now: int) -> Any:
        run = self.runs.get(row.run_id)
        decision = consent_machine.CONSENTS.decide(None, CreateConsent(row=row, run_running=run is not None
                                                              and run.status is RunStatus.RUNNING), now)
        _raise_if_coded(consent_machine.CONSENTS, decision)
        assert isinstance(decision, Applied) and decision.new_record is not None, "every refused creation is an error"
        self.consents[row.consent_id] = decision.new_record
        return public_consent(decision.new_record)

    def decide_consent(self, consent_id: str, verdict: ConsentStatus, now: int) -> bool:
        decision = consent_machine.CONSENTS.decide(self.consents.get(consent_id),
                                          DecideConsent(verdict=verdict, decided_by="principal-p"), now)
        if isinstance(decision, Applied):
            assert decision.new_record is not None
            self.consents[consent_id] = decision.new_record
        return isinstance(decision, Applied)

    def submit_job(self, row: AgentJobRow, now: int) -> Any:
        run = self.runs.get(row.run_id)
        command = SubmitJob(row=row, run_running=run is not None and run.status is RunStatus.RUNNING)
        decision = job_machine.AGENT_JOBS.decide(self.jobs.get(row.job_id), command, now)
        _raise_if_coded(job_machine.AGENT_JOBS, decision)
        assert isinstance(decision, Applied) and decision.new_record is not None, "every refused submission is an error"
        self.jobs[row.job_id] = decision.new_record
        return public_job(decision.new_record)

    def _slot(self, found: list[MessageRow], order: Callable[[MessageRow], Any]) -> MessageRow | None:
        return min(found, key=order) if found else None

    def send_message(self, row: MessageRow, now: int) -> tuple[Any, Any]:
        """``messages.send``: the slot holding the message ID (a replay), else the Run's
        oldest waiting receive of the topic, else none; the answer and the kernel's reply
        (``Delivered``: the Run waiting on that receive is resumed after commit)."""
        run = self.runs.get(row.run_id)
        mine = [slot for slot in self.messages.values() if slot.run_id == row.run_id]
        met = self._slot([slot for slot in mine if slot.message_id == row.message_id], lambda slot: slot.slot_id)
        if met is None:
            met = self._slot([slot for slot in mine if slot.topic == row.topic and slot.status is MessageStatus.PENDING],
                             lambda slot: (slot.created_at_us, slot.slot_id))
        last = max((slot.sequence for slot in mine if slot.topic == row.topic and slot.sequence is not None), default=0)
        command = SendMessage(row=row, run_status=None if run is None else run.status, sequence=last + 1)
        decision = message_machine.MESSAGES.decide(met, command, now)
        _raise_if_coded(message_machine.MESSAGES, decision)
        assert isinstance(decision, Applied) and decision.new_record is not None, "every refused send is an error"
        self.messages[decision.new_record.slot_id] = decision.new_record
        return public_message(decision.new_record), decision.reply

    def receive_message(self, row: MessageRow, seq: int, expires_in_us: int | None, now: int) -> tuple[Any, Any]:
        """``messages.receive``: the slot holding the key (a replay), else the Run's first
        undelivered message of the topic, else none."""
        run = self.runs.get(row.run_id)
        mine = [slot for slot in self.messages.values() if slot.run_id == row.run_id]
        met = self._slot([slot for slot in mine if slot.receive_key == row.receive_key], lambda slot: slot.slot_id)
        if met is None:
            met = self._slot([slot for slot in mine if slot.topic == row.topic and slot.status is MessageStatus.SENT],
                             lambda slot: slot.sequence)
        command = ReceiveMessage(row=row, hop_holds=run is not None and hop_holds(run, seq), expires_in_us=expires_in_us)
        decision = message_machine.MESSAGES.decide(met, command, now)
        _raise_if_coded(message_machine.MESSAGES, decision)
        assert isinstance(decision, Applied) and decision.new_record is not None, "every refused receive is an error"
        self.messages[decision.new_record.slot_id] = decision.new_record
        return public_message(decision.new_record), decision.reply

    def due_receives(self, now: int, limit: int) -> list[MessageRow]:
        """The relays' page of waiting receives whose deadline came by ``now``, oldest first."""
        due = [slot for slot in self.messages.values() if slot.status is MessageStatus.PENDING
               and slot.expires_at_us is not None and slot.expires_at_us <= now]
        return sorted(due, key=lambda slot: (slot.expires_at_us, slot.slot_id))[:limit]

    def time_out_receive(self, slot_id: str, now: int) -> bool:
        decision = message_machine.MESSAGES.decide(self.messages.get(slot_id), TimeOutReceive(), now)
        _raise_if_coded(message_machine.MESSAGES, decision)
        if isinstance(decision, Applied):
            assert decision.new_record is not None
            self.messages[slot_id] = decision.new_record
        return isinstance(decision, Applied)

    def job_command(self, job_id: str, command: Any, now: int) -> bool:
        decision = job_machine.AGENT_JOBS.decide(self.jobs.get(job_id), command, now)
        _raise_if_coded(job_machine.AGENT_JOBS, decision)
        if isinstance(decision, Applied):
            assert decision.new_record is not None
            self.jobs[job_id] = decision.new_record
        return isinstance(decision, Applied)


def _decided(answer: tuple[Any, ...]) -> tuple[Any, ...]:
    """An answer holding kernel decisions, with its refusals spelled as such (a refusal is
    counted as refused, not as a value that applied)."""
    if answer[0] != "ok":
        return answer
    decisions = answer[1] if isinstance(answer[1], list) else [answer[1]]
    if all(isinstance(decision, Refused) for decision in decisions):
        return ("refused", *(decision.reason.value for decision in decisions))
    return answer


def _intent(session: str | None, payload: int, requested: int | None) -> RunIntent:
    return RunIntent(session, "api", "alice", frozenset({"read", "write"}), {"n": payload}, requested)


def _job_row(run_id: str, request_id: str, variant: int) -> AgentJobRow:
    import json as _json

    return AgentJobRow(
        job_id=job_id_for(request_id), request_id=request_id, run_id=run_id, runtime="runtime-r", profile="profile-p",
        request_json=_json.dumps({"task": variant}, separators=(",", ":")), status=AgentJobStatus.QUEUED,
        result_json=None, runtime_job_id=None, created_at_us=0, updated_at_us=0,
    )


def _held(pair: RunPair) -> bool:
    return pair.run.status is RunStatus.QUEUED and pair.current.state is DeliveryState.HELD


def _publishable(pair: RunPair) -> bool:
    return pair.run.status is RunStatus.QUEUED and pair.current.state in (DeliveryState.PENDING, DeliveryState.PUBLISHED)


def _holding(pair: RunPair) -> bool:
    return pair.run.status in HOP_STATUSES


def _running(pair: RunPair) -> bool:
    return pair.run.status is RunStatus.RUNNING


def _waiting(pair: RunPair) -> bool:
    return pair.run.owner_id is not None


def _cancelling(pair: RunPair) -> bool:
    return pair.run.status is RunStatus.CANCELLING


def _open(pair: RunPair) -> bool:
    return pair.run.status not in TERMINAL_RUN_STATUSES


def _open_with_deadline(pair: RunPair) -> bool:
    return _open(pair) and pair.run.deadline_us is not None


def _holding_with_deadline(pair: RunPair) -> bool:
    return _holding(pair) and pair.run.deadline_us is not None


class RunLockstep(LockstepBase):
    machine_name = "runs"
    model: RunModel

    def __init__(self) -> None:
        super().__init__()
        self.model = RunModel()
        self.broker = InMemoryBroker()
        self.ledgers = [RunLedger(self.db_url), RunLedger(self.db_url)]
        self.paths_this_step: list[tuple[RunCommandType, str]] = []
        """The engine paths the commands of the running step took (both ledgers)."""
        self.latest_us = 0
        """The latest database time a step read (the aim of a resume that applies)."""
        self.held_keys = 0
        self.holder: Any = None
        """The session of :meth:`while_written`'s writer (PostgreSQL; opened once)."""
        for ledger in self.ledgers:
            ledger.store.observe_time = self.clock.seen.append
            ledger.engine.path_observer = self.took_path

    def message_event(self, name: str, count: int = 1) -> None:
        MESSAGE_EVENTS.setdefault(self.key(), collections.Counter())[name] += count

    def took_path(self, kind: RunCommandType, path: str) -> None:
        self.counter.took(kind.value, path)
        self.paths_this_step.append((kind, path))

    def close_resources(self) -> None:
        for ledger in self.ledgers:
            self.runner.run(ledger.close())
        if self.holder is not None:
            self.runner.run(self.holder.close())

    # --- choices ---------------------------------------------------------------------------

    def run_ids(self) -> list[str]:
        return list(self.model.runs) + ["00000000-0000-4000-8000-000000000000"]

    @staticmethod
    def pick(data: st.DataObject, options: list[T]) -> T | None:
        """One of ``options`` (None when there is none), drawn the same way whatever the
        state: on PostgreSQL a race's winner shapes the state, so a draw whose shape (a
        list's length, whether to draw at all) followed the state would replay
        differently and Hypothesis would call the strategy flaky."""
        index = data.draw(st.integers(0, 63))
        return options[index % len(options)] if options else None

    @staticmethod
    def aim(data: st.DataObject) -> bool:
        """Whether this draw aims at the live state the rule acts on (four times in five)
        or takes any choice, a near miss (the rest): drawn at random, most commands meet a
        Run in a state that refuses them, and the paths behind an applied settle, park or
        resume go unchecked (issue 49: no settle applied in 929 tries). Shrinks towards
        aiming."""
        return data.draw(st.integers(0, 9), label="aim") < 8

    def pick_run(self, data: st.DataObject, wanted: Callable[[RunPair], bool] | None = None) -> str:
        """A Run: when aiming, one whose pair ``wanted`` accepts (any known Run without
        ``wanted``), if there is one; otherwise any known Run or a missing one."""
        aiming = self.aim(data)
        live = [run_id for run_id, run in self.model.runs.items()
                if wanted is None or wanted(RunPair(run, (self.model.deliveries[key_of(run_id, run.enqueue_seq)],)))]
        run_id = self.pick(data, live if aiming and live else self.run_ids())
        assert run_id is not None  # run_ids() is never empty
        return run_id

    def pick_seq(self, data: st.DataObject, run_id: str) -> int:
        """The Run's current sequence, or a near miss (the one before, the one after) one
        time in four."""
        run = self.model.runs.get(run_id)
        current = 0 if run is None else run.enqueue_seq
        offset = data.draw(st.sampled_from([0, 0, 0, 0, 0, 0, -1, 1]), label="sequence offset")
        return max(0, current + offset)

    def owners(self) -> list[str]:
        receives = [slot_id for slot_id, row in self.model.messages.items() if row.receive_key is not None]
        return (list(self.model.consents) + list(self.model.jobs) + receives
                + ["00000000-0000-4000-8000-00000000000f", *TIMERS])

    def pick_owner(self, data: st.DataObject, aimed: list[str]) -> str:
        """One of ``aimed`` (the owners the rule's Run can use) when aiming, else any owner."""
        aiming = self.aim(data)
        owner_id = self.pick(data, aimed if aiming and aimed else self.owners())
        assert owner_id is not None  # owners() is never empty
        return owner_id

    def current_owner(self, run_id: str) -> list[str]:
        """The owner the Run waits on, if any (a resume's aim)."""
        run = self.model.runs.get(run_id)
        return [] if run is None or run.owner_id is None else [run.owner_id]

    def owners_of(self, run_id: str, kind: WaitKind) -> list[str]:
        """The owners of ``kind`` that belong to ``run_id`` (a park's own owners)."""
        if kind is WaitKind.MESSAGE:  # the Run's receives (a message no receive took is no owner)
            return [slot_id for slot_id, row in self.model.messages.items()
                    if row.run_id == run_id and row.receive_key is not None]
        rows: dict[str, Any] = self.model.consents if kind is WaitKind.CONSENT else self.model.jobs
        return [owner_id for owner_id, row in rows.items() if row.run_id == run_id]

    def once(self, call: Callable[[], Any]) -> tuple[tuple[Any, ...], int | None]:
        """The ledger's answer and the one database time it read (None: no transaction wrote)."""
        actual = self.run(call())
        seen = self.clock.take_all()
        assert len(seen) <= 1, f"one transaction per operation, saw {len(seen)}"
        self.latest_us = max([self.latest_us, *seen])
        return actual, (seen[0] if seen else None)

    def check(self, call: Callable[[], Any], model_step: Callable[[int], Any]) -> None:
        actual, now = self.once(call)
        assert now is not None, "every operation here reads the database clock once"
        self.expect(actual, outcome(lambda: model_step(now)))

    # --- admission and delivery ----------------------------------------------------------------

    # One admission in four holds its hop (a HELD delivery waits for a release before
    # anything can claim it): half of them left most Runs unclaimable.
    @rule(session=st.sampled_from(SESSIONS), key=st.sampled_from(KEYS), hold=st.sampled_from([False, False, False, True]),
          fence=st.booleans(),
          payload=st.integers(1, 2), priority=st.sampled_from([10, 50]), requested=st.sampled_from([None, 70]),
          queue=st.sampled_from(QUEUES), timeout_s=st.sampled_from(TIMEOUTS_S))
    def admit(self, session: str | None, key: str | None, hold: bool, fence: bool, payload: int, priority: int,
              requested: int | None, queue: str, timeout_s: float | None) -> None:
        fence = fence and session is not None
        intent = _intent(session, payload, requested)
        actual, now = self.once(lambda: self.ledgers[0].admit(
            intent, workflow=WORKFLOW, queue=queue, priority=priority, idempotency_key=key, hold=hold, session_fence=fence,
            timeout_s=timeout_s))
        assert now is not None
        fresh = actual[1].run.run_id if actual[0] == "ok" else None
        if actual[0] == "ok":
            actual = ("ok", (actual[1].run, actual[1].delivery, actual[1].created))
        timeout_us = None if timeout_s is None else round(timeout_s * 1_000_000)
        self.expect(actual, outcome(lambda: self.model.admit(intent, queue, priority, key, hold, fence, fresh, now,
                                                             timeout_us)))

    @rule(data=st.data(), fail=st.booleans())
    def release_or_fail_held(self, data: st.DataObject, fail: bool) -> None:
        run_id = self.pick_run(data, _held)
        seq = self.pick_seq(data, run_id)
        if fail:
            self.check(lambda: self.ledgers[0].fail_held(run_id, seq, error="context lost"),
                       lambda now: self.model.applied(run_id, FailHeld(enqueue_seq=seq, error="context lost"), now))
        else:
            self.check(lambda: self.ledgers[0].release(run_id, seq),
                       lambda now: self.model.applied(run_id, Release(enqueue_seq=seq), now))

    @rule(data=st.data(), fault=st.sampled_from(["none", "none", "fail", "lose_acknowledgement"]))
    def publish(self, data: st.DataObject, fault: str) -> None:
        run_id = self.pick_run(data, _publishable)
        seq = self.pick_seq(data, run_id)
        self.broker.fail_publishes = int(fault == "fail")
        self.broker.lose_acknowledgements = int(fault == "lose_acknowledgement")
        calls_before = self.broker.publish_calls
        remembered = self.ledgers[0].engine.last_pair(run_id)
        actual, now = self.once(lambda: self.ledgers[0].publish(run_id, seq, self.broker))
        sent = self.broker.publish_calls > calls_before
        self.broker.fail_publishes = self.broker.lose_acknowledgements = 0
        pair = self.model.pair(run_id)
        publishable = pair is not None and isinstance(RUNS.decide(pair, RecordPublished(enqueue_seq=seq), 0), Applied)
        # The ledger asks the kernel of the pair it last saw first (``RunLedger._publishable``):
        # a pair the other ledger has since moved on (cancelled, claimed, settled) lets the
        # broker be called for a hop nobody may run, whose record is then refused on the
        # rows as locked (documented there). Only a pair that stale explains a call the
        # stored pair does not.
        stale = not publishable and remembered is not None and isinstance(
            RUNS.decide(remembered, RecordPublished(enqueue_seq=seq), remembered.run.updated_at_us), Applied)
        assert sent == (publishable or stale), "the broker is called exactly when the kernel says the hop is publishable"
        if not sent:
            assert now is None
            self.expect(actual, ("ok", False))
            return
        assert now is not None
        if fault != "none":
            error = RecordPublishError(enqueue_seq=seq, error="publish_failed:BrokerUnavailable")
            self.model.applied(run_id, error, now)
            self.expect(actual, ("error", "run_broker_failed", "publish_failed"))
        else:
            self.expect(actual, outcome(lambda: self.model.applied(run_id, RecordPublished(enqueue_seq=seq), now)))
        if publishable and pair is not None and fault in ("lose_acknowledgement", "none"):
            assert self.broker.jobs[hop_key(run_id, seq)].queue == pair.current.queue

    @rule(data=st.data(), node=st.sampled_from(NODES), claimant=st.sampled_from([None, "claimant-1", "claimant-2"]))
    def claim(self, data: st.DataObject, node: str, claimant: str | None) -> None:
        # A claimant repeated on a running Run is a claim sent again after its lost answer.
        # (Its draws stay as they were: the focused machines that catch the broken
        # engines keep this rule, and their reach depends on its data.)
        run_id = self.pick_run(data, _publishable)
        seq = self.pick_seq(data, run_id)
        self.check(lambda: self.ledgers[0].claim(run_id, seq, node=node, claimant=claimant),
                   lambda now: self.model.claim(run_id, seq, node, now, claimant))

    @rule(data=st.data(), node=st.sampled_from(NODES),
          serves=st.sampled_from([((WORKFLOW.name, WORKFLOW.revision), ("other", "r1")), (),
                                  ((WORKFLOW.name, "r2"),), (("other", WORKFLOW.revision),)]))
    def claim_by_a_versioned_worker(self, data: st.DataObject, node: str, serves: tuple[tuple[str, str], ...]) -> None:
        # A worker naming the versions it serves: one that serves the Run's claims it, one
        # of another workflow version (a rolling deploy) leaves the Run as it was.
        run_id = self.pick_run(data, _publishable)
        seq = self.pick_seq(data, run_id)
        self.check(lambda: self.ledgers[0].claim_served(run_id, seq, node=node, claimant="claimant-3", serves=serves),
                   lambda now: self.model.claim(run_id, seq, node, now, "claimant-3", serves))

    @rule(data=st.data(), enter=st.booleans())
    def hardware_wait(self, data: st.DataObject, enter: bool) -> None:
        run_id = self.pick_run(data, _holding)
        seq = self.pick_seq(data, run_id)
        ledger = self.ledgers[0]
        if enter:
            self.check(lambda: ledger.enter_hardware_wait(run_id, seq),
                       lambda now: self.model.applied(run_id, EnterHardwareWait(enqueue_seq=seq), now))
        else:
            self.check(lambda: ledger.leave_hardware_wait(run_id, seq),
                       lambda now: self.model.applied(run_id, LeaveHardwareWait(enqueue_seq=seq), now))

    @rule(data=st.data())
    def broker_starts_or_finishes_a_hop(self, data: st.DataObject) -> None:
        """A broker worker takes a queued job (it becomes live and active) or finishes one."""
        if data.draw(st.booleans()):
            self.broker.take(data.draw(st.sampled_from(QUEUES)))
        else:
            active = sorted(key for key, job in self.broker.jobs.items() if job.state is BrokerJobState.ACTIVE)
            chosen = self.pick(data, active)
            if chosen is not None:
                self.broker.finish(chosen)

    # --- owners --------------------------------------------------------------------------------

    @rule(data=st.data(), preauthorized=st.booleans())
    def create_consent(self, data: st.DataObject, preauthorized: bool) -> None:
        run_id = self.pick_run(data, _running)
        actual, now = self.once(lambda: self.ledgers[0].consents.create(
            run_id, tool_name="shell", tool_call_id="call-1", payload={"command": "ls"},
            preauthorized_by="policy-1" if preauthorized else None))
        assert now is not None
        consent_id = actual[1].consent_id if actual[0] == "ok" else "consent-never-stored"
        row = ConsentRow(consent_id=consent_id, run_id=run_id, tool_name="shell", tool_call_id="call-1",
                         payload_json='{"command":"ls"}', status=ConsentStatus.PENDING, decided_by=None,
                         decided_at_us=None, preauthorized_by="policy-1" if preauthorized else None, created_at_us=0)
        self.expect(actual, outcome(lambda: self.model.create_consent(row, now)))

    @rule(data=st.data(), verdict=st.sampled_from([ConsentStatus.GRANTED, ConsentStatus.DENIED, ConsentStatus.EXPIRED]))
    def decide_consent(self, data: st.DataObject, verdict: ConsentStatus) -> None:
        # Aimed: a pending consent, one its Run waits on first (its verdict lets a resume apply).
        pending = [row.consent_id for row in self.model.consents.values() if row.status is ConsentStatus.PENDING]
        waited = [consent_id for consent_id in pending if self.current_owner(self.model.consents[consent_id].run_id) == [consent_id]]
        aiming = self.aim(data)
        consent_id = self.pick(data, (waited or pending) if aiming and pending
                               else list(self.model.consents) + ["00000000-0000-4000-8000-0000000000c0"])
        assert consent_id is not None
        self.check(lambda: self.ledgers[0].consents.decide(consent_id, verdict, decided_by="principal-p"),
                   lambda now: self.model.decide_consent(consent_id, verdict, now))

    @rule(data=st.data(), request_id=st.sampled_from(REQUESTS), variant=st.integers(1, 2))
    def submit_job(self, data: st.DataObject, request_id: str, variant: int) -> None:
        run_id = self.pick_run(data, _running)
        row = _job_row(run_id, request_id, variant)
        self.check(lambda: self.ledgers[0].jobs.submit(run_id, request_id=request_id, runtime="runtime-r",
                                                      profile="profile-p", request={"task": variant}),
                   lambda now: self.model.submit_job(row, now))

    @rule(data=st.data(), action=st.sampled_from(["admitted", "preparing", "running", "adopt", "cancelled"]),
          result=st.sampled_from(TERMINAL_RESULTS))
    def move_job(self, data: st.DataObject, action: str, result: AgentJobStatus) -> None:
        open_jobs = [row.job_id for row in self.model.jobs.values() if row.status in finders.OPEN_JOB_STATUSES]
        aiming = self.aim(data)
        job_id = self.pick(data, open_jobs if aiming and open_jobs else list(self.model.jobs) + [job_id_for("request-never")])
        assert job_id is not None
        ledger = self.ledgers[0]
        if action == "adopt":
            document = _result(job_id, result)
            import json as _json

            text = _json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            self.check(lambda: ledger.jobs.adopt_result(job_id, document),
                       lambda now: self.model.job_command(job_id, AdoptResult(status=result, result_json=text), now))
        elif action == "cancelled":
            self.check(lambda: ledger.jobs.record_cancelled(job_id),
                       lambda now: self.model.job_command(job_id, RecordCancelled(result_json=cancelled_result(job_id)), now))
        else:
            status = AgentJobStatus(action)
            self.check(lambda: ledger.jobs.advance(job_id, status, runtime_job_id="runtime-job-1"),
                       lambda now: self.model.job_command(job_id, AdvanceJob(status=status, runtime_job_id="runtime-job-1"), now))

    @rule(data=st.data(), topic=st.sampled_from(TOPICS), message_id=st.sampled_from(MESSAGE_IDS),
          variant=st.integers(1, 2))
    def send_message(self, data: st.DataObject, topic: str, message_id: str | None, variant: int) -> None:
        """A message to a Run (aimed at an open one), from any process and without a
        broker: a send that fills a waiting receive resumes the Run waiting on it in a
        second transaction (the relays publish the hop it opens). A message ID drawn
        again replays the stored message, or, with another topic or message, conflicts."""
        # Aimed at a Run with a receive waiting when there is one (and at its topic): the
        # send that fills it. Every pick is always drawn: the draws keep one shape.
        waiting = {row.run_id: row.topic for row in self.model.messages.values() if row.status is MessageStatus.PENDING}
        preferred = self.pick_run(data, lambda pair: _open(pair) and pair.run.run_id in waiting)
        other = self.pick_run(data, _open)
        run_id = preferred if any(run_id in waiting and run.status not in TERMINAL_RUN_STATUSES
                                  for run_id, run in self.model.runs.items()) else other
        if self.aim(data) and run_id in waiting:
            topic = waiting[run_id]
        actual = self.run(self.ledgers[0].messages.send(run_id, topic, {"n": variant}, message_id=message_id))
        times = self.clock.take_all()
        assert times, "the send reads the database clock"
        self.latest_us = max([self.latest_us, *times])
        stored = actual[1] if actual[0] == "ok" else None
        row = MessageRow(
            slot_id="slot-never-stored" if stored is None else stored.slot_id, run_id=run_id, topic=topic,
            status=MessageStatus.SENT, message_id=(message_id or "m-never-stored") if stored is None else stored.message_id,
            message_json=f'{{"n":{variant}}}', sequence=None, sent_at_us=None, receive_key=None, expires_at_us=None,
            created_at_us=0, decided_at_us=None, decided_by=None)
        expected = outcome(lambda: self.model.send_message(row, times[0]))
        delivered = expected[0] == "ok" and isinstance(expected[1][1], Delivered)
        if expected[0] == "ok":
            self.message_event(type(expected[1][1]).__name__)
            expected = ("ok", expected[1][0])
        assert len(times) == 1 + int(delivered), f"the send, then the resume of a filled receive; saw {len(times)}"
        if delivered:
            assert stored is not None
            self.model.resume(run_id, stored.slot_id, times[1])
        self.expect(actual, expected)

    @rule(data=st.data(), topic=st.sampled_from(TOPICS), key=st.sampled_from(RECEIVE_KEYS),
          timeout_s=st.sampled_from([None, None, 0.000_001, 3600]))
    def receive_message(self, data: st.DataObject, topic: str, key: str, timeout_s: float | None) -> None:
        """The hop holding a Run receives (a key drawn again replays that receive): it
        takes the first undelivered message of the topic, or waits, with no timeout, one
        due a microsecond later, or one due in an hour."""
        run_id = self.pick_run(data, _holding)
        seq = self.pick_seq(data, run_id)
        actual, now = self.once(lambda: self.ledgers[0].messages.receive(run_id, seq, topic, key=key,
                                                                          timeout_s=timeout_s))
        assert now is not None
        row = MessageRow(
            slot_id=actual[1].slot_id if actual[0] == "ok" else "slot-never-stored", run_id=run_id, topic=topic,
            status=MessageStatus.PENDING, message_id=None, message_json=None, sequence=None, sent_at_us=None,
            receive_key=key, expires_at_us=None, created_at_us=0, decided_at_us=None, decided_by=None)
        expires_in_us = None if timeout_s is None else max(1, round(timeout_s * 1_000_000))
        expected = outcome(lambda: self.model.receive_message(row, seq, expires_in_us, now))
        if expected[0] == "ok":
            self.message_event(type(expected[1][1]).__name__)
            expected = ("ok", expected[1][0])
        self.expect(actual, expected)

    @rule(limit=st.sampled_from([1, 8]))
    def time_out_receives(self, limit: int) -> None:
        """The relays' round of receive deadlines: the page of waiting receives whose
        deadline passed, each timed out as ``tenure:deadline`` in a transaction of its own
        and its Run resumed in another (no broker: the relays publish the hop)."""
        ledger = self.ledgers[0]

        async def resume(run_id: str, slot_id: str) -> object:
            return await ledger.resume(run_id, owner_id=slot_id)

        actual = self.run(ledger.messages.time_out_due(resume=resume, limit=limit))
        times = self.clock.take_all()
        assert times, "the page reads the database clock"
        self.latest_us = max([self.latest_us, *times])
        rest = iter(times[1:])
        timed_out = 0
        for slot in self.model.due_receives(times[0], limit):
            if self.model.time_out_receive(slot.slot_id, next(rest)):
                timed_out += 1
                self.model.resume(slot.run_id, slot.slot_id, next(rest))
        assert next(rest, None) is None, "one transaction per timeout and per resume"
        self.message_event("TimedOut", timed_out)
        # A round that timed nothing out counts as refused (``None``), one that did as applied.
        self.expect(("ok", actual[1] or None) if actual[0] == "ok" else actual, ("ok", timed_out or None))

    @rule(data=st.data(), kind=st.sampled_from([WaitKind.CONSENT, WaitKind.DELEGATE, WaitKind.MESSAGE]))
    def park(self, data: st.DataObject, kind: WaitKind) -> None:
        run_id = self.pick_run(data, _running)
        seq = self.pick_seq(data, run_id)
        owner_id = self.pick_owner(data, self.owners_of(run_id, kind))
        self.check(lambda: self.ledgers[0].park(run_id, seq, kind=kind, owner_id=owner_id),
                   lambda now: self.model.park(run_id, seq, kind, owner_id, now))

    @rule(data=st.data(), name=st.sampled_from(TIMERS), delay_s=st.sampled_from([0, 0.000_001, 3600]))
    def park_timer(self, data: st.DataObject, name: str, delay_s: float) -> None:
        """A timer due at once, a microsecond after the park, or in an hour; a later
        resume (any rule's database time) meets it due or not."""
        run_id = self.pick_run(data, _running)
        seq = self.pick_seq(data, run_id)
        self.check(lambda: self.ledgers[0].park_timer(run_id, seq, name=name, delay_s=delay_s),
                   lambda now: self.model.park_timer(run_id, seq, name, now + round(delay_s * 1_000_000), now))

    @rule(data=st.data(), step=st.integers(1, 2), bind=st.booleans())
    def save_checkpoint(self, data: st.DataObject, step: int, bind: bool) -> None:
        """A hop saves its snapshot, bound to one of its Run's consents or keeping the
        stored binding; a settle must then delete it."""
        run_id = self.pick_run(data, _holding)
        seq = self.pick_seq(data, run_id)
        drawn = self.pick_owner(data, self.owners_of(run_id, WaitKind.CONSENT))
        owner_id = drawn if bind else None
        actual, now = self.once(lambda: self.ledgers[0].checkpoints.save(
            run_id, seq, state={"step": step}, owner_kind=None if owner_id is None else WaitKind.CONSENT,
            owner_id=owner_id))
        if now is None:  # no Run to lock: nothing read the clock, nothing written
            self.expect(actual, ("ok", False))
            return
        self.expect(actual, outcome(lambda: self.model.save_checkpoint(run_id, seq, f'{{"step":{step}}}', owner_id, now)))

    @rule(data=st.data(), and_publish=st.booleans())
    def resume(self, data: st.DataObject, and_publish: bool) -> None:
        """The ledger's resume, or (``and_publish``) the worker's: the Run resumed and the
        hop it opens published, in one call (:meth:`resume_and_publish`)."""
        run_id = self.pick_run(data, _waiting)
        owner_id = self.pick_owner(data, self.current_owner(run_id))
        if and_publish:
            self.resume_and_publish(run_id, owner_id)
            return
        self.check(lambda: self.ledgers[0].resume(run_id, owner_id=owner_id),
                   lambda now: self.model.resume(run_id, owner_id, now))

    def resume_and_publish(self, run_id: str, owner_id: str) -> None:
        """``resume_and_publish``, as the worker and the relays call it: the resume's
        transaction, then (when it opened a hop: the declared ``publish_hop``) the
        broker's publication of that hop and its acknowledgement, recorded in a second
        transaction. The broker must hold exactly the hop the model opened."""
        published_before = set(self.broker.jobs)
        actual = self.run(resume_and_publish(self.ledgers[0], self.broker, run_id, owner_id=owner_id))
        times = self.clock.take_all()
        assert times, "the resume reads the database clock"
        self.latest_us = max([self.latest_us, *times])
        expected = outcome(lambda: self.model.resume(run_id, owner_id, times[0]))
        self.expect(actual, expected)
        seq = expected[1] if expected[0] == "ok" else None
        opened = set() if seq is None else {hop_key(run_id, seq)}
        assert set(self.broker.jobs) - published_before == opened, "the broker holds exactly the hop the resume opened"
        assert len(times) == 1 + len(opened), f"one transaction for the resume, one for the acknowledgement; saw {len(times)}"
        if seq is not None:
            self.model.applied(run_id, RecordPublished(enqueue_seq=seq), times[1])

    # --- settlement and cancellation -------------------------------------------------------

    @rule(data=st.data(), status=st.sampled_from([RunStatus.DONE, RunStatus.FAILED]))
    def settle(self, data: st.DataObject, status: RunStatus) -> None:
        # Aimed at a hop whose Run has pending consents or waiting receives when there is one: the settle
        # whose declared follow-up (the sweep) has work to do.
        # Both picks are always drawn: the draws keep one shape whatever the state.
        swept = {row.run_id for row in self.model.consents.values() if row.status is ConsentStatus.PENDING} | {
            row.run_id for row in self.model.messages.values() if row.status is MessageStatus.PENDING}
        preferred = self.pick_run(data, lambda pair: _holding(pair) and pair.run.run_id in swept)
        other = self.pick_run(data, _holding)
        run_id = preferred if any(run_id in swept and run.status in HOP_STATUSES
                                  for run_id, run in self.model.runs.items()) else other
        seq = self.pick_seq(data, run_id)
        error = "it broke" if status is RunStatus.FAILED else None
        self.check(lambda: self.ledgers[0].settle(run_id, seq, status, error=error),
                   lambda now: self.model.settle(run_id, seq, status, now))

    @rule(data=st.data())
    def begin_cancel(self, data: st.DataObject) -> None:
        run_id = self.pick_run(data, _open)
        self.check(lambda: self.ledgers[0].begin_cancel(run_id), lambda now: self.model.begin_cancel(run_id, now))

    @rule(data=st.data())
    def time_out(self, data: st.DataObject) -> None:
        """The deadline's owner: an open Run with a deadline when aiming (a microsecond's
        has passed, an hour's has not); a Run without one, a finished or a missing one
        otherwise."""
        run_id = self.pick_run(data, _open_with_deadline)
        self.check(lambda: self.ledgers[0].time_out(run_id), lambda now: self.model.time_out(run_id, now))

    @rule(data=st.data(), abort_fails=st.booleans())
    def finish_cancel(self, data: st.DataObject, abort_fails: bool) -> None:
        run_id = self.pick_run(data, _cancelling)
        seq = self.pick_seq(data, run_id)
        pair = self.model.pair(run_id)
        fenced = pair is not None and pair.run.status is RunStatus.CANCELLING and pair.run.enqueue_seq == seq
        key = hop_key(run_id, seq)
        before = None if key not in self.broker.jobs else self.broker.jobs[key].state
        self.broker.fail_aborts = int(abort_fails)
        actual, now = self.once(lambda: self.ledgers[0].finish_cancel(run_id, seq, self.broker))
        self.broker.fail_aborts = 0
        after = None if key not in self.broker.jobs else self.broker.jobs[key].state
        if fenced:
            hop: BrokerJobState | None = BrokerJobState.ABSENT if after is None else after
            if before in (BrokerJobState.QUEUED, BrokerJobState.ACTIVE):
                assert (after is BrokerJobState.ABORTED) == (not abort_fails), "a live frozen hop is aborted first"
        else:
            hop = None  # not probed: unknown, never "absent"
            assert after == before, "a generation that is not frozen is never aborted"
        assert now is not None
        self.expect(actual, outcome(lambda: self.model.finish_cancel(run_id, seq, hop, now)))

    # --- two ledgers at once ------------------------------------------------------------------

    @rule(data=st.data())
    def two_claimers_of_one_hop(self, data: st.DataObject) -> None:
        run_id = self.pick_run(data, _publishable)
        seq = self.pick_seq(data, run_id)

        def call(ledger: RunLedger, node: str) -> Callable[[], Awaitable[Any]]:
            return lambda: ledger.claim(run_id, seq, node=node)

        def step(node: str) -> Callable[[int], Any]:
            return lambda now: self.model.claim(run_id, seq, node, now)

        self.race([call(ledger, node) for ledger, node in zip(self.ledgers, NODES, strict=True)],
                  [step(node) for node in NODES])

    @rule(data=st.data())
    def two_resumers_of_one_wait(self, data: st.DataObject) -> None:
        run_id = self.pick_run(data, _waiting)
        run = self.model.runs.get(run_id)
        drawn = self.pick(data, self.owners())
        assert drawn is not None
        owner_id = run.owner_id if run is not None and run.owner_id is not None else drawn

        def call(ledger: RunLedger) -> Callable[[], Awaitable[Any]]:
            return lambda: ledger.resume(run_id, owner_id=owner_id)

        def step(now: int) -> Any:
            return self.model.resume(run_id, owner_id, now)

        self.race([call(ledger) for ledger in self.ledgers], [step] * 2)

    @rule(data=st.data())
    def cancellation_racing_completion(self, data: st.DataObject) -> None:
        run_id = self.pick_run(data, _holding)
        seq = self.pick_seq(data, run_id)
        self.race([lambda: self.ledgers[0].settle(run_id, seq, RunStatus.DONE),
                   lambda: self.ledgers[1].begin_cancel(run_id)],
                  [lambda now: self.model.settle(run_id, seq, RunStatus.DONE, now),
                   lambda now: self.model.begin_cancel(run_id, now)])

    @rule(data=st.data())
    def deadline_racing_completion(self, data: st.DataObject) -> None:
        run_id = self.pick_run(data, _holding_with_deadline)
        seq = self.pick_seq(data, run_id)
        self.race([lambda: self.ledgers[0].settle(run_id, seq, RunStatus.DONE),
                   lambda: self.ledgers[1].time_out(run_id)],
                  [lambda now: self.model.settle(run_id, seq, RunStatus.DONE, now),
                   lambda now: self.model.time_out(run_id, now)])

    @rule(data=st.data())
    def release_racing_fail_held(self, data: st.DataObject) -> None:
        run_id = self.pick_run(data, _held)
        seq = self.pick_seq(data, run_id)
        self.race([lambda: self.ledgers[0].release(run_id, seq),
                   lambda: self.ledgers[1].fail_held(run_id, seq, error="context lost")],
                  [lambda now: self.model.applied(run_id, Release(enqueue_seq=seq), now),
                   lambda now: self.model.applied(run_id, FailHeld(enqueue_seq=seq, error="context lost"), now)])

    @rule(key=st.sampled_from(["key-1", "key-2"]), hold=st.booleans(), payloads=st.tuples(st.integers(1, 2), st.integers(1, 2)),
          behind=st.sampled_from([False, False, False, True]))
    def concurrent_same_key_admissions(self, key: str, hold: bool, payloads: tuple[int, int], behind: bool) -> None:
        """Two admissions under one key at once; one time in four, one behind the other
        under a fresh key (:meth:`admission_behind_an_insert`)."""
        if behind:
            self.admission_behind_an_insert(hold, payloads)
            return
        intents = [_intent("session-1", payload, None) for payload in payloads]

        def normalize(answer: tuple[Any, ...]) -> tuple[Any, ...]:
            if answer[0] == "ok" and not isinstance(answer[1], tuple):
                return ("ok", (answer[1].run, answer[1].delivery, answer[1].created))
            return answer

        def call(ledger: RunLedger, intent: RunIntent) -> Callable[[], Awaitable[Any]]:
            return lambda: ledger.admit(intent, workflow=WORKFLOW, queue="runs", priority=50, idempotency_key=key,
                                        hold=hold)

        def step(intent: RunIntent) -> Callable[[int], Any]:
            return lambda now: self.model.admit(intent, "runs", 50, key, hold, False, None, now)

        self.race([call(ledger, intent) for ledger, intent in zip(self.ledgers, intents, strict=True)],
                  [step(intent) for intent in intents],
                  normalize)

    # --- the decided-ahead path's fallback, on purpose ------------------------------------------
    #
    # On PostgreSQL a command with a decided-ahead form takes the transaction path only
    # when its one statement cannot decide it: a serial stream rarely meets such a case,
    # so these rules plant one. Another session's transaction writes the Run (a resume
    # that opens the next hop) or the same admission, and stays open until the command's
    # statement waits on its locks: that statement's snapshot predates the commit, so it
    # cannot see the new delivery (or the inserted Run) and falls back. Both are compared
    # with the model in their serial order (the writer first: the command's clock is read
    # after the writer's commit). On SQLite (no decided-ahead statements) the two run one
    # after the other.

    def resumable(self, pair: RunPair) -> bool:
        """Whether a resume from the Run's current owner applies (at the latest database
        time seen: a timer due then is due at any later time)."""
        run = pair.run
        owner = self.model.evidence(run.owner_kind, run.owner_id)
        command = Resume(owner_id=run.owner_id or "", owner=owner)
        return run.owner_id is not None and isinstance(RUNS.decide(pair, command, self.latest_us), Applied)

    def rotatable(self, pair: RunPair) -> bool:
        """A Run whose next hop one transaction can open (:meth:`rotation`)."""
        return _held(pair) or _publishable(pair) or _running(pair) or self.resumable(pair)

    def rotation(self, run_id: str, owner_id: str) -> list[tuple[RunCommand, Inputs]]:
        """The commands one transaction sends to open the Run's next hop, from where the
        Run stands: a held hop is released, a queued one claimed, a running one parks on
        a timer due at the clock read under the lock, and the Run resumes (from
        ``owner_id`` when it already waits: a resume that may not apply)."""
        pair = self.model.pair(run_id)
        if pair is None or not (_held(pair) or _publishable(pair) or _running(pair)):
            return [(Resume(owner_id=owner_id, owner=None), NO_INPUTS)]
        seq = pair.run.enqueue_seq
        steps: list[tuple[RunCommand, Inputs]] = []
        if _held(pair):
            steps.append((Release(enqueue_seq=seq), NO_INPUTS))
        if not _running(pair):
            steps.append((Claim(enqueue_seq=seq, node=NODES[1]), NO_INPUTS))
        park = Park(enqueue_seq=seq, wait=WaitKind.TIMER, owner_id=TIMERS[0], owner=None)
        return [*steps, (park, Inputs(delay_us=0)), (Resume(owner_id=TIMERS[0], owner=None), NO_INPUTS)]

    def model_rotation(self, run_id: str, steps: list[tuple[RunCommand, Inputs]], now: int) -> list[Decision]:
        """The model's decisions of :meth:`rotation`'s commands at ``now`` (their one
        transaction's time; the engine fills the evidence each reads). A coded refusal
        raises, and the model keeps nothing of the transaction it rolls back."""
        saved = self.model.snapshot()
        decisions = []
        try:
            for command, inputs in steps:
                if isinstance(command, Park):
                    command = dataclasses.replace(command, wake_at_us=now + (inputs.delay_us or 0))
                elif isinstance(command, Resume):
                    run = self.model.runs.get(run_id)
                    owner = None if run is None else self.model.evidence(run.owner_kind, run.owner_id)
                    command = dataclasses.replace(command, owner=owner)
                decisions.append(self.model.run_command(run_id, command, now))
        except TenureError:
            self.model.restore(saved)
            raise
        return decisions

    def while_written(self, write: Callable[[Any], Awaitable[Any]], call: Callable[[], Awaitable[Any]],
                      ) -> tuple[tuple[Any, ...], tuple[Any, ...], bool, list[int]]:
        """``write(tx)`` in the second ledger's transaction, held open until ``call`` (the
        first ledger's) waits on its locks (PostgreSQL), else one after the other: both
        outcomes, whether ``call`` waited, and the database times the two read, in order."""
        writer = self.ledgers[1]
        self.clock.seen.clear()
        self.paths_this_step.clear()
        self.step_dump = None

        async def hold(connection: Any) -> Any:
            async with writer.store.borrowed(connection) as tx:
                return await write(tx)

        async def serially() -> tuple[tuple[Any, ...], tuple[Any, ...], bool]:
            held = await self.awaited(writer.engine.run(write))
            return held, await self.awaited(call()), False

        if self.database == "postgresql":
            if self.holder is None:
                self.holder = self.runner.run(raw.connect(self.db_url))
            held, called, waited = self.runner.run(raw.holding_open(self.holder, self.db_url, hold, call))
        else:
            held, called, waited = self.runner.run(serially())
        times = self.clock.take_all()
        self.latest_us = max([self.latest_us, *times])
        return held, called, waited, times

    def expect_both(self, actual: tuple[tuple[Any, ...], ...], expected: tuple[tuple[Any, ...], ...]) -> None:
        """Both answers of a step of two calls equal the model's (one step, as a race is)."""
        self.counter.step()
        self.counter.answered(*expected)
        assert actual == expected, f"adapter {actual!r} != model {expected!r}"

    @staticmethod
    def two_times(times: list[int]) -> tuple[int, int]:
        assert len(times) == 2, f"one transaction per call, saw {len(times)}"
        return times[0], times[1]

    @staticmethod
    async def awaited(call: Awaitable[Any]) -> tuple[Any, ...]:
        """What ``call`` answers, as :func:`~tenure.conformance.lockstep.harness.outcome` reports it."""
        try:
            return ("ok", await call)
        except TenureError as error:
            return ("error", error.code.value, error.reason)

    def fell_back(self, kind: RunCommandType, waited: bool, premise: bool) -> None:
        """A command that waited behind a writer whose commit it cannot see (``premise``)
        took the transaction path: the decided-ahead statement must not decide it."""
        if self.database == "postgresql" and waited and premise:
            assert (kind, FALLBACK) in self.paths_this_step, (
                f"{kind.value} waited behind a concurrent commit and never fell back: {self.paths_this_step}")

    @rule(data=st.data(), kind=st.sampled_from(sorted(BEHIND_A_ROTATION, key=lambda kind: kind.value)),
          offset=st.sampled_from([1, 1, 1, 0]))
    def decided_ahead_behind_a_rotation(self, data: st.DataObject, kind: RunCommandType, offset: int) -> None:
        """Another session opens a Run's next hop (:meth:`rotation`) while a command sent
        to the hop it opens (``offset`` 1) or to the one before waits on the Run's lock."""
        run_id = self.pick_run(data, self.rotatable)
        pair = self.model.pair(run_id)
        owner_id = self.pick_owner(data, self.current_owner(run_id))
        steps = self.rotation(run_id, owner_id)
        command = BEHIND_A_ROTATION[kind]((0 if pair is None else pair.run.enqueue_seq) + offset)

        async def write(tx: Any) -> list[Decision]:
            engine = self.ledgers[1].engine
            return [(await engine.send_in(tx, run_id, step, inputs)).decision for step, inputs in steps]

        async def call() -> Decision:
            return (await self.ledgers[0].engine.send(run_id, command)).decision

        held, called, waited, times = self.while_written(write, call)
        self.fell_back(kind, waited, held[0] == "ok" and isinstance(held[1][-1], Applied) and kind in AHEAD_KINDS)
        rotated_at, sent_at = self.two_times(times)
        expected = _decided(outcome(lambda: self.model_rotation(run_id, steps, rotated_at)))
        model_command = command
        if isinstance(command, Settle):  # the engine counts the containment the settle reads
            model_command = dataclasses.replace(command, containment=self.model.containment(run_id))
        self.expect_both((_decided(held), _decided(called)),
                         (expected, _decided(outcome(lambda: self.model.run_command(run_id, model_command, sent_at)))))

    def admission_behind_an_insert(self, hold: bool, payloads: tuple[int, int]) -> None:
        """Two admissions under a fresh key: one inserts the Run in another session's
        transaction, held open while the other's statement waits on that insert (a
        variant of :meth:`concurrent_same_key_admissions`, where the two race freely)."""
        self.held_keys += 1
        key = f"key-held-{self.held_keys}"
        run_id = run_id_for(key)
        intents = [_intent("session-1", payload, None) for payload in payloads]
        row, template = admission_rows(intents[0], WORKFLOW, "runs", 50, key, run_id)
        admit = Admit(run=row, delivery=template, hold=hold, session_busy=False)

        async def write(tx: Any) -> Decision:
            return (await self.ledgers[1].engine.send_in(tx, run_id, admit)).decision

        async def call() -> tuple[Any, ...]:
            admission = await self.ledgers[0].admit(intents[1], workflow=WORKFLOW, queue="runs", priority=50,
                                                    idempotency_key=key, hold=hold)
            return admission.run, admission.delivery, admission.created

        held, called, waited, times = self.while_written(write, call)
        created = held[0] == "ok" and isinstance(held[1], Applied)
        self.fell_back(RunCommandType.ADMIT, waited, created and RunCommandType.ADMIT in AHEAD_KINDS)
        inserted_at, admitted_at = self.two_times(times)
        expected = _decided(outcome(lambda: self.model.run_command(run_id, admit, inserted_at)))
        self.expect_both((_decided(held), called),
                         (expected, outcome(lambda: self.model.admit(intents[1], "runs", 50, key, hold, False, None,
                                                                      admitted_at))))

    # --- after every step ------------------------------------------------------------------------

    def dump(self) -> tuple[dict[str, Any], ...]:
        async def read(tx: Any) -> tuple[dict[str, Any], ...]:
            tables = []
            for binding in (RUNS_BINDING, DELIVERIES_BINDING, CONSENTS_BINDING, AGENT_JOBS_BINDING, CHECKPOINTS_BINDING,
                            MESSAGES_BINDING):
                rows = await tx.find(binding, _ALL, {}, 100_000)
                tables.append({getattr(row, binding.key_field): row for row in rows})
            return tuple(tables)

        # One read transaction through store.run (SQLite: one hop to the connection's thread).
        return cast(tuple[dict[str, Any], ...], self.runner.run(self.ledgers[0].store.run(read, write=False)))

    def model_rows(self) -> tuple[dict[str, Any], ...]:
        return self.model.snapshot()

    @invariant()
    def every_row_equals_the_model(self) -> None:
        assert self.rows_after_step() == self.model_rows()
        for run_id in self.model.runs:
            pair = self.model.pair(run_id)
            assert pair is not None and record_violations(pair) == []
        unsettled: dict[str, int] = {}
        for delivery in self.model.deliveries.values():
            if delivery.state.value != "settled":
                unsettled[delivery.run_id] = unsettled.get(delivery.run_id, 0) + 1
        assert all(count == 1 for count in unsettled.values()), "at most one unsettled delivery per Run"
