"""pycharter 0.0.67 as a real client of a database tenure adopts (run with pycharter's
own interpreter, from tests/adapters/core/test_pycharter.py; tenure is not importable here).

    python pycharter_client.py init URL       # pycharter db init (alembic version column widened)
    python pycharter_client.py populate URL   # jobs of all three kinds in every legacy state
    python pycharter_client.py work URL       # submit, claim, complete and list on a migrated database
    python pycharter_client.py schema URL     # the queue tables' schema, as JSON

Each command prints one JSON document on its last line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

QUEUE_TABLES = ("validation_jobs", "pipeline_jobs", "streaming_jobs")


def init(url: str) -> dict[str, Any]:
    # pycharter's revision IDs exceed alembic's 32-character version column on
    # PostgreSQL; widen it as a deployment must.
    from alembic.ddl.impl import DefaultImpl
    from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, String, Table

    def version_table_impl(self: Any, *, version_table: str, version_table_schema: Any, version_table_pk: bool, **kw: Any) -> Table:
        table = Table(version_table, MetaData(), Column("version_num", String(255), nullable=False), schema=version_table_schema)
        if version_table_pk:
            table.append_constraint(PrimaryKeyConstraint("version_num", name=f"{version_table}_pkc"))
        return table

    DefaultImpl.version_table_impl = version_table_impl  # type: ignore[method-assign]
    from pycharter.cli import main

    sys.argv = ["pycharter", "db", "init", url]
    status = main()
    return {"status": status or 0}


def _sources(url: str) -> tuple[Any, Any, Any]:
    from pycharter.worker.config import WorkerConfig
    from pycharter.worker.job_sources.pipeline import PipelineJobSource
    from pycharter.worker.job_sources.streaming import StreamingJobSource
    from pycharter.worker.job_sources.validation import ValidationJobSource

    config = WorkerConfig(db_url=url)
    return ValidationJobSource(url, config), PipelineJobSource(url, config), StreamingJobSource(url, config)


async def populate(url: str) -> dict[str, Any]:
    from pycharter.worker.models import PipelineJob, StreamingJob, ValidationJob

    validation, pipeline, streaming = _sources(url)
    postgres = url.startswith("postgresql")
    made: dict[str, Any] = {}
    # Validation: completed (with a result), completed (without one), failed, retried
    # (back to pending after a failure), claimed (in flight), pending.
    key = None if postgres else "pycharter-key-1"  # its keyed submit fails on PostgreSQL
    ids = [await validation.submit(ValidationJob("orders", "1.0", f"v{n}.jsonl", options={"n": n},
                                                 idempotency_key=key if n == 0 else None)) for n in range(6)]
    for outcome in ("complete_result", "complete_empty", "fail_final", "fail_retry"):
        claimed = await validation.claim_next("pycharter-worker")
        if outcome == "complete_result":
            await validation.complete(claimed.event_id, {"rows": 3})
        elif outcome == "complete_empty":
            await validation.complete(claimed.event_id)
        elif outcome == "fail_final":
            await validation.fail(claimed.event_id, "boom", retry=False)
        else:
            await validation.fail(claimed.event_id, "transient", retry=True)
        made[f"validation_{outcome}"] = claimed.event_id
    in_flight = await validation.claim_next("pycharter-worker")
    made["validation_claimed"] = in_flight.event_id
    made["validation_all"] = ids
    # Pipeline: completed, claimed (in flight), pending.
    runs = [await pipeline.submit(PipelineJob({"steps": [n]}, {"env": "test"})) for n in range(3)]
    done = await pipeline.claim_next("pycharter-worker")
    await pipeline.complete(done.job_id, {"ok": True})
    made["pipeline_completed"] = done.job_id
    made["pipeline_claimed"] = (await pipeline.claim_next("pycharter-worker")).job_id
    made["pipeline_runs"] = runs
    # Streaming: a launch claimed (in flight) and another config pending.
    made["streaming_claimed_submitted"] = await streaming.submit(StreamingJob("stream-a", "1"))
    made["streaming_claimed"] = (await streaming.claim_next("pycharter-launcher")).job_id
    made["streaming_pending"] = await streaming.submit(StreamingJob("stream-b", "1"))
    return made


async def work(url: str) -> dict[str, Any]:
    """Legacy work on the migrated database, then every row as pycharter lists it."""
    from pycharter.worker.models import ValidationJob

    validation, pipeline, streaming = _sources(url)
    job_id = await validation.submit(ValidationJob("orders", "2.0", "after-migration.jsonl"))
    claimed = await validation.claim_next("pycharter-worker-2")
    completed = await validation.complete(claimed.event_id, {"after": True}) if claimed else False
    return {
        "submitted": job_id,
        "claimed": None if claimed is None else claimed.event_id,
        "completed": completed,
        "validation": [{"job_id": job["job_id"], "status": job["status"], "result": job["result"]}
                       for job in await validation.list_jobs(limit=1000)],
        "pipeline": [{"job_id": job["job_id"], "status": job["status"]} for job in await pipeline.list_jobs(limit=1000)],
        "streaming": [{"job_id": job["job_id"], "status": job["status"]} for job in await streaming.list_jobs(limit=1000)],
    }


async def complete_by_id(url: str, job_id: str) -> dict[str, Any]:
    """pycharter completes a validation job by its ID alone, as its own workers do."""
    validation, _, _ = _sources(url)
    return {"completed": await validation.complete(job_id, {"by": "pycharter"})}


def schema(url: str) -> dict[str, Any]:
    from sqlalchemy import create_engine, inspect

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    inspector = inspect(engine)
    owner = "pycharter" if url.startswith("postgresql") else None
    described: dict[str, Any] = {"tables": sorted(inspector.get_table_names(schema=owner))}
    for table in QUEUE_TABLES:
        described[table] = {
            "columns": [
                [column["name"], str(column["type"]), column["nullable"], str(column.get("default"))]
                for column in inspector.get_columns(table, schema=owner)
            ],
            "indexes": sorted([index["name"], index["column_names"], bool(index["unique"])]
                              for index in inspector.get_indexes(table, schema=owner)),
            "unique": sorted([sorted(constraint["column_names"])]
                             for constraint in inspector.get_unique_constraints(table, schema=owner)),
            "primary_key": inspector.get_pk_constraint(table, schema=owner)["constrained_columns"],
        }
    engine.dispose()
    return described


def main() -> None:
    command, url = sys.argv[1], sys.argv[2]
    if command == "init":
        result = init(url)
    elif command == "populate":
        result = asyncio.run(populate(url))
    elif command == "work":
        result = asyncio.run(work(url))
    elif command == "complete-by-id":
        result = asyncio.run(complete_by_id(url, sys.argv[3]))
    else:
        result = schema(url)
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
