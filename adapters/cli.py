"""The ``tenure`` command: ``tenure demo``, ``tenure migrate`` and ``tenure --version``.

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
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from tenure.model import ConfigValidationError, TenureError
from tenure.model.errors import is_authored_word

from .demo import DEMO_LIMITS, DemoSettings, check_demo_settings, run_demo
from .migrations import downgrade, upgrade
from .worker_cli import add_worker_parser, run_worker
from .runs_cli import add_runs_parser, run_runs

__all__ = ["main", "run_command", "report_refusal", "report_failure", "CommandParser", "ArgumentsRefused"]

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

REFUSAL_HINTS = {
    "queue_tables_elsewhere": "the queue tables live in another schema: name it with ?schema=NAME in the URL or --schema NAME",
    "demo_database_not_empty": "the demo needs a database without jobs: name a new one, or leave --db out",
    "invalid_arguments": "`tenure COMMAND --help` lists what each option takes",
}
"""What to do next, printed under a refusal's reason."""

FIELD_HINTS = {
    "db_url": "--db takes sqlite:///PATH or postgresql://USER@HOST/DATABASE",
    **{
        field: f"--{field.replace('_', '-')} takes {low:g} to {high:g}"
        for field, (low, high) in DEMO_LIMITS.items()
    },
}
"""What a field accepts, printed beside its problem (the field names are the library's)."""


class ArgumentsRefused(ConfigValidationError):
    """Command-line arguments the parser rejected, with what each named option takes
    (the hints depend on the option's declaration, so they travel with the refusal)."""

    def __init__(self, *, fields: tuple[str, ...] = (), problems: tuple[str, ...],
                 hints: Mapping[str, str] | None = None) -> None:
        super().__init__("invalid_arguments", fields=fields, problems=problems)
        self.hints = dict(hints or {})


TYPE_PROBLEMS: dict[object, str] = {int: "integer_required", float: "number_required"}
"""The problem of a value its option's ``type=`` could not convert, by that type."""

TYPE_HINTS: dict[object, str] = {int: "an integer", float: "a number"}

MESSAGE_PROBLEMS = {"unrecognized arguments": "unrecognized_arguments", "ambiguous option": "ambiguous_option"}
"""The problem of an argparse message about no one option, by the message's opening words."""


def _option_field(action: argparse.Action) -> str:
    """A snake_case field for an option (``--lease-seconds``: ``lease_seconds``); the
    option's own spelling, not its ``dest``, since ``--queue`` stores into ``queues``."""
    if action.option_strings:
        return max(action.option_strings, key=len).lstrip("-").replace("-", "_")
    return action.dest


def _option_spelling(action: argparse.Action) -> str:
    return max(action.option_strings, key=len) if action.option_strings else action.dest


def _one_of(choices: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return choices[-1] if len(choices) == 1 else ", ".join(choices[:-1]) + " or " + choices[-1]


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that never prints what it rejects.

    argparse's messages quote the rejected text (``invalid int value: 'S3cr3t'``,
    ``invalid choice``, ``unrecognized arguments``, an ambiguous ``--opt=VALUE``), and a
    mistyped command line can carry a password or a token. So :meth:`error` never prints
    the message: it only reads which of this parser's own options it is about, and raises
    :class:`ArgumentsRefused` naming that option and what it takes, which :func:`main`
    reports like any refusal (exit 2). A message it cannot attribute is refused without
    detail rather than echoed. Subparsers are made of this class too (argparse creates
    them as ``type(parent)``).
    """

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)  # the usage is the parser's own text: no value in it
        raise self._refusal(message)

    def _options(self) -> dict[str, argparse.Action]:
        # argparse names an option in its messages by ``ArgumentError.argument_name``.
        return {str(argparse.ArgumentError(action, "").argument_name): action for action in self._actions}

    def _refusal(self, message: str) -> ArgumentsRefused:
        options = self._options()
        name, separator, problem = message.removeprefix("argument ").partition(": ")
        if message.startswith("argument ") and separator and name in options:
            return self._option_refusal(options[name], problem)
        required = "the following arguments are required: "
        if message.startswith(required):
            names = message.removeprefix(required).split(", ")
            fields = tuple(_option_field(options[name]) for name in names if name in options)
            if len(fields) == len(names) and all(is_authored_word(field) for field in fields):
                return ArgumentsRefused(fields=fields, problems=("argument_required",) * len(fields))
        problem = next((code for opening, code in MESSAGE_PROBLEMS.items() if message.startswith(opening)),
                       "arguments_not_understood")
        return ArgumentsRefused(problems=(problem,))

    @staticmethod
    def _option_refusal(action: argparse.Action, message: str) -> ArgumentsRefused:
        """What one option's value lacks, judged from the option's declaration; only the
        fixed openings of argparse's messages are read, never the quoted value."""
        field, spelling = _option_field(action), _option_spelling(action)
        hint = None
        if message.startswith("expected"):  # "expected one argument": the value is missing
            problem = "value_required"
        elif message.startswith("ignored explicit argument"):
            problem = "takes_no_value"
            hint = f"{spelling} is a flag: give it without =VALUE"
        elif action.choices is not None:
            problem = "invalid_choice"
            hint = f"{spelling} takes {_one_of([str(choice) for choice in action.choices])}"
        elif action.type in TYPE_PROBLEMS:
            problem = TYPE_PROBLEMS[action.type]
            hint = f"{spelling} takes {TYPE_HINTS[action.type]}"
        else:
            problem = "invalid_value"
        if not is_authored_word(field):  # a field is printed, so it must be a word we wrote
            return ArgumentsRefused(problems=(problem,))
        return ArgumentsRefused(fields=(field,), problems=(problem,), hints={} if hint is None else {field: hint})


def report_refusal(error: ConfigValidationError) -> None:
    """``refused: REASON``, then one line per field: its problem and what it accepts."""
    print(f"refused: {error.reason}")
    hints = error.hints if isinstance(error, ArgumentsRefused) else FIELD_HINTS
    named = error.fields or ("",) * len(error.problems)
    for field, problem in zip(named, error.problems, strict=True):
        hint = hints.get(field)
        shown = f"{field}: {problem}" if field else problem
        print(f"  {shown}" + (f" ({hint})" if hint else ""))
    hint = REFUSAL_HINTS.get(error.reason)
    if hint is not None:
        print(f"  {hint}")


def report_failure(error: TenureError) -> None:
    """``failed: CODE: REASON``, then what to do next when the reason has a hint."""
    print(f"failed: {error.code.value}: {error.reason}")
    hint = HINTS.get(error.reason)
    if hint is not None:
        print(f"  {hint}")


def run_command(command: Callable[[], int]) -> int:
    """Run one subcommand and return its exit status: its own, 2 when it was refused
    (``ConfigValidationError``), 1 when the database failed (any other ``TenureError``)."""
    try:
        return command()
    except ConfigValidationError as error:
        report_refusal(error)
        return 2
    except TenureError as error:
        report_failure(error)
        return 1


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
    add_runs_parser(commands)
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
    "demo": _demo, "migrate": _migrate, "worker": _worker, "runs": run_runs,
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
