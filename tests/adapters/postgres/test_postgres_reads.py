"""A PostgreSQL read (``store.run(body, write=False)``) runs its statements in autocommit:
no BEGIN and no COMMIT (under READ COMMITTED each statement of a transaction sees its own
snapshot anyway), and it cannot write: a write primitive refuses before anything is sent."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from adapter_support import raw

from tenure.adapters import ValidationJobSource
from tenure.adapters.postgres.store import PostgresStore
from tenure.adapters.queue.table import QUEUE_BINDINGS
from tenure.model import QueueKind, TenureError, ValidationJob, WorkerConfig

pytestmark = pytest.mark.parametrize("database", ["postgresql"])


def sent_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    sent: list[str] = []
    for name in ("fetch", "execute"):
        original = getattr(asyncpg.connection.Connection, name)

        async def recorded(self: Any, query: str, *args: Any, original: Any = original, **kwargs: Any) -> Any:
            sent.append(" ".join(query.split())[:40])
            return await original(self, query, *args, **kwargs)

        monkeypatch.setattr(asyncpg.connection.Connection, name, recorded)
    return sent


async def test_a_read_sends_no_begin_and_no_commit(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config = WorkerConfig(db_url, lease_seconds=30, heartbeat_seconds=10)
    async with ValidationJobSource(db_url, config) as source:
        job_id = await source.submit_owned(ValidationJob("orders", "1", "a.jsonl"), submission_id="s-1")
        sent = sent_statements(monkeypatch)
        info = await source.get_job(job_id)
        assert info.job_id == job_id and len(await source.list_jobs()) == 1
    assert sent and not [text for text in sent if text.startswith(("BEGIN", "COMMIT", "ROLLBACK"))], sent


async def test_a_write_inside_a_read_refuses_before_anything_is_sent(db_url: str) -> None:
    binding = QUEUE_BINDINGS[QueueKind.VALIDATION]
    config = WorkerConfig(db_url, lease_seconds=30, heartbeat_seconds=10)
    async with ValidationJobSource(db_url, config) as source:
        job_id = await source.submit_owned(ValidationJob("orders", "1", "a.jsonl"), submission_id="s-1")
    before = raw(db_url, "SELECT * FROM validation_jobs")
    store = PostgresStore(db_url)
    try:
        async def body(tx: Any) -> None:
            [row] = await tx.read(binding, [job_id])
            for write in (lambda: tx.update_many(binding, [(row, row)], read_back=False),
                          lambda: tx.delete(binding, row), lambda: tx.insert(binding, row),
                          lambda: tx.lock_name("anything")):
                with pytest.raises(TenureError) as refused:
                    await write()
                assert refused.value.reason == "invariant_broken"

        await store.run(body, write=False)
    finally:
        await store.close()
    assert raw(db_url, "SELECT * FROM validation_jobs") == before
