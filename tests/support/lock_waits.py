"""A second PostgreSQL session holding a job row's lock while a write waits on it, for
tests whose point is a lease that runs out *during* that wait.

Such a test needs two things a fixed sleep cannot promise on a loaded machine: the write
must be waiting on the lock while its lease is still live (it was sent before the lease
ran out), and the lease must have run out before the lock is released. The holder waits
for both, each a hang guard and never a timing: :meth:`Held.blocked` until the write's
session waits on the holder (``pg_blocking_pids``), :meth:`Held.until_lease_ran_out`
until the database clock is past the lease as the holder sees it (its own moved lease,
for a holder that moved it).

A write that ended without waiting was sent after its lease had run out (a machine slow
between the claim and the write): the attempt proves nothing, and :func:`with_longer_leases`
runs the scenario again with a lease twice as long. So the test asserts only on an
attempt whose premise held, and is as fast as the machine allows.

    async def scenario(lease_s: float, attempt: int) -> None:
        ...claim job-{attempt} with a lease of lease_s...
        async with held_elsewhere(db_url, job_id) as held:
            write = asyncio.create_task(...)
            await held.blocked(write)          # raises Inconclusive if it did not wait
            await held.until_lease_ran_out()
        assert await write is False

    await with_longer_leases(scenario)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

__all__ = ["Held", "Inconclusive", "held_elsewhere", "with_longer_leases", "LEASES_S", "HANG_GUARD_S"]

LEASES_S = (0.6, 1.2, 2.4, 4.8, 9.6, 19.2, 38.4)
"""The leases a scenario is tried with, shortest first."""

HANG_GUARD_S = 120.0

T = TypeVar("T")


class Inconclusive(Exception):
    """The write never waited on the lock: its lease ran out before it was sent."""


class Held:
    """The holder's session, inside its transaction (the row locked)."""

    def __init__(self, connection: Any, job_id: str, table: str) -> None:
        self.connection = connection
        self.job_id = job_id
        self.table = table

    async def blocked(self, write: asyncio.Future[Any]) -> None:
        """Until another session waits on this one's lock; :class:`Inconclusive` when
        ``write`` ended first (it did not wait: its lease had run out)."""
        pid = await self.connection.fetchval("SELECT pg_backend_pid()")
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + HANG_GUARD_S
        while not await self.connection.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", pid):
            if write.done():
                write.result()  # a write that failed fails the test
                raise Inconclusive
            assert loop.time() < give_up_at, "the write never reached the lock (a hang guard, not a timing)"
            await asyncio.sleep(0.005)

    async def until_lease_ran_out(self) -> None:
        """Until the database clock is past the row's lease (as this session sees it)."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + HANG_GUARD_S
        while not await self.connection.fetchval(
                f"SELECT clock_timestamp() > lease_expires_at FROM {self.table} WHERE id = $1", self.job_id):
            assert loop.time() < give_up_at, "the lease never ran out (a hang guard, not a timing)"
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def held_elsewhere(db_url: str, job_id: str, *, move_lease_to_expire_in_s: float | None = None,
                         table: str = "validation_jobs") -> AsyncIterator[Held]:
    """Another session holds the row's lock until the block ends: lock-only, or moving the
    lease to expire shortly after its own clock (committed when the lock ends)."""
    holder = await asyncpg.connect(db_url)
    try:
        async with holder.transaction():
            await holder.fetch(f"SELECT id FROM {table} WHERE id = $1 FOR UPDATE", job_id)
            if move_lease_to_expire_in_s is not None:
                await holder.execute(
                    f"UPDATE {table} SET lease_expires_at = clock_timestamp() + make_interval(secs => $2) "
                    "WHERE id = $1", job_id, move_lease_to_expire_in_s)
            yield Held(holder, job_id, table)
    finally:
        await holder.close()


async def with_longer_leases(scenario: Callable[[float, int], Awaitable[T]]) -> T:
    """``scenario(lease_s, attempt)`` with each of :data:`LEASES_S` until one attempt is
    not :class:`Inconclusive` (each attempt must use rows of its own)."""
    for attempt, lease_s in enumerate(LEASES_S):
        try:
            return await scenario(lease_s, attempt)
        except Inconclusive:
            continue
    raise AssertionError(f"the write never waited on the lock before its lease ran out, even with {LEASES_S[-1]} s")
