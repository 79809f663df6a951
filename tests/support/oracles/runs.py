"""The machine under test for the workflow Run (``specs/runs.md``): its guard glossary written
again, independently of the kernel, and what the shared table, oracle, property and
mutant tests need of it (``tests/support/machines.py`` reads ``UNDER_TEST``)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from machines import MachineUnderTest
from tenure.conformance.strategies.runs import run_situations
from tenure.kernel import RUNS
from tenure.kernel.runs.record import RunStep

# --- the Run machine's guards, from specs/runs.md's glossary ---------------------------------

_RESOLVING_OWNER_STATUSES = {
    "consent": {"granted", "denied", "expired"},
    "delegate": {"succeeded", "failed", "cancelled", "timed_out", "lost"},
    "service": {"succeeded", "failed", "cancelled"},
    "message": {"received", "timed_out"},
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
    "not_served": lambda r, c, n: c.serves is not None and not any(
        name == r.run.workflow_name and version == r.run.workflow_revision for name, version in c.serves),
    "owner_foreign": lambda r, c, n: (c.owner is not None) if c.wait.value == "timer" else (
        c.wait.value != "hardware" and not (
            c.owner is not None and c.owner.kind == c.wait and c.owner.owner_id == c.owner_id
            and c.owner.run_id == r.run.run_id)
    ),
    "waits_for_consent": lambda r, c, n: c.wait.value == "consent",
    "waits_for_delegate": lambda r, c, n: c.wait.value == "delegate",
    "waits_for_service": lambda r, c, n: c.wait.value == "service",
    "waits_for_timer": lambda r, c, n: c.wait.value == "timer",
    "waits_for_message": lambda r, c, n: c.wait.value == "message",
    "wake_invalid": lambda r, c, n: (c.wake_at_us is not None) if c.wait.value != "timer" else not (
        type(c.wake_at_us) is int and -62_135_596_800_000_000 <= c.wake_at_us <= 253_402_300_799_999_999),
    "timer_not_due": lambda r, c, n: not n >= r.run.wake_at_us,
    "not_current_owner": lambda r, c, n: c.owner_id != r.run.owner_id,
    "owner_unresolved": lambda r, c, n: not (
        _the_runs_owner(r, c.owner) and c.owner.complete is True
        and c.owner.status in _RESOLVING_OWNER_STATUSES.get(r.run.owner_kind.value, set())
    ),
    "containment_unproven": lambda r, c, n: c.containment.open_jobs > 0 or c.containment.open_attempts > 0,
    "attempts_open": lambda r, c, n: c.containment.open_attempts > 0,
    "settles_done": lambda r, c, n: c.status.value == "done",
    "hop_live": lambda r, c, n: c.hop is None or c.hop.value in ("queued", "active"),
    "hop_unfinished": lambda r, c, n: c.hop is None or c.hop.value not in ("complete", "failed", "aborted"),
    "no_retries_left": lambda r, c, n: not r.run.hop_retries < r.run.max_hop_retries,
    "claimed_by_claimant": lambda r, c, n: c.claimant is not None and c.enqueue_seq == r.run.enqueue_seq
    and _current(r).state.value == "claimed" and _current(r).claimed_by == c.claimant,
    "timeout_invalid": lambda r, c, n: c.timeout_us is not None and not (
        type(c.timeout_us) is int and 1 <= c.timeout_us <= 366 * 24 * 3600 * 1_000_000),
    "timed": lambda r, c, n: c.timeout_us is not None,
    "timeout_differs": lambda r, c, n: (
        None if r.run.deadline_us is None else r.run.deadline_us - r.run.created_at_us) != c.timeout_us,
    "no_deadline": lambda r, c, n: r.run.deadline_us is None,
    "deadline_not_due": lambda r, c, n: r.run.deadline_us is not None and not n >= r.run.deadline_us,
}


def _run_state(record: Any) -> enum.Enum:
    return RunStep.ABSENT if record is None else RunStep(record.run.status.value)


UNDER_TEST = MachineUnderTest(
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
    decides_every_change_ahead=True,  # nested times move by their paths (tenure.kernel.ahead._plain)
)
