"""The ``tenure`` command: ``tenure demo`` and ``tenure migrate``.

``tenure demo`` runs the owned queue under stress on an embedded SQLite file (or
``--db URL``) and exits non-zero if any invariant broke. ``tenure migrate --db URL``
applies and qualifies the owned migration and reports every admission check.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
import tempfile
from collections.abc import Sequence

from tenure.model import ConfigValidationError, TenureError

from .demo import DemoSettings, run_demo
from .migrations import downgrade, upgrade

__all__ = ["main"]

HINTS = {
    "schema_missing": "the queue tables are missing or not migrated: run `tenure migrate --db URL`",
    "database_missing": "the database does not exist: create it (PostgreSQL: createdb NAME), "
    "or check the SQLite file path and its folder",
    "connection_refused": "no connection could be made: is the server running and reachable at that host and port?",
    "authentication_failed": "the server refused the user or password of the URL",
    "timeout": "the database did not answer within the timeout: is it overloaded or unreachable?",
    "connection_lost": "the connection broke mid-call: nothing was committed; try again",
    "commit_unacknowledged": "the commit's answer was lost: check the result before repeating",
}
"""What to do next, printed under a persistence failure's reason."""


def _report_failure(error: TenureError) -> None:
    print(f"failed: {error.code.value}: {error.reason}")
    hint = HINTS.get(error.reason)
    if hint is not None:
        print(f"  {hint}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tenure", description="Durable work with a provable owner.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the owned queue under stress and check every invariant")
    demo.add_argument("--db", help="database URL (default: a new SQLite file in a temporary folder)")
    demo.add_argument("--jobs", type=int, default=3000, help="jobs to submit across the three queues")
    demo.add_argument("--workers", type=int, default=8, help="concurrent workers per queue")
    demo.add_argument("--lease-seconds", type=float, default=1.0, help="claim lease")
    demo.add_argument("--seed", type=int, default=7, help="seed of the workers' choices")
    migrate = commands.add_parser("migrate", help="apply and qualify the owned migration")
    migrate.add_argument("--db", required=True, help="database URL")
    migrate.add_argument("--schema", help="PostgreSQL: the schema of the queue tables (pycharter's: pycharter)")
    migrate.add_argument("--downgrade", action="store_true", help="remove the owned migration instead")
    migrate.add_argument("--sql", action="store_true",
                         help="print the statements the migration runs, then roll back (changes nothing)")
    migrate.add_argument("--verbose", action="store_true", help="list every admission check")
    return parser


async def _migrate(arguments: argparse.Namespace) -> int:
    run = downgrade if arguments.downgrade else upgrade
    try:
        report = await run(arguments.db, schema=arguments.schema, dry_run=arguments.sql)
    except ConfigValidationError as error:
        print(f"refused: {error.reason}")
        for field, problem in zip(error.fields, error.problems, strict=True):
            print(f"  {field}: {problem}")
        if error.reason == "queue_tables_elsewhere":
            print("  the queue tables live in another schema: name it with ?schema=NAME in the URL or --schema NAME")
        return 2
    except TenureError as error:
        _report_failure(error)
        return 1
    if arguments.sql:
        for statement in report.statements:
            print(statement.rstrip() + ";")
        print(f"-- {report.summary()}")
        return 0
    print("\n".join(report.lines(verbose=arguments.verbose)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    if arguments.command == "migrate":
        return asyncio.run(_migrate(arguments))
    db_url = arguments.db
    if db_url is None:
        folder = pathlib.Path(tempfile.mkdtemp(prefix="tenure-demo-"))
        db_url = f"sqlite:///{folder / 'demo.sqlite3'}"
        print(f"database: {folder / 'demo.sqlite3'}")
    if arguments.jobs < 10 or arguments.workers < 1:
        print("--jobs must be at least 10 and --workers at least 1")
        return 2
    settings = DemoSettings(
        db_url=db_url, jobs=arguments.jobs, workers=arguments.workers,
        lease_seconds=arguments.lease_seconds, seed=arguments.seed,
    )
    try:
        return asyncio.run(run_demo(settings))
    except TenureError as error:
        _report_failure(error)
        return 1


if __name__ == "__main__":
    sys.exit(main())
