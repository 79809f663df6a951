"""The message slots table, ``tenure_run_messages`` (schema step ``runs_v8``): one row per
message of a Run, per receive of a Run's hop, or per pair of both once a message was
delivered to a receive. Partial unique indexes hold the identities even against another
writer: a message ID once per Run, a receive key once per Run, a sequence once per Run
and topic (so no message is delivered twice and none is numbered twice); CHECK
constraints hold a slot's parts to its status."""

from __future__ import annotations

import functools

from sqlalchemy import DateTime, Integer, String, Text

from tenure.kernel.messages.machine import MESSAGES
from tenure.kernel.messages.record import MessageRow
from tenure.model import MessageStatus

from ..core.tables import Binding, Codec, IndexSpec, MachineTables, Step, TableSpec, column, one_of

__all__ = ["MESSAGES_TABLE", "MESSAGES_BINDING", "MESSAGES_STEP", "MACHINE_TABLES"]

C = Codec
MESSAGES_STEP = Step("runs_v8", 14)
"""The message slots table, with the Runs' wider checks (the status ``awaiting_message``,
the owner kind ``message``: ``adapters/runs/table.py``)."""
_INSTANT = DateTime(timezone=True)
_column = functools.partial(column, step=MESSAGES_STEP)

_HOLDS_MESSAGE = "status IN ('sent', 'received')"
_UNDECIDED = "status IN ('sent', 'pending')"
_WITHOUT_MESSAGE = "status IN ('timed_out', 'cancelled')"

MESSAGES_TABLE = TableSpec(
    "tenure_run_messages",
    (
        _column("slot_id", C.TEXT, String(36), mutable=False, primary_key=True),
        _column("run_id", C.TEXT, String(36), mutable=False),
        _column("topic", C.TEXT, String(64), mutable=False),
        _column("status", C.ENUM, String(10), mutable=True, choices=MessageStatus),
        _column("message_id", C.OPTIONAL_TEXT, String(128), mutable=True),
        _column("message_json", C.OPTIONAL_TEXT, Text(), mutable=True),
        _column("sequence", C.OPTIONAL_INT, Integer(), mutable=True),
        _column("sent_at", C.OPTIONAL_INSTANT, _INSTANT, mutable=True, field="sent_at_us"),
        _column("receive_key", C.OPTIONAL_TEXT, String(128), mutable=True),
        _column("expires_at", C.OPTIONAL_INSTANT, _INSTANT, mutable=True, field="expires_at_us"),
        _column("created_at", C.INSTANT, _INSTANT, mutable=False, field="created_at_us"),
        _column("decided_at", C.OPTIONAL_INSTANT, _INSTANT, mutable=True, field="decided_at_us"),
        _column("decided_by", C.OPTIONAL_TEXT, String(255), mutable=True),
    ),
    indexes=(
        # The identities a replay meets, once per Run; the order of a topic's messages.
        IndexSpec("ux_tenure_run_messages_message", ("run_id", "message_id"), unique=True, step=MESSAGES_STEP,
                  where="message_id IS NOT NULL"),
        IndexSpec("ux_tenure_run_messages_receive", ("run_id", "receive_key"), unique=True, step=MESSAGES_STEP,
                  where="receive_key IS NOT NULL"),
        IndexSpec("ux_tenure_run_messages_sequence", ("run_id", "topic", "sequence"), unique=True,
                  step=MESSAGES_STEP, where="sequence IS NOT NULL"),
        # A send's waiting receive and a receive's first undelivered message of a topic.
        IndexSpec("ix_tenure_run_messages_topic", ("run_id", "topic", "status"), step=MESSAGES_STEP),
        # A settlement's sweep of the pending receives; recovery's receives of a Run.
        IndexSpec("ix_tenure_run_messages_run", ("run_id", "status"), step=MESSAGES_STEP),
        # The relays' page of pending receives whose deadline came.
        IndexSpec("ix_tenure_run_messages_status_expires", ("status", "expires_at", "slot_id"), step=MESSAGES_STEP),
    ),
    created_by=MESSAGES_STEP,
    checks=(
        ("ck_tenure_run_messages_status", one_of("status", MessageStatus)),
        ("ck_tenure_run_messages_message",
         f"({_HOLDS_MESSAGE} AND message_id IS NOT NULL AND message_json IS NOT NULL AND sequence IS NOT NULL "
         f"AND sent_at IS NOT NULL) OR (NOT {_HOLDS_MESSAGE} AND message_id IS NULL AND message_json IS NULL "
         f"AND sequence IS NULL AND sent_at IS NULL)"),
        ("ck_tenure_run_messages_receive",
         "(status = 'sent' AND receive_key IS NULL AND expires_at IS NULL) OR "
         "(status <> 'sent' AND receive_key IS NOT NULL)"),
        ("ck_tenure_run_messages_sequence", "sequence IS NULL OR sequence >= 1"),
        ("ck_tenure_run_messages_decision",
         f"({_UNDECIDED} AND decided_at IS NULL AND decided_by IS NULL) OR "
         f"(status = 'received' AND decided_at IS NOT NULL AND decided_by IS NULL) OR "
         f"({_WITHOUT_MESSAGE} AND decided_at IS NOT NULL AND decided_by IS NOT NULL)"),
    ),
)

MESSAGES_BINDING = Binding("run_messages", MESSAGES, MESSAGES_TABLE, MessageRow, {}, "slot_id")

MACHINE_TABLES = MachineTables(machine=MESSAGES, tables=(MESSAGES_TABLE,), bindings=(MESSAGES_BINDING,))
"""The message machine's table (removed with runs_v8; the Runs it belongs to are kept by
runs_v1's guard, so no slot outlives its Run's)."""
