"""TaskApp on every database: a deferral is validated before anything is written, replays
are safe under a submission ID, a batch is one transaction that writes all or nothing,
claims serve only the named queues by priority, retries follow the task's own policy,
results are read back typed, and a handler's progress reaches the row through the fence."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from tenure.adapters import Backoff, TaskApp, TaskContext
from tenure.adapters.queue import FailJob
from tenure.adapters.tasks.app import UnknownTask
from tenure.model import ConfigValidationError, JobStatus, TenureError, WorkerConfig


def make_app(db_url: str) -> TaskApp:
    return TaskApp(db_url, config=WorkerConfig(db_url, lease_seconds=5, heartbeat_seconds=1))


def register(app: TaskApp, calls: list[tuple[str, Any]]) -> dict[str, Any]:
    @app.task(queue="emails", max_attempts=3, retry=Backoff(base_s=0, max_s=0, jitter=False), priority=10)
    async def send_welcome(ctx: TaskContext, user_id: int, note: str = "") -> dict[str, Any]:
        calls.append(("send_welcome", user_id))
        assert ctx.task_name == send_welcome.name and ctx.queue_name == "emails"
        await ctx.progress({"user": user_id})
        if user_id < 0:
            raise ValueError("negative user")
        return {"sent": user_id, "attempt": ctx.attempt}

    @app.task(queue="reports", name="reports.build", priority=90)
    async def build(ctx: TaskContext, name: str) -> None:
        calls.append(("build", name))
        if name == "missing":
            raise FailJob("no such report")

    return {"send_welcome": send_welcome, "build": build}


async def test_a_deferred_task_runs_once_and_its_result_is_read_back_typed(db_url: str) -> None:
    calls: list[tuple[str, Any]] = []
    async with make_app(db_url) as app:
        tasks = register(app, calls)
        job_id = await tasks["send_welcome"].defer(user_id=42, submission_id="welcome-42")
        assert await tasks["send_welcome"].defer(user_id=42, submission_id="welcome-42") == job_id  # an exact replay
        with pytest.raises(TenureError) as changed:
            await tasks["send_welcome"].defer(user_id=43, submission_id="welcome-42")
        assert changed.value.reason == "fingerprint_mismatch"
        pending = await app.result(job_id)
        assert pending is not None and pending.status is JobStatus.PENDING and not pending.done
        stats = await app.worker(idle_wait_s=0.1).run_until_idle()
        assert (stats.claimed, stats.completed) == (1, 1)
        outcome = await app.result(job_id, wait_s=5)
        assert outcome is not None and outcome.ok and outcome.done
        assert outcome.result == {"sent": 42, "attempt": 1} and outcome.progress == {"user": 42}
        assert outcome.task_name == tasks["send_welcome"].name and outcome.error is None
        assert calls == [("send_welcome", 42)]
        assert await app.result("no-such-task") is None


async def test_failures_retry_by_the_tasks_own_policy_and_fail_job_ends_at_once(db_url: str) -> None:
    calls: list[tuple[str, Any]] = []
    async with make_app(db_url) as app:
        tasks = register(app, calls)
        bad = await tasks["send_welcome"].defer(user_id=-1)
        missing = await tasks["build"].defer(name="missing")
        stats = await app.worker(idle_wait_s=0.1).run_until_idle()
        assert (stats.failed, stats.retried) == (2, 2)
        failed = await app.result(bad)
        assert failed is not None and failed.status is JobStatus.FAILED and failed.attempts == 3
        assert failed.error == "ValueError: negative user"
        ended = await app.result(missing)
        assert ended is not None and ended.status is JobStatus.FAILED and ended.attempts == 1
        assert ended.error == "FailJob: no such report"


async def test_a_retry_waits_the_tasks_backoff_counted_by_the_database(db_url: str) -> None:
    async with make_app(db_url) as app:
        @app.task(queue="slow", retry=Backoff(base_s=30, max_s=60, jitter=True))
        async def flaky(ctx: TaskContext) -> None:
            raise RuntimeError("try later")

        job_id = await flaky.defer()
        await app.worker(idle_wait_s=0.1).run_until_idle()
        info = await app.source.get_job(job_id)
        assert info is not None and info.status is JobStatus.PENDING and info.attempt == 1
        # attempt 1 failing waits min(60, 30 * 2**1) s, less a jitter of at most half.
        waited = (info.fires_at - info.claimed_at).total_seconds()
        assert 30 - 1 <= waited <= 60 + 1


async def test_claims_serve_only_the_named_queues_highest_priority_first(db_url: str) -> None:
    calls: list[tuple[str, Any]] = []
    async with make_app(db_url) as app:
        tasks = register(app, calls)
        await tasks["send_welcome"].defer(user_id=1)
        await tasks["send_welcome"].defer(user_id=2, priority=95)
        report = await tasks["build"].defer(name="weekly")
        await app.worker(queues=["emails"], concurrency=1, idle_wait_s=0.1).run_until_idle()
        assert calls == [("send_welcome", 2), ("send_welcome", 1)]
        untouched = await app.result(report)
        assert untouched is not None and untouched.status is JobStatus.PENDING
        await app.worker(concurrency=1, idle_wait_s=0.1).run_until_idle()
        assert calls[-1] == ("build", "weekly")


async def test_schedule_in_counts_from_the_database_clock_and_replays_match(db_url: str) -> None:
    async with make_app(db_url) as app:
        tasks = register(app, [])
        job_id = await tasks["send_welcome"].defer(user_id=5, schedule_in=3600, submission_id="later-5")
        await asyncio.sleep(0.01)
        # The same request later is the same request: the delay is fingerprinted, not an instant.
        assert await tasks["send_welcome"].defer(user_id=5, schedule_in=3600, submission_id="later-5") == job_id
        info = await app.source.get_job(job_id)
        assert info is not None
        delay = (info.fires_at - info.created_at).total_seconds()
        assert delay == 3600
        at = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
        scheduled = await app.source.get_job(await tasks["send_welcome"].defer(user_id=6, schedule_at=at))
        assert scheduled is not None and scheduled.fires_at == at
        stats = await app.worker(idle_wait_s=0.1).run_until_idle()
        assert stats.claimed == 0  # nothing is due


async def test_defer_many_is_one_transaction_that_writes_all_or_nothing(db_url: str) -> None:
    async with make_app(db_url) as app:
        tasks = register(app, [])
        ids = await tasks["send_welcome"].defer_many([{"user_id": n} for n in range(25)])
        assert len(ids) == len(set(ids)) == 25
        assert ids == sorted(ids)  # time-ordered: claimed in the order deferred
        owned = await tasks["send_welcome"].defer_many([{"user_id": 1}, {"user_id": 2}],
                                                      submission_ids=["batch-1", "batch-2"])
        assert await tasks["send_welcome"].defer_many([{"user_id": 1}, {"user_id": 2}],
                                                      submission_ids=["batch-1", "batch-2"]) == owned
        before = len(await app.source.list_jobs(limit=1000))
        with pytest.raises(TenureError) as conflict:
            # The second run changes batch-2's content: the whole transaction is refused,
            # so batch-3 (new, first in the call) is not written either.
            await tasks["send_welcome"].defer_many([{"user_id": 3}, {"user_id": 9}],
                                                   submission_ids=["batch-3", "batch-2"])
        assert conflict.value.reason == "fingerprint_mismatch"
        assert len(await app.source.list_jobs(limit=1000)) == before
        stats = await app.worker(concurrency=8, batch_size=8, idle_wait_s=0.1).run_until_idle()
        assert stats.completed == 27


@pytest.mark.parametrize(("call", "field"), [
    (lambda t: t.defer(nope=1), "args"),
    (lambda t: t.defer(), "args"),  # user_id is required
    (lambda t: t.defer(user_id={1, 2}), "args"),  # not JSON
    (lambda t: t.defer(user_id=1, priority=101), "priority"),
    (lambda t: t.defer(user_id=1, schedule_in=-1), "schedule_in"),
    (lambda t: t.defer(user_id=1, schedule_in=10**400), "schedule_in"),
    (lambda t: t.defer(user_id=1, schedule_in=1, schedule_at=dt.datetime.now(dt.timezone.utc)), "schedule_in"),
    (lambda t: t.defer(user_id=1, submission_id=""), "submission_id"),
    (lambda t: t.defer_many([{"user_id": 1}], submission_ids=["a", "b"]), "submission_ids"),
    (lambda t: t.app.defer(t.name, {"user_id": 1, "priority": 5}), "args"),  # a key that is an option's name
    (lambda t: t.app.defer(t.name, [1]), "args"),
    (lambda t: t.app.result("x", wait_s=10**400), "wait_s"),
])
async def test_a_bad_deferral_is_refused_naming_its_field_and_writes_nothing(db_url: str, call: Any, field: str) -> None:
    async with make_app(db_url) as app:
        tasks = register(app, [])
        with pytest.raises(ConfigValidationError) as refused:
            await call(tasks["send_welcome"])
        assert refused.value.fields == (field,), refused.value
        assert await app.source.list_jobs(limit=10) == []


async def test_arguments_larger_than_the_payload_bound_are_refused(db_url: str) -> None:
    app = TaskApp(db_url, config=WorkerConfig(db_url, max_payload_bytes=1024))
    async with app:
        tasks = register(app, [])
        with pytest.raises(ConfigValidationError) as refused:
            await tasks["send_welcome"].defer(user_id=1, note="x" * 2000)
        assert refused.value.problems == ("payload_too_large",)


def test_registration_refuses_what_could_never_run() -> None:
    app = TaskApp("sqlite:///unused.db")

    def plain(ctx: Any) -> Any:  # a generator: never a task (a plain function is: test_sync_tasks.py)
        yield ctx

    async def no_context() -> None: ...

    async def reserved(ctx: Any, priority: int) -> None: ...

    async def fine(ctx: Any) -> None: ...

    cases = [
        (lambda: app.task(plain), "function"),
        (lambda: app.task(no_context), "function"),
        (lambda: app.task(reserved), "function"),
        (lambda: app.task(queue="1bad")(fine), "queue"),
        (lambda: app.task(queue="emails", priority=-1)(fine), "priority"),
        (lambda: app.task(max_attempts=0)(fine), "max_attempts"),
        (lambda: app.task(name="not a name")(fine), "name"),
        (lambda: app.task(retry=Backoff(base_s=5, max_s=1))(fine), "base_s"),
    ]
    for register_it, field in cases:
        with pytest.raises(ConfigValidationError) as refused:
            register_it()
        assert refused.value.fields == (field,), field
    app.task(name="x.fine")(fine)
    with pytest.raises(ConfigValidationError) as twice:
        app.task(name="x.fine")(fine)
    assert twice.value.problems == ("already_registered",)
    with pytest.raises(ConfigValidationError) as unknown:
        app.get("x.other")
    assert unknown.value.reason == "unknown_task"


async def test_a_task_another_deploy_registered_fails_and_is_retried_by_its_policy(db_url: str) -> None:
    async with make_app(db_url) as sender, make_app(db_url) as worker_app:
        @sender.task(queue="shared", name="only.here", max_attempts=2, retry=Backoff(0, 0, False))
        async def only_here(ctx: TaskContext) -> None: ...

        @worker_app.task(queue="shared", name="other.task")
        async def other(ctx: TaskContext) -> None: ...

        job_id = await only_here.defer()
        stats = await worker_app.worker(idle_wait_s=0.1).run_until_idle()
        assert (stats.retried, stats.failed) == (1, 1)
        outcome = await sender.result(job_id)
        assert outcome is not None and outcome.status is JobStatus.FAILED
        assert outcome.error is not None and outcome.error.startswith(UnknownTask.__name__)


async def test_a_progress_report_after_the_lease_was_lost_is_refused(db_url: str) -> None:
    async with make_app(db_url) as app:
        answers: list[bool] = []
        release = asyncio.Event()

        @app.task(queue="long")
        async def long_running(ctx: TaskContext) -> None:
            answers.append(await ctx.progress({"step": 1}))
            await release.wait()

        job_id = await long_running.defer()
        worker = app.worker(idle_wait_s=0.1)
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        for _ in range(500):
            if answers:
                break
            await asyncio.sleep(0.01)
        assert answers == [True]
        # An operator cancels the task: the fence no longer matches, progress is refused.
        assert await app.source.cancel(job_id)
        job = next(iter(worker._runner.jobs.values()))  # noqa: SLF001 - the claim in flight
        assert await job.context.progress({"step": 2}) is False
        assert job.context.lease_lost.is_set()
        stop.set()
        release.set()
        await running
        info = await app.source.get_job(job_id)
        assert info is not None and info.status is JobStatus.CANCELLED and info.progress == {"step": 1}


async def test_an_app_on_another_database_defers_and_schedules_there_only(
    db_url: str, database: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    import adapter_support
    from adapter_support import raw
    from tenure.adapters import upgrade

    (tmp_path / "other").mkdir()
    other_url = adapter_support.new_database(database, tmp_path / "other", request)
    await upgrade(other_url)
    app = make_app(db_url)
    tasks = register(app, [])

    @app.periodic(cron="* * * * *", name="minutely", queue="emails")
    async def minutely(ctx: TaskContext, tick: str) -> None: ...

    async with app.on(other_url) as other:
        assert other is not app and other.get("reports.build").app is other
        assert other.tasks["reports.build"].app is other and app.get("reports.build") is tasks["build"]
        await other.defer("reports.build", {"name": "weekly"})
        await other.get(tasks["send_welcome"].name).defer(user_id=1)
        await other.tasks["reports.build"].defer_many([{"name": "daily"}])
        assert len(await other.scheduler().tick()) == 1
    count = "SELECT count(*) FROM tenure_tasks"
    assert raw(other_url, count)[0][0] == 4
    assert raw(db_url, count)[0][0] == 0  # the app's own database: nothing deferred, nothing ticked
    await app.close()
