"""Recovery's page reads: a page of Runs with their current deliveries and the evidence
their states need, in a constant number of statements per page.

A recovery pass (startup reconciliation, a relay round) visits Runs a page at a time. Each
visit starts from what the Run is and what the recovery table decides it on
(:data:`tenure.kernel.recovery.table.EVIDENCE_FOR`): the Run and its current delivery, the
persisted owner of a wait, the containment counts and the latest owner of a hop or a
cancellation, and the database time for a timer. :func:`read_page` reads all of that for a
whole page in one read transaction: the Runs with their current deliveries in one
statement (a join: one snapshot), then one statement per kind of evidence the page needs
(owner rows by their keys, one per owner table; open jobs and open attempts of the
page's Runs; every owner row of the page's Runs, one per owner table; the clock once):
at most twelve statements for a page, however many Runs it holds, and only those its Runs'
statuses need.

A Run the page cannot answer for is left out of the answer and the visit reads it alone
(:func:`tenure.adapters.runs.recovery` does, as before): a Run whose join did not give
exactly the delivery its sequence names (rows out of shape, or a delivery written between
the Run's read and its own on a database that reads each statement at its own instant),
and every Run of a page where a row could not be read (``corrupt_row``: then each Run is
read alone, so the failure stays with its own Run).

Nothing here decides: rows are grouped by the Run they belong to, and the evidence is
handed to the recovery table as the single-Run reads would.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from tenure.kernel.recovery.table import Evidence, evidence_for, latest_owner
from tenure.kernel.runs import finders
from tenure.kernel.runs.commands import Containment, OwnerEvidence
from tenure.kernel.runs.record import DeliveryRow, RunRow
from tenure.model import WaitKind

from ..agent_jobs.table import AGENT_JOBS_BINDING
from ..attempts.table import ATTEMPTS_BINDING
from ..consents.table import CONSENTS_BINDING
from ..messages.table import MESSAGES_BINDING
from .table import CURRENT_DELIVERY, DELIVERIES_BINDING, RUNS_BINDING
from .engine import attempt_evidence, consent_evidence, current_pair, job_evidence, message_evidence

if TYPE_CHECKING:
    from ..core.store import Transaction

__all__ = ["PageEntry", "read_page"]


@dataclasses.dataclass(frozen=True, slots=True)
class PageEntry:
    """One Run of a page as a visit starts from it: the Run, its current delivery and the
    evidence its status is decided on (what it does not need stays at its default)."""

    run: RunRow
    delivery: DeliveryRow | None
    """None: the Run's current delivery is missing (a visit reads a Run alone; a page leaves such a Run out)."""
    owner: OwnerEvidence | None = None
    containment: Containment = Containment(0, 0)
    latest_owner: tuple[WaitKind, str] | None = None
    now_us: int | None = None


async def _by_keys(tx: Transaction, binding: Any, keys: list[str]) -> list[Any]:
    return await tx.read(binding, keys)


async def _attempts_by_keys(tx: Transaction, binding: Any, keys: list[str]) -> list[Any]:
    # As RunEngine.owner reads a service attempt: through its finder, never locked.
    return await tx.find(binding, finders.attempts_by_keys, {"keys": keys})


# Where a wait's owner of each kind is read by its key, and the evidence its row gives
# (the same reads as RunEngine.owner, for several owners at once).
_OWNER_READS: tuple[tuple[WaitKind, Any, str, Callable[..., Awaitable[list[Any]]], Callable[[Any], OwnerEvidence]],
                    ...] = (
    (WaitKind.CONSENT, CONSENTS_BINDING, "consent_id", _by_keys, consent_evidence),
    (WaitKind.DELEGATE, AGENT_JOBS_BINDING, "job_id", _by_keys, job_evidence),
    (WaitKind.SERVICE, ATTEMPTS_BINDING, "attempt_id", _attempts_by_keys, attempt_evidence),
    (WaitKind.MESSAGE, MESSAGES_BINDING, "slot_id", _by_keys, message_evidence),
)


async def read_page(tx: Transaction, run_ids: Sequence[str]) -> dict[str, PageEntry]:
    """The Runs of ``run_ids`` each with its current delivery and the evidence its status
    needs (see the module docstring); a Run left out is read alone by its visit."""
    if not run_ids:
        return {}
    joined: list[tuple[RunRow, DeliveryRow | None]] = await tx.read_joined(
        RUNS_BINDING, list(run_ids), DELIVERIES_BINDING, CURRENT_DELIVERY)
    by_run: dict[str, list[tuple[RunRow, DeliveryRow | None]]] = {}
    for run, delivery in joined:
        by_run.setdefault(run.run_id, []).append((run, delivery))
    pairs: dict[str, tuple[RunRow, DeliveryRow]] = {}
    for run_id, rows in by_run.items():
        found = current_pair(run_id, rows)
        if found is not None:
            pairs[run_id] = found
    needs = {run_id: evidence_for(run.status) for run_id, (run, _) in pairs.items()}
    owners = await _owners(tx, [pairs[run_id][0] for run_id, need in needs.items() if Evidence.OWNER in need])
    counted = await _containment(tx, [run_id for run_id, need in needs.items() if Evidence.CONTAINMENT in need])
    latest = await _latest_owners(tx, [run_id for run_id, need in needs.items() if Evidence.LATEST_OWNER in need])
    # A timer's owner is the database clock: read once, after the page's rows.
    now = await tx.now_us() if any(Evidence.CLOCK in need for need in needs.values()) else None
    entries: dict[str, PageEntry] = {}
    for run_id, (run, delivery) in pairs.items():
        need = needs[run_id]
        entries[run_id] = PageEntry(
            run, delivery,
            owner=owners.get((run.owner_kind, run.owner_id)) if Evidence.OWNER in need else None,
            containment=counted.get(run_id, Containment(0, 0)),
            latest_owner=latest.get(run_id),
            now_us=now if Evidence.CLOCK in need else None,
        )
    return entries


async def _owners(tx: Transaction, runs: Sequence[RunRow]) -> dict[tuple[WaitKind | None, str | None], OwnerEvidence]:
    """The persisted owner row of each waiting Run, by ``(kind, owner ID)``: one statement
    per owner table the page's waits name."""
    found: dict[tuple[WaitKind | None, str | None], OwnerEvidence] = {}
    for kind, binding, key_field, read, evidence in _OWNER_READS:
        keys = sorted({run.owner_id for run in runs if run.owner_kind is kind and run.owner_id is not None})
        if keys:
            for row in await read(tx, binding, keys):
                found[(kind, getattr(row, key_field))] = evidence(row)
    return found


async def _containment(tx: Transaction, run_ids: Sequence[str]) -> dict[str, Containment]:
    """Each Run's open delegated jobs and service attempts: one statement per table."""
    if not run_ids:
        return {}
    parameters = {"run_ids": list(run_ids)}
    jobs = Counter(row.run_id for row in await tx.find(AGENT_JOBS_BINDING, finders.open_jobs_of_runs, parameters))
    attempts = Counter(row.run_id for row in await tx.find(ATTEMPTS_BINDING, finders.open_attempts_of_runs, parameters))
    return {run_id: Containment(open_jobs=jobs[run_id], open_attempts=attempts[run_id]) for run_id in run_ids}


async def _latest_owners(tx: Transaction, run_ids: Sequence[str]) -> dict[str, tuple[WaitKind, str] | None]:
    """Each Run's newest owner that is not cancelled (the recovery kernel's
    :func:`latest_owner` over its own rows): one statement per owner table."""
    if not run_ids:
        return {}
    parameters = {"run_ids": list(run_ids)}
    rows: list[list[Any]] = [
        await tx.find(binding, finder, parameters)
        for binding, finder in ((CONSENTS_BINDING, finders.consents_of_runs), (AGENT_JOBS_BINDING, finders.jobs_of_runs),
                                (ATTEMPTS_BINDING, finders.attempts_of_runs), (MESSAGES_BINDING, finders.receives_of_runs))
    ]
    grouped: dict[str, tuple[list[Any], list[Any], list[Any], list[Any]]] = {
        run_id: ([], [], [], []) for run_id in run_ids}
    for table, table_rows in enumerate(rows):
        for row in table_rows:
            grouped[row.run_id][table].append(row)
    return {run_id: latest_owner(*owned) for run_id, owned in grouped.items()}
