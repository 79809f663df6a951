"""An explorer trace of the service-attempt machine, written as a replay script and run
against real databases.

Under a mutant kernel the explorer finds a shortest trace breaking a property; replayed
against a database running the same mutant, every decision and every stored attempt
agrees with the trace (the broken property reaches the database); replayed against a
database running tenure's kernel, the database departs from the trace at the step where
the mutant was wrong. A mutant whose decided record breaks a record invariant never
reaches the database at all: the engine's own check refuses to store it.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import paths
import pytest

HANG_GUARD_S = 600

WRITE_UNDER_A_MUTANT = textwrap.dedent("""
    import runpy
    import sys
    import kernel_mutants
    kernel_mutants.apply(sys.argv[1])
    sys.argv = ["explore", "--machines", "attempts", "--replay-dir", sys.argv[2]]
    runpy.run_module("tenure.conformance.explore", run_name="__main__")
""")

REPLAY_UNDER_A_MUTANT = textwrap.dedent("""
    import runpy
    import sys
    import kernel_mutants
    kernel_mutants.apply(sys.argv[1])
    script = sys.argv[2]
    sys.argv = [script, *sys.argv[3:]]
    runpy.run_path(script, run_name="__main__")
""")

SCRIPT = "tenure-explore-replay-attempts.py"

DEPARTS_FROM_TENURES_KERNEL = {
    # mutant: (the transition rule its trace breaks first, the first line where tenure's kernel departs)
    "rejection_of_any_transmission_fails": (
        "g1 record_failed breaks TR-A4",
        "6 sender-1 record_failed g1#1 -> failed applied refused stale_transmission <--",
    ),
    "fabricate_failure_on_timeout": (
        "g1 record_ambiguous breaks TR-A4",
        # Applied on both sides, but tenure's kernel stores INDETERMINATE, never FAILED.
        "4 stored g1 failed #1 lease live g1 indeterminate #1 lease live [differs: state] <--",
    ),
    "not_found_judged_when_decided": (
        # A not-found held across a step of the clock: its instant moved back with the
        # stored ones, so the database judges it at its lookup, during the lease.
        "g1 reconcile breaks TR-A9",
        "5 reconciler reconcile g1 with the not-found it held -> submitting applied refused submit_lease_live <--",
    ),
    "prepare_ignores_closed_run": (
        "g1 prepare breaks TR-A10",
        "2 sender-1 prepare g1 -> prepared applied refused run_closed <--",
    ),
}
"""Each mutant's trace, and where the database running tenure's kernel departs from it."""


def _run(*arguments: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(paths.ROOT / "tests" / "support")}
    return subprocess.run([sys.executable, "-P", *arguments], capture_output=True, text=True, timeout=HANG_GUARD_S,
                          check=False, env=environment, cwd=cwd)


def _lines(output: str) -> list[str]:
    """The table's lines with their padding collapsed (column widths follow the trace)."""
    return [" ".join(line.split()) for line in output.splitlines()]


def _departures(output: str) -> list[str]:
    return [line for line in _lines(output) if line.endswith("<--")]


def _steps(output: str) -> int:
    """The trace steps the table lists (each a decision line and a ``stored`` line)."""
    return len({line.split()[0] for line in _lines(output) if line[:1].isdigit()})


def _written(mutant: str, tmp_path: pathlib.Path) -> pathlib.Path:
    written = _run("-c", WRITE_UNDER_A_MUTANT, f"attempts:{mutant}", str(tmp_path), cwd=tmp_path)
    assert written.returncode == 1, written.stdout + written.stderr  # the explorer found the broken property
    script = tmp_path / SCRIPT
    assert script.exists(), written.stdout
    return script


def _db_url(database: str, tmp_path: pathlib.Path, pg_dsn: str) -> str:
    return f"sqlite:///{tmp_path / 'app.db'}" if database == "sqlite" else pg_dsn


@pytest.mark.parametrize("mutant", sorted(DEPARTS_FROM_TENURES_KERNEL))
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_mutants_attempt_trace_replays_against_the_database_and_departs_from_tenures_kernel(
    database: str, mutant: str, tmp_path: pathlib.Path, pg_dsn: str
) -> None:
    broken, departure = DEPARTS_FROM_TENURES_KERNEL[mutant]
    script = _written(mutant, tmp_path)
    assert broken in script.read_text()  # the trace's table rides in the script's docstring
    db_url = _db_url(database, tmp_path, pg_dsn)
    same = _run("-c", REPLAY_UNDER_A_MUTANT, f"attempts:{mutant}", str(script), "--db", db_url, cwd=tmp_path)
    assert same.returncode == 0, same.stdout + same.stderr
    assert not _departures(same.stdout)
    assert "the database answered every step as the trace's kernel decided" in same.stdout
    # Every step's rows were compared.
    assert sum(line.split()[1:2] == ["stored"] for line in _lines(same.stdout)) == _steps(same.stdout) > 1
    sound = _run(str(script), "--db", db_url, cwd=tmp_path)
    assert sound.returncode == 1, sound.stdout + sound.stderr
    assert _departures(sound.stdout)[0] == departure
    assert [path.name for path in tmp_path.iterdir()] == [SCRIPT]  # no scratch left


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_mutant_record_that_breaks_an_invariant_is_refused_by_the_database_even_under_the_mutant(
    database: str, tmp_path: pathlib.Path, pg_dsn: str
) -> None:
    # The mutant releases the reservation of an INDETERMINATE attempt (INV-A6 broken):
    # the explorer's kernel checks catch the record, and so does the engine, which never
    # stores a decided record that breaks an invariant the old one kept.
    mutant = "release_while_indeterminate"
    script = _written(mutant, tmp_path)
    assert "broken: records_keep_their_invariants" in script.read_text()
    db_url = _db_url(database, tmp_path, pg_dsn)
    same = _run("-c", REPLAY_UNDER_A_MUTANT, f"attempts:{mutant}", str(script), "--db", db_url, cwd=tmp_path)
    assert same.returncode == 1, same.stdout + same.stderr
    assert _departures(same.stdout)[0] == (
        "5 operator release_reservation g1 -> indeterminate applied attempt_persistence_failed <--")
    assert [path.name for path in tmp_path.iterdir()] == [SCRIPT]
