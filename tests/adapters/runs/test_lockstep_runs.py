"""The Run kernels and the RunLedger in lockstep on the test servers
(:mod:`tenure.conformance.lockstep.runs` holds the machine and its model).
"""

from __future__ import annotations

import os

import adapter_support
import pytest

from tenure.adapters.runs.engine import AHEAD, FALLBACK
from tenure.conformance.lockstep.harness import COUNTERS, Counter, budget, machine_for, run_lockstep
from tenure.conformance.lockstep.runs import AHEAD_KINDS, MESSAGE_EVENTS, RunLockstep, missing_paths

LOCKSTEP_STEPS = budget({"sqlite": 2_500, "postgresql": 2_500})
"""Steps CI runs per database (``TENURE_LOCKSTEP_STEPS=N`` overrides; see docs/testing.md),
and past them, until every rule has run, at most :data:`EVERY_RULE_BY` steps. Every rule
has run by step 1,044 in a quiet run (measured December 2026); the rules a run chooses
depend on the database's answers, and a fresh-clone CI once ran 2,500 PostgreSQL steps
without choosing ``park``: the budget is now a floor with a cap, not a gamble (it was
3,500 flat; 6,000 before issue 48, 10,000 before that). The long runs (20,000 steps on
each) are ``.ci/soak``'s."""

EVERY_RULE_BY = 7_000
"""How far a run goes past :data:`LOCKSTEP_STEPS` for a rule that has not run yet (then
``every_rule_ran`` fails it)."""


@pytest.mark.slow
@pytest.mark.parametrize("database", adapter_support.AVAILABLE_DATABASES)
def test_the_run_kernels_and_the_ledger_stay_in_lockstep(
    database: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    adapter_support.prepare_machine_databases(database, request)
    machine = machine_for(RunLockstep, adapter_support.LockstepDatabases(database))
    covered = _both_paths if database == "postgresql" else None
    summary = run_lockstep(machine, LOCKSTEP_STEPS[database], step_count=150, every_rule_by=EVERY_RULE_BY,
                           covered=covered)
    with capsys.disabled():
        print("\n" + summary)
    adapter_support.every_rule_ran(machine)
    if database == "postgresql" and not os.environ.get("TENURE_LOCKSTEP_STEPS"):
        assert missing_paths(COUNTERS[machine.key()]) == [], "a decided-ahead command kind never took one of its paths"


def _both_paths(counter: Counter) -> bool:
    """Whether every command kind with a decided-ahead form was decided both ahead and by
    the fallback (PostgreSQL's decided-ahead statements; the rules that reach the
    fallback on purpose are ``decided_ahead_behind_a_rotation`` and
    ``concurrent_same_key_admissions``'s variant ``admission_behind_an_insert``)."""
    return not missing_paths(counter)



MESSAGE_RULES = frozenset({"admit", "publish", "claim", "send_message", "receive_message", "park",
                           "time_out_receives"})
"""The rules of the focused machine that sends, receives and times out messages: in the
whole machine, whose rules cancel or finish most Runs, a hop that holds its Run is rare,
and so is a receive that waits and a message that then fills it. Nothing here ends a
hop but a park (the sweep of a settled Run's receives is the whole machine's, and
``a_settle_loses_its_receive_sweep``'s below). It reaches every message event in 1,000
to 2,000 steps (a few seconds; measured December 2026), capped at 4,000."""


@pytest.mark.parametrize("database", adapter_support.AVAILABLE_DATABASES)
def test_the_lockstep_sends_receives_and_times_out_messages_in_agreement_with_the_kernels(
    database: str, request: pytest.FixtureRequest,
) -> None:
    adapter_support.prepare_machine_databases(database, request)
    machine = machine_for(RunLockstep, adapter_support.LockstepDatabases(database), only=MESSAGE_RULES)
    MESSAGE_EVENTS.pop(machine.key(), None)
    run_lockstep(machine, 400, step_count=100, every_rule_by=4_000,
                 covered=lambda counter: _every_message_event(machine.key()))
    assert _every_message_event(machine.key()), MESSAGE_EVENTS.get(machine.key())


def _every_message_event(key: str) -> bool:
    """Whether the run stored a message, filled a waiting receive with one (resuming its
    Run), took one at once, started a wait, replayed a send and a receive, and timed a
    receive out."""
    seen = MESSAGE_EVENTS.get(key, {})
    return all(seen.get(name, 0) > 0 for name in ("Queued", "Delivered", "Taken", "Waiting", "Replayed", "TimedOut"))


BROKEN_ENGINES: dict[str, frozenset[str] | None] = {
    "the_cas_skips_the_delivery": None,
    "the_cas_skips_the_run": None,
    "a_settle_loses_its_consent_sweep": frozenset({"admit", "claim", "create_consent", "settle"}),
    "a_settle_loses_its_receive_sweep": frozenset({"admit", "claim", "receive_message", "settle"}),
    "a_settle_does_not_count_containment": frozenset({"admit", "claim", "settle"}),
    "a_park_reads_the_run_owner_instead_of_the_named_one": frozenset({"admit", "claim", "create_consent", "submit_job", "park"}),
    "a_settle_loses_its_checkpoint_delete": frozenset({"admit", "claim", "save_checkpoint", "settle"}),
    "a_timer_park_loses_its_checkpoint": frozenset({"admit", "claim", "park_timer"}),
    "a_resume_loses_its_publication": frozenset({"admit", "claim", "park_timer", "resume"}),
    "a_resume_reads_no_owner": frozenset({"admit", "claim", "create_consent", "decide_consent", "park", "resume"}),
}
"""Broken Run engines (``test_run_engine_mutants.BREAKAGES``) the Run lockstep must catch
on its own, without a scenario written for them; the rules a focused machine keeps to
reach the broken path sooner (None: every rule). Since the rules aim at the model's live
Runs and the model keeps the Runs' checkpoints (issue 49), every one of them but the
refused settle's lost outcome record is caught here: the ``resume`` rule also resumes
and publishes in one call the way the worker does (``resume_and_publish``, comparing
the hop the broker holds), so a resume that loses its publication answers None where
the model opened a hop; a resume that reads no owner refuses a resume the model applies
(its focused machine took 33 s on PostgreSQL before the decided-ahead paths and the
aimed verdicts, about 1 s now, measured December 2026). The refused settle's outcome
record is written only by the worker's settle (``RunEngine.settle(record=True)``), which
no rule sends: its scenario catches it."""


@pytest.mark.parametrize("breakage", sorted(BROKEN_ENGINES))
@pytest.mark.parametrize("database", adapter_support.AVAILABLE_DATABASES)
def test_the_lockstep_catches_a_broken_run_engine(
    database: str, breakage: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    from test_run_engine_mutants import BREAKAGES

    adapter_support.prepare_machine_databases(database, request)
    BREAKAGES[breakage][0](monkeypatch)
    machine = machine_for(RunLockstep, adapter_support.LockstepDatabases(database), only=BROKEN_ENGINES[breakage])
    findings = adapter_support.lockstep_findings(machine, max_examples=200, step_count=40)
    assert findings, breakage


BROKEN_PATHS: dict[str, tuple[str, frozenset[str]]] = {
    "the_engine_never_decides_ahead": (AHEAD, frozenset({"admit", "claim", "decided_ahead_behind_a_rotation"})),
    "the_engine_never_falls_back": (FALLBACK, frozenset({"admit", "claim", "decided_ahead_behind_a_rotation"})),
}
"""Broken Run engines on PostgreSQL (``test_run_engine_paths.BREAKAGES``) that decide every
command right, but never take one of the engine's two paths: the transaction path is the
reference, so an engine that never decides ahead answers every step as the model does,
and only the path counts show it; one that never falls back answers a command behind a
concurrent commit wrongly, or never counts a fallback. Each with the path it never
takes and the rules of the focused machine that catches it."""


@pytest.mark.parametrize("breakage", sorted(BROKEN_PATHS))
def test_the_postgresql_lockstep_catches_an_engine_that_never_takes_one_of_its_paths(
    breakage: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
) -> None:
    from test_run_engine_paths import BREAKAGES

    if "postgresql" not in adapter_support.AVAILABLE_DATABASES:
        pytest.skip("no PostgreSQL server")
    adapter_support.prepare_machine_databases("postgresql", request)
    BREAKAGES[breakage][0](monkeypatch)
    never, only = BROKEN_PATHS[breakage]
    machine = machine_for(RunLockstep, adapter_support.LockstepDatabases("postgresql"), only=only)
    try:
        run_lockstep(machine, 300, step_count=40, shrink=False)
    except Exception:  # noqa: BLE001 - a finding (kept in the counter), or Hypothesis's report of one
        pass
    counter = COUNTERS[machine.key()]
    taken = {path for by_path in counter.paths.values() for path in by_path}
    assert taken, "the engine decided no command with a decided-ahead form"
    if never == AHEAD:  # the answers are the reference's: only the counts see it, for every kind
        assert counter.findings == []
        assert {kind for kind, path in missing_paths(counter) if path == AHEAD} == {kind.value for kind in AHEAD_KINDS}
    else:  # a command behind a concurrent commit: the rule that planted it sees no fallback
        assert any("never fell back" in finding for finding in counter.findings), counter.findings

