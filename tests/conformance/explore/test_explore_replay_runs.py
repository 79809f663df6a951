"""An explorer trace of workflow Runs, written as a replay script and run against real
databases.

Under a mutant of the Run, consent, delegated-job or node machine, the explorer finds a
shortest trace breaking a property; replayed against a database running the same
mutant, every decision and every stored record agrees with the trace; replayed against
a database running tenure's kernel, the database departs from the trace at the step
where the mutant was wrong. Traces of tenure's own kernel that reach a consent sweep, a
restart's reconciliation, a retried lost hop, a takeover, a due timer, an expired
deadline and a Run timed out by a relay replay without a departure. A trace whose clock stands a microsecond before an
instant cannot be followed by a database whose clock keeps running: it is reported not
replayable, never as a departure or an agreement.
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
SCRIPT = "tenure-explore-replay-runs.py"

WRITE_ONE_WORLD = textwrap.dedent("""
    # Explore one standard Run world (under a mutant, or to a witness of tenure's kernel)
    # and write its trace as --replay-dir does: the command line explores every world.
    import pathlib
    import sys
    import kernel_mutants
    mutant, world, witness, folder = sys.argv[1:]
    if mutant != "-":
        kernel_mutants.apply(mutant)
    from tenure.conformance.explore.replays.runs import replay_script
    from tenure.kernel.core import Applied
    from tenure.conformance.explore import engine, runs
    WITNESSES = {
        "sweep": lambda last: [d for d in last if d.actor == "ledger (sweep)"],
        "restart": lambda last: [d for d in last if type(d.command).__name__ == "Boot"]
                                and [d for d in last if d.machine == "runs"],
        "retry": lambda last: [d for d in last if type(d.command).__name__ == "RetryLost"],
        "takeover": lambda last: [d for d in last if type(d.command).__name__ == "TakeOver"]
                                 and [d for d in last if d.machine == "runs"],
        "timer": lambda last: [d for d in last if type(d.command).__name__ == "Resume"
                               and d.command.owner_id.startswith("sleep")],
        "deadline": lambda last: [d for d in last if type(d.command).__name__ == "DecideConsent"
                                  and d.command.verdict.value == "expired"],
        "timeout": lambda last: [d for d in last if type(d.command).__name__ == "TimeOut"]
                                and [d for d in last if type(d.command).__name__ == "FinishCancel"],
    }
    model, depth = next((model, depth) for model, depth in runs.STANDARD if model.bounds.name == world)
    if witness != "-":
        reached = lambda before, step, after: "reached" if [
            d for d in WITNESSES[witness](after.last) if isinstance(d.decision, Applied)] else None
        model.properties = (engine.Property("witness", "-", "a step tenure's kernel takes", step=reached),)
    violation = engine.explore(model, max_depth=depth, max_states=400_000).violation
    assert violation is not None
    table = engine.trace_table(violation, model.describe)
    pathlib.Path(folder, "tenure-explore-replay-runs.py").write_text(
        replay_script(model, violation.initial, violation.trace, table))
""")

WRITE_ON_THE_COMMAND_LINE = textwrap.dedent("""
    import runpy
    import sys
    import kernel_mutants
    kernel_mutants.apply(sys.argv[1])
    sys.argv = ["explore", "--machines", "runs", "--replay-dir", sys.argv[2]]
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

REPLAY_COUNTING_PATHS = textwrap.dedent("""
    # The replay with every Run engine telling which path each command took (the
    # adapters' test seam), printed as one line at exit.
    import atexit
    import collections
    import runpy
    import sys
    from tenure.adapters.runs import engine as run_engine
    taken = collections.Counter()
    built = run_engine.RunEngine.__init__
    def counting(self, engine):
        built(self, engine)
        self.path_observer = lambda kind, path: taken.update([f"{kind.value}:{path}"])
    run_engine.RunEngine.__init__ = counting
    atexit.register(lambda: print("engine paths:", " ".join(f"{key}={count}" for key, count in sorted(taken.items()))))
    script = sys.argv[1]
    sys.argv = [script, *sys.argv[2:]]
    runpy.run_path(script, run_name="__main__")
""")

DEPARTS_FROM_TENURES_KERNEL = {
    # (mutant, world): the first line where the database running tenure's kernel departs
    ("runs:resume_without_owner_check", "consents"):
        "7 resumer resumes naming run-1 by consent-1-1: runs Resume applied refused owner_undecided <--",
    ("consent:second_verdict_wins", "consents"):
        "6 principal-p denies consent-1-1: consent DecideConsent applied refused already_decided <--",
    ("consent:expire_before_the_deadline", "consents"):
        "5 deadline owner expires consent-1-1: consent DecideConsent applied refused not_due <--",
    ("runs:cancelled_without_containment", "delegates"):
        "7 operator finishes the cancel run-1 (broker: complete): runs FinishCancel applied refused "
        "containment_unproven <--",
    ("agent_jobs:result_adopted_twice", "delegates"):
        "6 runtime reports failed job-1-1: agent_jobs AdoptResult applied refused already_finished <--",
    # A timer parked one second ahead: the database holds that margin.
    ("runs:timer_resumed_before_due", "hops"):
        "5 resumer resumes naming run-1 by sleep:0: runs Resume applied refused timer_not_due <--",
    # The Run's deadline lies 30 s ahead when the deadline owner's time_out is sent.
    ("runs:time_out_before_the_deadline", "deadlines"):
        "2 deadline owner times out run-1: runs TimeOut applied refused deadline_not_due <--",
    ("runs:settle_over_cancelling", "recovery"):
        "6 w1 settles (done) run-1/0: runs Settle applied refused cancelling <--",
    ("nodes:renewal_after_expiry", "leases"): "2 node-b#1 renews its lease: nodes Renew applied refused lease_expired <--",
    ("nodes:takeover_claim_stolen", "takers"):
        "3 node-b takes over node-c: nodes TakeOver applied refused takeover_in_progress <--",
}
"""Mutants of the four machines a Run world decides with, in the world each is first
caught in (a Run world's mutant is caught in several)."""

WITNESSES = {
    # witness: (world, a line of the replay that shows it was sent)
    "sweep": ("consents", "5 w1 settles (done) run-1/0: consent CancelPending swept swept"),
    "restart": ("hops", "2 node-a restarts (boot, reconcile): nodes Boot applied applied"),
    "retry": ("delegates", "runs RetryLost applied applied"),
    "takeover": ("leases", "node-a takes over node-b: nodes TakeOver applied applied"),
    "timer": ("hops", "resumer resumes naming run-1 by sleep:0: runs Resume applied applied"),
    "deadline": ("consents", "deadline owner expires consent-1-1: consent DecideConsent applied applied"),
    "timeout": ("deadlines", "relay a relay round: runs TimeOut applied applied"),
}
"""Steps of tenure's own kernel the replay must follow without a departure."""


def _run(*arguments: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(paths.ROOT / "tests" / "support")}
    return subprocess.run([sys.executable, "-P", *arguments], capture_output=True, text=True, timeout=HANG_GUARD_S,
                          check=False, env=environment, cwd=cwd)


def _lines(output: str) -> list[str]:
    """The table's lines with their padding collapsed (column widths follow the trace)."""
    return [" ".join(line.split()) for line in output.splitlines()]


def _departures(output: str) -> list[str]:
    return [line for line in _lines(output) if line.endswith("<--")]


def _written(tmp_path: pathlib.Path, *, mutant: str = "-", world: str, witness: str = "-") -> pathlib.Path:
    written = _run("-c", WRITE_ONE_WORLD, mutant, world, witness, str(tmp_path), cwd=tmp_path)
    assert written.returncode == 0, written.stdout + written.stderr
    return tmp_path / SCRIPT


def _db_url(database: str, tmp_path: pathlib.Path, pg_dsn: str) -> str:
    return f"sqlite:///{tmp_path / 'app.db'}" if database == "sqlite" else pg_dsn


def _replay_agrees_under(mutant: str, script: pathlib.Path, db_url: str, tmp_path: pathlib.Path) -> None:
    same = _run("-c", REPLAY_UNDER_A_MUTANT, mutant, str(script), "--db", db_url, cwd=tmp_path)
    assert same.returncode == 0, same.stdout + same.stderr
    assert not _departures(same.stdout)
    assert "the database answered every step as the trace's kernel decided" in same.stdout


@pytest.mark.parametrize(("mutant", "world"), sorted(DEPARTS_FROM_TENURES_KERNEL))
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_mutants_run_trace_replays_against_the_database_and_departs_from_tenures_kernel(
    database: str, mutant: str, world: str, tmp_path: pathlib.Path, pg_dsn: str
) -> None:
    script = _written(tmp_path, mutant=mutant, world=world)
    db_url = _db_url(database, tmp_path, pg_dsn)
    _replay_agrees_under(mutant, script, db_url, tmp_path)
    sound = _run(str(script), "--db", db_url, cwd=tmp_path)
    assert sound.returncode == 1, sound.stdout + sound.stderr
    assert _departures(sound.stdout)[0] == DEPARTS_FROM_TENURES_KERNEL[(mutant, world)]
    assert [path.name for path in tmp_path.iterdir()] == [SCRIPT]  # no scratch left


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_the_command_line_writes_a_run_replay_that_departs_where_the_claim_lost_its_claimant(
    database: str, tmp_path: pathlib.Path, pg_dsn: str
) -> None:
    # The mutant breaks every Run world within a few actions; the last one written is the
    # delegates world's: a claim whose acknowledgement was lost, sent again.
    mutant = "runs:claim_records_the_node_not_the_claimant"
    written = _run("-c", WRITE_ON_THE_COMMAND_LINE, mutant, str(tmp_path), cwd=tmp_path)
    assert written.returncode == 1, written.stdout + written.stderr
    assert "runs/delegates: 1 workers x 1 Runs" in written.stdout
    script = tmp_path / SCRIPT
    db_url = _db_url(database, tmp_path, pg_dsn)
    _replay_agrees_under(mutant, script, db_url, tmp_path)
    sound = _run(str(script), "--db", db_url, cwd=tmp_path)
    assert sound.returncode == 1, sound.stdout + sound.stderr
    departures = _departures(sound.stdout)
    # tenure's kernel records the claimant, so the stored delivery departs first, then the
    # claim sent again is answered (the mutant's kernel refused it).
    assert departures[0].startswith("3 stored run-1 running@0 (claimed)")
    assert "[differs: delivery.claimed_by]" in departures[0]
    assert departures[1] == ("4 w1 claim again (same token) run:run-1:0 (refused: not_queued): runs Claim "
                             "refused not_queued applied <--")


@pytest.mark.parametrize("witness", sorted(WITNESSES))
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_trace_of_tenures_kernel_replays_without_a_departure(
    database: str, witness: str, tmp_path: pathlib.Path, pg_dsn: str
) -> None:
    world, shown = WITNESSES[witness]
    script = _written(tmp_path, world=world, witness=witness)
    replayed = _run(str(script), "--db", _db_url(database, tmp_path, pg_dsn), cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert any(shown in line for line in _lines(replayed.stdout)), replayed.stdout
    assert not _departures(replayed.stdout)


def test_a_trace_of_tenures_kernel_replays_on_postgresql_through_the_decided_ahead_path(
    tmp_path: pathlib.Path, pg_dsn: str
) -> None:
    # The timer witness's trace admits, publishes and claims: on PostgreSQL each of those
    # is decided ahead (one statement) as the ledger's callers send it.
    world, shown = WITNESSES["timer"]
    script = _written(tmp_path, world=world, witness="timer")
    replayed = _run("-c", REPLAY_COUNTING_PATHS, str(script), "--db", pg_dsn, cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert any(shown in line for line in _lines(replayed.stdout)), replayed.stdout
    counts = dict(pair.split("=") for line in _lines(replayed.stdout) if line.startswith("engine paths:")
                  for pair in line.removeprefix("engine paths:").split())
    for kind in ("admit", "record_published", "claim"):
        assert int(counts.get(f"{kind}:ahead", 0)) >= 1, counts


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_step_a_microsecond_before_a_deadline_is_not_replayable(
    database: str, tmp_path: pathlib.Path, pg_dsn: str
) -> None:
    # The mutant expires a consent a second early; its trace stands the clock a
    # microsecond before the deadline, which a database clock that keeps running cannot
    # hold: neither kernel's replay judges the step.
    mutant = "consent:expire_a_second_early"
    script = _written(tmp_path, mutant=mutant, world="consents")
    db_url = _db_url(database, tmp_path, pg_dsn)
    for replayed in (_run("-c", REPLAY_UNDER_A_MUTANT, mutant, str(script), "--db", db_url, cwd=tmp_path),
                     _run(str(script), "--db", db_url, cwd=tmp_path)):
        assert replayed.returncode == 1, replayed.stdout + replayed.stderr
        assert _departures(replayed.stdout) == ["5 the database clock an instant 1 us ahead not replayable <--"]
        assert "could not follow the trace past the step marked not replayable" in replayed.stdout
        assert "deadline owner expires" not in replayed.stdout  # never sent


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_recovery_mutants_verdict_never_reaches_the_database(
    database: str, tmp_path: pathlib.Path, pg_dsn: str
) -> None:
    # The mutant lets a relay fail a held admission whose caller lives: a verdict that
    # breaks the recovery rules, which the ledger (and the world) never execute. The
    # replay sends decisions, not verdicts, so both kernels agree with the trace.
    mutant = "recovery:held_failed_by_relay"
    script = _written(tmp_path, mutant=mutant, world="admissions")
    db_url = _db_url(database, tmp_path, pg_dsn)
    _replay_agrees_under(mutant, script, db_url, tmp_path)
    sound = _run(str(script), "--db", db_url, cwd=tmp_path)
    assert sound.returncode == 0, sound.stdout + sound.stderr
