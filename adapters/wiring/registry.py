"""The registry of machines' tables: what the migration runner creates, checks and
removes, and what the store conformance suite runs against. A new machine adds its
table module's names here (and its table's step to
:class:`tenure.adapters.core.tables.Step`); it imports table modules only."""

from __future__ import annotations

import dataclasses

# Table modules only: each imports nothing but the core, so the registry closes no circle.
from ..agent_jobs.table import AGENT_JOBS_BINDING, AGENT_JOBS_TABLE
from ..attempts.table import ATTEMPTS_BINDING, ATTEMPTS_TABLE
from ..consents.table import CONSENTS_BINDING, CONSENTS_TABLE
from ..nodes.table import NODES_BINDING, NODES_TABLE
from ..queue.table import HOPS_BINDING, HOPS_TABLE, QUEUE_BINDINGS, QUEUE_TABLES, TASKS_BINDING, TASKS_TABLE
from ..runs.table import (
    CHECKPOINTS_TABLE,
    DELIVERIES_BINDING,
    DELIVERIES_TABLE,
    RECOVERY_REPORTS_TABLE,
    RUNS_BINDING,
    RUNS_TABLE,
    STEPS_TABLE,
)
from ..core.tables import Binding, Step, TableSpec

__all__ = ["TABLES", "BINDINGS", "RUN_TABLES", "RetirementGuard", "RETIREMENT_GUARDS"]

RUN_TABLES: tuple[TableSpec, ...] = (RUNS_TABLE, DELIVERIES_TABLE, CONSENTS_TABLE, AGENT_JOBS_TABLE)
"""The tables step ``runs_v1`` creates, in its order: the Run machine's pair and its owners'."""

TABLES: tuple[TableSpec, ...] = (*QUEUE_TABLES.values(), ATTEMPTS_TABLE, *RUN_TABLES, CHECKPOINTS_TABLE, HOPS_TABLE,
                                 NODES_TABLE, STEPS_TABLE, TASKS_TABLE, RECOVERY_REPORTS_TABLE)
# The checkpoints table has a binding but no machine (it is evidence the Run machine's
# callers write under the Run's lock), so it is migrated here and not in BINDINGS. The
# Run hops' table is the queue machine's, in a table of the validation queue's shape. The
# step journal, like the checkpoints, is evidence without a machine; the recovery reports
# are diagnostics without a machine.
BINDINGS: tuple[Binding, ...] = (*QUEUE_BINDINGS.values(), ATTEMPTS_BINDING, RUNS_BINDING, DELIVERIES_BINDING,
                                 CONSENTS_BINDING, AGENT_JOBS_BINDING, HOPS_BINDING, NODES_BINDING, TASKS_BINDING)


@dataclasses.dataclass(frozen=True, slots=True)
class RetirementGuard:
    """Rows that forbid removing a step: ``SELECT count(*) FROM table WHERE condition``
    must be zero (``condition`` has one positional parameter, ``True``, when it says ``?``)."""

    table: str
    subject: str
    requirement: str
    condition: str
    problem: str


RETIREMENT_GUARDS: dict[Step, tuple[RetirementGuard, ...]] = {
    Step.OWNED: tuple(
        guard
        for spec in QUEUE_TABLES.values()
        for guard in (
            RetirementGuard(spec.name, "fence_required", "no protected submissions", "fence_required = ?",
                            "protected_submissions_remain"),
            RetirementGuard(spec.name, "claim_token", "no live owned claims",
                            "status = 'claimed' AND claim_token IS NOT NULL", "owned_claims_remain"),
        )
    ),
    Step.ATTEMPTS: (
        # Every attempt guards an effect (and its prepare replay): none may be dropped.
        RetirementGuard(ATTEMPTS_TABLE.name, "attempt_id", "no recorded attempts", "TRUE", "attempts_remain"),
    ),
    Step.RUNS: (
        # Runs are canonical workflow truth (and their owners the evidence a resume
        # reads): removing the step would lose them.
        RetirementGuard(RUNS_TABLE.name, "run_id", "no recorded runs", "TRUE", "runs_remain"),
    ),
    Step.WORKERS: (
        # A checkpoint is what a parked Run resumes from: dropping one strands its Run.
        RetirementGuard(CHECKPOINTS_TABLE.name, "run_id", "no saved checkpoints", "TRUE", "checkpoints_remain"),
        # A queued or running hop is a delivery some Run is waiting on.
        RetirementGuard(HOPS_TABLE.name, "status", "no queued or running hops",
                        "status IN ('pending', 'claimed')", "hops_remain"),
    ),
    Step.TASKS: (
        # A queued or running task is work someone deferred; a protected one is also the
        # record its submission ID replays against.
        RetirementGuard(TASKS_TABLE.name, "status", "no pending or claimed tasks", "status IN ('pending', 'claimed')",
                        "tasks_remain"),
        RetirementGuard(TASKS_TABLE.name, "fence_required", "no protected task submissions", "fence_required = ?",
                        "protected_submissions_remain"),
    ),
    # Step.RECOVERY and Step.ADMISSION_KEYS need no guard of their own: their column and
    # index live on tenure_runs, and runs_v1's guard already refuses the downgrade while
    # any Run exists. Step.REPORTS needs none either: a recovery report is a diagnostic
    # (the next pass writes it again), never evidence any Run is waiting on.
}
