"""``tenure jobs``: look at and operate on the jobs of the owned queues.

    tenure jobs list   --db URL --queue validation|pipeline|streaming [--status S] [--older-than AGE]
                       [--limit N] [--json]
    tenure jobs show   --db URL --queue Q JOB_ID [--show-args] [--json]
    tenure jobs retry  --db URL --queue validation|pipeline JOB_ID
    tenure jobs cancel --db URL --queue Q JOB_ID
    tenure jobs purge  --db URL --queue Q --older-than AGE

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
that finished longer ago than ``AGE``, a bounded batch per transaction, with progress on
stderr; owned submissions are never purged (a replay of their submission ID must keep
finding them). ``AGE`` is a number with a unit: ``90s``, ``15m``, ``12h``, ``7d``.

Output is a plain table, or JSON with ``--json`` (one document on stdout). Exit status:
0 on success; 2 for bad arguments, a job that does not exist, a retry or cancel that
changed nothing, or a database that was never migrated (checked before anything is written); 1
for a database failure.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
import sys
from typing import Any

from tenure.model import ConfigValidationError, JobInfo, JobStatus, QueueKind, canonical_json

from ..queue import JobSource
from ..queue.operations import PURGE_LIMIT
from ..queue.worker import MAX_ERROR_BYTES, error_text
from .runs_cli import run_table
from .worker_cli import SOURCES, refused_unless_migrated

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
    jobs = commands.add_parser("jobs", help="look at and operate on the jobs of the owned queues")
    actions = jobs.add_subparsers(dest="action", required=True)

    def with_queue(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument("--db", required=True, help="database URL (already migrated: see `tenure migrate`)")
        parser.add_argument("--queue", required=True, choices=sorted(SOURCES), help="the queue")
        return parser

    listing = with_queue(actions.add_parser("list", help="list jobs, oldest first"))
    listing.add_argument("--status", choices=[status.value for status in JobStatus])
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


def _printable(error: str | None) -> str | None:
    """A stored error as it may reach a terminal: another client may have stored control
    characters (escape sequences), which are replaced as the worker replaces them."""
    return None if error is None else error_text(error, MAX_ERROR_BYTES)


def _when(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _document(info: JobInfo, *, with_args: bool) -> dict[str, Any]:
    """What ``--json`` prints of a job: its state, the result only as a size, the envelope
    only when asked."""
    document: dict[str, Any] = {
        "queue": info.queue.value, "job_id": info.job_id, "run_id": info.run_id, "status": info.status.value,
        "attempt": info.attempt, "max_attempts": info.max_attempts, "generation": info.generation,
        "owner_id": info.owner_id, "protected": info.protected, "submission_id": info.submission_id,
        "fires_at": _when(info.fires_at), "created_at": _when(info.created_at), "claimed_at": _when(info.claimed_at),
        "lease_expires_at": _when(info.lease_expires_at), "completed_at": _when(info.completed_at),
        "cancel_requested": info.cancel_requested, "pid": info.pid, "error": _printable(info.error),
        "result_bytes": None if info.result is None else len(canonical_json(info.result).encode()),
        "dlq_record_id": info.dlq_record_id,
    }
    if with_args:
        document["job"] = info.job.model_dump(mode="json")
    return document


async def _list(source: JobSource[Any], arguments: argparse.Namespace) -> int:
    status = None if arguments.status is None else JobStatus(arguments.status)
    age = None if arguments.older_than is None else parse_age(arguments.older_than)
    jobs = await source.list_jobs(status=status, limit=arguments.limit)
    if age is not None:
        # Oldest first: the jobs left out of a full page are newer than every one in it.
        cutoff = dt.datetime.now(dt.timezone.utc) - age
        jobs = [info for info in jobs if info.created_at < cutoff]
    if arguments.json:
        print(json.dumps([_document(info, with_args=False) for info in jobs], indent=2))
        return 0
    rows = [[info.job_id, info.status.value, f"{info.attempt}/{info.max_attempts}", info.generation,
             "owned" if info.protected else "legacy", info.owner_id, info.created_at.strftime("%Y-%m-%d %H:%M:%S"),
             (_printable(info.error) or "").splitlines()[0][:60] if info.error else None]
            for info in jobs]
    print(run_table(["job", "status", "attempts", "generation", "kind", "owner", "created", "error"], rows))
    if len(jobs) == arguments.limit:
        print(f"(more may follow: raise --limit above {arguments.limit})")
    return 0


async def _show(source: JobSource[Any], arguments: argparse.Namespace) -> int:
    info = await source.get_job(arguments.job_id)
    if info is None:
        print("no such job")
        return 2
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
        batch = await source.purge_finished(age)
        deleted += batch
        print(f"purged {deleted} so far", file=sys.stderr, flush=True)
        if batch < PURGE_LIMIT:
            break
    print(run_table(["queue", "purged", "older than"], [[source.queue.value, deleted, arguments.older_than]]))
    return 0


ACTIONS = {"list": _list, "show": _show, "retry": _retry, "cancel": _cancel, "purge": _purge}


async def _run(arguments: argparse.Namespace) -> int:
    # Every argument is checked before the database is touched.
    if getattr(arguments, "older_than", None) is not None:
        parse_age(arguments.older_than)
    limit = getattr(arguments, "limit", None)
    if limit is not None and not 1 <= limit <= 10_000:
        raise ConfigValidationError("invalid_arguments", fields=("limit",), problems=("integer_out_of_range",))
    if arguments.action == "retry" and arguments.queue == QueueKind.STREAMING.value:
        raise ConfigValidationError("invalid_arguments", fields=("queue",), problems=("validation_or_pipeline_required",))
    async with SOURCES[arguments.queue](arguments.db) as source:
        refused = await refused_unless_migrated(source.get_job(_PROBE_JOB_ID), "tenure jobs")
        return refused if refused is not None else await ACTIONS[arguments.action](source, arguments)


def run_jobs(arguments: argparse.Namespace) -> int:
    return asyncio.run(_run(arguments))
