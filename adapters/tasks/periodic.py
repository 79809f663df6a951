"""Periodic tasks: a cron schedule that defers its task once per tick, across any number
of schedulers.

``@app.periodic(cron="*/5 * * * *", timezone="Europe/Paris")`` registers a task whose
handler takes the tick as its one argument, ``tick`` (an ISO 8601 instant in UTC). A
:class:`Scheduler` (every ``tenure worker --app`` runs one) defers each tick as an owned
submission whose submission ID is the task's name and the tick itself
(``periodic:<task>:<tick>``): however many schedulers defer the same tick, the first
writes the task and the others replay it, so each tick runs once. Cron expressions are
parsed by croniter (five fields, or six with seconds last, as croniter reads them);
the time zone decides which instants the fields mean, daylight saving included (a tick
in a skipped hour moves to the hour after, as croniter computes it).

Missed ticks (every scheduler was down): with ``catch_up=False`` (the default) only the
latest tick due is deferred, so a job that should run every five minutes runs once when
the schedulers come back, not once per missed tick; with ``catch_up=True`` every tick
after the latest one any scheduler deferred (read from the database when a scheduler
starts) is deferred, within the last :data:`CATCH_UP_WINDOW` and at most
:data:`CATCH_UP_LIMIT` (the latest ones); a task never deferred before starts at its
latest tick (a new deployment does not replay a week of ticks).

The scheduler reads its own clock (``now``, injectable): a tick is deferred once that
clock has passed it. Clocks of several schedulers may disagree; the tick they defer is
the same instant either way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import zoneinfo
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from croniter import croniter

from tenure.model import ConfigValidationError, ErrorCode, TenureError
from tenure.model.validation import refuse

from ..core.outages import OutageLog
from ..queue.sources import TaskSource

__all__ = ["Periodic", "Scheduler", "PeriodicTask", "PeriodicApp", "CATCH_UP_WINDOW", "CATCH_UP_LIMIT",
           "tick_submission_id"]

log = logging.getLogger("tenure.adapters.tasks.periodic")

CATCH_UP_WINDOW = dt.timedelta(days=7)
"""How far back ``catch_up=True`` looks for missed ticks."""

CATCH_UP_LIMIT = 1000
"""The most ticks one catch-up defers (the latest ones)."""

MAX_SLEEP_S = 60.0
"""A scheduler wakes at least this often (a clock that stepped is noticed within it)."""


MAX_PERIODIC_NAME_CHARS = 255 - len("periodic::") - len("2000-01-01T00:00:00+00:00")
"""A periodic task's name leaves room for the tick in its submission IDs."""


def tick_submission_id(task_name: str, tick: dt.datetime) -> str:
    """The submission ID a tick is deferred under: the same for every scheduler."""
    return f"periodic:{task_name}:{_iso(tick)}"


def _iso(instant: dt.datetime) -> str:
    return instant.astimezone(dt.timezone.utc).isoformat(timespec="seconds")


def checked_schedule(cron: object, timezone: object) -> tuple[str, zoneinfo.ZoneInfo]:
    """The cron expression and time zone, or ``invalid_periodic`` naming the field."""
    if type(cron) is not str or not cron.strip() or len(cron) > 255 or not croniter.is_valid(cron):
        raise refuse("cron", "cron_expression_required", reason="invalid_periodic")
    if type(timezone) is not str:
        raise refuse("timezone", "time_zone_name_required", reason="invalid_periodic")
    try:
        zone = zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise refuse("timezone", "unknown_time_zone", reason="invalid_periodic") from None
    return cron, zone


class PeriodicTask(Protocol):
    """What the scheduler needs of a registered task (:class:`~tenure.adapters.tasks.app.Task`
    is one): its name, the same task on another app, and its deferrals."""

    @property
    def name(self) -> str: ...

    def on(self, app: Any) -> PeriodicTask: ...

    async def defer(self, *, submission_id: str | None = None, **args: Any) -> str: ...

    async def defer_many(self, many: Sequence[Mapping[str, Any]], *,
                         submission_ids: Sequence[str] | None = None) -> list[str]: ...


class PeriodicApp(Protocol):
    """What the scheduler needs of an app (:class:`~tenure.adapters.tasks.app.TaskApp` is
    one): its periodic tasks and the task source it reads through."""

    @property
    def periodics(self) -> list[Periodic]: ...

    @property
    def source(self) -> TaskSource: ...


@dataclasses.dataclass
class Periodic:
    """One periodic task: its schedule and the last tick this process deferred."""

    task: PeriodicTask
    cron: str
    zone: zoneinfo.ZoneInfo
    catch_up: bool
    last_deferred: dt.datetime | None = None

    def due(self, now: dt.datetime) -> list[dt.datetime]:
        """The ticks to defer at ``now`` (an aware instant), oldest first."""
        local = now.astimezone(self.zone)
        ticks = croniter(self.cron, local + dt.timedelta(microseconds=1))
        latest = ticks.get_prev(dt.datetime)
        if not self.catch_up or self.last_deferred is None:
            return [] if self.last_deferred is not None and latest <= self.last_deferred else [latest]
        floor = local - CATCH_UP_WINDOW
        if self.last_deferred is not None and self.last_deferred > floor:
            floor = self.last_deferred
        found = [latest] if latest > floor else []
        while found and len(found) < CATCH_UP_LIMIT:
            earlier = ticks.get_prev(dt.datetime)
            if earlier <= floor:
                break
            found.append(earlier)
        return list(reversed(found))

    def next_after(self, now: dt.datetime) -> dt.datetime:
        return croniter(self.cron, now.astimezone(self.zone)).get_next(dt.datetime)


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Scheduler:
    """Defers the ticks of an app's periodic tasks (see the module docstring). ``now``
    is the clock it reads (an aware datetime each call)."""

    def __init__(self, app: PeriodicApp, *, now: Callable[[], dt.datetime] = _utc_now) -> None:
        self.app = app
        self.now = now
        self.periodics: list[Periodic] = [dataclasses.replace(periodic) for periodic in app.periodics]
        self.deferred = 0
        """Ticks this scheduler deferred (its replays of ticks another wrote included)."""

    async def tick(self) -> list[str]:
        """Defer every tick due now; the job IDs, in order (a replayed tick answers the
        job another scheduler wrote)."""
        now = self.now()
        if now.tzinfo is None:
            raise ConfigValidationError("invalid_clock", fields=("now",), problems=("timezone_required",))
        ids: list[str] = []
        failure: TenureError | None = None
        for periodic in self.periodics:
            # Each periodic on its own: one that fails does not hold back the others.
            try:
                ids += await self._defer_due(periodic, now)
            except TenureError as error:
                failure = failure or error
        if failure is not None:
            raise failure
        return ids

    async def _defer_due(self, periodic: Periodic, now: dt.datetime) -> list[str]:
        if periodic.catch_up and periodic.last_deferred is None:
            periodic.last_deferred = await self._last_stored_tick(periodic)
        ticks = periodic.due(now)
        if not ticks:
            return []
        task = periodic.task.on(self.app)  # deferred to this scheduler's app's database
        runs: list[dict[str, Any]] = [{"tick": _iso(tick)} for tick in ticks]
        submission_ids = [tick_submission_id(task.name, tick) for tick in ticks]
        try:
            ids = await task.defer_many(runs, submission_ids=submission_ids)
        except TenureError as error:
            if error.code is not ErrorCode.QUEUE_SUBMISSION_CONFLICT:
                raise
            # A tick deferred before under other settings (a deploy changed the task's
            # priority, attempts or retry): that tick is deferred all the same. Each tick
            # alone, so the others are still written.
            ids = []
            for run, submission_id in zip(runs, submission_ids, strict=True):
                try:
                    ids.append(await task.defer(submission_id=submission_id, **run))
                except TenureError as single:
                    if single.code is not ErrorCode.QUEUE_SUBMISSION_CONFLICT:
                        raise
        periodic.last_deferred = ticks[-1]
        self.deferred += len(ticks)
        return ids

    async def _last_stored_tick(self, periodic: Periodic) -> dt.datetime | None:
        """The latest tick any scheduler deferred for this task (catch-up starts after
        it; None: never deferred, so there is nothing to catch up)."""
        newest = await self.app.source.list_tasks(task_name=periodic.task.name, limit=1, newest_first=True)
        if not newest:
            return None
        tick = getattr(newest[0].job, "args", {}).get("tick")
        try:
            return dt.datetime.fromisoformat(tick) if type(tick) is str else None
        except ValueError:
            return None

    def seconds_to_next(self) -> float:
        now = self.now()
        if not self.periodics:
            return MAX_SLEEP_S
        soonest = min(periodic.next_after(now) for periodic in self.periodics)
        return max(0.0, min(MAX_SLEEP_S, (soonest - now).total_seconds()))

    async def run(self, stop: asyncio.Event) -> int:
        """Defer ticks as they come due until ``stop`` is set; how many it deferred. A
        database failure is logged and the tick tried again on the next wake-up (its
        submission ID makes the retry safe)."""
        outage = OutageLog(log, "periodic tasks")  # a failing database is said once per change, not each second
        while not stop.is_set():
            try:
                await self.tick()
                outage.answered()
                pause = self.seconds_to_next() + 0.001
            except TenureError as error:
                outage.failed("deferring a tick", error.code.value, error.reason)
                pause = 1.0
            except Exception:  # noqa: BLE001 - the scheduler must outlive any one failure, loudly
                log.exception("periodic tasks: the scheduler met an unexpected error; trying again")
                pause = 1.0
            await _sleep_or_stop(stop, pause)
        return self.deferred


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        pass


def periodic_parameters_problem(parameters: Sequence[Any]) -> bool:
    """Whether a periodic handler's parameters after the context are not exactly ``tick``."""
    return [parameter.name for parameter in parameters[1:]] != ["tick"]
