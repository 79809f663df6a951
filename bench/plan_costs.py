"""Server time of each hot owned statement, as tenure sends it, on an analyzed table.

    python bench/plan_costs.py DSN [ROWS] [REPEATS]

Runs one owned cycle of the validation queue (submit, claim, claim of 2, heartbeat,
heartbeat of 2, complete of 2, complete, fail, release, release of 2), keeping each
statement the store sent and its arguments; then fills the table to ROWS finished rows
(default 50,000), analyzes it, and for each statement prints the server's planning and
execution time (``EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE``, each run in a transaction
rolled back), median of REPEATS, under ``plan_cache_mode = auto`` after the five custom
executions that precede a cached plan, and under ``force_generic_plan``; and whether
that plan read the table with a sequential scan, and (``cached``) whether the explained
execution ran the cached generic plan (``pg_prepared_statements.generic_plans`` grew: in
auto mode, PostgreSQL chose it over a custom plan). Not a test: no figure is asserted.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import statistics
import sys
import uuid
from typing import Any

import asyncpg

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import tenure_bench as bench  # noqa: E402

from tenure.adapters import ValidationJobSource, upgrade  # noqa: E402
from tenure.adapters.postgres.connections import count_instants_in_microseconds  # noqa: E402
from tenure.model import ValidationJob  # noqa: E402


async def cycle(db_url: str) -> list[tuple[str, str, list[Any]]]:
    sent: list[tuple[str, str, list[Any]]] = []
    async with ValidationJobSource(db_url, bench.config(db_url)) as source:
        store = source._engine.store  # noqa: SLF001
        fetch_once, label = store._fetch_once, [""]  # noqa: SLF001

        async def recorded(pool: Any, deadline: float, sql: str, arguments: list[Any]) -> list[Any]:
            if label[0]:
                sent.append((label[0], sql, list(arguments)))
            return await fetch_once(pool, deadline, sql, arguments)

        store._fetch_once = recorded  # noqa: SLF001

        async def one(name: str, call: Any) -> Any:
            label[0] = name
            try:
                return await call
            finally:
                label[0] = ""

        async def submit(n: int) -> None:
            await source.submit_owned(ValidationJob("orders", "1", f"{n}.jsonl"), submission_id=f"s-{n}")

        await submit(0)
        await one("submit", submit(1))
        for n in range(2, 9):
            await submit(n)
        single = await one("claim", source.claim_next_owned("w", claim_token=uuid.uuid4().hex))
        pair = await one("claim_batch", source.claim_batch_owned("w", claim_tokens=[uuid.uuid4().hex for _ in range(2)]))
        fences = [claimed.claim_fence for claimed in pair]
        await one("heartbeat", source.heartbeat_owned(single.claim_fence))
        await one("heartbeat_batch", source.heartbeat_many_owned(fences))
        await one("complete_batch", source.complete_many_owned([(fence, None) for fence in fences]))
        await one("complete", source.complete_owned(single.claim_fence))
        failing = await source.claim_next_owned("w", claim_token=uuid.uuid4().hex)
        await one("fail", source.fail_owned(failing.claim_fence, "boom", retry=False))
        released = await source.claim_next_owned("w", claim_token=uuid.uuid4().hex)
        await one("release", source.release_owned(released.claim_fence))
        again = await source.claim_batch_owned("w", claim_tokens=[uuid.uuid4().hex for _ in range(2)])
        await one("release_batch", source.release_many_owned([claimed.claim_fence for claimed in again]))
    return sent


async def fill(connection: asyncpg.Connection, rows: int) -> None:
    unique = ("id", "claim_token", "submission_id", "idempotency_key")
    columns = [row[0] for row in await connection.fetch(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'validation_jobs'::regclass AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum")]
    copied = ", ".join(f"'g' || g || '-' || left({c}, 16)" if c in unique else c for c in columns)
    await connection.execute(f"INSERT INTO validation_jobs ({', '.join(columns)}) SELECT {copied} FROM "
                             f"(SELECT * FROM validation_jobs WHERE status = 'completed' LIMIT 1) AS template, "
                             f"generate_series(1, {rows}) AS g")
    await connection.execute("ANALYZE validation_jobs")


def scanned(plan: dict[str, Any]) -> bool:
    if plan.get("Node Type") == "Seq Scan" and plan.get("Relation Name") == "validation_jobs":
        return True
    return any(scanned(child) for child in plan.get("Plans", ()))


class _Rollback(Exception):
    pass


async def main(server_dsn: str, rows: int, repeats: int) -> None:
    db_url = await bench.fresh_database(server_dsn)
    await upgrade(db_url)
    sent = await cycle(db_url)
    connection = await asyncpg.connect(db_url)
    await count_instants_in_microseconds(connection)
    try:
        await fill(connection, rows)
        print(f"{'statement':<16} {'mode':<19} {'plan us':>8} {'exec us':>8}  seq scan  cached")
        for number, (name, sql, arguments) in enumerate(sent):
            statement = await connection.prepare(sql)
            types = [await connection.fetchval("SELECT format_type($1::oid, NULL)", p.oid)
                     for p in statement.get_parameters()]
            literals = [await connection.fetchval(f"SELECT quote_nullable(($1::{t})::text)", a)
                        for t, a in zip(types, arguments, strict=True)]
            await connection.execute(f"PREPARE s{number} ({', '.join(types)}) AS {sql}")
            execute = f"EXECUTE s{number} ({', '.join(f'{v}::{t}' for v, t in zip(literals, types, strict=True))})"
            for mode in ("auto", "force_generic_plan"):
                figures = await _repeat(connection, execute, f"s{number}", mode, repeats)
                print(f"{name:<16} {mode:<19} {figures[0]:8.0f} {figures[1]:8.0f}  {'yes' if figures[2] else 'no':<8}  "
                      f"{figures[3]}/{repeats}", flush=True)
    finally:
        await connection.close()


async def _repeat(connection: asyncpg.Connection, execute: str, name: str, mode: str,
                  repeats: int) -> tuple[float, float, bool, int]:
    planning, execution, seq, cached = [], [], False, 0
    generic = "SELECT generic_plans FROM pg_prepared_statements WHERE name = $1"
    await connection.execute(f"SET plan_cache_mode = {mode}")
    for _ in range(repeats):
        try:
            async with connection.transaction():
                for _ in range(5):  # the custom executions after which auto may cache a plan
                    await connection.execute(execute)
                before = await connection.fetchval(generic, name)
                explained = json.loads(await connection.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {execute}"))[0]
                cached += await connection.fetchval(generic, name) > before
                planning.append(explained["Planning Time"] * 1000)
                execution.append(explained["Execution Time"] * 1000)
                seq = seq or scanned(explained["Plan"])
                raise _Rollback  # the statement wrote: every repeat starts from the same rows
        except _Rollback:
            pass
    return statistics.median(planning), statistics.median(execution), seq, cached


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 50_000,
                     int(sys.argv[3]) if len(sys.argv) > 3 else 20))
