"""Database time: read after the last lock, and on SQLite never backwards.

PostgreSQL: a batch (and anything else that locks several rows) reads the clock after
its last row lock, so a row whose lock was held elsewhere past its lease answers exactly
as its single call would: refused. SQLite: the process clock may step back; the file's
high-water mark keeps database time from following it, for every process on the file.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from adapter_support import row
from tenure.adapters import ValidationJobSource
from tenure.adapters.sqlite import store as sqlite_store
from tenure.adapters.core.tables import instant_from_sqlite_text
from tenure.model import QueueKind, ValidationJob, WorkerConfig

SECOND_US = 1_000_000


def config(db_url: str, **changes: Any) -> WorkerConfig:
    return WorkerConfig(db_url, **{"lease_seconds": 30, "heartbeat_seconds": 10, **changes})


# --- PostgreSQL: the clock after the last row lock -------------------------------------------


@contextlib.asynccontextmanager
async def held_elsewhere(db_url: str, job_id: str, *, update_lease_to_expire_in_s: float | None) -> AsyncIterator[None]:
    """Another session locks the row until the block ends: a lock-only holder, or an
    updating one that moves the lease to expire shortly (it commits with the lock's end)."""
    blocker = await asyncpg.connect(db_url)
    try:
        async with blocker.transaction():
            await blocker.fetch("SELECT id FROM validation_jobs WHERE id = $1 FOR UPDATE", job_id)
            if update_lease_to_expire_in_s is not None:
                await blocker.execute(
                    "UPDATE validation_jobs SET lease_expires_at = clock_timestamp() + make_interval(secs => $2) WHERE id = $1",
                    job_id, update_lease_to_expire_in_s,
                )
            yield
    finally:
        await blocker.close()


async def _two_claims(db_url: str, short_lease_s: float) -> tuple[ValidationJobSource, ValidationJobSource, Any, Any]:
    """``job-a`` claimed with a long lease, ``job-b`` (sorted after it) with a short one."""
    long_source = ValidationJobSource(db_url, config(db_url))
    short_source = ValidationJobSource(db_url, config(db_url, lease_seconds=short_lease_s, heartbeat_seconds=short_lease_s / 4))
    await long_source.submit_owned(ValidationJob("orders", "1", "a.jsonl", job_id="job-a"), submission_id="s-a")
    first = await long_source.claim_next_owned("worker-long", claim_token="t-a")
    await long_source.submit_owned(ValidationJob("orders", "1", "b.jsonl", job_id="job-b"), submission_id="s-b")
    second = await short_source.claim_next_owned("worker-short", claim_token="t-b")
    assert first.job_id == "job-a" and second.job_id == "job-b"
    return long_source, short_source, first.claim_fence, second.claim_fence


@pytest.mark.parametrize("database", ["postgresql"])
@pytest.mark.parametrize("holder", ["lock-only", "updating"])
@pytest.mark.parametrize("operation", ["heartbeat", "complete"])
async def test_a_batch_decides_a_later_row_with_a_clock_read_after_that_rows_lock(db_url: str, holder: str, operation: str) -> None:
    long_source, short_source, fence_a, fence_b = await _two_claims(db_url, short_lease_s=0.6)
    try:
        expire_in = 0.3 if holder == "updating" else None
        async with held_elsewhere(db_url, "job-b", update_lease_to_expire_in_s=expire_in):
            if operation == "heartbeat":
                batch = asyncio.create_task(long_source.heartbeat_many_owned([fence_a, fence_b]))
            else:
                batch = asyncio.create_task(long_source.complete_many_owned([(fence_a, {"a": 1}), (fence_b, {"b": 1})]))
            await asyncio.sleep(1.0)  # job-b's lease runs out while the batch waits for its lock
            assert not batch.done(), "the batch waits for job-b's lock"
        answers = await batch
        # job-a's long lease is live; job-b's expired during the wait: refused, exactly as
        # its single call would answer now.
        assert answers == [True, False]
        assert row(db_url, QueueKind.VALIDATION, "job-b")["status"] == "claimed"
        assert await short_source.heartbeat_owned(fence_b) is False
    finally:
        await long_source.close()
        await short_source.close()


@pytest.mark.parametrize("database", ["postgresql"])
async def test_the_same_batch_within_the_lease_applies_both(db_url: str) -> None:
    long_source, short_source, fence_a, fence_b = await _two_claims(db_url, short_lease_s=20)
    try:
        async with held_elsewhere(db_url, "job-b", update_lease_to_expire_in_s=None):
            batch = asyncio.create_task(long_source.heartbeat_many_owned([fence_a, fence_b]))
            await asyncio.sleep(0.3)
            assert not batch.done()
        assert await batch == [True, True]
    finally:
        await long_source.close()
        await short_source.close()


# --- SQLite: time that never runs backwards ---------------------------------------------------


class SteppingClock:
    """A process clock a test moves by hand (forward, or back as NTP might step it)."""

    def __init__(self, start_us: int) -> None:
        self.now_us = start_us

    def __call__(self) -> int:
        return self.now_us


@contextlib.contextmanager
def process_clock(source: ValidationJobSource, clock: SteppingClock) -> Iterator[None]:
    store = source._engine.store
    assert isinstance(store, sqlite_store.SqliteStore)
    store.wall_clock_us = clock
    yield


@pytest.mark.parametrize("database", ["sqlite"])
async def test_a_clock_stepped_back_cannot_revive_an_expired_lease(db_url: str) -> None:
    clock = SteppingClock(sqlite_store.wall_clock_us())
    async with ValidationJobSource(db_url, config(db_url, lease_seconds=10, heartbeat_seconds=2)) as source:
        with process_clock(source, clock):
            await source.submit_owned(ValidationJob("orders", "1", "a.jsonl"), submission_id="s-1")
            claimed = await source.claim_next_owned("worker-a", claim_token="t-1")
            clock.now_us += 11 * SECOND_US
            assert await source.heartbeat_owned(claimed.claim_fence) is False, "the lease ran out"
            clock.now_us -= 60 * SECOND_US  # the process clock steps back a minute
            assert await source.heartbeat_owned(claimed.claim_fence) is False
            assert await source.complete_owned(claimed.claim_fence, {"late": True}) is False
            assert row(db_url, QueueKind.VALIDATION, claimed.job_id)["status"] == "claimed"
            # Database time stood still at the mark: a new claim's lease starts there.
            taken = await source.claim_next_owned("worker-b", claim_token="t-2")
            assert taken is not None and taken.job_id == claimed.job_id
            stored = row(db_url, QueueKind.VALIDATION, claimed.job_id)
            assert instant_from_sqlite_text(stored["claimed_at"]) >= clock.now_us + 60 * SECOND_US


@pytest.mark.parametrize("database", ["sqlite"])
async def test_a_process_whose_clock_is_behind_decides_at_the_time_another_process_reached(db_url: str) -> None:
    real = sqlite_store.wall_clock_us()
    ahead, behind = SteppingClock(real + 5 * SECOND_US), SteppingClock(real - 60 * SECOND_US)
    short = config(db_url, lease_seconds=10, heartbeat_seconds=2)
    async with ValidationJobSource(db_url, short) as first, ValidationJobSource(db_url, short) as second:
        with process_clock(first, behind), process_clock(second, ahead):
            # The process ahead writes first: the file's time is now its time.
            await second.submit_owned(ValidationJob("orders", "1", "a.jsonl"), submission_id="s-1")
            claimed = await first.claim_next_owned("worker-a", claim_token="t-1")
            assert await second.heartbeat_owned(claimed.claim_fence) is True  # lease: ahead + 10 s
            ahead.now_us += 20 * SECOND_US
            await second.submit_owned(ValidationJob("orders", "1", "b.jsonl"), submission_id="s-2")  # moves the mark
            # The process behind reads the mark, 15 s past the lease, not its own clock.
            assert await first.heartbeat_owned(claimed.claim_fence) is False
            assert await first.complete_owned(claimed.claim_fence, {"late": True}) is False


@pytest.mark.parametrize("database", ["sqlite"])
async def test_without_the_high_water_mark_the_step_back_would_revive_the_lease(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario above has teeth: with the mark ignored, the stale heartbeat applies."""
    monkeypatch.setattr(sqlite_store, "_ADVANCE_CLOCK", "SELECT :wall")
    monkeypatch.setattr(sqlite_store, "_READ_CLOCK", "SELECT :wall")
    clock = SteppingClock(sqlite_store.wall_clock_us())
    async with ValidationJobSource(db_url, config(db_url, lease_seconds=10, heartbeat_seconds=2)) as source:
        with process_clock(source, clock):
            await source.submit_owned(ValidationJob("orders", "1", "a.jsonl"), submission_id="s-1")
            claimed = await source.claim_next_owned("worker-a", claim_token="t-1")
            clock.now_us += 11 * SECOND_US
            assert await source.heartbeat_owned(claimed.claim_fence) is False
            clock.now_us -= 60 * SECOND_US
            assert await source.heartbeat_owned(claimed.claim_fence) is True
