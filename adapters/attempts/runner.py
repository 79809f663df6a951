"""The attempt runner: drives a provider through the attempt machine, so domain code never
hand-rolls the protocol.

``run(attempt_id)`` takes a prepared attempt to a settled state: it obtains a fresh
egress decision, asks the ledger for the transmission (the compare-and-set to SUBMITTING
happens before the driver is called), sends it under the submit lease, records what came
back, and polls until the attempt is terminal. Every exception the driver raises is
ambiguous (INDETERMINATE) unless it is a ``RejectedBeforeEffect``; a failure is recorded
only on the provider's word. An attempt it finds already transmitted (by an earlier run
that crashed, say) is reconciled first and resubmitted only where the ledger accepts the
proof.

``reconcile_unresolved(deadline_s=...)`` is what a process runs after a restart (and a
relay runs periodically): it pages every unresolved attempt, asks the provider to cancel
where cancellation was requested, looks the attempt up (or polls its job), and ends a
submit lease nobody can vouch for as INDETERMINATE, each under the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from tenure.kernel.attempts.record import is_terminal
from tenure.model import (
    AttemptRecord,
    AttemptState,
    CancelConfirmed,
    ConfigValidationError,
    EgressDecision,
    ErrorCode,
    Found,
    LookupFailed,
    NotFound,
    ReconcileReport,
    RejectedBeforeEffect,
    TenureError,
    Transmission,
)

from .ledger import DEFAULT_SUBMIT_LEASE_SECONDS, AttemptLedger

__all__ = ["ProviderDriver", "AttemptRunner", "EgressPolicy"]


@runtime_checkable
class ProviderDriver(Protocol):
    """What a provider or executor binding offers the runner (every method async).

    ``submit`` sends one transmission under its idempotency key and returns the
    provider's job identity; it raises ``RejectedBeforeEffect`` only for a definite
    rejection before any effect (anything else it raises is treated as ambiguous).
    ``lookup`` finds the job by idempotency key; ``cancel`` asks the provider to stop a
    job and answers whether it confirmed the stop; ``poll`` reports a known job's state.
    """

    async def submit(self, transmission: Transmission) -> str: ...

    async def lookup(self, idempotency_key: str) -> Found | NotFound | LookupFailed: ...

    async def cancel(self, provider_job_id: str) -> bool: ...

    async def poll(self, provider_job_id: str) -> Found | LookupFailed: ...


EgressPolicy = Callable[[AttemptRecord], Awaitable[EgressDecision]]
"""Returns a fresh egress decision for one transmission of this attempt."""


async def _allow_everything(attempt: AttemptRecord) -> EgressDecision:
    return EgressDecision(decision_id=f"egress-{uuid.uuid4()}", allowed=True, policy_revision="unrestricted")


def _kind(error: BaseException) -> str:
    """An authored description of a driver failure: its class name only (its message may
    quote the request)."""
    name = type(error).__name__
    return f"driver_raised:{name}"[:200]


@dataclasses.dataclass
class _Tally:
    moved: int = 0
    unresolved: int = 0
    failed_lookups: int = 0


class AttemptRunner:
    """Runs attempts of one ledger against one provider driver."""

    def __init__(
        self,
        ledger: AttemptLedger,
        driver: ProviderDriver,
        *,
        egress: EgressPolicy | None = None,
        submit_lease_seconds: float = DEFAULT_SUBMIT_LEASE_SECONDS,
        poll_interval_s: float = 0.5,
        max_polls: int = 10_000,
    ) -> None:
        if not isinstance(driver, ProviderDriver):
            raise ConfigValidationError("invalid_driver", fields=("driver",), problems=("provider_driver_required",))
        self.ledger = ledger
        self.driver = driver
        self._egress = egress or _allow_everything
        self._lease_seconds = submit_lease_seconds
        self._poll_interval_s = poll_interval_s
        self._max_polls = max_polls

    async def _current(self, attempt_id: str) -> AttemptRecord:
        record = await self.ledger.get(attempt_id)
        if record is None:
            raise ConfigValidationError("unknown_attempt", fields=("attempt_id",), problems=("not_found",))
        return record

    # --- run -----------------------------------------------------------------------------

    async def run(self, attempt_id: str) -> AttemptRecord:
        """Take the attempt as far as it can go now; returns it as stored at the end
        (terminal, or unresolved when the provider cannot settle it: INDETERMINATE, or a
        transmission another sender holds)."""
        record = await self._current(attempt_id)
        if record.state in (AttemptState.SUBMITTING, AttemptState.INDETERMINATE):
            # Transmitted before (by a run that did not finish): learn what happened first.
            with contextlib.suppress(_LookupFailed):
                await self._observe(record)
            record = await self._current(attempt_id)
        if record.state in (AttemptState.PREPARED, AttemptState.SUBMITTING, AttemptState.INDETERMINATE):
            record = await self._transmit(record)
        polls = 0
        while record.state in (AttemptState.ACCEPTED, AttemptState.RUNNING) and polls < self._max_polls:
            if record.cancel_requested and await self._cancel(record):
                return await self._current(attempt_id)
            polls += 1
            observed = await self.driver.poll(record.provider_job_id)  # type: ignore[arg-type]
            if isinstance(observed, Found):
                await self.ledger.reconcile(attempt_id, observed)
            record = await self._current(attempt_id)
            if record.state in (AttemptState.ACCEPTED, AttemptState.RUNNING):
                await asyncio.sleep(self._poll_interval_s)
        return record

    async def _transmit(self, record: AttemptRecord) -> AttemptRecord:
        try:
            transmission = await self.ledger.begin_submit(
                record.attempt_id, egress=await self._egress(record), lease_seconds=self._lease_seconds
            )
        except TenureError as error:
            if error.code is not ErrorCode.ATTEMPT_RESUBMIT_UNPROVEN:
                raise
            return await self._current(record.attempt_id)  # another sender, or no proof: leave it
        if transmission is None:
            return await self._current(record.attempt_id)  # refused by egress, or past sending
        outcome: str | RejectedBeforeEffect | None = None
        provider_job_id: str | None = None
        try:
            async with asyncio.timeout(self._lease_seconds):
                provider_job_id = await self.driver.submit(transmission)
        except RejectedBeforeEffect as rejection:
            outcome = rejection
        except Exception as error:  # noqa: BLE001 - every other driver failure is ambiguous
            outcome = _kind(error)
        # A BaseException (cancellation, the process going away) passes: the submit lease
        # and reconciliation cover whatever the transmission did.
        if isinstance(outcome, RejectedBeforeEffect):
            await self.ledger.record_failed(record.attempt_id, evidence=outcome, transmission=transmission.number)
        elif isinstance(outcome, str):
            await self.ledger.record_ambiguous(record.attempt_id, reason=outcome)
        elif type(provider_job_id) is not str or not provider_job_id:
            await self.ledger.record_ambiguous(record.attempt_id, reason="malformed_acknowledgement")
        else:
            await self.ledger.record_accepted(record.attempt_id, provider_job_id=provider_job_id)
        return await self._current(record.attempt_id)

    async def _cancel(self, record: AttemptRecord) -> bool:
        """Ask the provider to stop the job; CANCELLED only on its confirmation."""
        if record.provider_job_id is None:
            return False
        if await self.driver.cancel(record.provider_job_id):
            return await self.ledger.record_cancelled(
                record.attempt_id, evidence=CancelConfirmed(record.provider_job_id)
            )
        return False

    async def _observe(self, record: AttemptRecord) -> bool:
        """Look the attempt up (or poll its job) and record what was seen; True when the
        attempt moved."""
        # A not-found speaks for the moment the lookup was made: the database clock is
        # read before it is sent, and the ledger judges the not-found at that instant.
        looked_up_at = await self.ledger.database_now()
        if record.provider_job_id is not None and record.state is not AttemptState.SUBMITTING:
            observed: Found | NotFound | LookupFailed = await self.driver.poll(record.provider_job_id)
        elif record.guarantees.lookup:
            observed = await self.driver.lookup(record.idempotency_key)
        else:
            # Nothing can be looked up: once the sender's lease is over, say so.
            return await self.ledger.expire_submit_lease(record.attempt_id)
        moved = await self.ledger.reconcile(record.attempt_id, observed,
                                            looked_up_at=looked_up_at if isinstance(observed, NotFound) else None)
        if not moved and isinstance(observed, NotFound) and record.state is AttemptState.SUBMITTING:
            # Nothing proven (or the lease is still live): an expired lease is ambiguity.
            moved = await self.ledger.expire_submit_lease(record.attempt_id)
        if isinstance(observed, LookupFailed):
            raise _LookupFailed()
        return moved

    # --- recovery --------------------------------------------------------------------------

    async def reconcile_unresolved(self, *, deadline_s: float = 10.0, page_size: int = 100) -> ReconcileReport:
        """Reconcile every unresolved attempt, one at a time, each under ``deadline_s``."""
        tally = _Tally()
        cursor: str | None = None
        while True:
            page = await self.ledger.list_unresolved(after=cursor, limit=page_size)
            for record in page.items:
                await self._reconcile_one(record, deadline_s, tally)
            cursor = page.next_cursor
            if cursor is None:
                break
        return ReconcileReport(tally.moved, tally.unresolved, tally.failed_lookups)

    async def _reconcile_one(self, record: AttemptRecord, deadline_s: float, tally: _Tally) -> None:
        try:
            async with asyncio.timeout(deadline_s):
                moved = False
                if record.cancel_requested:
                    moved = await self._cancel(record)
                if not moved:
                    moved = await self._observe(record)
        except (_LookupFailed, TimeoutError):
            tally.failed_lookups += 1
            moved = False
        except TenureError as error:
            if error.code is ErrorCode.ATTEMPT_PERSISTENCE_FAILED:
                raise
            tally.failed_lookups += 1  # an identity conflict, say: left for an operator
            moved = False
        except Exception:  # noqa: BLE001 - a driver failure is a failed lookup, isolated to its attempt
            tally.failed_lookups += 1
            moved = False
        tally.moved += int(moved)
        now = await self.ledger.get(record.attempt_id)
        if now is not None and not is_terminal(now):
            tally.unresolved += 1


class _LookupFailed(Exception):
    """The lookup itself failed (recorded as changing nothing)."""
