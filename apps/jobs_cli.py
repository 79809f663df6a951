"""``tenure jobs``: look at and operate on tasks and the jobs of pycharter's queues.

    tenure jobs list   --db URL [--queue tasks|validation|pipeline|streaming] [--status S]
                       [--task-queue Q] [--task NAME] [--older-than AGE] [--limit N] [--json]
    tenure jobs show   --db URL [--queue Q] JOB_ID [--show-args] [--json]
    tenure jobs retry  --db URL [--queue tasks|validation|pipeline] JOB_ID
    tenure jobs cancel --db URL [--queue Q] JOB_ID
    tenure jobs purge  --db URL [--queue Q] --older-than AGE [--status completed|failed|cancelled]
    tenure jobs defer  --app package.module:app TASK [--args JSON | --args-file F]
                       [--submission-id S] [--schedule-in SECONDS] [--priority N] [--db URL]

``--queue`` picks the table: ``tasks`` (the default: ``tenure_tasks``, every task queue)
or one of pycharter's queues; ``--task-queue`` and ``--task`` narrow a task listing.
``defer`` enqueues a task of an app by its registered name (its arguments a JSON object,
checked against the task's parameters before anything is written).

``list`` prints the jobs oldest first (``--older-than``: only jobs created longer ago
than ``AGE`` by this machine's clock, unlike ``purge``, whose cutoff is the database's); ``show`` one job's state: attempts, fence generation, owner, times, error
and the size of its result, never its claim token; its envelope (what it was submitted
with) only with ``--show-args``, since it may carry data. ``retry`` sends a failed validation or
pipeline job back to pending at once with a fresh attempt budget (its ID, submission
identity and last error kept; a completed or cancelled job's outcome stands; a failed
streaming launch is rerun by a forced submission instead). ``cancel`` is the queue's
administrative cancel: a pending or claimed validation or pipeline job ends cancelled (a
live claim's next fenced write is refused); a streaming launch gets a cancel request its
launcher acknowledges. ``purge`` deletes finished (completed, failed, cancelled) jobs
that finished longer ago than ``AGE`` (``--status``: of that status only), a bounded
batch per transaction, with progress on stderr; owned submissions are never purged (a replay of their submission ID must keep
finding them). ``AGE`` is a number with a unit: ``90s``, ``15m``, ``12h``, ``7d``.

Output is a plain table, or JSON with ``--json`` (one document on stdout). Exit status:
0 on success; 2 for bad arguments, a job that does not exist, a retry or cancel that
changed nothing, a ``defer`` whose ``--submission-id`` already names another request
(a conflict: nothing written; the original request answers its job, a new ID makes a
new task), or a database that was never migrated (checked before anything is written); 1
for a database failure.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import enum
import json
import re
import sys
from typing import Any

from tenure.model import (
    ConfigValidationError,
    JobInfo,
    JobStatus,
    QueueKind,
    TaskJob,
    canonical_json,
    load_json,
)
from tenure.model.validation import is_queue_name, micros_to_datetime

from tenure.adapters.core.tables import Unreadable
from tenure.adapters.queue import JobSource
from tenure.adapters.queue.operations import PURGE_LIMIT
from tenure.adapters.queue.sources import TaskSource
from tenure.adapters.core.text import clean_text
from .runs_cli import run_table
from .worker_cli import SOURCES, load_app, refused_unless_migrated

TABLES: dict[str, type[JobSource[Any]]] = {"tasks": TaskSource, **SOURCES}
"""What ``--queue`` picks: the task table, or one of pycharter's queues."""

MAX_ARGS_FILE_BYTES = 16 * 1024 * 1024

__all__ = ["add_jobs_parser", "run_jobs", "parse_age"]

_PROBE_JOB_ID = "00000000-0000-0000-0000-000000000000"

_AGE = re.compile(r"([0-9]{1,7})([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
MAX_AGE = dt.timedelta(days=36_500)


def parse_age(text: str, field: str = "older_than") -> dt.timedelta:
    """``90s``, ``15m``, ``12h`` or ``7d`` as a timedelta (at most 100 years)."""
    found = _AGE.fullmatch(text.strip()) if type(text) is str else None
    if found is None:
        raise ConfigValidationError("invalid_arguments", fields=(field,), problems=("age_with_unit_s_m_h_or_d_required",))
    age = dt.timedelta(seconds=int(found[1]) * _UNIT_SECONDS[found[2]])
    if age > MAX_AGE:
        raise ConfigValidationError("invalid_arguments", fields=(field,), problems=("age_out_of_range",))
    return age


def add_jobs_parser(commands: Any) -> None:
    jobs = commands.add_parser("jobs", help="look at and operate on tasks and the jobs of pycharter's queues")
    actions = jobs.add_subparsers(dest="action", required=True)

    def with_queue(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument("--db", help="database URL (already migrated: see `tenure migrate`; "
                                          "default: $TENURE_DB)")
        parser.set_defaults(database_required=True)
        parser.add_argument("--queue", default="tasks", choices=sorted(TABLES),
                            help="tasks (default: every task queue) or one of pycharter's queues")
        return parser

    listing = with_queue(actions.add_parser("list", help="list jobs, oldest first"))
    listing.add_argument("--status", type=str.lower, choices=[status.value for status in JobStatus],
                         help="only jobs of this status (any letter case)")
    listing.add_argument("--task-queue", help="tasks: only this task queue")
    listing.add_argument("--task", help="tasks: only tasks of this name")
    listing.add_argument("--older-than", help="only jobs created longer ago than this (90s, 15m, 12h, 7d)")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (1 to 10000, default 50)")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")

    show = with_queue(actions.add_parser("show", help="one job's state"))
    show.add_argument("job_id")
    show.add_argument("--show-args", action="store_true",
                      help="also print what the job was submitted with (never printed otherwise: it may carry data)")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")

    retry = with_queue(actions.add_parser("retry", help="send a failed job back to pending with a fresh budget"))
    retry.add_argument("job_id")

    cancel = with_queue(actions.add_parser("cancel", help="cancel a pending or claimed job (streaming: request it)"))
    cancel.add_argument("job_id")

    purge = with_queue(actions.add_parser("purge", help="delete finished jobs that finished longer ago than an age"))
    purge.add_argument("--older-than", required=True, help="finished longer ago than this (90s, 15m, 12h, 7d)")
    purge.add_argument("--status", type=str.lower, choices=[JobStatus.COMPLETED.value, JobStatus.FAILED.value,
                                            JobStatus.CANCELLED.value], help="only jobs that finished so")

    defer = actions.add_parser("defer", help="enqueue a task of an app by its name")
    defer.add_argument("--app", required=True, help="the TaskApp, as package.module:app")
    defer.add_argument("task_name", help="the task's registered name")
    given = defer.add_mutually_exclusive_group()
    given.add_argument("--args", help="the arguments, a JSON object (default {})")
    given.add_argument("--args-file", help="a file holding the arguments (- reads stdin)")
    defer.add_argument("--submission-id", help="makes the deferral replay-safe: the same call answers the same job")
    defer.add_argument("--schedule-in", type=float, help="due this many seconds after it is written")
    defer.add_argument("--priority", type=int, help="0 to 100 (default: the task's)")
    defer.add_argument("--db", help="database URL (default: $TENURE_DB, else the app's own)")


def _kind(info: JobInfo, tasks: bool) -> str:
    """An owned submission (replay-safe under its submission ID), or not."""
    if tasks:
        return "replay-safe" if info.protected else "plain"
    return "owned" if info.protected else "legacy"


def _task_columns(info: JobInfo) -> list[Any]:
    job = info.job
    assert isinstance(job, TaskJob)
    return [job.queue_name, job.task_name, job.priority]


def _when(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


CORRUPT = "corrupt_row"
"""The status a listing shows for a row tenure cannot read."""

_CORRUPT_NOTE = "the stored row holds values tenure cannot read (written outside tenure)"


def _stored(entry: Unreadable, field: str) -> Any:
    """A field of a row tenure cannot read, as ``--json`` prints it (None: unreadable)."""
    value = entry.fields.get(field)
    if isinstance(value, enum.Enum):
        return value.value
    if field.endswith("_at_us"):
        return _when(micros_to_datetime(value)) if type(value) is int else None
    if type(value) is str:
        return clean_text(value)
    return value if value is None or type(value) in (int, bool) else None


def _corrupt_document(queue: QueueKind, entry: Unreadable) -> dict[str, Any]:
    """What ``--json`` prints of a row tenure cannot read: its ID, ``status``
    ``corrupt_row``, and each state field that could be read (None where not; never its
    envelope or result)."""
    names = {"run_id": "run_id", "attempts": "attempt", "max_attempts": "max_attempts", "generation": "generation",
             "owner_id": "owner_id", "fence_required": "protected", "submission_id": "submission_id",
             "fires_at_us": "fires_at", "created_at_us": "created_at", "claimed_at_us": "claimed_at",
             "lease_expires_at_us": "lease_expires_at", "completed_at_us": "completed_at",
             "error_message": "error", "dlq_record_id": "dlq_record_id"}
    document: dict[str, Any] = {"queue": queue.value, "job_id": entry.shown_key, "status": CORRUPT, "corrupt_row": True,
                                "stored_status": _stored(entry, "status")}
    document.update((name, _stored(entry, field)) for field, name in names.items())
    if queue is QueueKind.TASK:
        document.update(task_queue=_stored(entry, "queue_name"), task=_stored(entry, "task_name"),
                        priority=_stored(entry, "priority"))
    return document


def _document(info: JobInfo, *, with_args: bool) -> dict[str, Any]:
    """What ``--json`` prints of a job: its state, the result only as a size, the envelope
    only when asked."""
    document: dict[str, Any] = {
        "queue": info.queue.value, "job_id": info.job_id, "run_id": info.run_id, "status": info.status.value,
        "attempt": info.attempt, "max_attempts": info.max_attempts, "generation": info.generation,
        "owner_id": info.owner_id, "protected": info.protected, "submission_id": info.submission_id,
        "fires_at": _when(info.fires_at), "created_at": _when(info.created_at), "claimed_at": _when(info.claimed_at),
        "lease_expires_at": _when(info.lease_expires_at), "completed_at": _when(info.completed_at),
        "cancel_requested": info.cancel_requested, "pid": info.pid, "error": clean_text(info.error),
        "result_bytes": None if info.result is None else len(canonical_json(info.result).encode()),
        "dlq_record_id": info.dlq_record_id, "corrupt_row": False,
    }
    if isinstance(info.job, TaskJob):
        document.update(task_queue=info.job.queue_name, task=info.job.task_name, priority=info.job.priority,
                        progress=info.progress)
    if with_args:
        document["job"] = info.job.model_dump(mode="json")
    return document


def _created_before(entry: JobInfo | Unreadable, cutoff: dt.datetime) -> bool:
    if isinstance(entry, JobInfo):
        return entry.created_at < cutoff
    created = entry.fields.get("created_at_us")
    return type(created) is not int or micros_to_datetime(created) < cutoff


def _line(entry: JobInfo | Unreadable, tasks: bool) -> list[Any]:
    """One job's line of the table (a row tenure cannot read: what could be read of it)."""
    if isinstance(entry, JobInfo):
        return [entry.job_id, *(_task_columns(entry) if tasks else []), entry.status.value,
                f"{entry.attempt}/{entry.max_attempts}", entry.generation,
                _kind(entry, tasks), entry.owner_id, entry.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                (clean_text(entry.error) or "").splitlines()[0][:60] if entry.error else None]
    document = _corrupt_document(QueueKind.TASK if tasks else QueueKind.VALIDATION, entry)
    created = document["created_at"]
    return [document["job_id"], *([document["task_queue"], document["task"], document["priority"]] if tasks else []),
            CORRUPT, f"{document['attempt']}/{document['max_attempts']}", document["generation"], None,
            document["owner_id"], None if created is None else created[:19].replace("T", " "), _CORRUPT_NOTE[:60]]


async def _list(source: JobSource[Any], arguments: argparse.Namespace) -> int:
    status = None if arguments.status is None else JobStatus(arguments.status)
    age = None if arguments.older_than is None else parse_age(arguments.older_than)
    # Entries: a row tenure cannot read (written outside tenure) is listed as corrupt_row
    # in its place, with what could be read of it, and hides no other.
    jobs: list[JobInfo | Unreadable]
    if isinstance(source, TaskSource):
        jobs = await source.list_entries(status=status, limit=arguments.limit, queue_name=arguments.task_queue,
                                         task_name=arguments.task)
    else:
        jobs = await source.list_entries(status=status, limit=arguments.limit)
    listed = len(jobs)
    if age is not None:
        # Oldest first: the jobs left out of a full page are newer than every one in it.
        cutoff = dt.datetime.now(dt.timezone.utc) - age
        jobs = [entry for entry in jobs if _created_before(entry, cutoff)]
    if arguments.json:
        print(json.dumps([_document(entry, with_args=False) if isinstance(entry, JobInfo)
                          else _corrupt_document(source.queue, entry) for entry in jobs], indent=2))
        return 0
    tasks = isinstance(source, TaskSource)
    print(run_table(["job", *(["queue", "task", "priority"] if tasks else []), "status", "attempts", "generation",
                     "kind", "owner", "created", "error"], [_line(entry, tasks) for entry in jobs]))
    if listed == arguments.limit:
        print(f"(more may follow: raise --limit above {arguments.limit})")
    return 0


async def _show(source: JobSource[Any], arguments: argparse.Namespace) -> int:
    info = await source.get_entry(arguments.job_id)
    if info is None:
        print("no such job")
        return 2
    if isinstance(info, Unreadable):
        # Shown all the same: what could be read, and why the rest cannot (never an envelope).
        document = _corrupt_document(source.queue, info)
        if arguments.json:
            print(json.dumps(document, indent=2))
            return 0
        print(run_table(["job", document.pop("job_id")], [[name, value] for name, value in document.items()]))
        print(f"note: {_CORRUPT_NOTE}; claims set such a job aside (specs/queue.md, 'Rows tenure cannot read')")
        return 0
    if arguments.json:
        print(json.dumps(_document(info, with_args=arguments.show_args), indent=2))
        return 0
    document = _document(info, with_args=False)
    document["result"] = (None if document.pop("result_bytes") is None else
                          f"{len(canonical_json(info.result).encode())} bytes of JSON")
    print(run_table(["job", info.job_id], [[name, value] for name, value in document.items() if name != "job_id"]))
    if arguments.show_args:
        print(json.dumps(info.job.model_dump(mode="json"), indent=2))
    return 0


async def _retry(source: JobSource[Any], arguments: argparse.Namespace) -> int:
    if not await source.retry_failed(arguments.job_id):  # type: ignore[attr-defined]
        print("not retried: the job does not exist or did not fail")
        return 2
    info = await source.get_job(arguments.job_id)
    if info is None:  # deleted or purged since
        print("no such job")
        return 2
    print(run_table(["job", "state", "attempts"], [[info.job_id, info.status.value, f"{info.attempt}/{info.max_attempts}"]]))
    return 0


async def _cancel(source: JobSource[Any], arguments: argparse.Namespace) -> int:
    changed = await source.cancel(arguments.job_id)  # type: ignore[attr-defined]
    info = await source.get_job(arguments.job_id)
    if not changed or info is None:
        print("not cancelled: the job does not exist or already finished")
        return 2
    state = "cancel requested (its launcher acknowledges)" if info.status is JobStatus.CLAIMED else info.status.value
    print(run_table(["job", "state"], [[info.job_id, state]]))
    return 0


async def _purge(source: JobSource[Any], arguments: argparse.Namespace) -> int:
    age = parse_age(arguments.older_than)
    deleted = 0
    while True:
        batch = await source.purge_finished(age, status=None if arguments.status is None else JobStatus(arguments.status))
        deleted += batch
        print(f"purged {deleted} so far", file=sys.stderr, flush=True)
        if batch < PURGE_LIMIT:
            break
    print(run_table(["queue", "purged", "older than"], [[source.queue.value, deleted, arguments.older_than]]))
    return 0


ACTIONS = {"list": _list, "show": _show, "retry": _retry, "cancel": _cancel, "purge": _purge}


def _arguments_of(arguments: argparse.Namespace) -> Any:
    """The ``defer`` arguments as given (a JSON object), or the refusal."""
    if arguments.args_file is not None:
        try:
            if arguments.args_file == "-":
                text = sys.stdin.read(MAX_ARGS_FILE_BYTES + 1)
            else:
                with open(arguments.args_file, encoding="utf-8") as handle:
                    text = handle.read(MAX_ARGS_FILE_BYTES + 1)
        except (OSError, UnicodeDecodeError):
            raise ConfigValidationError("invalid_arguments", fields=("args_file",), problems=("unreadable",)) from None
        field = "args_file"
    else:
        text, field = ("{}" if arguments.args is None else arguments.args), "args"
    try:
        value = load_json(text) if len(text) <= MAX_ARGS_FILE_BYTES else None
    except ValueError:
        value = None
    if type(value) is not dict:
        raise ConfigValidationError("invalid_arguments", fields=(field,), problems=("json_object_required",))
    return value


async def _defer(arguments: argparse.Namespace) -> int:
    given = _arguments_of(arguments)
    if sys.path[0] != "":
        sys.path.insert(0, "")  # the app's package may live in the current folder
    app = load_app(arguments.app)
    if app is None:
        return 2
    if arguments.task_name not in app.tasks:
        # Registered names come from the app's code; the name asked for is not echoed.
        print("refused: the app registers no task of that name; it registers: " + ", ".join(sorted(app.tasks)))
        return 2
    options: dict[str, Any] = {name: value for name, value in (
        ("submission_id", arguments.submission_id), ("schedule_in", arguments.schedule_in),
        ("priority", arguments.priority)) if value is not None}
    async with app.on(arguments.db if arguments.db is not None else app.db_url) as bound:
        refused = await refused_unless_migrated(bound.source.get_job(_PROBE_JOB_ID), "tenure jobs")
        if refused is not None:
            return refused
        # A conflict (the submission ID names another request) is reported by run_command
        # as a refused request, exit 2.
        job_id = await bound.get(arguments.task_name).defer(**options, **given)
    print(run_table(["job", "task", "state"], [[job_id, arguments.task_name, "deferred"]]))
    return 0


async def _run(arguments: argparse.Namespace) -> int:
    if arguments.action == "defer":
        return await _defer(arguments)
    # Every argument is checked before the database is touched.
    if getattr(arguments, "older_than", None) is not None:
        parse_age(arguments.older_than)
    limit = getattr(arguments, "limit", None)
    if limit is not None and not 1 <= limit <= 10_000:
        raise ConfigValidationError("invalid_arguments", fields=("limit",), problems=("integer_out_of_range",))
    if arguments.action == "retry" and arguments.queue == QueueKind.STREAMING.value:
        raise ConfigValidationError("invalid_arguments", fields=("queue",), problems=("tasks_validation_or_pipeline_required",))
    if arguments.action == "list" and arguments.queue != "tasks" and (arguments.task_queue or arguments.task):
        raise ConfigValidationError("invalid_arguments", fields=("queue",), problems=("task_filters_need_tasks",))
    if getattr(arguments, "task_queue", None) is not None and not is_queue_name(arguments.task_queue):
        raise ConfigValidationError("invalid_arguments", fields=("task_queue",), problems=("identifier_required",))
    async with TABLES[arguments.queue](arguments.db) as source:
        refused = await refused_unless_migrated(source.get_job(_PROBE_JOB_ID), "tenure jobs")
        return refused if refused is not None else await ACTIONS[arguments.action](source, arguments)


def run_jobs(arguments: argparse.Namespace) -> int:
    return asyncio.run(_run(arguments))
