"""The PostgreSQL store: asyncpg connections from a pool, one transaction per operation.

The lock is the row lock: every finder that returns rows to decide on ends in
``FOR UPDATE`` (claims and sweeps in ``FOR UPDATE SKIP LOCKED``, which never waits).
The database time is ``clock_timestamp()`` (``now()`` would be the transaction's start),
sampled after the lock, so a lock wait that outlasts a lease cannot authorize a stale
write.

Job IDs may live in a genuine ``uuid`` column: IDs are then canonicalized by the
database (``$1::uuid::text``) before anything is decided, and rows come back as
canonical UUID text. A syntactically invalid UUID is a persistence failure
(``unavailable``) raised before any row is touched.

asyncpg is used directly rather than through SQLAlchemy's async engine: on this
machine a fenced-write transaction ran about 3x faster through asyncpg
(``python bench/driver_overhead.py DSN``), and the statements here are fixed texts that
need none of the engine's features. SQLAlchemy Core still declares the schema.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from tenure.kernel import JobRecord
from tenure.model import JobStatus, QueueKind, datetime_to_micros

from ..records import INSTANT_COLUMNS, MUTABLE_COLUMNS_FOR, columns_for, record_from_row, row_from_record
from ..sql import POSTGRESQL, statements_for
from ..store import TimeObserver, persistence_failed
from ..schema import TABLE_NAMES

__all__ = ["PostgresStore", "PostgresTransaction", "POOL_SIZE"]

POOL_SIZE = 10
"""Connections per store; each open transaction holds one."""

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_PARAMETER = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
_INSTANT_PARAMETERS = frozenset(INSTANT_COLUMNS | {"now", "cutoff"} | {f"old_{c}" for c in INSTANT_COLUMNS})


def _micros_to_datetime(micros: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=micros)


class _Compiled:
    """A ``:name`` statement rewritten to asyncpg's ``$n`` with its parameter order."""

    __slots__ = ("sql", "names")

    def __init__(self, sql: str) -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        self.sql = _PARAMETER.sub(number, sql)
        self.names = tuple(names)

    def arguments(self, parameters: Mapping[str, Any]) -> list[Any]:
        values = []
        for name in self.names:
            value = parameters[name]
            if name in _INSTANT_PARAMETERS and value is not None:
                value = _micros_to_datetime(value)
            values.append(value)
        return values


_COMPILED: dict[str, _Compiled] = {}


def _compiled(sql: str) -> _Compiled:
    found = _COMPILED.get(sql)
    if found is None:
        found = _COMPILED[sql] = _Compiled(sql)
    return found


def _failure_reason(error: BaseException) -> str:
    if isinstance(error, asyncpg.UniqueViolationError):
        return "constraint_violated"
    if isinstance(error, asyncpg.DeadlockDetectedError):
        return "deadlock"
    return "unavailable"


_DRIVER_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, ValueError, TypeError, OverflowError)


def _plain(column: str, value: Any) -> Any:
    """A stored value as the kernel counts it (instants in microseconds, UUIDs as text)."""
    if column in INSTANT_COLUMNS and isinstance(value, dt.datetime):
        return datetime_to_micros(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


class PostgresTransaction:
    """A transaction on one pooled connection (see :class:`tenure.adapters.store.Transaction`)."""

    def __init__(self, store: PostgresStore, connection: asyncpg.Connection) -> None:
        self._store = store
        self._connection = connection
        self._now: int | None = None

    async def _fetch(self, sql: str, parameters: Mapping[str, Any]) -> list[Any]:
        compiled = _compiled(sql)
        failure: str | None = None
        try:
            return list(await self._connection.fetch(compiled.sql, *compiled.arguments(parameters)))
        except _DRIVER_ERRORS as error:
            failure = _failure_reason(error)
        raise persistence_failed(failure)

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        """Run one ``$n`` statement in this transaction (migrations and checks)."""
        failure: str | None = None
        try:
            return list(await self._connection.fetch(sql, *parameters))
        except _DRIVER_ERRORS as error:
            failure = _failure_reason(error)
        raise persistence_failed(failure)

    async def now_us(self) -> int:
        if self._now is None:
            rows = await self.execute("SELECT clock_timestamp()")
            self._now = datetime_to_micros(rows[0][0])
            if self._store.observe_time is not None:
                self._store.observe_time(self._now)
        return self._now

    async def _records(self, queue: QueueKind, sql: str, parameters: Mapping[str, Any]) -> list[JobRecord]:
        columns = columns_for(queue)
        return [
            record_from_row(queue, {column: _plain(column, row[index]) for index, column in enumerate(columns)})
            for row in await self._fetch(sql, parameters)
        ]

    async def _one(self, queue: QueueKind, sql: str, parameters: Mapping[str, Any]) -> JobRecord | None:
        found = await self._records(queue, sql, parameters)
        return found[0] if found else None

    async def canonical_job_id(self, queue: QueueKind, job_id: str) -> str:
        if not self._store.uuid_ids.get(queue, False):
            return job_id
        rows = await self.execute("SELECT $1::uuid::text", [job_id])
        return str(rows[0][0])

    async def load(self, queue: QueueKind, job_id: str) -> JobRecord | None:
        return await self._one(queue, statements_for(queue, POSTGRESQL).load, {"job_id": job_id})

    async def by_submission(self, queue: QueueKind, submission_id: str) -> JobRecord | None:
        return await self._one(queue, statements_for(queue, POSTGRESQL).by_submission, {"submission_id": submission_id})

    async def colliding(
        self, queue: QueueKind, job_id: str, run_id: str | None, idempotency_key: str | None
    ) -> JobRecord | None:
        parameters = {"job_id": job_id, "run_id": run_id, "idempotency_key": idempotency_key}
        return await self._one(queue, statements_for(queue, POSTGRESQL).colliding, parameters)

    async def key_holder(self, queue: QueueKind, active_key: str) -> JobRecord | None:
        return await self._one(queue, statements_for(queue, POSTGRESQL).key_holder, {"active_key": active_key})

    async def token_stored(self, queue: QueueKind, claim_token: str) -> bool:
        rows = await self._fetch(statements_for(queue, POSTGRESQL).token_stored, {"claim_token": claim_token})
        return bool(rows)

    async def by_token(self, queue: QueueKind, claim_token: str) -> JobRecord | None:
        return await self._one(queue, statements_for(queue, POSTGRESQL).by_token, {"claim_token": claim_token})

    async def next_eligible(self, queue: QueueKind, now_us: int, *, owned: bool) -> JobRecord | None:
        statements = statements_for(queue, POSTGRESQL)
        sql = statements.next_owned if owned else statements.next_legacy
        return await self._one(queue, sql, {"now": now_us, "false": False})

    async def expired_claims(self, queue: QueueKind, now_us: int, limit: int) -> list[JobRecord]:
        return await self._records(queue, statements_for(queue, POSTGRESQL).expired, {"now": now_us, "limit": limit})

    async def finished_before(self, queue: QueueKind, cutoff_us: int, limit: int) -> list[JobRecord]:
        parameters = {"cutoff": cutoff_us, "limit": limit, "false": False}
        return await self._records(queue, statements_for(queue, POSTGRESQL).finished_before, parameters)

    async def insert(self, record: JobRecord) -> JobRecord:
        stored = await self._one(record.queue, statements_for(record.queue, POSTGRESQL).insert, row_from_record(record))
        if stored is None:
            raise persistence_failed("write_not_applied")
        return stored

    @staticmethod
    def _compare(old: JobRecord) -> dict[str, Any]:
        old_row = row_from_record(old)
        compared = {f"old_{column}": old_row[column] for column in MUTABLE_COLUMNS_FOR[old.queue]}
        compared["old_id"] = old.job_id
        return compared

    async def update(self, old: JobRecord, new: JobRecord) -> JobRecord | None:
        parameters = {**row_from_record(new), **self._compare(old)}
        return await self._one(new.queue, statements_for(new.queue, POSTGRESQL).update, parameters)

    async def delete(self, old: JobRecord) -> bool:
        return bool(await self._fetch(statements_for(old.queue, POSTGRESQL).delete, self._compare(old)))

    async def claim_identity(self, queue: QueueKind, job_id: str) -> tuple[object, object, object]:
        rows = await self._fetch(statements_for(queue, POSTGRESQL).read_claim_identity, {"job_id": job_id})
        if not rows:
            return (None, None, None)
        owner_id, claim_token, generation = rows[0]
        return (owner_id, claim_token, generation)

    async def list_records(self, queue: QueueKind, status: JobStatus | None, limit: int) -> list[JobRecord]:
        statements = statements_for(queue, POSTGRESQL)
        if status is None:
            return await self._records(queue, statements.list_all, {"limit": limit})
        return await self._records(queue, statements.list_by_status, {"status": status.value, "limit": limit})


class PostgresStore:
    """A PostgreSQL database holding the queue tables, reached through an asyncpg pool."""

    def __init__(self, dsn: str, *, pool_size: int = POOL_SIZE) -> None:
        self._dsn = dsn
        self._pool_size = pool_size
        self._pool: asyncpg.Pool | None = None
        self._opening = asyncio.Lock()
        self.observe_time: TimeObserver | None = None
        self.uuid_ids: dict[QueueKind, bool] = {}
        """Which queue tables keep job IDs in a genuine uuid column (read at first use)."""

    async def _open(self) -> asyncpg.Pool:
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._pool is None:
                failure = False
                try:
                    pool = await asyncpg.create_pool(self._dsn, min_size=1, max_size=self._pool_size)
                    async with pool.acquire() as connection:
                        rows = await connection.fetch(
                            "SELECT table_name, data_type FROM information_schema.columns"
                            " WHERE table_schema = current_schema() AND column_name = 'id'"
                            " AND table_name = ANY($1::text[])",
                            list(TABLE_NAMES.values()),
                        )
                except _DRIVER_ERRORS:
                    failure = True
                if failure:
                    raise persistence_failed("unavailable")
                types = {name: data_type for name, data_type in rows}
                self.uuid_ids = {queue: types.get(table) == "uuid" for queue, table in TABLE_NAMES.items()}
                self._pool = pool
        assert self._pool is not None
        return self._pool

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[PostgresTransaction]:
        pool = await self._open()
        failure: str | None = None
        try:
            connection = await pool.acquire()
        except _DRIVER_ERRORS:
            failure = "unavailable"
        if failure is not None:
            raise persistence_failed(failure)
        try:
            transaction = connection.transaction()
            try:
                await transaction.start()
            except _DRIVER_ERRORS:
                failure = "unavailable"
            if failure is not None:
                raise persistence_failed(failure)
            try:
                yield PostgresTransaction(self, connection)
            except BaseException:
                await self._rollback(transaction)
                raise
            await self._commit(transaction)
        finally:
            await self._release(pool, connection)

    async def _commit(self, transaction: Any) -> None:
        """COMMIT. A failure here is an uncertain acknowledgement: the caller must recover
        by replay or claim recovery, never by assuming nothing was written."""
        failed = False
        try:
            await transaction.commit()
        except _DRIVER_ERRORS:
            failed = True
        if failed:
            await self._rollback(transaction)
            raise persistence_failed("commit_unacknowledged")

    @staticmethod
    async def _rollback(transaction: Any) -> None:
        try:
            await transaction.rollback()
        except (*_DRIVER_ERRORS, asyncpg.InterfaceError):
            pass  # nothing open any more, or the connection is gone

    @staticmethod
    async def _release(pool: asyncpg.Pool, connection: asyncpg.Connection) -> None:
        try:
            await pool.release(connection)
        except _DRIVER_ERRORS:
            pass

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await pool.close()
            except _DRIVER_ERRORS:
                pass
