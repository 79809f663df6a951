"""``tenure worker``: run a fenced :class:`~tenure.adapters.Worker`.

    tenure worker --db URL --app package.module:app [--queue emails --queue reports]
    tenure worker --db URL --queue validation --handler package.module:function

With ``--app`` (a :class:`~tenure.adapters.TaskApp`, or an :class:`~tenure.adapters.App`,
whose workflows it serves too, through a Run runtime on the app's own broker: startup
reconciliation, relays and a Run worker) the worker runs that app's tasks on
the task queues named by ``--queue`` (any number; default: every queue the app's tasks
use), against ``--db`` (default: the app's own database), which is then the only
database it uses: its claims, and the ticks its scheduler defers for the app's periodic
tasks (:meth:`TaskApp.on`). Otherwise it serves one of
pycharter's queues (``validation``, ``pipeline`` or ``streaming``) with ``--handler``.
The app or handler is imported by its path (``package.module:attribute``; the current
folder is importable). The worker logs through ``logging`` (stderr) and prints one status line
per ``--status-seconds`` on stdout. SIGTERM or SIGINT stops claiming and lets in-flight
handlers finish within ``--grace-seconds``; the rest are cancelled and their claims left
to expire. It never migrates: a database without the queue tables is refused.

Exit status: 0 after a clean shutdown; 2 for bad arguments, a handler that does not
import or is not async, or a database that is not migrated; 1 for any other database
failure at startup, or a shutdown in which a handler ignored its cancellation.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import signal
import sys
from collections.abc import Awaitable
from typing import Any

from tenure.model import ConfigValidationError, ErrorCode, TenureError, WorkerConfig
from tenure.model.validation import is_queue_name

from tenure.adapters.queue.sources import JobSource, PipelineJobSource, StreamingJobSource, ValidationJobSource
from tenure.adapters.queue import Worker, WorkerStats
from .logs import add_logging_options, configure_logging
from .metrics import add_metrics_options, start_metrics
from .reporting import report_refusal  # the one refusal format of every subcommand

__all__ = ["add_worker_parser", "run_worker", "load_handler", "status_line", "NEVER_MIGRATED", "refuse_never_migrated",
           "refused_unless_migrated", "SOURCES", "load_app", "import_problem"]

SOURCES: dict[str, type[JobSource[Any]]] = {
    "validation": ValidationJobSource,
    "pipeline": PipelineJobSource,
    "streaming": StreamingJobSource,
}

log = logging.getLogger("tenure.adapters.queue.worker")


def add_worker_parser(commands: Any) -> None:
    worker = commands.add_parser("worker", help="run a fenced worker (an app's tasks, or one pycharter queue) "
                                                "until SIGTERM or SIGINT")
    worker.add_argument("--db", help="database URL (already migrated: see `tenure migrate`); with --app, "
                                     "default: the app's own")
    worker.add_argument("--app", help="a TaskApp or App, as package.module:app: run its tasks (and an App's "
                                      "workflows)")
    worker.add_argument("--queue", action="append", default=[],
                        help="with --app: a task queue to serve (repeat for several; default: every queue of the "
                             "app's tasks); else one of " + ", ".join(sorted(SOURCES)))
    worker.add_argument("--handler", help="without --app: the async handler, as package.module:function")
    worker.add_argument("--concurrency", type=int, default=8, help="handlers in flight at most (default 8)")
    worker.add_argument("--batch", type=int, default=1, help="jobs claimed per claim call (default 1)")
    worker.add_argument("--processes", type=int,
                        help="run this many worker processes (1 to 64) under one supervisor that starts a dead one "
                             "again and passes SIGTERM on to all")
    worker.add_argument("--threads", type=int,
                        help="with --app: plain def tasks run at once at most, each in a thread (default: "
                             "--concurrency bounds them)")
    worker.add_argument("--lease-seconds", type=float,
                        help="claim lease (default: the app's setting with --app, else 300)")
    worker.add_argument("--heartbeat-seconds", type=float,
                        help="heartbeat interval (default: the app's setting with --app, else 60)")
    worker.add_argument("--idle-wait", type=float, default=5.0,
                        help="longest idle wait in seconds (SQLite: the polling bound; PostgreSQL: the "
                             "fallback poll behind LISTEN/NOTIFY; default 5)")
    worker.add_argument("--grace-seconds", type=float, default=30.0,
                        help="how long in-flight handlers may finish after SIGTERM (default 30)")
    worker.add_argument("--status-seconds", type=float, default=10.0, help="status line interval (default 10)")
    worker.add_argument("--worker-id", help="the owner recorded on claims (default: host, PID and a random suffix)")
    add_logging_options(worker)
    add_metrics_options(worker)


def load_handler(path: str) -> Any:
    """The object named by ``package.module:attribute`` (dots allowed after the colon)."""
    module_name, separator, attribute = path.partition(":")
    if not separator or not module_name or not attribute:
        raise ValueError("expected package.module:function")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def status_line(stats: WorkerStats, in_flight: int) -> str:
    return (f"claimed {stats.claimed}, completed {stats.completed}, failed {stats.failed}, "
            f"retried {stats.retried}, stale refused {stats.stale_writes_refused}, "
            f"cancelled {stats.cancelled}, lease losses {stats.lease_losses}, released {stats.released}, "
            f"in flight {in_flight}")


NEVER_MIGRATED = ("schema_missing", "database_missing")
"""The persistence reasons of a database that was never migrated: a refusal (exit 2), not a
failure, since no command but ``tenure migrate`` ever creates or migrates one."""


def refuse_never_migrated(reason: str, command: str) -> int:
    """Say that ``command`` needs ``tenure migrate`` first; the exit status 2."""
    print(f"refused: {reason}: run `tenure migrate --db URL` first ({command} never migrates)")
    return 2


async def refused_unless_migrated(probe: Awaitable[Any], command: str) -> int | None:
    """Await ``probe`` (a read that meets the tables): None when the database is
    migrated, else the refusal's exit status 2 once said; any other failure raises."""
    try:
        await probe
    except TenureError as error:
        if error.reason not in NEVER_MIGRATED:
            raise
        return refuse_never_migrated(error.reason, command)
    return None


def _refused(error: ConfigValidationError) -> int:
    report_refusal(error)
    return 2


async def _status(worker: Worker, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        print(status_line(worker.stats, worker.in_flight), flush=True)


def _mode_problem(arguments: argparse.Namespace) -> str | None:
    """Why the flags do not name one worker, or None."""
    if arguments.app is None and arguments.threads is not None:
        return "--threads bounds an --app's plain def tasks; a --handler is async"
    if arguments.app is not None:
        if arguments.handler is not None:
            return "--handler serves a pycharter queue; an --app's tasks need none"
        if not all(is_queue_name(name) for name in arguments.queue):
            return "--queue takes task queue names: identifiers of letters, digits and underscores (1 to 63)"
        return None
    if arguments.db is None:
        return "--db is required (or --app, whose database is the default)"
    if len(arguments.queue) != 1 or arguments.queue[0] not in SOURCES:
        return "without --app, give exactly one --queue: " + ", ".join(sorted(SOURCES))
    if arguments.handler is None:
        return "without --app, --handler is required (package.module:function)"
    return None


IMPORT_MESSAGE_BYTES = 300
"""How much of an import failure's message a refusal shows (cleaned of control characters)."""


def _failing_module(error: BaseException) -> str | None:
    """The module whose top-level code raised ``error`` (the innermost one in its
    traceback): the module that failed to import, which may be a dependency of the one
    named on the command line."""
    failing = None
    trace = error.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_name == "<module>":
            failing = trace.tb_frame.f_globals.get("__name__")
        trace = trace.tb_next
    return failing if isinstance(failing, str) else None


def import_problem(path: str, what: str) -> tuple[Any, str | None]:
    """The object at ``path`` (``package.module:attribute``) and None, or None and why it
    could not be had. The path itself is never in the answer (nothing printed echoes a
    rejected value): a module that does not exist, or lacks the attribute, is said so
    without its name. A module that raised while importing is named with the failure's
    type and message (the code's own words, bounded and cleaned, never a file's
    contents), and so is the dependency it failed to import: a handler whose module
    imports a missing package must not read as if the handler's own module were missing."""
    from tenure.adapters.core.text import clean_text

    module_name, separator, attribute = path.partition(":")
    if (not separator or not all(part.isidentifier() for part in module_name.split("."))
            or not all(part.isidentifier() for part in attribute.split("."))):
        # Also a relative module (.pkg), which import_module would name in its message.
        return None, f"the {what} must be given as package.module:attribute"
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            return None, f"the {what}'s module does not exist (ModuleNotFoundError)"
        # A dependency of the module: its name comes from the code, not from the command line.
        return None, f"the {what}'s module imports a module that is not installed ({missing!r})"
    except Exception as error:  # noqa: BLE001 - any import failure is a bad argument
        failing = _failing_module(error)
        message = clean_text(str(error), IMPORT_MESSAGE_BYTES, one_line=True)
        # A dependency is named; the module given, or a package of its path, never is.
        named = failing and failing != module_name and not module_name.startswith(failing + ".")
        where = f" while importing {failing!r}" if named else ""
        return None, (f"the {what}'s module failed to import{where}: {type(error).__name__}"
                      + (f": {message}" if message else ""))
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            return None, f"the {what}'s module has no attribute of that name"
        except Exception as error:  # noqa: BLE001 - a module __getattr__ that raises is a bad argument too
            return None, f"the {what}'s module failed to give that attribute ({type(error).__name__})"
    return target, None


def _imported(path: str, what: str) -> Any:
    """The object at ``path``, or None once the refusal is printed (see :func:`import_problem`)."""
    target, problem = import_problem(path, what)
    if problem is not None:
        print(f"refused: {problem}")
    return target


def _is_app(target: Any) -> bool:
    from tenure.adapters.app.front import App  # only a command that takes --app pays for it

    return isinstance(target, App)


def _workflows_of(target: Any) -> dict[str, Any]:
    """The workflows an ``--app`` registers (a TaskApp has none)."""
    return dict(target.workflows) if _is_app(target) else {}


def load_app(path: str) -> Any:
    """The TaskApp (or App) at ``path``, or None once the refusal is printed (see :func:`_imported`)."""
    from tenure.adapters.tasks.app import TaskApp  # only a command that takes --app pays for it

    app = _imported(path, "app")
    if app is not None and not isinstance(app, TaskApp):
        print("refused: --app must name a TaskApp (package.module:app)")
        return None
    return app


def supervise_workers(arguments: argparse.Namespace) -> int:
    """``tenure worker ... --processes N``: the same command line in N supervised worker
    processes (:mod:`tenure.apps.supervisor`), once the flags name a worker."""
    import asyncio

    from .supervisor import MAX_PROCESSES, child_command, supervise

    configure_logging(arguments.log_level, arguments.log_format)
    if not 1 <= arguments.processes <= MAX_PROCESSES:
        print(f"refused: --processes takes 1 to {MAX_PROCESSES}")
        return 2
    problem = _mode_problem(arguments)
    if problem is not None:
        print(f"refused: {problem}")
        return 2
    return asyncio.run(supervise(child_command(arguments.given), arguments.processes, arguments.grace_seconds))


async def run_worker(arguments: argparse.Namespace) -> int:
    from tenure.adapters.runs.runtime import ShutdownIncomplete, StartupDegraded  # raised by an App's Run runtime

    configure_logging(arguments.log_level, arguments.log_format)
    if sys.path[0] != "":
        sys.path.insert(0, "")  # the handler's package may live in the current folder
    problem = _mode_problem(arguments)
    if problem is not None:
        print(f"refused: {problem}")
        return 2
    if not (arguments.status_seconds > 0):
        print("refused: --status-seconds must be positive")
        return 2
    target = load_app(arguments.app) if arguments.app is not None else _imported(arguments.handler, "handler")
    if target is None:
        return 2
    settings = dict(worker_id=arguments.worker_id, concurrency=arguments.concurrency, batch_size=arguments.batch,
                    idle_wait_s=arguments.idle_wait, shutdown_grace_s=arguments.grace_seconds)
    if arguments.threads is not None:
        settings["threads"] = arguments.threads
    flows = _workflows_of(target) if arguments.app is not None else {}
    if arguments.app is not None and not target.tasks and not flows:
        print("refused: the app registers no tasks" + (" or workflows" if _is_app(target) else ""))
        return 2
    try:
        db_url = arguments.db if arguments.db is not None else target.db_url
        settings["metrics"] = start_metrics(arguments, db_url)  # /metrics and spans, when asked for
        given = {name: value for name, value in (("lease_seconds", arguments.lease_seconds),
                                                 ("heartbeat_seconds", arguments.heartbeat_seconds)) if value is not None}
        # An app's worker keeps the app's own settings (schema, timeouts, payload bound,
        # backoff), the flags given on the command line replacing theirs.
        settings_of_app = {} if arguments.app is None else {
            name: value for name, value in target.config.model_dump().items() if name != "db_url"}
        config = WorkerConfig(db_url, **{**settings_of_app, **given})
        if arguments.app is not None:
            app = target.on(db_url, config)
            source: JobSource[Any] = app.source
        else:
            source = SOURCES[arguments.queue[0]](db_url, config)
    except ConfigValidationError as error:
        return _refused(error)
    try:
        runtime: Any = None
        front: Any = None
        try:
            if arguments.app is not None and flows:
                # An App's workflows are served beside its tasks by its AppWorker: a Run
                # runtime (startup reconciliation, relays, one Run worker) on the app's own
                # broker, and the children relay that resumes parents whose child ended.
                front = app.worker(queues=arguments.queue or None, **settings)
                worker, runtime = front.tasks, front.runtime
            elif arguments.app is not None:
                worker = app.worker(queues=arguments.queue or None, **settings)
            else:
                worker = Worker(source, target, **settings)
        except ConfigValidationError as error:
            return _refused(error)
        try:
            await source.list_jobs(limit=1)  # the schema is there and readable
        except TenureError as error:
            if error.reason in NEVER_MIGRATED:
                return refuse_never_migrated(error.reason, "a worker")
            print(f"failed: {error.code.value}: {error.reason}")
            return 1
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        status = asyncio.create_task(_status(worker, arguments.status_seconds)) if worker is not None else None
        if worker is not None:
            serving = (f"the {arguments.queue[0]} queue" if worker.queues is None
                       else "task queues " + ", ".join(worker.queues))
            print(f"worker on {serving}: concurrency {worker.concurrency}, batch {worker.batch_size}", flush=True)
        if runtime is not None:
            print(f"workflows {', '.join(sorted(flows))} on Run queues {', '.join(app.workflow_queues)}: "
                  f"node {runtime.node}", flush=True)
        # An app's periodic tasks are deferred by a scheduler beside the worker (every
        # worker runs one: each tick is deferred once however many do).
        scheduler = (asyncio.create_task(app.scheduler().run(stop))
                     if arguments.app is not None and app.periodics else None)
        try:
            if front is not None:
                await front.run(stop)  # the whole AppWorker: its runtime, children relay and tasks
                stats = front.stats or WorkerStats()
            elif worker is not None:
                stats = await worker.run(stop)
            else:
                await stop.wait()
                stats = WorkerStats()
        except TenureError as error:
            if error.code is not ErrorCode.WORKER_SHUTDOWN_INCOMPLETE:
                raise
            print(f"failed: {error.code.value}: {error.reason}")
            return 1
        except (StartupDegraded, ShutdownIncomplete) as error:  # the Run runtime's (see RunRuntime)
            print(f"failed: {type(error).__name__}: {error}")
            return 1
        finally:
            stop.set()
            if scheduler is not None:
                await asyncio.gather(scheduler, return_exceptions=True)
            if status is not None:
                status.cancel()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
        print("stopped: " + status_line(stats, worker.in_flight if worker is not None else 0), flush=True)
        return 0
    finally:
        await source.close()
