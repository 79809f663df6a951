"""The SQLite store's one-hop transactions.

An operation's whole transaction (BEGIN, its statements and kernel decisions, COMMIT)
runs in one hop to aiosqlite's connection thread, through aiosqlite's private
``Connection._execute``. These tests pin that private API (an aiosqlite release that
renames it fails here, not in production), count the hops, and prove the hop is still a
transaction: a call cancelled mid-way, a failing statement and a body that awaits
something else all leave nothing written.
"""

from __future__ import annotations

import asyncio
import inspect
import pathlib
import sqlite3
import threading
from typing import Any

import aiosqlite
import pytest

from adapter_support import raw
from tenure.adapters import ValidationJobSource, upgrade
from tenure.adapters.sqlite import store as sqlite_store
from tenure.adapters.sqlite.store import SqliteStore
from tenure.model import TenureError, ValidationJob, WorkerConfig


@pytest.fixture
async def sqlite_url(tmp_path: pathlib.Path) -> str:
    url = f"sqlite:///{tmp_path}/queue.db"
    await upgrade(url)
    return url


def source_for(url: str) -> ValidationJobSource:
    return ValidationJobSource(url, WorkerConfig(url, lease_seconds=30, heartbeat_seconds=10))


def job(job_id: str) -> ValidationJob:
    return ValidationJob("orders", "1", f"{job_id}.jsonl", job_id=job_id)


async def test_aiosqlite_runs_functions_in_its_connection_thread() -> None:
    """The private API the store relies on: ``_execute(fn, *args)`` is a coroutine
    function that runs ``fn`` in the one thread where the connection's public methods
    run, and ``_conn`` is the sqlite3 connection."""
    assert inspect.iscoroutinefunction(aiosqlite.Connection._execute)  # noqa: SLF001
    connection = await aiosqlite.connect(":memory:")
    try:
        seen: list[int] = []

        def here(value: int) -> int:
            seen.append(threading.get_ident())
            return value * 2

        assert await connection._execute(here, 21) == 42  # noqa: SLF001
        assert seen and seen[0] != threading.get_ident()
        raw_connection = connection._conn  # noqa: SLF001
        await connection.execute("CREATE TABLE t (x)")
        await connection.execute("INSERT INTO t VALUES (1)")

        def count() -> int:
            seen.append(threading.get_ident())
            return int(raw_connection.execute("SELECT count(*) FROM t").fetchone()[0])

        assert await connection._execute(count) == 1  # noqa: SLF001
        assert seen[0] == seen[1]
    finally:
        await connection.close()


async def test_the_stores_connection_runs_in_a_daemon_thread(sqlite_url: str) -> None:
    """The private shape the store relies on to keep a program's exit free: the thread that
    runs an aiosqlite connection is the connection itself (before 0.22) or its
    ``_thread`` (0.22 on), and the store's is a daemon (a non-daemon thread would keep
    a program that never closed its source alive; tests/adapters/tasks/test_process_exit.py)."""
    source = source_for(sqlite_url)
    try:
        await source.submit_owned(job("a"), submission_id="s-a")  # opens the connection
        connection = source._operations.store._connection  # noqa: SLF001
        thread = getattr(connection, "_thread", connection)
        assert isinstance(thread, threading.Thread) and thread.is_alive() and thread.daemon
    finally:
        await source.close()
    await asyncio.to_thread(thread.join, 60)  # a hang guard: close() ends the thread
    assert not thread.is_alive()


async def test_each_operation_is_one_hop(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Submit, claim, heartbeat and complete each cross to the connection's thread once
    (the connection's first opening aside), whatever their number of statements."""
    hops: list[str] = []
    statements: list[str] = []
    original_execute = aiosqlite.Connection._execute  # noqa: SLF001
    original_statement = sqlite_store._statement  # noqa: SLF001

    async def counting_execute(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__name__", "?"))
        return await original_execute(self, fn, *args, **kwargs)

    def counting_statement(connection: Any, sql: str, parameters: Any) -> Any:
        statements.append(sql)
        return original_statement(connection, sql, parameters)

    source = source_for(sqlite_url)
    try:
        await source.submit_owned(job("warm"), submission_id="s-warm")  # opens the connection
        monkeypatch.setattr(aiosqlite.Connection, "_execute", counting_execute)
        monkeypatch.setattr(sqlite_store, "_statement", counting_statement)
        counts: list[tuple[int, int]] = []
        for call in (
            lambda: source.submit_owned(job("a"), submission_id="s-a"),
            lambda: source.claim_next_owned("worker", claim_token="t-1"),
        ):
            hops.clear(), statements.clear()
            claimed = await call()
            counts.append((len(hops), len(statements)))
        assert claimed is not None
        fence = claimed.claim_fence
        assert fence is not None
        hops.clear(), statements.clear()
        assert await source.heartbeat_owned(fence)
        counts.append((len(hops), len(statements)))
        hops.clear(), statements.clear()
        assert await source.complete_owned(fence, {"rows": 1})
        counts.append((len(hops), len(statements)))
    finally:
        await source.close()
    assert [h for h, _ in counts] == [1, 1, 1, 1], counts
    assert all(s >= 4 for _, s in counts), counts  # BEGIN, clock, work, COMMIT at least


async def test_a_call_cancelled_during_its_hop_writes_nothing(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread runs the transaction on while the caller is cancelled; it sees the
    cancellation before COMMIT and rolls back, and the store stays usable."""
    entered, release = threading.Event(), threading.Event()
    original_statement = sqlite_store._statement  # noqa: SLF001

    def stalling_statement(connection: Any, sql: str, parameters: Any) -> Any:
        if sql.lstrip().upper().startswith("INSERT"):
            entered.set()
            release.wait(10)
        return original_statement(connection, sql, parameters)

    monkeypatch.setattr(sqlite_store, "_statement", stalling_statement)
    source = source_for(sqlite_url)
    try:
        call = asyncio.create_task(source.submit_owned(job("cancelled"), submission_id="s-c"))
        assert await asyncio.to_thread(entered.wait, 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        release.set()
        monkeypatch.setattr(sqlite_store, "_statement", original_statement)
        assert await source.submit_owned(job("after"), submission_id="s-after") == "after"
    finally:
        await source.close()
    ids = [r[0] for r in raw(sqlite_url, "SELECT id FROM validation_jobs ORDER BY id")]
    assert ids == ["after"]


async def test_a_failing_statement_rolls_the_whole_hop_back(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """COMMIT fails after the INSERT ran: nothing survives, the error is the documented
    one, and the next call works on the same store."""
    original_statement = sqlite_store._statement  # noqa: SLF001
    failed: list[str] = []

    def failing_commit(connection: Any, sql: str, parameters: Any) -> Any:
        if sql == "COMMIT" and not failed:
            failed.append(sql)
            raise aiosqlite.OperationalError("disk I/O error")
        return original_statement(connection, sql, parameters)

    monkeypatch.setattr(sqlite_store, "_statement", failing_commit)
    source = source_for(sqlite_url)
    try:
        with pytest.raises(TenureError) as raised:
            await source.submit_owned(job("lost"), submission_id="s-lost")
        assert raised.value.reason == "commit_unacknowledged"
        await source.submit_owned(job("kept"), submission_id="s-kept")
    finally:
        await source.close()
    assert [r[0] for r in raw(sqlite_url, "SELECT id FROM validation_jobs")] == ["kept"]


async def test_a_body_that_awaits_elsewhere_is_refused_and_rolled_back(sqlite_url: str) -> None:
    """A one-hop body may only await its transaction; awaiting anything else would block
    the connection's thread on the event loop, so it is a programming error, rolled back."""
    store = SqliteStore(sqlite_url.split(":///", 1)[1])

    async def body(transaction: Any) -> None:
        await transaction.execute("UPDATE tenure_clock SET high_water_us = 12345 WHERE id = 1")
        await asyncio.sleep(0)

    try:
        with pytest.raises(AssertionError):
            await store.run(body, write=True)

        async def high_water(transaction: Any) -> int:
            rows = await transaction.execute("SELECT high_water_us FROM tenure_clock")
            return int(rows[0][0])

        assert await store.run(high_water, write=False) == 0  # never migrated-then-used: still 0
    finally:
        await store.close()



def test_connections_that_open_a_file_at_once_all_switch_it_to_wal(tmp_path: pathlib.Path) -> None:
    """A migration leaves the journal mode alone, so the first connections to a migrated
    file switch it to WAL; two switching at once made SQLite answer one SQLITE_BUSY at
    once, without waiting (a ledger's first admission beside a polling worker failed
    ``timeout`` in CI). Four connections open each of 120 fresh files at the same
    instant (a barrier): every one opens, and every file ends in WAL mode."""
    failures: list[str] = []
    for index in range(120):
        path = str(tmp_path / f"open-{index}.db")
        sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()
        barrier = threading.Barrier(4)

        def open_at_once(path: str = path, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                sqlite_store._connect(path, create=False, busy_timeout_ms=5000, wal=True).close()  # noqa: SLF001
            except sqlite3.Error as error:
                failures.append(str(getattr(error, "sqlite_errorname", type(error).__name__)))

        threads = [threading.Thread(target=open_at_once) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert raw(f"sqlite:///{path}", "PRAGMA journal_mode") == [("wal",)]
    assert failures == []
