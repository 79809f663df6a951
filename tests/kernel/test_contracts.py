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
import tenure.kernel.nodes.contracts as node_contracts
import tenure.kernel.queue.contracts as queue_contracts
import tenure.kernel.queue.machine as queue_machine
import tenure.kernel.runs.contracts as run_contracts

ROOT = paths.ROOT
CONTRACT_MODULES = [queue_contracts, queue_machine, attempt_contracts, run_contracts, consent_contracts,
                    agent_job_contracts, node_contracts]


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


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mutant", "target"),
    [
        ("queue:reuse_generation", "queue.contracts.decide_claim_owned"),
        ("queue:legacy_write_on_owned_claim", "queue.contracts.decide_complete_legacy"),
        ("queue:skip_owner_check", "queue.contracts.decide_complete_owned"),
        ("attempts:resubmit_without_proof", "attempts.contracts.decide_begin_submit"),
        ("attempts:fabricate_failure_on_timeout", "attempts.contracts.decide_record_ambiguous"),
        ("attempts:accept_second_identity", "attempts.contracts.decide_record_accepted"),
        ("runs:claim_ignores_sequence", "runs.contracts.decide_claim"),
        ("runs:resume_without_owner_check", "runs.contracts.decide_resume"),
        ("consent:second_verdict_wins", "consents.contracts.decide_decide_consent"),
        ("consent:expire_before_the_deadline", "consents.contracts.decide_decide_consent"),
        ("agent_jobs:result_adopted_twice", "agent_jobs.contracts.decide_adopt_result"),
    ],
)
def test_crosshair_finds_a_counterexample_in_a_broken_kernel(mutant: str, target: str) -> None:
    finished = subprocess.run(
        [
            sys.executable, str(paths.SUPPORT / "crosshair_with_mutant.py"), mutant,
            # Wall time per condition: on a loaded 2-core machine (CI runs CrossHair over the
            # whole kernel alongside) 5 s was not always enough to reach a planted bug.
            "check", "--analysis_kind=PEP316", "--per_condition_timeout=20",
            f"tenure.kernel.{target}",
        ],
        cwd="/tmp",
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finished.returncode == 1, finished.stdout[-2000:] + finished.stderr[-2000:]
    assert "error: false when calling" in finished.stdout
