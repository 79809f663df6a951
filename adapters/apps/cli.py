"""The ``tenure`` command: ``tenure demo``, ``tenure migrate``, ``tenure worker``, ``tenure
jobs``, ``tenure runs`` and ``tenure --version``.

``tenure demo`` runs the owned queue under stress on an embedded SQLite file (or
``--db URL``) and exits non-zero if any invariant broke. ``tenure migrate --db URL``
applies and qualifies the owned migration and summarizes its admission checks
(``--verbose`` lists each).

Every subcommand runs through :func:`run_command`, so every one answers alike: a refused
request or configuration (``ConfigValidationError``) exits 2 and names each field and its
problem; a database failure (any other ``TenureError``) exits 1 with its reason and what
to do next. Neither ever prints a URL, an ID, a token or a payload. Arguments the parser
rejects are refused the same way (``refused: invalid_arguments``) by
:class:`CommandParser`, which names the option and what it takes but never the value.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import sys
import tempfile
from collections.abc import Callable, Sequence

from ..core.migrations import downgrade, upgrade
from .demo import DemoSettings, check_demo_settings, run_demo
from .health_cli import add_health_parser, run_health
from .jobs_cli import add_jobs_parser, run_jobs
from .reporting import ArgumentsRefused, CommandParser, report_failure, report_refusal, run_command
from .runs_cli import add_runs_parser, run_runs
from .worker_cli import add_worker_parser, run_worker

__all__ = ["main", "run_command", "report_refusal", "report_failure", "CommandParser", "ArgumentsRefused"]


def _version() -> str:
    try:
        return importlib.metadata.version("tenure")
    except importlib.metadata.PackageNotFoundError:  # run from a tree that was never installed
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="tenure", description="Durable work with a provable owner.")
    parser.add_argument("--version", action="version", version=f"tenure {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the owned queue under stress and check every invariant")
    demo.add_argument("--db", help="URL of a database without jobs (default: a new SQLite file in a temporary folder, "
                      "removed at the end)")
    demo.add_argument("--jobs", type=int, default=3000, help="jobs to submit across the three queues (10 to 10000)")
    demo.add_argument("--workers", type=int, default=8, help="concurrent workers per queue (1 to 64)")
    demo.add_argument("--lease-seconds", type=float, default=1.0, help="claim lease (0.1 to 10)")
    demo.add_argument("--seed", type=int, default=7, help="seed of the workers' choices")
    migrate = commands.add_parser("migrate", help="apply and qualify the owned migration")
    migrate.add_argument("--db", required=True, help="database URL")
    migrate.add_argument("--schema", help="PostgreSQL: the schema of the queue tables (pycharter's: pycharter)")
    migrate.add_argument("--downgrade", action="store_true", help="remove the owned migration instead")
    migrate.add_argument("--sql", action="store_true",
                         help="print the statements the migration runs, then roll back (changes nothing)")
    migrate.add_argument("--verbose", action="store_true", help="list every admission check")
    add_worker_parser(commands)
    add_jobs_parser(commands)
    add_runs_parser(commands)
    add_health_parser(commands)
    return parser


def _migrate(arguments: argparse.Namespace) -> int:
    run = downgrade if arguments.downgrade else upgrade
    report = asyncio.run(run(arguments.db, schema=arguments.schema, dry_run=arguments.sql))
    if arguments.sql:
        for statement in report.statements:
            print(statement.rstrip() + ";")
        print(f"-- {report.summary()}")
        return 0
    print("\n".join(report.lines(verbose=arguments.verbose)))
    return 0


def _demo(arguments: argparse.Namespace) -> int:
    # Every setting is checked before a folder or a database exists.
    check_demo_settings(jobs=arguments.jobs, workers=arguments.workers, lease_seconds=arguments.lease_seconds,
                        seed=arguments.seed, db_url=arguments.db)

    def settings(db_url: str) -> DemoSettings:
        return DemoSettings(db_url=db_url, jobs=arguments.jobs, workers=arguments.workers,
                            lease_seconds=arguments.lease_seconds, seed=arguments.seed)

    if arguments.db is not None:
        return asyncio.run(run_demo(settings(arguments.db)))
    with tempfile.TemporaryDirectory(prefix="tenure-demo-", ignore_cleanup_errors=True) as folder:
        print("database: a new SQLite file in a temporary folder, removed at the end (--db names one to keep)")
        return asyncio.run(run_demo(settings(f"sqlite:///{folder}/demo.sqlite3")))


def _worker(arguments: argparse.Namespace) -> int:
    return asyncio.run(run_worker(arguments))


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _demo, "migrate": _migrate, "worker": _worker, "jobs": run_jobs, "runs": run_runs, "health": run_health,
}
"""Each subcommand's body; :func:`main` runs it through :func:`run_command`."""


def main(argv: Sequence[str] | None = None) -> int:
    def parsed_and_run() -> int:
        # Parsed inside run_command: rejected arguments are a refusal like any other.
        arguments = _parser().parse_args(argv)
        return COMMANDS[arguments.command](arguments)

    return run_command(parsed_and_run)


if __name__ == "__main__":
    sys.exit(main())
