"""Which stored rows the Run ledger's commands meet, as data (see :mod:`tenure.kernel.core`).

Every Run command locks the Run row first (``runs_by_keys``), then its current delivery
(``deliveries_by_keys``), then, where the command needs them, the Run's pending consents
and its waiting receives;
owner rows and containment counts are read after the Run's lock, which every writer of
a Run's owners also takes, so a count cannot miss an owner created concurrently. One
lock order (Run, delivery, consents, receives) for every operation means no two
transactions of the ledger wait for each other in a cycle.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable

from tenure.model import (
    TERMINAL_AGENT_JOB_STATUSES,
    TERMINAL_ATTEMPT_STATES,
    TERMINAL_RUN_STATUSES,
    AgentJobStatus,
    AttemptState,
    ConsentStatus,
    MessageStatus,
    RunStatus,
)

from ..core import Condition, Finder, Param

__all__ = [
    "runs_by_keys",
    "runs_opening_owners",
    "deliveries_by_keys",
    "attempts_by_keys",
    "session_open",
    "runs_by_admission_key",
    "pending_consents_of_run",
    "pending_receives_of_run",
    "open_jobs_of_run",
    "open_attempts_of_run",
    "runs_page",
    "runs_by_status",
    "runs_past_deadline",
    "runs_listing",
    "consents_of_run",
    "jobs_of_run",
    "attempts_of_run",
    "receives_of_run",
    "consents_of_runs",
    "jobs_of_runs",
    "attempts_of_runs",
    "receives_of_runs",
    "open_jobs_of_runs",
    "open_attempts_of_runs",
    "OPEN_JOB_STATUSES",
    "OPEN_ATTEMPT_STATES",
]


def _sorted(members: Iterable[enum.Enum]) -> tuple[enum.Enum, ...]:
    return tuple(sorted(members, key=lambda member: str(member.value)))


def _by_keys(name: str, field: str) -> Finder:
    return Finder(name, ((Condition(field, "in", Param("keys")),),), order=(field,), lock="wait")


runs_by_keys = _by_keys("runs_by_keys", "run_id")
deliveries_by_keys = _by_keys("deliveries_by_keys", "delivery_id")
runs_opening_owners = Finder("runs_opening_owners", runs_by_keys.any_of, order=runs_by_keys.order, lock="touch")
"""The Run an owner's opening (a consent, a delegated job, a service attempt) is checked
against, locked by writing its row unchanged: the counts of its owners only ever rise
under this lock, and a decided-ahead settle whose snapshot predates it sees that the Run
it locked is newer than its snapshot (``aggregate.COUNTED_AHEAD``)."""
attempts_by_keys = Finder("attempts_by_run_owner", ((Condition("attempt_id", "in", Param("keys")),),),
                          order=("attempt_id",), lock="none")
"""A service-attempt owner, read (not locked) after the Run's lock."""

_NONTERMINAL_RUNS = _sorted(set(RunStatus) - TERMINAL_RUN_STATUSES)

session_open = Finder(
    "session_open",
    ((Condition("session_id", "=", Param("session_id")), Condition("status", "in", _NONTERMINAL_RUNS)),),
    order=("run_id",),
    lock="none",
)
"""Nonterminal Runs of a session (read under the session's lock: the session fence)."""

runs_by_admission_key = Finder(
    "runs_by_admission_key",
    ((Condition("idempotency_key", "=", Param("key")),),),
    order=("created_at_us", "run_id"),
    lock="none",
)
"""Runs holding an idempotency key, oldest first (read under the key's named lock; the
Run met is then locked as usual)."""

pending_consents_of_run = Finder(
    "pending_consents_of_run",
    ((Condition("run_id", "=", Param("run_id")), Condition("status", "=", ConsentStatus.PENDING)),),
    order=("consent_id",),
    lock="wait",
)

pending_receives_of_run = Finder(
    "pending_receives_of_run",
    ((Condition("run_id", "=", Param("run_id")), Condition("status", "=", MessageStatus.PENDING)),),
    order=("slot_id",),
    lock="wait",
)
"""The Run's receives still waiting for a message: what a settled or cancelled Run's
``sweep_receives`` cancels (locked, after the Run and its delivery)."""

OPEN_JOB_STATUSES = _sorted((set(AgentJobStatus) - TERMINAL_AGENT_JOB_STATUSES) | {AgentJobStatus.LOST})
"""Delegated jobs that keep a Run's containment unproven: open, or LOST (terminal for
adoption, but no evidence that anything stopped)."""

OPEN_ATTEMPT_STATES = _sorted(set(AttemptState) - TERMINAL_ATTEMPT_STATES)
"""Service attempts that keep a Run's containment unproven: every state but a terminal
one (PREPARED too: it can still be transmitted)."""

open_jobs_of_run = Finder(
    "open_jobs_of_run",
    ((Condition("run_id", "=", Param("run_id")), Condition("status", "in", OPEN_JOB_STATUSES)),),
    order=("job_id",),
    lock="none",
)

open_attempts_of_run = Finder(
    "open_attempts_of_run",
    ((Condition("run_id", "=", Param("run_id")), Condition("state", "in", OPEN_ATTEMPT_STATES)),),
    order=("attempt_id",),
    lock="none",
)


@functools.cache
def runs_page(*, status: bool, session: bool, after: bool) -> Finder:
    """Runs oldest created first, optionally of one ``status`` and one ``session_id``, and
    after a page's last ``(created_at, run_id)`` (parameters ``after_created``, ``after_id``)."""
    base: tuple[Condition, ...] = ()
    if status:
        base += (Condition("status", "=", Param("status")),)
    if session:
        base += (Condition("session_id", "=", Param("session_id")),)
    return _keyset("runs_page", base, "created_at_us", "after_created", after=after)


def _keyset(name: str, base: tuple[Condition, ...], field: str, after_param: str, *, after: bool) -> Finder:
    """Rows meeting ``base`` in ``(field, run_id)`` order, after the position
    ``(after_param, after_id)`` when ``after`` (keyset paging: ``name`` + ``_after``)."""
    if not after:
        return Finder(name, (base,), order=(field, "run_id"), lock="none")
    return Finder(
        f"{name}_after",
        (
            (*base, Condition(field, ">", Param(after_param))),
            (*base, Condition(field, "=", Param(after_param)), Condition("run_id", ">", Param("after_id"))),
        ),
        order=(field, "run_id"),
        lock="none",
    )


@functools.cache
def runs_listing(*, status: bool = False, queue: bool = False, workflow: bool = False, after: bool = False) -> Finder:
    """Runs newest created first (an operator's pages: ``tenure console``), optionally of
    one ``status``, one ``queue`` and one ``workflow`` (its name), and past a page's last
    ``(created_at, run_id)`` (parameters ``after_created``, ``after_id``) when ``after``.

    Keyset paging on the index ``(created_at, run_id)``, read backwards. Both halves of the
    position test also say ``created_at <= after_created`` (implied, so the rows are the
    same): a database that takes the condition common to every half out of the OR
    (PostgreSQL does) starts the index scan at the position instead of at the newest Run."""
    base: tuple[Condition, ...] = tuple(
        Condition(field, "=", Param(name))
        for field, name, wanted in (("status", "status", status), ("queue", "queue", queue),
                                    ("workflow_name", "workflow", workflow)) if wanted)
    order = ("-created_at_us", "-run_id")
    label = "_".join(["runs_listing", *(name for name, wanted in (("status", status), ("queue", queue),
                                                                  ("workflow", workflow), ("after", after)) if wanted)])
    if not after:
        return Finder(label, (base,), order=order, lock="none")
    bound = Condition("created_at_us", "<=", Param("after_created"))
    return Finder(
        label,
        (
            (*base, bound, Condition("created_at_us", "<", Param("after_created"))),
            (*base, bound, Condition("created_at_us", "=", Param("after_created")),
             Condition("run_id", "<", Param("after_id"))),
        ),
        order=order,
        lock="none",
    )


@functools.cache
def runs_by_status(*, after: bool) -> Finder:
    """Runs of the ``statuses`` parameter in ``(updated_at, run_id)`` order, after a
    position ``(after_updated, after_id)``: recovery's pages. Every transition moves
    ``updated_at``, so a Run whose eligibility changed reappears later, never earlier."""
    base = (Condition("status", "in", Param("statuses")),)
    return _keyset("runs_by_status", base, "updated_at_us", "after_updated", after=after)


@functools.cache
def runs_past_deadline(*, after: bool) -> Finder:
    """Nonterminal Runs (CANCELLING included) whose deadline is at or before ``now`` (the
    database clock), in ``(deadline, run_id)`` order, after a position ``(after_deadline,
    after_id)``: the relays' sweep of deadlines that passed, each status one range of the
    index ``(status, deadline, run_id)`` (a terminal Run is never read there)."""
    base = (Condition("status", "in", _NONTERMINAL_RUNS), Condition("deadline_us", "<=", Param("now")))
    return _keyset("runs_past_deadline", base, "deadline_us", "after_deadline", after=after)


def _of_run(name: str, key: str) -> Finder:
    return Finder(name, ((Condition("run_id", "=", Param("run_id")),),), order=(key,), lock="none")


consents_of_run = _of_run("consents_of_run", "consent_id")
jobs_of_run = _of_run("jobs_of_run", "job_id")
attempts_of_run = _of_run("attempts_of_run", "attempt_id")
"""Every owner row of one Run (recovery picks the newest that is not cancelled)."""

receives_of_run = Finder("receives_of_run", ((Condition("run_id", "=", Param("run_id")),
                                              Condition("receive_key", "not_null")),), order=("slot_id",), lock="none")
"""Every message slot of one Run that a receive holds (its receives: owners a Run may
wait on; a message no receive took is none)."""


def _of_runs(name: str, key: str, *also: Condition) -> Finder:
    return Finder(name, ((Condition("run_id", "in", Param("run_ids")), *also),), order=("run_id", key), lock="none")


consents_of_runs = _of_runs("consents_of_runs", "consent_id")
jobs_of_runs = _of_runs("jobs_of_runs", "job_id")
attempts_of_runs = _of_runs("attempts_of_runs", "attempt_id")
receives_of_runs = _of_runs("receives_of_runs", "slot_id", Condition("receive_key", "not_null"))
"""Every owner row of several Runs (``run_ids``): recovery's page reads each Run's latest
owner from these, one statement per table for a whole page."""

open_jobs_of_runs = _of_runs("open_jobs_of_runs", "job_id", Condition("status", "in", OPEN_JOB_STATUSES))
open_attempts_of_runs = _of_runs("open_attempts_of_runs", "attempt_id",
                                 Condition("state", "in", OPEN_ATTEMPT_STATES))
"""The open delegated jobs and service attempts of several Runs (``run_ids``): a page's
containment counts, one statement per table (the rows are counted per Run)."""
