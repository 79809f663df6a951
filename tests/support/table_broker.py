"""A broker whose jobs live in a PostgreSQL table, so they outlive the process that
published them (the two-boot recovery tests kill that process with ``kill -9``).

It keeps the port's contract and nothing more: ``publish`` is idempotent by key,
``probe`` answers the state (with ``started_at`` for an active job, and the queue and
wire priority it holds), ``abort`` stops a live job. ``take`` hands the next queued job
of a queue to a worker (lowest wire priority first), ``finish`` completes it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import asyncpg

from tenure.adapters import BrokerProbe
from tenure.model import BrokerJobState

SCHEMA = """
CREATE TABLE IF NOT EXISTS test_broker_jobs (
    key text PRIMARY KEY, queue text NOT NULL, wire_priority integer NOT NULL, state text NOT NULL,
    started_at timestamptz, serial bigserial
);
CREATE TABLE IF NOT EXISTS test_checkpoints (run_id text PRIMARY KEY, owner_id text NOT NULL);
"""


class TableBroker:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.connection: Any = None

    async def __aenter__(self) -> TableBroker:
        self.connection = await asyncpg.connect(self.dsn)
        await self.connection.execute(SCHEMA)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.connection.close()

    async def publish(self, key: str, *, queue: str, wire_priority: int) -> None:
        await self.connection.execute(
            "INSERT INTO test_broker_jobs (key, queue, wire_priority, state) VALUES ($1, $2, $3, 'queued') "
            "ON CONFLICT (key) DO NOTHING", key, queue, wire_priority)

    async def probe(self, key: str) -> BrokerProbe:
        row = await self.connection.fetchrow(
            "SELECT queue, wire_priority, state, started_at FROM test_broker_jobs WHERE key = $1", key)
        if row is None:
            return BrokerProbe(BrokerJobState.ABSENT)
        state = BrokerJobState(row["state"])
        return BrokerProbe(state, row["started_at"] if state is BrokerJobState.ACTIVE else None,
                           queue=row["queue"], wire_priority=row["wire_priority"])

    async def abort(self, key: str, *, terminal: bool = False) -> bool:
        await self.connection.execute(
            "UPDATE test_broker_jobs SET state = 'aborted' WHERE key = $1 AND state IN ('queued', 'active')", key)
        return True

    async def take(self, queue: str) -> str | None:
        key: str | None = await self.connection.fetchval(
            "UPDATE test_broker_jobs SET state = 'active', started_at = clock_timestamp() WHERE key = ("
            " SELECT key FROM test_broker_jobs WHERE queue = $1 AND state = 'queued'"
            " ORDER BY wire_priority, serial LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING key", queue)
        return key

    async def start(self, key: str) -> None:
        """A broker worker starts exactly this job."""
        await self.connection.execute(
            "UPDATE test_broker_jobs SET state = 'active', started_at = clock_timestamp() WHERE key = $1", key)

    async def finish(self, key: str) -> None:
        await self.connection.execute("UPDATE test_broker_jobs SET state = 'complete' WHERE key = $1", key)

    async def forget(self, key: str) -> None:
        """The broker loses the job (a lost publication)."""
        await self.connection.execute("DELETE FROM test_broker_jobs WHERE key = $1", key)

    async def started_long_ago(self, key: str, seconds: float) -> None:
        await self.connection.execute(
            "UPDATE test_broker_jobs SET started_at = clock_timestamp() - $2::interval WHERE key = $1",
            key, dt.timedelta(seconds=seconds))

    # --- the checkpoint store the workflow writes before it parks ----------------------------

    async def save_checkpoint(self, run_id: str, owner_id: str) -> None:
        await self.connection.execute(
            "INSERT INTO test_checkpoints VALUES ($1, $2) ON CONFLICT (run_id) DO NOTHING", run_id, owner_id)

    async def checkpoint_owner(self, run_id: str) -> str | None:
        owner: str | None = await self.connection.fetchval(
            "SELECT owner_id FROM test_checkpoints WHERE run_id = $1", run_id)
        return owner
