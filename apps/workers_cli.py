"""``tenure workers``: the workers that recorded themselves on a database.

    tenure workers [--db URL] [--json] [--all]

One line per worker, live ones first: its ID, whether it is ``live``, ``missing`` (not
seen for three of its reports' time: killed, frozen or cut off) or ``stopped``, its host
and PID, the queues it serves, how many task names its app registers, its concurrency,
its claims in flight and how long ago it last reported (by the database's clock).
Stopped workers are left out unless ``--all``. With ``--json``, one JSON array of
objects (``worker_id``, ``state``, ``host``, ``pid``, ``queues``, ``tasks``,
``concurrency``, ``in_flight``, ``last_seen_seconds_ago``). ``--db`` defaults to
``TENURE_DB``; the URL is never printed.

Exit status: 0; 2 refused (bad arguments, or a database ``tenure migrate`` never ran on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

__all__ = ["add_workers_parser", "run_workers", "WORKERS_HELP"]

WORKERS_HELP = "list the workers that recorded themselves: live, missing or stopped, with their claims in flight"


def add_workers_parser(commands: Any) -> None:
    workers = commands.add_parser("workers", help=WORKERS_HELP)
    workers.add_argument("--db", default=None, help="database URL (default: $TENURE_DB)")
    workers.set_defaults(database_required=True)
    workers.add_argument("--json", action="store_true", help="print one JSON array instead of one line per worker")
    workers.add_argument("--all", action="store_true", help="include workers that stopped")


def run_workers(arguments: argparse.Namespace) -> int:
    return asyncio.run(_run(arguments))


async def _run(arguments: argparse.Namespace) -> int:
    from tenure.adapters.queue.presence import Presence
    from tenure.adapters.queue.sources import TaskSource
    from tenure.model import WorkerConfig

    from .worker_cli import refused_unless_migrated

    source = TaskSource(arguments.db, WorkerConfig(arguments.db))
    try:
        found: list[Any] = []

        async def read() -> None:
            found.extend(await source.workers())

        refused = await refused_unless_migrated(read(), "tenure workers")
        if refused is not None:
            return refused
    finally:
        await source.close()
    shown = [view for view in found if arguments.all or view.presence is not Presence.STOPPED]
    if arguments.json:
        print(json.dumps([_as_json(view) for view in shown], indent=2))
        return 0
    if not shown:
        print("no workers recorded" + ("" if arguments.all else " (running or missing; --all lists stopped ones)"))
    for view in shown:
        print(worker_line(view))
    return 0


def worker_line(view: Any) -> str:
    """One worker, as ``tenure workers`` prints it."""
    return (f"{view.worker_id}: {view.presence.value}, host {view.host} pid {view.pid}, "
            f"queues {', '.join(view.queues) or '-'}, {len(view.tasks)} tasks, concurrency {view.concurrency}, "
            f"in flight {view.in_flight}, last seen {_ago(view.seen_ago_s)} ago")


def _ago(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {rest}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes}m"


def _as_json(view: Any) -> dict[str, Any]:
    return {"worker_id": view.worker_id, "state": view.presence.value, "host": view.host, "pid": view.pid,
            "queues": list(view.queues), "tasks": list(view.tasks), "concurrency": view.concurrency,
            "in_flight": view.in_flight, "last_seen_seconds_ago": round(view.seen_ago_s, 3)}
