"""`tenure health` and the console's overview read per-queue counts through one reader
(``tenure.apps.queue_counts.QueueCounts``), on every database: they show the same counts
for the same queues, and the throughput the overview shows of a queue lands on the queue
whose counts it shows, also for task queues counted under ``(other)`` (past the cap of
names reported one by one, or named with what is no identifier)."""

from __future__ import annotations

import uuid

import pytest
from adapter_support import raw

from tenure.adapters.queue.sources import TaskSource, ValidationJobSource
from tenure.apps import queue_counts
from tenure.apps.console.reads import THROUGHPUT_MINUTES, ConsoleData
from tenure.apps.health import health_snapshot
from tenure.model import TaskJob, ValidationJob


async def _finish(source: TaskSource, queue: str, *, failed: bool = False) -> str:
    claimed = await source.claim_next_owned("worker-1", claim_token=uuid.uuid4().hex, queues=[queue])
    assert claimed is not None and claimed.claim_fence is not None
    if failed:
        assert await source.fail_owned(claimed.claim_fence, "broke", retry=False)
    else:
        assert await source.complete_owned(claimed.claim_fence, {"sent": True})
    return str(claimed.job_id)


async def _seed(db_url: str) -> None:
    """Tasks finished (completed, failed) and waiting in four task queues, one of them
    renamed by SQL to a name that is no identifier; one validation job completed."""
    async with TaskSource(db_url) as tasks:
        await tasks.submit_many([TaskJob(queue_name=queue, task_name="work", args={"n": n})
                                 for queue, count in (("emails", 3), ("reports", 2), ("backups", 2), ("renamed", 1))
                                 for n in range(count)])
        await _finish(tasks, "emails")
        await _finish(tasks, "emails", failed=True)
        await _finish(tasks, "reports")
        await _finish(tasks, "reports")
        await _finish(tasks, "backups", failed=True)
        renamed = await _finish(tasks, "renamed")
    raw(db_url, "UPDATE tenure_tasks SET queue_name = ? WHERE id = ?", ("no identifier!", renamed))
    async with ValidationJobSource(db_url) as validation:
        await validation.submit_owned(ValidationJob("orders", "1.0", "s3://bucket/a"), submission_id="s-1")
        claimed = await validation.claim_next_owned("worker-2", claim_token=uuid.uuid4().hex)
        assert claimed is not None and await validation.complete_owned(claimed.claim_fence, {"rows": 1})


@pytest.mark.parametrize("reported_task_queues", [queue_counts.MAX_TASK_QUEUES, 1], ids=["all_named", "capped"])
async def test_health_and_the_overview_show_the_same_counts_and_throughput_lands_on_the_counted_queue(
    db_url: str, reported_task_queues: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(queue_counts, "MAX_TASK_QUEUES", reported_task_queues)
    await _seed(db_url)
    health = await health_snapshot(db_url)
    console = ConsoleData(db_url)
    try:
        overview = await console.overview()
    finally:
        await console.close()
    assert health.queues is not None and overview.unread == ()
    assert {(reading.table, reading.queue): dict(reading.counts) for reading in health.queues} == {
        (view.table, view.queue): dict(view.counts) for view in overview.queues}
    task_queues = {view.queue for view in overview.queues if view.table == "tenure_tasks"}
    # Capped: one of the three identifier queues by name, the others with "no identifier!".
    assert queue_counts.OTHER in task_queues and len(task_queues) == (2 if reported_task_queues == 1 else 4)
    for view in overview.queues:  # every job here finished moments ago: within the window
        assert len(view.completed_per_minute) == THROUGHPUT_MINUTES
        assert (sum(view.completed_per_minute), sum(view.failed_per_minute)) == (
            view.counts["completed"], view.counts["failed"]), view
    assert sum(view.counts["completed"] + view.counts["failed"] for view in overview.queues) == 7
