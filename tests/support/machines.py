"""The machines under test: what the shared table, oracle, property and mutant tests need
of each registered machine. A new machine adds one entry here (and its spec file, its
strategies and its oracle guards); the shared tests then run for it unchanged."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import strategies as st

from tenure.conformance.strategies.agent_jobs import job_situations
from tenure.conformance.strategies.attempts import attempt_situations
from tenure.conformance.strategies.consents import consent_situations
from tenure.conformance.strategies.nodes import node_situations
from tenure.conformance.strategies.queues import situations as queue_situations
from tenure.conformance.strategies.runs import run_situations
from tenure.kernel.agent_jobs.commands import AgentJobCommandType
from tenure.kernel.agent_jobs.machine import AGENT_JOBS
from tenure.kernel.agent_jobs.record import AgentJobStep
from tenure.kernel.attempts.machine import ATTEMPTS
from tenure.kernel.attempts.record import AttemptStep
from tenure.kernel.consents.machine import CONSENTS
from tenure.kernel.consents.record import ConsentStep
from tenure.kernel.core import Machine, Rule
from tenure.kernel.nodes.commands import NodeCommandType
from tenure.kernel.nodes.machine import NODES
from tenure.kernel.nodes.record import NodeStep
from tenure.kernel.queue.commands import QueueCommandType
from tenure.kernel.queue.machine import QUEUE
from tenure.kernel.queue.record import QueueStep
from tenure.kernel.runs.machine import RUNS
from tenure.kernel.runs.record import RunStep
from tenure.model import JobStatus, QueueKind

INT64_MAX = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class MachineUnderTest:
    name: str
    """The machine's name and spec file (``specs/<name>.md``)."""
    machine: Machine
    situations: Callable[..., st.SearchStrategy[tuple[Any, Any, int]]]
    """``situations(state=None, kind=None)``: (record, command, now) triples."""
    terminal: frozenset[enum.Enum]
    live: frozenset[enum.Enum]
    """States from which a terminal state must stay reachable (no traps)."""
    terminal_exit_allowed: Callable[[enum.Enum, enum.Enum, Rule], bool]
    """Which state-changing rules may leave a terminal state."""
    state_of_record: Callable[[Any], enum.Enum]
    oracle_guards: Mapping[str, Callable[[Any, Any, int], bool]]
    """The spec's guard glossary written again, independently of the kernel."""
    decides_every_change_ahead: bool = True
    """Whether :func:`tenure.kernel.ahead.decide_ahead` can make every decision ahead.
    A machine whose record nests rows (the Run pair), or whose replies carry the decision
    time (node leases: a boot and a takeover answer with their instant, which a window
    cannot move), makes only the decisions that leave the record unchanged ahead; the
    others are made the ordinary way (node leases are written once per relay interval,
    never on a hot path)."""


# --- the queue's guards, from specs/queue.md's glossary --------------------------------------


def _lease_live(record: Any, now: int) -> bool:
    return record.lease_expires_at_us is not None and now < record.lease_expires_at_us


def _fence_mismatch(record: Any, fence: Any, now: int) -> bool:
    same_strings = all(
        isinstance(mine, str) and mine == theirs
        for mine, theirs in (
            (fence.job_id, record.job_id),
            (fence.owner_id, record.owner_id),
            (fence.claim_token, record.claim_token),
        )
    )
    same_generation = type(fence.generation) is int and fence.generation == record.generation
    return not (same_strings and same_generation and fence.queue == record.queue)


def _dedupe_key(record: Any) -> Any:
    return record.active_key if record.queue == QueueKind.STREAMING else record.idempotency_key


def _requested_key(record: Any, command: Any) -> Any:
    return command.active_key if record.queue == QueueKind.STREAMING else command.idempotency_key


QUEUE_ORACLE_GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda r, c, n: True,
    "protection_inconsistent": lambda r, c, n: not (
        (r.submission_id is None) == (r.fingerprint is None) == (not r.fence_required)
    ),
    "legacy_row": lambda r, c, n: r.fence_required is False,
    "other_submission": lambda r, c, n: r.submission_id != c.submission_id,
    "fingerprint_differs": lambda r, c, n: r.fingerprint != c.fingerprint,
    "protected": lambda r, c, n: r.fence_required is True,
    "protected_or_owned": lambda r, c, n: r.fence_required is True
    or (r.status == JobStatus.CLAIMED and r.claim_token is not None),
    "key_differs": lambda r, c, n: _requested_key(r, c) is None or _dedupe_key(r) != _requested_key(r, c),
    "not_forced": lambda r, c, n: c.force is False,
    "nonce_stored": lambda r, c, n: c.nonce_already_stored is True,
    "other_queue": lambda r, c, n: not (c.queue_names is None or any(r.queue_name == q for q in c.queue_names)),
    "not_due": lambda r, c, n: n < r.fires_at_us,
    "attempts_exhausted": lambda r, c, n: not r.attempts < r.max_attempts,
    "generation_exhausted": lambda r, c, n: r.generation == INT64_MAX or r.generation > INT64_MAX,
    "owner_differs": lambda r, c, n: not (r.owner_id is not None and r.owner_id == c.owner_id),
    "token_differs": lambda r, c, n: not (r.claim_token is not None and r.claim_token == c.claim_token),
    "lease_live": lambda r, c, n: _lease_live(r, n),
    "lease_not_live": lambda r, c, n: not _lease_live(r, n),
    "fence_mismatch": lambda r, c, n: _fence_mismatch(r, c.fence, n),
    "cancel_requested": lambda r, c, n: r.cancel_requested is True,
    "no_cancel_request": lambda r, c, n: r.cancel_requested is False,
    "pid_recorded": lambda r, c, n: not (r.pid is None),
    "retry_allowed": lambda r, c, n: c.retry is True and r.attempts < r.max_attempts,
    "streaming": lambda r, c, n: r.queue == QueueKind.STREAMING,
    "not_streaming": lambda r, c, n: r.queue != QueueKind.STREAMING,
    "not_task": lambda r, c, n: r.queue != QueueKind.TASK,
    "finished_after_cutoff": lambda r, c, n: r.completed_at_us is None or not r.completed_at_us < c.older_than_us,
}


# --- the attempts' guards, from specs/attempts.md's glossary ----------------------------------

_ORDER = {"submitting": 1, "indeterminate": 1, "accepted": 2, "running": 3,
          "succeeded": 4, "failed": 4, "cancelled": 4, "prepared": 0}


def _lease_on(record: Any, now: int) -> bool:
    return record.submit_lease_expires_at_us is not None and now < record.submit_lease_expires_at_us


def _is(value: Any, name: str) -> bool:
    return getattr(value, "value", None) == name


def _found(name: str) -> Callable[[Any, Any, int], bool]:
    return lambda r, c, n: _is(c.lookup, "found") and _is(c.found_state, name)


ATTEMPT_ORACLE_GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda r, c, n: True,
    "run_closed": lambda r, c, n: c.run_closed is True,
    "spec_differs": lambda r, c, n: r.spec_digest != c.row.spec_digest,
    "key_held_elsewhere": lambda r, c, n: c.key_held_elsewhere is True,
    "generation_gap": lambda r, c, n: c.row.generation - c.predecessor_generation != 1,
    "predecessor_succeeded": lambda r, c, n: _is(c.predecessor_state, "succeeded"),
    "predecessor_unresolved": lambda r, c, n: c.predecessor_state is not None
    and not (_is(c.predecessor_state, "failed") or _is(c.predecessor_state, "cancelled")),
    "egress_reused": lambda r, c, n: c.egress_decision_id in (*r.transmission_egress, *r.denied_egress),
    "egress_denied": lambda r, c, n: c.egress_allowed is False,
    "cancel_requested": lambda r, c, n: r.cancel_requested is True,
    "resubmit_unproven": lambda r, c, n: not (
        r.same_key_replay is True
        or (r.no_effect_proof_for is not None and r.no_effect_proof_for == r.transmissions)
        or (c.proof_looked_up_at_us is not None and not _lease_on(r, min(c.proof_looked_up_at_us, n)))
    ),
    "identity_differs": lambda r, c, n: None not in (r.provider_job_id, c.provider_job_id)
    and r.provider_job_id != c.provider_job_id,
    "identity_unknown": lambda r, c, n: r.provider_job_id is None,
    "rejection_not_of_the_latest": lambda r, c, n: _is(c.evidence, "rejected_before_effect")
    and (c.transmission is None or c.transmission < r.transmissions or c.transmission > r.transmissions),
    "rejection_beside_an_earlier_transmission": lambda r, c, n: _is(c.evidence, "rejected_before_effect")
    and r.granted_during_earlier_lease is True,
    "rejected_before_effect": lambda r, c, n: _is(c.evidence, "rejected_before_effect"),
    "provider_failed": lambda r, c, n: _is(c.evidence, "provider_failed"),
    "lookup_failed": lambda r, c, n: _is(c.lookup, "lookup_failed"),
    "not_found": lambda r, c, n: _is(c.lookup, "not_found"),
    "not_found_during_submit_lease": lambda r, c, n: _is(c.lookup, "not_found")
    and _lease_on(r, n if c.looked_up_at_us is None else min(c.looked_up_at_us, n)),
    "not_found_unproven": lambda r, c, n: _is(c.lookup, "not_found")
    and (c.proves_no_effect is not True or c.looked_up_at_us is None),
    "proof_recorded": lambda r, c, n: _is(c.lookup, "not_found") and r.no_effect_proof_for == r.transmissions,
    "found_not_ahead": lambda r, c, n: _is(c.lookup, "found") and c.found_state is not None
    and _ORDER[c.found_state.value] <= _ORDER[r.state.value],
    "found_accepted": _found("accepted"),
    "found_running": _found("running"),
    "found_succeeded": _found("succeeded"),
    "found_failed": _found("failed"),
    "found_cancelled": _found("cancelled"),
    "submit_lease_live": lambda r, c, n: _lease_on(r, n),
    "no_reservation": lambda r, c, n: r.reservation is None,
    "already_released": lambda r, c, n: r.reservation_released is True,
}


# --- the Run machine's guards, from specs/runs.md's glossary ---------------------------------

_RESOLVING_OWNER_STATUSES = {
    "consent": {"granted", "denied", "expired"},
    "delegate": {"succeeded", "failed", "cancelled", "timed_out", "lost"},
    "service": {"succeeded", "failed", "cancelled"},
}


def _current(record: Any) -> Any:
    return record.deliveries[len(record.deliveries) - 1]


def _the_runs_owner(record: Any, owner: Any) -> bool:
    run = record.run
    return (
        owner is not None and run.owner_kind is not None and owner.kind == run.owner_kind
        and owner.owner_id == run.owner_id and owner.run_id == run.run_id
    )


RUN_ORACLE_GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda r, c, n: True,
    "other_key": lambda r, c, n: r.run.idempotency_key != c.run.idempotency_key,
    "intent_differs": lambda r, c, n: r.run.intent_digest != c.run.intent_digest,
    "held_without_hold": lambda r, c, n: _current(r).state.value == "held" and c.hold is False,
    "session_busy": lambda r, c, n: c.session_busy is True,
    "seq_differs": lambda r, c, n: c.enqueue_seq != r.run.enqueue_seq,
    "not_held": lambda r, c, n: _current(r).state.value != "held",
    "unpublishable": lambda r, c, n: _current(r).state.value not in ("pending", "published"),
    "owner_foreign": lambda r, c, n: (c.owner is not None) if c.wait.value == "timer" else (
        c.wait.value != "hardware" and not (
            c.owner is not None and c.owner.kind == c.wait and c.owner.owner_id == c.owner_id
            and c.owner.run_id == r.run.run_id)
    ),
    "waits_for_consent": lambda r, c, n: c.wait.value == "consent",
    "waits_for_delegate": lambda r, c, n: c.wait.value == "delegate",
    "waits_for_service": lambda r, c, n: c.wait.value == "service",
    "waits_for_timer": lambda r, c, n: c.wait.value == "timer",
    "wake_invalid": lambda r, c, n: (c.wake_at_us is not None) if c.wait.value != "timer" else not (
        type(c.wake_at_us) is int and -62_135_596_800_000_000 <= c.wake_at_us <= 253_402_300_799_999_999),
    "timer_not_due": lambda r, c, n: not n >= r.run.wake_at_us,
    "not_current_owner": lambda r, c, n: c.owner_id != r.run.owner_id,
    "owner_unresolved": lambda r, c, n: not (
        _the_runs_owner(r, c.owner) and c.owner.complete is True
        and c.owner.status in _RESOLVING_OWNER_STATUSES.get(r.run.owner_kind.value, set())
    ),
    "containment_unproven": lambda r, c, n: c.containment.open_jobs > 0 or c.containment.open_attempts > 0,
    "settles_done": lambda r, c, n: c.status.value == "done",
    "hop_live": lambda r, c, n: c.hop is None or c.hop.value in ("queued", "active"),
    "hop_unfinished": lambda r, c, n: c.hop is None or c.hop.value not in ("complete", "failed", "aborted"),
    "no_retries_left": lambda r, c, n: not r.run.hop_retries < r.run.max_hop_retries,
    "claimed_by_claimant": lambda r, c, n: c.claimant is not None and c.enqueue_seq == r.run.enqueue_seq
    and _current(r).state.value == "claimed" and _current(r).claimed_by == c.claimant,
}


# --- the node lease machine's guards, from specs/nodes.md's glossary ------------------------

NODE_ORACLE_GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda r, c, n: True,
    "lease_out_of_range": lambda r, c, n: type(c.lease_us) is not int or c.lease_us < 1
    or c.lease_us > 3_600_000_000 or n + c.lease_us > 253402300799999999,
    "epoch_exhausted": lambda r, c, n: r.epoch == INT64_MAX,
    "epoch_differs": lambda r, c, n: c.epoch != r.epoch,
    "lease_expired": lambda r, c, n: not n < r.lease_expires_at_us,
    "lease_live": lambda r, c, n: r.lease_expires_at_us > n,
    "own_node": lambda r, c, n: c.taker == r.node,
    "claim_live": lambda r, c, n: r.takeover_until_us is not None and r.takeover_until_us > n,
    "other_taker": lambda r, c, n: c.taker != r.taker,
}


# --- the consent machine's guards, from specs/consent.md's glossary --------------------------

CONSENT_ORACLE_GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda r, c, n: True,
    "run_not_running": lambda r, c, n: c.run_running is False,
    "preauthorized": lambda r, c, n: c.row.preauthorized_by is not None,
    "verdict_granted": lambda r, c, n: c.verdict.value == "granted",
    "verdict_denied": lambda r, c, n: c.verdict.value == "denied",
    "verdict_expired": lambda r, c, n: c.verdict.value == "expired",
    "deadline_not_due": lambda r, c, n: c.decided_by == "tenure:deadline" and not (
        c.verdict.value == "expired" and r.expires_at_us is not None and r.expires_at_us <= n),
}


# --- the delegated-job machine's guards, from specs/agent_jobs.md's glossary ----------------

_JOB_STEPS = ["queued", "admitted", "preparing", "running"]


def _next_job_step(status: str) -> str | None:
    position = _JOB_STEPS.index(status) if status in _JOB_STEPS else len(_JOB_STEPS)
    return _JOB_STEPS[position + 1] if position + 1 < len(_JOB_STEPS) else None


def _result(name: str) -> Callable[[Any, Any, int], bool]:
    return lambda r, c, n: c.status.value == name


AGENT_JOB_ORACLE_GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda r, c, n: True,
    "run_not_running": lambda r, c, n: c.run_running is False,
    "request_differs": lambda r, c, n: any(
        getattr(r, field) != getattr(c.row, field) for field in ("run_id", "runtime", "profile", "request_json")
    ),
    "identity_differs": lambda r, c, n: r.runtime_job_id is not None and c.runtime_job_id is not None
    and r.runtime_job_id != c.runtime_job_id,
    "same_status": lambda r, c, n: c.status == r.status,
    "next_status": lambda r, c, n: _next_job_step(r.status.value) == c.status.value,
    "result_succeeded": _result("succeeded"),
    "result_failed": _result("failed"),
    "result_cancelled": _result("cancelled"),
    "result_timed_out": _result("timed_out"),
    "result_lost": _result("lost"),
}


def _queue_state(record: Any) -> enum.Enum:
    return QueueStep.ABSENT if record is None else QueueStep(record.status.value)


def _attempt_state(record: Any) -> enum.Enum:
    return AttemptStep.ABSENT if record is None else AttemptStep(record.state.value)


def _run_state(record: Any) -> enum.Enum:
    return RunStep.ABSENT if record is None else RunStep(record.run.status.value)


def _node_state(record: Any) -> enum.Enum:
    return NodeStep.ABSENT if record is None else NodeStep(record.status.value)


def _consent_state(record: Any) -> enum.Enum:
    return ConsentStep.ABSENT if record is None else ConsentStep(record.status.value)


def _job_state(record: Any) -> enum.Enum:
    return AgentJobStep.ABSENT if record is None else AgentJobStep(record.status.value)


MACHINES: dict[str, MachineUnderTest] = {
    "queue": MachineUnderTest(
        name="queue",
        machine=QUEUE,
        situations=lambda state=None, kind=None: queue_situations(state, kind),
        terminal=frozenset({QueueStep.COMPLETED, QueueStep.FAILED, QueueStep.CANCELLED}),
        live=frozenset({QueueStep.PENDING, QueueStep.CLAIMED}),
        terminal_exit_allowed=lambda state, command, rule: (
            rule.target is QueueStep.ABSENT
            and command in (QueueCommandType.DELETE_LEGACY, QueueCommandType.PURGE_FINISHED)
        ) or (  # TR-Q4's one exception: an operator's retry of a failed job
            state is QueueStep.FAILED and command is QueueCommandType.RETRY_FAILED and rule.target is QueueStep.PENDING
        ),
        state_of_record=_queue_state,
        oracle_guards=QUEUE_ORACLE_GUARDS,
    ),
    "attempts": MachineUnderTest(
        name="attempts",
        machine=ATTEMPTS,
        situations=lambda state=None, kind=None: attempt_situations(state, kind),
        terminal=frozenset({AttemptStep.SUCCEEDED, AttemptStep.FAILED, AttemptStep.CANCELLED}),
        live=frozenset({AttemptStep.PREPARED, AttemptStep.SUBMITTING, AttemptStep.ACCEPTED, AttemptStep.RUNNING,
                        AttemptStep.INDETERMINATE}),
        terminal_exit_allowed=lambda state, command, rule: False,
        state_of_record=_attempt_state,
        oracle_guards=ATTEMPT_ORACLE_GUARDS,
    ),
    "runs": MachineUnderTest(
        name="runs",
        machine=RUNS,
        situations=lambda state=None, kind=None: run_situations(state, kind),
        terminal=frozenset({RunStep.DONE, RunStep.FAILED, RunStep.CANCELLED}),
        live=frozenset({RunStep.QUEUED, RunStep.RUNNING, RunStep.AWAITING_HARDWARE, RunStep.AWAITING_CONSENT,
                        RunStep.AWAITING_DELEGATE, RunStep.AWAITING_SERVICE, RunStep.AWAITING_TIMER,
                        RunStep.CANCELLING}),
        terminal_exit_allowed=lambda state, command, rule: False,
        state_of_record=_run_state,
        oracle_guards=RUN_ORACLE_GUARDS,
        decides_every_change_ahead=False,
    ),
    "consent": MachineUnderTest(
        name="consent",
        machine=CONSENTS,
        situations=lambda state=None, kind=None: consent_situations(state, kind),
        terminal=frozenset({ConsentStep.GRANTED, ConsentStep.DENIED, ConsentStep.EXPIRED, ConsentStep.CANCELLED}),
        live=frozenset({ConsentStep.PENDING}),
        terminal_exit_allowed=lambda state, command, rule: False,
        state_of_record=_consent_state,
        oracle_guards=CONSENT_ORACLE_GUARDS,
    ),
    "agent_jobs": MachineUnderTest(
        name="agent_jobs",
        machine=AGENT_JOBS,
        situations=lambda state=None, kind=None: job_situations(state, kind),
        terminal=frozenset({AgentJobStep.SUCCEEDED, AgentJobStep.FAILED, AgentJobStep.CANCELLED,
                            AgentJobStep.TIMED_OUT, AgentJobStep.LOST}),
        live=frozenset({AgentJobStep.QUEUED, AgentJobStep.ADMITTED, AgentJobStep.PREPARING, AgentJobStep.RUNNING}),
        # LOST is terminal for adoption, not proof that anything stopped: only the
        # runtime's containment returning records LOST -> CANCELLED.
        terminal_exit_allowed=lambda state, command, rule: state is AgentJobStep.LOST
        and command is AgentJobCommandType.RECORD_CANCELLED and rule.target is AgentJobStep.CANCELLED,
        state_of_record=_job_state,
        oracle_guards=AGENT_JOB_ORACLE_GUARDS,
    ),
    "nodes": MachineUnderTest(
        name="nodes",
        machine=NODES,
        situations=lambda state=None, kind=None: node_situations(state, kind),
        # A taken-over incarnation is finished; only a new boot under the name leaves it.
        terminal=frozenset({NodeStep.TAKEN_OVER}),
        live=frozenset({NodeStep.LIVE, NodeStep.TAKING_OVER}),
        terminal_exit_allowed=lambda state, command, rule: command is NodeCommandType.BOOT
        and rule.target is NodeStep.LIVE,
        state_of_record=_node_state,
        oracle_guards=NODE_ORACLE_GUARDS,
        decides_every_change_ahead=False,
    ),
}
