"""What only PostgreSQL has: row-lock waits, genuine uuid and CHAR columns, catalog-based
migration admission, and many workers on many connections racing for one queue."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from adapter_support import raw, row
from lock_waits import held_elsewhere, with_longer_leases

from tenure.adapters import StreamingJobSource, ValidationJobSource, downgrade, upgrade
from tenure.adapters.core.schema import owned_column_ddl
from tenure.adapters.core.tables import sql_dialect
from tenure.adapters.queue.table import OWNED_STEP, QUEUE_TABLES, legacy_ddl
from tenure.model import (
    ConfigValidationError,
    ErrorCode,
    JobStatus,
    QueueClaimFence,
    QueueKind,
    StreamingJob,
    TenureError,
    ValidationJob,
    WorkerConfig,
)

pytestmark = pytest.mark.parametrize("database", ["postgresql"])

DIALECT = sql_dialect("postgresql")
REQUEST = ValidationJob("orders", "1.0.0", "orders.jsonl")


def config(db_url: str, **changes: Any) -> WorkerConfig:
    settings: dict[str, Any] = dict(lease_seconds=30, heartbeat_seconds=10)
    settings.update(changes)
    return WorkerConfig(db_url, **settings)


# --- the row lock and the clock ------------------------------------------------------------


@contextlib.asynccontextmanager
async def row_locked_elsewhere(db_url: str, job_id: str) -> AsyncIterator[None]:
    """Another session holds the job's row lock (``FOR UPDATE``) until the block ends."""
    blocker = await asyncpg.connect(db_url)
    try:
        async with blocker.transaction():
            await blocker.fetch("SELECT id FROM validation_jobs WHERE id = $1 FOR UPDATE", job_id)
            yield
    finally:
        await blocker.close()


async def test_a_lock_wait_that_outlasts_the_lease_cannot_authorize_a_stale_write(db_url: str) -> None:
    async with ValidationJobSource(db_url, config(db_url, lease_seconds=1.0, heartbeat_seconds=0.2)) as source:
        job_id = await source.submit_owned(REQUEST, submission_id="sub-1")
        claimed = await source.claim_next_owned("worker-a", claim_token="token-1")
        async with row_locked_elsewhere(db_url, job_id):
            waiting = asyncio.create_task(source.complete_owned(claimed.claim_fence, {"late": True}))
            await asyncio.sleep(1.5)  # hold the row lock until the lease has run out
            assert not waiting.done(), "the write must wait for the row lock"
        assert await waiting is False
        info = await source.get_job(job_id)
        assert (info.status, info.result) == (JobStatus.CLAIMED, None)


async def test_the_same_wait_within_the_lease_still_applies(db_url: str) -> None:
    # The control for the test above: only the expired lease made the difference.
    async with ValidationJobSource(db_url, config(db_url)) as source:
        job_id = await source.submit_owned(REQUEST, submission_id="sub-1")
        claimed = await source.claim_next_owned("worker-a", claim_token="token-1")
        async with row_locked_elsewhere(db_url, job_id):
            waiting = asyncio.create_task(source.complete_owned(claimed.claim_fence, {"ok": True}))
            await asyncio.sleep(0.3)
        assert await waiting is True


# --- genuine uuid and CHAR columns -------------------------------------------------------------


def _legacy_schema_with(db_url: str, replacements: dict[str, str]) -> None:
    """The legacy schema with some validation_jobs column types replaced (an older
    deployment that chose uuid IDs or CHAR owners)."""
    for statement in legacy_ddl(DIALECT, None):
        if statement.startswith("CREATE TABLE IF NOT EXISTS validation_jobs"):
            for column, declared in replacements.items():
                statement = statement.replace(f"\t{column} VARCHAR(36) NOT NULL", f"\t{column} {declared} NOT NULL")
                statement = statement.replace(f"\t{column} VARCHAR(255)", f"\t{column} {declared}")
        raw(db_url, statement)


async def test_uuid_job_ids_are_stored_and_returned_as_canonical_database_text(fresh_db_url: str) -> None:
    _legacy_schema_with(fresh_db_url, {"id": "UUID"})
    await upgrade(fresh_db_url)
    authored = str(uuid.uuid4()).upper()
    async with ValidationJobSource(fresh_db_url) as source:
        job_id = await source.submit_owned(ValidationJob("c", "1", "s", job_id=authored), submission_id="sub-1")
        assert job_id == authored.lower()
        # The authored spelling stays in the fingerprint: replay it unchanged.
        assert await source.submit_owned(ValidationJob("c", "1", "s", job_id=authored), submission_id="sub-1") == job_id
        with pytest.raises(TenureError) as caught:
            await source.submit_owned(ValidationJob("c", "1", "s", job_id=authored.lower()), submission_id="sub-1")
        assert caught.value.reason == "fingerprint_mismatch"
        generated = await source.submit_owned(ValidationJob("c", "1", "s2"), submission_id="sub-2")
        first = await source.claim_next_owned("worker-a", claim_token="token-1")
        second = await source.claim_next_owned("worker-a", claim_token="token-2")
        assert {first.job_id, second.job_id} == {job_id, generated}
        assert first.claim_fence.job_id == first.job_id == first.job_id.lower()


async def test_a_wrong_case_uuid_fence_is_refused_by_the_exact_row_comparison(fresh_db_url: str) -> None:
    _legacy_schema_with(fresh_db_url, {"id": "UUID"})
    await upgrade(fresh_db_url)
    async with ValidationJobSource(fresh_db_url) as source:
        job_id = await source.submit_owned(REQUEST, submission_id="sub-1")
        fence = (await source.claim_next_owned("worker-a", claim_token="token-1")).claim_fence
        before = row(fresh_db_url, QueueKind.VALIDATION, job_id)
        shouting = QueueClaimFence(fence.queue, fence.job_id.upper(), fence.owner_id, fence.generation, fence.claim_token)
        assert await source.complete_owned(shouting) is False
        assert row(fresh_db_url, QueueKind.VALIDATION, job_id) == before
        assert await source.complete_owned(fence) is True


async def test_an_invalid_uuid_is_a_persistence_failure_with_no_driver_detail_and_no_change(fresh_db_url: str) -> None:
    _legacy_schema_with(fresh_db_url, {"id": "UUID"})
    await upgrade(fresh_db_url)
    async with ValidationJobSource(fresh_db_url) as source:
        job_id = await source.submit_owned(REQUEST, submission_id="sub-1")
        fence = (await source.claim_next_owned("worker-a", claim_token="token-1")).claim_fence
        before = row(fresh_db_url, QueueKind.VALIDATION, job_id)
        broken = QueueClaimFence(fence.queue, "not-a-uuid-SECRET", fence.owner_id, fence.generation, fence.claim_token)
        for call in (source.complete_owned(broken), source.heartbeat_owned(broken), source.get_job("not-a-uuid-SECRET")):
            with pytest.raises(TenureError) as caught:
                await call
            assert (caught.value.code, caught.value.reason) == (ErrorCode.QUEUE_PERSISTENCE_FAILED, "unavailable")
            assert "SECRET" not in str(caught.value) and "uuid" not in str(caught.value).lower()
        with pytest.raises(TenureError) as caught:
            await source.submit_owned(ValidationJob("c", "1", "s", job_id="not-a-uuid"), submission_id="sub-2")
        assert caught.value.reason == "unavailable"
        assert row(fresh_db_url, QueueKind.VALIDATION, job_id) == before


async def test_char_owners_must_be_supplied_in_their_padded_form(fresh_db_url: str) -> None:
    _legacy_schema_with(fresh_db_url, {"claimed_by": "CHAR(20)"})
    await upgrade(fresh_db_url)
    async with ValidationJobSource(fresh_db_url) as source:
        job_id = await source.submit_owned(REQUEST, submission_id="sub-1")
        before = row(fresh_db_url, QueueKind.VALIDATION, job_id)
        with pytest.raises(TenureError) as caught:
            await source.claim_next_owned("worker-a", claim_token="token-1")
        assert (caught.value.code, caught.value.reason) == (ErrorCode.QUEUE_CLAIM_CONFLICT, "claim_identity_changed")
        assert row(fresh_db_url, QueueKind.VALIDATION, job_id) == before
        padded = "worker-a".ljust(20)
        claimed = await source.claim_next_owned(padded, claim_token="token-2")
        assert claimed.claim_fence.owner_id == padded
        assert await source.complete_owned(claimed.claim_fence)


# --- migration admission from the catalogs -----------------------------------------------------


def _prepare(db_url: str, replace: dict[str, str], extra: list[str]) -> None:
    for statement in legacy_ddl(DIALECT, None):
        raw(db_url, statement)
    for spec in QUEUE_TABLES.values():
        table = spec.name
        for column in spec.columns_of(OWNED_STEP):
            ddl = owned_column_ddl(spec, column, DIALECT, None)
            if table == "validation_jobs" and column.name in replace:
                ddl = f"ALTER TABLE {table} ADD COLUMN {column.name} {replace[column.name]}"
            raw(db_url, ddl)
    for statement in extra:
        raw(db_url, statement)


def _catalog(db_url: str) -> list[tuple[Any, ...]]:
    return raw(
        db_url,
        "SELECT table_name, column_name, data_type, column_default, is_nullable FROM information_schema.columns"
        " WHERE table_schema = 'public' ORDER BY 1, 2",
    ) + raw(db_url, "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1")


CASE_INSENSITIVE = "CREATE COLLATION IF NOT EXISTS case_insensitive (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"

BAD_SCHEMAS = {
    "fixed_char_token": ({"claim_token": "CHAR(255)"}, [], "not_canonical_varchar"),
    "text_submission_id": ({"submission_id": "TEXT"}, [], "not_canonical_varchar"),
    "narrow_varchar_fingerprint": ({"fingerprint": "VARCHAR(64)"}, [], "not_canonical_varchar"),
    "integer_generation": ({"generation": "INTEGER DEFAULT 0 NOT NULL"}, [], "not_bigint"),
    "nullable_generation": ({"generation": "BIGINT DEFAULT 0"}, [], "wrong_nullability"),
    "generation_default_one": ({"generation": "BIGINT DEFAULT 1 NOT NULL"}, [], "default_not_zero"),
    "flag_default_true": ({"fence_required": "BOOLEAN DEFAULT true NOT NULL"}, [], "default_not_false"),
    "token_default_manufactures_identity": (
        {"claim_token": "VARCHAR(255) DEFAULT md5(random()::text)"}, [], "default_manufactures_identity",
    ),
    "partial_token_index": (
        {}, ["CREATE UNIQUE INDEX ux_validation_jobs_claim_token ON validation_jobs (claim_token) WHERE claim_token IS NOT NULL"],
        "partial_or_differently_compared_unique_index",
    ),
    "expression_submission_index": (
        {}, ["CREATE UNIQUE INDEX lowered ON validation_jobs (lower(submission_id))"],
        "partial_or_differently_compared_unique_index",
    ),
    "nondeterministic_token_column": (
        {"claim_token": "VARCHAR(255) COLLATE case_insensitive"}, [], "nondeterministic_collation",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SCHEMAS))
async def test_a_wrongly_prepared_database_is_refused_and_left_unchanged(fresh_db_url: str, case: str) -> None:
    replace, extra, problem = BAD_SCHEMAS[case]
    raw(fresh_db_url, CASE_INSENSITIVE)
    _prepare(fresh_db_url, replace, extra)
    before = _catalog(fresh_db_url)
    with pytest.raises(ConfigValidationError) as caught:
        await upgrade(fresh_db_url)
    assert caught.value.reason == "migration_admission_refused"
    assert problem in caught.value.problems
    assert _catalog(fresh_db_url) == before


@pytest.mark.parametrize(
    "replace",
    [
        {"fence_required": "BOOLEAN DEFAULT 'false'::boolean NOT NULL"},
        {"generation": "BIGINT DEFAULT '0' NOT NULL"},
        {"claim_token": "VARCHAR"},
    ],
    ids=["typed-quoted-false", "quoted-zero", "unbounded-varchar"],
)
async def test_compatible_variants_are_admitted(fresh_db_url: str, replace: dict[str, str]) -> None:
    _prepare(fresh_db_url, replace, [])
    report = await upgrade(fresh_db_url)
    assert all(check.passed for check in report.checks)


async def test_downgrade_locks_refuses_protected_work_then_removes_the_columns(db_url: str) -> None:
    async with ValidationJobSource(db_url) as source:
        owned = await source.submit_owned(REQUEST, submission_id="sub-1")
        with pytest.raises(ConfigValidationError) as caught:
            await downgrade(db_url)
        assert caught.value.problems == ("protected_submissions_remain",)
        raw(db_url, "DELETE FROM validation_jobs WHERE id = ?", (owned,))
        legacy = await source.submit(REQUEST)
        claimed = await source.claim_next_owned("worker-a", claim_token="token-1")
        assert claimed.job_id == legacy
        with pytest.raises(ConfigValidationError) as caught:
            await downgrade(db_url)
        assert caught.value.problems == ("owned_claims_remain",)
        assert await source.complete_owned(claimed.claim_fence)
    assert (await downgrade(db_url)).changed == ("workers_v1", "runs_v8", "runs_v7", "attempts_v2", "versions_v1", "console_v1", "runs_v6", "tasks_v1", "runs_v5", "runs_v4", "runs_v3", "runs_v2", "runs_v1", "attempts_v1", "owned_v2")
    columns = {name for (name,) in raw(db_url, "SELECT column_name FROM information_schema.columns WHERE table_name = 'validation_jobs'")}
    assert "claim_token" not in columns and "generation" not in columns
    assert (await upgrade(db_url)).applied == ("owned_v2", "attempts_v1", "runs_v1", "runs_v2", "runs_v3", "runs_v4", "runs_v5", "tasks_v1", "runs_v6", "console_v1", "versions_v1", "attempts_v2", "runs_v7", "runs_v8", "workers_v1")


# --- many workers, one queue ---------------------------------------------------------------------


async def test_sixteen_workers_race_over_three_thousand_jobs_and_every_job_ends_exactly_once(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs, workers, lease = 3000, 16, 0.5
    worker_config = config(db_url, lease_seconds=lease, heartbeat_seconds=0.1, backoff_base_ms=0, backoff_max_ms=0)
    async with ValidationJobSource(db_url, worker_config) as submitter:
        for n in range(jobs):
            await submitter.submit_owned(ValidationJob("c", "1", f"s-{n}", max_attempts=100), submission_id=f"sub-{n}")
    accepted: collections.Counter[str] = collections.Counter()
    accepted_generation: dict[str, int] = {}
    generations: dict[str, list[int]] = collections.defaultdict(list)
    counts = collections.Counter[str]()
    slowest = 0.0
    rng = random.Random(11)

    async def timed(call: Any) -> Any:
        nonlocal slowest
        started = time.perf_counter()
        result = await asyncio.wait_for(call, timeout=60)  # a hang fails; no speed is asserted
        slowest = max(slowest, time.perf_counter() - started)
        return result

    async def worker(index: int) -> None:
        async with ValidationJobSource(db_url, worker_config) as source:
            idle = 0
            while idle < 20:
                claimed = await timed(source.claim_next_owned(f"worker-{index}", claim_token=uuid.uuid4().hex))
                if claimed is None:
                    idle += 1
                    await asyncio.sleep(0.05)
                    continue
                idle = 0
                counts["claims"] += 1
                fence = claimed.claim_fence
                generations[claimed.job_id].append(fence.generation)
                roll = rng.random()
                if roll < 0.03:
                    await asyncio.sleep(lease * 1.6)  # stall past the lease, then write anyway
                    counts["stalled writes"] += 1
                elif roll < 0.08:
                    counts["retries"] += await timed(source.fail_owned(fence, "transient", retry=True))
                    continue
                if await timed(source.complete_owned(fence, {"worker": index})):
                    accepted[claimed.job_id] += 1
                    accepted_generation[claimed.job_id] = fence.generation
                else:
                    counts["refused writes"] += 1

    await asyncio.gather(*(worker(index) for index in range(workers)))
    final = {
        job_id: (status, generation)
        for job_id, status, generation in raw(db_url, "SELECT id, status, generation FROM validation_jobs")
    }
    assert len(final) == jobs
    lost = [job_id for job_id, (status, _) in final.items() if status != "completed"]
    assert lost == []
    assert set(accepted) == set(final) and set(accepted.values()) == {1}
    for job_id, seen in generations.items():
        assert seen == sorted(set(seen)), "generations must strictly increase across claims"
        # The one accepted write came from the job's final claim: no stale fence was accepted.
        assert accepted_generation[job_id] == final[job_id][1] == seen[-1]
    with capsys.disabled():
        print(
            f"\nconcurrency proof: {jobs} jobs, {workers} workers: {counts['claims']} claims, "
            f"{counts['retries']} retries, {counts['stalled writes']} stalled writers, "
            f"{counts['refused writes']} stale writes refused, accepted terminal writes per job "
            f"{sorted(set(accepted.values()))}, lost {len(lost)}, slowest request {slowest:.2f} s"
        )
    assert counts["refused writes"] > 0, "the race must actually exercise stale writes"


async def test_two_concurrent_forced_reruns_leave_exactly_one_active_successor(db_url: str) -> None:
    sources = [StreamingJobSource(db_url) for _ in range(2)]
    try:
        for round_number in range(20):
            config_name = f"feed-{round_number}"
            await sources[0].submit_owned(StreamingJob(config_name, "1"), submission_id=f"{config_name}-original")
            results = await asyncio.gather(
                *(
                    source.submit_owned(StreamingJob(config_name, "1", force=True), submission_id=f"{config_name}-force-{n}")
                    for n, source in enumerate(sources)
                ),
                return_exceptions=True,
            )
            assert all(isinstance(result, str) for result in results), results
            active = raw(
                db_url,
                "SELECT id FROM streaming_jobs WHERE idempotency_key = ? AND status IN ('pending', 'claimed')",
                (f"streaming:{config_name}@1",),
            )
            assert len(active) == 1 and active[0][0] in results
            statuses = sorted(status for (status,) in raw(
                db_url, "SELECT status FROM streaming_jobs WHERE config_name = ?", (config_name,)
            ))
            assert statuses == ["cancelled", "cancelled", "pending"]
    finally:
        for source in sources:
            await source.close()


async def test_the_claim_query_is_served_by_the_eligibility_index_not_a_table_scan(db_url: str) -> None:
    # A claim must stay as cheap with a million waiting rows as with a thousand: its
    # query has to walk the (status, fires_at, id) index and stop at the first row.
    raw(
        db_url,
        "INSERT INTO validation_jobs (id, contract_name, contract_version, data_json, status, fires_at, created_at,"
        " attempt, max_attempts, generation, fence_required) SELECT 'bulk-' || n, 'c', '1', '{\"data_source\": \"s\"}',"
        " CASE WHEN n % 10 = 0 THEN 'completed' ELSE 'pending' END,"
        " now() - make_interval(secs => n), now(), 0, 5, 0, false FROM generate_series(1, 20000) n",
    )
    raw(db_url, "ANALYZE validation_jobs")
    from tenure.adapters.core.sql import POSTGRESQL, compile_finder
    from tenure.adapters.postgres.statements import numbered
    from tenure.adapters.queue.table import QUEUE_BINDINGS
    from tenure.kernel.queue import finders

    finder = compile_finder(QUEUE_BINDINGS[QueueKind.VALIDATION], finders.eligible, POSTGRESQL, None, limited=True)
    compiled = numbered(finder.sql)
    sql = compiled.sql
    literals = {"now": "now()", "limit": "1"}
    literals.update({name: f"'{value}'" for name, value in finder.constants.items()})
    for number, name in reversed(list(enumerate(compiled.names, start=1))):
        sql = sql.replace(f"${number}", literals[name])
    plan = "\n".join(line for (line,) in raw(db_url, "EXPLAIN " + sql))
    assert "ix_validation_jobs_eligible" in plan, plan
    assert "Seq Scan" not in plan, plan


async def test_a_single_statement_fenced_update_is_fooled_by_a_lock_wait_which_is_why_tenure_locks_first(
    db_url: str,
) -> None:
    """Why an owned write is a transaction (lock, then read the clock, then decide, then
    compare-and-set) rather than one fenced UPDATE, the benchmark floor's shape.

    PostgreSQL evaluates an UPDATE's WHERE clause, ``lease > clock_timestamp()``
    included, before it waits for a row lock, and does not evaluate it again when the
    lock holder only locked the row. A worker whose write waited past its lease is then
    accepted: the stale write this library exists to refuse. The same wait makes
    ``complete_owned`` answer False (test_a_lock_wait_that_outlasts_the_lease_...).
    """
    async def scenario(lease_s: float, attempt: int) -> None:
        # A lease of lease_s; the UPDATE must reach the lock while it is live (else the
        # attempt proves nothing and runs again with a longer one), and the holder keeps
        # the lock until the lease ran out.
        raw(db_url, "DELETE FROM validation_jobs")  # an inconclusive attempt's job, claimable again
        async with ValidationJobSource(db_url, config(db_url, lease_seconds=lease_s, heartbeat_seconds=0.1)) as source:
            job_id = await source.submit_owned(REQUEST, submission_id=f"sub-{attempt}")
            fence = (await source.claim_next_owned("worker-a", claim_token=f"token-{attempt}")).claim_fence
            assert fence.job_id == job_id
        lease = raw(db_url, "SELECT lease_expires_at FROM validation_jobs WHERE id = ?", (job_id,))[0][0]
        writer = await asyncpg.connect(db_url)
        try:
            async with held_elsewhere(db_url, job_id) as held:
                one_statement = asyncio.ensure_future(writer.fetch(
                    "UPDATE validation_jobs SET status = 'completed', lease_expires_at = NULL, "
                    "completed_at = clock_timestamp() WHERE id = $1 AND claimed_by = $2 AND claim_token = $3 "
                    "AND generation = $4 AND status = 'claimed' AND lease_expires_at > clock_timestamp() "
                    "RETURNING clock_timestamp() AS written_at, $5::timestamptz AS lease",
                    job_id, fence.owner_id, fence.claim_token, fence.generation, lease,
                ))
                await held.blocked(one_statement)
                await held.until_lease_ran_out()  # the lease runs out while the UPDATE waits for the lock
            rows = await one_statement
        finally:
            await writer.close()
        assert len(rows) == 1, "PostgreSQL re-checked the predicate after the wait: revisit this rationale"
        assert rows[0]["written_at"] > rows[0]["lease"], "the write landed after the lease had expired"

    await with_longer_leases(scenario)


# --- connections ------------------------------------------------------------------------------


async def _backend_pid(source: ValidationJobSource) -> int:
    """The server process behind the connection the source's next transaction gets."""
    async with source._engine.store.transaction(write=False) as tx:  # type: ignore[attr-defined]
        return int((await tx.execute("SELECT pg_backend_pid()"))[0][0])


async def test_a_connection_is_reused_after_a_refusal_and_replaced_after_the_server_ends_it(db_url: str) -> None:
    async with ValidationJobSource(db_url, config(db_url)) as source:
        await source.submit_owned(REQUEST, submission_id="sub-1")
        first = await _backend_pid(source)
        with pytest.raises(TenureError) as refused:  # raised inside the transaction, rolled back cleanly
            await source.submit_owned(ValidationJob("orders", "2.0.0", "orders.jsonl"), submission_id="sub-1")
        assert refused.value.code is ErrorCode.QUEUE_SUBMISSION_CONFLICT
        assert await _backend_pid(source) == first, "a cleanly rolled back connection is kept"
        raw(db_url, "SELECT pg_terminate_backend(?)", (first,))
        try:  # fails if the ended session is noticed only when used, succeeds if noticed before
            await source.submit_owned(REQUEST, submission_id="sub-2")
        except TenureError as failed:
            assert failed.code is ErrorCode.QUEUE_PERSISTENCE_FAILED
        replacement = await _backend_pid(source)
        assert replacement != first, "a connection the server ended is never handed out again"
        assert await _backend_pid(source) == replacement
        assert await source.submit_owned(REQUEST, submission_id="sub-2")


async def test_a_source_never_opens_more_than_its_connection_limit(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from polling import until

    from tenure.adapters.postgres import connections
    from tenure.adapters.postgres.store import POOL_SIZE

    database = db_url.rsplit("/", 1)[1]
    opened = 0
    connect = connections.Connections._connect  # noqa: SLF001

    async def counted(self: Any) -> Any:
        nonlocal opened
        opened += 1
        return await connect(self)

    monkeypatch.setattr(connections.Connections, "_connect", counted)

    def others() -> int:
        return raw(db_url, "SELECT count(*) FROM pg_stat_activity WHERE datname = ? AND pid <> pg_backend_pid()",
                   (database,))[0][0]

    async with ValidationJobSource(db_url, config(db_url)) as source:
        job_ids = await asyncio.gather(*(source.submit_owned(REQUEST, submission_id=f"sub-{n}") for n in range(40)))
        assert len(set(job_ids)) == 40
        # Counted where they are opened: pg_stat_activity also lists, for a moment, the
        # server processes of connections closed just before (each raw() call's own).
        assert 1 < opened <= POOL_SIZE
    # A closed connection's server process leaves pg_stat_activity once it has exited.
    await until(lambda: others() == 0, what="closing the source closes every connection it opened")


@pytest.mark.parametrize("shape", ["transaction", "one statement"])
async def test_a_call_cancelled_during_a_lock_wait_leaves_no_lock_and_the_source_working(db_url: str, shape: str) -> None:
    """A transaction cancelled while it waits for a lock never commits (COMMIT is never
    sent). A one-statement fenced write commits on its own once it has its lock: the
    cancellation sends the server a cancel request, but a lock that arrives first lets
    the write through. Its outcome is then unknown to the caller, as after an
    unacknowledged commit, and the row holds one of exactly two states."""
    async with ValidationJobSource(db_url, config(db_url)) as source:
        job_id = await source.submit_owned(REQUEST, submission_id="sub-1")
        fence = (await source.claim_next_owned("worker-a", claim_token="token-1")).claim_fence
        async with row_locked_elsewhere(db_url, job_id):
            if shape == "transaction":  # a batch naming one fence twice runs as a transaction
                call = source.complete_many_owned([(fence, {"never": True}), (fence, {"never": True})])
            else:
                call = source.complete_owned(fence, {"never": True})
            waiting = asyncio.create_task(call)
            await asyncio.sleep(0.3)
            assert not waiting.done(), "the write must be waiting for the row lock"
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        # The cancelled call holds nothing: its connection was never handed back open.
        for _ in range(100):
            try:
                raw(db_url, "SELECT id FROM validation_jobs WHERE id = ? FOR UPDATE NOWAIT", (job_id,))
                break
            except Exception:  # the ended session's lock may take a moment to go
                await asyncio.sleep(0.02)
        else:
            pytest.fail("the cancelled call still holds the row lock")
        status = row(db_url, QueueKind.VALIDATION, job_id)["status"]
        if shape == "transaction":
            assert status == "claimed", "the cancelled transaction was not applied"
        else:
            assert status in ("claimed", "completed")
        if status == "claimed":
            assert await source.heartbeat_owned(fence) is True
            assert await source.complete_owned(fence, {"done": True}) is True
        else:
            assert await source.complete_owned(fence, {"done": True}) is False  # already applied
        assert await source.get_job(job_id) is not None


async def test_the_connection_pool_hands_out_only_connections_whose_transaction_ended_cleanly(db_url: str) -> None:
    from tenure.adapters.postgres.connections import Connections

    pool = Connections(db_url, 2)
    deadline = asyncio.get_running_loop().time() + 30

    async def take() -> Any:
        return await pool.take(deadline)

    try:
        first = await take()
        pool.give_back(first, clean=True)
        assert await take() is first, "a clean connection is reused"
        pool.give_back(first, clean=False)
        second = await take()
        assert second is not first and first.is_closed(), "an unclean end terminates the connection"
        left_open = second.transaction()
        await left_open.start()
        pool.give_back(second, clean=True)
        third = await take()
        assert third is not second and second.is_closed(), "a connection still in a transaction is never reused"
        fourth = await take()
        waiting = asyncio.create_task(take())
        await asyncio.sleep(0.1)
        assert not waiting.done(), "no more than the limit are open at once"
        pool.give_back(fourth, clean=True)
        assert await waiting is fourth
        pool.give_back(third, clean=True)
        pool.give_back(fourth, clean=True)
    finally:
        await pool.close(deadline)
    assert third.is_closed() and fourth.is_closed(), "closing the pool closes its idle connections"
