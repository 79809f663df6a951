"""Tasks for everyone: name a function a task, defer it, and let a fenced worker run it.

::

    app = TaskApp(os.environ["TENURE_DB"])

    @app.task(queue="emails", max_attempts=5, retry=Backoff(base_s=1, max_s=300), priority=50)
    async def send_welcome(ctx: TaskContext, user_id: int) -> dict:
        ...

    job_id = await send_welcome.defer(user_id=42, submission_id="welcome-42")   # replay-safe
    await send_welcome.defer(user_id=7, schedule_in=60)                         # due in a minute
    await send_welcome.defer_many([{"user_id": i} for i in range(1000)])        # one transaction
    outcome = await app.result(job_id, wait_s=10)
    job_id = send_welcome.defer_sync(user_id=42)   # from a Django or Flask view: no event loop

    @app.task(queue="reports")
    def build_report(ctx: TaskContext, name: str) -> str:       # a plain function: run in a thread
        ...

A task is a row of ``tenure_tasks`` driven by the same kernel as every owned queue: a
claim stores a fresh nonce and advances the generation, and the handler's outcome is
written only with that exact fence while the lease is live, so a worker that lost its
task can never overwrite the new owner's result.

What a deferral checks, before anything is written (``ConfigValidationError``, naming
the field): the arguments bind to the function's parameters and are a JSON object within
``WorkerConfig.max_payload_bytes``; ``schedule_in`` and ``schedule_at`` (one of them);
``priority`` (0..100); ``submission_id``. A deferral with a ``submission_id`` is an owned
submission: its exact replay answers the original job ID, a changed one raises
``QUEUE_SUBMISSION_CONFLICT``, and retention never purges it. Without one, each call is
a new task, which retention may purge once finished.

``schedule_in`` counts from the database's clock when the task is inserted (a replay
with the same delay is the same request); ``schedule_at`` is an instant.

The handler gets a :class:`TaskContext` (the worker's ``JobContext``: ``job_id``,
``attempt``, ``generation``, ``task_name``, ``queue_name``, ``heartbeat_now()``,
``progress(...)``, ``lease_lost``) and the deferred arguments as keywords. It returns its
result, any JSON value (an object, a list, a string, a number, a boolean), or None; a
result that cannot be stored (not JSON, or too large) fails the task at once, never
retried (the handler did its work). An exception fails the attempt: the task comes back
after its own backoff while attempts remain (``FailJob(message)`` ends it at once;
``FailJob(message, retry=True)`` asks for the retry explicitly).

A plain ``def`` task runs in a thread of its own (a daemon thread, so a handler stuck in
it never holds the process open at exit), at most ``threads`` at once per worker
(``app.worker(threads=N)``; by default its ``concurrency`` bounds them), while the event
loop keeps renewing the claim's lease and writes the outcome under its fence as for an
async task. It gets the same context, whose coroutine methods (``progress``,
``heartbeat_now``) it cannot await: read its IDs and ``lease_lost``. A thread cannot be
stopped: when the attempt is cancelled (its lease lost, the worker stopping, its
timeout) the thread runs on detached (logged, counted in :attr:`TaskApp.abandoned`) and
what it returns is discarded, never written.

Hooks run around every task a worker of the app runs, in the asyncio task that runs the
attempt (so a context variable or a tracing span a ``before_task`` hook sets is the
handler's, in a plain task's thread too):
``@app.before_task`` ``f(ctx)`` before the handler (one that raises fails the attempt as
the handler would have, and the handler does not run); ``@app.after_task``
``f(ctx, result, error)`` once the attempt ended (``error`` None when the handler
returned); ``@app.on_failure`` ``f(ctx, error)`` when the handler (or a ``before_task``
hook) raised, a timeout included; and
``@app.on_worker_start`` / ``@app.on_worker_stop`` ``f()`` when a worker of the app
starts (one that raises stops the start) and ends. Hooks may be ``async def`` or plain
functions (run in the event loop: keep them short), run in registration order. An
``after_task``, ``on_failure`` or ``on_worker_stop`` hook that raises is logged (its
exception type and the hook's name) and changes nothing: the outcome stands. The
worker's own cancellation of an attempt (its lease lost, the worker stopping) runs no
hook after the handler: nothing is written for that attempt.

A task registered with ``timeout_s`` is cancelled when it runs past it, and its attempt
fails with :class:`TaskTimeout` (stored as ``TaskTimeout: ran past its timeout of N s``),
retried by its policy while attempts remain; the fenced write is the same as any
failure's, so a worker that lost the claim meanwhile writes nothing. A handler that
ignores its cancellation (catches ``CancelledError`` and goes on) cannot be stopped: after
:data:`TIMEOUT_GRACE_S` its attempt fails all the same, the handler is left running
detached (logged at ERROR, counted in :attr:`TaskApp.abandoned`), and whatever it
returns later is discarded, never written; the task may meanwhile be retried, so such a
handler may overlap its own retry. A handler that lets ``CancelledError`` through never
does.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import contextvars
import functools
import inspect
import logging
import pathlib
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from tenure.model import (
    TERMINAL_STATUSES,
    ClaimedTask,
    ConfigValidationError,
    JobStatus,
    TaskJob,
    WorkerConfig,
    bounds,
)
from tenure.model.validation import backoff_seconds, is_queue_name, refuse

from ..queue.job import FailJob, JobContext
from ..queue.sources import MAX_BATCH, TaskSource
from ..queue.runner import WorkerStats
from ..queue.worker import MAX_CONCURRENCY, Worker
from .periodic import MAX_PERIODIC_NAME_CHARS, Periodic, Scheduler, checked_schedule, periodic_parameters_problem
from .sync import SyncClient, refuse_inside_a_running_loop

__all__ = ["TaskApp", "Task", "TaskWorker", "Backoff", "TaskContext", "TaskOutcome", "UnknownTask", "TaskTimeout",
           "RESERVED_ARGUMENTS", "HOOKS", "default_name", "MAX_WAIT_S", "MAX_TIMEOUT_S", "TIMEOUT_GRACE_S", "poll_until"]

log = logging.getLogger("tenure.adapters.queue.worker")
"""The worker's logger: a task's timeout is a line about its claim, beside the others."""

TaskContext = JobContext
"""What a task handler may know and do about its claim (see :class:`JobContext`)."""

RESERVED_ARGUMENTS = frozenset({"submission_id", "schedule_in", "schedule_at", "priority", "using"})
"""``defer``'s own options: a task's parameters may not use these names."""

DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 3
MAX_WAIT_S = 3600.0
MAX_TIMEOUT_S = 7 * 86_400.0
"""The longest ``timeout_s`` a task may have (a week)."""
TIMEOUT_GRACE_S = 5.0
"""How long a task cancelled at its timeout may take to end before its attempt fails
anyway and the handler is left running detached (see the module docstring)."""
_FIRST_POLL_S = 0.02
_MAX_POLL_S = 0.25

T = TypeVar("T")

HOOKS = ("before_task", "after_task", "on_failure", "on_worker_start", "on_worker_stop")
"""The hooks an app registers (see the module docstring), each a decorator of its name."""

H = TypeVar("H", bound=Callable[..., Any])


async def _called(hook: Callable[..., Any], *args: Any) -> None:
    """Call a hook; await what it answers when it is awaitable (an ``async def`` hook)."""
    answer = hook(*args)
    if inspect.isawaitable(answer):
        await answer


def _is_async(function: Callable[..., Any]) -> bool:
    """Whether ``function`` gives a coroutine to await: an ``async def``, a partial of one,
    or a plain wrapper of one (``functools.wraps``, as decorators write them). An async
    generator is neither a coroutine nor a plain function: never a task."""
    if inspect.isasyncgenfunction(function) or inspect.isasyncgenfunction(inspect.unwrap(function)):
        return False
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(inspect.unwrap(function))


def _cancelled_by_the_worker() -> bool:
    """Whether the worker is cancelling the asyncio task this runs in (the lease lost, the
    worker stopping), as opposed to a handler's own ``CancelledError``."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0


async def _each_logged(hooks: Sequence[Callable[..., Any]], what: str, *args: Any) -> None:
    """Call every hook of ``hooks``; one that raises anything is logged and the next still
    runs (only the worker's own cancellation of this task goes through)."""
    for hook in hooks:
        try:
            await _called(hook, *args)
        except BaseException as error:  # noqa: BLE001 - a hook after the fact changes no outcome
            if _cancelled_by_the_worker():
                raise
            log.error("%s hook %s raised %s; ignored", what, getattr(hook, "__qualname__", "?"), type(error).__name__,
                      extra={"outcome": "hook_failed"})


async def poll_until(read: Callable[[], Awaitable[T]], settled: Callable[[T], bool], wait_s: float) -> T:
    """Call ``read`` until ``settled`` holds of what it answered or ``wait_s`` seconds (0 to
    :data:`MAX_WAIT_S`) have passed, and return its last answer; the pause between reads
    doubles from 0.02 s to 0.25 s and never outlasts the wait. Refuses a ``wait_s`` out of
    range (``invalid_wait``) before the first read."""
    # Compared, never converted: a huge int or a NaN is simply out of range.
    if type(wait_s) not in (int, float) or not 0 <= wait_s <= MAX_WAIT_S:
        raise refuse("wait_s", "number_out_of_range", reason="invalid_wait")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    pause = _FIRST_POLL_S
    while True:
        answer = await read()
        if settled(answer) or loop.time() >= deadline:
            return answer
        await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
        pause = min(pause * 2, _MAX_POLL_S)


@dataclasses.dataclass(frozen=True, slots=True)
class Backoff:
    """A task's retry policy: attempt ``n`` failing waits ``min(max_s, base_s * 2**n)``
    seconds, less a random part of up to half of it when ``jitter``."""

    base_s: float = 1.0
    max_s: float = 300.0
    jitter: bool = True

    def __post_init__(self) -> None:
        for field in ("base_s", "max_s"):
            backoff_seconds(getattr(self, field), field, reason="invalid_backoff")
        if self.base_s > self.max_s:
            raise refuse("base_s", "base_above_max", reason="invalid_backoff")
        if type(self.jitter) is not bool:
            raise refuse("jitter", "bool_required", reason="invalid_backoff")

    @property
    def millis(self) -> tuple[int, int]:
        return round(self.base_s * 1000), round(self.max_s * 1000)


@dataclasses.dataclass(frozen=True, slots=True)
class TaskOutcome:
    """Where a task stands: ``done`` once finished (``ok`` when completed, with its
    ``result``; ``error`` is the last failure's type and message)."""

    job_id: str
    task_name: str
    status: JobStatus
    result: Any
    error: str | None
    attempts: int
    progress: Any

    @property
    def done(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def ok(self) -> bool:
        return self.status is JobStatus.COMPLETED


class UnknownTask(Exception):
    """A worker claimed a task whose name this app does not register (another deploy's
    task on a shared queue): the attempt fails and the task is retried by its policy."""

    def __init__(self) -> None:
        super().__init__("no handler is registered for this task's name in this worker")


class TaskTimeout(FailJob):
    """A task ran past its ``timeout_s``: its attempt fails and is retried by its policy."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"ran past its timeout of {timeout_s:g} s", retry=True)


class _Exited(Exception):
    """Carries a handler's ``SystemExit`` or ``KeyboardInterrupt`` out of the task a timeout
    runs it in (asyncio re-raises those two out of the event loop): raised again in the
    worker's own handler task, where the worker makes it a failure of the attempt."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(type(raised).__name__)
        self.raised = raised


def _timeout_seconds(value: object) -> float | None:
    """``timeout_s`` checked: None, or a number of seconds in (0, :data:`MAX_TIMEOUT_S`]."""
    if value is None:
        return None
    number = value if type(value) in (int, float) else None
    # Compared, never converted first: a NaN fails the comparison, a huge int exceeds the bound.
    if number is None or not 0 < number <= MAX_TIMEOUT_S:  # type: ignore[operator]
        raise refuse("timeout_s", "number_out_of_range", reason="invalid_task")
    return float(number)  # type: ignore[arg-type]


def _delay_ms(schedule_in: object) -> int | None:
    if schedule_in is None:
        return None
    return round(backoff_seconds(schedule_in, "schedule_in", reason="invalid_deferral") * 1000)


def _priority(value: object, field: str = "priority") -> int:
    if not bounds.is_strict_int(value) or not 0 <= value <= bounds.MAX_PRIORITY:  # type: ignore[operator]
        raise refuse(field, "integer_out_of_range", reason="invalid_deferral")
    return value  # type: ignore[return-value]


def default_name(function: Callable[..., Any]) -> str:
    """``module.qualname`` (a nested function's without its "<locals>" parts), the module
    named as an import names it (see :func:`_main_module_name`)."""
    module = function.__module__
    if module == "__main__":
        module = _main_module_name(getattr(function, "__globals__", {}))
    return f"{module}.{function.__qualname__}".replace(".<locals>", "")


def _main_module_name(namespace: Mapping[str, Any]) -> str:
    """The name a worker imports a script's module by. A task's default name must not
    depend on how its module was loaded: deferred from ``python jobs.py`` (where the
    module is ``__main__``) it must have the name ``tenure worker --app jobs:app``
    registers, or every attempt fails ``UnknownTask``. Run with ``python -m`` the module
    knows its name; run as a file, it is the file's stem, inside the packages (folders
    with an ``__init__.py``) that hold it, as an import from the folder above them names
    it. Without a file (``python -c``, an interactive session, a notebook) no import
    could find the task: ``name=`` is required."""
    spec = namespace.get("__spec__")
    if spec is not None and isinstance(getattr(spec, "name", None), str) and spec.name != "__main__":
        return str(spec.name)
    path = namespace.get("__file__")
    if not isinstance(path, str) or not path.endswith(".py"):
        raise refuse("name", "name_required_outside_a_module_file", reason="invalid_task")
    file = pathlib.Path(path).resolve()
    parts = [file.stem]
    folder = file.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts)


class Task:
    """One registered task: call ``defer`` to enqueue it, or call it directly (with a
    context) to run the function in-process."""

    def __init__(self, app: TaskApp, function: Callable[..., Any], *, name: str, queue: str,
                 priority: int, max_attempts: int, retry: Backoff, timeout_s: float | None = None) -> None:
        self.app = app
        self.function = function
        self.sync = not _is_async(function)
        """A plain ``def`` task: a worker runs it in a thread (see the module docstring)."""
        self.name = name
        self.queue = queue
        self.priority = priority
        self.max_attempts = max_attempts
        self.retry = retry
        self.timeout_s = timeout_s
        self._signature = inspect.signature(function)
        self.__doc__ = function.__doc__

    def __repr__(self) -> str:
        return f"Task({self.name!r}, queue={self.queue!r})"

    def on(self, app: TaskApp) -> Task:
        """This task as ``app`` defers it (``app`` shares its registry: see
        :meth:`TaskApp.on`): the same function and settings, its deferrals written to
        ``app``'s database. Itself when ``app`` is its own."""
        if app is self.app:
            return self
        bound = copy.copy(self)
        bound.app = app
        return bound

    async def __call__(self, ctx: Any, /, **args: Any) -> Any:
        if self.sync:
            return self.function(ctx, **args)  # in-process, in this thread
        return await self.function(ctx, **args)

    def job(self, args: Mapping[str, Any], *, schedule_in: float | None = None,
            schedule_at: dt.datetime | None = None, priority: int | None = None) -> TaskJob:
        """The envelope a deferral stores (validated: see the module docstring)."""
        if not isinstance(args, Mapping):
            raise refuse("args", "json_object_required", reason="invalid_task_arguments")
        try:
            self._signature.bind(None, **args)
        except TypeError:
            raise refuse("args", "arguments_do_not_match", reason="invalid_task_arguments") from None
        if schedule_in is not None and schedule_at is not None:
            raise refuse("schedule_in", "schedule_in_or_schedule_at", reason="invalid_deferral")
        base_ms, max_ms = self.retry.millis
        return TaskJob(self.queue, self.name, dict(args),
                       priority=self.priority if priority is None else _priority(priority),
                       retry_base_ms=base_ms, retry_max_ms=max_ms, retry_jitter=self.retry.jitter,
                       fires_at=schedule_at, delay_ms=_delay_ms(schedule_in), max_attempts=self.max_attempts)

    async def defer(self, *, submission_id: str | None = None, schedule_in: float | None = None,
                    schedule_at: dt.datetime | None = None, priority: int | None = None, using: Any = None,
                    **args: Any) -> str:
        """Enqueue one run with ``args``; its job ID. With ``submission_id`` it is
        replay-safe (the same call again answers the same ID). With ``using`` (your open
        transaction's connection or session: asyncpg, aiosqlite, or SQLAlchemy's
        ``AsyncConnection`` / ``AsyncSession`` on either) it is written in that
        transaction and commits or rolls back with your data."""
        job = self.job(args, schedule_in=schedule_in, schedule_at=schedule_at, priority=priority)
        source = self.app.source
        if using is not None:
            ids = None if submission_id is None else [submission_id]
            return (await source.submit_using(using, [job], submission_ids=ids))[0]
        if submission_id is None:
            return await source.submit(job)
        return await source.submit_owned(job, submission_id=submission_id)

    async def defer_many(self, many: Sequence[Mapping[str, Any]], *, submission_ids: Sequence[str] | None = None,
                         schedule_in: float | None = None, schedule_at: dt.datetime | None = None,
                         priority: int | None = None, using: Any = None) -> list[str]:
        """Enqueue one run per argument mapping, all in one transaction however many
        there are (one lock-and-clock statement, then one pipelined insert); the job IDs
        in order. ``submission_ids`` (one per run, no two alike) makes each replay-safe.
        Every run is validated, and every run decided, before anything is written: a
        refusal, a conflict or a database failure writes nothing of the call, so the
        whole call can be repeated (a repeated call of plain runs then writes each run
        once; only a failure of the COMMIT itself leaves unknown whether it was written,
        which ``submission_ids`` make safe to repeat). Being one transaction, a call
        must finish within ``WorkerConfig.timeout_seconds`` on PostgreSQL (tens of
        thousands of runs take seconds). ``using``: as for :meth:`defer` (then every run
        is written in your transaction, and a conflict raises before any of them is)."""
        if not isinstance(many, (list, tuple)):
            raise refuse("many", "list_required", reason="invalid_deferral")
        if submission_ids is not None and (not isinstance(submission_ids, (list, tuple))
                                           or len(submission_ids) != len(many)):
            raise refuse("submission_ids", "one_per_run_required", reason="invalid_deferral")
        jobs = [self.job(args, schedule_in=schedule_in, schedule_at=schedule_at, priority=priority) for args in many]
        source = self.app.source
        # Validated and frozen a chunk at a time (the source's batch bound), then written
        # as one batch: one transaction for the whole call.
        requests = [request for start in range(0, len(jobs), MAX_BATCH) for request in source.prepared(
            jobs[start:start + MAX_BATCH], None if submission_ids is None else list(submission_ids[start:start + MAX_BATCH]))]
        if submission_ids is not None and len({request.submission_id for request in requests}) != len(requests):
            raise refuse("submission_ids", "duplicate_submission_id", reason="invalid_deferral")
        if not requests:
            return []
        return await (source.write_using(using, requests) if using is not None else source.write_many(requests))

    def defer_sync(self, **options: Any) -> str:
        """:meth:`defer` from code without a running event loop (a Django or Flask view,
        a script, a plain ``def`` task): the same checks, ``submission_id`` and errors,
        through the app's sync client (:mod:`tenure.adapters.tasks.sync`). ``using`` is
        not taken here (the async form takes your async connection)."""
        _refuse_sync_using(options)
        return self.app.sync.call("defer_sync", lambda app: self.on(app).defer(**options))

    def defer_many_sync(self, many: Sequence[Mapping[str, Any]], **options: Any) -> list[str]:
        """:meth:`defer_many` from code without a running event loop (see :meth:`defer_sync`)."""
        _refuse_sync_using(options)
        return self.app.sync.call("defer_many_sync", lambda app: self.on(app).defer_many(many, **options))


def _refuse_sync_using(options: Mapping[str, Any]) -> None:
    """The sync forms take no ``using`` (see :mod:`tenure.adapters.tasks.sync`)."""
    if "using" in options:
        raise refuse("using", "not_supported_by_sync_calls", reason="invalid_deferral")


class TaskWorker(Worker):
    """The fenced :class:`Worker` of a :class:`TaskApp` (:meth:`TaskApp.worker`): the
    same worker, with the app's ``on_worker_start`` hooks run before it claims anything
    and its ``on_worker_stop`` hooks once it ended. A run the Worker refuses (a second
    run, a ``stop`` that is not an ``asyncio.Event``) runs no hook."""

    def __init__(self, app: TaskApp, *arguments: Any, **settings: Any) -> None:
        self.task_names = tuple(sorted(app._tasks))  # recorded with the worker (tenure workers)
        super().__init__(*arguments, **settings)
        self.app = app
        self._started = False
        self.hooks_ran = asyncio.Event()
        """Set once the ``on_worker_start`` hooks ran and the worker goes on to serve."""

    async def run(self, stop: asyncio.Event | None = None) -> WorkerStats:
        return await self._hooked(super().run, stop)

    async def run_until_idle(self, stop: asyncio.Event | None = None) -> WorkerStats:
        return await self._hooked(super().run_until_idle, stop)

    async def _hooked(self, run: Callable[[asyncio.Event | None], Awaitable[WorkerStats]],
                      stop: asyncio.Event | None) -> WorkerStats:
        if self._started or (stop is not None and type(stop) is not asyncio.Event):
            return await run(stop)  # refused by the Worker itself, before any hook
        for hook in self.app.hooks("on_worker_start"):
            await _called(hook)  # one that raises: this run never starts (and may be tried again)
        self._started = True
        self.hooks_ran.set()
        try:
            return await run(stop)
        finally:
            await _each_logged(self.app.hooks("on_worker_stop"), "on_worker_stop")


class TaskApp:
    """The tasks of one application on one database (``db_url``: ``sqlite:///path`` or
    ``postgresql://...``; ``config``: the worker settings, lease and timeouts included).

    Constructing it neither connects nor migrates (``tenure migrate`` or
    :func:`tenure.adapters.upgrade` creates ``tenure_tasks``)."""

    def __init__(self, db_url: str, *, config: WorkerConfig | None = None) -> None:
        if config is None:
            config = WorkerConfig(db_url)
        elif type(config) is not WorkerConfig or config.db_url != db_url:
            raise refuse("config", "worker_config_for_this_db_url_required")
        self.db_url = db_url
        self.config = config
        self._tasks: dict[str, Task] = {}
        self._periodics: list[Periodic] = []
        self._source: TaskSource | None = None
        self._sync = SyncClient(self)
        """The sync client (:mod:`tenure.adapters.tasks.sync`): made here, where no other
        thread can race its making, and opened only by its first call."""
        self._hooks: dict[str, list[Callable[..., Any]]] = {kind: [] for kind in HOOKS}
        self._detached: set[asyncio.Task[Any]] = set()
        """Handlers left running past their timeout (they ignored their cancellation)."""
        self.abandoned = 0
        """Handlers this app's workers left running detached, having ignored their
        cancellation at their timeout (see the module docstring)."""

    def on(self, db_url: str, config: WorkerConfig | None = None) -> TaskApp:
        """This app's tasks on another database (or settings): a new app sharing the
        registry (``tenure worker --app ... --db URL``). Itself when nothing differs.
        Everything the new app does is on its database: its worker, its scheduler's
        ticks, and its deferrals (:meth:`defer`, and the tasks :meth:`get` and
        :attr:`tasks` give, which defer through it); a task object the module holds
        (``send_welcome.defer``) still defers to the app it was registered on."""
        if db_url == self.db_url and (config is None or config == self.config):
            return self
        fresh = TaskApp(db_url, config=config)  # the URL and settings checked as a new app's
        other = self.copy_for_another_loop()  # the same registries (and a subclass's own), no connection
        other.db_url, other.config = fresh.db_url, fresh.config
        return other

    def copy_for_another_loop(self) -> TaskApp:
        """This app, with the same registries, database and settings but no connection:
        what the sync client runs on its own event loop (connections belong to a loop)."""
        other = copy.copy(self)
        other._source, other._detached, other.abandoned = None, set(), 0
        other._sync = SyncClient(other)  # never opened: the copy is the one sync calls run on
        return other

    @property
    def sync(self) -> SyncClient:
        """The app's sync client, for code without an event loop (opened on first use)."""
        return self._sync

    def defer_sync(self, task_name: str, args: Mapping[str, Any] | None = None, **options: Any) -> str:
        """:meth:`defer` from code without a running event loop (see
        :meth:`Task.defer_sync`)."""
        _refuse_sync_using(options)
        async def defer(app: TaskApp) -> str:
            return await app.defer(task_name, args, **options)

        return self.sync.call("defer_sync", defer)

    def result_sync(self, job_id: str, *, wait_s: float = 0.0) -> TaskOutcome | None:
        """:meth:`result` from code without a running event loop."""
        async def result(app: TaskApp) -> TaskOutcome | None:
            return await app.result(job_id, wait_s=wait_s)

        return self.sync.call("result_sync", result)

    def close_sync(self) -> None:
        """Close the sync client's connections and stop its thread (``await close()``
        does it too); the app's own connections are :meth:`close`'s. Refused where an
        event loop is running (``await app.close()`` there)."""
        refuse_inside_a_running_loop("close_sync")
        self._sync.close()

    # --- registering -------------------------------------------------------------------

    def task(self, function: Callable[..., Any] | None = None, *, name: str | None = None,
             queue: str = DEFAULT_QUEUE, priority: int = 0, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
             retry: Backoff | None = None, timeout_s: float | None = None) -> Any:
        """Register a function ``f(ctx, **args)`` (``async def``, or a plain ``def`` a worker
        runs in a thread) as a task (as ``@app.task`` or
        ``@app.task(...)``). ``name`` defaults to ``module.qualname`` (a script's module
        named as a worker imports it: ``python jobs.py`` names its tasks ``jobs.*``;
        required where no module file exists, as in ``python -c``); ``queue`` is an
        identifier; ``priority`` 0..100 (higher first); ``max_attempts`` >= 1; ``retry``
        the backoff between attempts (default ``Backoff()``: attempt ``n`` failing waits
        ``min(300, 2**n)`` seconds, less a jitter of up to half); ``timeout_s`` (None: no
        limit; up to a week) cancels an attempt that runs longer and fails it with
        :class:`TaskTimeout`, retried by the policy (see the module docstring)."""
        def register(target: Callable[..., Any]) -> Task:
            return self._register(target, name=name, queue=queue, priority=priority, max_attempts=max_attempts,
                                  retry=Backoff() if retry is None else retry, timeout_s=timeout_s)

        return register if function is None else register(function)

    def _register(self, function: Callable[..., Any], *, name: str | None, queue: str, priority: int,
                  max_attempts: int, retry: Backoff, timeout_s: object = None) -> Task:
        if not _is_async(function) and (not (inspect.isfunction(function) or inspect.ismethod(function))
                                        or inspect.isgeneratorfunction(function)
                                        or inspect.isasyncgenfunction(function)):
            raise refuse("function", "function_required", reason="invalid_task")
        parameters = list(inspect.signature(function).parameters.values())
        if not parameters or parameters[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                        inspect.Parameter.POSITIONAL_OR_KEYWORD):
            raise refuse("function", "context_parameter_required", reason="invalid_task")
        if any(parameter.name in RESERVED_ARGUMENTS for parameter in parameters[1:]):
            raise refuse("function", "reserved_argument_name", reason="invalid_task")
        # The default name is the function's module and qualified name (a nested function's
        # without its "<locals>" parts; a script's module named as an import names it).
        # Give ``name`` when the code may move: a task deferred under one name is run only
        # by a worker that registers that name.
        chosen = name if name is not None else default_name(function)
        if not is_queue_name(queue):
            raise refuse("queue", "identifier_required", reason="invalid_task")
        if not bounds.is_strict_int(max_attempts) or not 1 <= max_attempts <= bounds.INT32_MAX:
            raise refuse("max_attempts", "integer_out_of_range", reason="invalid_task")
        if type(retry) is not Backoff:
            raise refuse("retry", "backoff_required", reason="invalid_task")
        limit = _timeout_seconds(timeout_s)
        _priority(priority)
        try:  # the name is checked as the envelope checks it (a dotted identifier of at most 255)
            TaskJob(queue, chosen)
        except ConfigValidationError:
            raise refuse("name", "dotted_identifier_required", reason="invalid_task") from None
        if chosen in self._tasks:
            raise refuse("name", "already_registered", reason="invalid_task")
        task = Task(self, function, name=chosen, queue=queue, priority=priority, max_attempts=max_attempts,
                    retry=retry, timeout_s=limit)
        self._tasks[chosen] = task
        return task

    def periodic(self, *, cron: str, timezone: str = "UTC", catch_up: bool = False, name: str | None = None,
                 queue: str = DEFAULT_QUEUE, priority: int = 0, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 retry: Backoff | None = None, timeout_s: float | None = None,
                 ) -> Callable[[Callable[..., Any]], Task]:
        """Register a function ``f(ctx, tick)`` (as :meth:`task` takes) as a task deferred once per tick of
        the ``cron`` schedule in ``timezone`` (see :mod:`tenure.adapters.tasks.periodic`:
        ``tick`` is the ISO 8601 instant in UTC; ``catch_up``: after downtime, every
        missed tick of the last week, else only the latest). The other settings are
        :meth:`task`'s. A :meth:`scheduler` (every ``tenure worker --app`` runs one)
        defers the ticks."""
        checked_cron, zone = checked_schedule(cron, timezone)
        if type(catch_up) is not bool:
            raise refuse("catch_up", "bool_required", reason="invalid_periodic")

        def register(function: Callable[..., Any]) -> Task:
            if callable(function) and periodic_parameters_problem(
                    list(inspect.signature(function).parameters.values())):
                raise refuse("function", "tick_parameter_required", reason="invalid_periodic")
            if len(name if name is not None else default_name(function)) > MAX_PERIODIC_NAME_CHARS:
                raise refuse("name", "too_long_for_periodic", reason="invalid_periodic")
            task = self._register(function, name=name, queue=queue, priority=priority, max_attempts=max_attempts,
                                  retry=Backoff() if retry is None else retry, timeout_s=timeout_s)
            self._periodics.append(Periodic(task, checked_cron, zone, catch_up))
            return task

        return register

    # --- hooks ----------------------------------------------------------------------------

    def before_task(self, function: H) -> H:
        """Register ``f(ctx)``, run before each task's handler (see the module docstring)."""
        return self._hook("before_task", function)

    def after_task(self, function: H) -> H:
        """Register ``f(ctx, result, error)``, run once each task's handler ended."""
        return self._hook("after_task", function)

    def on_failure(self, function: H) -> H:
        """Register ``f(ctx, error)``, run when a task's handler raised."""
        return self._hook("on_failure", function)

    def on_worker_start(self, function: H) -> H:
        """Register ``f()``, run when a worker of this app starts."""
        return self._hook("on_worker_start", function)

    def on_worker_stop(self, function: H) -> H:
        """Register ``f()``, run when a worker of this app ends."""
        return self._hook("on_worker_stop", function)

    def _hook(self, kind: str, function: H) -> H:
        if not (inspect.isfunction(function) or inspect.ismethod(function)) \
                or inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
            raise refuse("function", "function_required", reason="invalid_hook")
        self._hooks[kind].append(function)
        return function

    def hooks(self, kind: str) -> list[Callable[..., Any]]:
        """The hooks of ``kind`` (one of :data:`HOOKS`), in registration order."""
        if kind not in self._hooks:
            raise refuse("kind", "unknown_hook", reason="invalid_hook")
        return list(self._hooks[kind])

    @property
    def periodics(self) -> list[Periodic]:
        """The periodic tasks, in registration order."""
        return list(self._periodics)

    def scheduler(self, *, now: Callable[[], dt.datetime] | None = None) -> Scheduler:
        """A scheduler deferring this app's periodic ticks (``now``: its clock)."""
        return Scheduler(self) if now is None else Scheduler(self, now=now)

    @property
    def tasks(self) -> Mapping[str, Task]:
        """The registered tasks by name (each deferring through this app)."""
        return {name: task.on(self) for name, task in self._tasks.items()}

    @property
    def queues(self) -> list[str]:
        """The queues of the registered tasks, in registration order."""
        return list(dict.fromkeys(task.queue for task in self._tasks.values()))

    def get(self, name: object) -> Task:
        """The task registered under ``name``; ``unknown_task`` otherwise."""
        task = self._tasks.get(name) if type(name) is str else None
        if task is None:
            raise ConfigValidationError("unknown_task", fields=("task_name",), problems=("not_registered",))
        return task.on(self)  # deferring through this app, on its database

    # --- deferring and reading ---------------------------------------------------------

    @property
    def source(self) -> TaskSource:
        """The task source this app submits and reads through (opened on first use)."""
        if self._source is None:
            self._source = TaskSource(self.db_url, self.config)
        return self._source

    async def defer(self, task_name: str, args: Mapping[str, Any] | None = None, **options: Any) -> str:
        """Defer the task registered as ``task_name`` with ``args`` (a mapping of its
        arguments) and :meth:`Task.defer`'s options."""
        task = self.get(task_name)
        if args is not None and not isinstance(args, Mapping):
            raise refuse("args", "json_object_required", reason="invalid_task_arguments")
        given = dict(args or {})
        if RESERVED_ARGUMENTS & set(given) or not set(options) <= RESERVED_ARGUMENTS:
            raise refuse("args", "reserved_argument_name", reason="invalid_task_arguments")
        return await task.defer(**options, **given)

    async def result(self, job_id: str, *, wait_s: float = 0.0) -> TaskOutcome | None:
        """Where the task stands, waiting up to ``wait_s`` seconds for it to finish (it
        answers as soon as it has; after the wait, whatever it is then). None when no
        task has this ID."""
        info = await poll_until(lambda: self.source.get_job(job_id),
                                lambda info: info is None or info.status in TERMINAL_STATUSES, wait_s)
        if info is None:
            return None
        assert isinstance(info.job, TaskJob)
        return TaskOutcome(job_id=info.job_id, task_name=info.job.task_name, status=info.status, result=info.result,
                           error=info.error, attempts=info.attempt, progress=info.progress)

    # --- running -----------------------------------------------------------------------

    def worker(self, *, queues: Sequence[str] | None = None, threads: int | None = None,
               **settings: Any) -> TaskWorker:
        """A fenced :class:`Worker` for this app's tasks on ``queues`` (default: every
        queue a registered task uses); ``threads`` (1..1000): the most plain ``def`` tasks
        it runs at once (default: its ``concurrency`` bounds them with the rest);
        ``settings`` are the Worker's (concurrency, batch_size, idle_wait_s,
        shutdown_grace_s, store_error_text, worker_id)."""
        served = self.queues if queues is None else queues
        if not served:
            raise refuse("queues", "no_tasks_registered", reason="invalid_worker")
        if threads is not None and (not bounds.is_strict_int(threads) or not 1 <= threads <= MAX_CONCURRENCY):
            raise refuse("threads", "integer_out_of_range", reason="invalid_worker")
        handler = self._dispatch if threads is None else functools.partial(
            self._dispatch, threads=asyncio.Semaphore(threads))
        return TaskWorker(self, self.source, handler, queues=served, **settings)

    async def _dispatch(self, claimed: ClaimedTask, context: JobContext, *,
                        threads: asyncio.Semaphore | None = None) -> Any:
        task = self._tasks.get(claimed.job.task_name)
        if task is None:
            raise UnknownTask()
        hooks = self._hooks
        args = claimed.job.args
        try:
            for hook in hooks["before_task"]:
                await _called(hook, context)  # one that raises fails the attempt; the handler never runs
            if task.sync:
                if threads is not None:
                    await threads.acquire()  # before the timeout starts: waiting for a thread is not the task's time
                call = self._started_thread(task, context, args, threads)
            else:
                call = task.function(context, **args)
            result = await (call if task.timeout_s is None else self._within_timeout(task, call, context))
        except BaseException as error:
            if _cancelled_by_the_worker():
                raise  # nothing is written for this attempt: no hook after it
            await _each_logged(hooks["on_failure"], "on_failure", context, error)
            await _each_logged(hooks["after_task"], "after_task", context, None, error)
            raise
        if not _cancelled_by_the_worker():  # a handler that swallowed the worker's cancellation
            await _each_logged(hooks["after_task"], "after_task", context, result, None)
        return result

    def _started_thread(self, task: Task, context: JobContext, args: Mapping[str, Any],
                        slot: asyncio.Semaphore | None) -> Awaitable[Any]:
        """Start a plain ``def`` task in a daemon thread of its own (with this task's
        context variables: a tracing span carries over), holding ``slot`` (a worker's
        ``threads`` bound, taken by the caller) until the thread itself ends; what to
        await for its return value or exception. Cancelled while the thread runs, that
        wait answers at once and leaves the thread running detached (see the module
        docstring)."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[tuple[bool, Any]] = loop.create_future()
        variables = contextvars.copy_context()

        def deliver(outcome: tuple[bool, Any]) -> None:
            if not answered.done():  # a cancelled wait discards what the thread answers
                answered.set_result(outcome)
            if slot is not None:
                slot.release()  # the thread has ended: only now may another start

        def run() -> None:
            try:
                value = variables.run(task.function, context, **args)
                if inspect.isawaitable(value):  # a def that hands back a coroutine is not a plain task
                    if inspect.iscoroutine(value):
                        value.close()
                    raise TypeError("a plain def task returned an awaitable: register an async def instead")
                outcome: tuple[bool, Any] = (True, value)
            except BaseException as error:  # noqa: BLE001 - handed to the event loop, raised there
                outcome = (False, error)
            try:
                loop.call_soon_threadsafe(deliver, outcome)
            except RuntimeError:
                pass  # the event loop closed meanwhile: nobody waits for this answer

        thread = threading.Thread(target=run, name=f"tenure-task-{context.job_id}", daemon=True)
        try:
            thread.start()
        except BaseException:
            if slot is not None:
                slot.release()
            raise

        async def answer() -> Any:
            try:
                ok, value = await answered
            except asyncio.CancelledError:
                if thread.is_alive():
                    self.abandoned += 1
                    log.error("job %s (task %s): a plain def task cannot be stopped; its thread runs on detached "
                              "and its outcome will be discarded", context.job_id, task.name,
                              extra={"job_id": context.job_id, "task": task.name, "outcome": "abandoned"})
                raise
            if ok:
                return value
            raise value

        return answer()

    async def _within_timeout(self, task: Task, call: Awaitable[Any], context: JobContext) -> Any:
        """``call`` (the handler), cancelled at the task's timeout, whose attempt then fails
        with :class:`TaskTimeout`: once the handler ended, or after
        :data:`TIMEOUT_GRACE_S` when it ignores its cancellation (then it is left running
        detached and its outcome discarded). The worker's own cancellation of this call
        (the lease lost, the worker stopping) reaches the handler as before."""
        async def carried() -> Any:
            try:
                return await call
            except (SystemExit, KeyboardInterrupt) as error:
                raise _Exited(error) from None

        running = asyncio.ensure_future(carried())
        try:
            await asyncio.wait({running}, timeout=task.timeout_s)
        except asyncio.CancelledError:
            await self._stopped(running, task, context)
            raise
        if not running.done():
            await self._stopped(running, task, context)
            if running.done() and not running.cancelled():
                log.warning("job %s (task %s): its handler ended after its timeout without letting its cancellation "
                            "through; its outcome is discarded", context.job_id, task.name,
                            extra={"job_id": context.job_id, "task": task.name, "outcome": "timeout"})
            raise TaskTimeout(task.timeout_s)  # type: ignore[arg-type]
        if running.cancelled():
            raise asyncio.CancelledError()  # the handler's own cancellation: a failure of its attempt
        error = running.exception()
        if isinstance(error, _Exited):
            raise error.raised
        return running.result()

    async def _stopped(self, running: asyncio.Task[Any], task: Task, context: JobContext) -> None:
        """Cancel the handler and give it :data:`TIMEOUT_GRACE_S` to end; one still running
        then (or when this wait is cancelled too) is left running detached. What an ended
        handler raised is retrieved here: its outcome is the caller's to decide."""
        running.cancel()
        try:
            await asyncio.wait({running}, timeout=TIMEOUT_GRACE_S)
        finally:
            if not running.done():
                self._detach(running, task, context)
            elif not running.cancelled():
                running.exception()  # retrieved (asyncio would otherwise report it as never retrieved)

    def _detach(self, running: asyncio.Task[Any], task: Task, context: JobContext) -> None:
        """Leave a handler that ignored its cancellation running, counted and logged; its
        end (whenever it comes) only forgets it."""
        self.abandoned += 1
        self._detached.add(running)
        running.add_done_callback(self._forget_detached)
        log.error("job %s (task %s): its handler ignored its cancellation for %g s; its attempt fails and the "
                  "handler is left running detached (its outcome will be discarded)", context.job_id, task.name,
                  TIMEOUT_GRACE_S, extra={"job_id": context.job_id, "task": task.name, "outcome": "abandoned"})

    def _forget_detached(self, running: asyncio.Task[Any]) -> None:
        self._detached.discard(running)
        if not running.cancelled():
            running.exception()  # retrieved: its outcome is discarded, never written or reported

    async def close(self) -> None:
        if self._sync.opened:
            await asyncio.to_thread(self._sync.close)
        for running in list(self._detached):
            running.cancel()  # asked once more; a handler that still ignores it ends with the loop
        if self._source is not None:
            await self._source.close()
            self._source = None

    async def __aenter__(self) -> TaskApp:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
