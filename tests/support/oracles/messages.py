"""The machine under test for the message slot (``specs/messages.md``): its guard glossary
written again, independently of the kernel, and what the shared table, oracle, property
and mutant tests need of it (``tests/support/machines.py`` reads ``UNDER_TEST``)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from machines import MachineUnderTest
from tenure.conformance.strategies.messages import message_situations
from tenure.kernel import MESSAGES
from tenure.kernel.messages.record import MessageStep

# --- the message machine's guards, from specs/messages.md's glossary --------------------------

MESSAGE_ORACLE_GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda r, c, n: True,
    "run_missing": lambda r, c, n: c.run_status is None,
    "run_finished": lambda r, c, n: c.run_status is not None
    and c.run_status.value in ("done", "failed", "cancelled", "cancelling"),
    "other_slot": lambda r, c, n: r.run_id != c.row.run_id or r.topic != c.row.topic,
    "message_differs": lambda r, c, n: any(
        getattr(r, field) != getattr(c.row, field) for field in ("run_id", "topic", "message_id", "message_json")),
    "receive_differs": lambda r, c, n: any(
        getattr(r, field) != getattr(c.row, field) for field in ("run_id", "topic", "receive_key")),
    "hop_lost": lambda r, c, n: c.hop_holds is False,
    "not_due": lambda r, c, n: not (r.expires_at_us is not None and n >= r.expires_at_us),
}


def _message_state(record: Any) -> enum.Enum:
    return MessageStep.ABSENT if record is None else MessageStep(record.status.value)


UNDER_TEST = MachineUnderTest(
    name="messages",
    machine=MESSAGES,
    situations=lambda state=None, kind=None: message_situations(state, kind),
    terminal=frozenset({MessageStep.RECEIVED, MessageStep.TIMED_OUT, MessageStep.CANCELLED}),
    # A message waits for its receive and a receive for its message (or its timeout, or
    # its Run's end): from either, a decided slot stays reachable.
    live=frozenset({MessageStep.SENT, MessageStep.PENDING}),
    terminal_exit_allowed=lambda state, command, rule: False,
    state_of_record=_message_state,
    oracle_guards=MESSAGE_ORACLE_GUARDS,
)
