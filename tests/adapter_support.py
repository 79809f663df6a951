"""Helpers for the shared adapter suite: fresh databases and raw SQL the API cannot express.

Raw SQL here plays the part of an operator or a clock: moving a lease into the past,
reading a row exactly as stored, installing a trigger. Tests use it to set up
situations and to check results, never to bypass what they test.
"""

from __future__ import annotations

import contextlib
import pathlib
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from tenure.adapters.schema import TABLE_NAMES
from tenure.model import QueueKind


AVAILABLE_DATABASES = ["sqlite"]
"""Every database with a store; the shared suites run against each."""


def new_database(kind: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/queue.db"
    raise AssertionError(f"unknown database kind {kind}")


def prepare_machine_databases(kind: str, request: pytest.FixtureRequest) -> None:
    """Make ``new_database_for_machine`` work for ``kind`` (PostgreSQL needs its server)."""
    assert kind in AVAILABLE_DATABASES


def new_database_for_machine(kind: str, workdir: pathlib.Path) -> str:
    """A fresh, empty database for one state-machine run."""
    if kind == "sqlite":
        return f"sqlite:///{workdir}/lockstep.db"
    raise AssertionError(f"unknown database kind {kind}")


def drop_database_for_machine(kind: str, db_url: str) -> None:
    """Remove what new_database_for_machine made (SQLite files go with their folder)."""


def store_module(kind: str) -> Any:
    if kind == "sqlite":
        from tenure.adapters.sqlite import store

        return store
    raise AssertionError(f"unknown database kind {kind}")


@contextlib.contextmanager
def interfering_after_load(kind: str, queue: QueueKind, marker: str) -> Iterator[None]:
    """While active, every row the engine loads is changed by another writer right after
    the read (in the same transaction, as a trigger or a privileged session would): its
    error message becomes ``marker``."""
    module = store_module(kind)
    transaction_type = module.SqliteTransaction
    sql = f"UPDATE {table(queue)} SET error_message = ? WHERE id = ?"
    original = transaction_type.load

    async def load_then_interfere(self: Any, load_queue: QueueKind, job_id: str) -> Any:
        record = await original(self, load_queue, job_id)
        if record is not None:
            await self.execute(sql, [marker, job_id])
        return record

    transaction_type.load = load_then_interfere
    try:
        yield
    finally:
        transaction_type.load = original


def sqlite_path(db_url: str) -> str:
    return db_url.split(":///", 1)[1]


def raw(db_url: str, sql: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement outside the library and commit it."""
    if db_url.startswith("sqlite"):
        connection = sqlite3.connect(sqlite_path(db_url))
        try:
            rows = connection.execute(sql, parameters).fetchall()
            connection.commit()
            return rows
        finally:
            connection.close()
    raise AssertionError("unknown database")


def table(queue: QueueKind) -> str:
    return TABLE_NAMES[queue]


def expire_lease(db_url: str, queue: QueueKind, job_id: str, by_us: int = 3_600_000_000) -> None:
    """Move a claim's lease into the past (the clock ran on while the worker stalled)."""
    raw(db_url, f"UPDATE {table(queue)} SET lease_expires_at = lease_expires_at - ? WHERE id = ?", (by_us, job_id))


def row(db_url: str, queue: QueueKind, job_id: str) -> dict[str, Any] | None:
    from tenure.adapters.records import columns_for

    columns = columns_for(queue)
    found = raw(db_url, f"SELECT {', '.join(columns)} FROM {table(queue)} WHERE id = ?", (job_id,))
    return dict(zip(columns, found[0])) if found else None


def all_rows(db_url: str, queue: QueueKind) -> list[tuple[Any, ...]]:
    return raw(db_url, f"SELECT * FROM {table(queue)} ORDER BY id")
