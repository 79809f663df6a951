"""The attempts table (``tenure_attempts``), created by the ``attempts_v1`` step.

One row per attempt, in the same database as the queues (and, later, the Runs). The
spec's binding and policy revisions are canonical JSON text; refs, warnings and evidence
are JSON arrays of strings; instants follow the dialect (SQLAlchemy's DATETIME text on
SQLite, ``timestamptz`` on PostgreSQL), like every tenure table. Unique indexes:
``idempotency_key`` (a key names one effect, ever) and ``(owner_job_id, generation)``
(one attempt per generation).
"""

from __future__ import annotations

import functools

from sqlalchemy import BigInteger, Boolean, DateTime, Integer, String, Text

from tenure.kernel.attempts.machine import ATTEMPTS
from tenure.kernel.attempts.record import AttemptRow
from tenure.model import AttemptState

from ..core.tables import Binding, Codec, IndexSpec, MachineTables, RetirementGuard, Step, TableSpec, column

__all__ = ["ATTEMPTS_TABLE", "ATTEMPTS_BINDING", "ATTEMPTS_STEP", "ATTEMPT_OVERLAP_STEP", "MACHINE_TABLES"]

C = Codec
ATTEMPTS_STEP = Step("attempts_v1", 2)
"""``tenure_attempts``."""
ATTEMPT_OVERLAP_STEP = Step("attempts_v2", 12)
"""``tenure_attempts.granted_during_earlier_lease``: whether the latest transmission
was granted while an earlier one could still reach the provider (a rejection of the
latest then fails nothing). Existing rows get false: before this step the kernel
never recorded it, and a row whose latest grant overlapped an earlier one is read as
not overlapping (the rule the kernel had until then)."""
_RUNS_STEP = Step("runs_v1", 3)
"""The Run machine's first step, which indexes the attempts by Run."""
_STEP = ATTEMPTS_STEP
_INSTANT = DateTime(timezone=True)


_column = functools.partial(column, step=_STEP)


ATTEMPTS_TABLE = TableSpec(
    "tenure_attempts",
    (
        _column("attempt_id", C.TEXT, String(255), mutable=False, primary_key=True),
        _column("envelope", C.TEXT, String(64), mutable=False),
        _column("owner_job_id", C.TEXT, String(255), mutable=False),
        _column("run_id", C.OPTIONAL_TEXT, String(255), mutable=False),
        _column("station_attempt_id", C.OPTIONAL_TEXT, String(255), mutable=False),
        _column("generation", C.INT, Integer(), mutable=False),
        _column("request_digest", C.TEXT, String(71), mutable=False),
        _column("idempotency_key", C.TEXT, String(255), mutable=False),
        _column("binding_json", C.TEXT, Text(), mutable=False),
        _column("same_key_replay", C.FLAG, Boolean(), mutable=False),
        _column("lookup", C.FLAG, Boolean(), mutable=False),
        _column("target", C.TEXT, String(255), mutable=False),
        _column("source_refs", C.TEXTS, Text(), mutable=False),
        _column("working_refs", C.TEXTS, Text(), mutable=False),
        _column("destination", C.OPTIONAL_TEXT, String(255), mutable=False),
        _column("purpose", C.TEXT, String(255), mutable=False),
        _column("consent_decision", C.OPTIONAL_TEXT, String(255), mutable=False),
        _column("policy_revisions_json", C.TEXT, Text(), mutable=False),
        _column("reservation", C.OPTIONAL_TEXT, String(255), mutable=False),
        _column("spec_digest", C.TEXT, String(71), mutable=False),
        _column("state", C.ENUM, String(20), mutable=True, choices=AttemptState),
        _column("provider_job_id", C.OPTIONAL_TEXT, String(255), mutable=True),
        _column("transmissions", C.INT, Integer(), mutable=True),
        _column("transmission_egress", C.TEXTS, Text(), mutable=True),
        _column("denied_egress", C.TEXTS, Text(), mutable=True),
        _column("submit_lease_expires_at", C.OPTIONAL_INSTANT, _INSTANT, mutable=True,
                field="submit_lease_expires_at_us"),
        _column("no_effect_proof_for", C.OPTIONAL_INT, BigInteger(), mutable=True),
        column("granted_during_earlier_lease", C.FLAG, Boolean(), step=ATTEMPT_OVERLAP_STEP, mutable=True,
               default_sql="false"),
        _column("progress_cursor", C.OPTIONAL_TEXT, Text(), mutable=True),
        _column("result_refs", C.TEXTS, Text(), mutable=True),
        _column("diagnostic_refs", C.TEXTS, Text(), mutable=True),
        _column("usage_json", C.OPTIONAL_TEXT, Text(), mutable=True),
        _column("cost_json", C.OPTIONAL_TEXT, Text(), mutable=True),
        _column("warnings", C.TEXTS, Text(), mutable=True),
        _column("cancel_requested", C.FLAG, Boolean(), mutable=True),
        _column("evidence", C.TEXTS, Text(), mutable=True),
        _column("reservation_released", C.FLAG, Boolean(), mutable=True),
        _column("created_at", C.INSTANT, _INSTANT, mutable=False, field="created_at_us"),
        _column("updated_at", C.INSTANT, _INSTANT, mutable=True, field="updated_at_us"),
    ),
    indexes=(
        IndexSpec("ux_tenure_attempts_idempotency_key", ("idempotency_key",), unique=True, step=_STEP),
        IndexSpec("ux_tenure_attempts_owner_generation", ("owner_job_id", "generation"), unique=True, step=_STEP),
        IndexSpec("ix_tenure_attempts_unresolved", ("state", "created_at", "attempt_id"), step=_STEP),
        # Added with the Run ledger: a Run's containment reads the attempts of its Run.
        IndexSpec("ix_tenure_attempts_run", ("run_id", "state"), step=_RUNS_STEP),
    ),
    created_by=_STEP,
    exact_unique_columns=("idempotency_key",),
)

ATTEMPTS_BINDING = Binding("attempts", ATTEMPTS, ATTEMPTS_TABLE, AttemptRow, {}, "attempt_id")
"""The attempt machine's records in ``tenure_attempts``."""

MACHINE_TABLES = MachineTables(
    machine=ATTEMPTS,
    tables=(ATTEMPTS_TABLE,),
    bindings=(ATTEMPTS_BINDING,),
    # Every attempt guards an effect (and its prepare replay): none may be dropped.
    retirement_guards=(
        RetirementGuard(ATTEMPTS_STEP, ATTEMPTS_TABLE.name, "attempt_id", "no recorded attempts", "TRUE",
                        "attempts_remain"),
    ),
)
