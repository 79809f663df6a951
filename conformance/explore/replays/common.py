"""What the attempt and Run replays of explorer traces share (see
:mod:`tenure.conformance.explore.replays.attempts` and
:mod:`tenure.conformance.explore.replays.runs`; the queue's replay,
:mod:`tenure.conformance.explore.replays.queue`, came first and keeps its own).

- :func:`shift_instants`: a step of the world's clock moves every stored instant back by
  as much, in one transaction (the database clock cannot jump; moving every instant back
  is the same to every comparison the kernel makes with the time).
- :func:`answer_of`: what the database answered a command, in the words the trace uses
  for the kernel's decision (``applied``, ``refused <reason>``); a refusal that raises its
  error code (the adapters raise the conflicts a caller must see) is still a refusal.
- :func:`shape`: a stored row as the comparison sees it: every field as stored, but each
  instant only as unset, past (at or before now) or future. Every time guard of the
  kernels compares now with an instant this way, and the database's instants differ
  from the world's by construction.
- :func:`script_text` and :func:`script_main`: a written replay script and what it runs.

Why a replay's instants stay sound: every instant moves back by exactly the world's
steps of the clock, so an instant the database wrote (at its own now, later than the
world's clock reading it stands for) or a world instant translated onto the database's
clock when a command was sent is, when a later decision reads it, behind the world's by
the real time the replay took since then, never ahead. An instant at or before the
world's now is therefore at or before the database's; one after it stays after it as
long as it lies further ahead than that real time. The Run replay checks that last
condition at every step (a step it cannot hold is ``not replayable``); the attempt
worlds' only future instants are submit leases at least 60 s ahead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import sqlite3
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tenure.adapters.core.tables import Binding, instant_from_sqlite_text, instant_to_sqlite_text
from tenure.kernel.core import Applied, Decision, Machine
from tenure.model import TenureError

from tenure.conformance.lockstep import raw
from .queue import ReplayedStep, replay_table

__all__ = ["shift_instants", "instant_columns", "answer_of", "kernel_answer", "shape", "differing",
           "script_text", "script_main", "NOT_REPLAYABLE"]

NOT_REPLAYABLE = "not replayable"
"""The database's answer to a step it cannot follow (the replay ends there)."""


def instant_columns(bindings: Sequence[Binding]) -> list[tuple[str, str, str]]:
    """(table, key column, instant column) of every instant column of ``bindings``' tables."""
    return [(binding.spec.name, binding.key_column, name)
            for binding in bindings for name in sorted(binding.spec.instant_names)]


def _shift_sqlite(db_url: str, columns: Sequence[tuple[str, str, str]], by_us: int) -> None:
    # SQLite keeps SQLAlchemy's DATETIME text, so the arithmetic happens here.
    connection = sqlite3.connect(raw.sqlite_path(db_url))
    try:
        for table, key, column in columns:
            found = connection.execute(f"SELECT {key}, {column} FROM {table} WHERE {column} IS NOT NULL").fetchall()
            for row_key, value in found:
                moved = instant_to_sqlite_text(instant_from_sqlite_text(value) - by_us)
                connection.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (moved, row_key))
        connection.commit()
    finally:
        connection.close()


async def _shift_postgresql(db_url: str, columns: Sequence[tuple[str, str, str]], by_us: int) -> None:
    connection = await raw.connect(db_url)
    try:
        async with connection.transaction():
            await raw.in_schema(connection, db_url)
            for table, _, column in columns:
                await connection.execute(f"UPDATE {table} SET {column} = {column} - $1::bigint * interval '1 microsecond' "
                                         f"WHERE {column} IS NOT NULL", by_us)
    finally:
        await connection.close()


async def shift_instants(db_url: str, columns: Sequence[tuple[str, str, str]], by_us: int) -> None:
    """Move every stored instant of ``columns`` back by ``by_us``, in one transaction."""
    if by_us == 0:
        return
    if raw.kind_of(db_url) == "sqlite":
        await asyncio.to_thread(_shift_sqlite, db_url, columns, by_us)
    else:
        await _shift_postgresql(db_url, columns, by_us)


def kernel_answer(decision: Decision) -> str:
    """A kernel decision in the replay's words."""
    return "applied" if isinstance(decision, Applied) else f"refused {decision.reason.value}"


async def answer_of(machine: Machine, send: Callable[[], Awaitable[Decision]]) -> str:
    """What the database answered: ``applied``, ``refused <reason>`` (whether the adapter
    answered the refusal or raised its error code), or another error's code."""
    refusal_codes = {code for code in machine.outcomes.values() if code is not None}
    try:
        decision = await send()
    except TenureError as error:
        return f"refused {error.reason}" if error.code in refusal_codes else error.code.value
    return kernel_answer(decision)


def _instant(value: int | None, now_us: int) -> str:
    return "unset" if value is None else "past" if value <= now_us else "future"


def shape(row: Any, now_us: int) -> dict[str, Any]:
    """Every field of ``row`` (a kernel record), each instant (``*_us``) as unset, past
    or future at ``now_us``."""
    return {field.name: _instant(getattr(row, field.name), now_us) if field.name.endswith("_us")
            else getattr(row, field.name) for field in dataclasses.fields(row)}


def differing(expected: dict[str, Any], got: dict[str, Any]) -> str:
    """`` [differs: field, ...]`` naming the fields whose values differ (empty: none)."""
    names = [name for name in expected if expected[name] != got.get(name)]
    return f" [differs: {', '.join(names)}]" if names else ""


# --- the script -----------------------------------------------------------------------------


def script_text(module: str, describe: str, recorded: str, table: str) -> str:
    """A replay script's text: its docstring (what it replays, ``describe``, and the
    trace's ``table``), then a call of ``tenure.conformance.<module>.main`` on the
    recorded trace."""
    lines = "\n".join("    " + line for line in table.splitlines()).replace(chr(34) * 3, chr(39) * 3)
    return f'''#!/usr/bin/env python3
r"""An explorer trace of {describe}, replayed against a database in lockstep.

    python {{this file}} --db URL        (or TENURE_DB=URL python {{this file}})

The trace is embedded below as pickled kernel values (base64): it is read back only
under the tenure install that wrote this file (the same version, with the same classes),
as data tenure itself wrote; never run a replay script of unknown origin.

The trace (recorded with the tenure version that wrote this file):
{lines}
"""
import sys

from tenure.conformance.{module} import main

TRACE = "{recorded}"

if __name__ == "__main__":
    sys.exit(main(TRACE, sys.argv[1:]))
'''


def script_main(recorded: str, argv: Sequence[str], replay: Callable[[str, Any], list[ReplayedStep]]) -> int:
    """What a written replay script runs: read the recorded trace back, make a scratch
    area in the database ``--db`` names, ``replay(url, trace)`` there, print the table,
    drop the area. Exit 0 when the database answered and stored every step as the
    trace's kernel did, 1 when it did not (or could not follow it), 2 when it cannot run."""
    import argparse
    import base64
    import os
    import pickle

    from tenure.conformance.drivers.scratch import ScratchRefused, open_scratch

    parser = argparse.ArgumentParser(description="Replay an explorer trace against a database.")
    parser.add_argument("--db", default=None, help="database URL (default: $TENURE_DB)")
    arguments = parser.parse_args(list(argv))
    db_url = arguments.db or os.environ.get("TENURE_DB")
    if not db_url:
        print("replay refused: --db or TENURE_DB names the database", file=sys.stderr)
        return 2
    trace = pickle.loads(base64.b64decode(recorded))  # noqa: S301 - the file tenure itself wrote
    try:
        area = asyncio.run(open_scratch(db_url))
    except ScratchRefused as refused:
        print(f"replay refused: {refused.reason}", file=sys.stderr)
        return 2
    try:
        steps = replay(area.acquire(pathlib.Path(".")), trace)
    finally:
        asyncio.run(area.drop())
    print(replay_table(steps))
    agrees = all(step.agrees or step.kernel == "-" for step in steps)
    if any(step.database == NOT_REPLAYABLE for step in steps):
        print("the database could not follow the trace past the step marked not replayable")
    else:
        print("the database answered every step as the trace's kernel decided" if agrees
              else "the database departed from the trace (marked <--)")
    return 0 if agrees else 1
