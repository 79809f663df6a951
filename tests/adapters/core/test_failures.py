"""Failures say what happened and what to do, and every one is the documented error.

Each database failure becomes ``TenureError(QUEUE_PERSISTENCE_FAILED, reason)`` at one
boundary per store, whatever the driver raised (even an exception class nobody listed);
each cause has its own reason word; calls are bounded in time; a closed source stays
closed. Faults come from the driver (patched to raise), a stalling TCP proxy in front of
the real server, a second connection holding SQLite's write lock, and mistyped targets.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from adapter_support import kind_of, raw, row, sqlite_path
from stalling_proxy import stalling_proxy
import paths
from tenure.adapters import StreamingJobSource, ValidationJobSource
from tenure.adapters.core.failures import REASONS, RETRY_SAFE
from tenure.model import (
    ConfigValidationError,
    ErrorCode,
    QueueKind,
    StreamingJob,
    TenureError,
    ValidationJob,
    WorkerConfig,
)

ROOT = paths.ROOT
REQUEST = ValidationJob("orders", "1.0.0", "orders.jsonl")


def config(db_url: str, **changes: Any) -> WorkerConfig:
    return WorkerConfig(db_url, **{"lease_seconds": 30, "heartbeat_seconds": 10, **changes})


async def failure_of(call: Any) -> TenureError:
    with pytest.raises(TenureError) as caught:
        await call
    error = caught.value
    assert error.code is ErrorCode.QUEUE_PERSISTENCE_FAILED, error
    assert error.reason in REASONS
    assert error.__cause__ is None and error.__context__ is None, "no driver exception rides along"
    return error


# --- the documented reasons --------------------------------------------------------------


def test_the_docs_list_exactly_the_reasons_a_persistence_failure_can_carry() -> None:
    page = (ROOT / "docs" / "errors.md").read_text()
    section = page.split("\n## Failure reasons\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE))
    assert listed == set(REASONS)
    for reason in REASONS:
        line = next(line for line in section.splitlines() if line.startswith(f"| `{reason}` |"))
        assert ("| yes |" in line) == (reason in RETRY_SAFE), reason


async def test_a_missing_sqlite_folder_is_database_missing_and_creates_nothing(tmp_path: pathlib.Path) -> None:
    async with ValidationJobSource(f"sqlite:///{tmp_path}/no-such-folder/queue.db") as source:
        assert (await failure_of(source.get_job("job-1"))).reason == "database_missing"
    assert list(tmp_path.iterdir()) == []


async def test_a_postgresql_database_that_does_not_exist_is_database_missing(pg_dsn: str) -> None:
    url = pg_dsn.rsplit("/", 1)[0] + "/tenure_no_such_database"
    async with ValidationJobSource(url) as source:
        assert (await failure_of(source.get_job("job-1"))).reason == "database_missing"


async def test_a_server_that_refuses_connections_is_connection_refused() -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with ValidationJobSource(f"postgresql://postgres@127.0.0.1:{port}/postgres") as source:
        assert (await failure_of(source.get_job("job-1"))).reason == "connection_refused"


async def test_an_unknown_postgresql_role_is_authentication_failed(pg_dsn: str) -> None:
    url = pg_dsn.replace("postgres@", "tenure_no_such_role@", 1)
    async with ValidationJobSource(url) as source:
        assert (await failure_of(source.get_job("job-1"))).reason == "authentication_failed"


async def test_an_unmigrated_database_is_schema_missing(fresh_db_url: str) -> None:
    if kind_of(fresh_db_url) == "sqlite":
        sqlite3.connect(sqlite_path(fresh_db_url)).close()
    async with ValidationJobSource(fresh_db_url) as source:
        assert (await failure_of(source.claim_next_owned("worker-a", claim_token="t-1"))).reason == "schema_missing"
        assert (await failure_of(source.submit_owned(REQUEST, submission_id="s-1"))).reason == "schema_missing"


def test_the_cli_says_what_to_do_and_a_failed_sqlite_open_leaves_no_stray_traceback(tmp_path: pathlib.Path) -> None:
    script = (
        "import asyncio\n"
        "from tenure.adapters import ValidationJobSource\n"
        "from tenure.model import TenureError\n"
        "async def main():\n"
        f"    async with ValidationJobSource('sqlite:///{tmp_path}/missing/queue.db') as source:\n"
        "        try:\n"
        "            await source.get_job('job-1')\n"
        "        except TenureError as error:\n"
        "            print(error.reason)\n"
        "asyncio.run(main())\n"
    )
    api = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert api.stdout.strip() == "database_missing" and api.stderr == "", api.stderr
    cli = subprocess.run(
        [sys.executable, "-m", "tenure.apps.cli", "migrate", "--db", f"sqlite:///{tmp_path}/missing/queue.db"],
        capture_output=True, text=True, timeout=60,
    )
    assert cli.returncode == 1
    assert "database_missing" in cli.stdout and "folder" in cli.stdout, cli.stdout
    assert "Traceback" not in cli.stderr and "Event loop is closed" not in cli.stderr, cli.stderr


# --- one boundary: whatever the driver raises ----------------------------------------------


class NovelDriverError(Exception):
    """An exception class no store has ever heard of, carrying text that must not leak."""


def _failing(kind: str, exception: Exception, statement: str, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Make the driver raise ``exception`` at the next statement starting with
    ``statement`` ("CONNECT" for opening a connection); returns the arming function."""
    armed = {"on": False}

    def arm() -> None:
        armed["on"] = True

    def take(sql: str) -> bool:
        if armed["on"] and sql.lstrip().upper().startswith(statement.upper()):
            armed["on"] = False
            return True
        return False

    if kind == "sqlite":
        from tenure.adapters.sqlite import store as sqlite_store

        original = sqlite_store._statement
        original_connect = sqlite_store._connect

        def execute(connection: Any, sql: str, parameters: Any) -> Any:
            if take(sql):
                raise exception
            return original(connection, sql, parameters)

        def connect(*args: Any, **kwargs: Any) -> Any:
            if take("CONNECT"):
                raise exception
            return original_connect(*args, **kwargs)

        monkeypatch.setattr(sqlite_store, "_statement", execute)
        monkeypatch.setattr(sqlite_store, "_connect", connect)
        return arm
    import asyncpg

    original_fetch = asyncpg.Connection.fetch
    original_execute = asyncpg.Connection.execute
    original_pg_connect = asyncpg.connect

    async def fetch(self: Any, sql: str, *args: Any, **kwargs: Any) -> Any:
        if take(sql):
            raise exception
        return await original_fetch(self, sql, *args, **kwargs)

    async def pg_execute(self: Any, sql: str, *args: Any, **kwargs: Any) -> Any:
        if take(sql):
            raise exception
        return await original_execute(self, sql, *args, **kwargs)

    async def pg_connect(*args: Any, **kwargs: Any) -> Any:
        if take("CONNECT"):
            raise exception
        return await original_pg_connect(*args, **kwargs)

    monkeypatch.setattr(asyncpg.Connection, "fetch", fetch)
    monkeypatch.setattr(asyncpg.Connection, "execute", pg_execute)
    monkeypatch.setattr(asyncpg, "connect", pg_connect)
    return arm


def _known_driver_error(kind: str) -> Exception:
    """An exception the driver really raises mid-call (PostgreSQL: the one seen while the
    server terminated backends four times a second)."""
    if kind == "sqlite":
        return sqlite3.DatabaseError("disk image is malformed: secret-payload-text")
    import asyncpg

    return asyncpg.InternalClientError("cannot switch to state 15; another operation is in progress")


POINTS = {
    "connect": "CONNECT",
    "begin": "BEGIN",
    "locking statement": {"sqlite": "SELECT", "postgresql": "WITH locked"},
    "write": "UPDATE",
    "commit": "COMMIT",
    "one statement or clock": {"sqlite": "UPDATE tenure_clock", "postgresql": "WITH locked"},
}
"""Where a heartbeat meets the driver. On PostgreSQL a fenced write is one decided-ahead
statement (``WITH locked``, as the transaction's locking statement begins); the transaction points are met by a batch that names one
fence twice, which runs as a transaction. On SQLite every write is a transaction, whose
clock statement is a point of its own; a fenced write decides from the row last seen
without reading it, so its locking statement is met by that batch too."""


@pytest.mark.parametrize("point", list(POINTS))
@pytest.mark.parametrize("novel", [True, False], ids=["unknown-exception-class", "known-driver-exception"])
async def test_any_driver_exception_at_any_point_becomes_the_documented_error(
    db_url: str, point: str, novel: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kind = kind_of(db_url)
    statement = POINTS[point] if isinstance(POINTS[point], str) else POINTS[point][kind]  # type: ignore[index]
    exception = NovelDriverError("secret-payload-text") if novel else _known_driver_error(kind)
    source = ValidationJobSource(db_url, config(db_url))
    try:
        await source.submit_owned(REQUEST, submission_id="s-0")
        claimed = await source.claim_next_owned("worker-a", claim_token="t-0")
        assert claimed is not None
        if point == "connect":
            await source.close()  # a new source must open its first connection
            source = ValidationJobSource(db_url, config(db_url))
        _failing(kind, exception, statement, monkeypatch)()
        fence = claimed.claim_fence
        in_transaction = ((kind == "postgresql" and point in ("begin", "locking statement", "write", "commit"))
                          or (kind == "sqlite" and point == "locking statement"))
        with caplog.at_level(logging.DEBUG, logger="tenure.adapters"):
            if in_transaction:
                error = await failure_of(source.heartbeat_many_owned([fence, fence]))
            else:
                error = await failure_of(source.heartbeat_owned(fence))
        if point == "commit" or (point == "one statement or clock" and kind == "postgresql"):
            # The outcome is unknown: the write may have committed.
            assert error.reason == "commit_unacknowledged"
        elif novel or kind == "sqlite":
            assert error.reason == "unavailable"
        else:
            assert error.reason == ("connection_refused" if point == "connect" else "connection_lost")
        assert "secret-payload-text" not in str(error) + repr(error) + caplog.text
        assert "state 15" not in str(error) + caplog.text
        assert type(exception).__name__ in caplog.text, "the debug log names the driver's exception class"
        monkeypatch.undo()
        # The source keeps working: a connection that failed is never reused.
        assert await source.heartbeat_owned(claimed.claim_fence) is True
    finally:
        await source.close()


async def test_a_failing_rollback_after_a_conflict_still_raises_the_conflict(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with ValidationJobSource(db_url, config(db_url)) as source:
        await source.submit_owned(REQUEST, submission_id="s-1")
        arm = _failing(kind_of(db_url), NovelDriverError("secret"), "ROLLBACK", monkeypatch)
        arm()
        with pytest.raises(TenureError) as caught:
            await source.submit_owned(ValidationJob("orders", "2.0.0", "orders.jsonl"), submission_id="s-1")
        assert caught.value.code is ErrorCode.QUEUE_SUBMISSION_CONFLICT
        monkeypatch.undo()
        assert await source.get_job((await source.list_jobs())[0].job_id) is not None


# --- timeouts ------------------------------------------------------------------------------

BOUND_GUARD_S = 15.0
"""The calls below are configured with a bound of a second or less, and what they wait on
(a frozen server, a write lock held) would never answer: only the configured bound can
end them. This guard, fifteen times the bound and half of ``WorkerConfig``'s 30 s default,
fails a call the bound did not end (a hang, or the default bound applied instead), and a
loaded machine stays far inside it: no timing is asserted."""


async def within_the_bound(call: Any) -> TenureError:
    return await asyncio.wait_for(failure_of(call), BOUND_GUARD_S)


@pytest.mark.parametrize("database", ["postgresql"])
async def test_a_frozen_server_fails_calls_with_timeout_within_the_bound(db_url: str) -> None:
    async with stalling_proxy(db_url) as (proxy, through):
        async with ValidationJobSource(through, config(through, timeout_seconds=1)) as source:
            await source.submit_owned(REQUEST, submission_id="s-1")
            claimed = await source.claim_next_owned("worker-a", claim_token="t-1")
            assert claimed is not None
            proxy.freeze()
            error = await within_the_bound(source.heartbeat_owned(claimed.claim_fence))
            # A fenced write is one autocommit statement: once sent, a timeout leaves its
            # outcome unknown (it may have committed), which is what the reason says.
            assert error.reason == "commit_unacknowledged"
            error = await within_the_bound(source.submit_owned(REQUEST, submission_id="s-2"))
            assert error.reason == "timeout"  # a transaction: never committed
            # The timed-out connection was dropped: the next call must connect anew,
            # and connecting through the frozen network is bounded too.
            assert (await within_the_bound(source.get_job(claimed.job_id))).reason == "timeout"
            proxy.thaw()
            assert await source.heartbeat_owned(claimed.claim_fence) is True


@pytest.mark.parametrize("database", ["postgresql"])
async def test_a_commit_whose_answer_never_arrives_is_unacknowledged_and_replay_recovers(db_url: str) -> None:
    async with stalling_proxy(db_url) as (proxy, through):
        async with ValidationJobSource(through, config(through, timeout_seconds=1)) as source:
            await source.get_job("warm-up")  # the first connection is open
            proxy.freeze_answers_after(b"COMMIT")
            error = await within_the_bound(source.submit_owned(REQUEST, submission_id="s-1"))
            assert error.reason == "commit_unacknowledged"
            proxy.thaw()
            job_id = await source.submit_owned(REQUEST, submission_id="s-1")  # the replay
            assert len(raw(db_url, "SELECT id FROM validation_jobs")) == 1
            assert (await source.get_job(job_id)).submission_id == "s-1"


@pytest.mark.parametrize("database", ["sqlite"])
async def test_a_sqlite_write_lock_held_past_the_bound_fails_with_timeout(db_url: str) -> None:
    blocker = sqlite3.connect(sqlite_path(db_url), isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        async with ValidationJobSource(db_url, config(db_url, timeout_seconds=0.5)) as source:
            error = await within_the_bound(source.submit_owned(REQUEST, submission_id="s-1"))
            assert error.reason == "timeout"
            blocker.execute("ROLLBACK")
            assert await source.submit_owned(REQUEST, submission_id="s-1")
    finally:
        blocker.close()


# --- closing ---------------------------------------------------------------------------------


async def test_close_is_final_and_a_second_close_is_harmless(db_url: str) -> None:
    source = ValidationJobSource(db_url, config(db_url))
    await source.submit_owned(REQUEST, submission_id="s-1")
    await source.close()
    for call in (source.get_job("job-1"), source.claim_next_owned("worker-a", claim_token="t-1"),
                 source.submit_owned(REQUEST, submission_id="s-2")):
        with pytest.raises(ConfigValidationError) as caught:
            await call
        assert caught.value.reason == "source_closed"
    await source.close()
    assert len(raw(db_url, "SELECT id FROM validation_jobs")) == 1, "nothing was written after close"


# --- bounds ------------------------------------------------------------------------------------


def test_numbers_too_large_for_a_float_are_refused_as_config_errors() -> None:
    for field in ("lease_seconds", "heartbeat_seconds", "timeout_seconds"):
        with pytest.raises(ConfigValidationError) as caught:
            WorkerConfig("sqlite:///x.db", **{field: 10**400})
        assert caught.value.fields == (field,) and caught.value.problems == ("number_out_of_range",)


async def test_payloads_results_and_errors_over_the_bound_are_refused_and_nothing_is_written(db_url: str) -> None:
    limit = 4096
    async with ValidationJobSource(db_url, config(db_url, max_payload_bytes=limit)) as source:
        big = {"blob": "x" * limit}
        with pytest.raises(ConfigValidationError) as caught:
            source.submit_owned(ValidationJob("orders", "1.0.0", "orders.jsonl", options=big), submission_id="s-1")
        assert caught.value.fields == ("job",) and caught.value.problems == ("payload_too_large",)
        with pytest.raises(ConfigValidationError):
            await source.submit(ValidationJob("orders", "1.0.0", "orders.jsonl", options=big))
        # Multi-byte text counts in bytes: 1,100 four-byte characters exceed 4,096 bytes.
        with pytest.raises(ConfigValidationError):
            source.submit_owned(ValidationJob("orders", "1.0.0", "\U0001F600" * 1100), submission_id="s-2")
        assert raw(db_url, "SELECT id FROM validation_jobs") == []
        await source.submit_owned(REQUEST, submission_id="s-3")
        claimed = await source.claim_next_owned("worker-a", claim_token="t-1")
        with pytest.raises(ConfigValidationError) as caught:
            await source.complete_owned(claimed.claim_fence, big)
        assert caught.value.fields == ("result",)
        with pytest.raises(ConfigValidationError) as caught:
            await source.fail_owned(claimed.claim_fence, "e" * (limit + 1), retry=True)
        assert caught.value.fields == ("error",)
        assert row(db_url, QueueKind.VALIDATION, claimed.job_id)["status"] == "claimed"
        assert await source.complete_owned(claimed.claim_fence, {"small": True})


def test_the_default_payload_bound_is_one_mebibyte() -> None:
    assert WorkerConfig("sqlite:///x.db").max_payload_bytes == 1024 * 1024


async def test_a_streaming_source_refuses_an_oversized_launch_too(db_url: str) -> None:
    async with StreamingJobSource(db_url, config(db_url, max_payload_bytes=1024)) as source:
        with pytest.raises(ConfigValidationError):
            source.submit_owned(StreamingJob("feed", "1", {"v": "x" * 2000}), submission_id="s-1")


async def test_purge_with_an_age_beyond_a_century_is_refused(db_url: str) -> None:
    import datetime as dt

    async with ValidationJobSource(db_url, config(db_url)) as source:
        with pytest.raises(ConfigValidationError):
            await source.purge_finished(dt.timedelta.max)


