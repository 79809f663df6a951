"""The server facts (tenure.conformance.drivers.facts) on SQLite, on PostgreSQL directly and
through a real PgBouncer in transaction mode: each fact passes where the server keeps
it, fails with its reason where it does not (a pooler dropping LISTEN and prepared
statements, a timeout shorter than the deadline, another isolation level, a clock
without its high-water mark), and nothing of the caller's is left changed.

PgBouncer: ``.ci/test-all.sh`` exports TEST_PGBOUNCER_DSN; run alone, the fixture starts
one with ``.ci/pgbouncer-start.sh`` in front of the test server. It never skips.
"""

from __future__ import annotations

import pathlib
import sqlite3
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tenure.adapters import upgrade
from tenure.conformance.drivers.facts import CHECKS, FACT_NAMES, Fact, check_server_facts
from tenure.model import ConfigValidationError
from tenure.model.errors import is_authored_word

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMA = "tenure_scratch"


def _named(dsn: str, database: str) -> str:
    return dsn.rsplit("/", 1)[0] + "/" + database


async def _on(dsn: str, sql: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(dsn)
    try:
        return list(await connection.fetch(sql))
    finally:
        await connection.close()


@pytest.fixture
async def server_database(pg_dsn: str) -> AsyncIterator[str]:
    """A new PostgreSQL database's name (dropped afterwards)."""
    name = "tenure_facts_" + uuid.uuid4().hex[:12]
    await _on(pg_dsn, f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        await _on(pg_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
async def scratch(pg_dsn: str, server_database: str) -> str:
    """A migrated scratch schema's direct URL, as `tenure conform` makes one."""
    url = _named(pg_dsn, server_database) + f"?schema={SCHEMA}"
    await upgrade(url)
    return url


async def _tables(pg_dsn: str, database: str) -> list[tuple[str, str]]:
    rows = await _on(_named(pg_dsn, database),
                     "SELECT schemaname, tablename FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', "
                     "'information_schema') ORDER BY 1, 2")
    return [(row[0], row[1]) for row in rows]


def by_name(facts: list[Fact]) -> dict[str, tuple[bool | None, str]]:
    assert [fact.name for fact in facts] == list(FACT_NAMES)
    assert all(is_authored_word(fact.reason) for fact in facts), facts
    return {fact.name: (fact.passed, fact.reason) for fact in facts}


def test_every_database_kind_has_a_check_for_every_fact() -> None:
    for kind, checks in CHECKS.items():
        assert tuple(checks) == FACT_NAMES, kind


# --- SQLite ----------------------------------------------------------------------------------


async def test_on_sqlite_the_clock_and_the_writer_lock_pass_and_the_server_facts_do_not_apply(
    tmp_path: pathlib.Path,
) -> None:
    url = f"sqlite:///{tmp_path}/scratch.db"
    await upgrade(url)
    before = sqlite3.connect(tmp_path / "scratch.db").execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall()
    facts = by_name(await check_server_facts(url))
    assert facts["clock_monotonic"] == (True, "monotonic_high_water_holds")
    assert facts["transaction_isolation"] == (True, "serializable_writers")
    for name in ("skip_locked", "advisory_locks", "listen_notify", "prepared_statements", "time_zone_irrelevant",
                 "statement_timeouts"):
        assert facts[name][0] is None, name
    after = sqlite3.connect(tmp_path / "scratch.db").execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall()
    assert after == before


async def test_on_sqlite_a_clock_without_its_high_water_mark_fails_when_the_wall_clock_steps_back(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A mutant of tenure's SQLite clock: the write transaction takes the process's wall
    # clock as it is, so a clock stepped back is seen stepped back.
    from tenure.adapters.sqlite import store

    url = f"sqlite:///{tmp_path}/scratch.db"
    await upgrade(url)
    monkeypatch.setattr(store, "_ADVANCE_CLOCK", "SELECT :wall")
    monkeypatch.setattr(store, "_READ_CLOCK", "SELECT :wall")
    facts = by_name(await check_server_facts(url))
    assert facts["clock_monotonic"] == (False, "clock_went_back_with_the_wall_clock")


# --- PostgreSQL, directly --------------------------------------------------------------------


async def test_on_postgresql_directly_every_fact_passes_and_only_tenures_tables_remain(
    scratch: str, pg_dsn: str, server_database: str,
) -> None:
    before = await _tables(pg_dsn, server_database)
    facts = by_name(await check_server_facts(scratch))
    assert facts == {
        "clock_monotonic": (True, "monotonic"),
        "transaction_isolation": (True, "read_committed"),
        "skip_locked": (True, "locked_row_skipped"),
        "advisory_locks": (True, "transaction_locks_exclude"),
        "listen_notify": (True, "delivered"),
        "prepared_statements": (True, "prepared_statements_kept"),
        "time_zone_irrelevant": (True, "instants_independent_of_time_zone"),
        "statement_timeouts": (True, "no_timeout_below_deadline"),
    }
    after = await _tables(pg_dsn, server_database)
    assert after == before and {schema for schema, _ in after} == {SCHEMA}


@pytest.mark.parametrize(("setting", "deadline", "expected"), [
    ("statement_timeout=1000", 5.0, (False, "statement_timeout_shorter_than_deadline")),
    ("lock_timeout=2000", 5.0, (False, "lock_timeout_shorter_than_deadline")),
    ("idle_in_transaction_session_timeout=1500", 2.0, (False, "idle_in_transaction_session_timeout_shorter_than_deadline")),
    ("statement_timeout=10000", 5.0, (True, "no_timeout_below_deadline")),
])
async def test_a_server_timeout_shorter_than_the_per_call_deadline_fails(
    scratch: str, setting: str, deadline: float, expected: tuple[bool, str],
) -> None:
    facts = by_name(await check_server_facts(f"{scratch}&{setting}", per_call_deadline_seconds=deadline))
    assert facts["statement_timeouts"] == expected


async def test_a_database_whose_transactions_default_to_repeatable_read_fails_the_isolation_fact(
    scratch: str, pg_dsn: str, server_database: str,
) -> None:
    await _on(pg_dsn, f"ALTER DATABASE {server_database} SET default_transaction_isolation = 'repeatable read'")
    facts = by_name(await check_server_facts(scratch))
    assert facts["transaction_isolation"] == (False, "repeatable_read_not_read_committed")


async def test_an_unreachable_server_fails_every_fact_with_a_reason_and_raises_nothing() -> None:
    facts = by_name(await check_server_facts("postgresql://nobody@127.0.0.1:9/none?schema=s",
                                             per_call_deadline_seconds=1.0))
    assert {passed for passed, _ in facts.values()} == {False}
    assert {reason for _, reason in facts.values()} == {"connection_refused"}


@pytest.mark.parametrize("deadline", [0, -1.0, float("nan"), float("inf"), "5", True])
async def test_a_bad_deadline_is_refused(deadline: object) -> None:
    with pytest.raises(ConfigValidationError) as refused:
        await check_server_facts("sqlite:///unused.db", per_call_deadline_seconds=deadline)  # type: ignore[arg-type]
    assert refused.value.problems == ("number_out_of_range",)


# --- PostgreSQL through PgBouncer in transaction mode ------------------------------------------


async def test_through_pgbouncer_in_transaction_mode_notify_and_prepared_statements_fail_with_their_reasons(
    scratch: str, pgbouncer_dsn: str, pg_dsn: str, server_database: str,
) -> None:
    pooled = _named(pgbouncer_dsn, server_database) + f"?schema={SCHEMA}&pooler=transaction"
    before = await _tables(pg_dsn, server_database)
    facts = by_name(await check_server_facts(pooled, per_call_deadline_seconds=2.0))
    assert facts == {
        "clock_monotonic": (True, "monotonic"),
        "transaction_isolation": (True, "read_committed"),
        "skip_locked": (True, "locked_row_skipped"),
        "advisory_locks": (True, "transaction_locks_exclude"),
        # tenure's pooler mode needs neither: its workers poll, its statements are unnamed.
        "listen_notify": (False, "notify_not_delivered_workers_poll"),
        "prepared_statements": (False, "prepared_statements_lost_pooler_mode_avoids_them"),
        "time_zone_irrelevant": (True, "instants_independent_of_time_zone"),
        "statement_timeouts": (True, "no_timeout_below_deadline"),
    }
    assert await _tables(pg_dsn, server_database) == before


async def test_through_pgbouncer_without_the_pooler_parameter_every_fact_says_to_add_it(
    scratch: str, pgbouncer_dsn: str, server_database: str,
) -> None:
    unnamed = _named(pgbouncer_dsn, server_database) + f"?schema={SCHEMA}"
    facts = by_name(await check_server_facts(unnamed, per_call_deadline_seconds=2.0))
    assert set(facts.values()) == {(False, "pooler_detected_needs_pooler_parameter")}
