"""``defer_many`` is one transaction however many runs it carries, on every database: a
conflict or a database failure anywhere in a call of more than 1,000 runs writes nothing
of it, so the whole call can simply be repeated (and a repeated call of plain runs then
writes each run once)."""

from __future__ import annotations

import urllib.parse
from typing import Any

import aiosqlite
import asyncpg
import pytest

from adapter_support import kind_of, raw
from tenure.adapters import TaskApp, TaskContext
from tenure.model import ConfigValidationError, TenureError, WorkerConfig

RUNS = 1500
"""More than one chunk of 1,000 (the most one statement batch carries)."""

FAILING_RUN = 1200
"""A run of the second chunk."""


def make_app(db_url: str) -> tuple[TaskApp, Any]:
    app = TaskApp(db_url, config=WorkerConfig(db_url, lease_seconds=30, heartbeat_seconds=10))

    @app.task(queue="emails", name="send_welcome")
    async def send_welcome(ctx: TaskContext, user_id: int) -> None: ...

    return app, send_welcome


def fail_inserting(db_url: str, user_id: int) -> None:
    """A trigger that fails the INSERT of the run for ``user_id`` (a database failure in
    the middle of a call, after earlier runs were written in its transaction)."""
    match = f'%"user_id":{user_id}}}%'
    if kind_of(db_url) == "sqlite":
        raw(db_url, f"CREATE TRIGGER fail_one BEFORE INSERT ON tenure_tasks WHEN NEW.args_json LIKE '{match}' "
                    "BEGIN SELECT RAISE(ABORT, 'injected'); END")
        return
    raw(db_url, "CREATE FUNCTION fail_one() RETURNS trigger LANGUAGE plpgsql AS "
                f"$$ BEGIN IF NEW.args_json::text LIKE '{match}' THEN RAISE EXCEPTION 'injected'; END IF; "
                "RETURN NEW; END $$")
    raw(db_url, "CREATE TRIGGER fail_one BEFORE INSERT ON tenure_tasks FOR EACH ROW EXECUTE FUNCTION fail_one()")


def stop_failing(db_url: str) -> None:
    raw(db_url, "DROP TRIGGER fail_one" if kind_of(db_url) == "sqlite" else "DROP TRIGGER fail_one ON tenure_tasks")


def count(db_url: str) -> int:
    return int(raw(db_url, "SELECT count(*) FROM tenure_tasks")[0][0])


async def test_a_conflict_in_a_later_chunk_writes_nothing_of_the_call(db_url: str) -> None:
    app, send_welcome = make_app(db_url)
    async with app:
        original = await send_welcome.defer(user_id=-1, submission_id=f"welcome-{FAILING_RUN}")
        runs = [{"user_id": n} for n in range(RUNS)]
        ids = [f"welcome-{n}" for n in range(RUNS)]
        with pytest.raises(TenureError) as conflict:
            await send_welcome.defer_many(runs, submission_ids=ids)  # welcome-1200 changed its arguments
        assert conflict.value.reason == "fingerprint_mismatch"
        assert count(db_url) == 1
        runs[FAILING_RUN] = {"user_id": -1}  # the original request: a replay
        written = await send_welcome.defer_many(runs, submission_ids=ids)
        assert len(written) == RUNS and written[FAILING_RUN] == original and len(set(written)) == RUNS
        assert count(db_url) == RUNS


async def test_a_database_failure_in_a_later_chunk_writes_nothing_and_the_call_can_be_repeated(db_url: str) -> None:
    app, send_welcome = make_app(db_url)
    async with app:
        runs = [{"user_id": n} for n in range(RUNS)]
        fail_inserting(db_url, FAILING_RUN)
        with pytest.raises(TenureError):
            await send_welcome.defer_many(runs)  # plain runs: no submission ID
        assert count(db_url) == 0
        stop_failing(db_url)
        written = await send_welcome.defer_many(runs)
        assert len(set(written)) == RUNS
        assert count(db_url) == RUNS


async def test_a_submission_id_given_twice_in_one_call_is_refused_before_anything_is_written(db_url: str) -> None:
    app, send_welcome = make_app(db_url)
    async with app:
        ids = [f"welcome-{n}" for n in range(RUNS)]
        ids[FAILING_RUN] = "welcome-3"  # the same ID in the first chunk and in the second
        with pytest.raises(ConfigValidationError) as refused:
            await send_welcome.defer_many([{"user_id": n} for n in range(RUNS)], submission_ids=ids)
        assert refused.value.fields == ("submission_ids",) and refused.value.problems == ("duplicate_submission_id",)
        assert count(db_url) == 0


async def test_in_the_callers_transaction_a_conflict_in_a_later_chunk_writes_none_of_the_runs(db_url: str) -> None:
    """The caller may still commit its transaction after the conflict: none of the call's
    runs is in it (every run is decided before the first is written)."""
    app, send_welcome = make_app(db_url)
    async with app:
        await send_welcome.defer(user_id=-1, submission_id=f"welcome-{FAILING_RUN}")
        runs = [{"user_id": n} for n in range(RUNS)]
        ids = [f"welcome-{n}" for n in range(RUNS)]
        if kind_of(db_url) == "sqlite":
            connection: Any = await aiosqlite.connect(urllib.parse.urlsplit(db_url).path, isolation_level=None)
        else:
            connection = await asyncpg.connect(db_url)
        try:
            await connection.execute("BEGIN")
            with pytest.raises(TenureError) as conflict:
                await send_welcome.defer_many(runs, submission_ids=ids, using=connection)
            assert conflict.value.reason == "fingerprint_mismatch"
            await connection.execute("COMMIT")
        finally:
            await connection.close()
        assert count(db_url) == 1
