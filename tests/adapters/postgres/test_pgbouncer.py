"""tenure through a real PgBouncer in transaction pooling mode (Debian's package; issue 33,
item 4): what works with ``pooler=transaction`` in the URL, and what is refused, with
which reason, without it.

Each of tenure's connections may run each transaction on another server connection, so
every test here drives more clients than the pooler has server connections: a named
prepared statement, a LISTEN or a session setting kept on a connection would fail them.
``.ci/test-all.sh`` starts one PgBouncer in front of its throwaway server and exports
TEST_PGBOUNCER_DSN; run alone, the fixture starts its own with ``.ci/pgbouncer-start.sh``.
It never skips: without PgBouncer the tests fail.
"""

from __future__ import annotations

import asyncio
import collections
import pathlib
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from adapter_support import counting_empty_claims, expire_lease
from polling import until

from tenure.adapters import (
    JobContext,
    QueueBroker,
    RunLedger,
    RunRuntime,
    RunWorker,
    ValidationJobSource,
    Worker,
    Workflows,
    upgrade,
)
from tenure.adapters.core.urls import Pooler, parse_db_url
from tenure.model import ConfigValidationError, JobStatus, QueueKind, RunIntent, RunStatus, ValidationJob, WorkerConfig

ROOT = pathlib.Path(__file__).resolve().parents[3]
REQUEST = ValidationJob("orders", "1.0.0", "orders.jsonl")


# --- a PgBouncer in transaction mode in front of the test server ---------------------------


def _with_database(dsn: str, name: str) -> str:
    return dsn.rsplit("/", 1)[0] + "/" + name


async def _admin(pg_dsn: str, sql: str) -> None:
    connection = await asyncpg.connect(pg_dsn)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


@pytest.fixture
async def bouncer_database(pg_dsn: str, pgbouncer_dsn: str) -> AsyncIterator[tuple[str, str]]:
    """A new empty database: (its direct DSN, its DSN through PgBouncer without tenure's parameters)."""
    name = "tenure_bouncer_" + uuid.uuid4().hex[:12]
    await _admin(pg_dsn, f"CREATE DATABASE {name}")
    try:
        yield _with_database(pg_dsn, name), _with_database(pgbouncer_dsn, name)
    finally:
        await _admin(pg_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
async def pooled(bouncer_database: tuple[str, str]) -> str:
    """A migrated database's tenure URL through PgBouncer, ``pooler=transaction``."""
    url = bouncer_database[1] + "?pooler=transaction"
    await upgrade(url)
    return url


def config(db_url: str, **changes: Any) -> WorkerConfig:
    settings: dict[str, Any] = dict(lease_seconds=30, heartbeat_seconds=10)
    settings.update(changes)
    return WorkerConfig(db_url, **settings)


async def _server_connections(direct: str) -> int:
    """The server's connections to the database (PgBouncer's, and nothing else here)."""
    connection = await asyncpg.connect(direct)
    try:
        return int(await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"))
    finally:
        await connection.close()


# --- the URL parameter ----------------------------------------------------------------------


def test_the_pooler_parameter_is_parsed_and_never_reaches_the_driver() -> None:
    target = parse_db_url("postgresql://u@h:6432/d?pooler=transaction&schema=jobs&application_name=a")
    assert (target.pooler, target.schema) == (Pooler.TRANSACTION, "jobs")
    assert "pooler" not in target.location and "schema" not in target.location
    assert "application_name=a" in target.location
    assert parse_db_url("postgresql://u@h/d?pooler=session").pooler is Pooler.SESSION
    assert parse_db_url("postgresql://u@h/d").pooler is None


@pytest.mark.parametrize("query", ["pooler=statement", "pooler=", "pooler=transaction&pooler=session"])
def test_an_unknown_or_repeated_pooler_mode_is_refused_before_connecting(query: str) -> None:
    with pytest.raises(ConfigValidationError) as refused:
        parse_db_url(f"postgresql://u:hunter2@h/d?{query}")
    assert refused.value.problems == ("unknown_pooler_mode", "unknown_pooler_mode")
    assert refused.value.fields == ("db_url", "db_url.pooler") and "hunter2" not in str(refused.value)


@pytest.mark.parametrize("setting", ["statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"])
def test_server_settings_in_the_url_are_refused_in_transaction_mode(setting: str) -> None:
    # They travel in the startup packet, which a pooler in transaction mode refuses (or,
    # told to ignore them, would silently not apply).
    with pytest.raises(ConfigValidationError) as refused:
        parse_db_url(f"postgresql://u@h/d?{setting}=5000&pooler=transaction")
    assert refused.value.problems[0] == "pooler_transaction_mode_refuses_server_settings"
    assert refused.value.fields == ("db_url", f"db_url.{setting}")
    assert parse_db_url(f"postgresql://u@h/d?{setting}=5000&pooler=session").pooler is Pooler.SESSION


# --- refused without the parameter ----------------------------------------------------------


async def test_without_the_pooler_parameter_pgbouncer_is_detected_and_refused_and_nothing_is_written(
    bouncer_database: tuple[str, str],
) -> None:
    direct, bounced = bouncer_database
    with pytest.raises(ConfigValidationError) as refused:
        await upgrade(bounced)
    assert refused.value.problems == ("pooler_detected_needs_pooler_parameter",) * 2
    assert refused.value.fields == ("db_url", "db_url.pooler")
    port = str(urllib.parse.urlsplit(bounced).port)
    assert port not in str(refused.value) and "postgres" not in str(refused.value)
    connection = await asyncpg.connect(direct)
    try:
        assert await connection.fetchval(
            "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')") == 0
    finally:
        await connection.close()
    # A source (a worker's) is refused the same way at its first call.
    await upgrade(direct)
    async with ValidationJobSource(bounced, config(bounced)) as source:
        with pytest.raises(ConfigValidationError) as refused:
            await source.submit_owned(REQUEST, submission_id="sub-1")
    assert refused.value.problems[0] == "pooler_detected_needs_pooler_parameter"


async def test_a_direct_connection_is_not_mistaken_for_a_pooler(bouncer_database: tuple[str, str]) -> None:
    direct, _ = bouncer_database
    await upgrade(direct)
    async with ValidationJobSource(direct, config(direct)) as source:
        assert await source.submit_owned(REQUEST, submission_id="sub-1")


async def test_a_server_setting_pgbouncer_refuses_at_startup_is_a_reason_not_driver_text(
    bouncer_database: tuple[str, str],
) -> None:
    _, bounced = bouncer_database
    with pytest.raises(ConfigValidationError) as refused:
        await upgrade(bounced + "?statement_timeout=5000")
    assert refused.value.problems == ("pooler_refused_startup_parameter",)
    assert "unsupported" not in str(refused.value) and "statement_timeout" not in str(refused.value)


# --- what works with pooler=transaction ------------------------------------------------------


async def test_migrate_submit_claim_heartbeat_complete_and_a_stale_completion_is_refused(pooled: str) -> None:
    # An hour's lease (a second's could run out before the first heartbeat on a loaded
    # machine); the stall past it is written by SQL.
    async with ValidationJobSource(pooled, config(pooled, lease_seconds=3600, heartbeat_seconds=0.2)) as source:
        job_id = await source.submit_owned(REQUEST, submission_id="sub-1")
        assert await source.submit_owned(REQUEST, submission_id="sub-1") == job_id  # a replay, not a second job
        first = await source.claim_next_owned("worker-a", claim_token="token-a")
        assert first is not None and first.job_id == job_id
        assert await source.heartbeat_owned(first.claim_fence) is True
        expire_lease(pooled, QueueKind.VALIDATION, job_id)  # worker-a stalls past its lease
        second = await source.claim_next_owned("worker-b", claim_token="token-b")
        assert second is not None and second.claim_fence.generation > first.claim_fence.generation
        assert await source.complete_owned(first.claim_fence, {"by": "a"}) is False  # fenced out
        assert await source.heartbeat_owned(first.claim_fence) is False
        assert await source.complete_owned(second.claim_fence, {"by": "b"}) is True
        info = await source.get_job(job_id)
        assert (info.status, info.result) == (JobStatus.COMPLETED, {"by": "b"})


async def test_the_schema_parameter_holds_through_the_pooler_without_session_state(
    bouncer_database: tuple[str, str],
) -> None:
    # tenure names its schema in every statement (never SET search_path): a server
    # connection another client used next sees no trace of it.
    direct, bounced = bouncer_database
    url = bounced + "?schema=tenure_jobs&pooler=transaction"
    await upgrade(url)
    async with ValidationJobSource(url, config(url)) as source:
        job_id = await source.submit_owned(REQUEST, submission_id="sub-1")
        claimed = await source.claim_next_owned("worker-a", claim_token="token-a")
        assert claimed is not None and await source.complete_owned(claimed.claim_fence, {"ok": 1}) is True
    connection = await asyncpg.connect(direct)
    try:
        assert await connection.fetchval("SELECT status FROM tenure_jobs.validation_jobs WHERE id = $1",
                                         job_id) == "completed"
        assert await connection.fetchval("SELECT to_regclass('public.validation_jobs')") is None
    finally:
        await connection.close()


async def test_many_sources_race_through_fewer_server_connections_and_every_job_ends_exactly_once(
    pooled: str, bouncer_database: tuple[str, str],
) -> None:
    direct, _ = bouncer_database
    jobs, sources = 300, 16
    async with ValidationJobSource(pooled, config(pooled)) as submitter:
        for number in range(jobs):
            await submitter.submit_owned(ValidationJob("c", "1", f"s-{number}"), submission_id=f"sub-{number}")
    accepted: collections.Counter[str] = collections.Counter()
    busiest = 0
    racing = True

    async def watch() -> None:
        nonlocal busiest
        while racing:
            busiest = max(busiest, await _server_connections(direct))
            await asyncio.sleep(0.02)

    async def worker(index: int) -> None:
        async with ValidationJobSource(pooled, config(pooled)) as source:
            # Two calls at once per source: 32 client connections in all.
            async def lane(lane_number: int) -> None:
                while (claimed := await source.claim_next_owned(
                        f"worker-{index}", claim_token=uuid.uuid4().hex)) is not None:
                    if await source.complete_owned(claimed.claim_fence, {"worker": index, "lane": lane_number}):
                        accepted[claimed.job_id] += 1
            await asyncio.gather(lane(0), lane(1))

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.wait_for(asyncio.gather(*(worker(index) for index in range(sources))), timeout=120)
    finally:
        racing = False
        await watcher
    assert len(accepted) == jobs and set(accepted.values()) == {1}
    assert 0 < busiest < sources, (busiest, sources)  # the pooler's few server connections served them all


async def test_an_idle_worker_polls_instead_of_listening_and_still_finds_new_work(pooled: str) -> None:
    # A LISTEN through the pooler would be accepted on some server connection and then
    # hear nothing: the store opens no listener, and the worker polls (up to idle_wait_s).
    async with ValidationJobSource(pooled, config(pooled)) as source, \
            ValidationJobSource(pooled, config(pooled)) as submitter:
        done = asyncio.Event()

        async def handler(claimed: Any, context: JobContext) -> dict[str, Any]:
            done.set()
            return {}

        stop = asyncio.Event()
        empty_claims = counting_empty_claims(source)
        worker = Worker(source, handler, idle_wait_s=0.5)
        running = asyncio.create_task(worker.run(stop))
        # Idle: a claim came back empty (a hang guard, not an "idle by now" sleep).
        await until(lambda: empty_claims[0] > 0, what="the worker finds nothing to do")
        assert worker.listening is False
        await submitter.submit_owned(ValidationJob("orders", "1", "late.jsonl"), submission_id="late")
        await asyncio.wait_for(done.wait(), 60)
        stop.set()
        stats = await asyncio.wait_for(running, 60)
        assert stats.completed == 1


async def test_a_run_is_admitted_and_delivered_through_the_queue_broker(pooled: str) -> None:
    workflows = Workflows()

    @workflows.workflow("greet", "1")
    async def greet(ctx: Any) -> dict[str, str]:
        name = await ctx.step("normalise", str.title, ctx.payload["name"])
        return {"greeting": f"hello, {name}"}

    broker = QueueBroker(pooled, queues=["runs"], poll_s=0.05)
    async with RunLedger(pooled) as ledger:
        worker = RunWorker(ledger, broker, workflows, node="node-a")
        async with RunRuntime(ledger, brokers=[broker], workers=[worker], node="node-a"):
            intent = RunIntent(session_id=None, source="api", principal="alice", scopes=frozenset(),
                               payload={"name": "ada"})
            admission = await ledger.admit(intent, workflow=workflows.pin("greet", "1"), queue="runs",
                                           priority=50, idempotency_key="greet-ada")
            run_id = admission.run.run_id
            assert await ledger.publish(run_id, 0, broker) is True

            async def settled() -> Any:
                run = await ledger.get(run_id)
                return run if run is not None and run.status in (RunStatus.DONE, RunStatus.FAILED) else None

            run = None
            for _ in range(600):
                if (run := await settled()) is not None:
                    break
                await asyncio.sleep(0.05)
    assert run is not None and (run.status, run.result) == (RunStatus.DONE, {"greeting": "hello, Ada"})
