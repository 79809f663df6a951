"""Every hot queue statement keeps an index plan, cached or not, on a young table and on
an analyzed one.

PostgreSQL plans a prepared statement with its parameters' values for its first five
executions (custom plans), then may cache one plan for every value (the generic plan)
if that one looks no dearer. A statement whose generic plan scans the whole job table
costs every call the table's size from the sixth on (issue 51 measured about 400 us per
statement on a young table, beside the floor's 75); one whose custom plans win is
planned again on every call. So each hot statement of each queue (validation, pipeline,
streaming, task) is taken here exactly as tenure sends it (recorded at the store's
one-statement boundary while the public calls run, never copied by hand), prepared, and
explained under ``plan_cache_mode = force_generic_plan`` and under ``force_custom_plan``,
on a table in three states: empty (as a pool may meet it right after the migration),
young (20,000 rows, never analyzed) and analyzed (the same rows, after ANALYZE). No plan may read a job table with a sequential scan. And every
hot statement (submit, claim, and heartbeat, complete, fail or release, single or batch)
runs its cached plan on the analyzed table when PostgreSQL chooses (``auto``).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import asyncpg
import pytest

from tenure.adapters import PipelineJobSource, StreamingJobSource, TaskSource, ValidationJobSource
from tenure.adapters.postgres.connections import count_instants_in_microseconds
from tenure.adapters.queue.table import binding_for
from tenure.model import PipelineJob, QueueKind, StreamingJob, TaskJob, ValidationJob, WorkerConfig

pytestmark = pytest.mark.parametrize("database", ["postgresql"])

ROWS = 20_000
"""The rows of the young and the analyzed table: enough that a scan of them costs more
than any index path, as the planner counts."""

JOB_TABLES = frozenset(binding_for(queue).spec.name for queue in QueueKind)

MODES = ("force_generic_plan", "force_custom_plan")

TABLE_STATES = ("empty", "young", "analyzed")


@dataclasses.dataclass(frozen=True)
class Sent:
    """One statement as the store sent it: its ``$n`` text and its arguments."""

    operation: str
    sql: str
    arguments: tuple[Any, ...]


class Recorder:
    """Keeps every one-statement call the store sends (its ``_fetch_once``, where every
    decided-ahead statement, claim and insert leaves), by the operation running."""

    def __init__(self, source: Any) -> None:
        store = source._engine.store  # noqa: SLF001
        self.sent: list[Sent] = []
        self.operation = ""
        fetch_once = store._fetch_once  # noqa: SLF001

        async def recorded(pool: Any, deadline: float, sql: str, arguments: list[Any]) -> list[Any]:
            if self.operation:
                self.sent.append(Sent(self.operation, sql, tuple(arguments)))
            return await fetch_once(pool, deadline, sql, arguments)

        store._fetch_once = recorded  # noqa: SLF001

    async def one(self, operation: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``call``, which must send exactly one statement (the hot path's)."""
        self.operation = operation
        before = len(self.sent)
        try:
            answer = await call()
        finally:
            self.operation = ""
        assert len(self.sent) == before + 1, f"{operation}: {len(self.sent) - before} one-statement calls"
        return answer


def _config(db_url: str) -> WorkerConfig:
    return WorkerConfig(db_url, lease_seconds=60, heartbeat_seconds=15)


def _tokens(count: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(count)]


async def _owned_cycle(recorder: Recorder, source: Any, submit: Callable[[int], Awaitable[Any]],
                       claim_one: Callable[[], Awaitable[Any]], claim_many: Callable[[int], Awaitable[Any]]) -> None:
    """Every hot owned call once: submit, claim (single and batch), heartbeat (single and
    batch), complete (single and batch), fail, release (single and batch)."""
    await submit(0)  # the first call reads the database clock: a decided-ahead call starts from it
    await recorder.one("submit", lambda: submit(1))
    for number in range(2, 9):
        await submit(number)
    single = await recorder.one("claim", claim_one)
    assert single is not None
    batch = await recorder.one("claim_batch", lambda: claim_many(2))
    assert len(batch) == 2
    fence = single.claim_fence
    assert await recorder.one("heartbeat", lambda: source.heartbeat_owned(fence))
    fences = [claimed.claim_fence for claimed in batch]
    assert all(await recorder.one("heartbeat_batch", lambda: source.heartbeat_many_owned(fences)))
    assert all(await recorder.one("complete_batch", lambda: source.complete_many_owned([(f, None) for f in fences])))
    assert await recorder.one("complete", lambda: source.complete_owned(fence))
    failing = await claim_one()
    assert failing is not None
    assert await recorder.one("fail", lambda: source.fail_owned(failing.claim_fence, "boom", retry=False))
    released = await claim_one()
    assert released is not None
    assert await recorder.one("release", lambda: source.release_owned(released.claim_fence))
    again = await claim_many(2)
    assert len(again) == 2
    assert all(await recorder.one("release_batch",
                                  lambda: source.release_many_owned([claimed.claim_fence for claimed in again])))


async def _validation_statements(db_url: str) -> list[Sent]:
    async with ValidationJobSource(db_url, _config(db_url)) as source:
        recorder = Recorder(source)
        await _owned_cycle(
            recorder, source,
            lambda n: source.submit_owned(ValidationJob("orders", "1", f"{n}.jsonl"), submission_id=f"s-{n}"),
            lambda: source.claim_next_owned("worker", claim_token=uuid.uuid4().hex),
            lambda count: source.claim_batch_owned("worker", claim_tokens=_tokens(count)),
        )
        return recorder.sent


async def _task_statements(db_url: str) -> list[Sent]:
    async with TaskSource(db_url, _config(db_url)) as source:
        recorder = Recorder(source)
        await _owned_cycle(
            recorder, source,
            lambda n: source.submit_owned(TaskJob("default", "send", {"n": n}), submission_id=f"s-{n}"),
            lambda: source.claim_next_owned("worker", claim_token=uuid.uuid4().hex, queues=["default"]),
            lambda count: source.claim_batch_owned("worker", claim_tokens=_tokens(count), queues=["default"]),
        )
        return recorder.sent


async def _pipeline_statements(db_url: str) -> list[Sent]:
    async with PipelineJobSource(db_url, _config(db_url)) as source:
        recorder = Recorder(source)
        await _owned_cycle(
            recorder, source,
            lambda n: source.submit_owned(PipelineJob({"steps": [n]}, {"n": str(n)}), submission_id=f"s-{n}"),
            lambda: source.claim_next_owned("worker", claim_token=uuid.uuid4().hex),
            lambda count: source.claim_batch_owned("worker", claim_tokens=_tokens(count)),
        )
        return recorder.sent


async def _streaming_statements(db_url: str) -> list[Sent]:
    async with StreamingJobSource(db_url, _config(db_url)) as source:
        recorder = Recorder(source)
        await _owned_cycle(
            recorder, source,
            # One active launch per config: each launch its own config, so a batch claims two.
            lambda n: source.submit_owned(StreamingJob(f"stream-{n}", "1"), submission_id=f"s-{n}"),
            lambda: source.claim_next_owned("launcher", claim_token=uuid.uuid4().hex),
            lambda count: source.claim_batch_owned("launcher", claim_tokens=_tokens(count)),
        )
        return recorder.sent


CYCLES = {QueueKind.VALIDATION: _validation_statements, QueueKind.PIPELINE: _pipeline_statements,
          QueueKind.STREAMING: _streaming_statements, QueueKind.TASK: _task_statements}


async def _connect(db_url: str) -> asyncpg.Connection:
    connection = await asyncpg.connect(db_url)
    await count_instants_in_microseconds(connection)  # the arguments travel as the store's do
    return connection


async def _prepared(connection: asyncpg.Connection, name: str, sent: Sent) -> str:
    """Prepare ``sent`` as the SQL statement ``name`` with the parameter types the server
    infers for it (as it does for the driver's own prepare), and answer the EXECUTE that
    runs it with ``sent``'s arguments, each spelled as a typed literal."""
    statement = await connection.prepare(sent.sql)
    types = [await connection.fetchval("SELECT format_type($1::oid, NULL)", parameter.oid)
             for parameter in statement.get_parameters()]
    literals = [await connection.fetchval(f"SELECT quote_nullable(($1::{kind})::text)", argument)
                for kind, argument in zip(types, sent.arguments, strict=True)]
    await connection.execute(f"PREPARE {name} ({', '.join(types)}) AS {sent.sql}")
    return f"EXECUTE {name} ({', '.join(f'{literal}::{kind}' for literal, kind in zip(literals, types, strict=True))})"


def _scans(plan: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """Every (node type, relation) of a plan tree that reads a relation."""
    if "Relation Name" in plan:
        yield plan["Node Type"], plan["Relation Name"]
    for child in plan.get("Plans", ()):
        yield from _scans(child)


async def plans(db_url: str, statements: list[Sent]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Each statement's job-table scans under each plan cache mode, by (operation, mode)."""
    connection = await _connect(db_url)
    found: dict[tuple[str, str], list[tuple[str, str]]] = {}
    try:
        for number, sent in enumerate(statements):
            execute = await _prepared(connection, f"hot_{number}", sent)
            for mode in MODES:
                await connection.execute(f"SET plan_cache_mode = {mode}")
                explained = json.loads(await connection.fetchval(f"EXPLAIN (FORMAT JSON) {execute}"))
                found[(sent.operation, mode)] = [scan for scan in _scans(explained[0]["Plan"]) if scan[1] in JOB_TABLES]
            await connection.execute(f"DEALLOCATE hot_{number}")
    finally:
        await connection.close()
    return found


async def set_table(db_url: str, table: str, state: str) -> None:
    """The job table emptied (TRUNCATE: as never analyzed), then for ``young`` and
    ``analyzed`` filled with :data:`ROWS` finished rows (one INSERT ... SELECT over
    generate_series, each a copy of a finished row with its unique text columns made
    unique, short enough for pycharter's widths), and analyzed for ``analyzed``. Autovacuum is off for the table, so that a
    young table stays unanalyzed for the test."""
    connection = await asyncpg.connect(db_url)
    try:
        columns = [row[0] for row in await connection.fetch(
            "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum", table)]
        unique = {row[0] for row in await connection.fetch(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = $1::regclass AND i.indisunique "
            "AND format_type(a.atttypid, NULL) IN ('text', 'character varying')", table)}
        template = await connection.fetchrow(f"SELECT * FROM {table} WHERE status = 'completed' LIMIT 1")
        assert template is not None
        await connection.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        await connection.execute(f"CREATE TEMP TABLE template AS SELECT * FROM {table} WHERE id = $1", template["id"])
        await connection.execute(f"TRUNCATE {table}")
        if state != "empty":
            copied = ", ".join(f"'g' || g || '-' || left({column}, 16)" if column in unique else column for column in columns)
            await connection.execute(f"INSERT INTO {table} ({', '.join(columns)}) "
                                     f"SELECT {copied} FROM template, generate_series(1, {ROWS}) AS g")
        if state == "analyzed":
            await connection.execute(f"ANALYZE {table}")
    finally:
        await connection.close()


@pytest.mark.parametrize("queue", list(CYCLES), ids=lambda queue: queue.value)
@pytest.mark.parametrize("state", TABLE_STATES)
async def test_every_hot_statement_reads_the_job_table_by_index_under_generic_and_custom_plans(
    db_url: str, queue: QueueKind, state: str,
) -> None:
    statements = await CYCLES[queue](db_url)
    assert sorted({sent.operation for sent in statements}) == sorted(
        ["submit", "claim", "claim_batch", "heartbeat", "heartbeat_batch", "complete", "complete_batch", "fail",
         "release", "release_batch"])
    await set_table(db_url, binding_for(queue).spec.name, state)
    found = await plans(db_url, statements)
    scanned = {(operation, mode) for (operation, mode), scans in found.items()
               if any(kind == "Seq Scan" for kind, _ in scans)}
    assert not scanned, f"sequential scans of a job table on a {state} table: {sorted(scanned)}"
    assert all(scans for scans in found.values()), "every hot statement reads its job table"


CACHED = ("submit", "claim", "claim_batch", "heartbeat", "heartbeat_batch", "complete", "complete_batch", "fail",
          "release", "release_batch")
"""Every hot statement: on an analyzed table PostgreSQL's own choice (``auto``) is its
cached generic plan from the sixth execution on, no planning per call. A lookup of one
key is one equality (a list of one key spelled as its first element); a claim's pick
has its status a literal, so the cached plan sees it and matches the pending rows' index
as a custom plan does; a batch's list is sized alike in every plan (unnested through a
scalar subquery, rechecked where the planner cannot price it per element, its UPDATE
meeting the locked rows by key), so its cached plan is not priced above the custom
ones (they planned at every call before: ~470-600 us each on 50,000 rows)."""


@pytest.mark.parametrize("queue", list(CYCLES), ids=lambda queue: queue.value)
async def test_every_hot_statement_runs_its_cached_plan_when_postgresql_chooses(
    db_url: str, queue: QueueKind,
) -> None:
    statements = [sent for sent in await CYCLES[queue](db_url) if sent.operation in CACHED]
    assert sorted(sent.operation for sent in statements) == sorted(CACHED)
    await set_table(db_url, binding_for(queue).spec.name, "analyzed")
    connection = await _connect(db_url)
    chosen: dict[str, int] = {}
    try:
        await connection.execute("SET plan_cache_mode = auto")
        for number, sent in enumerate(statements):
            execute = await _prepared(connection, f"cached_{number}", sent)
            transaction = connection.transaction()
            await transaction.start()
            try:
                for _ in range(6):  # five custom plans, then PostgreSQL may cache one
                    await connection.execute(execute)
            finally:
                await transaction.rollback()
            chosen[sent.operation] = await connection.fetchval(
                "SELECT generic_plans FROM pg_prepared_statements WHERE name = $1", f"cached_{number}")
    finally:
        await connection.close()
    assert chosen == dict.fromkeys(CACHED, 1), f"generic plans run of six executions: {chosen}"
