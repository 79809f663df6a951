"""What every ``tenure`` subcommand says when it is refused or fails, in one format.

A refusal (``ConfigValidationError``, exit 2) prints ``refused: REASON`` and one line per
field with its problem and what it accepts; a conflict (a ``TenureError`` whose code is in
:data:`CONFLICT_CODES`: the request disagrees with what is stored, nothing was written,
exit 2) prints ``refused: CODE: REASON`` and what to do; a failure (any other
``TenureError``, exit 1) prints ``failed: CODE: REASON`` and what to do next. :class:`CommandParser` turns
argparse's complaints into the same refusals without ever echoing the rejected value
(it may be a password or a token).
"""

from __future__ import annotations

import argparse
import contextvars
import sys
from collections.abc import Callable
from typing import NoReturn

from tenure.model import ConfigValidationError, ErrorCode, TenureError
from tenure.model.errors import ArgumentsRefused, is_authored_word  # re-exported: every command raises it

from .flags import FLAGS, flag_for

__all__ = ["report_refusal", "report_failure", "report_conflict", "run_command", "CONFLICT_CODES", "CommandParser", "ArgumentsRefused", "RefusedWithDetail",
           "HINTS",
           "REFUSAL_HINTS", "COMMAND"]

COMMAND: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenure_command", default=None)
"""The subcommand being run (``main`` sets it once parsed): a refusal spells each field as
that command's flag (:func:`~tenure.apps.flags.flag_for`)."""

HINTS = {
    "schema_missing": "the queue tables are missing or not migrated: run `tenure migrate --db URL`",
    "database_missing": "the database does not exist: create it (PostgreSQL: createdb NAME), "
    "or check the SQLite file path and its folder",
    "connection_refused": "no connection could be made: is the server running and reachable at that host and port?",
    "authentication_failed": "the server refused the user or password of the URL",
    "host_not_found": "the URL's host name does not resolve: check its spelling and this machine's DNS",
    "tls_failed": "TLS could not be negotiated: does the server offer TLS (sslmode=require needs it), "
    "and is its certificate trusted (sslrootcert=PATH)?",
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

class RefusedWithDetail(ConfigValidationError):
    """A refusal with one more line that says what went wrong in the operator's own code
    (an import failure's type and message): written by the command, never a rejected value."""

    def __init__(self, reason: str, *, fields: tuple[str, ...], problems: tuple[str, ...], detail: str) -> None:
        super().__init__(reason, fields=fields, problems=problems)
        self.detail = detail


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
            return self._option_refusal(options[name], problem, self._command())
        required = "the following arguments are required: "
        if message.startswith(required):
            names = message.removeprefix(required).split(", ")
            fields = tuple(_option_field(options[name]) for name in names if name in options)
            if len(fields) == len(names) and all(is_authored_word(field) for field in fields):
                return ArgumentsRefused(fields=fields, problems=("argument_required",) * len(fields),
                                        spellings={_option_field(options[name]): _option_spelling(options[name])
                                                   for name in names})
        problem = next((code for opening, code in MESSAGE_PROBLEMS.items() if message.startswith(opening)),
                       "arguments_not_understood")
        return ArgumentsRefused(problems=(problem,))

    def _command(self) -> str | None:
        """The subcommand this parser is for (``tenure runs list``: ``runs``); parsing
        happens before :data:`COMMAND` is set."""
        words = self.prog.split()
        return words[1] if len(words) > 1 else None

    @staticmethod
    def _option_refusal(action: argparse.Action, message: str, command: str | None) -> ArgumentsRefused:
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
            row = next((row for row in sorted(FLAGS, key=lambda row: row.command is None)
                        if row.flag == spelling and row.command in (None, command)), None)
            hint = f"{spelling} takes {TYPE_HINTS[action.type]}" + (f": {row.accepts}" if row is not None else "")
        else:
            problem = "invalid_value"
        if not is_authored_word(field):  # a field is printed, so it must be a word we wrote
            return ArgumentsRefused(problems=(problem,))
        return ArgumentsRefused(fields=(field,), problems=(problem,), hints={} if hint is None else {field: hint},
                                spellings={field: spelling})


def report_refusal(error: ConfigValidationError) -> None:
    """``refused: REASON``, then one line per field: the flag that sets it (the field's own
    name when no flag does), its problem and what it accepts."""
    print(f"refused: {error.reason}")
    named = error.fields or ("",) * len(error.problems)
    for field, problem in zip(named, error.problems, strict=True):
        if isinstance(error, ArgumentsRefused):
            shown, hint = error.spellings.get(field, field), error.hints.get(field)
        else:
            # A dotted field is a part of a flag's value: db_url.sslmod is the URL's parameter.
            base, dotted, part = field.partition(".")
            row = flag_for(field, COMMAND.get(), problem) or (flag_for(base, COMMAND.get()) if dotted else None)
            shown, hint = (field, None) if row is None else (row.flag, f"{row.flag} takes {row.accepts}")
            if row is not None and dotted and row.field != field:
                shown = f"{row.flag} {part}"
        line = f"{shown}: {problem}" if shown else problem
        print(f"  {line}" + (f" ({hint})" if hint else ""))
    if isinstance(error, RefusedWithDetail):
        print(f"  {error.detail}")
    hint = REFUSAL_HINTS.get(error.reason)
    if hint is not None:
        print(f"  {hint}")


def report_failure(error: TenureError) -> None:
    """``failed: CODE: REASON``, then what to do next when the reason has a hint."""
    print(f"failed: {error.code.value}: {error.reason}")
    hint = HINTS.get(error.reason)
    if hint is not None:
        print(f"  {hint}")


CONFLICT_CODES = frozenset({
    ErrorCode.QUEUE_SUBMISSION_CONFLICT,
    ErrorCode.RUN_ADMISSION_CONFLICT,
    ErrorCode.RUN_OWNER_MISMATCH,
    ErrorCode.JOB_REQUEST_CONFLICT,
    ErrorCode.ATTEMPT_PREPARE_CONFLICT,
    ErrorCode.ATTEMPT_IDENTITY_CONFLICT,
})
"""Codes of a request that disagrees with what is stored (the same key or ID already
names other work, or the answer is not the owner's): a refused request, exit 2, like a
bad argument; repeating it changes nothing. Codes of a busy key (``run_admission_held``,
``run_session_busy``) stay failures (exit 1): the same request may succeed later."""

CONFLICT_HINTS: dict[ErrorCode, tuple[str, ...]] = {
    ErrorCode.QUEUE_SUBMISSION_CONFLICT: (
        "--submission-id: already names a task deferred with other arguments, task or options "
        "(nothing was written)",
        "repeat the original request to get its job, or give a new --submission-id for a new task"),
    ErrorCode.RUN_ADMISSION_CONFLICT: (
        "--key: already names a Run admitted with other work (nothing was written)",
        "repeat the original request to get its Run, or give a new --key for a new Run"),
}
"""What to do, printed under a conflict (the flags are the commands' that can meet one)."""


def report_conflict(error: TenureError) -> None:
    """``refused: CODE: REASON``, then what to do; never the ID, key or payload."""
    print(f"refused: {error.code.value}: {error.reason}")
    for line in CONFLICT_HINTS.get(error.code, ("the request disagrees with what is stored; nothing was written",)):
        print(f"  {line}")


def run_command(command: Callable[[], int]) -> int:
    """Run one subcommand and return its exit status: its own, 2 when it was refused
    (``ConfigValidationError``, or a conflict: :data:`CONFLICT_CODES`), 1 when the
    database failed (any other ``TenureError``)."""
    try:
        return command()
    except ConfigValidationError as error:
        report_refusal(error)
        return 2
    except TenureError as error:
        if error.code in CONFLICT_CODES:
            report_conflict(error)
            return 2
        report_failure(error)
        return 1
