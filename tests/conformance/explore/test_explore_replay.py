"""An explorer trace of the queue, written as a replay script and run against real databases.

Under a mutant kernel the explorer finds a shortest trace breaking a property; replayed
against a database running the same mutant, every step and every stored job agrees with
the trace (the broken property reaches the database); replayed against a database
running tenure's kernel, the database departs from the trace where the mutant was wrong.
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
    sys.argv = ["explore", "--machines", "queue", "--replay-dir", sys.argv[2]]
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


def _run(*arguments: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(paths.ROOT / "tests" / "support")}
    return subprocess.run([sys.executable, "-P", *arguments], capture_output=True, text=True, timeout=HANG_GUARD_S,
                          check=False, env=environment, cwd=cwd)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_mutants_trace_replays_against_the_database_and_departs_from_tenures_kernel(
    database: str, tmp_path: pathlib.Path, pg_dsn: str
) -> None:
    mutant = "queue:release_spends_the_attempt"
    written = _run("-c", WRITE_UNDER_A_MUTANT, mutant, str(tmp_path), cwd=tmp_path)
    assert written.returncode == 1, written.stdout + written.stderr  # the explorer found the broken property
    assert "broken: release_returns_the_attempt" in written.stdout
    script = tmp_path / "tenure-explore-replay-queue.py"
    assert script.exists()
    db_url = f"sqlite:///{tmp_path / 'app.db'}" if database == "sqlite" else pg_dsn
    same = _run("-c", REPLAY_UNDER_A_MUTANT, mutant, str(script), "--db", db_url, cwd=tmp_path)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "pending a1 g1  pending a1 g1" in same.stdout  # the spent attempt, stored
    sound = _run(str(script), "--db", db_url, cwd=tmp_path)
    assert sound.returncode == 1, sound.stdout + sound.stderr
    assert "pending a1 g1  pending a0 g1  <--" in sound.stdout  # tenure's kernel gives the attempt back
    assert [path.name for path in tmp_path.iterdir()] == ["tenure-explore-replay-queue.py"]  # no scratch left
