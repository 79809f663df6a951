"""Which stored message slots the message commands meet, as data (see
:mod:`tenure.kernel.core`). A send and a receive lock their Run's row first (the Run
ledger's lock order), then look up, in this order, the slot they replay and the slot
they would take: every writer that fills or takes a slot holds the same Run lock, so
what these finders see cannot change under the decision but for a pending receive's
timeout (which locks the slot alone: the pending receive is locked here too). The
slots of one Run (its pending receives, or every one) are the Run's lookups
(:mod:`tenure.kernel.runs.finders`)."""

from __future__ import annotations

from tenure.model import MessageStatus

from ..core import Condition, Finder, Param

__all__ = ["messages_by_keys", "message_of_run", "receive_of_run", "pending_of_topic", "first_sent_of_topic",
           "last_of_topic", "due_receives", "slots_of_run"]

messages_by_keys = Finder("messages_by_keys", ((Condition("slot_id", "in", Param("keys")),),),
                          order=("slot_id",), lock="wait")
"""The slots a command names by their IDs, locked (a timeout decides on the locked row)."""

message_of_run = Finder(
    "message_of_run",
    ((Condition("run_id", "=", Param("run_id")), Condition("message_id", "=", Param("message_id"))),),
    order=("slot_id",), lock="wait",
)
"""The slot holding a message ID of a Run (a send's replay; at most one: a unique index)."""

receive_of_run = Finder(
    "receive_of_run",
    ((Condition("run_id", "=", Param("run_id")), Condition("receive_key", "=", Param("receive_key"))),),
    order=("slot_id",), lock="wait",
)
"""The slot holding a receive key of a Run (a receive's replay; at most one: a unique index)."""

pending_of_topic = Finder(
    "pending_of_topic",
    ((Condition("run_id", "=", Param("run_id")), Condition("topic", "=", Param("topic")),
      Condition("status", "=", MessageStatus.PENDING)),),
    order=("created_at_us", "slot_id"), lock="wait",
)
"""The Run's receives of a topic still waiting, oldest first (a send fills the first),
locked: a timeout may decide one meanwhile, and a send then meets the next."""

first_sent_of_topic = Finder(
    "first_sent_of_topic",
    ((Condition("run_id", "=", Param("run_id")), Condition("topic", "=", Param("topic")),
      Condition("status", "=", MessageStatus.SENT)),),
    order=("sequence",), lock="none",
)
"""The Run's undelivered messages of a topic in sending order (a receive takes the
first: read with a limit of one). Unlocked: only a receive takes a sent message, under
the Run's lock this reading is made under."""

last_of_topic = Finder(
    "last_of_topic",
    ((Condition("run_id", "=", Param("run_id")), Condition("topic", "=", Param("topic")),
      Condition("sequence", "not_null")),),
    order=("-sequence",), lock="none",
)
"""The Run's latest message of a topic (read with a limit of one): the next message's
sequence is one more. Only a send, under the Run's lock, adds one."""

due_receives = Finder(
    "due_receives",
    ((Condition("status", "=", MessageStatus.PENDING), Condition("expires_at_us", "<=", Param("now"))),),
    order=("expires_at_us", "slot_id"),
    lock="none",
)
"""Pending receives whose deadline came by ``now``, oldest deadline first: the candidates
for the deadline owner's ``time_out``, which the kernel then decides on the locked row
(read unlocked; a receive decided since is refused ``already_decided``)."""


slots_of_run = Finder("slots_of_run", ((Condition("run_id", "=", Param("run_id")),),),
                      order=("created_at_us", "slot_id"), lock="none")
"""Every slot of one Run, oldest first (its messages and its receives: an operator's listing)."""
