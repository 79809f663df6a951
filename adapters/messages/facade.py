"""Messages to a Run, and the receives its hops wait on (the message machine,
``specs/messages.md``): ``RunLedger.messages``.

A send and a receive are each one transaction that locks the Run's row first (the
ledger's lock order, by writing it unchanged as every owner's opening does), reads what
the message kernel decides on (the Run's status, or whether the receiving hop still
holds it; the slot the command replays, else the slot it would fill or take; the next
sequence of the topic), asks the kernel and writes its decision with a compare-and-set.
A send that fills a waiting receive resumes the Run waiting on it after the commit,
through the Run ledger (``resume``, given by the ledger: this facade never decides a
Run), as a verdict does; a receive's timeout is a decision the relays send as
``tenure:deadline`` once the database clock passed it (:meth:`Messages.time_out_due`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tenure.kernel.core import Applied, Decision, Finder
from tenure.kernel.messages import finders as message_finders
from tenure.kernel.messages.commands import Delivered, ReceiveMessage, SendMessage, TimeOut
from tenure.kernel.messages.record import MAX_RECEIVE_TIMEOUT_US, MessageRow
from tenure.kernel.runs import finders
from tenure.kernel.runs.record import hop_holds
from tenure.model import ErrorCode, MessageRecord, MessageStatus, TenureError, bounds
from tenure.model.runs import MAX_MESSAGE_ID_CHARS, check_run_id, check_seq, check_text, check_topic
from tenure.model.validation import micros_to_datetime, refuse

from ..core.engine import raise_if_conflict
from ..core.facade import Transactions, json_text, parsed_json
from ..core.failures import persistence_failed
from ..core.store import Transaction
from ..runs.table import RUNS_BINDING
from .table import MESSAGES_BINDING

__all__ = ["Messages", "public_message", "Resume"]

log = logging.getLogger("tenure.adapters.messages")

Resume = Callable[[str, str, Any], Awaitable[object]]
"""``resume(run_id, owner_id, broker)``: resume the Run waiting on that owner (and publish
its next hop through ``broker``, or leave the publication to the relays when it is None)."""

def _timeout_us(seconds: object) -> int | None:
    """A receive's timeout in microseconds (None: no timeout)."""
    if seconds is None:
        return None
    if type(seconds) not in (int, float) or not 0 < seconds <= MAX_RECEIVE_TIMEOUT_US / 1_000_000:  # type: ignore[operator]
        raise refuse("timeout_s", "number_out_of_range")
    return max(1, round(seconds * 1_000_000))  # type: ignore[operator]


def public_message(row: MessageRow) -> MessageRecord:
    return MessageRecord(
        slot_id=row.slot_id, run_id=row.run_id, topic=row.topic, status=row.status, message_id=row.message_id,
        message=parsed_json(row.message_json), sequence=row.sequence, sent_at=micros_to_datetime(row.sent_at_us),
        receive_key=row.receive_key, expires_at=micros_to_datetime(row.expires_at_us),
        created_at=micros_to_datetime(row.created_at_us), decided_at=micros_to_datetime(row.decided_at_us),
        decided_by=row.decided_by,
    )


def _slot(run_id: str, topic: str, **fields: Any) -> MessageRow:
    """A new slot's row as a command carries it (where it stands and its times are the kernel's)."""
    values: dict[str, Any] = dict(
        slot_id=str(uuid.uuid4()), run_id=run_id, topic=topic, status=MessageStatus.SENT, message_id=None,
        message_json=None, sequence=None, sent_at_us=None, receive_key=None, expires_at_us=None, created_at_us=0,
        decided_at_us=None, decided_by=None,
    )
    values.update(fields)
    return MessageRow(**values)


async def _first(tx: Transaction, finder: Finder, parameters: dict[str, Any]) -> MessageRow | None:
    """The first slot a finder meets: locked when the finder locks, else read with a limit of one."""
    rows = await (tx.locked(MESSAGES_BINDING, finder, parameters) if finder.lock == "wait"
                  else tx.find(MESSAGES_BINDING, finder, parameters, 1))
    return rows[0] if rows else None


def _stored(decision: Decision) -> MessageRow:
    if not isinstance(decision, Applied) or not isinstance(decision.new_record, MessageRow):
        raise persistence_failed("invariant_broken")  # every refusal a ledger can meet raises its code
    return decision.new_record


class Messages:
    """The messages and receives of one Run ledger's database, on the ledger's connections.
    ``resume`` is the ledger's (see :data:`Resume`); ``is_broker`` says whether a value is
    a broker ``resume`` can publish through (checked before any database work)."""

    def __init__(self, transactions: Transactions, resume: Resume, is_broker: Callable[[Any], bool]) -> None:
        self._tx = transactions
        self._resume = resume
        self._is_broker = is_broker

    async def send(self, run_id: str, topic: str, message: Any, *, message_id: str | None = None,
                   broker: Any = None) -> MessageRecord:
        """Store ``message`` (any JSON value of at most 1 MiB) for the Run ``run_id`` under
        ``topic`` (1 to 64 characters of ``A-Z a-z 0-9 _ . : / -``, from a letter or a
        digit): delivered to the Run's oldest receive of that topic still waiting, whose
        Run then resumes (through ``broker`` when given, else the relays publish its next
        hop), or kept ``sent`` for the next receive, numbered after the Run's earlier
        messages of the topic. ``message_id`` (default: a fresh UUID) identifies the
        message within its Run: the same ID with the same topic and message answers the
        stored message again (also once the Run finished) and sends nothing twice; the
        same ID with another topic or message raises ``RUN_MESSAGE_CONFLICT``
        (``message_changed``). A Run that is unknown (``run_not_found``), finished or
        being cancelled (``run_finished``) raises ``RUN_MESSAGE_REFUSED``. Nothing is
        stored when it raises."""
        key = check_run_id(run_id)
        if broker is not None and not self._is_broker(broker):
            raise refuse("broker", "broker_required")
        row = _slot(key, check_topic(topic), message_json=json_text(message, "message"),
                    message_id=str(uuid.uuid4()) if message_id is None
                    else check_text(message_id, "message_id", MAX_MESSAGE_ID_CHARS))
        engine = self._tx.engine

        async def body(tx: Transaction) -> tuple[MessageRow, bool]:
            runs = await tx.locked(RUNS_BINDING, finders.runs_opening_owners, {"keys": [key]})
            met = await _first(tx, message_finders.message_of_run, {"run_id": key, "message_id": row.message_id})
            if met is None:
                met = await _first(tx, message_finders.pending_of_topic, {"run_id": key, "topic": row.topic})
            last = await _first(tx, message_finders.last_of_topic, {"run_id": key, "topic": row.topic})
            command = SendMessage(row=row, run_status=runs[0].status if runs else None,
                                  sequence=1 if last is None or last.sequence is None else last.sequence + 1)
            decision = await engine.decide_one(tx, MESSAGES_BINDING, met, command)
            raise_if_conflict(MESSAGES_BINDING, decision)
            return _stored(decision), isinstance(decision, Applied) and isinstance(decision.reply, Delivered)

        stored, delivered = await self._tx.run(body)
        if delivered:  # the declared resume_run of a send that filled a waiting receive
            await self._resume_after(stored, broker)
        return public_message(stored)

    async def _resume_after(self, stored: MessageRow, broker: Any) -> None:
        # The message is stored and delivered: a database failure of the resume leaves it
        # to the relays (they resume every Run whose receive has its answer).
        try:
            await self._resume(stored.run_id, stored.slot_id, broker)
        except TenureError as error:
            if error.code is not ErrorCode.RUN_PERSISTENCE_FAILED:
                raise
            log.warning("resuming a Run after its message failed with %s; the relays resume it", error.reason)

    async def receive(self, run_id: str, enqueue_seq: int, topic: str, *, key: str,
                      timeout_s: float | None = None) -> MessageRecord:
        """The receive ``key`` (1 to 128 characters, unique within the Run: the replay
        layer's journal position) of the hop ``enqueue_seq`` for a message of ``topic``.
        A receive stored under ``key`` answers again as it is (its answer, or still
        waiting), whichever hop asks; otherwise, for the hop holding the Run, the Run's
        first undelivered message of ``topic`` is taken at once (``received``) or, with
        none, the receive waits (``pending``) until a message comes or ``timeout_s``
        (more than 0, at most 366 days; None: no timeout) passes on the database clock:
        the caller parks the Run on it (``WaitKind.MESSAGE``, owner ID the slot's).
        The record's :attr:`~tenure.model.MessageRecord.answer` says which. A hop that
        does not hold its Run raises ``RUN_OWNER_MISMATCH``; the same key for another
        topic raises ``RUN_MESSAGE_CONFLICT`` (``receive_changed``)."""
        run = check_run_id(run_id)
        seq = check_seq(enqueue_seq)
        row = _slot(run, check_topic(topic), status=MessageStatus.PENDING, receive_key=check_text(key, "key"))
        expires_in_us = _timeout_us(timeout_s)
        engine = self._tx.engine

        async def body(tx: Transaction) -> MessageRow:
            runs = await tx.locked(RUNS_BINDING, finders.runs_opening_owners, {"keys": [run]})
            met = await _first(tx, message_finders.receive_of_run, {"run_id": run, "receive_key": row.receive_key})
            if met is None:
                met = await _first(tx, message_finders.first_sent_of_topic, {"run_id": run, "topic": row.topic})
            command = ReceiveMessage(row=row, hop_holds=bool(runs) and hop_holds(runs[0], seq),
                                     expires_in_us=expires_in_us)
            decision = await engine.decide_one(tx, MESSAGES_BINDING, met, command)
            raise_if_conflict(MESSAGES_BINDING, decision)
            return _stored(decision)

        return public_message(await self._tx.run(body))

    async def time_out_due(self, *, resume: Callable[[str, str], Awaitable[object]], limit: int = 32) -> int:
        """The deadline owner's round: every pending receive whose deadline passed (at most
        ``limit``, oldest deadline first) is decided ``timed_out`` by ``tenure:deadline``,
        one receive per transaction (the slot locked, the clock read after the lock), and
        handed at once to ``resume(run_id, slot_id)``: the Run ledger resumes its Run.
        Returns how many receives this call timed out; one that got its message (or was
        cancelled) meanwhile is left as it was. The relays call it every round
        (``tenure.adapters.runs.ledger.time_out_due_receives``)."""
        if not bounds.is_strict_int(limit) or not 1 <= limit <= 1000:
            raise refuse("limit", "integer_out_of_range")

        async def body(tx: Transaction) -> list[MessageRow]:
            return await tx.find(MESSAGES_BINDING, message_finders.due_receives, {"now": await tx.now_us()}, limit)

        due = await self._tx.run(body, write=False)
        timed_out = 0
        for row in due:
            async with self._tx.errors():
                decisions = await self._tx.engine.on_keys(MESSAGES_BINDING, [(row.slot_id, TimeOut())],
                                                          message_finders.messages_by_keys, raise_conflicts=True)
            if not isinstance(decisions[0], Applied):
                continue  # answered, or cancelled, since the page was read
            timed_out += 1
            await resume(row.run_id, row.slot_id)
        return timed_out

    async def get(self, slot_id: str) -> MessageRecord | None:
        """One message slot by its ID (a receive's ID is the owner ID its Run parks on)."""
        key = check_text(slot_id, "slot_id", 36)

        async def body(tx: Transaction) -> list[MessageRow]:
            return await tx.read(MESSAGES_BINDING, [key])

        found = await self._tx.run(body, write=False)
        return public_message(found[0]) if found else None

    async def list(self, run_id: str) -> Sequence[MessageRecord]:
        """Every message slot of a Run (its messages and its receives), oldest first."""
        key = check_run_id(run_id)

        async def body(tx: Transaction) -> list[MessageRow]:
            return await tx.find(MESSAGES_BINDING, message_finders.slots_of_run, {"run_id": key})

        return tuple(public_message(row) for row in await self._tx.run(body, write=False))
