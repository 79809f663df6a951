"""The kernel's PEP 316 contracts can be evaluated, and the CrossHair gate can fail."""

from __future__ import annotations

import ast
import builtins
import inspect
import os
import subprocess
import sys

import paths
import pytest

import tenure.kernel.agent_jobs.contracts as agent_job_contracts
import tenure.kernel.attempts.contracts as attempt_contracts
import tenure.kernel.consents.contracts as consent_contracts
import tenure.kernel.messages.contracts as message_contracts
import tenure.kernel.nodes.contracts as node_contracts
import tenure.kernel.queue.contracts as queue_contracts
import tenure.kernel.queue.machine as queue_machine
import tenure.kernel.replay.table as replay_table
import tenure.kernel.runs.contracts as run_contracts

ROOT = paths.ROOT
CONTRACT_MODULES = [queue_contracts, queue_machine, attempt_contracts, run_contracts, consent_contracts,
                    agent_job_contracts, node_contracts, replay_table, message_contracts]


def _conditions(function: object) -> list[str]:
    doc = inspect.getdoc(function) or ""
    return [line.split(":", 1)[1].strip() for line in doc.splitlines() if line.strip().startswith(("pre:", "post:"))]


def test_every_name_in_a_contract_resolves_in_its_module() -> None:
    # CrossHair evaluates pre/post lines in the function's module; a name that is not
    # importable there turns every check into "Unable to meet precondition", a gate
    # that cannot fail. (A linter once removed such imports as unused.)
    checked = 0
    for module in CONTRACT_MODULES:
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ != module.__name__:
                continue
            parameters = set(inspect.signature(function).parameters) | {"__return__"}
            for condition in _conditions(function):
                for node in ast.walk(ast.parse(condition, mode="eval")):
                    if isinstance(node, ast.Name):
                        known = node.id in parameters or hasattr(builtins, node.id) or node.id in vars(module)
                        assert known, f"{module.__name__}.{name}: {node.id!r} is not defined"
                checked += 1
    assert checked >= 150


def test_every_machine_contracts_module_of_the_kernel_is_checked_here() -> None:
    kernel = ROOT / "kernel"
    found = {f"tenure.kernel.{path.parent.name}.contracts" for path in kernel.glob("*/contracts.py")}
    assert found <= {module.__name__ for module in CONTRACT_MODULES}


CROSSHAIR_MUTANTS = [
    # (mutant, target, budget): the budget is CPU seconds per condition, three times what
    # the search needed to reach the planted bug (measured December 2026 with CrossHair
    # 0.0.114: each mutant is still caught with a third of its budget; 3 s at least).
    ("queue:reuse_generation", "queue.contracts.decide_claim_owned", 6),
    ("queue:legacy_write_on_owned_claim", "queue.contracts.decide_complete_legacy", 9),
    ("queue:skip_owner_check", "queue.contracts.decide_complete_owned", 3),
    ("attempts:resubmit_without_proof", "attempts.contracts.decide_begin_submit", 3),
    ("attempts:fabricate_failure_on_timeout", "attempts.contracts.decide_record_ambiguous", 6),
    ("attempts:accept_second_identity", "attempts.contracts.decide_record_accepted", 9),
    ("runs:claim_ignores_sequence", "runs.contracts.decide_claim", 3),
    # Found at 10 to 12 s since issue 50 widened the Run machine (the message wait); a search
    # stops once it finds, so the larger budget costs about 2 s more (21 s in all).
    ("runs:resume_without_owner_check", "runs.contracts.decide_resume", 30),
    ("consent:second_verdict_wins", "consents.contracts.decide_decide_consent", 3),
    ("consent:expire_before_the_deadline", "consents.contracts.decide_decide_consent", 3),
    ("agent_jobs:result_adopted_twice", "agent_jobs.contracts.decide_adopt_result", 6),
    # One of the replay table's three mutants (about 11 CPU-s each here): the behavioural
    # suite catches all three (tests/kernel/test_mutants.py), CrossHair this one.
    ("replay:recorded_answer_for_any_call", "replay.table.decide", 3),
    # Measured December 2026 as above: found at 2 s and at 4 s (not 3 s) per condition.
    ("messages:second_message_overwrites_the_first", "messages.contracts.decide_send", 6),
    ("messages:lost_hop_takes_a_message", "messages.contracts.decide_receive", 12),
]
"""Each condition the mutant leaves true is searched for its whole budget, so the budget
is most of a case's cost: a per-mutant budget instead of one generous budget for all
(20 s each cost three times the CPU)."""

CROSSHAIR_PATH_TIMEOUT_S = 4.5
"""Per path, fixed: CrossHair otherwise takes the square root of the condition budget,
and a different path timeout is a different search, whose time to the bug would have to
be measured again."""

CROSSHAIR_HANG_GUARD_S = 300
"""Only stops a hang: the searches' budgets are CPU time, counted by CrossHair itself, so a
loaded machine makes a search slower, never shorter."""


@pytest.mark.slow
@pytest.mark.parametrize(("mutant", "target", "budget"), CROSSHAIR_MUTANTS,
                         ids=[f"{mutant}-{target}" for mutant, target, _ in CROSSHAIR_MUTANTS])
def test_crosshair_finds_a_counterexample_in_a_broken_kernel(mutant: str, target: str, budget: float) -> None:
    finished = subprocess.run(
        [
            sys.executable, str(paths.SUPPORT / "crosshair_with_mutant.py"), mutant,
            "check", "--analysis_kind=PEP316", f"--per_condition_timeout={budget}",
            f"--per_path_timeout={CROSSHAIR_PATH_TIMEOUT_S}", f"tenure.kernel.{target}",
        ],
        cwd="/tmp",
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        capture_output=True,
        text=True,
        timeout=CROSSHAIR_HANG_GUARD_S,
    )
    assert finished.returncode == 1, finished.stdout[-2000:] + finished.stderr[-2000:]
    assert "error: false when calling" in finished.stdout
