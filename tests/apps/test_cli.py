"""The `tenure` command: the demo's checks have teeth, every subcommand refuses bad input by
field and problem before it creates anything, and migrate reports what it checked."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import itertools
import os
import pathlib
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from tenure.apps.cli import main
from tenure.apps.reporting import run_command
from tenure.kernel.queue import machine as queue_machine


def test_the_demo_runs_and_every_invariant_holds(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/demo.db"
    status = main(["demo", "--db", url, "--jobs", "80", "--workers", "3", "--lease-seconds", "0.4"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "every invariant held" in out
    assert "lost                                     0" in out
    assert "stale writes accepted                    0" in out
    # Its checks count every job as its own: a second run on the same database is refused.
    assert main(["demo", "--db", url, "--jobs", "80"]) == 2
    assert "refused: demo_database_not_empty" in capsys.readouterr().out


@pytest.mark.parametrize("database", ["postgresql"])
async def test_the_demo_runs_on_postgresql(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from tenure.apps.demo import DemoSettings, run_demo

    status = await run_demo(DemoSettings(db_url=db_url, jobs=80, workers=3, lease_seconds=0.4))
    out = capsys.readouterr().out
    assert status == 0, out
    assert "every invariant held" in out


def test_the_demo_exits_non_zero_when_the_kernel_accepts_stale_writes(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A kernel that compares fences without their owner and token lets a stalled worker
    # finish a job another worker took over: the demo's takeover drill must catch it.
    def fence_mismatch_by_job_only(record: object, command: object, now: int) -> bool:
        return command.fence.job_id != record.job_id  # type: ignore[attr-defined]

    monkeypatch.setitem(queue_machine.GUARDS, "fence_mismatch", fence_mismatch_by_job_only)
    monkeypatch.setitem(queue_machine.GUARDS, "lease_not_live", lambda record, command, now: False)
    url = f"sqlite:///{tmp_path}/demo.db"
    status = main(["demo", "--db", url, "--jobs", "200", "--workers", "3", "--lease-seconds", "0.3", "--seed", "3"])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "INVARIANT BROKEN" in out


def test_migrate_summarizes_and_lists_every_admission_check_only_when_verbose(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/m.db"
    assert main(["migrate", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "applied: owned_v2" in out and "checks passed" in out
    assert "validation_jobs.claim_token" not in out
    assert main(["migrate", "--db", url, "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "nothing (up to date)" in out
    assert "validation_jobs.claim_token: one full unique index comparing exactly: ok" in out


def test_migrate_sql_prints_the_statements_and_changes_nothing(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.db"
    sqlite3.connect(path).close()  # an empty database file
    assert main(["migrate", "--db", f"sqlite:///{path}", "--sql"]) == 0
    out = capsys.readouterr().out
    assert "CREATE TABLE IF NOT EXISTS validation_jobs" in out
    assert "ALTER TABLE validation_jobs ADD COLUMN claim_token VARCHAR(255);" in out
    assert "dry run: rolled back" in out
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)
    finally:
        connection.close()


def test_downgrade_says_nothing_to_remove_when_nothing_was_applied(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.db"
    sqlite3.connect(path).close()
    assert main(["migrate", "--db", f"sqlite:///{path}", "--downgrade"]) == 0
    assert "removed: nothing to remove" in capsys.readouterr().out


def table_tenure_did_not_create(tmp_path: pathlib.Path) -> pathlib.Path:
    """An SQLite file whose validation_jobs table lacks the legacy columns."""
    path = tmp_path / "bad.db"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE validation_jobs (id VARCHAR(36) PRIMARY KEY, claim_token CHAR(255))")
    connection.commit()
    connection.close()
    return path


def test_migrate_refuses_a_table_it_did_not_create_with_exit_status_two(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = table_tenure_did_not_create(tmp_path)
    assert main(["migrate", "--db", f"sqlite:///{path}"]) == 2
    out = capsys.readouterr().out
    assert "refused: migration_admission_refused" in out
    assert "validation_jobs.status: missing_legacy_column" in out


# --- tenure --version -------------------------------------------------------------------


def test_version_prints_the_installed_version_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"tenure {importlib.metadata.version('tenure')}\n"
    done = subprocess.run([sys.executable, "-P", "-m", "tenure.apps.cli", "--version"],
                          capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (0, f"tenure {importlib.metadata.version('tenure')}\n")


# --- tenure demo: settings, progress, explanations, its temporary folder -------------------


@pytest.fixture
def temporary_root(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """Where the demo's temporary folder goes (so a test can see what it left behind)."""
    root = tmp_path / "temporary"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.mark.parametrize(("arguments", "lines"), [
    (["--jobs", "5"], ["  --jobs: integer_out_of_range (--jobs takes 10 to 10,000)"]),
    (["--jobs", "10001"], ["  --jobs: integer_out_of_range (--jobs takes 10 to 10,000)"]),
    (["--workers", "0"], ["  --workers: integer_out_of_range (--workers takes 1 to 64)"]),
    (["--lease-seconds", "0"], ["  --lease-seconds: number_out_of_range (--lease-seconds takes 0.1 to 10 seconds)"]),
    (["--lease-seconds", "nan"], ["  --lease-seconds: number_out_of_range (--lease-seconds takes 0.1 to 10 seconds)"]),
    (["--lease-seconds", "-1", "--workers", "100"], [
        "  --workers: integer_out_of_range (--workers takes 1 to 64)",
        "  --lease-seconds: number_out_of_range (--lease-seconds takes 0.1 to 10 seconds)",
    ]),
])
def test_demo_refuses_bad_settings_naming_each_before_it_creates_a_folder(
    arguments: list[str], lines: list[str], temporary_root: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *arguments]) == 2
    out = capsys.readouterr().out
    assert out.splitlines() == ["refused: invalid_demo_settings", *lines]
    assert list(temporary_root.iterdir()) == []


def test_demo_refuses_bad_settings_before_it_creates_the_database_it_was_given(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "demo.db"
    assert main(["demo", "--db", f"sqlite:///{path}", "--jobs", "3"]) == 2
    assert "jobs: integer_out_of_range" in capsys.readouterr().out
    assert not path.exists()


@pytest.mark.parametrize("command", [["demo"], ["migrate"]])
def test_a_bad_database_url_is_refused_naming_the_field_and_never_echoing_the_url(
    command: list[str], temporary_root: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--db", "mysql://operator:hunter2@db.internal/queue"]) == 2
    out = capsys.readouterr().out
    assert "--db: unsupported_scheme (--db takes sqlite:///PATH or postgresql://USER@HOST/DATABASE" in out
    assert "hunter2" not in out and "db.internal" not in out and "operator" not in out
    assert list(temporary_root.iterdir()) == []


@pytest.mark.parametrize("url", ["sqlite://queue.db", "sqlite:/queue.db", "sqlite+aiosqlite://queue.db"])
def test_a_sqlite_url_with_too_few_slashes_is_refused_saying_so(
    url: str, temporary_root: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--db", url]) == 2
    out = capsys.readouterr().out
    assert "--db: sqlite_needs_three_slashes (--db takes sqlite:///PATH or postgresql://USER@HOST/DATABASE" in out
    assert "queue.db" not in out
    assert list(temporary_root.iterdir()) == []


def test_demo_refuses_a_wrongly_prepared_database_as_migrate_does(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = table_tenure_did_not_create(tmp_path)
    for command in (["migrate"], ["demo"]):
        assert main([*command, "--db", f"sqlite:///{path}"]) == 2
        out = capsys.readouterr().out
        assert "refused: migration_admission_refused" in out
        assert "validation_jobs.status: missing_legacy_column" in out


def test_a_refusal_without_field_names_still_lists_its_problems(capsys: pytest.CaptureFixture[str]) -> None:
    from tenure.model import ConfigValidationError

    def refused() -> int:
        raise ConfigValidationError("queue_tables_elsewhere", problems=("tables_in_schema_pycharter",))

    assert run_command(refused) == 2
    assert capsys.readouterr().out.splitlines() == [
        "refused: queue_tables_elsewhere",
        "  tables_in_schema_pycharter",
        "  the queue tables live in another schema: name it with ?schema=NAME in the URL or --schema NAME",
    ]


def _table(out: str, title: str) -> dict[str, int]:
    """The ``name  count`` rows of one summary table of the demo's output."""
    lines = out.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(f"{title} ")) + 2
    rows = {}
    for line in lines[start:]:
        if not line.strip():
            break
        name, count = line.rsplit(None, 1)
        rows[name.strip()] = int(count)
    return rows


async def test_demo_reports_progress_while_it_submits_and_explains_its_counts(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tenure.apps.demo import DemoSettings, run_demo

    settings = DemoSettings(db_url=f"sqlite:///{tmp_path}/demo.db", jobs=85, workers=3, lease_seconds=0.3,
                            progress_every=20)
    assert await run_demo(settings) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # 85 jobs: 51 validation, 25 pipeline and at least 10 streaming; the rerun adds 2.
    assert "submitting 86 jobs: 51 validation, 25 pipeline, 10 streaming" in out
    progress = [index for index, line in enumerate(lines) if line.endswith(tuple(f"submitted {n:6d}" for n in (20, 40, 60, 80)))]
    submitted = next(index for index, line in enumerate(lines) if line.startswith("submitted 86 jobs"))
    assert len(progress) == 4 and max(progress) < submitted
    summary = _table(out, "summary")
    assert summary["submitted"] == 88
    ended = ("finished by exactly one accepted write", "ended by lease expiry (no worker write)", "lost")
    assert sum(summary[name] for name in ended) == summary["submitted"]
    assert "what the counts mean:" in out
    assert "submitted: 51 validation + 25 pipeline + 10 streaming (--jobs 85 split 60/30/10 %" in out
    assert "plus the 2 launches of the forced rerun" in out
    assert "Ended by lease" in out and "lease expired with no attempts left" in out


def test_demo_removes_its_temporary_folder_when_it_finishes(
    temporary_root: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--jobs", "20", "--workers", "2", "--lease-seconds", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "every invariant held" in out
    assert "removed at the end" in out and str(temporary_root) not in out
    assert list(temporary_root.iterdir()) == []


@pytest.mark.parametrize("failure", ["persistence", "interrupt"])
def test_demo_removes_its_temporary_folder_when_it_fails(
    failure: str, temporary_root: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tenure.apps import demo
    from tenure.model import ErrorCode, TenureError

    seen: list[pathlib.Path] = []

    async def failing_demo(settings: object) -> int:
        folder = pathlib.Path(settings.db_url.removeprefix("sqlite:///")).parent  # type: ignore[attr-defined]
        assert folder.parent == temporary_root and folder.is_dir()
        seen.append(folder)
        if failure == "interrupt":
            raise KeyboardInterrupt
        raise TenureError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "connection_lost")

    monkeypatch.setattr(demo, "run_demo", failing_demo)
    if failure == "interrupt":
        with pytest.raises(KeyboardInterrupt):
            main(["demo"])
    else:
        assert main(["demo"]) == 1
        assert "failed: queue_persistence_failed: connection_lost" in capsys.readouterr().out
    assert seen and list(temporary_root.iterdir()) == []


def test_a_demo_that_fails_midway_closes_its_sources_and_exits(tmp_path: pathlib.Path) -> None:
    # An SQLite source left open keeps a thread that stops the process from exiting.
    script = (
        "import sys\n"
        "from tenure.apps import cli, demo\n"
        "from tenure.model import ErrorCode, TenureError\n"
        "async def drill(self):\n"
        "    raise TenureError(ErrorCode.QUEUE_PERSISTENCE_FAILED, 'connection_lost')\n"
        "demo.Demo.takeover_drill = drill\n"
        f"sys.exit(cli.main(['demo', '--db', 'sqlite:///{tmp_path}/demo.db', '--jobs', '20']))\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed: queue_persistence_failed: connection_lost" in done.stdout


# --- tenure migrate: short unless verbose --------------------------------------------------


def test_a_migration_report_is_short_unless_verbose_and_always_shows_failed_checks() -> None:
    from tenure.adapters.core.migration_report import Check, MigrationReport

    checks = tuple(Check("validation_jobs", f"column_{n}", "present", True) for n in range(200))
    failed = Check("validation_jobs", "status", "present", False, "missing_legacy_column")
    report = MigrationReport("sqlite", "upgrade", ("owned_v2",), (*checks, failed))
    assert report.lines() == [
        "database: sqlite",
        "applied: owned_v2; 200 of 201 checks passed",
        "  validation_jobs.status: present: REFUSED (missing_legacy_column)",
    ]
    verbose = report.lines(verbose=True)
    assert len(verbose) == 2 + 201 and "  validation_jobs.column_0: present: ok" in verbose


# --- rejected arguments: refused by option and type, never echoed ---------------------------

SECRET = "S3cr3tPW-9f2c"
"""A value that must never be printed back, whatever position it is rejected in."""

PLAIN_VALUES = {"broker": "queue", "workflows": "flows:registry", "workflow": "hello", "revision": "1",
                "handler": "asyncio:sleep", "by": "bob", "run_id": "0" * 36, "consent_id": "0" * 36,
                "job_id": "0" * 36, "older_than": "7d", "app": "asyncio:sleep", "task_name": "send"}
"""A plausible value for each required argument without choices (besides --db)."""


def _leaf_parsers(
    parser: argparse.ArgumentParser, words: list[str],
) -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    """Every command the parser wires (``demo``, ``runs list``, ...) and its parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield from _leaf_parsers(subparser, [*words, name])
            return
    yield words, parser


def secret_command_lines(missing_db_url: str) -> Iterator[list[str]]:
    """The secret in every position of every command: the command word, each option's
    value (``--opt VALUE`` and ``--opt=VALUE``), each flag (``--flag=VALUE``), each
    positional, an unrecognized argument and option, and every ambiguous option prefix.
    The other arguments are valid; the database is a file in a missing folder, so any
    command that gets past its arguments is refused before it runs."""
    from tenure.apps import cli

    yield [SECRET]
    yield ["runs", SECRET]
    for words, parser in _leaf_parsers(cli._parser(), []):
        actions = [action for action in parser._actions
                   if not isinstance(action, (argparse._HelpAction, argparse._VersionAction))]

        def plain(action: argparse.Action) -> str:
            if action.dest == "db":
                return missing_db_url
            return str(next(iter(action.choices))) if action.choices else PLAIN_VALUES[action.dest]

        def command_line(secret_in: argparse.Action | None = None) -> list[str]:
            options = [part for action in actions if action.option_strings and action.required
                       and action is not secret_in for part in (action.option_strings[-1], plain(action))]
            positionals = [SECRET if action is secret_in else plain(action)
                           for action in actions if not action.option_strings]
            return [*words, *options, *positionals]

        for action in actions:
            if not action.option_strings:
                yield command_line(secret_in=action)
            elif action.nargs == 0:
                yield [*command_line(), f"{action.option_strings[-1]}={SECRET}"]
            else:
                yield [*command_line(secret_in=action), action.option_strings[-1], SECRET]
                yield [*command_line(secret_in=action), f"{action.option_strings[-1]}={SECRET}"]
        yield [*command_line(), SECRET]
        yield [*command_line(), f"--{SECRET}={SECRET}"]
        spellings = [spelling for action in actions for spelling in action.option_strings if spelling.startswith("--")]
        for first, second in itertools.combinations(spellings, 2):
            prefix = os.path.commonprefix([first, second])
            if len(prefix) > 2 and prefix not in spellings:
                yield [*command_line(), f"{prefix}={SECRET}"]


def test_no_command_prints_a_value_it_rejects_in_any_position_and_each_exits_two(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "no-such-folder" / "tenure.db"
    command_lines = list(secret_command_lines(f"sqlite:///{missing}"))
    assert len(command_lines) > 100
    for command_line in command_lines:
        try:
            status: object = main(command_line)
        except SystemExit as exited:  # argparse's own way out: must not happen either
            status = exited.code
        captured = capsys.readouterr()
        printed = captured.out + captured.err
        assert SECRET not in printed, (command_line, printed)
        assert status == 2, (command_line, printed)
        assert captured.out.startswith("refused: "), (command_line, printed)
    assert not missing.parent.exists()


@pytest.mark.parametrize(("arguments", "lines"), [
    (["runs", "list", "--limit", SECRET], ["  --limit: integer_required (--limit takes an integer: 1 to 1,000)"]),
    (["demo", "--lease-seconds", SECRET], ["  --lease-seconds: number_required (--lease-seconds takes a number: 0.1 to 10 seconds)"]),
    (["runs", "list", "--status", SECRET], [
        "  --status: invalid_choice (--status takes queued, running, awaiting_hardware, awaiting_consent, "
        "awaiting_delegate, awaiting_service, awaiting_timer, awaiting_message, cancelling, done, failed or cancelled)"]),
    (["runs", "admit", "--db", "sqlite:///x.db", "--broker", SECRET],
     ["  --broker: invalid_choice (--broker takes saq or queue)"]),
    ([SECRET], ["  command: invalid_choice (command takes demo, migrate, worker, jobs, runs, health, workers, console or conform)"]),
    (["runs", "list", "--db", "sqlite:///x.db", SECRET], ["  unrecognized_arguments"]),
    (["migrate", "--db", "sqlite:///x.db", f"--verbose={SECRET}"],
     ["  --verbose: takes_no_value (--verbose is a flag: give it without =VALUE)"]),
    (["runs", "list", "--limit"], ["  --limit: value_required"]),
    (["runs", "show"], ["  run_id: argument_required"]),
])
def test_a_rejected_argument_is_refused_naming_its_option_and_what_it_takes(
    arguments: list[str], lines: list[str], capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(arguments) == 2
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "refused: invalid_arguments", *lines, "  `tenure COMMAND --help` lists what each option takes",
    ]
    assert captured.err.startswith("usage: tenure") and SECRET not in captured.err


# --- TENURE_DB --------------------------------------------------------------------------------

def test_without_db_every_command_but_demo_reads_tenure_db_and_never_prints_it(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"sqlite:///{tmp_path}/from-the-environment.db"
    monkeypatch.setenv("TENURE_DB", url)
    assert main(["migrate"]) == 0
    assert (tmp_path / "from-the-environment.db").exists()
    assert main(["runs", "list"]) == 0
    assert main(["jobs", "list", "--queue", "validation"]) == 0
    printed = capsys.readouterr().out
    assert url not in printed and "from-the-environment" not in printed
    # --db wins over the variable.
    other = tmp_path / "named.db"
    assert main(["migrate", "--db", f"sqlite:///{other}"]) == 0 and other.exists()


@pytest.mark.parametrize("command", [["migrate"], ["runs", "list"], ["jobs", "list"], ["runs", "cancel", "r-1"]])
def test_without_db_or_tenure_db_a_command_is_refused_naming_the_flag_and_the_variable(
    command: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TENURE_DB", raising=False)
    assert main(command) == 2
    assert capsys.readouterr().out.splitlines() == [
        "refused: invalid_arguments",
        "  --db: argument_required (--db takes sqlite:///PATH or postgresql://USER@HOST/DATABASE; or set TENURE_DB)",
        "  `tenure COMMAND --help` lists what each option takes"]


def test_the_demo_never_reads_tenure_db(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TENURE_DB", f"sqlite:///{tmp_path}/production.db")
    assert main(["demo", "--jobs", "10", "--workers", "1"]) == 0
    assert not (tmp_path / "production.db").exists()
    assert "a new SQLite file in a temporary folder" in capsys.readouterr().out


def test_version_and_help_are_answered_without_importing_the_library() -> None:
    script = ("import sys\nfrom tenure.apps.cli import main\n"
              "for argv in (['--version'], ['--help']):\n"
              "    try:\n        main(argv)\n    except SystemExit as exited:\n        assert exited.code == 0\n"
              "heavy = sorted(name for name in sys.modules if name.startswith(('pydantic', 'sqlalchemy', 'asyncpg',"
              " 'tenure.model', 'tenure.kernel')))\n"
              "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "tenure " in done.stdout and "health" in done.stdout


def test_the_quick_help_lists_every_command_with_the_full_parsers_help() -> None:
    from tenure.apps import cli

    def helps(parser: argparse.ArgumentParser) -> dict[str, str | None]:
        [commands] = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
        return {choice.dest: choice.help for choice in commands._choices_actions}

    assert helps(cli._quick_parser()) == helps(cli._parser()) == cli.COMMAND_HELP


# --- URL diagnostics --------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["queue.db", "./data/queue.db", "/var/lib/tenure/queue.db"])
def test_a_bare_path_is_refused_as_scheme_missing(
    path: str, temporary_root: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--db", path]) == 2
    out = capsys.readouterr().out
    assert "--db: scheme_missing (--db takes sqlite:///PATH or postgresql://" in out and "queue.db" not in out


def test_an_unknown_url_parameter_is_refused_before_connecting_naming_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("connected")

    monkeypatch.setattr(socket, "create_connection", no_network)
    assert main(["migrate", "--db", "postgresql://ops:hunter2@db.internal/queue?sslmod=require"]) == 2
    out = capsys.readouterr().out
    assert out.splitlines()[1:3] == [
        "  --db: unknown_url_parameter (--db takes sqlite:///PATH or postgresql://USER@HOST/DATABASE; or set TENURE_DB)",
        "  --db sslmode: closest_known_parameter (--db takes sqlite:///PATH or postgresql://USER@HOST/DATABASE; "
        "or set TENURE_DB)"]
    assert "sslmod=" not in out and "hunter2" not in out and "db.internal" not in out and "require" not in out
    # The unknown name itself is never printed: it may be a secret pasted after "?".
    for query in ("swordfish", "hunter2", "Secret%20Name=1"):
        assert main(["migrate", "--db", f"postgresql://ops@db.internal/queue?{query}"]) == 2
        out = capsys.readouterr().out
        assert "  --db: unknown_url_parameter" in out and "closest" not in out
        assert "swordfish" not in out and "hunter2" not in out and "Secret" not in out


def test_every_known_url_parameter_passes_the_check() -> None:
    from tenure.adapters.core.urls import URL_PARAMETERS, parse_db_url

    query = "&".join(f"{name}=x" for name in sorted(URL_PARAMETERS - {"schema", "pooler"}))
    target = parse_db_url(f"postgresql://u@h/d?{query}&schema=pycharter&pooler=session")
    assert (target.schema, target.pooler and target.pooler.value) == ("pycharter", "session")


def test_a_host_that_does_not_resolve_fails_as_host_not_found_with_a_hint(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # .invalid never resolves (RFC 6761). The resolver's answer is given here, so a machine
    # whose resolver is slow or absent answers the same (the connection path is the real one).
    import socket

    real = socket.getaddrinfo

    def resolver(host: object, *args: object, **kwargs: object) -> object:
        if isinstance(host, str) and host.endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    assert main(["runs", "list", "--db", "postgresql://ops:hunter2@no-such-host.invalid/queue"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[:2] == [
        "failed: run_persistence_failed: host_not_found",
        "  the URL's host name does not resolve: check its spelling and this machine's DNS"]
    assert "hunter2" not in out and "no-such-host" not in out


@pytest.mark.parametrize("database", ["postgresql"])
def test_a_tls_negotiation_failure_fails_as_tls_failed_with_a_hint(
    fresh_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The throwaway server offers no TLS: sslmode=require cannot be met.
    separator = "&" if "?" in fresh_db_url else "?"
    assert main(["runs", "list", "--db", f"{fresh_db_url}{separator}sslmode=require"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "failed: run_persistence_failed: tls_failed", out
    assert "sslrootcert" in out.splitlines()[1]


# --- import failures say what failed ------------------------------------------------------------

@pytest.fixture
def modules(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "tenure_t_app.py").write_text("import tenure_t_dependency\nasync def handler(claimed, context):\n"
                                            "    return {}\n")
    (folder / "tenure_t_dependency.py").write_text("raise RuntimeError('DATABASE_HOST is not set\\n(see notes)')\n")
    (folder / "tenure_t_missing_dep.py").write_text("import tenure_t_not_installed\n")
    (folder / "tenure_t_fine.py").write_text("async def handler(claimed, context):\n    return {}\n")
    (folder / "tenure_t_syntax.py").write_text("def broken(:\n    SECRET_LINE = 1\n")
    (folder / "tenure_t_lazy.py").write_text("def __getattr__(name):\n    raise KeyError(name)\n")
    (folder / "tenure_t_pkg").mkdir()
    (folder / "tenure_t_pkg" / "__init__.py").write_text("raise RuntimeError('raised by the package')\n")
    monkeypatch.syspath_prepend(str(folder))
    for name in [name for name in sys.modules if name.startswith("tenure_t_")]:
        monkeypatch.delitem(sys.modules, name)
    return folder


@pytest.mark.parametrize(("path", "problem"), [
    ("tenure_t_app:handler", "the handler's module failed to import while importing 'tenure_t_dependency': "
                             "RuntimeError: DATABASE_HOST is not set (see notes)"),
    ("tenure_t_dependency:handler", "the handler's module failed to import: RuntimeError: DATABASE_HOST is not set "
                                    "(see notes)"),
    ("tenure_t_missing_dep:handler", "the handler's module imports a module that is not installed "
                                     "('tenure_t_not_installed')"),
    ("tenure_t_fine:absent", "the handler's module has no attribute of that name"),
    ("tenure_t_nowhere:handler", "the handler's module does not exist (ModuleNotFoundError)"),
    ("tenure_t_fine", "the handler must be given as package.module:attribute"),
    (".tok3n:x", "the handler must be given as package.module:attribute"),
    ("tenure_t_fine:a-b", "the handler must be given as package.module:attribute"),
    ("tenure_t_lazy:anything", "the handler's module failed to give that attribute (KeyError)"),
    ("tenure_t_pkg.sub:handler", "the handler's module failed to import: RuntimeError: raised by the package"),
])
def test_an_import_failure_names_its_type_message_and_failing_module_never_the_path(
    modules: pathlib.Path, path: str, problem: str
) -> None:
    from tenure.apps.worker_cli import import_problem

    assert import_problem(path, "handler") == (None, problem)


def test_a_syntax_error_names_the_file_and_line_never_its_contents(modules: pathlib.Path) -> None:
    from tenure.apps.worker_cli import import_problem

    target, problem = import_problem("tenure_t_syntax:broken", "handler")
    assert target is None and problem is not None and problem.startswith("the handler's module failed to import: "
                                                                         "SyntaxError")
    assert "SECRET_LINE" not in problem and "def broken" not in problem


async def test_a_workflows_registry_that_fails_to_import_is_refused_with_the_detail(
    modules: pathlib.Path, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await asyncio.to_thread(main, ["runs", "admit", "--db", db_url, "--workflows", "tenure_t_app:flows",
                                          "--workflow", "w", "--revision", "1"]) == 2
    assert capsys.readouterr().out.splitlines()[:3] == [
        "refused: invalid_workflows",
        "  --workflows: does_not_import (--workflows takes package.module:registry, a Workflows registry)",
        "  the registry's module failed to import while importing 'tenure_t_dependency': RuntimeError: "
        "DATABASE_HOST is not set (see notes)"]


# --- refusals name the flag and its range -------------------------------------------------------

FLOWS_MODULE = ("from tenure.adapters import Workflows\nregistry = Workflows()\n"
                "@registry.workflow('w', '1')\nasync def w(ctx):\n    return None\n")
HANDLER_MODULE = "async def handle(claimed, context):\n    return {}\n"
TASKS_MODULE = ("import os\nfrom tenure.adapters import TaskApp\napp = TaskApp(os.environ['TENURE_DB'])\n"
                "@app.task(name='plain')\ndef plain(ctx):\n    return 1\n")


@pytest.mark.parametrize(("command", "flag"), [
    (["worker", "--queue", "validation", "--handler", "tenure_t_handlers:handle", "--concurrency", "0"],
     "--concurrency"),
    (["worker", "--queue", "validation", "--handler", "tenure_t_handlers:handle", "--batch", "5000"], "--batch"),
    (["worker", "--app", "tenure_t_tasks:app", "--threads", "0"], "--threads"),
    (["worker", "--queue", "validation", "--handler", "tenure_t_handlers:handle", "--idle-wait", "0"], "--idle-wait"),
    (["worker", "--queue", "validation", "--handler", "tenure_t_handlers:handle", "--grace-seconds", "-1"],
     "--grace-seconds"),
    (["worker", "--queue", "validation", "--handler", "tenure_t_handlers:handle", "--lease-seconds", "-1"],
     "--lease-seconds"),
    (["worker", "--queue", "validation", "--handler", "tenure_t_handlers:handle", "--lease-seconds", "1",
      "--heartbeat-seconds", "2"], "--heartbeat-seconds"),
    (["runs", "worker", "--broker", "queue", "--workflows", "tenure_t_flows:registry", "--relay-seconds", "0"],
     "--relay-seconds"),
    (["runs", "worker", "--broker", "queue", "--workflows", "tenure_t_flows:registry", "--shutdown-seconds", "0"],
     "--shutdown-seconds"),
    (["runs", "worker", "--broker", "queue", "--workflows", "tenure_t_flows:registry", "--node-lease-seconds", "1"],
     "--node-lease-seconds"),
    (["runs", "admit", "--workflows", "tenure_t_flows:registry", "--workflow", "w", "--revision", "1",
      "--priority", "101"], "--priority"),
    (["runs", "admit", "--workflows", "tenure_t_flows:registry", "--workflow", "w", "--revision", "2"], "--workflow"),
    (["runs", "list", "--limit", "0"], "--limit"),
    (["jobs", "list", "--limit", "0"], "--limit"),
    (["health", "--timeout-seconds", "0"], "--timeout-seconds"),
])
def test_an_out_of_range_setting_is_refused_naming_its_flag_and_what_the_flag_takes(
    command: list[str], flag: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "tenure_t_flows.py").write_text(FLOWS_MODULE)
    (tmp_path / "tenure_t_handlers.py").write_text(HANDLER_MODULE)
    (tmp_path / "tenure_t_tasks.py").write_text(TASKS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TENURE_DB", f"sqlite:///{tmp_path}/queue.db")
    assert main(["migrate"]) == 0
    capsys.readouterr()
    assert main(command) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("refused: ") and lines[1].startswith(f"  {flag}: "), lines
    assert f"({flag} takes " in lines[1], lines


def test_threads_serve_an_apps_plain_tasks_and_are_refused_without_an_app(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
) -> None:
    db = f"sqlite:///{tmp_path}/queue.db"
    assert main(["worker", "--db", db, "--queue", "validation", "--handler", "tenure_t_handlers:handle",
                 "--threads", "2"]) == 2
    assert capsys.readouterr().out.startswith("refused: --threads bounds an --app's plain def tasks")
