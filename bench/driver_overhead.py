"""How much does SQLAlchemy's async engine cost over asyncpg for tenure's statements?

Runs the same transaction shape as a fenced write (lock one row, read the clock,
update it with a compare-and-set and RETURNING) through asyncpg directly and through
SQLAlchemy's async engine (``text()`` statements, compiled cache warm), on one
connection each, and prints transactions per second and the ratio measured in this run.

    python bench/driver_overhead.py postgresql://postgres@127.0.0.1:5432/postgres [rounds]
"""

from __future__ import annotations

import asyncio
import sys
import time

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

SETUP = [
    "DROP TABLE IF EXISTS bench_rows",
    "CREATE TABLE bench_rows (id varchar(36) PRIMARY KEY, generation bigint NOT NULL, lease timestamptz)",
    "INSERT INTO bench_rows SELECT 'row-' || n, 1, clock_timestamp() + interval '1 hour' FROM generate_series(1, 100) n",
]
LOCK = "SELECT id, generation, lease FROM bench_rows WHERE id = $1 FOR UPDATE"
CLOCK = "SELECT clock_timestamp()"
UPDATE = (
    "UPDATE bench_rows SET lease = $1 WHERE id = $2 AND generation = $3 AND lease = $4 "
    "RETURNING id, generation, lease"
)


async def with_asyncpg(dsn: str, rounds: int) -> float:
    connection = await asyncpg.connect(dsn)
    started = time.perf_counter()
    for n in range(rounds):
        key = f"row-{n % 100 + 1}"
        async with connection.transaction():
            row = await connection.fetchrow(LOCK, key)
            now = await connection.fetchval(CLOCK)
            await connection.fetchrow(UPDATE, now, key, row["generation"], row["lease"])
    elapsed = time.perf_counter() - started
    await connection.close()
    return rounds / elapsed


async def with_sqlalchemy(dsn: str, rounds: int) -> float:
    engine = create_async_engine(dsn.replace("postgresql://", "postgresql+asyncpg://"), pool_size=1)
    lock = text(LOCK.replace("$1", ":id"))
    clock = text(CLOCK)
    update = text(UPDATE.replace("$1", ":lease_new").replace("$2", ":id").replace("$3", ":generation").replace("$4", ":lease"))
    started = time.perf_counter()
    for n in range(rounds):
        key = f"row-{n % 100 + 1}"
        async with engine.begin() as connection:
            row = (await connection.execute(lock, {"id": key})).one()
            now = (await connection.execute(clock)).scalar_one()
            await connection.execute(update, {"lease_new": now, "id": key, "generation": row.generation, "lease": row.lease})
    elapsed = time.perf_counter() - started
    await engine.dispose()
    return rounds / elapsed


async def main(dsn: str, rounds: int) -> None:
    connection = await asyncpg.connect(dsn)
    for statement in SETUP:
        await connection.execute(statement)
    await connection.close()
    await with_asyncpg(dsn, rounds // 10)  # warm up both paths
    await with_sqlalchemy(dsn, rounds // 10)
    direct = await with_asyncpg(dsn, rounds)
    engine = await with_sqlalchemy(dsn, rounds)
    print(f"fenced-write transactions per second, one connection, {rounds} rounds:")
    print(f"  asyncpg directly           {direct:8.0f}/s")
    print(f"  SQLAlchemy async engine    {engine:8.0f}/s")
    print(f"  asyncpg / SQLAlchemy       {direct / engine:8.2f}x")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5000))
