"""The ``tenure`` command: ``tenure demo``, ``tenure migrate``, ``tenure worker``, ``tenure
jobs``, ``tenure runs``, ``tenure health``, ``tenure workers``, ``tenure console``, ``tenure conform`` (:mod:`tenure.conformance.command`)
and ``tenure --version``.

``tenure demo`` runs the owned queue under stress on an embedded SQLite file (or
``--db URL``) and exits non-zero if any invariant broke. ``tenure migrate --db URL``
applies and qualifies the owned migration and summarizes its admission checks
(``--verbose`` lists each); ``tenure migrate --alembic`` prints an Alembic revision that
runs the same steps (:mod:`tenure.apps.alembic`).

Every command but ``demo`` takes its database from ``--db``, else from the ``TENURE_DB``
environment variable (so a URL with a password need not appear in ``ps`` or the shell's
history); the URL is never printed. ``tenure worker --app`` falls back further, to the
app's own database. ``demo`` never reads ``TENURE_DB``: it writes thousands of jobs, so
only a database named on its command line (or its own temporary file) is used.

Every subcommand runs through :func:`run_command`, so every one answers alike: a refused
request or configuration (``ConfigValidationError``) exits 2 and names each flag, its
problem and what it takes; a database failure (any other ``TenureError``) exits 1 with
its reason and what to do next. Neither ever prints a URL, an ID, a token or a payload.
Arguments the parser rejects are refused the same way (``refused: invalid_arguments``)
by :class:`CommandParser`, which names the option and what it takes but never the value.

``tenure --version`` and ``tenure --help`` are answered before the library is imported
(it takes most of a second to import; ``bench/cli_startup.py`` measures both).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["main", "COMMAND_HELP", "DB_VARIABLE"]

DB_VARIABLE = "TENURE_DB"
"""The environment variable every command but ``demo`` reads when ``--db`` is not given."""

COMMAND_HELP = {
    "demo": "run the owned queue under stress and check every invariant",
    "migrate": "apply and qualify the owned migration",
    "worker": "run a fenced worker (an app's tasks, or one pycharter queue) until SIGTERM or SIGINT",
    "jobs": "look at and operate on tasks and the jobs of pycharter's queues",
    "runs": "run workflow Runs (worker) and operate on them",
    "health": "check that a database is reachable, migrated and keeping up (exit 0 healthy, 1 unhealthy, 2 refused)",
    "workers": "list the workers that recorded themselves: live, missing or stopped, with their claims in flight",
    "console": "serve the web console: queues, jobs, Runs and a consent inbox (needs tenure[console])",
    "conform": "run tenure's lockstep proof against a database, in a scratch area it removes "
               "(exit 0 conformant, 1 divergence, 2 refused; needs tenure[conform])",
}
"""Each subcommand's one-line help, shown by ``tenure --help`` without importing the
subcommand (the full parser's help is held equal to it by a test)."""

QUICK_ARGUMENTS = frozenset({"--version", "--help", "-h"})


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("tenure")
    except importlib.metadata.PackageNotFoundError:  # run from a tree that was never installed
        return "unknown"


def _quick_parser() -> argparse.ArgumentParser:
    """``tenure --version`` and ``tenure --help`` only: plain argparse, nothing imported.
    (It only ever prints its own text, so it needs none of CommandParser's care.)"""
    parser = argparse.ArgumentParser(prog="tenure", description="Durable work with a provable owner.")
    parser.add_argument("--version", action="version", version=f"tenure {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in COMMAND_HELP.items():
        commands.add_parser(name, help=text)
    return parser


def _parser() -> argparse.ArgumentParser:
    from tenure.conformance.command import add_conform_parser

    from .console.command import add_console_parser
    from .health_cli import add_health_parser
    from .jobs_cli import add_jobs_parser
    from .reporting import CommandParser
    from .runs_cli import add_runs_parser
    from .worker_cli import add_worker_parser
    from .workers_cli import add_workers_parser

    parser = CommandParser(prog="tenure", description="Durable work with a provable owner.")
    parser.add_argument("--version", action="version", version=f"tenure {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help=COMMAND_HELP["demo"])
    demo.add_argument("--db", help="URL of a database without jobs (default: a new SQLite file in a temporary folder, "
                      "removed at the end; TENURE_DB is not read)")
    demo.add_argument("--jobs", type=int, default=3000, help="jobs to submit across the three queues (10 to 10000)")
    demo.add_argument("--workers", type=int, default=8, help="concurrent workers per queue (1 to 64)")
    demo.add_argument("--lease-seconds", type=float, default=1.0, help="claim lease (0.1 to 10)")
    demo.add_argument("--seed", type=int, default=7, help="seed of the workers' choices")
    migrate = commands.add_parser("migrate", help=COMMAND_HELP["migrate"])
    migrate.add_argument("--db", help="database URL (default: $TENURE_DB; not read with --alembic)")
    migrate.add_argument("--schema", help="PostgreSQL: the schema of the queue tables (pycharter's: pycharter)")
    migrate.add_argument("--downgrade", action="store_true", help="remove the owned migration instead")
    migrate.add_argument("--sql", action="store_true",
                         help="print the statements the migration runs, then roll back (changes nothing)")
    migrate.add_argument("--verbose", action="store_true", help="list every admission check")
    migrate.add_argument("--alembic", action="store_true",
                         help="print an Alembic revision file whose upgrade and downgrade run these steps "
                         "(needs no database; tenure[alembic])")
    migrate.add_argument("--revision", help="with --alembic: the revision's identifier (default: a placeholder)")
    migrate.add_argument("--down-revision", help="with --alembic: the revision it follows (default: a placeholder)")
    add_worker_parser(commands)
    add_jobs_parser(commands)
    add_runs_parser(commands)
    add_health_parser(commands)
    add_workers_parser(commands)
    add_console_parser(commands, COMMAND_HELP["console"])
    add_conform_parser(commands, COMMAND_HELP["conform"])
    return parser


def with_database(arguments: argparse.Namespace) -> argparse.Namespace:
    """``--db``, else ``TENURE_DB`` (never for ``demo``). A command that cannot run without
    a database (``database_required`` among its defaults) and has neither is refused
    (``--db: argument_required``)."""
    if arguments.command != "demo" and getattr(arguments, "db", "") is None:
        arguments.db = os.environ.get(DB_VARIABLE) or None
    if getattr(arguments, "database_required", False):
        database_required(arguments)
    return arguments


def database_required(arguments: argparse.Namespace) -> str:
    """The database URL of a command that cannot run without one."""
    from tenure.model import ConfigValidationError

    if arguments.db is None:
        raise ConfigValidationError("invalid_arguments", fields=("db_url",), problems=("argument_required",))
    return str(arguments.db)


def _migrate(arguments: argparse.Namespace) -> int:
    import asyncio

    from tenure.model import ConfigValidationError

    if arguments.alembic:
        from .alembic import revision_file

        conflicting = [flag for flag in ("downgrade", "sql", "verbose") if getattr(arguments, flag)]
        if conflicting:
            raise ConfigValidationError("invalid_arguments", fields=("alembic",), problems=("not_with_" + conflicting[0],))
        print(revision_file(revision=arguments.revision, down_revision=arguments.down_revision,
                            schema=arguments.schema, version=_version()), end="")
        return 0
    for field in ("revision", "down_revision"):
        if getattr(arguments, field) is not None:
            raise ConfigValidationError("invalid_arguments", fields=(field,), problems=("only_with_alembic",))
    database_required(arguments)

    from tenure.adapters.wiring.migrations import downgrade, upgrade

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
    import asyncio
    import tempfile

    from .demo import DemoSettings, check_demo_settings, run_demo

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
    import asyncio

    from .worker_cli import run_worker, supervise_workers

    if arguments.processes is not None:
        return supervise_workers(arguments)
    return asyncio.run(run_worker(arguments))


def _jobs(arguments: argparse.Namespace) -> int:
    from .jobs_cli import run_jobs

    return run_jobs(arguments)


def _runs(arguments: argparse.Namespace) -> int:
    from .runs_cli import run_runs

    return run_runs(arguments)


def _health(arguments: argparse.Namespace) -> int:
    from .health_cli import run_health

    return run_health(arguments)


def _workers(arguments: argparse.Namespace) -> int:
    from .workers_cli import run_workers

    return run_workers(arguments)


def _console(arguments: argparse.Namespace) -> int:
    from .console.command import run_console

    return run_console(arguments)


def _conform(arguments: argparse.Namespace) -> int:
    from tenure.conformance.command import run_conform

    return run_conform(arguments)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _demo, "migrate": _migrate, "worker": _worker, "jobs": _jobs, "runs": _runs, "health": _health,
    "workers": _workers, "console": _console, "conform": _conform,
}
"""Each subcommand's body; :func:`main` runs it through :func:`run_command`."""


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given and set(given) <= QUICK_ARGUMENTS:
        _quick_parser().parse_args(given)  # prints the version or the help, then exits 0
    from .reporting import COMMAND, run_command

    def parsed_and_run() -> int:
        # Parsed inside run_command: rejected arguments are a refusal like any other.
        arguments: Any = _parser().parse_args(given)
        arguments.given = given  # the command line as given (tenure worker --processes runs it again)
        COMMAND.set(arguments.command)  # refusals spell fields as this command's flags
        with_database(arguments)
        return COMMANDS[arguments.command](arguments)

    return run_command(parsed_and_run)


if __name__ == "__main__":
    sys.exit(main())
