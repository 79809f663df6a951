"""The attempt ledger: ``ServiceJobAttempt@1`` records on SQLite or PostgreSQL.

Every method is one transaction on the shared engine: it locks the attempt (``prepare``:
the Run the attempt names, if any, then every attempt of the owner job and any holding
the key), reads the database time after the lock, asks the attempt kernel, and persists
its decision with a compare-and-set.
The answer law is the job sources': ``True`` (or a value) means the exact change
applied; ``False`` (or ``None``) means stale, ineligible or already applied, and nothing
changed; a conflict raises ``TenureError`` with its ``ATTEMPT_*`` code; a database
failure raises ``ATTEMPT_PERSISTENCE_FAILED`` with the reason words of the job sources
(see docs/errors.md's failure reasons); invalid input raises ``ConfigValidationError``
before any database work. No message echoes an ID, a key, a ref or a payload.

The attempt ID is derived: ``uuid5(ATTEMPT_NAMESPACE, f"{owner_job_id}\\n{generation}")``,
so a repeated ``prepare`` of the same spec, from any process, names the same attempt.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import uuid
from collections.abc import Sequence
from typing import Any

from tenure.kernel.attempts import finders
from tenure.kernel.attempts.commands import (
    AttemptCommand,
    BeginSubmit,
    EgressDenied,
    ExpireSubmitLease,
    FailureKind,
    LookupKind,
    Prepare,
    Prepared,
    Reconcile,
    RecordAccepted,
    RecordAmbiguous,
    RecordCancelled,
    RecordFailed,
    RecordProgress,
    RecordRunning,
    RecordSucceeded,
    ReleaseReservation,
    RequestCancel,
    TransmissionGranted,
)
from tenure.kernel.attempts.record import AttemptRow
from tenure.kernel.core import Applied, Decision
from tenure.kernel.runs.finders import runs_opening_owners
from tenure.kernel.runs.record import opens_owners
from tenure.model import (
    ENVELOPE_TAG,
    AttemptPage,
    AttemptRecord,
    AttemptSpec,
    AttemptState,
    CancelConfirmed,
    CapabilityBinding,
    ConfigValidationError,
    EgressDecision,
    ErrorCode,
    Found,
    LookupFailed,
    NotFound,
    ProviderFailed,
    ProviderGuarantees,
    RejectedBeforeEffect,
    ToolBinding,
    Transmission,
    bounds,
    canonical_json,
    json_problem,
)
from tenure.model.attempts import MAX_REFS, check_reason, check_refs
from tenure.model.validation import datetime_to_micros, micros_to_datetime, refuse

from ..core.engine import Engine, raise_if_conflict
from ..core.facade import Cursor, Facade, checked_timeout
from ..core.failures import persistence_failed
from ..core.store import Transaction
from ..core.tables import json_column
from ..runs.table import RUNS_BINDING, RUNS_TABLE
from ..wiring.dialects import open_store
from .table import ATTEMPTS_BINDING

__all__ = [
    "AttemptLedger", "ATTEMPT_NAMESPACE", "attempt_id_for", "prepared_row", "DEFAULT_SUBMIT_LEASE_SECONDS",
    "MAX_DOCUMENT_BYTES",
]

ATTEMPT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "tenure:service-job-attempt")
"""The namespace of derived attempt IDs."""

DEFAULT_SUBMIT_LEASE_SECONDS = 60.0
MAX_DOCUMENT_BYTES = 64 * 1024
"""The largest usage or cost object (UTF-8 bytes of its canonical JSON)."""


def attempt_id_for(owner_job_id: str, generation: int) -> str:
    """The attempt ID of ``(owner_job_id, generation)``."""
    return str(uuid.uuid5(ATTEMPT_NAMESPACE, f"{owner_job_id}\n{generation}"))



def _identity(value: object, field: str) -> str:
    if not bounds.is_identity(value):
        raise refuse(field, "identity_required")
    return value  # type: ignore[return-value]


def _document(value: object, field: str) -> str | None:
    """A usage or cost object as canonical JSON text (None stays None)."""
    if value is None:
        return None
    if type(value) is not dict:
        raise refuse(field, "json_object_required")
    problem = json_problem(value)
    if problem is not None:
        raise refuse(field, problem)
    text = canonical_json(value)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_DOCUMENT_BYTES:
        raise refuse(field, "payload_too_large")
    return text


def _warnings(value: object) -> tuple[str, ...]:
    if type(value) not in (tuple, list) or len(value) > MAX_REFS:  # type: ignore[arg-type]
        raise refuse("warnings", "list_required")
    return tuple(check_reason(item, "warnings") for item in value)  # type: ignore[attr-defined]


def _lease_us(seconds: object) -> int:
    if not isinstance(seconds, (int, float)) or type(seconds) is bool:
        raise refuse("lease_seconds", "number_required")
    # An int is compared as an int: a huge one cannot become a float.
    finite = type(seconds) is int or math.isfinite(seconds)
    if not finite or not 0 < seconds <= bounds.MAX_LEASE_SECONDS:
        raise refuse("lease_seconds", "number_out_of_range")
    return max(1, round(seconds * 1_000_000))


def _looked_up_at(value: object, field: str = "looked_up_at") -> int:
    """A lookup's instant (an aware datetime, read from ``database_now()`` just before the
    lookup was sent) as microseconds on the database clock."""
    if type(value) is not dt.datetime or value.utcoffset() is None:
        raise refuse(field, "aware_datetime_required")
    try:
        micros = datetime_to_micros(value)
    except (OverflowError, ValueError, ArithmeticError):
        raise refuse(field, "datetime_out_of_range") from None
    if not bounds.is_instant(micros):
        raise refuse(field, "datetime_out_of_range")
    return micros


def _proof_instant(lookup: NotFound, looked_up_at: object, field: str) -> int | None:
    """When a not-found that vouches for no effect was looked up (required: a not-found
    speaks for the moment of its lookup, see specs/attempts.md); None for one that does
    not vouch, which proves nothing whenever it was made."""
    if not lookup.proves_no_effect:
        return None
    if looked_up_at is None:
        raise refuse(field, "lookup_instant_required")
    return _looked_up_at(looked_up_at, field)


def _binding_document(binding: CapabilityBinding | ToolBinding) -> dict[str, Any]:
    names = CapabilityBinding.model_fields if isinstance(binding, CapabilityBinding) else ToolBinding.model_fields
    return {name: getattr(binding, name) for name in names}


def _spec_document(spec: AttemptSpec) -> dict[str, Any]:
    document = {name: getattr(spec, name) for name in AttemptSpec.model_fields}
    document["binding"] = _binding_document(spec.binding)
    document["guarantees"] = {"same_key_replay": spec.guarantees.same_key_replay, "lookup": spec.guarantees.lookup}
    document["source_refs"] = list(spec.source_refs)
    document["working_refs"] = list(spec.working_refs)
    return document


def prepared_row(spec: AttemptSpec) -> AttemptRow:
    """The spec as the kernel row :meth:`AttemptLedger.prepare` asks the kernel to insert
    (where it stands and its times are set by the kernel's ``insert``). Part of the
    adapters' test seam (``docs/testing.md``): a proof's model inserts the same row."""
    digest = "sha256:" + hashlib.sha256(canonical_json(_spec_document(spec)).encode("utf-8")).hexdigest()
    return AttemptRow(
        attempt_id=attempt_id_for(spec.owner_job_id, spec.generation), envelope=ENVELOPE_TAG,
        owner_job_id=spec.owner_job_id, run_id=spec.run_id, station_attempt_id=spec.station_attempt_id,
        generation=spec.generation, request_digest=spec.request_digest, idempotency_key=spec.idempotency_key,
        binding_json=canonical_json(_binding_document(spec.binding)),
        same_key_replay=spec.guarantees.same_key_replay, lookup=spec.guarantees.lookup, target=spec.target,
        source_refs=spec.source_refs, working_refs=spec.working_refs, destination=spec.destination,
        purpose=spec.purpose, consent_decision=spec.consent_decision,
        policy_revisions_json=canonical_json(dict(spec.policy_revisions)), reservation=spec.reservation,
        spec_digest=digest, state=AttemptState.PREPARED, provider_job_id=None, transmissions=0,
        transmission_egress=(), denied_egress=(), submit_lease_expires_at_us=None, no_effect_proof_for=None,
        granted_during_earlier_lease=False,
        progress_cursor=None, result_refs=(), diagnostic_refs=(), usage_json=None, cost_json=None, warnings=(),
        cancel_requested=False, evidence=(), reservation_released=False, created_at_us=0, updated_at_us=0,
    )


_RUN_ID_CHARS = RUNS_TABLE.column("run_id").sql_type.length  # type: ignore[attr-defined]


async def _run_closed(tx: Transaction, run_id: str | None) -> bool:
    """Whether ``run_id`` names a Run of this database that is not RUNNING, observed under
    that Run's lock (taken before any attempt's: the Run ledger's order, so the two never
    wait for each other in a cycle). The Run ledger counts a Run's open attempts under
    the same lock before it settles or cancels the Run, so an attempt prepared for it
    either lands before that count or sees the Run closed. No Run, or an ID no Run row
    can hold, is never closed: attempts are also used without Runs."""
    if run_id is None or len(run_id) > _RUN_ID_CHARS:
        return False
    runs = await tx.locked(RUNS_BINDING, runs_opening_owners, {"keys": [run_id]})
    return bool(runs) and not opens_owners(runs[0])


def _public(row: AttemptRow) -> AttemptRecord:
    binding_fields = json_column(row.binding_json)
    revisions = json_column(row.policy_revisions_json)
    binding: CapabilityBinding | ToolBinding | None = None
    try:
        if type(binding_fields) is dict and binding_fields.get("kind") == "tool":
            binding = ToolBinding(**binding_fields)
        elif type(binding_fields) is dict:
            binding = CapabilityBinding(**binding_fields)
    except (ConfigValidationError, TypeError):
        binding = None
    if binding is None or type(revisions) is not dict:
        raise persistence_failed("corrupt_row")
    return AttemptRecord(
        attempt_id=row.attempt_id, envelope=row.envelope, owner_job_id=row.owner_job_id, run_id=row.run_id,
        station_attempt_id=row.station_attempt_id, generation=row.generation, request_digest=row.request_digest,
        idempotency_key=row.idempotency_key, binding=binding,
        guarantees=ProviderGuarantees(same_key_replay=row.same_key_replay, lookup=row.lookup), target=row.target,
        source_refs=row.source_refs, working_refs=row.working_refs, destination=row.destination,
        purpose=row.purpose, consent_decision=row.consent_decision, policy_revisions=revisions,
        reservation=row.reservation, state=row.state, provider_job_id=row.provider_job_id,
        transmissions=row.transmissions, progress_cursor=row.progress_cursor, result_refs=row.result_refs,
        diagnostic_refs=row.diagnostic_refs, usage=json_column(row.usage_json), cost=json_column(row.cost_json),
        warnings=row.warnings, cancel_requested=row.cancel_requested, evidence=row.evidence,
        reservation_released=row.reservation_released, created_at_us=row.created_at_us,
        updated_at_us=row.updated_at_us,
    )


def _cursor_of(row: AttemptRow) -> str:
    return Cursor.encode(row.created_at_us, row.attempt_id)


class AttemptLedger(Facade):
    """Attempts in one database (SQLite file or PostgreSQL), migrated by ``upgrade``."""

    persistence_code = ErrorCode.ATTEMPT_PERSISTENCE_FAILED

    def __init__(self, db_url: str, *, timeout_seconds: float = 30.0, db_schema: str | None = None) -> None:
        self._on(Engine(open_store(db_url, timeout_seconds=checked_timeout(timeout_seconds), schema=db_schema)))

    @classmethod
    def on_engine(cls, engine: Engine) -> AttemptLedger:
        """An attempt ledger on another ledger's engine (the same database and
        connections; closing that ledger closes this one's store)."""
        return cls._on_engine(engine)

    async def send(self, attempt_id: object, command: AttemptCommand, *, write: bool = True) -> Decision:
        """Send one attempt kernel command to one attempt, as the named operations do:
        the row locked, the database clock read, the kernel's decision written with its
        compare-and-set; returns the kernel's ``Decision`` (a conflict raises its
        ``ATTEMPT_*`` code). Part of the adapters' test seam (``docs/testing.md``): a
        replay of an explorer trace sends the trace's own commands. Applications call
        the named operations (:meth:`begin_submit`, :meth:`record_accepted`, ...)."""
        key = _identity(attempt_id, "attempt_id")
        async with self._errors():
            decisions = await self._engine.on_keys(
                ATTEMPTS_BINDING, [(key, command)], finders.by_keys, write=write, raise_conflicts=True
            )
        return decisions[0]

    async def _applied(self, attempt_id: object, command: AttemptCommand) -> bool:
        return isinstance(await self.send(attempt_id, command), Applied)

    async def _prepare_in(self, tx: Transaction, row: AttemptRow, run_closed: bool) -> Decision:
        """The prepare decision for ``row`` in ``tx``: every attempt of its owner job and
        any holding its key locked, the predecessor and the key observed under that lock."""
        binding = ATTEMPTS_BINDING
        rows = await tx.locked(binding, finders.of_owner_or_key,
                               {"owner_job_id": row.owner_job_id, "key": row.idempotency_key})
        met, predecessor_state, predecessor_generation, key_held = finders.prepare_meets(
            rows, attempt_id=row.attempt_id, owner_job_id=row.owner_job_id, idempotency_key=row.idempotency_key
        )
        command = Prepare(row=row, predecessor_state=predecessor_state,
                          predecessor_generation=predecessor_generation, key_held_elsewhere=key_held,
                          run_closed=run_closed)
        decision = await self._engine.decide_one(tx, binding, met, command)
        raise_if_conflict(binding, decision)
        return decision

    async def send_prepare(self, row: AttemptRow, *, run_closed: bool) -> Decision:
        """:meth:`prepare`'s transaction for a kernel row as given, with ``run_closed`` as
        the caller says instead of read under the Run's lock; the predecessor and the key
        are what the database holds under the attempts' lock. Returns the kernel's
        ``Decision`` (a conflict raises its ``ATTEMPT_*`` code). Part of the adapters'
        test seam (``docs/testing.md``): a replay of an explorer trace prepares the
        trace's own row in a world whose Run exists only in the trace."""
        async with self._errors():
            return await self.store.run(lambda tx: self._prepare_in(tx, row, run_closed), write=True)

    # --- the operations ----------------------------------------------------------------

    async def prepare(self, spec: AttemptSpec) -> str:
        """Record an attempt before its first transmission; the same spec again returns the
        same attempt ID. A changed spec, a reused key, a generation gap or a succeeded
        predecessor raise ATTEMPT_PREPARE_CONFLICT; an unresolved predecessor raises
        ATTEMPT_PREDECESSOR_UNRESOLVED; a new attempt naming a Run of this database that
        is not RUNNING raises RUN_OWNER_MISMATCH. Nothing is stored on a refusal."""
        if type(spec) is not AttemptSpec:
            raise refuse("spec", "attempt_spec_required")
        row = prepared_row(spec)

        async def body(tx: Transaction) -> Decision:
            # The Run's lock first (the Run ledger's order), then the attempts'.
            return await self._prepare_in(tx, row, await _run_closed(tx, spec.run_id))

        async with self._errors():
            decision = await self.store.run(body, write=True)
        reply = decision.reply if isinstance(decision, Applied) else None
        if not isinstance(reply, Prepared):
            raise persistence_failed("invariant_broken")
        return reply.attempt_id

    async def begin_submit(
        self, attempt_id: str, *, egress: EgressDecision, proof: NotFound | None = None,
        looked_up_at: dt.datetime | None = None, lease_seconds: float = DEFAULT_SUBMIT_LEASE_SECONDS,
    ) -> Transmission | None:
        """Grant the next physical transmission (the first from PREPARED, a resubmission
        from SUBMITTING or INDETERMINATE when proven) and return what to send; ``None``
        when the egress decision refused it (recorded) or the attempt is past sending.
        An unproven resubmission raises ATTEMPT_RESUBMIT_UNPROVEN.

        ``proof``: a lookup's ``NotFound(proves_no_effect=True)``, with ``looked_up_at``,
        the database instant (:meth:`database_now`) read just before that lookup was sent;
        it proves the latest transmission had no effect only when that instant is past the
        submit lease (a lookup made while the sender may still be transmitting proves
        nothing, however late it is passed here)."""
        if type(egress) is not EgressDecision:
            raise refuse("egress", "egress_decision_required")
        if proof is not None and type(proof) is not NotFound:
            raise refuse("proof", "not_found_required")
        if proof is None and looked_up_at is not None:
            raise refuse("looked_up_at", "proof_required")
        command = BeginSubmit(
            egress_decision_id=egress.decision_id, egress_allowed=egress.allowed,
            proof_looked_up_at_us=None if proof is None else _proof_instant(proof, looked_up_at, "looked_up_at"),
            lease_us=_lease_us(lease_seconds),
        )
        decision = await self.send(attempt_id, command)
        if not isinstance(decision, Applied) or isinstance(decision.reply, EgressDenied):
            return None
        granted = decision.reply
        record = decision.new_record
        if not isinstance(granted, TransmissionGranted) or not isinstance(record, AttemptRow):
            raise persistence_failed("invariant_broken")
        return Transmission(record.attempt_id, record.idempotency_key, granted.number, record.request_digest,
                            record.target, granted.egress_decision_id)

    async def record_accepted(self, attempt_id: str, *, provider_job_id: str) -> bool:
        """The provider acknowledged the transmission with its job identity (recorded once;
        a different one raises ATTEMPT_IDENTITY_CONFLICT)."""
        return await self._applied(attempt_id, RecordAccepted(provider_job_id=_identity(provider_job_id, "provider_job_id")))

    async def record_running(self, attempt_id: str) -> bool:
        return await self._applied(attempt_id, RecordRunning())

    async def record_progress(
        self, attempt_id: str, *, cursor: str, usage: Any = None, cost: Any = None, warnings: Sequence[str] = ()
    ) -> bool:
        command = RecordProgress(cursor=check_reason(cursor, "cursor"), usage_json=_document(usage, "usage"),
                                 cost_json=_document(cost, "cost"), warnings=_warnings(warnings))
        return await self._applied(attempt_id, command)

    async def record_succeeded(
        self, attempt_id: str, *, result_refs: Sequence[str], diagnostic_refs: Sequence[str] = (),
        usage: Any = None, cost: Any = None,
    ) -> bool:
        command = RecordSucceeded(
            result_refs=check_refs(result_refs, "result_refs"), diagnostic_refs=check_refs(diagnostic_refs, "diagnostic_refs"),
            usage_json=_document(usage, "usage"), cost_json=_document(cost, "cost"),
        )
        return await self._applied(attempt_id, command)

    async def record_failed(self, attempt_id: str, *, evidence: RejectedBeforeEffect | ProviderFailed,
                            transmission: int | None = None) -> bool:
        """FAILED needs evidence: ``RejectedBeforeEffect`` while submitting, with the
        number of the transmission it answers (``Transmission.number``), or
        ``ProviderFailed`` for an accepted, running or indeterminate attempt (a failure of
        the provider's job, which names no transmission). A rejection fails the attempt
        only when it answers the latest transmission and no earlier one may still reach
        the provider; otherwise it returns False and changes nothing (the lease's end, a
        lookup or the other sender settles the attempt)."""
        if isinstance(evidence, RejectedBeforeEffect):
            if not bounds.is_strict_int(transmission) or not 1 <= transmission <= bounds.INT32_MAX:  # type: ignore[operator]
                raise refuse("transmission", "transmission_number_required")
            command = RecordFailed(evidence=FailureKind.REJECTED_BEFORE_EFFECT, reason=evidence.reason,
                                   transmission=transmission)
        elif type(evidence) is ProviderFailed:
            if transmission is not None:
                raise refuse("transmission", "not_taken_with_a_provider_failure")
            command = RecordFailed(evidence=FailureKind.PROVIDER_FAILED, reason=evidence.reason)
        else:
            raise refuse("evidence", "failure_evidence_required")
        return await self._applied(attempt_id, command)

    async def record_ambiguous(self, attempt_id: str, *, reason: str) -> bool:
        """The outcome after transmission is unknown (timeout, disconnect, crash, malformed
        acknowledgement): INDETERMINATE, never FAILED."""
        return await self._applied(attempt_id, RecordAmbiguous(reason=check_reason(reason)))

    async def request_cancel(self, attempt_id: str) -> bool:
        """PREPARED cancels at once; anything in flight records the request (CANCELLED then
        needs containment evidence)."""
        return await self._applied(attempt_id, RequestCancel())

    async def record_cancelled(self, attempt_id: str, *, evidence: CancelConfirmed | Found) -> bool:
        """CANCELLED with containment evidence: the provider's confirmation, or a lookup
        that found the job cancelled."""
        if type(evidence) is CancelConfirmed:
            return await self._applied(attempt_id, RecordCancelled(provider_job_id=evidence.provider_job_id))
        if type(evidence) is Found and evidence.state is AttemptState.CANCELLED:
            return await self.reconcile(attempt_id, evidence)
        raise refuse("evidence", "containment_evidence_required")

    async def reconcile(self, attempt_id: str, lookup: Found | NotFound | LookupFailed, *,
                        looked_up_at: dt.datetime | None = None) -> bool:
        """Move on what a lookup of the same provider and key saw: Found moves to its state
        (recording the identity); NotFound(proves_no_effect=True) records the proof that
        makes one resubmission legal when the lookup was made after the submit lease
        ended; LookupFailed changes nothing.

        ``looked_up_at`` (required with a NotFound that vouches for no effect): the database
        instant (:meth:`database_now`) read just before the lookup was sent. A not-found
        speaks for the moment it was looked up: one made while a transmission could still
        reach the provider proves nothing, however late it reaches the ledger."""
        if looked_up_at is not None and type(lookup) is not NotFound:
            raise refuse("looked_up_at", "not_found_required")
        if type(lookup) is Found:
            command = Reconcile(lookup=LookupKind.FOUND, provider_job_id=lookup.provider_job_id,
                                found_state=lookup.state, result_refs=lookup.result_refs)
        elif type(lookup) is NotFound:
            command = Reconcile(lookup=LookupKind.NOT_FOUND, proves_no_effect=lookup.proves_no_effect,
                                looked_up_at_us=_proof_instant(lookup, looked_up_at, "looked_up_at"))
        elif type(lookup) is LookupFailed:
            command = Reconcile(lookup=LookupKind.FAILED)
        else:
            raise refuse("lookup", "lookup_result_required")
        return await self._applied(attempt_id, command)

    async def expire_submit_lease(self, attempt_id: str) -> bool:
        """A SUBMITTING attempt whose submit lease ended with no acknowledgement becomes
        INDETERMINATE (recovery, when no lookup can say more)."""
        return await self._applied(attempt_id, ExpireSubmitLease())

    async def release_reservation(self, attempt_id: str) -> bool:
        """Release the attempt's reservation after terminal containment (never while
        INDETERMINATE)."""
        return await self._applied(attempt_id, ReleaseReservation())

    async def get(self, attempt_id: str) -> AttemptRecord | None:
        key = _identity(attempt_id, "attempt_id")
        async def body(tx: Transaction) -> list[AttemptRow]:
            return await tx.read(ATTEMPTS_BINDING, [key])

        async with self._errors():
            found = await self.store.run(body, write=False)
        return _public(found[0]) if found else None

    async def database_now(self) -> dt.datetime:
        """The database's clock, the one every attempt instant is taken from: read it just
        before a lookup and pass it as ``looked_up_at``."""
        async def body(tx: Transaction) -> int:
            return await tx.now_us()

        async with self._errors():
            micros = await self.store.run(body, write=False)
        return micros_to_datetime(micros)

    async def list_unresolved(self, *, after: str | None = None, limit: int = 100) -> AttemptPage:
        """SUBMITTING, ACCEPTED, RUNNING and INDETERMINATE attempts, oldest created first."""
        if not bounds.is_strict_int(limit) or not 1 <= limit <= 1000:
            raise refuse("limit", "integer_out_of_range")
        binding = ATTEMPTS_BINDING
        cursor = None if after is None else Cursor.parse(after, bounds.is_identity)

        async def body(tx: Transaction) -> list[AttemptRow]:
            if cursor is None:
                return await tx.find(binding, finders.unresolved, {}, limit + 1)
            return await tx.find(binding, finders.unresolved_after,
                                 {"after_created": cursor[0], "after_id": cursor[1]}, limit + 1)

        async with self._errors():
            rows = await self.store.run(body, write=False)
        items = tuple(_public(row) for row in rows[:limit])
        next_cursor = _cursor_of(rows[limit - 1]) if len(rows) > limit else None
        return AttemptPage(items, next_cursor)

