"""The consents table, ``tenure_consents`` (schema step ``runs_v1``; ``runs_v5`` adds a
consent's deadline, ``expires_at``, and an index on it): one row per consent a Run asked
for. CHECK constraints hold a decision's parts together even against another writer."""

from __future__ import annotations

import functools

from sqlalchemy import DateTime, String, Text

from tenure.kernel.consents.machine import CONSENTS
from tenure.kernel.consents.record import ConsentRow
from tenure.model import ConsentStatus

from ..core.tables import Binding, Codec, ColumnSpec, IndexSpec, MachineTables, Step, TableSpec, column, one_of

__all__ = ["CONSENTS_TABLE", "CONSENTS_BINDING", "MACHINE_TABLES"]

C = Codec
_STEP = Step("runs_v1", 3)
"""The Run machine's first step, which creates the owners' tables with the Runs'."""
_LIVENESS = Step("runs_v5", 7)
"""Consent deadlines (with the Run machine's liveness)."""
_CONSOLE = Step("console_v1", 10)
_INSTANT = DateTime(timezone=True)
_column = functools.partial(column, step=_STEP)


CONSENTS_TABLE = TableSpec(
    "tenure_consents",
    (
        _column("consent_id", C.TEXT, String(36), mutable=False, primary_key=True),
        _column("run_id", C.TEXT, String(36), mutable=False),
        _column("tool_name", C.TEXT, String(128), mutable=False),
        _column("tool_call_id", C.TEXT, String(128), mutable=False),
        _column("payload_json", C.TEXT, Text(), mutable=False),
        _column("status", C.ENUM, String(10), mutable=True, choices=ConsentStatus),
        _column("decided_by", C.OPTIONAL_TEXT, String(255), mutable=True),
        _column("decided_at", C.OPTIONAL_INSTANT, _INSTANT, mutable=True, field="decided_at_us"),
        _column("preauthorized_by", C.OPTIONAL_TEXT, String(128), mutable=False),
        _column("created_at", C.INSTANT, _INSTANT, mutable=False, field="created_at_us"),
        # runs_v5 (liveness): the consent's deadline, which the relays apply (NULL: none).
        ColumnSpec("expires_at", "expires_at_us", C.OPTIONAL_INSTANT, _INSTANT, True, False, step=_LIVENESS),
    ),
    indexes=(
        IndexSpec("ix_tenure_consents_run", ("run_id", "status"), step=_STEP),
        # runs_v5: the relays' page of pending consents whose deadline came.
        IndexSpec("ix_tenure_consents_status_expires", ("status", "expires_at", "consent_id"), step=_LIVENESS),
        # console_v1: the console's inbox pages, each one range in its page's order: the
        # pending consents longest waiting first, the decided ones latest decision first
        # (a consent has its decided_at exactly when it is not pending).
        IndexSpec("ix_tenure_consents_status_created", ("status", "created_at", "consent_id"), step=_CONSOLE),
        IndexSpec("ix_tenure_consents_decided", ("decided_at", "consent_id"), step=_CONSOLE),
    ),
    created_by=_STEP,
    checks=(
        ("ck_tenure_consents_status", one_of("status", ConsentStatus)),
        ("ck_tenure_consents_decision",
         "(status = 'pending' AND decided_by IS NULL AND decided_at IS NULL) OR "
         "(status <> 'pending' AND decided_by IS NOT NULL AND decided_at IS NOT NULL)"),
    ),
)

CONSENTS_BINDING = Binding("consents", CONSENTS, CONSENTS_TABLE, ConsentRow, {}, "consent_id")

MACHINE_TABLES = MachineTables(machine=CONSENTS, tables=(CONSENTS_TABLE,), bindings=(CONSENTS_BINDING,))
"""The consent machine's table (removed with runs_v1, whose guard keeps every Run)."""
