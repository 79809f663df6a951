"""Periodic tasks on every database: each tick is deferred exactly once however many
schedulers run, missed ticks follow ``catch_up``, time zones decide what the cron fields
mean, and bad schedules are refused before anything is registered."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from tenure.adapters import TaskApp, TaskContext
from tenure.adapters.tasks.periodic import tick_submission_id
from tenure.model import ConfigValidationError, JobStatus

UTC = dt.timezone.utc
START = dt.datetime(2026, 12, 5, 10, 2, 30, tzinfo=UTC)


class SteppedClock:
    """A clock the test moves; every scheduler reads the same one."""

    def __init__(self, at: dt.datetime) -> None:
        self.at = at

    def __call__(self) -> dt.datetime:
        return self.at

    def step(self, **delta: float) -> None:
        self.at += dt.timedelta(**delta)


def periodic_app(db_url: str, runs: list[str], *, catch_up: bool = False, timezone: str = "UTC",
                 cron: str = "*/5 * * * *") -> TaskApp:
    app = TaskApp(db_url)

    @app.periodic(cron=cron, timezone=timezone, catch_up=catch_up, name="report.every_five", queue="cron")
    async def every_five(ctx: TaskContext, tick: str) -> dict[str, Any]:
        runs.append(tick)
        return {"tick": tick}

    return app


async def ticks_stored(app: TaskApp) -> list[str]:
    return sorted(info.job.args["tick"] for info in await app.source.list_tasks(limit=10_000))  # type: ignore[union-attr]


async def test_every_tick_is_deferred_once_by_any_number_of_schedulers(db_url: str) -> None:
    runs: list[str] = []
    clock = SteppedClock(START)
    apps = [periodic_app(db_url, runs) for _ in range(3)]
    schedulers = [app.scheduler(now=clock) for app in apps]
    try:
        for step in range(4):  # 10:02:30, 10:07:30, 10:12:30, 10:17:30
            if step:
                clock.step(minutes=5)
            answers = await asyncio.gather(*(scheduler.tick() for scheduler in schedulers))
            assert len({tuple(ids) for ids in answers}) == 1  # every scheduler answers the same job
        assert await ticks_stored(apps[0]) == ["2026-12-05T10:00:00+00:00", "2026-12-05T10:05:00+00:00",
                                               "2026-12-05T10:10:00+00:00", "2026-12-05T10:15:00+00:00"]
        # A tick is not deferred twice by the same scheduler either, and the same clock
        # reading again defers nothing new.
        assert await schedulers[0].tick() == []
        await apps[0].worker(idle_wait_s=0.1).run_until_idle()
        assert sorted(runs) == await ticks_stored(apps[0])  # each tick ran exactly once
        infos = await apps[0].source.list_tasks(limit=100)
        assert all(info.status is JobStatus.COMPLETED and info.protected for info in infos)
        assert {info.submission_id for info in infos} == {
            tick_submission_id("report.every_five", dt.datetime.fromisoformat(tick)) for tick in runs}
    finally:
        for app in apps:
            await app.close()


@pytest.mark.parametrize("catch_up", [False, True])
async def test_missed_ticks_after_downtime_follow_catch_up(db_url: str, catch_up: bool) -> None:
    clock = SteppedClock(START)
    app = periodic_app(db_url, [], catch_up=catch_up)
    async with app:
        first = app.scheduler(now=clock)
        await first.tick()  # 10:00
        clock.step(minutes=30)  # every scheduler down for half an hour: 10:05 ... 10:30 missed
        restarted = app.scheduler(now=clock)
        await restarted.tick()
        stored = await ticks_stored(app)
        if catch_up:
            assert stored == [f"2026-12-05T10:{minute:02d}:00+00:00" for minute in range(0, 35, 5)]
        else:
            assert stored == ["2026-12-05T10:00:00+00:00", "2026-12-05T10:30:00+00:00"]


async def test_a_first_start_catches_up_nothing_before_the_latest_tick(db_url: str) -> None:
    # Nothing ran before: catch_up has no last tick to start from, so a new deployment
    # does not replay a week of ticks.
    app = periodic_app(db_url, [], catch_up=True)
    async with app:
        await app.scheduler(now=SteppedClock(START)).tick()
        assert await ticks_stored(app) == ["2026-12-05T10:00:00+00:00"]


async def test_the_time_zone_decides_what_the_cron_fields_mean(db_url: str) -> None:
    clock = SteppedClock(dt.datetime(2026, 12, 5, 8, 30, tzinfo=UTC))  # 09:30 in Paris
    app = periodic_app(db_url, [], cron="0 9 * * *", timezone="Europe/Paris")
    async with app:
        await app.scheduler(now=clock).tick()
        assert await ticks_stored(app) == ["2026-12-05T08:00:00+00:00"]  # 09:00 Paris time


async def test_a_scheduler_runs_until_stopped_and_a_worker_runs_its_ticks(db_url: str) -> None:
    runs: list[str] = []
    app = periodic_app(db_url, runs, cron="* * * * * */1")  # every second (croniter's sixth field)
    async with app:
        stop = asyncio.Event()
        scheduler = asyncio.create_task(app.scheduler().run(stop))
        worker = asyncio.create_task(app.worker(idle_wait_s=0.1).run(stop))
        for _ in range(300):
            if len(runs) >= 2:
                break
            await asyncio.sleep(0.02)
        stop.set()
        deferred = await scheduler
        await worker
        assert len(runs) >= 2 and deferred >= len(runs)
        assert len(set(runs)) == len(runs)


@pytest.mark.parametrize(("settings", "field"), [
    ({"cron": "not a cron"}, "cron"),
    ({"cron": "61 * * * *"}, "cron"),
    ({"cron": 5}, "cron"),
    ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
    ({"cron": "* * * * *", "catch_up": "yes"}, "catch_up"),
])
def test_a_schedule_that_does_not_parse_is_refused_naming_its_field(settings: dict[str, Any], field: str) -> None:
    app = TaskApp("sqlite:///unused.db")
    with pytest.raises(ConfigValidationError) as refused:
        app.periodic(**settings)
    assert refused.value.fields == (field,)
    assert app.periodics == [] and app.tasks == {}


def test_a_periodic_handler_takes_the_tick_and_nothing_else() -> None:
    app = TaskApp("sqlite:///unused.db")

    async def no_tick(ctx: Any) -> None: ...

    with pytest.raises(ConfigValidationError) as refused:
        app.periodic(cron="* * * * *")(no_tick)
    assert refused.value.problems == ("tick_parameter_required",)


async def test_a_tick_deferred_under_other_settings_counts_as_deferred_after_a_deploy(db_url: str) -> None:
    clock = SteppedClock(START)
    before = periodic_app(db_url, [])
    async with before:
        first = await before.scheduler(now=clock).tick()
    after = TaskApp(db_url)  # the next deploy: the same periodic task at another priority

    @after.periodic(cron="*/5 * * * *", name="report.every_five", queue="cron", priority=90)
    async def every_five(ctx: TaskContext, tick: str) -> None: ...

    @after.periodic(cron="*/5 * * * *", name="report.other", queue="cron")
    async def other(ctx: TaskContext, tick: str) -> None: ...

    async with after:
        scheduler = after.scheduler(now=clock)
        assert await scheduler.tick() != []  # no conflict raised; the other periodic is deferred
        clock.step(minutes=5)
        await scheduler.tick()
        stored = sorted((info.job.task_name, info.job.args["tick"], info.job.priority)  # type: ignore[union-attr]
                        for info in await after.source.list_tasks(limit=100))
        assert stored == [
            ("report.every_five", "2026-12-05T10:00:00+00:00", 0),  # the first deploy's, kept
            ("report.every_five", "2026-12-05T10:05:00+00:00", 90),
            ("report.other", "2026-12-05T10:00:00+00:00", 0),
            ("report.other", "2026-12-05T10:05:00+00:00", 0),
        ]
        assert len(first) == 1


def test_a_periodic_name_too_long_for_its_tick_ids_is_refused() -> None:
    app = TaskApp("sqlite:///unused.db")

    async def handler(ctx: Any, tick: str) -> None: ...

    with pytest.raises(ConfigValidationError) as refused:
        app.periodic(cron="* * * * *", name="a" * 230)(handler)
    assert refused.value.problems == ("too_long_for_periodic",) and app.tasks == {}
