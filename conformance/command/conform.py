"""``tenure conform``: tenure's lockstep proof, run against your own database.

    tenure conform [--db URL] [--machines queue,attempts,runs,stores] [--steps N] [--seed S]
                   [--json] [--replay-dir DIR] [--scratch-schema NAME]

It works in a scratch area it makes and removes (:mod:`tenure.conformance.drivers.scratch`:
PostgreSQL, a new schema; SQLite, a new folder beside the file), so nothing of the
user's is read or written. In it, it checks the server facts tenure's guarantees rest on
(:mod:`tenure.conformance.drivers.facts`), then runs each chosen lockstep machine for ``--steps``
steps (default 1,000 each; the store suite for ``--steps / 20`` examples per case and
check) with a progress bar on stderr, and prints one table row per machine: steps run,
rules exercised of the machine's total, races run (two calls at once, one serial order
must explain them), divergences. On a divergence it prints the shrunk command sequence
and writes a replay script (``tenure-conform-replay-<machine>.py`` in ``--replay-dir``,
default the current folder) that reproduces it against any database.

Exit status: 0 conformant (every fact tenure needs holds, no divergence); 1 a divergence
or a failed fact; 2 refused (bad arguments, the conform extra missing, a database that
cannot be reached or will not let the role make a scratch schema, a scratch schema name
already taken). Needs ``tenure[conform]`` (Hypothesis).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import pathlib
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tenure.model import ConfigValidationError
from tenure.model.errors import ArgumentsRefused

if TYPE_CHECKING:
    from tenure.conformance.lockstep.harness import Counter

__all__ = [
    "add_conform_parser", "run_conform", "database_label", "fact_rows", "COMMAND_HELP_LINE", "DEFAULT_STEPS",
]

COMMAND_HELP_LINE = ("run tenure's lockstep proof against a database, in a scratch area it removes "
                     "(exit 0 conformant, 1 divergence, 2 refused; needs tenure[conform])")
DEFAULT_STEPS = 1000
PER_CALL_DEADLINE_S = 30.0
"""tenure's per-call deadline (``WorkerConfig.timeout_seconds``' default): a server timeout
shorter than it would end calls tenure still waits for."""
STEPS_RANGE = (1, 10_000_000)
SEED_RANGE = (0, 2**32 - 1)
MACHINE_CHOICES = ("queue", "attempts", "runs", "stores")
CONFORM_HINT = "pip install 'tenure[conform]' (Hypothesis)"
STORE_EXAMPLES_PER_STEP = 20
"""The store suite runs ``steps / 20`` examples per case and check (each example stores
and reads back a whole generated table)."""
INTERRUPTED_STATUS = 130
"""The exit status of a run SIGINT or SIGTERM stopped (after removing its scratch area)."""
SCHEMA_REASONS = frozenset({"scratch_schema_exists", "scratch_schema_reserved", "sqlite_has_no_schemas"})
"""Refusals that are about ``--scratch-schema`` rather than ``--db``."""
SCRATCH_HINTS = {
    "unreachable": "the server did not answer: check the host, the port and that it runs",
    "authentication_failed": "the server refused the role's credentials",
    "database_missing": "the database the URL names does not exist",
    "read_only_role": "conform makes (and drops) a scratch schema: the role needs CREATE on the database",
    "scratch_schema_exists": "that schema exists: name another (conform never works in an existing one)",
    "scratch_schema_reserved": "names starting with pg_ are PostgreSQL's own: name another",
    "sqlite_has_no_schemas": "--scratch-schema is for PostgreSQL; SQLite's scratch area is a folder beside the file",
    "sqlite_path_is_a_folder": "--db names a folder: name the SQLite file (it need not exist)",
    "scratch_reset_failed": "a run changed the migration's own rows: report it as a divergence",
    "sqlite_folder_missing": "the folder of the SQLite file does not exist",
    "sqlite_folder_not_writable": "conform makes a scratch folder beside the SQLite file: the folder must be writable",
}
"""What to do about each reason a scratch area was refused."""
NOT_NEEDED_UNDER_TRANSACTION_POOLER = frozenset({"listen_notify", "prepared_statements"})
"""Facts tenure does without under ``pooler=transaction`` (workers poll; statements are
parsed each time): reported, never counted against the database."""


def add_conform_parser(commands: Any, help_line: str = COMMAND_HELP_LINE) -> None:
    conform = commands.add_parser("conform", help=help_line)
    conform.add_argument("--db", default=None, help="database URL (default: $TENURE_DB)")
    conform.set_defaults(database_required=True)
    conform.add_argument("--machines", default=",".join(MACHINE_CHOICES),
                         help=f"comma-separated, any of {', '.join(MACHINE_CHOICES)} (default: all)")
    conform.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                         help=f"lockstep steps per machine ({STEPS_RANGE[0]:,} to {STEPS_RANGE[1]:,}, "
                              f"default {DEFAULT_STEPS:,})")
    conform.add_argument("--seed", type=int, default=None,
                         help=f"make the runs repeatable ({SEED_RANGE[0]} to {SEED_RANGE[1]:,}; default: random)")
    conform.add_argument("--rules", default=None,
                         help="comma-separated rule names: run only these rules of the chosen machines (to narrow "
                              "down a divergence; default: every rule)")
    conform.add_argument("--no-shrink", action="store_true",
                         help="report a divergence as found instead of shrinking it first (Hypothesis shrinks "
                              "for up to five minutes; the replay is then longer)")
    conform.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    conform.add_argument("--replay-dir", default=".", help="where a divergence's replay script is written "
                                                         "(default: the current folder)")
    conform.add_argument("--scratch-schema", default=None,
                         help="PostgreSQL: the scratch schema's name (default: a random tenure_conform_...; "
                              "refused if it exists)")


def _refusal(field: str, problem: str, hint: str, spelling: str | None = None) -> ArgumentsRefused:
    return ArgumentsRefused(fields=(field,), problems=(problem,), hints={field: hint},
                            spellings={field: spelling or "--" + field.replace("_", "-")})


def _settings(arguments: argparse.Namespace) -> dict[str, Any]:
    machines = [name.strip().lower() for name in str(arguments.machines).split(",") if name.strip()]
    if not machines or any(name not in MACHINE_CHOICES for name in machines):
        raise _refusal("machines", "unknown_machine", f"--machines takes any of {', '.join(MACHINE_CHOICES)}")
    if not STEPS_RANGE[0] <= arguments.steps <= STEPS_RANGE[1]:
        raise _refusal("steps", "integer_out_of_range", f"--steps takes {STEPS_RANGE[0]:,} to {STEPS_RANGE[1]:,}")
    if arguments.seed is not None and not SEED_RANGE[0] <= arguments.seed <= SEED_RANGE[1]:
        raise _refusal("seed", "integer_out_of_range", f"--seed takes {SEED_RANGE[0]} to {SEED_RANGE[1]:,}")
    replay_dir = pathlib.Path(arguments.replay_dir)
    if not replay_dir.is_dir() or not os.access(replay_dir, os.W_OK):
        raise _refusal("replay_dir", "folder_not_writable", "--replay-dir takes a folder you may write in")
    if arguments.scratch_schema is not None:
        from tenure.adapters.core.urls import check_schema_name

        try:
            check_schema_name(arguments.scratch_schema, "scratch_schema")
            if str(arguments.scratch_schema).lower().startswith("pg_"):
                raise ConfigValidationError("invalid_scratch_schema")
        except ConfigValidationError:
            raise _refusal("scratch_schema", "invalid_schema_name",
                           "--scratch-schema takes a plain identifier (letters, digits, _; at most 63)") from None
    rules = None
    if arguments.rules is not None:
        from tenure.conformance.lockstep.harness import rule_names
        from .runner import MACHINES

        rules = frozenset(name.strip() for name in str(arguments.rules).split(",") if name.strip())
        known = {rule for machine in machines if machine in MACHINES for rule in rule_names(MACHINES[machine].base)}
        if not rules or not rules <= known:
            raise _refusal("rules", "unknown_rule", "--rules takes rule names of the chosen machines "
                                                    "(see tenure.conformance.command.runner.MACHINES)")
    return {"machines": list(dict.fromkeys(machines)), "rules": rules, "steps": arguments.steps, "seed": arguments.seed,
            "replay_dir": replay_dir, "scratch_schema": arguments.scratch_schema, "json": arguments.json,
            "shrink": not arguments.no_shrink}


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal (at most 5 times a
    second), one line per quarter otherwise."""

    WIDTH = 30

    def __init__(self, label: str, total: int, stream: Any = None) -> None:
        self.label, self.total = label, total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.shown_at = 0.0
        self.quarter = -1

    def update(self, done: int) -> None:
        done = min(done, self.total)
        if self.tty:
            now = time.monotonic()
            if now - self.shown_at < 0.2 and done < self.total:
                return
            self.shown_at = now
            filled = self.WIDTH * done // self.total
            self.stream.write(f"\r{self.label:<28} [{'#' * filled}{'-' * (self.WIDTH - filled)}] {done:,}/{self.total:,}")
            self.stream.flush()
            return
        quarter = 4 * done // self.total
        if quarter > self.quarter:
            self.quarter = quarter
            self.stream.write(f"{self.label}: {done:,}/{self.total:,}\n")
            self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _showing(progress: Progress) -> Callable[[Counter], None]:
    def show(counter: Counter) -> None:
        check_stop()
        progress.update(counter.steps)

    return show


def database_label(db_url: str) -> tuple[str, str | None]:
    """The database as the tables name it (``postgresql (pooler=transaction)``), and its pooler's name."""
    from tenure.adapters.core.urls import parse_db_url

    target = parse_db_url(db_url)
    pooler = getattr(target, "pooler", None)
    pooler_name = None if pooler is None else getattr(pooler, "value", str(pooler))
    return (target.kind.value + ("" if pooler_name is None else f" (pooler={pooler_name})"), pooler_name)


def fact_rows(facts: list[Any], pooler: str | None) -> list[dict[str, Any]]:
    """The server facts as the table and ``--json`` show them: a failed fact that a
    transaction pooler does not need (:data:`NOT_NEEDED_UNDER_TRANSACTION_POOLER`) shows
    as ``not needed``, not ``FAIL``."""
    rows = []
    for fact in facts:
        needed = not (pooler == "transaction" and fact.name in NOT_NEEDED_UNDER_TRANSACTION_POOLER)
        verdict = "n/a" if fact.passed is None else ("pass" if fact.passed else ("FAIL" if needed else "not needed"))
        rows.append({"name": fact.name, "passed": fact.passed, "needed": needed, "verdict": verdict,
                     "reason": fact.reason})
    return rows


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
             for row in [headers, *rows]]
    return "\n".join(lines)


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: the run stops at its next step (a BaseException, so
    neither Hypothesis nor a handler of exceptions mistakes it for a failure)."""


@contextlib.contextmanager
def _stopping_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM stop the run at its next step, through :data:`STOP`; a second
    one is ignored while the scratch area is removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    def stop(number: int, frame: Any) -> None:
        STOP.set()

    previous = {number: signal.signal(number, stop) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


STOP = threading.Event()
"""Set by SIGINT or SIGTERM; every step of a run checks it (:func:`check_stop`)."""


def check_stop() -> None:
    if STOP.is_set():
        raise Interrupted()


def run_conform(arguments: argparse.Namespace) -> int:
    if importlib.util.find_spec("hypothesis") is None:
        raise _refusal("conform", "conform_not_installed", CONFORM_HINT, "tenure conform")
    settings = _settings(arguments)
    STOP.clear()
    with tempfile.TemporaryDirectory(prefix="tenure-conform-") as home, _stopping_on_signals():
        # Hypothesis keeps a folder of its own (.hypothesis in the current folder by
        # default): never in the user's folder, and gone at the end.
        from hypothesis.configuration import set_hypothesis_home_dir

        set_hypothesis_home_dir(home)
        return _conform(arguments, settings)


def _conform(arguments: argparse.Namespace, settings: dict[str, Any]) -> int:
    from tenure.adapters.core.urls import parse_db_url

    db_url = str(arguments.db)
    parse_db_url(db_url)  # a malformed URL is refused before anything is made
    label, pooler = database_label(db_url)
    from tenure.conformance.drivers.scratch import ScratchRefused, open_scratch

    try:
        area = asyncio.run(open_scratch(db_url, schema=settings["scratch_schema"]))
    except ScratchRefused as refused:
        field = "scratch_schema" if refused.reason in SCHEMA_REASONS else "db_url"
        raise ArgumentsRefused(fields=(field,), problems=(refused.reason,),
                               hints={field: SCRATCH_HINTS.get(refused.reason, "")},
                               spellings={field: "--scratch-schema" if field == "scratch_schema" else "--db"}) from None
    try:
        check_stop()
        return _conform_in(area, label, pooler, settings)
    except Interrupted:
        print("interrupted: the run stopped; the scratch area was removed", file=sys.stderr)
        return INTERRUPTED_STATUS
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the cleanup itself is not interrupted
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        asyncio.run(area.drop())


def _conform_in(area: Any, label: str, pooler: str | None, settings: dict[str, Any]) -> int:
    from tenure.conformance.drivers.facts import check_server_facts
    from tenure.conformance.lockstep.harness import rule_names
    from .runner import MACHINES, MachineResult, replay_script, run_machine

    started = time.perf_counter()
    facts = fact_rows(asyncio.run(check_server_facts(area.url, per_call_deadline_seconds=PER_CALL_DEADLINE_S)),
                       pooler)
    results: list[MachineResult] = []
    stores: list[Any] = []
    for name in settings["machines"]:
        if name == "stores":
            stores = _run_stores(area, settings)
            continue
        progress = Progress(f"{name} on {label}", settings["steps"])
        only = None if settings["rules"] is None else settings["rules"] & set(rule_names(MACHINES[name].base))
        if only is not None and not only:
            continue  # none of the rules asked for is this machine's
        result = run_machine(name, area, settings["steps"], seed=settings["seed"], only=only,
                             on_step=_showing(progress), label=label, shrink=settings["shrink"])
        progress.finish()
        if result.divergence is not None:
            path = _free_path(settings["replay_dir"], f"tenure-conform-replay-{name}")
            path.write_text(replay_script(result.divergence, database_kind=area.kind, pooler=pooler))
            path.chmod(0o755)
            result.divergence.replay_path = str(path)
        results.append(result)
    failed_facts = [fact for fact in facts if fact["verdict"] == "FAIL"]
    store_failures = [case for case in stores if case.failure is not None]
    conformant = (not failed_facts and not store_failures
                  and all(r.divergence is None and r.failure is None for r in results))
    if settings["json"]:
        print(json.dumps({
            "conformant": conformant, "database": label, "seconds": round(time.perf_counter() - started, 1),
            "facts": facts, "machines": [result.as_json() for result in results],
            "stores": [vars(case) for case in stores],
        }, indent=2, sort_keys=True))
    else:
        _print_tables(label, facts, results, stores)
        print(("conformant" if conformant else "NOT conformant")
              + f" ({round(time.perf_counter() - started, 1)} s; the scratch area was removed)")
    return 0 if conformant else 1


def _free_path(folder: pathlib.Path, stem: str) -> pathlib.Path:
    """``folder/stem.py``, or ``stem-2.py``, ``stem-3.py``, ...: an earlier replay is never overwritten."""
    path = folder / f"{stem}.py"
    number = 1
    while path.exists():
        number += 1
        path = folder / f"{stem}-{number}.py"
    return path


def _run_stores(area: Any, settings: dict[str, Any]) -> list[Any]:
    from tenure.conformance.drivers.stores import CASES, CHECKS, SNAPSHOT_CASES, check_stores

    examples = max(1, settings["steps"] // STORE_EXAMPLES_PER_STEP)
    checks = sum(len(CHECKS) if case in SNAPSHOT_CASES else len(CHECKS) - 1 for case in CASES)
    progress = Progress("stores", checks * examples)
    done = [0]

    def one() -> None:
        check_stop()
        done[0] += 1
        progress.update(done[0])

    results = check_stores(area, examples=examples, seed=settings["seed"], on_example=one)
    progress.finish()
    return list(results)


def _print_tables(label: str, facts: list[dict[str, Any]], results: list[Any], stores: list[Any]) -> None:
    print(f"server facts ({label})")
    print(_table(["fact", "verdict", "reason"], [[f["name"], f["verdict"], f["reason"]] for f in facts]))
    if results:
        print()
        print(f"lockstep ({label})")
        print(_table(
            ["machine", "steps", "runs", "rules exercised", "races", "divergences", "seconds"],
            [[r.machine, f"{r.steps:,}", f"{r.runs:,}", f"{r.rules_run}/{r.rules_total}", f"{r.races:,}",
              ("0" if r.divergence is None else "1") + ("" if r.failure is None else " (failed)"), f"{r.seconds:.1f}"]
             for r in results],
        ))
    if stores:
        print()
        print(f"store suite ({label})")
        print(_table(["case", "check", "examples", "verdict"],
                     [[c.case, c.check, str(c.examples), "pass" if c.failure is None else "FAIL"] for c in stores]))
    for result in results:
        if result.failure is not None:
            print()
            print(f"{result.machine} could not finish: {result.failure}")
        if result.divergence is None:
            continue
        divergence = result.divergence
        print()
        print(f"divergence in {result.machine}: {divergence.error}")
        print("shrunk command sequence:")
        for line in divergence.steps:
            print("    " + line)
        print(f"replay: python {divergence.replay_path} --db URL   (or TENURE_DB=URL)")
    for case in stores:
        if case.failure is not None:
            print()
            print(f"store suite failure in {case.case} ({case.check}):")
            print(case.failure)
