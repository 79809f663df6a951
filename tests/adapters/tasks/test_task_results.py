"""A task's result is any JSON value, stored and read back exactly on every database (on
SQLite a bare number too, which a column declared JSON would otherwise convert); a
result that cannot be stored is a programming error: the task fails at once, never
retried (its handler did its work, so a retry would repeat its side effects)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tenure.adapters import Backoff, TaskApp, TaskContext
from tenure.model import JobStatus, WorkerConfig

RESULTS: list[Any] = [
    "sent", "", 42, 0, -7, 2**63 - 1, -(2**63), 1.0, -0.5, 0.1 + 0.2, 1e16, 1.5e300, 5e-324, True, False,
    [1, "a", None], [], {"sent_to": 42}, {}, "42", "1.0", "-1",
]
"""Strings, integers to the 64-bit bounds, floats that SQLite's NUMERIC affinity would
turn into integers (1.0, 1e16) or round, booleans, arrays, objects, and strings that
look like numbers."""


def make_app(db_url: str) -> TaskApp:
    return TaskApp(db_url, config=WorkerConfig(db_url, lease_seconds=30, heartbeat_seconds=10, max_payload_bytes=4096))


async def test_a_handler_may_return_any_json_value_and_it_is_read_back_exactly(db_url: str) -> None:
    calls: list[int] = []
    async with make_app(db_url) as app:
        @app.task(queue="emails", name="give", retry=Backoff(0, 0, False))
        async def give(ctx: TaskContext, index: int) -> Any:
            calls.append(index)
            return RESULTS[index]

        ids = await give.defer_many([{"index": index} for index in range(len(RESULTS))])
        stats = await app.worker(concurrency=4, idle_wait_s=0.1).run_until_idle()
        assert (stats.completed, stats.failed, stats.retried) == (len(RESULTS), 0, 0)
        assert sorted(calls) == list(range(len(RESULTS)))  # each handler ran once
        for job_id, expected in zip(ids, RESULTS, strict=True):
            outcome = await app.result(job_id)
            assert outcome is not None and outcome.ok and outcome.attempts == 1, (expected, outcome)
            assert outcome.result == expected and type(outcome.result) is type(expected), (expected, outcome.result)
        listed = {info.job_id: info.result for info in await app.source.list_tasks(limit=100)}
        assert [listed[job_id] for job_id in ids] == RESULTS


@pytest.mark.parametrize(("returned", "problem"), [
    ({1, 2}, "json_type_not_allowed"),
    (math.nan, "json_not_finite"),
    ({"n": 2**64}, "json_integer_out_of_range"),
    ("x" * 5000, "payload_too_large"),
])
async def test_a_result_that_cannot_be_stored_fails_the_task_at_once_without_a_retry(
    db_url: str, returned: Any, problem: str
) -> None:
    calls: list[int] = []
    async with make_app(db_url) as app:
        @app.task(queue="emails", name="send", max_attempts=3, retry=Backoff(0, 0, False))
        async def send(ctx: TaskContext) -> Any:
            calls.append(ctx.attempt)
            return returned

        job_id = await send.defer()
        stats = await app.worker(idle_wait_s=0.1).run_until_idle()
        assert (stats.failed, stats.retried, stats.completed) == (1, 0, 0)
        assert calls == [1]  # its side effects happened once
        outcome = await app.result(job_id)
        assert outcome is not None and outcome.status is JobStatus.FAILED and outcome.attempts == 1
        assert outcome.error is not None and outcome.error.startswith("InvalidResult: ") and problem in outcome.error
