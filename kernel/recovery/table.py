"""Recovery decisions: what startup reconciliation and the relays do with one Run, as a table.

Theory of operation
-------------------
A process that died leaves Runs behind in every state: a hop claimed and never settled,
a delivery published to a broker that lost it, a consent decided while nobody listened,
a cancellation whose abort failed. Recovery visits each Run and decides, from what it
can observe, one next step. The observation is a :class:`Situation`: the stored Run
and its current delivery (None when the row is missing), which pass is asking
(``reconcile`` at startup with this node's name and boot cutoff, or a ``relay`` with
neither), and the evidence gathered so far in this visit: the broker's answer for the
hop key, whether the hop was fenced (aborted if live, then probed again), the owner
bound by the Run's first resumable checkpoint, the Run's latest non-cancelled owner
row, its persisted owner's evidence and its containment counts.

:func:`case_of` sorts the situation into one :class:`Case` (a total function);
:data:`TABLE` holds, per ``(case, pass)``, an ordered list of rules; the first whose
guard holds names the :class:`Action`. Evidence actions (``probe``, ``fence``,
``ask_checkpoint``, ``contain``, ``contain_attempts``, ``observe``) only gather facts: the ledger performs
them, adds what it learned to the situation and asks again. A write action
(``publish``, ``mark_published``, ``rotate``, ``fail_held``, ``repark``, ``fail_lost``,
``retry_lost``, ``resume``, ``finish_cancel``, ``cleanup``) is sent to the Run machine (or a port)
with its own compare-and-set; the ledger then reads the Run again and asks afresh
(a bounded number of writes per visit). ``keep`` (still waiting,
held, or live elsewhere; revisited by the relays), ``leave`` (nothing to do) and
``report`` (an issue; the pass is degraded) end the visit without a write.

Nothing here reads a clock, a broker or a database: the ledger observes, the table
decides, the Run machine fences every write. ``specs/recovery.md`` is this table.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any

from tenure.model import (
    FINISHED_BROKER_STATES,
    LIVE_BROKER_STATES,
    AgentJobStatus,
    AttemptState,
    BrokerJobState,
    ConsentStatus,
    DeliveryState,
    MessageStatus,
    RunRecord,
    RunStatus,
    WaitKind,
)

from ..agent_jobs.record import AgentJobRow
from ..attempts.record import AttemptRow
from ..consents.record import ConsentRow
from ..messages.record import MessageRow
from ..runs.commands import Containment, OwnerEvidence
from ..runs.machine import owner_resolves
from ..runs.record import WAIT_FOR_KIND, DeliveryRow, RunRow, key_of

__all__ = [
    "Pass",
    "Case",
    "Action",
    "Reason",
    "Probe",
    "Situation",
    "Verdict",
    "RecoveryRule",
    "GUARDS",
    "ROWS",
    "TABLE",
    "LOST_ERROR",
    "Evidence",
    "EVIDENCE_FOR",
    "evidence_for",
    "lost_and_retryable",
    "latest_owner",
    "HELD_ERROR",
    "case_of",
    "decide",
    "verdict_violations",
]

LOST_ERROR = "lost"
"""The error of an orphan failed at startup: its hop died with the process."""

HELD_ERROR = "admission context unresolved"
"""The error of a HELD admission failed at startup: its caller's retention died too."""


class Pass(enum.Enum):
    """Who asks: startup reconciliation (with a node and a boot cutoff) or a relay."""

    RECONCILE = "reconcile"
    RELAY = "relay"


class Case(enum.Enum):
    """What a Run is, for recovery (values are the spec's names)."""

    DELIVERY_MISSING = "delivery_missing"
    DELIVERY_INVALID = "delivery_invalid"
    DELIVERY_MISMATCH = "delivery_mismatch"
    TERMINAL = "terminal"
    CANCELLING = "cancelling"
    HOP = "hop"
    HELD = "held"
    QUEUED = "queued"
    WAITING = "waiting"


class Action(enum.Enum):
    """What recovery does next with one Run (values are the spec's names)."""

    PROBE = "probe"
    FENCE = "fence"
    ASK_CHECKPOINT = "ask_checkpoint"
    CONTAIN = "contain"
    CONTAIN_ATTEMPTS = "contain_attempts"
    OBSERVE = "observe"
    PUBLISH = "publish"
    REPUBLISH = "republish"
    MARK_PUBLISHED = "mark_published"
    ROTATE = "rotate"
    FAIL_HELD = "fail_held"
    REPARK = "repark"
    FAIL_LOST = "fail_lost"
    SETTLE_RECORDED = "settle_recorded"
    RETRY_LOST = "retry_lost"
    RESUME = "resume"
    FINISH_CANCEL = "finish_cancel"
    CLEANUP = "cleanup"
    KEEP = "keep"
    LEAVE = "leave"
    REPORT = "report"


class Reason(enum.Enum):
    """Why a Run makes the pass degraded (values are the report's issue reasons)."""

    DELIVERY_MISSING = "delivery_missing"
    DELIVERY_STATE_INVALID = "delivery_state_invalid"
    DELIVERY_MISMATCH = "delivery_mismatch"
    QUEUE_UNKNOWN = "queue_unknown"
    BROKER_UNPROBEABLE = "broker_unprobeable"
    START_TIME_UNKNOWN = "start_time_unknown"
    ORPHAN_UNFENCED = "orphan_unfenced"
    CONTAINMENT_UNPROVEN = "containment_unproven"


@dataclasses.dataclass(frozen=True, slots=True)
class Probe:
    """The broker's answer for the hop key: its state (None: the broker could not say),
    its start for an active job (None: unknown), and the queue and wire priority it
    holds the job under when it says (None: not reported)."""

    state: BrokerJobState | None
    started_at_us: int | None = None
    queue: str | None = None
    wire_priority: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Situation:
    """One Run as recovery sees it in one visit (see the module docstring)."""

    phase: Pass
    run: RunRow
    delivery: DeliveryRow | None
    node: str | None
    """The reconciling node (None in a relay)."""
    cutoff_us: int | None
    """The boot cutoff (None in a relay): hops claimed before it belong to a dead process."""
    stale_after_us: int
    """How long before the cutoff a QUEUED Run's active broker job must have started to
    be pre-boot (another node's live worker waiting at its claim gate is younger)."""
    queue_known: bool
    probe: Probe | None = None
    """None: the broker was not asked yet in this visit."""
    fenced: bool = False
    """The hop was fenced in this visit (``probe`` is the answer after the abort)."""
    checkpoint_asked: bool = False
    checkpoint_owner: str | None = None
    """The owner bound by the Run's first resumable checkpoint (None: none)."""
    outcome: tuple[RunStatus, int] | None = None
    """The outcome (DONE or FAILED, and the hop's sequence) the Run's checkpoint records:
    a hop that finished and died before it settled (asked with the checkpoint)."""
    latest_owner: tuple[WaitKind, str] | None = None
    """The Run's newest consent, delegated job, service attempt or receive that is not cancelled."""
    owner: OwnerEvidence | None = None
    """The Run's persisted owner row (waits), re-read in this visit."""
    containment: Containment = Containment(0, 0)
    contained: bool = False
    """The containment ports were called in this visit (``containment`` is after them)."""
    observed: bool = False
    """A waiting service attempt was observed in this visit."""
    now_us: int | None = None
    """The database time read in this visit (read for timer waits only; None: not read)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """The action, the hop key it acts on (broker actions), the owner a re-park binds, or
    the reason of a report."""

    action: Action
    key: str | None = None
    owner: tuple[WaitKind, str] | None = None
    reason: Reason | None = None
    terminal: bool = False
    """A fence with startup's authority to finish the broker job without its worker's
    acknowledgement: only for a hop proven to belong to a dead process (REC-9)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryRule:
    guard: str
    action: Action
    reason: Reason | None = None


# --- the case of a situation --------------------------------------------------------------

_TERMINAL = frozenset({RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED})
_HOPS = frozenset({RunStatus.RUNNING, RunStatus.AWAITING_HARDWARE})
_WAITS = frozenset(WAIT_FOR_KIND.values())
_ALLOWED: dict[RunStatus, frozenset[DeliveryState]] = {
    RunStatus.QUEUED: frozenset({DeliveryState.HELD, DeliveryState.PENDING, DeliveryState.PUBLISHED}),
    RunStatus.RUNNING: frozenset({DeliveryState.CLAIMED}),
    RunStatus.AWAITING_HARDWARE: frozenset({DeliveryState.CLAIMED}),
    **{status: frozenset({DeliveryState.SETTLED}) for status in _WAITS | _TERMINAL},
    RunStatus.CANCELLING: frozenset(DeliveryState),
}
"""The delivery states each status allows (written again here, not imported: recovery
must not trust the invariant it is there to repair)."""


def case_of(situation: Situation) -> Case:
    """The situation's case; total over every Run and delivery, stored or corrupt."""
    run, delivery = situation.run, situation.delivery
    if delivery is None:
        return Case.DELIVERY_MISSING
    if (delivery.run_id != run.run_id or delivery.enqueue_seq != run.enqueue_seq
            or delivery.state not in _ALLOWED.get(run.status, frozenset())):
        return Case.DELIVERY_INVALID
    if delivery.queue != run.queue or delivery.priority != run.priority:
        return Case.DELIVERY_MISMATCH
    status = run.status
    if status in _TERMINAL:
        return Case.TERMINAL
    if status is RunStatus.CANCELLING:
        return Case.CANCELLING
    if status in _HOPS:
        return Case.HOP
    if status in _WAITS:
        return Case.WAITING
    if delivery.state is DeliveryState.HELD:
        return Case.HELD
    return Case.QUEUED


# --- the evidence a visit reads, and the latest owner --------------------------------------


class Evidence(enum.Enum):
    """What a visit reads beside the Run and its delivery."""

    OWNER = "owner"
    """The Run's persisted owner row (a wait resumes only from its owner)."""
    CONTAINMENT = "containment"
    """The Run's open delegated jobs and service attempts."""
    LATEST_OWNER = "latest_owner"
    """The Run's newest owner that is not cancelled (a re-park binds it)."""
    CLOCK = "clock"
    """The database time (a timer's owner is the clock)."""


EVIDENCE_FOR: dict[RunStatus, frozenset[Evidence]] = {
    **{status: frozenset({Evidence.OWNER}) for status in _WAITS - {RunStatus.AWAITING_TIMER}},
    RunStatus.AWAITING_TIMER: frozenset({Evidence.OWNER, Evidence.CLOCK}),
    **{status: frozenset({Evidence.CONTAINMENT, Evidence.LATEST_OWNER}) for status in _HOPS},
    RunStatus.CANCELLING: frozenset({Evidence.CONTAINMENT}),
}
"""The evidence each status is decided on; a status not listed needs none. Only this is
read, so a visit never waits on a row its decision does not use."""


def evidence_for(status: RunStatus) -> frozenset[Evidence]:
    return EVIDENCE_FOR.get(status, frozenset())


def lost_and_retryable(run: RunRow | RunRecord) -> bool:
    """Whether the Run failed ``lost`` (its hop died with its process), the one failure
    ``RunLedger.retry`` re-admits."""
    return run.status is RunStatus.FAILED and run.error == LOST_ERROR


def latest_owner(consents: Sequence[ConsentRow], jobs: Sequence[AgentJobRow],
                 attempts: Sequence[AttemptRow], receives: Sequence[MessageRow] = ()) -> tuple[WaitKind, str] | None:
    """The Run's newest owner that is not cancelled, among its consents, delegated jobs,
    service attempts and receives (message slots a receive holds; ties: consent, then job,
    then attempt, then receive, then the larger ID). None: no such owner."""
    kept = [
        *((row.created_at_us, 0, row.consent_id, WaitKind.CONSENT)
          for row in consents if row.status is not ConsentStatus.CANCELLED),
        *((row.created_at_us, 1, row.job_id, WaitKind.DELEGATE)
          for row in jobs if row.status is not AgentJobStatus.CANCELLED),
        *((row.created_at_us, 2, row.attempt_id, WaitKind.SERVICE)
          for row in attempts if row.state is not AttemptState.CANCELLED),
        *((row.created_at_us, 3, row.slot_id, WaitKind.MESSAGE)
          for row in receives if row.receive_key is not None and row.status is not MessageStatus.CANCELLED),
    ]
    if not kept:
        return None
    _, _, owner_id, kind = max(kept)
    return kind, owner_id


# --- guards: named predicates over a situation ------------------------------------------

_LIVE = LIVE_BROKER_STATES
_FINISHED = FINISHED_BROKER_STATES


def _orphan(s: Situation) -> bool:
    # This node's hop, claimed before this boot: the node the claim recorded on the Run and
    # the delivery's claim time, never the Run's started_at (a later hop of an old Run is
    # claimed after it). The delivery's claimed_by is the hop's claimant token.
    d = s.delivery
    return (
        s.phase is Pass.RECONCILE and s.node is not None and s.cutoff_us is not None and d is not None
        and s.run.node == s.node and d.claimed_at_us is not None and d.claimed_at_us < s.cutoff_us
    )


def _fenced_dead(s: Situation) -> bool:
    return s.fenced and s.probe is not None and s.probe.state is not None and s.probe.state not in _LIVE


def _held_here_before_cutoff(s: Situation) -> bool:
    d = s.delivery
    return (
        s.phase is Pass.RECONCILE and s.cutoff_us is not None and d is not None and d.created_at_us < s.cutoff_us
        and (s.run.admitted_node is None or s.run.admitted_node == s.node)
    )


def _probe_mismatch(s: Situation) -> bool:
    p, d = s.probe, s.delivery
    if p is None or d is None or p.state in (None, BrokerJobState.ABSENT):
        return False
    # 100 - priority is model.broker_priority's rule, inlined: that function refuses an
    # out-of-range priority by raising, and a guard must stay total over corrupt rows.
    return (p.queue is not None and p.queue != d.queue) or (
        p.wire_priority is not None and p.wire_priority != 100 - d.priority
    )


def _stale_active(s: Situation) -> bool:
    p = s.probe
    return (
        s.phase is Pass.RECONCILE and s.cutoff_us is not None and p is not None
        and p.state is BrokerJobState.ACTIVE and p.started_at_us is not None
        and p.started_at_us < s.cutoff_us - s.stale_after_us
    )


def _retry_left(s: Situation) -> bool:
    return s.run.hop_retries < s.run.max_hop_retries


def _timer_due(s: Situation) -> bool:
    return (s.run.status is RunStatus.AWAITING_TIMER and s.run.wake_at_us is not None and s.now_us is not None
            and s.now_us >= s.run.wake_at_us)


def _outcome_of_this_hop(s: Situation) -> bool:
    # Only an outcome the current hop recorded: an older hop's is no evidence for this one.
    return s.checkpoint_asked and s.outcome is not None and s.outcome[1] == s.run.enqueue_seq \
        and s.outcome[0] in (RunStatus.DONE, RunStatus.FAILED)


def _checkpoint_binds_latest(s: Situation) -> bool:
    # Only the exact pre-park window: the checkpoint names this Run's newest
    # non-cancelled owner (a consent, a delegated job, a service attempt or a receive).
    return (
        s.checkpoint_asked and s.checkpoint_owner is not None and s.latest_owner is not None
        and s.latest_owner[1] == s.checkpoint_owner and s.latest_owner[0] in WAIT_FOR_KIND
    )


GUARDS: dict[str, Callable[[Situation], bool]] = {
    "always": lambda s: True,
    "not_orphan": lambda s: not _orphan(s),
    "unfenced": lambda s: not s.fenced,
    "hop_still_live": lambda s: not _fenced_dead(s),
    "checkpoint_unasked": lambda s: not s.checkpoint_asked,
    "checkpoint_binds_latest": _checkpoint_binds_latest,
    "outcome_uncontained": lambda s: _outcome_of_this_hop(s) and not s.containment.proven and not s.contained,
    "outcome_open": lambda s: _outcome_of_this_hop(s) and not s.containment.proven,
    "outcome_recorded": _outcome_of_this_hop,
    "retry_left": _retry_left,
    # A retry carries the lost hop's delegated jobs into the hop that runs again (its
    # replay adopts each by its request); only its service attempts are stopped first.
    "retry_attempts_uncontained": lambda s: _retry_left(s) and s.containment.open_attempts != 0 and not s.contained,
    "retry_attempts_open": lambda s: _retry_left(s) and s.containment.open_attempts != 0,
    "uncontained": lambda s: not s.containment.proven and not s.contained,
    "containment_open": lambda s: not s.containment.proven,
    "held_here_before_cutoff": _held_here_before_cutoff,
    "queue_unknown": lambda s: not s.queue_known,
    "unprobed": lambda s: s.probe is None,
    "unprobeable": lambda s: s.probe is not None and s.probe.state is None,
    "probe_mismatch": _probe_mismatch,
    "absent_unpublished": lambda s: s.probe is not None and s.probe.state is BrokerJobState.ABSENT
    and s.delivery is not None and s.delivery.state is DeliveryState.PENDING,
    "absent": lambda s: s.probe is not None and s.probe.state is BrokerJobState.ABSENT,
    "broker_finished": lambda s: s.probe is not None and s.probe.state in _FINISHED,
    "active_without_start": lambda s: s.probe is not None and s.probe.state is BrokerJobState.ACTIVE
    and s.probe.started_at_us is None,
    "stale_unfenced": lambda s: _stale_active(s) and not s.fenced,
    "stale_fenced": lambda s: _stale_active(s) and s.fenced,
    "live_unpublished": lambda s: s.delivery is not None and s.delivery.state is DeliveryState.PENDING,
    # the Run machine's own resume guard: recovery resumes exactly what resume accepts
    "owner_resolved": lambda s: owner_resolves(s.run, s.owner),
    "service_unobserved": lambda s: s.run.status is RunStatus.AWAITING_SERVICE and not s.observed,
    # the Run machine's own timer guard, negated: a timer is due at its instant
    "timer_due": lambda s: _timer_due(s),
}


# --- the table ----------------------------------------------------------------------------

A, Rs, P, K = Action, Reason, Pass, Case
_BOTH = (P.RECONCILE, P.RELAY)


def _rules(*rules: tuple[Any, ...]) -> tuple[RecoveryRule, ...]:
    return tuple(RecoveryRule(*rule) for rule in rules)


_QUEUED_RULES = (
    ("queue_unknown", A.REPORT, Rs.QUEUE_UNKNOWN),
    ("unprobed", A.PROBE),
    ("unprobeable", A.REPORT, Rs.BROKER_UNPROBEABLE),
    ("probe_mismatch", A.REPORT, Rs.DELIVERY_MISMATCH),
    ("absent_unpublished", A.PUBLISH),
    ("absent", A.REPUBLISH),
    ("broker_finished", A.ROTATE),
    ("active_without_start", A.REPORT, Rs.START_TIME_UNKNOWN),
)

ROWS: tuple[tuple[Case, tuple[Pass, ...], tuple[RecoveryRule, ...]], ...] = (
    # One block per spec table of specs/recovery.md, in its order: (case, passes, rules).
    (K.DELIVERY_MISSING, _BOTH, _rules(("always", A.REPORT, Rs.DELIVERY_MISSING))),
    (K.DELIVERY_INVALID, _BOTH, _rules(("always", A.REPORT, Rs.DELIVERY_STATE_INVALID))),
    (K.DELIVERY_MISMATCH, _BOTH, _rules(("always", A.REPORT, Rs.DELIVERY_MISMATCH))),
    (K.TERMINAL, (P.RECONCILE,), _rules(("always", A.CLEANUP))),
    (K.TERMINAL, (P.RELAY,), _rules(("always", A.LEAVE))),
    (K.CANCELLING, (P.RECONCILE,), _rules(
        ("unfenced", A.FENCE),
        ("hop_still_live", A.REPORT, Rs.CONTAINMENT_UNPROVEN),
        ("uncontained", A.CONTAIN),
        ("containment_open", A.REPORT, Rs.CONTAINMENT_UNPROVEN),
        ("always", A.FINISH_CANCEL),
    )),
    (K.CANCELLING, (P.RELAY,), _rules(("always", A.LEAVE))),
    (K.HOP, (P.RECONCILE,), _rules(
        ("not_orphan", A.LEAVE),
        ("unfenced", A.FENCE),
        ("hop_still_live", A.REPORT, Rs.ORPHAN_UNFENCED),
        ("checkpoint_unasked", A.ASK_CHECKPOINT),
        ("outcome_uncontained", A.CONTAIN),
        ("outcome_open", A.REPORT, Rs.CONTAINMENT_UNPROVEN),
        ("outcome_recorded", A.SETTLE_RECORDED),
        ("checkpoint_binds_latest", A.REPARK),
        ("retry_attempts_uncontained", A.CONTAIN_ATTEMPTS),
        ("retry_attempts_open", A.REPORT, Rs.CONTAINMENT_UNPROVEN),
        ("retry_left", A.RETRY_LOST),
        ("uncontained", A.CONTAIN),
        ("containment_open", A.REPORT, Rs.CONTAINMENT_UNPROVEN),
        ("always", A.FAIL_LOST),
    )),
    (K.HOP, (P.RELAY,), _rules(("always", A.LEAVE))),
    (K.HELD, (P.RECONCILE,), _rules(("held_here_before_cutoff", A.FAIL_HELD), ("always", A.KEEP))),
    (K.HELD, (P.RELAY,), _rules(("always", A.KEEP))),
    (K.QUEUED, (P.RECONCILE,), _rules(
        *_QUEUED_RULES,
        ("stale_unfenced", A.FENCE),
        ("stale_fenced", A.REPORT, Rs.ORPHAN_UNFENCED),
        ("live_unpublished", A.MARK_PUBLISHED),
        ("always", A.KEEP),
    )),
    (K.QUEUED, (P.RELAY,), _rules(
        *_QUEUED_RULES,
        ("live_unpublished", A.MARK_PUBLISHED),
        ("always", A.KEEP),
    )),
    (K.WAITING, _BOTH, _rules(
        ("owner_resolved", A.RESUME),
        ("timer_due", A.RESUME),
        ("service_unobserved", A.OBSERVE),
        ("always", A.KEEP),
    )),
)

TABLE: dict[tuple[Case, Pass], tuple[RecoveryRule, ...]] = {
    (case, phase): rules for case, phases, rules in ROWS for phase in phases
}

def decide(situation: Situation) -> Verdict:
    """The next step for one Run: the first rule of its (case, pass) whose guard holds."""
    case = case_of(situation)
    for rule in TABLE[(case, situation.phase)]:
        if GUARDS[rule.guard](situation):
            return _verdict(situation, rule)
    raise AssertionError("unreachable: every rule list ends in always")  # pragma: no cover


def _verdict(situation: Situation, rule: RecoveryRule) -> Verdict:
    run = situation.run
    if rule.action is Action.REPORT:
        return Verdict(Action.REPORT, reason=rule.reason)
    if rule.action is Action.REPARK:
        return Verdict(Action.REPARK, owner=situation.latest_owner)
    if rule.action is Action.FENCE:
        # This node's hop claimed before its boot, or a broker job that started long
        # before it, belongs to a dead process: nobody is left to acknowledge an abort.
        return Verdict(Action.FENCE, key=key_of(run.run_id, run.enqueue_seq),
                       terminal=_orphan(situation) or _stale_active(situation))
    if rule.action in (Action.PROBE, Action.PUBLISH, Action.REPUBLISH):
        # Every broker call names the stored hop's own key: a republication reuses it.
        return Verdict(rule.action, key=key_of(run.run_id, run.enqueue_seq))
    return Verdict(rule.action)


# --- the rules every verdict keeps (REC-1 ... REC-13 in specs/recovery.md) -----------------


def verdict_violations(situation: Situation, verdict: Verdict) -> list[str]:
    """The recovery rules a verdict breaks, written independently of the guards."""
    s, v = situation, verdict
    run, d, p = s.run, s.delivery, s.probe
    broken: list[str] = []
    reconcile = s.phase is Pass.RECONCILE
    intact = (d is not None and d.run_id == run.run_id and d.enqueue_seq == run.enqueue_seq
              and d.queue == run.queue and d.priority == run.priority)
    if v.action is not Action.REPORT and v.action is not Action.LEAVE and not intact:
        broken.append("REC-1")  # a Run with missing or mismatched delivery truth is only reported
    this_nodes_old_hop = (
        reconcile and d is not None and s.node is not None and s.cutoff_us is not None
        and run.node == s.node and d.claimed_at_us is not None and d.claimed_at_us < s.cutoff_us
    )
    if run.status in _HOPS and v.action is not Action.LEAVE and v.action is not Action.REPORT \
            and not this_nodes_old_hop:
        broken.append("REC-2")  # another node's hop, or one of this boot, is never touched
    if v.action in (Action.FAIL_HELD, Action.FAIL_LOST, Action.REPARK, Action.FINISH_CANCEL, Action.CLEANUP,
                    Action.SETTLE_RECORDED, Action.RETRY_LOST) and not reconcile:
        broken.append("REC-3")  # a relay has no boot boundary: it never fails, re-parks or finishes
    dead_after_fence = s.fenced and p is not None and p.state in _FINISHED | {BrokerJobState.ABSENT}
    if v.action in (Action.FAIL_LOST, Action.REPARK, Action.FINISH_CANCEL, Action.SETTLE_RECORDED,
                    Action.RETRY_LOST) and not dead_after_fence:
        broken.append("REC-4")  # nothing is decided over a hop that may still be live
    if v.action is Action.REPARK and not (
        s.checkpoint_owner is not None and v.owner is not None and v.owner == s.latest_owner
        and v.owner[1] == s.checkpoint_owner
    ):
        broken.append("REC-5")  # a re-park needs the checkpoint to bind the exact latest owner
    if v.action in (Action.FAIL_LOST, Action.FINISH_CANCEL, Action.SETTLE_RECORDED) and not (
        s.containment.open_jobs == 0 and s.containment.open_attempts == 0
    ):
        broken.append("REC-6")  # terminal truth only with every correlated effect contained
    if v.action is Action.RETRY_LOST and s.containment.open_attempts != 0:
        broken.append("REC-6")  # a hop runs again only with the lost hop's service attempts ended
    if v.action is Action.FAIL_HELD and not (
        reconcile and d is not None and d.state is DeliveryState.HELD and s.cutoff_us is not None
        and d.created_at_us < s.cutoff_us and run.admitted_node in (None, s.node)
    ):
        broken.append("REC-7")  # only this node's HELD admission of an earlier boot fails
    hop = key_of(run.run_id, run.enqueue_seq)
    if v.action in (Action.PROBE, Action.FENCE, Action.PUBLISH, Action.REPUBLISH) and v.key != hop:
        broken.append("REC-8")  # the broker is only ever asked about the stored hop's key
    if v.action in (Action.PUBLISH, Action.REPUBLISH) and not (p is not None and p.state is BrokerJobState.ABSENT):
        broken.append("REC-8")  # republication only where the broker holds nothing
    if v.action is Action.ROTATE and not (p is not None and p.state in _FINISHED):
        broken.append("REC-8")  # rotation only after the broker finished the hop
    if v.action is Action.MARK_PUBLISHED and not (p is not None and p.state in _LIVE):
        broken.append("REC-8")
    stale_active = (
        reconcile and p is not None and p.state is BrokerJobState.ACTIVE and p.started_at_us is not None
        and s.cutoff_us is not None and p.started_at_us < s.cutoff_us - s.stale_after_us
    )
    if v.terminal and not (v.action is Action.FENCE and (this_nodes_old_hop or stale_active)):
        broken.append("REC-9")  # a terminal fence only for a hop proven to belong to a dead process
    recorded_here = (s.checkpoint_asked and s.outcome is not None and s.outcome[1] == run.enqueue_seq
                     and s.outcome[0] in (RunStatus.DONE, RunStatus.FAILED))
    if v.action is Action.SETTLE_RECORDED and not recorded_here:
        broken.append("REC-10")  # a Run is settled from an outcome only its current hop recorded
    if v.action in (Action.FAIL_LOST, Action.REPARK, Action.RETRY_LOST) and recorded_here:
        broken.append("REC-10")  # a hop that recorded its outcome finished: it is settled with it
    retried = run.status in _HOPS and run.hop_retries < run.max_hop_retries and not recorded_here
    if v.action is Action.CONTAIN and retried:
        broken.append("REC-13")  # a hop that will run again keeps its delegated jobs: they are not cancelled
    if v.action is Action.CONTAIN_ATTEMPTS and not retried:
        broken.append("REC-13")  # only a retry carries the delegated jobs; everything else stops them
    if v.action is Action.RETRY_LOST and not run.hop_retries < run.max_hop_retries:
        broken.append("REC-11")  # a lost hop runs again only if its workflow allows one more retry
    if v.action is Action.FAIL_LOST and run.hop_retries < run.max_hop_retries:
        broken.append("REC-11")  # a workflow that allows a retry is not failed lost
    timer_due = (run.status is RunStatus.AWAITING_TIMER and run.wake_at_us is not None and s.now_us is not None
                 and s.now_us >= run.wake_at_us)
    if v.action is Action.RESUME and not (owner_resolves(run, s.owner) or timer_due):
        broken.append("REC-12")  # a wait resumes only once its owner decided (a timer: once due)
    if v.action is Action.FENCE and run.status is RunStatus.QUEUED and not (
        reconcile and p is not None and p.state is BrokerJobState.ACTIVE and p.started_at_us is not None
        and s.cutoff_us is not None and p.started_at_us < s.cutoff_us - s.stale_after_us
    ):
        broken.append("REC-2")  # a queued hop is fenced only when proven pre-boot and stale
    return broken
