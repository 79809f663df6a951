"""The throwaway PostgreSQL server the suite runs against is real and usable."""

from __future__ import annotations

import asyncpg


async def test_the_server_is_real_and_has_a_clock_that_advances_inside_a_transaction(pg_dsn: str) -> None:
    connection = await asyncpg.connect(pg_dsn)
    try:
        version = await connection.fetchval("SHOW server_version_num")
        assert int(version) >= 150000
        async with connection.transaction():
            # clock_timestamp() moves within a transaction; now() is the transaction start.
            first, second, started = await connection.fetchrow(
                "SELECT clock_timestamp(), (SELECT clock_timestamp() FROM pg_sleep(0.01)), now()"
            )
            assert second > first >= started
    finally:
        await connection.close()
