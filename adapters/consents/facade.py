"""Consents on a Run ledger's database (the consent machine, ``specs/consent.md``):
``RunLedger.consents``.

A consent is a person's verdict on one tool call of a RUNNING Run. Creating one locks
the Run row first (the ledger's lock order) and asks the consent kernel whether the Run
may ask; a verdict is the first one the kernel accepts; a deadline is a verdict the
relays give as ``tenure:deadline`` once the database clock passed it. The Run resumes
from a decided consent through the Run ledger (``RunLedger.resume``), never from here:
:meth:`Consents.expire_due` hands each consent it expired to the ledger's ``resume``.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from tenure.kernel.consents import finders as consent_finders
from tenure.kernel.consents.commands import CreateConsent, DecideConsent
from tenure.kernel.consents.machine import DEADLINE_OWNER
from tenure.kernel.consents.record import MAX_DEADLINE_US, ConsentRow
from tenure.kernel.core import Applied
from tenure.kernel.runs import finders
from tenure.kernel.runs.record import opens_owners
from tenure.model import ConsentRecord, ConsentStatus, bounds
from tenure.model.runs import check_run_id, check_text
from tenure.model.validation import micros_to_datetime, refuse

from ..core.engine import raise_if_conflict
from ..core.facade import Transactions, json_text, parsed_json
from ..core.failures import persistence_failed
from ..core.store import Transaction
from ..runs.table import RUNS_BINDING
from .table import CONSENTS_BINDING

__all__ = ["Consents", "public_consent"]


def _deadline_us(seconds: object) -> int | None:
    """A consent's deadline in microseconds from its creation (None: no deadline)."""
    if seconds is None:
        return None
    if type(seconds) not in (int, float) or not 0 < seconds <= MAX_DEADLINE_US / 1_000_000:  # type: ignore[operator]
        raise refuse("expires_in_s", "number_out_of_range")
    return max(1, round(seconds * 1_000_000))  # type: ignore[operator]


def public_consent(row: ConsentRow) -> ConsentRecord:
    return ConsentRecord(
        consent_id=row.consent_id, run_id=row.run_id, tool_name=row.tool_name, tool_call_id=row.tool_call_id,
        payload=parsed_json(row.payload_json), status=row.status, decided_by=row.decided_by,
        decided_at=micros_to_datetime(row.decided_at_us), preauthorized_by=row.preauthorized_by,
        created_at=micros_to_datetime(row.created_at_us),
        expires_at=micros_to_datetime(row.expires_at_us),
    )


class Consents:
    """The consents of one Run ledger's database, on the ledger's connections."""

    def __init__(self, transactions: Transactions) -> None:
        self._tx = transactions

    async def create(
        self, run_id: str, *, tool_name: str, tool_call_id: str, payload: Any, preauthorized_by: str | None = None,
        expires_in_s: float | None = None,
    ) -> ConsentRecord:
        """A pending consent for one tool call of a RUNNING Run (granted at once with
        ``preauthorized_by``). A Run that is missing or not RUNNING raises
        RUN_OWNER_MISMATCH. ``expires_in_s`` (more than 0, at most 30 days) gives it a
        deadline, ``created_at + expires_in_s`` on the database clock, which the relays
        apply: once it passed, :meth:`expire_due` decides it EXPIRED."""
        expires_in_us = _deadline_us(expires_in_s)
        key = check_run_id(run_id)
        row = ConsentRow(
            consent_id=str(uuid.uuid4()), run_id=key, tool_name=check_text(tool_name, "tool_name"),
            tool_call_id=check_text(tool_call_id, "tool_call_id"), payload_json=json_text(payload, "payload"),
            status=ConsentStatus.PENDING, decided_by=None, decided_at_us=None,
            preauthorized_by=None if preauthorized_by is None else check_text(preauthorized_by, "preauthorized_by"),
            created_at_us=0,
        )
        engine = self._tx.engine

        async def body(tx: Transaction) -> ConsentRow:
            runs = await tx.locked(RUNS_BINDING, finders.runs_opening_owners, {"keys": [key]})
            running = bool(runs) and opens_owners(runs[0])
            decision = await engine.decide_one(
                tx, CONSENTS_BINDING, None, CreateConsent(row=row, run_running=running, expires_in_us=expires_in_us))
            raise_if_conflict(CONSENTS_BINDING, decision)
            if not isinstance(decision, Applied) or not isinstance(decision.new_record, ConsentRow):
                raise persistence_failed("invariant_broken")
            return decision.new_record

        return public_consent(await self._tx.run(body))

    async def decide(self, consent_id: str, verdict: ConsentStatus, *, decided_by: str) -> bool:
        """Record a verdict (GRANTED, DENIED or EXPIRED); the first verdict wins (False
        for any later one). Expiry is a verdict like the others, never derived from a clock."""
        if verdict not in (ConsentStatus.GRANTED, ConsentStatus.DENIED, ConsentStatus.EXPIRED):
            raise refuse("verdict", "verdict_required")
        decider = check_text(decided_by, "decided_by", bounds.MAX_IDENTITY_CHARS)
        command = DecideConsent(verdict=verdict, decided_by=decider)
        key = check_text(consent_id, "consent_id", 36)
        async with self._tx.errors():
            decisions = await self._tx.engine.on_keys(CONSENTS_BINDING, [(key, command)],
                                                      consent_finders.consents_by_keys,
                                                      raise_conflicts=True)
        return isinstance(decisions[0], Applied)

    async def expire_due(self, *, resume: Callable[[str, str], Awaitable[object]], limit: int = 32) -> int:
        """The deadline owner's round: every pending consent whose deadline passed (at most
        ``limit``, oldest deadline first) is decided EXPIRED by ``tenure:deadline``, one
        consent per transaction on the same path as :meth:`decide`, and handed at once to
        ``resume(run_id, consent_id)``: the Run ledger resumes its Run (and publishes it,
        given a broker), as a principal's verdict resumes it
        (``tenure.adapters.runs.ledger.expire_due_consents``). Returns how many consents this call expired;
        a consent decided meanwhile is left as it was. The relays call it every round."""
        if not bounds.is_strict_int(limit) or not 1 <= limit <= 1000:
            raise refuse("limit", "integer_out_of_range")

        async def body(tx: Transaction) -> list[ConsentRow]:
            return await tx.find(CONSENTS_BINDING, consent_finders.due_consents, {"now": await tx.now_us()}, limit)

        due = await self._tx.run(body, write=False)
        expire = DecideConsent(verdict=ConsentStatus.EXPIRED, decided_by=DEADLINE_OWNER)
        expired = 0
        for row in due:
            async with self._tx.errors():
                decisions = await self._tx.engine.on_keys(CONSENTS_BINDING, [(row.consent_id, expire)],
                                                          consent_finders.consents_by_keys, raise_conflicts=True)
            if not isinstance(decisions[0], Applied):
                continue  # decided (or not due, on this clock) since the page was read
            expired += 1
            await resume(row.run_id, row.consent_id)
        return expired

    async def get(self, consent_id: str) -> ConsentRecord | None:
        key = check_text(consent_id, "consent_id", 36)

        async def body(tx: Transaction) -> list[ConsentRow]:
            return await tx.read(CONSENTS_BINDING, [key])

        found = await self._tx.run(body, write=False)
        return public_consent(found[0]) if found else None
