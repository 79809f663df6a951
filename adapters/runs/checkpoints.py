"""Workflow checkpoints: the snapshot a hop leaves for the hop that resumes it.

A Run's hop ends when it parks (the kernel's resume clears the Run's owner), so the
hop that resumes it must learn from somewhere durable what it was waiting for and
where its workflow stood. That is the checkpoint: one row per Run in
``tenure_run_checkpoints`` (schema step ``runs_v3``), holding the workflow's JSON state,
the sequence of the hop that wrote it and the owner (consent, delegated job, service
attempt or receive) it parks on, if any. The worker writes it before it parks, the resumed hop
reads it, and the same row is the evidence startup recovery asks for
(``checkpoint_owner``: an orphan whose checkpoint names the Run's latest owner is
re-parked instead of failed) and the debt it clears (``delete_checkpoint`` once the Run
is terminal).

Owner bindings: a save with an owner (the one a park writes) binds that owner; a plain
save (``ctx.save``, ``ctx.wait_for_hardware``'s) replaces the state and keeps the owner
the stored snapshot binds. So a resumed hop's checkpoint names the owner it resumed
from (a consent, a delegated job, a service attempt or a timer) until the hop parks on
another or the Run ends, whatever the hop saved meanwhile, and a hop that runs again in
its place (recovery's re-park and resume, or ``retry_lost`` in resume mode) resumes from
that same decided owner, with the state saved last (``specs/recovery.md``, "Checkpoints
and hops that run again"). Before issue 47 a plain save dropped the binding: such a hop
was failed ``checkpoint_invalid`` without running.

Fences: a save is one transaction that locks the Run row first (the ledger's lock
order) and writes only while the Run is RUNNING or AWAITING_HARDWARE at the saving
hop's sequence, so a hop that lost its Run (cancelled, failed by recovery, superseded)
cannot overwrite the snapshot of the hop after it. A delete writes only once the Run
is terminal. A checkpoint is not a state machine: it is evidence the Run machine's
callers read, stored next to the Run's rows and written under the Run's lock.

Outcomes (schema step ``runs_v5``): a hop's outcome (DONE with the workflow's result,
or FAILED with its error, for the hop's sequence) can be recorded in the same row,
under the same fence as a save. The worker settles its finished hop in one transaction
(``RunEngine.settle`` with ``record``, issue 49): the Run settles (its checkpoint
deleted in that transaction), or, when the kernel refuses because an effect is not
contained yet, the outcome is recorded here instead (the declared ``record_outcome``
follow-up, :func:`record_outcome_in`), and recovery settles the Run with it once
contained (``specs/recovery.md``, ``outcome_recorded``). After a database failure of
that settle the worker records the outcome on its own first
(:meth:`Checkpoints.record_outcome`, the retry path; every hop did so before its settle
until issue 49), then retries the settle. A process that dies before any of these
COMMITs leaves an orphaned hop, which recovery treats as its table says (failed
``lost``, or retried).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from typing import Any

from tenure.kernel.runs import finders
from tenure.kernel.runs.record import RunRow, hop_holds, is_terminal
from tenure.model import (
    ErrorCode,
    RunStatus,
    TenureError,
    WaitKind,
    canonical_json,
)
from tenure.model.runs import (
    MAX_ERROR_CHARS,
    MAX_RUN_DOCUMENT_BYTES,
    check_document,
    check_run_id,
    check_seq,
    check_text,
)
from tenure.model.validation import micros_to_datetime, refuse

from ..core.facade import Transactions
from ..core.store import Transaction
from ..core.tables import json_column
from .table import CHECKPOINTS_BINDING, CHECKPOINTS_TABLE, RUNS_BINDING, CheckpointRow

__all__ = ["Checkpoint", "Checkpoints", "CHECKPOINTS_TABLE", "CHECKPOINTS_BINDING", "OWNER_KINDS", "RecordedOutcome",
           "recorded_outcome", "record_outcome_in", "delete_in", "clear_outcome_in",
           "stored_in", "held_with_checkpoint"]

OWNER_KINDS = frozenset({WaitKind.CONSENT, WaitKind.DELEGATE, WaitKind.SERVICE, WaitKind.MESSAGE})
"""The owners ``save`` binds (a timer's checkpoint is written by ``RunLedger.park_timer``,
in the same transaction as its park)."""
"""The owners a checkpoint may name (a hardware wait is left by the same hop)."""



@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    """A Run's snapshot: the workflow ``state`` (any JSON value) the hop ``enqueue_seq``
    saved, and the owner it parked on (None for a plain checkpoint)."""

    run_id: str
    enqueue_seq: int
    owner_kind: WaitKind | None
    owner_id: str | None
    state: Any
    saved_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class RecordedOutcome:
    """What a finished hop recorded before settling: the hop's sequence, DONE or FAILED,
    the result (canonical JSON text, or None) or the error."""

    enqueue_seq: int
    status: RunStatus
    result_json: str | None
    error: str | None


_refuse = functools.partial(refuse, reason="invalid_checkpoint")


def recorded_outcome(row: CheckpointRow) -> RecordedOutcome | None:
    """The outcome a stored row holds, or None (also when its parts do not agree: a row
    written outside tenure is no evidence)."""
    status = row.outcome_status
    if row.outcome_seq is None or status not in (RunStatus.DONE, RunStatus.FAILED):
        return None
    failed = status is RunStatus.FAILED
    if failed != (row.outcome_error is not None) or (failed and row.outcome_json is not None):
        return None
    return RecordedOutcome(row.outcome_seq, status, row.outcome_json, row.outcome_error)


async def clear_outcome_in(tx: Transaction, run_id: str) -> None:
    """Forget a recorded outcome inside the caller's transaction (a retried hop's)."""
    stored = await stored_in(tx, run_id)
    if stored is not None and stored.outcome_seq is not None:
        cleared = dataclasses.replace(stored, outcome_seq=None, outcome_status=None, outcome_json=None,
                                      outcome_error=None)
        await tx.update_many(CHECKPOINTS_BINDING, [(stored, cleared)], read_back=False)


_UNREAD = object()


async def record_outcome_in(tx: Transaction, run_id: str, outcome: RecordedOutcome, now_us: int, *,
                            stored: Any = _UNREAD) -> None:
    """Record ``outcome`` in the Run's checkpoint row inside the caller's transaction (which
    holds the Run's lock and has checked that the outcome's hop holds the Run), keeping
    the snapshot; ``stored``: the row as read under that lock, when the caller read it."""
    if stored is _UNREAD:
        stored = await stored_in(tx, run_id)
    seq = outcome.enqueue_seq
    base = stored if stored is not None else CheckpointRow(run_id, seq, None, None, "null", now_us)
    row = dataclasses.replace(base, saved_at_us=now_us, outcome_seq=seq, outcome_status=outcome.status,
                              outcome_json=outcome.result_json, outcome_error=outcome.error)
    await put_in(tx, row, stored)


def state_text(state: Any) -> str:
    """A workflow state as the checkpoint stores it (canonical JSON, bounded)."""
    text = canonical_json(check_document(state, "state"))
    if len(text.encode()) > MAX_RUN_DOCUMENT_BYTES:
        raise _refuse("state", "document_too_large")
    return text


RUN_CHECKPOINT = (("run_id", "run_id"),)
"""A Run's checkpoint, as a join."""


async def held_with_checkpoint(tx: Transaction, run_id: str, seq: int) -> tuple[bool, CheckpointRow | None]:
    """Whether the hop ``seq`` holds the Run (the kernel's fence: only a hop holding its Run
    writes its checkpoint), with the stored checkpoint: the Run locked, then its
    checkpoint (every checkpoint writer holds the Run's lock first), in one statement,
    the clock read after both. A checkpoint that cannot be read matters only to a hop
    that holds the Run, as when it was read after the fence: the Run is locked alone
    and a holding hop meets ``corrupt_row``."""
    try:
        joined: list[tuple[RunRow, CheckpointRow | None]] = await tx.locked_joined(
            RUNS_BINDING, [run_id], CHECKPOINTS_BINDING, RUN_CHECKPOINT)
    except TenureError as error:
        if error.reason != "corrupt_row":
            raise
        runs: list[RunRow] = await tx.locked(RUNS_BINDING, finders.runs_by_keys, {"keys": [run_id]})
        if runs and hop_holds(runs[0], seq):
            raise
        return False, None
    if not joined or not hop_holds(joined[0][0], seq):
        return False, None
    return True, joined[0][1]


async def stored_in(tx: Transaction, run_id: str) -> CheckpointRow | None:
    """The Run's checkpoint as stored, inside the caller's transaction (which holds the
    Run's lock)."""
    found: list[CheckpointRow] = await tx.read(CHECKPOINTS_BINDING, [run_id])
    return found[0] if found else None


async def put_in(tx: Transaction, row: CheckpointRow, stored: CheckpointRow | None) -> None:
    """Write the Run's checkpoint inside the caller's transaction (which holds the Run's
    lock and has checked the hop's fence), replacing ``stored``, the one it read under
    that lock (None: there was none)."""
    if stored is not None:
        await tx.update_many(CHECKPOINTS_BINDING, [(stored, row)], read_back=False)
    else:
        await tx.insert(CHECKPOINTS_BINDING, row)


async def delete_in(tx: Transaction, run_id: str) -> None:
    """Delete the Run's checkpoint inside the caller's transaction (which holds the Run's
    lock and has just made it terminal): by its key, in one statement, since every
    checkpoint writer holds that lock too (nothing can change it in between). A
    checkpoint that cannot be read goes too, unread: it belongs to a terminal Run (read
    first, it used to fail the settle with ``corrupt_row``, and every later try)."""
    await tx.delete_keys(CHECKPOINTS_BINDING, [run_id])


def _public(row: CheckpointRow) -> Checkpoint:
    saved = micros_to_datetime(row.saved_at_us)
    state = json_column(row.state_json, ErrorCode.RUN_PERSISTENCE_FAILED)
    return Checkpoint(row.run_id, row.enqueue_seq, row.owner_kind, row.owner_id, state, saved)



class Checkpoints:
    """The checkpoints of one Run ledger's database, on the ledger's connections
    (``RunLedger.checkpoints``). Its :meth:`owner` and :meth:`delete` are the recovery
    ports ``checkpoint_owner`` and ``delete_checkpoint``."""

    def __init__(self, transactions: Transactions) -> None:
        self._tx = transactions

    async def save(self, run_id: str, enqueue_seq: int, *, state: Any, owner_kind: WaitKind | None = None,
                   owner_id: str | None = None) -> bool:
        """Write the Run's snapshot for the hop ``enqueue_seq``, replacing any earlier one.
        With an owner (a park's save) the snapshot binds that owner; a plain save (no
        owner) replaces the state and keeps the owner the stored snapshot binds, if any
        (see the module docstring: a resumed hop that saved and died runs again as a
        resume of the same owner). True when written; False when that hop does not hold
        the Run any more (the Run is not RUNNING or AWAITING_HARDWARE at that sequence):
        nothing changed."""
        key = check_run_id(run_id)
        seq = check_seq(enqueue_seq)
        if owner_kind is None:
            if owner_id is not None:
                raise _refuse("owner_kind", "owner_kind_required")
        elif type(owner_kind) is not WaitKind or owner_kind not in OWNER_KINDS:
            raise _refuse("owner_kind", "owner_kind_required")
        else:
            owner_id = check_text(owner_id, "owner_id")
        text = state_text(state)

        async def body(tx: Transaction) -> bool:
            holds, stored = await held_with_checkpoint(tx, key, seq)
            if not holds:
                return False
            kind, owner = owner_kind, owner_id
            if kind is None and stored is not None:
                kind, owner = stored.owner_kind, stored.owner_id  # a plain save keeps the binding
            await put_in(tx, CheckpointRow(key, seq, kind, owner, text, await tx.now_us()), stored)
            return True

        return bool(await self._tx.run(body))

    async def record_outcome(self, run_id: str, enqueue_seq: int, status: RunStatus, *,
                             result_json: str | None = None, error: str | None = None) -> bool:
        """Record the finished hop ``enqueue_seq``'s outcome (DONE with its result, the
        canonical JSON text the settlement will keep, or FAILED with its error) in the
        Run's checkpoint row, keeping the snapshot. The same fence as :meth:`save`: True
        when written, False when that hop does not hold the Run any more."""
        key = check_run_id(run_id)
        seq = check_seq(enqueue_seq)
        if status not in (RunStatus.DONE, RunStatus.FAILED):
            raise _refuse("status", "done_or_failed_required")
        failed = status is RunStatus.FAILED
        if failed != (error is not None) or (failed and result_json is not None):
            raise _refuse("error", "failed_needs_error_done_has_none")
        if error is not None:
            error = check_text(error, "error", MAX_ERROR_CHARS)
        if result_json is not None and (type(result_json) is not str
                                        or len(result_json.encode()) > MAX_RUN_DOCUMENT_BYTES):
            raise _refuse("result_json", "document_too_large")

        async def body(tx: Transaction) -> bool:
            holds, stored = await held_with_checkpoint(tx, key, seq)
            if not holds:
                return False
            await record_outcome_in(tx, key, RecordedOutcome(seq, status, result_json, error), await tx.now_us(),
                                    stored=stored)
            return True

        return bool(await self._tx.run(body))

    async def outcome(self, run_id: str) -> RecordedOutcome | None:
        """The outcome the Run's checkpoint records (recovery's ``checkpoint_outcome``)."""
        key = check_run_id(run_id)

        async def body(tx: Transaction) -> list[CheckpointRow]:
            return await tx.read(CHECKPOINTS_BINDING, [key])

        found = await self._tx.run(body, write=False)
        return recorded_outcome(found[0]) if found else None

    async def load(self, run_id: str) -> Checkpoint | None:
        key = check_run_id(run_id)

        async def body(tx: Transaction) -> list[CheckpointRow]:
            return await tx.read(CHECKPOINTS_BINDING, [key])

        found = await self._tx.run(body, write=False)
        return _public(found[0]) if found else None

    async def owner(self, run_id: str) -> str | None:
        """The owner the Run's snapshot parks on (recovery's ``checkpoint_owner``)."""
        checkpoint = await self.load(run_id)
        return None if checkpoint is None else checkpoint.owner_id

    async def delete(self, run_id: str) -> None:
        """Remove a terminal Run's snapshot (recovery's ``delete_checkpoint``; idempotent).
        A Run that is not terminal keeps it: raises ``ConfigValidationError``
        (``run_not_terminal``) and deletes nothing."""
        key = check_run_id(run_id)

        async def body(tx: Transaction) -> bool:
            runs = await tx.locked(RUNS_BINDING, finders.runs_by_keys, {"keys": [key]})
            if runs and not is_terminal(runs[0]):
                return False
            await delete_in(tx, key)
            return True

        if not await self._tx.run(body):
            raise _refuse("run_id", "run_not_terminal")
