"""An explorer trace of the service-attempt machine, replayed against a real database.

The explorer (:mod:`tenure.conformance.explore.attempts`) finds a shortest trace in a world of
kernel records. :func:`replay_attempt_trace` sends the same trace to the attempt ledger on
a database (a scratch area, as ``tenure conform`` makes), step by step:

- a step whose world carries a kernel decision (``World.last``) sends the same kernel
  command to the same attempt through the ledger's engine: it locks the row, reads the
  database clock, asks the kernel and persists the decision with its compare-and-set
  (``AttemptLedger.decide``; a ``prepare`` goes through the ledger's own prepare
  transaction, ``AttemptLedger.send_prepare``, which locks the owner's attempts and the
  key's and observes the predecessor and the key in the database: both are the adapters'
  test seam, docs/testing.md). The database's answer (applied, or refused
  with the kernel's reason, whether the ledger answers the refusal or raises its error
  code) is compared with the trace's decision;
- a step without one (a sender's crash, a send to the provider, a lookup held, the
  operator closing the Run) changes nothing in the database;
- a step of the clock moves every stored instant of ``tenure_attempts`` back by as much
  (the database clock cannot jump; moving every instant back is the same to every
  comparison the kernel makes; see :mod:`.common` for why it stays
  sound: the only future instants of these worlds are submit leases 60 s ahead).

Instants inside commands (a prepare's row instants, ``Reconcile.looked_up_at_us``,
``BeginSubmit.proof_looked_up_at_us``) are world instants: an instant ``w`` sent when the
world's clock reads ``W`` becomes the database instant ``now + (w - W)``, ``now`` read from
the database just before the command is sent. A not-found held across steps of the clock
thus moves back with the stored instants (``W`` moved on by as much as they moved back).

The Run the attempts name exists only in the world: the scratch database holds no Run,
so a prepare carries the world's word on whether that Run is closed (the Run ledger's
own containment count belongs to the Run replay).

After each step the stored attempts are compared with the world's rows: every field but
the instants and the evidence log (which no guard reads), plus whether the submit lease
is live at the database's clock as at the world's. The result lists each decision with
both answers, then the rows as each side stores them (``stored``). Replayed under the
same mutant kernel, a trace shows the broken property reaching the database; replayed
under tenure's kernel, it shows where the database refuses what the mutant accepted.

:func:`replay_script` writes the trace as a self-contained script (``tenure conform``'s
scratch area, exit status 0 when every step agrees).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tenure.adapters import AttemptLedger
from tenure.adapters.attempts.table import ATTEMPTS_BINDING
from tenure.adapters.core.store import Transaction
from tenure.adapters.core.urls import parse_db_url
from tenure.kernel.attempts.commands import AttemptCommand, BeginSubmit, Prepare, Reconcile
from tenure.kernel.attempts.record import AttemptRow, replace_fields
from tenure.kernel.core import Decision
from tenure.conformance.explore.attempts import World
from tenure.conformance.explore.engine import Step

from .queue import ReplayedStep
from .common import (
    answer_of,
    differing,
    instant_columns,
    kernel_answer,
    script_main,
    script_text,
    shift_instants,
)

__all__ = ["replay_attempt_trace", "replay_script", "main"]

_INSTANT_COLUMNS = instant_columns([ATTEMPTS_BINDING])
"""The instant columns of ``tenure_attempts``, moved back on a step of the clock."""

_NOT_COMPARED = ("created_at_us", "updated_at_us", "submit_lease_expires_at_us", "evidence")
"""Fields of a row the stored comparison leaves out: the instants (the database's differ
from the world's by construction; the one comparison the kernel makes with them, a live
submit lease, is compared instead) and the evidence log (history no guard reads)."""

_COMPARED = tuple(field.name for field in dataclasses.fields(AttemptRow) if field.name not in _NOT_COMPARED)


# --- the commands, with their instants on the database's clock ------------------------------

Translate = Callable[[int | None], int | None]

_WITH_INSTANTS: dict[type[Any], Callable[[Any, Translate], Any]] = {
    Prepare: lambda command, at: dataclasses.replace(command, row=replace_fields(
        command.row, created_at_us=at(command.row.created_at_us), updated_at_us=at(command.row.updated_at_us))),
    Reconcile: lambda command, at: dataclasses.replace(command, looked_up_at_us=at(command.looked_up_at_us)),
    BeginSubmit: lambda command, at: dataclasses.replace(
        command, proof_looked_up_at_us=at(command.proof_looked_up_at_us)),
}
"""The commands that carry instants, and how to move them onto the database's clock
(every other command carries none and goes as it is)."""


async def _database_now(ledger: AttemptLedger) -> int:
    async def body(tx: Transaction) -> int:
        return await tx.now_us()

    return await ledger.store.run(body, write=False)


async def _prepare(ledger: AttemptLedger, command: Prepare) -> Decision:
    """The ledger's prepare transaction, for the trace's row: the predecessor and the key
    are what the database holds under the lock; the Run's closure is the world's."""
    return await ledger.send_prepare(command.row, run_closed=command.run_closed)


async def _send(ledger: AttemptLedger, command: AttemptCommand, attempt_id: str) -> Decision:
    return await ledger.send(attempt_id, command)


_SENDERS: dict[type[Any], Callable[[AttemptLedger, Any, str], Awaitable[Decision]]] = {
    Prepare: lambda ledger, command, attempt_id: _prepare(ledger, command),
}
"""How a command reaches the database, where it is not the ledger's one-row decision."""


async def _answer(ledger: AttemptLedger, command: AttemptCommand, attempt_id: str, world_now_us: int) -> str:
    """The database's answer to ``command`` (see :func:`.common.answer_of`)."""
    database_now = await _database_now(ledger)

    def at(instant: int | None) -> int | None:
        return None if instant is None else database_now + (instant - world_now_us)

    translate = _WITH_INSTANTS.get(type(command))
    sent = command if translate is None else translate(command, at)
    send = _SENDERS.get(type(command), _send)
    return await answer_of(ATTEMPTS_BINDING.machine, lambda: send(ledger, sent, attempt_id))


# --- the stored rows ------------------------------------------------------------------------


def _compared(row: AttemptRow, now_us: int) -> dict[str, Any]:
    fields = {name: getattr(row, name) for name in _COMPARED}
    lease = row.submit_lease_expires_at_us
    fields["submit_lease_live"] = lease is not None and lease > now_us
    return fields


def _summary(row: AttemptRow | None, now_us: int) -> str:
    if row is None:
        return "absent"
    notes = [row.state.value, f"#{row.transmissions}"]
    notes += ["lease live"] if _compared(row, now_us)["submit_lease_live"] else []
    notes += [] if row.no_effect_proof_for is None else [f"proof #{row.no_effect_proof_for}"]
    notes += [] if row.provider_job_id is None else [row.provider_job_id]
    notes += ["cancel requested"] if row.cancel_requested else []
    notes += ["released"] if row.reservation_released else []
    return " ".join(notes)


def _stored_line(world: World, stored: dict[str, AttemptRow], database_now: int,
                 ids: Sequence[str | None]) -> tuple[str, str]:
    """(the world's rows, the database's rows), one ``gN ...`` part per generation; a
    database row that differs in a compared field the summary does not show names it."""
    kernel_parts, database_parts = [], []
    for generation, (row, attempt_id) in enumerate(zip(world.rows, ids), start=1):
        found = None if attempt_id is None else stored.get(attempt_id)
        kernel_parts.append(f"g{generation} {_summary(row, world.now_us)}")
        shown = f"g{generation} {_summary(found, database_now)}"
        if row is not None and found is not None:
            shown += differing(_compared(row, world.now_us), _compared(found, database_now))
        database_parts.append(shown)
    return "; ".join(kernel_parts), "; ".join(database_parts)


async def _read_stored(ledger: AttemptLedger, ids: Sequence[str | None]) -> tuple[dict[str, AttemptRow], int]:
    keys = [attempt_id for attempt_id in ids if attempt_id is not None]

    async def body(tx: Transaction) -> tuple[list[AttemptRow], int]:
        return await tx.read(ATTEMPTS_BINDING, keys), await tx.now_us()

    rows, now_us = await ledger.store.run(body, write=False)
    return {row.attempt_id: row for row in rows}, now_us


def _attempt_ids(initial: World, trace: Sequence[tuple[Step, World]]) -> list[str | None]:
    """Each generation's attempt ID, as the trace's rows name it (None: never prepared)."""
    ids: list[str | None] = [None] * len(initial.rows)
    for _, world in trace:
        for generation, row in enumerate(world.rows):
            ids[generation] = ids[generation] or (None if row is None else row.attempt_id)
    return ids


async def _replay(db_url: str, initial: World, trace: Sequence[tuple[Step, World]]) -> list[ReplayedStep]:
    ledger = AttemptLedger(db_url)
    ids = _attempt_ids(initial, trace)
    replayed: list[ReplayedStep] = []
    try:
        previous = initial
        for number, (step, world) in enumerate(trace, start=1):
            action = step.action + (f" {step.detail}" if step.detail else "")
            # The clock stepped on: every stored instant moves back as much.
            await shift_instants(db_url, _INSTANT_COLUMNS, world.now_us - previous.now_us)
            if world.last is None:
                replayed.append(ReplayedStep(number, step.actor, action, "-", "-"))
            else:
                generation, command, decision = world.last
                attempt_id = ids[generation]
                assert attempt_id is not None  # a decided step names a prepared (or preparing) row
                kernel = kernel_answer(decision)
                database = await _answer(ledger, command, attempt_id, world.now_us)
                replayed.append(ReplayedStep(number, step.actor, action, kernel, database))
            stored, database_now = await _read_stored(ledger, ids)
            replayed.append(ReplayedStep(number, "", "stored", *_stored_line(world, stored, database_now, ids)))
            previous = world
    finally:
        await ledger.close()
    return replayed


def replay_attempt_trace(db_url: str, initial: World, trace: Sequence[tuple[Step, World]]) -> list[ReplayedStep]:
    """Replay ``trace`` (from ``initial``) against the migrated, empty database
    ``db_url``; see the module's docstring."""
    parse_db_url(db_url)
    return asyncio.run(_replay(db_url, initial, trace))


# --- the script -----------------------------------------------------------------------------


def replay_script(initial: World, trace: Sequence[tuple[Step, World]], table: str) -> str:
    """A Python script that replays ``trace`` against the database its ``--db`` (or
    ``TENURE_DB``) names, in a scratch area it removes: exit 0 when the database answers
    every step and stores every row as the trace's kernel did, 1 when it does not, 2 when
    it cannot run."""
    import base64
    import pickle

    recorded = base64.b64encode(pickle.dumps((initial, tuple(trace)))).decode()
    return script_text("explore.replays.attempts", "the service-attempt machine", recorded, table)


def main(recorded: str, argv: Sequence[str]) -> int:
    """What a written attempt replay script runs (see :func:`replay_script`)."""
    return script_main(recorded, argv, lambda db_url, trace: replay_attempt_trace(db_url, *trace))
