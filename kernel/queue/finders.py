"""Which stored rows a queue command meets, as data.

Each :class:`~tenure.kernel.core.Finder` here is a predicate over queue records that the
adapters compile to SQL; ``tests/kernel/test_finders.py`` holds each to exactly the rows its
kernel guard accepts (for example, ``eligible`` selects a row exactly when a claim of it
is not refused as ineligible). The ``meets`` functions say which of the located rows a
submission meets; the engine and the lockstep model both use them, so which row a
command meets is decided here, once.

Order matters where a limit applies: claims take the earliest due row, then the
smallest job ID (tasks: the highest priority first), so every store (and the lockstep
model) picks the same ones.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from tenure.model import JobStatus, QueueKind, bounds

from ..core import Condition, Finder, Param
from .record import QueueRow

__all__ = [
    "by_keys",
    "by_token",
    "tokens_stored",
    "eligible",
    "eligible_legacy",
    "claimable",
    "claimable_legacy",
    "eligible_tasks",
    "eligible_tasks_legacy",
    "claimable_tasks",
    "claimable_tasks_legacy",
    "eligible_task_queue",
    "eligible_task_queue_legacy",
    "claimable_task_queue",
    "claimable_task_queue_legacy",
    "claim_finders",
    "expired",
    "set_aside_guard",
    "finished_before",
    "finished_before_with_status",
    "all_rows",
    "with_status",
    "listed",
    "listed_page",
    "locate",
    "located_batch",
    "dedupe_field",
    "submission_meets",
    "key_holder",
]

_PENDING = Condition("status", "=", JobStatus.PENDING)
_CLAIMED = Condition("status", "=", JobStatus.CLAIMED)

by_keys = Finder("by_keys", ((Condition("job_id", "in", Param("keys")),),), order=("job_id",), lock="wait")
"""The rows with these job IDs, locked in ID order (by-ID and fenced writes)."""

by_token = Finder("by_token", ((Condition("claim_token", "=", Param("claim_token")),),), lock="wait")
"""The row storing this claim token (claim recovery)."""

tokens_stored = Finder("tokens_stored", ((Condition("claim_token", "in", Param("tokens")),),), lock="none")
"""Rows already storing one of these tokens (a claim's nonce must be fresh)."""

eligible = Finder(
    "eligible",
    ((_PENDING, Condition("fires_at_us", "<=", Param("now")),
      Condition("attempts", "<", other_field="max_attempts")),),
    order=("fires_at_us", "job_id"),
    lock="skip",
)
"""Rows an owned claim may take: pending, due, with attempts left."""

eligible_legacy = Finder(
    "eligible_legacy",
    ((_PENDING, Condition("fires_at_us", "<=", Param("now")),
      Condition("attempts", "<", other_field="max_attempts"), Condition("fence_required", "=", False)),),
    order=("fires_at_us", "job_id"),
    lock="skip",
)
"""Rows a legacy claim may take: the same, never a protected submission."""

_GENERATION_LEFT = Condition("generation", "<", bounds.INT64_MAX)

claimable = Finder("claimable", ((*eligible.any_of[0], _GENERATION_LEFT),), order=eligible.order, lock="skip")
"""Eligible rows a claim with a fresh nonce actually takes (one whose generation can still
grow): a store that claims in one statement writes only if every row it picked is one."""

claimable_legacy = Finder(
    "claimable_legacy", ((*eligible_legacy.any_of[0], _GENERATION_LEFT),), order=eligible_legacy.order, lock="skip"
)
"""The same for a legacy claim."""

_OF_QUEUES = Condition("queue_name", "in", Param("queues"))
_OF_QUEUE = Condition("queue_name", "=", Param("queue"))
_TASK_ORDER = ("-priority", "fires_at_us", "job_id")

eligible_tasks = Finder("eligible_tasks", ((*eligible.any_of[0], _OF_QUEUES),), order=_TASK_ORDER, lock="skip")
"""Tasks an owned claim serving ``:queues`` may take: highest priority first, then the
earliest due, then the smallest (time-ordered, so the earliest submitted) job ID."""

eligible_tasks_legacy = Finder("eligible_tasks_legacy", ((*eligible_legacy.any_of[0], _OF_QUEUES),),
                               order=_TASK_ORDER, lock="skip")
claimable_tasks = Finder("claimable_tasks", ((*eligible_tasks.any_of[0], _GENERATION_LEFT),), order=_TASK_ORDER,
                         lock="skip")
claimable_tasks_legacy = Finder("claimable_tasks_legacy", ((*eligible_tasks_legacy.any_of[0], _GENERATION_LEFT),),
                                order=_TASK_ORDER, lock="skip")

eligible_task_queue = Finder("eligible_task_queue", ((*eligible.any_of[0], _OF_QUEUE),), order=_TASK_ORDER, lock="skip")
"""The same for a claim serving one queue (``:queue``): an equality the claim index
(queue, status, priority, due time, ID) serves in order, where a list of queues is
served by the index without the queue."""

eligible_task_queue_legacy = Finder("eligible_task_queue_legacy", ((*eligible_legacy.any_of[0], _OF_QUEUE),),
                                    order=_TASK_ORDER, lock="skip")
claimable_task_queue = Finder("claimable_task_queue", ((*eligible_task_queue.any_of[0], _GENERATION_LEFT),),
                              order=_TASK_ORDER, lock="skip")
claimable_task_queue_legacy = Finder(
    "claimable_task_queue_legacy", ((*eligible_task_queue_legacy.any_of[0], _GENERATION_LEFT),), order=_TASK_ORDER,
    lock="skip",
)


def claim_finders(queue: QueueKind, *, owned: bool, one_queue: bool = False) -> tuple[Finder, Finder]:
    """``(eligible, claimable)`` for a claim of ``queue``'s table (tasks: parameter
    ``queue`` when ``one_queue``, else ``queues``: the task queues the claim serves)."""
    if queue is QueueKind.TASK and one_queue:
        return (eligible_task_queue, claimable_task_queue) if owned else \
            (eligible_task_queue_legacy, claimable_task_queue_legacy)
    if queue is QueueKind.TASK:
        return (eligible_tasks, claimable_tasks) if owned else (eligible_tasks_legacy, claimable_tasks_legacy)
    return (eligible, claimable) if owned else (eligible_legacy, claimable_legacy)


expired = Finder(
    "expired",
    ((_CLAIMED, Condition("lease_expires_at_us", "<=", Param("now"))),),
    order=("lease_expires_at_us", "job_id"),
    lock="skip",
)
"""Claims whose lease has run out (the sweep before a claim)."""

set_aside_guard = Finder("set_aside_guard", ((Condition("status", "in", (JobStatus.PENDING, JobStatus.CLAIMED)),),),
                         lock="none")
"""The rows a claim or its sweep may set aside (``SET_ASIDE`` in
:mod:`tenure.kernel.queue.machine`) when it cannot read them: the statuses they meet. A row
of another status is never met by a claim, and one another writer moved since is left as
it is."""

finished_before = Finder(
    "finished_before",
    ((Condition("status", "in", (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)),
      Condition("completed_at_us", "<", Param("cutoff")), Condition("fence_required", "=", False)),),
    order=("completed_at_us", "job_id"),
    lock="skip",
)
"""Finished, unprotected rows older than the cutoff (retention)."""

finished_before_with_status = Finder(
    "finished_before_with_status",
    ((Condition("status", "=", Param("status")), *finished_before.any_of[0][1:]),),
    order=finished_before.order,
    lock="skip",
)
"""The same, of one finished status only (``tenure jobs purge --status``; the caller
passes a finished status)."""

all_rows = Finder("all_rows", ((),), order=("created_at_us", "job_id"), lock="none")
with_status = Finder("with_status", ((Condition("status", "=", Param("status")),),),
                     order=("created_at_us", "job_id"), lock="none")


@functools.cache
def listed(*, status: bool = False, queue_name: bool = False, task_name: bool = False,
           newest_first: bool = False) -> Finder:
    """Rows in creation order (``newest_first``: the reverse), filtered by the parameters
    named (``status``, ``queue_name``, ``task_name``: each an exact value); a listing,
    never a command's met row."""
    conditions = tuple(
        Condition(field, "=", Param(field))
        for field, wanted in (("status", status), ("queue_name", queue_name), ("task_name", task_name)) if wanted
    )
    name = "_".join(["listed", *(field for field, wanted in (("status", status), ("queue_name", queue_name),
                                                             ("task_name", task_name)) if wanted)])
    order = ("-created_at_us", "-job_id") if newest_first else ("created_at_us", "job_id")
    return Finder(name + ("_newest_first" if newest_first else ""), (conditions,), order=order, lock="none")


@functools.cache
def listed_page(*, status: bool = False, queue_name: bool = False, task_name: bool = False,
                created_before: bool = False, after: bool = False) -> Finder:
    """One page of a listing, largest job ID first (an operator's pages: ``tenure
    console``), filtered by the parameters named (``status``, ``queue_name``,
    ``task_name``: each an exact value; ``created_before``: created at or before that
    instant) and, with ``after``, past a page's last job ID (parameter ``after_id``).

    The order is the primary key's, so every page is a range of its index whatever the
    table holds (keyset paging, no offset); the filters are checked on the rows that range
    meets. Task IDs are time-ordered (``time_ordered_id``), so a task listing runs newest
    first; pycharter's job IDs are random UUIDs, so its queues' pages follow no time
    order. A listing, never a command's met row."""
    named = (("status", status), ("queue_name", queue_name), ("task_name", task_name))
    conditions = tuple(Condition(field, "=", Param(field)) for field, wanted in named if wanted)
    if created_before:
        conditions += (Condition("created_at_us", "<=", Param("created_before")),)
    if after:
        conditions += (Condition("job_id", "<", Param("after_id")),)
    name = "_".join(["listed_page", *(field for field, wanted in (*named, ("created_before", created_before),
                                                                  ("after", after)) if wanted)])
    return Finder(name, (conditions,), order=("-job_id",), lock="none")


def dedupe_field(queue: QueueKind) -> str:
    """The record field a submission deduplicates on: the active key for streaming."""
    return "active_key" if queue is QueueKind.STREAMING else "idempotency_key"


@functools.cache
def locate(queue: QueueKind) -> Finder:
    """Every row sharing an identity with a submission (its submission ID, job ID, run
    ID, or idempotency key / active key), locked in ID order."""
    identities = [
        (Condition("submission_id", "=", Param("submission_id")),),
        (Condition("job_id", "=", Param("job_id")),),
    ]
    if queue is not QueueKind.TASK:  # a task has no idempotency key: its submission ID is the replay key
        identities.append((Condition(dedupe_field(queue), "=", Param("key")),))
    if queue is QueueKind.PIPELINE:
        identities.insert(2, (Condition("run_id", "=", Param("run_id")),))
    return Finder(f"locate_{queue.value}", tuple(identities), order=("job_id",), lock="wait")


located_batch = Finder(
    "located_batch",
    ((Condition("submission_id", "in", Param("submission_ids")),), (Condition("job_id", "in", Param("keys")),)),
    order=("job_id",), lock="wait",
)
"""Every row sharing a submission ID or a job ID with a batch of task submissions (tasks
have no run ID or key), locked in ID order."""


def submission_meets(
    rows: Sequence[QueueRow], *, submission_id: str | None, job_id: str, run_id: str | None, key: str | None
) -> QueueRow | None:
    """The located row a submission meets: its own submission first (an existing original
    answers before any key is touched), else the row (smallest job ID first) sharing its
    job ID, run ID or idempotency key, else none."""
    if submission_id is not None:
        own = next((row for row in rows if row.submission_id == submission_id), None)
        if own is not None:
            return own
    for row in sorted(rows, key=lambda r: r.job_id):
        if row.job_id == job_id or (run_id is not None and row.run_id == run_id) or (
            key is not None and row.idempotency_key == key
        ):
            return row
    return None


def key_holder(rows: Sequence[QueueRow], active_key: str | None) -> QueueRow | None:
    """The located row holding a streaming config's active key, if any."""
    if active_key is None:
        return None
    return next((row for row in rows if row.active_key == active_key), None)
