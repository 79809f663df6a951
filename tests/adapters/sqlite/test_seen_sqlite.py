"""SQLite's fast path: a fenced write decided from the row last seen, inside the write
transaction, without reading the row first.

A SQLite write transaction holds the whole database's write lock from ``BEGIN
IMMEDIATE`` and reads its clock after it, so the kernel can decide a heartbeat,
completion or failure from the row this source last read or wrote, at the exact
transaction time. The write then compares every column of the stored row (not only the
mutable ones) with that row: the row written is the very row decided on. Any row not as
seen writes nothing and the same transaction reads the row and decides again (the
reference path). Here foreign writers change the row behind the source's back, in a
mutable column (the lease) and in a column tenure never writes (``max_attempts``), and
deliberately broken copies of the statement show that each comparison matters.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from adapter_support import raw, row

from tenure.adapters import ValidationJobSource
from tenure.adapters.core import store as core_store
from tenure.adapters.sqlite import store as sqlite_store
from tenure.model import JobStatus, QueueKind, TenureError, ValidationJob, WorkerConfig

pytestmark = pytest.mark.parametrize("database", ["sqlite"])


def config(db_url: str) -> WorkerConfig:
    return WorkerConfig(db_url, lease_seconds=60, heartbeat_seconds=10)


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[str]]:
    """The statements every SQLite call runs, by their first words."""
    counted: collections.Counter[str] = collections.Counter()
    original = sqlite_store._statement  # noqa: SLF001

    def counting(connection: Any, sql: str, parameters: Any) -> list[Any]:
        words = sql.split()
        counted[" ".join(words[:2]) if words[0] in ("SELECT", "UPDATE", "INSERT", "BEGIN") else words[0]] += 1
        return original(connection, sql, parameters)

    monkeypatch.setattr(sqlite_store, "_statement", counting)
    yield counted


def broken_update_seen(monkeypatch: pytest.MonkeyPatch, compared: str) -> None:
    """A mutant of the from-seen compare-and-set that compares only ``compared`` columns
    (``key``: the row's key alone; ``mutable``: what the reference path compares)."""
    original = core_store.SharedPrimitives.statements

    def statements(self: Any, binding: Any) -> Any:
        real = original(self, binding)
        spec = binding.spec
        assignments = ", ".join(f"{c} = :{c}" for c in spec.mutable_names)
        where = f"{binding.key_column} = :old_key"
        if compared == "mutable":
            where += "".join(f" AND {c} IS :old_{c}" for c in spec.mutable_names)
        sql = f"UPDATE {real.table} SET {assignments} WHERE {where} RETURNING {', '.join(real.columns)}"
        return dataclasses.replace(real, update_seen=sql)

    monkeypatch.setattr(core_store.SharedPrimitives, "statements", statements)


async def claimed(source: ValidationJobSource, name: str = "a") -> Any:
    await source.submit_owned(ValidationJob("orders", "1", f"{name}.jsonl", job_id=f"job-{name}"), submission_id=f"s-{name}")
    claim = await source.claim_next_owned("worker", claim_token=f"t-{name}")
    assert claim is not None and claim.claim_fence is not None
    return claim.claim_fence


async def test_a_fenced_write_from_the_row_last_seen_reads_nothing_first(
    db_url: str, statements: collections.Counter[str],
) -> None:
    async with ValidationJobSource(db_url, config(db_url)) as source:
        fence = await claimed(source)
        statements.clear()
        assert await source.heartbeat_owned(fence) is True
        assert await source.complete_owned(fence, {"rows": 3}) is True
        assert statements == {"BEGIN IMMEDIATE": 2, "UPDATE tenure_clock": 2, "UPDATE validation_jobs": 2, "COMMIT": 2}
        statements.clear()
        # The repeat is a refusal: the row is read now and the refusal decided on it.
        assert await source.complete_owned(fence, {"rows": 3}) is False
        assert statements["SELECT id,"] == 1 and statements["UPDATE validation_jobs"] == 0
    assert row(db_url, QueueKind.VALIDATION, "job-a")["status"] == "completed"


async def test_a_row_never_seen_is_read_and_decided_as_before(
    db_url: str, statements: collections.Counter[str],
) -> None:
    async with ValidationJobSource(db_url, config(db_url)) as writer:
        fence = await claimed(writer)
    async with ValidationJobSource(db_url, config(db_url)) as source:  # a new source has seen nothing
        statements.clear()
        assert await source.heartbeat_owned(fence) is True
        assert statements["SELECT id,"] == 1 and statements["UPDATE validation_jobs"] == 1
        statements.clear()
        assert await source.heartbeat_owned(fence) is True  # now it has seen the row
        assert statements["SELECT id,"] == 0 and statements["UPDATE validation_jobs"] == 1


async def expired_behind_the_sources_back(db_url: str, statements: collections.Counter[str] | None = None) -> bool:
    """A plain UPDATE ends the lease after the source last saw the row; the heartbeat's
    answer (the reference path refuses it: the lease ran out)."""
    async with ValidationJobSource(db_url, config(db_url)) as source:
        fence = await claimed(source)
        raw(db_url, "UPDATE validation_jobs SET lease_expires_at = '2000-01-01 00:00:00.000000' WHERE id = 'job-a'")
        if statements is not None:
            statements.clear()
        return await source.heartbeat_owned(fence)


async def test_a_lease_ended_behind_the_sources_back_is_refused(db_url: str, statements: collections.Counter[str]) -> None:
    assert await expired_behind_the_sources_back(db_url, statements) is False
    # The fast write found the row not as seen; the row was read and decided on.
    assert statements["UPDATE validation_jobs"] == 1 and statements["SELECT id,"] == 1
    assert row(db_url, QueueKind.VALIDATION, "job-a")["lease_expires_at"].startswith("2000-")


async def test_the_mutant_that_compares_only_the_key_renews_that_lease(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    broken_update_seen(monkeypatch, "key")
    assert await expired_behind_the_sources_back(db_url) is True, "the mutant writes on the stale row"


async def fail_after_max_attempts_changed(db_url: str) -> JobStatus | None:
    """A foreign writer lowers ``max_attempts`` (a column tenure never writes) to the
    attempt in flight after the source last saw the row; a retryable failure must then
    finish the job: no attempt is left."""
    async with ValidationJobSource(db_url, config(db_url)) as source:
        fence = await claimed(source)
        raw(db_url, "UPDATE validation_jobs SET max_attempts = attempt WHERE id = 'job-a'")
        return await source.fail_owned_status(fence, "boom", retry=True)


async def test_a_column_tenure_never_writes_is_compared_too(db_url: str) -> None:
    assert await fail_after_max_attempts_changed(db_url) is JobStatus.FAILED
    assert row(db_url, QueueKind.VALIDATION, "job-a")["status"] == "failed"


async def test_the_mutant_that_compares_only_the_mutable_columns_fails_the_call(
    db_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Compared like the reference path's write (mutable columns only), the retry decided
    on the old limit is written; only the check of the returned row against the decided
    one catches it, rolls the transaction back and fails the call that the real
    statement answers."""
    broken_update_seen(monkeypatch, "mutable")
    with pytest.raises(TenureError) as raised:
        await fail_after_max_attempts_changed(db_url)
    assert raised.value.reason == "read_back_mismatch"
    assert row(db_url, QueueKind.VALIDATION, "job-a")["status"] == "claimed"  # nothing kept


async def test_a_batch_with_one_row_not_as_seen_keeps_none_of_its_fast_writes(
    db_url: str, statements: collections.Counter[str],
) -> None:
    """All or nothing: the fast writes before the row found changed are undone (to a
    savepoint), and the whole batch is decided again on the rows read now. Kept, they
    would make the batch refuse its own completions (the rows read again would be
    completed already) and move their versions twice."""
    async with ValidationJobSource(db_url, config(db_url)) as source:
        fences = [await claimed(source, name) for name in ("a", "b", "c", "d")]
        raw(db_url, "UPDATE validation_jobs SET error_message = 'touched' WHERE id = 'job-c'")
        versions = dict(raw(db_url, "SELECT id, row_version FROM validation_jobs"))
        statements.clear()
        assert await source.complete_many_owned([(fence, {"n": 1}) for fence in fences[:3]]) == [True, True, True]
        after = dict(raw(db_url, "SELECT id, row_version FROM validation_jobs"))
        assert {key: after[key] - versions[key] for key in versions} == {"job-a": 1, "job-b": 1, "job-c": 1, "job-d": 0}
        assert statements["SAVEPOINT"] == 1 and statements["ROLLBACK"] == 1 and statements["SELECT id,"] == 1
        statements.clear()
        assert await source.heartbeat_many_owned(fences[3:]) == [True]  # seen: no read, no savepoint
        assert statements["SELECT id,"] == 0 and statements["SAVEPOINT"] == 0
