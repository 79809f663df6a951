"""Decided-ahead statements on a real PostgreSQL server: one round trip per fenced write,
and still no write with a time from before the lock.

The kernel decides a heartbeat or a completion ahead from the row last seen, with a
validity window; one autocommit statement locks the row, reads the clock after the lock
and writes only if the row still equals that record and the clock lies in the window.
Here a second session holds the row lock past the lease, as a lock-only holder and as an
updating holder, under every plan shape the planner can be forced into, and the write is
refused, where the plain single-statement fenced UPDATE (the benchmark's floor) accepts
it. The fallbacks (a stale remembered row, a remembered refusal that no longer holds,
duplicate keys, a trigger that changes a written value) answer exactly as the
transaction path does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from adapter_support import raw, row
from lock_waits import held_elsewhere, with_longer_leases

from tenure.adapters import ValidationJobSource
from tenure.model import ErrorCode, QueueKind, TenureError, ValidationJob, WorkerConfig

pytestmark = pytest.mark.parametrize("database", ["postgresql"])

PLANS = {
    "default": (),
    "no-nestloop": ("enable_nestloop",),
    "no-hashjoin": ("enable_hashjoin",),
    "no-mergejoin": ("enable_mergejoin",),
    "no-seqscan": ("enable_seqscan",),
    "only-mergejoin": ("enable_nestloop", "enable_hashjoin"),
    "only-hashjoin": ("enable_nestloop", "enable_mergejoin"),
}
"""Planner switches turned off for the library's connections (``ALTER DATABASE``)."""


def config(db_url: str, lease_s: float) -> WorkerConfig:
    return WorkerConfig(db_url, lease_seconds=lease_s, heartbeat_seconds=lease_s / 4)


class Spy:
    """Counts the store's decided-ahead statements and transactions, and keeps the SQL
    text and argument count of each one-statement call it sent (``sent``)."""

    def __init__(self, source: ValidationJobSource) -> None:
        store = source._engine.store  # noqa: SLF001
        self.statements = 0
        self.transactions = 0
        self.sent: list[tuple[str, int]] = []
        write_ahead, run, fetch_once = store.write_ahead, store.run, store._fetch_once  # noqa: SLF001

        async def counted_write_ahead(*args: Any, **kwargs: Any) -> Any:
            self.statements += 1
            return await write_ahead(*args, **kwargs)

        async def counted_run(*args: Any, **kwargs: Any) -> Any:
            self.transactions += 1
            return await run(*args, **kwargs)

        async def recorded(pool: Any, deadline: float, sql: str, arguments: list[Any]) -> list[Any]:
            self.sent.append((sql, len(arguments)))
            return await fetch_once(pool, deadline, sql, arguments)

        store.write_ahead, store.run, store._fetch_once = counted_write_ahead, counted_run, recorded  # noqa: SLF001

    def reset(self) -> None:
        self.statements = self.transactions = 0


@contextlib.contextmanager
def forced_plan(db_url: str, switches: tuple[str, ...]) -> Iterator[None]:
    database = db_url.rsplit("/", 1)[1]
    for switch in switches:
        raw(db_url, f'ALTER DATABASE "{database}" SET {switch} = off')
    try:
        yield
    finally:
        raw(db_url, f'ALTER DATABASE "{database}" RESET ALL')


async def claimed_source(db_url: str, lease_s: float, job_id: str = "job-a") -> tuple[ValidationJobSource, Any]:
    """``job_id`` submitted and claimed with a lease of ``lease_s`` (the rows of an earlier,
    inconclusive attempt of a lock-wait scenario are removed first: one is claimable)."""
    raw(db_url, "DELETE FROM validation_jobs WHERE id <> ?", (job_id,))
    source = ValidationJobSource(db_url, config(db_url, lease_s))
    await source.submit_owned(ValidationJob("orders", "1", "a.jsonl", job_id=job_id), submission_id="s-" + job_id)
    claimed = await source.claim_next_owned("worker-a", claim_token="t-" + job_id)
    assert claimed is not None and claimed.claim_fence is not None and claimed.job_id == job_id
    return source, claimed.claim_fence


async def test_a_fenced_write_is_one_statement(db_url: str) -> None:
    source, fence = await claimed_source(db_url, 30)
    spy = Spy(source)
    try:
        assert await source.heartbeat_owned(fence) is True
        assert await source.heartbeat_many_owned([fence]) == [True]
        assert await source.complete_owned(fence, {"rows": 3}) is True
        assert (spy.statements, spy.transactions) == (3, 0)
        spy.reset()
        assert await source.complete_owned(fence, {"rows": 3}) is False  # the repeat: remembered, refused
        assert (spy.statements, spy.transactions) == (1, 0)
    finally:
        await source.close()
    assert row(db_url, QueueKind.VALIDATION, "job-a")["status"] == "completed"


@pytest.mark.parametrize("plan", sorted(PLANS))
@pytest.mark.parametrize("holder", ["lock-only", "updating"])
@pytest.mark.parametrize("operation", ["heartbeat", "complete"])
async def test_a_lease_that_ran_out_behind_a_lock_wait_refuses_the_write(
    db_url: str, plan: str, holder: str, operation: str
) -> None:
    async def scenario(lease_s: float, attempt: int) -> None:
        job_id = f"job-{attempt}"
        source, fence = await claimed_source(db_url, lease_s, job_id)
        spy = Spy(source)
        try:
            before = row(db_url, QueueKind.VALIDATION, job_id)
            async with held_elsewhere(db_url, job_id,
                                      move_lease_to_expire_in_s=0.3 if holder == "updating" else None) as held:
                call = (source.heartbeat_owned(fence) if operation == "heartbeat"
                        else source.complete_owned(fence, {"late": True}))
                pending = asyncio.ensure_future(call)
                await held.blocked(pending)  # the write waits for the row lock, its lease live
                await held.until_lease_ran_out()
            assert await pending is False
            assert spy.transactions == 0 and 1 <= spy.statements <= 2
            after = row(db_url, QueueKind.VALIDATION, job_id)
            assert after["status"] == "claimed" and after["completed_at"] is None
            if holder == "lock-only":
                assert after == before
        finally:
            await source.close()

    with forced_plan(db_url, PLANS[plan]):
        await with_longer_leases(scenario)


async def test_the_single_statement_floor_accepts_that_stale_write(db_url: str) -> None:
    """The contrast that gives the test above its teeth: the plain fenced UPDATE reads
    the clock in its WHERE clause before the lock wait, and writes after the lease ran
    out behind a lock-only holder."""
    async def scenario(lease_s: float, attempt: int) -> None:
        job_id = f"job-{attempt}"
        source, fence = await claimed_source(db_url, lease_s, job_id)
        await source.close()
        floor = await asyncpg.connect(db_url)
        try:
            async with held_elsewhere(db_url, job_id) as held:
                pending = asyncio.ensure_future(floor.fetch(
                    "UPDATE validation_jobs SET status = 'completed', completed_at = clock_timestamp(), "
                    "lease_expires_at = NULL WHERE id = $1 AND claim_token = $2 AND generation = $3 "
                    "AND lease_expires_at > clock_timestamp() RETURNING id", fence.job_id, fence.claim_token,
                    fence.generation,
                ))
                await held.blocked(pending)
                await held.until_lease_ran_out()
            written = await pending
        finally:
            await floor.close()
        assert [tuple(r) for r in written] == [(job_id,)], "the floor writes after the lease ran out"
        assert row(db_url, QueueKind.VALIDATION, job_id)["status"] == "completed"

    await with_longer_leases(scenario)


async def test_a_stale_remembered_row_costs_one_more_statement(db_url: str) -> None:
    source, fence = await claimed_source(db_url, 30)
    spy = Spy(source)
    try:
        raw(db_url, "UPDATE validation_jobs SET lease_expires_at = lease_expires_at + interval '1 hour' WHERE id = 'job-a'")
        assert await source.heartbeat_owned(fence) is True
        assert (spy.statements, spy.transactions) == (2, 0)
        spy.reset()
        assert await source.heartbeat_owned(fence) is True
        assert (spy.statements, spy.transactions) == (1, 0)
    finally:
        await source.close()


async def test_a_remembered_refusal_that_no_longer_holds_is_not_trusted(db_url: str) -> None:
    """The source remembers the row with its lease run out (so the kernel, deciding
    ahead, refuses); another writer renews the lease. The statement sees a row that
    differs from the remembered one, and the kernel decides again on the row as it is."""
    source, fence = await claimed_source(db_url, 30)
    try:
        raw(db_url, "UPDATE validation_jobs SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = 'job-a'")
        assert await source.heartbeat_owned(fence) is False  # remembers the expired row
        raw(db_url, "UPDATE validation_jobs SET lease_expires_at = clock_timestamp() + interval '1 hour' WHERE id = 'job-a'")
        assert await source.heartbeat_owned(fence) is True
    finally:
        await source.close()


async def test_a_batch_with_a_repeated_key_runs_as_one_transaction(db_url: str) -> None:
    source, fence = await claimed_source(db_url, 30)
    spy = Spy(source)
    try:
        assert await source.complete_many_owned([(fence, {"first": 1}), (fence, {"second": 2})]) == [True, False]
        assert (spy.statements, spy.transactions) == (0, 1)
    finally:
        await source.close()
    stored = row(db_url, QueueKind.VALIDATION, "job-a")["result_json"]
    assert (json.loads(stored) if isinstance(stored, str) else stored) == {"first": 1}


async def test_a_batch_is_one_statement_and_all_or_nothing(db_url: str) -> None:
    source = ValidationJobSource(db_url, config(db_url, 30))
    spy = Spy(source)
    try:
        fences = []
        for name in ("a", "b", "c"):
            await source.submit_owned(ValidationJob("orders", "1", f"{name}.jsonl", job_id=f"job-{name}"), submission_id=f"s-{name}")
            claimed = await source.claim_next_owned("worker", claim_token=f"t-{name}")
            fences.append(claimed.claim_fence)
        spy.reset()
        assert await source.heartbeat_many_owned(fences) == [True, True, True]
        assert (spy.statements, spy.transactions) == (1, 0)
        # One row changed behind the source's back: the first statement writes nothing,
        # the second decides from the rows it returned and writes all three.
        raw(db_url, "UPDATE validation_jobs SET lease_expires_at = lease_expires_at + interval '1 hour' WHERE id = 'job-b'")
        spy.reset()
        assert await source.complete_many_owned([(fence, {"n": 1}) for fence in fences]) == [True, True, True]
        assert (spy.statements, spy.transactions) == (2, 0)
    finally:
        await source.close()


async def test_a_trigger_that_changes_a_written_value_keeps_nothing(db_url: str) -> None:
    source, fence = await claimed_source(db_url, 30)
    raw(db_url, """CREATE FUNCTION shorten_lease() RETURNS trigger LANGUAGE plpgsql AS
                   $$ BEGIN NEW.lease_expires_at := NEW.lease_expires_at - interval '1 second'; RETURN NEW; END $$""")
    raw(db_url, "CREATE TRIGGER shorten_lease BEFORE UPDATE ON validation_jobs FOR EACH ROW EXECUTE FUNCTION shorten_lease()")
    before = row(db_url, QueueKind.VALIDATION, "job-a")
    try:
        with pytest.raises(TenureError) as raised:
            await source.heartbeat_owned(fence)
        assert (raised.value.code, raised.value.reason) == (ErrorCode.QUEUE_PERSISTENCE_FAILED, "read_back_mismatch")
    finally:
        await source.close()
    assert row(db_url, QueueKind.VALIDATION, "job-a") == before


MUTANTS = {
    "clock read before the lock": "clock",
    "rows read without a lock": "finder",
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
async def test_a_statement_without_its_lock_first_order_would_accept_the_stale_write(
    db_url: str, monkeypatch: pytest.MonkeyPatch, mutant: str
) -> None:
    """The mutants the lock-wait test exists to catch: the same statement with its clock
    read before the row lock, or with the rows read without taking the lock (the UPDATE
    then waits instead, with a clock and a comparison from before the wait), completes
    after the lease ran out."""
    import dataclasses

    from tenure.adapters.postgres import statements as postgres_statements
    from tenure.kernel.queue import finders

    if MUTANTS[mutant] == "clock":
        monkeypatch.setattr(postgres_statements, "CLOCK_AFTER_LOCKS",
                            "clock AS MATERIALIZED (SELECT clock_timestamp() AS now, (SELECT count(*) FROM locked) AS locked_rows)")
    else:
        monkeypatch.setattr(finders, "by_keys", dataclasses.replace(finders.by_keys, lock="none"))
    postgres_statements.clear_statement_cache()

    async def scenario(lease_s: float, attempt: int) -> str:
        job_id = f"job-{attempt}"
        source, fence = await claimed_source(db_url, lease_s, job_id)
        try:
            async with held_elsewhere(db_url, job_id) as held:
                pending = asyncio.ensure_future(source.complete_owned(fence, {"late": True}))
                await held.blocked(pending)
                await held.until_lease_ran_out()
            assert await pending is True, "the mutant writes after the lease ran out"
        finally:
            await source.close()
        return job_id

    try:
        job_id = await with_longer_leases(scenario)
    finally:
        postgres_statements.clear_statement_cache()
    assert row(db_url, QueueKind.VALIDATION, job_id)["status"] == "completed"


# --- the row version: one integer instead of the whole pre-image ---------------------------------


async def test_a_row_known_by_its_version_is_compared_by_it_alone_and_sends_only_what_changed(db_url: str) -> None:
    source, fence = await claimed_source(db_url, 30)
    sent = Spy(source)
    try:
        assert await source.heartbeat_owned(fence) is True  # the claim returned the version it wrote
        assert await source.complete_owned(fence, {"n": 1}) is True
    finally:
        await source.close()
    (heartbeat, heartbeat_arguments), (complete, _) = sent.sent[:2]
    assert "l.row_version =" in heartbeat and "l.row_version =" in complete
    assert heartbeat_arguments <= 8  # the version, the key, the window, the lease: not the whole row twice
    assert "SET lease_expires_at =" in heartbeat and "status =" not in heartbeat
    assert "status =" in complete and "result_json =" in complete
    assert row(db_url, QueueKind.VALIDATION, "job-a")["status"] == "completed"


async def test_a_foreign_change_to_a_column_no_write_compares_is_seen_by_the_version(db_url: str) -> None:
    """The whole-pre-image comparison covers the columns a write may change; the version
    covers every column: a row whose immutable payload another writer rewrote is not the
    row the source remembers, and costs one more statement (decided again on the row as
    it is now), never a write on the remembered image."""
    source, fence = await claimed_source(db_url, 30)
    spy = Spy(source)
    try:
        assert await source.heartbeat_owned(fence) is True
        raw(db_url, "UPDATE validation_jobs SET data_json = '\"b.jsonl\"' WHERE id = 'job-a'")
        spy.reset()
        assert await source.heartbeat_owned(fence) is True
        assert (spy.statements, spy.transactions) == (2, 0)
    finally:
        await source.close()


async def expired_behind_the_sources_back(db_url: str) -> bool:
    """A heartbeat after a plain UPDATE ran the remembered lease out: what it answers."""
    source, fence = await claimed_source(db_url, 30)
    try:
        assert await source.heartbeat_owned(fence) is True  # remembered with its version
        raw(db_url, "UPDATE validation_jobs SET lease_expires_at = clock_timestamp() - interval '1 second', "
                    "claimed_at = claimed_at WHERE id = 'job-a'")
        return await source.heartbeat_owned(fence)
    finally:
        await source.close()


async def test_a_lease_run_out_by_another_writer_refuses_the_heartbeat(db_url: str) -> None:
    assert await expired_behind_the_sources_back(db_url) is False


async def test_the_mutant_that_does_not_compare_the_version_renews_the_expired_lease(
    db_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mutant the test above exists to catch: a verdict that trusts the remembered row
    without comparing its version writes on the stale image (renews a lease that ran out)."""
    from tenure.adapters.postgres import statements as postgres_statements

    monkeypatch.setattr(postgres_statements, "VERSION_UNCHANGED", "true")
    postgres_statements.clear_statement_cache()
    try:
        assert await expired_behind_the_sources_back(db_url) is True, "the mutant writes on the stale row"
    finally:
        postgres_statements.clear_statement_cache()


# --- the claim: one statement, verified in SQL, committed alone -------------------------------


async def test_a_claim_is_one_statement_and_no_transaction(db_url: str) -> None:
    source = ValidationJobSource(db_url, config(db_url, 30))
    try:
        for n in range(3):
            await source.submit_owned(ValidationJob("orders", "1", f"{n}.jsonl"), submission_id=f"s-{n}")
        sent = Spy(source)
        one = await source.claim_next_owned("worker-a", claim_token="t-1")
        batch = await source.claim_batch_owned("worker-a", claim_tokens=["t-2", "t-3", "t-4"])
        nothing = await source.claim_next_owned("worker-a", claim_token="t-5")
        assert one is not None and len(batch) == 2 and nothing is None
        assert sent.transactions == 0
        assert [sql.startswith("WITH clock AS MATERIALIZED") for sql, _ in sent.sent] == [True] * 3
        assert await source.complete_owned(one.claim_fence, {}) is True  # decided ahead from the claimed row
        assert sent.transactions == 0
    finally:
        await source.close()


async def test_an_expired_claim_to_settle_sends_the_claim_through_its_transaction(db_url: str) -> None:
    source = ValidationJobSource(db_url, config(db_url, 0.2))
    try:
        await source.submit_owned(ValidationJob("orders", "1", "a.jsonl", job_id="job-a"), submission_id="s-a")
        assert await source.claim_next_owned("worker-a", claim_token="t-1") is not None
        await asyncio.sleep(0.3)  # the lease runs out: the one statement is blocked, the sweep must run
        sent = Spy(source)
        again = await source.claim_next_owned("worker-b", claim_token="t-2")
        assert again is not None and again.job_id == "job-a" and again.claim_fence.generation == 2
        assert (len(sent.sent), sent.transactions) == (1, 1)
    finally:
        await source.close()


async def test_the_claim_without_its_verification_commits_a_changed_owner(
    db_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mutant the claim's SQL verification exists to stop: with every check of the
    written row replaced by ``true``, a claim whose owner a trigger folded commits before
    anything can notice (tests/adapters/queue/test_sources.py holds the real statement to
    keeping the row as it was)."""
    from adapter_support import install_owner_folding_trigger

    from tenure.adapters.postgres import statements as postgres_statements

    monkeypatch.setattr(postgres_statements, "_strictly_equal", lambda *_: "true")
    postgres_statements.clear_statement_cache()
    try:
        source = ValidationJobSource(db_url, config(db_url, 30))
        try:
            job_id = await source.submit_owned(ValidationJob("orders", "1", "a.jsonl"), submission_id="s-a")
            install_owner_folding_trigger(db_url, QueueKind.VALIDATION)
            with pytest.raises(TenureError) as caught:
                await source.claim_next_owned("Worker-A", claim_token="t-1")
            assert caught.value.reason == "claim_identity_changed"
        finally:
            await source.close()
    finally:
        postgres_statements.clear_statement_cache()
    stored = row(db_url, QueueKind.VALIDATION, job_id)
    assert (stored["status"], stored["claimed_by"]) == ("claimed", "worker-a"), "the mutant committed the folded owner"


# --- the plain decision with its window read from the declared time guards ------------------


@pytest.mark.parametrize("mutant", [None, "interpreted", "compiled"])
async def test_a_stale_fence_is_refused_on_the_fast_path_and_the_mutant_that_skips_the_fence_renews_it(
    db_url: str, monkeypatch: pytest.MonkeyPatch, mutant: str | None,
) -> None:
    """The fast path decides with the kernel's guards, the fence among them; the mutant
    that reads only the declared time guards (skipping every other guard) renews a
    lease for a fence that is not the current one: on the generic interpreter
    (``Engine.compiled`` off, ``decide_windowed`` broken) and on the compiled deciders
    (the machine's guards broken in place after the claim: the decider is generated again)."""
    import dataclasses

    from tenure.adapters.core.engine import Engine, deciders
    from tenure.kernel import ahead as kernel_ahead
    from tenure.kernel.queue.machine import QUEUE
    from tenure.model import QueueClaimFence

    def skipped(machine: Any) -> dict[str, Any]:
        return {name: (lambda *_: False) if name not in machine.time_guards and name != "always" else guard
                for name, guard in machine.guards.items()}

    if mutant == "interpreted":
        def skipping_the_fence(machine: Any, record: Any, command: Any, reference_us: int) -> Any:
            return kernel_ahead.decide_windowed(dataclasses.replace(machine, guards=skipped(machine)), record, command,
                                                reference_us)

        monkeypatch.setattr(Engine, "compiled", False)
        monkeypatch.setattr(deciders, "decide_windowed", skipping_the_fence)
    source, fence = await claimed_source(db_url, 30)
    if mutant == "compiled":
        for name, guard in skipped(QUEUE).items():
            monkeypatch.setitem(QUEUE.guards, name, guard)
    spy = Spy(source)
    try:
        stale = QueueClaimFence(fence.queue, fence.job_id, fence.owner_id, fence.generation, "not-the-token")
        before = row(db_url, QueueKind.VALIDATION, "job-a")
        assert await source.heartbeat_owned(stale) is (mutant is not None)
        assert (spy.statements, spy.transactions) == (1, 0)  # decided ahead, one statement
    finally:
        await source.close()
    renewed = row(db_url, QueueKind.VALIDATION, "job-a")["lease_expires_at"] != before["lease_expires_at"]
    assert renewed is (mutant is not None)


async def test_a_written_text_is_verified_byte_for_byte_even_under_a_case_blind_collation(db_url: str) -> None:
    """Under a nondeterministic (case-insensitive) collation ``'Boom' = 'boom'`` holds, so
    an equality check would pass a value a trigger folded; the statements compare texts
    byte for byte (``COLLATE "C"``) and keep nothing."""
    source, fence = await claimed_source(db_url, 30)
    raw(db_url, "CREATE COLLATION case_blind (provider = icu, locale = 'und-u-ks-level2', deterministic = false)")
    raw(db_url, "ALTER TABLE validation_jobs ALTER COLUMN error_message TYPE text COLLATE case_blind")
    raw(db_url, """CREATE FUNCTION fold_error() RETURNS trigger LANGUAGE plpgsql AS
                   $$ BEGIN NEW.error_message := lower(NEW.error_message); RETURN NEW; END $$""")
    raw(db_url, "CREATE TRIGGER fold_error BEFORE UPDATE ON validation_jobs FOR EACH ROW EXECUTE FUNCTION fold_error()")
    before = row(db_url, QueueKind.VALIDATION, "job-a")
    try:
        with pytest.raises(TenureError) as raised:
            await source.fail_owned(fence, "Boom", retry=False)
        assert (raised.value.code, raised.value.reason) == (ErrorCode.QUEUE_PERSISTENCE_FAILED, "read_back_mismatch")
    finally:
        await source.close()
    assert row(db_url, QueueKind.VALIDATION, "job-a") == before
