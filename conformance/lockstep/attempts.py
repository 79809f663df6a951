"""The attempt kernel as the model and the AttemptLedger on every database, in lockstep.

The same command stream goes to the ledger and to a model that stores kernel records in
a dictionary and decides with the kernel at the database time the ledger's transaction
read; every answer and every stored attempt must agree after every step. Two rules run
two ledgers at once (concurrent first ``begin_submit`` calls; racing observations): the
database must then have done what one of the two serial orders does.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, cast

from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from tenure.adapters import AttemptLedger
from tenure.adapters.attempts.ledger import prepared_row
from tenure.adapters.attempts.table import ATTEMPTS_BINDING
from tenure.conformance.lockstep.harness import LockstepBase
from tenure.kernel.attempts import finders
from tenure.kernel.attempts.commands import (
    BeginSubmit,
    ExpireSubmitLease,
    FailureKind,
    LookupKind,
    Prepare,
    Reconcile,
    RecordAccepted,
    RecordAmbiguous,
    RecordCancelled,
    RecordFailed,
    RecordRunning,
    RecordSucceeded,
    ReleaseReservation,
    RequestCancel,
    TransmissionGranted,
)
from tenure.kernel.attempts.machine import ATTEMPTS
from tenure.kernel.attempts.record import AttemptRow
from tenure.kernel.core import Applied, Refused
from tenure.model import (
    AttemptSpec,
    AttemptState,
    CancelConfirmed,
    CapabilityBinding,
    EgressDecision,
    Found,
    LookupFailed,
    NotFound,
    ProviderFailed,
    ProviderGuarantees,
    RejectedBeforeEffect,
    TenureError,
    Transmission,
)
from tenure.model.validation import micros_to_datetime

__all__ = ["AttemptLockstep", "AttemptModel", "GUARANTEES", "spec"]

GUARANTEES = {
    "replay": ProviderGuarantees(same_key_replay=True, lookup=True),
    "lookup_only": ProviderGuarantees(same_key_replay=False, lookup=True),
    "neither": ProviderGuarantees(same_key_replay=False, lookup=False),
    "lying": ProviderGuarantees(same_key_replay=True, lookup=True),
}


def spec(owner: str = "owner-1", generation: int = 1, *, key: str | None = None, kind: str = "replay",
         reservation: str | None = None, **changes: Any) -> AttemptSpec:
    fields: dict[str, Any] = dict(
        owner_job_id=owner, run_id="run-1", station_attempt_id=None, generation=generation,
        request_digest="sha256:" + hashlib.sha256(f"{owner}:{generation}".encode()).hexdigest(),
        idempotency_key=key or f"key-{owner}-{generation}",
        binding=CapabilityBinding(interface="image", profile_revision="p1", profile_digest="sha256:" + "b" * 64,
                                  operation="render", driver_revision="d1", dialect_revision="x1"),
        guarantees=GUARANTEES[kind], target="provider-a", purpose="thumbnail", reservation=reservation,
    )
    fields.update(changes)
    return AttemptSpec(**fields)


OWNERS = ["owner-1", "owner-2"]
KINDS = ["replay", "lookup_only", "neither"]
PROVIDER_IDS = ["job-a", "job-b"]
EGRESS_POOL = [f"egress-{n}" for n in range(8)]
LEASES = [0.000001, 60.0]
"""A submit lease that is over at once, and one that outlives the run."""


class AttemptModel:
    """Kernel records in a dictionary, decided at the database's own times."""

    def __init__(self) -> None:
        self.rows: dict[str, AttemptRow] = {}

    def snapshot(self) -> dict[str, AttemptRow]:
        return dict(self.rows)

    def restore(self, saved: dict[str, AttemptRow]) -> None:
        self.rows = dict(saved)

    def _apply(self, attempt_id: str, command: Any, now: int) -> Any:
        decision = ATTEMPTS.decide(self.rows.get(attempt_id), command, now)
        if isinstance(decision, Refused):
            code = ATTEMPTS.outcomes[decision.reason]
            if code is not None:
                raise TenureError(code, decision.reason.value)
            return decision
        if decision.new_record is not None:
            self.rows[attempt_id] = decision.new_record
        return decision

    def prepare(self, request: Any, now: int) -> str:
        row = prepared_row(request)
        located = [r for r in self.rows.values()
                   if r.owner_job_id == request.owner_job_id or r.idempotency_key == request.idempotency_key]
        met, state, generation, held = finders.prepare_meets(
            located, attempt_id=row.attempt_id, owner_job_id=request.owner_job_id, idempotency_key=request.idempotency_key
        )
        # No Run exists in these databases: an attempt's Run is never closed.
        command = Prepare(row=row, predecessor_state=state, predecessor_generation=generation, key_held_elsewhere=held,
                          run_closed=False)
        decision = ATTEMPTS.decide(met, command, now)
        if isinstance(decision, Refused):
            code = ATTEMPTS.outcomes[decision.reason]
            assert code is not None, "every refused Prepare is an error to the caller"
            raise TenureError(code, decision.reason.value)
        assert decision.new_record is not None
        self.rows[row.attempt_id] = decision.new_record
        return row.attempt_id

    def begin_submit(self, attempt_id: str, egress: EgressDecision, proof_at: int | None, lease_us: int,
                     now: int) -> Any:
        decision = self._apply(attempt_id, BeginSubmit(
            egress_decision_id=egress.decision_id, egress_allowed=egress.allowed, proof_looked_up_at_us=proof_at,
            lease_us=lease_us,
        ), now)
        if not isinstance(decision, Applied) or not isinstance(decision.reply, TransmissionGranted):
            return None
        row = decision.new_record
        assert row is not None
        return Transmission(row.attempt_id, row.idempotency_key, decision.reply.number, row.request_digest,
                            row.target, decision.reply.egress_decision_id)

    def command(self, attempt_id: str, command: Any, now: int) -> bool:
        return isinstance(self._apply(attempt_id, command, now), Applied)


def _lease_us(seconds: float) -> int:
    return max(1, round(seconds * 1_000_000))


def _reconcile_command(lookup: Any, looked_up_at: int | None) -> Any:
    if isinstance(lookup, Found):
        return Reconcile(lookup=LookupKind.FOUND, provider_job_id=lookup.provider_job_id, found_state=lookup.state,
                         result_refs=lookup.result_refs)
    if isinstance(lookup, NotFound):
        return Reconcile(lookup=LookupKind.NOT_FOUND, proves_no_effect=lookup.proves_no_effect,
                         looked_up_at_us=looked_up_at if lookup.proves_no_effect else None)
    return Reconcile(lookup=LookupKind.FAILED)


_LONG_AGO_US = 1_600_000_000_000_000
"""A lookup instant before any lease these runs grant (2020)."""


lookups = st.one_of(
    st.builds(Found, st.sampled_from(PROVIDER_IDS),
              st.sampled_from([AttemptState.ACCEPTED, AttemptState.RUNNING, AttemptState.SUCCEEDED,
                               AttemptState.FAILED, AttemptState.CANCELLED]),
              st.just(("ref-found",))),
    st.builds(NotFound, st.booleans()),
    st.just(LookupFailed("provider down")),
)


class AttemptLockstep(LockstepBase):
    machine_name = "attempts"
    model: AttemptModel

    def __init__(self) -> None:
        super().__init__()
        self.model = AttemptModel()
        self.ledgers = [AttemptLedger(self.db_url), AttemptLedger(self.db_url)]
        for ledger in self.ledgers:
            ledger.store.observe_time = self.clock.seen.append
        self.egress_serial = itertools.count()
        self.contention_steps = 0

    def close_resources(self) -> None:
        for ledger in self.ledgers:
            self.runner.run(ledger.close())

    def known(self) -> list[str]:
        return sorted(self.model.rows) + ["attempt-missing"]

    def fresh_egress(self, allowed: bool) -> EgressDecision:
        return EgressDecision(decision_id=f"egress-fresh-{next(self.egress_serial)}", allowed=allowed, policy_revision="p")

    def model_rows(self) -> dict[str, AttemptRow]:
        return self.model.rows

    def lookup_instant(self, data: st.DataObject, attempt_id: str) -> int:
        """When a lookup was made: just before, at or after the attempt's submit lease
        ends (the comparison the kernel makes), or long ago."""
        row = self.model.rows.get(attempt_id)
        anchors = [_LONG_AGO_US]
        if row is not None and row.submit_lease_expires_at_us is not None:
            lease = row.submit_lease_expires_at_us
            anchors += [lease - 1, lease, lease + 1]
        return data.draw(st.sampled_from(anchors))

    def looked_up_at(self, data: st.DataObject, attempt_id: str, lookup: Any) -> int | None:
        """The instant a vouching not-found is passed with (None for every other lookup)."""
        if isinstance(lookup, NotFound) and lookup.proves_no_effect:
            return self.lookup_instant(data, attempt_id)
        return None

    # --- rules ----------------------------------------------------------------------------

    @rule(owner=st.sampled_from(OWNERS), generation=st.integers(1, 3), provider=st.sampled_from(["p-a", "p-b"]),
          kind=st.sampled_from(KINDS), shared_key=st.booleans(), reservation=st.booleans())
    def prepare(self, owner: str, generation: int, provider: str, kind: str, shared_key: bool, reservation: bool) -> None:
        request = spec(owner, generation, kind=kind, target=provider, key="shared-key" if shared_key else None,
                       reservation="gpu-0" if reservation else None)
        actual = self.run(self.ledgers[0].prepare(request))
        now = self.clock.take()
        self.expect(actual, self.model_outcome(lambda: self.model.prepare(request, now)))

    @rule(data=st.data(), allowed=st.booleans(), reuse=st.booleans(), proof=st.booleans(),
          lease=st.sampled_from(LEASES))
    def begin_submit(self, data: st.DataObject, allowed: bool, reuse: bool, proof: bool, lease: float) -> None:
        attempt_id = data.draw(st.sampled_from(self.known()))
        egress = (EgressDecision(decision_id=data.draw(st.sampled_from(EGRESS_POOL)), allowed=allowed, policy_revision="p")
                  if reuse else self.fresh_egress(allowed))
        proof_at = self.lookup_instant(data, attempt_id) if proof else None
        actual = self.run(self.ledgers[0].begin_submit(
            attempt_id, egress=egress, proof=NotFound(True) if proof else None,
            looked_up_at=None if proof_at is None else micros_to_datetime(proof_at), lease_seconds=lease))
        now = self.clock.take()
        self.expect(actual, self.model_outcome(
            lambda: self.model.begin_submit(attempt_id, egress, proof_at, _lease_us(lease), now)))

    @rule(data=st.data(), provider_job_id=st.sampled_from(PROVIDER_IDS))
    def record_accepted(self, data: st.DataObject, provider_job_id: str) -> None:
        attempt_id = data.draw(st.sampled_from(self.known()))
        actual = self.run(self.ledgers[0].record_accepted(attempt_id, provider_job_id=provider_job_id))
        now = self.clock.take()
        self.expect(actual, self.model_outcome(
            lambda: self.model.command(attempt_id, RecordAccepted(provider_job_id=provider_job_id), now)))

    @rule(data=st.data(), operation=st.sampled_from(
        ["running", "succeeded", "rejected", "provider_failed", "ambiguous", "cancel", "expire", "release"]))
    def record(self, data: st.DataObject, operation: str) -> None:
        attempt_id = data.draw(st.sampled_from(self.known()))
        ledger = self.ledgers[0]
        row = self.model.rows.get(attempt_id)
        latest = 0 if row is None else row.transmissions
        # The transmission a rejection answers: the latest, or one before or after it.
        number = data.draw(st.sampled_from(sorted({max(1, latest - 1), max(1, latest), latest + 1})))
        calls: dict[str, tuple[Callable[[], Awaitable[Any]], Any]] = {
            "running": (lambda: ledger.record_running(attempt_id), RecordRunning()),
            "succeeded": (lambda: ledger.record_succeeded(attempt_id, result_refs=["ref-1"]),
                          RecordSucceeded(result_refs=("ref-1",), diagnostic_refs=(), usage_json=None, cost_json=None)),
            "rejected": (lambda: ledger.record_failed(attempt_id, evidence=RejectedBeforeEffect("quota"),
                                                      transmission=number),
                         RecordFailed(evidence=FailureKind.REJECTED_BEFORE_EFFECT, reason="quota", transmission=number)),
            "provider_failed": (lambda: ledger.record_failed(attempt_id, evidence=ProviderFailed("boom")),
                                RecordFailed(evidence=FailureKind.PROVIDER_FAILED, reason="boom")),
            "ambiguous": (lambda: ledger.record_ambiguous(attempt_id, reason="timeout"), RecordAmbiguous(reason="timeout")),
            "cancel": (lambda: ledger.request_cancel(attempt_id), RequestCancel()),
            "expire": (lambda: ledger.expire_submit_lease(attempt_id), ExpireSubmitLease()),
            "release": (lambda: ledger.release_reservation(attempt_id), ReleaseReservation()),
        }
        call, command = calls[operation]
        actual = self.run(call())
        now = self.clock.take()
        self.expect(actual, self.model_outcome(lambda: self.model.command(attempt_id, command, now)))

    @rule(data=st.data(), provider_job_id=st.sampled_from(PROVIDER_IDS))
    def record_cancelled(self, data: st.DataObject, provider_job_id: str) -> None:
        attempt_id = data.draw(st.sampled_from(self.known()))
        actual = self.run(self.ledgers[0].record_cancelled(attempt_id, evidence=CancelConfirmed(provider_job_id)))
        now = self.clock.take()
        self.expect(actual, self.model_outcome(
            lambda: self.model.command(attempt_id, RecordCancelled(provider_job_id=provider_job_id), now)))

    @rule(data=st.data(), lookup=lookups)
    def reconcile(self, data: st.DataObject, lookup: Any) -> None:
        attempt_id = data.draw(st.sampled_from(self.known()))
        at = self.looked_up_at(data, attempt_id, lookup)
        actual = self.run(self.ledgers[0].reconcile(
            attempt_id, lookup, looked_up_at=None if at is None else micros_to_datetime(at)))
        now = self.clock.take()
        self.expect(actual, self.model_outcome(
            lambda: self.model.command(attempt_id, _reconcile_command(lookup, at), now)))

    # --- two ledgers at once ------------------------------------------------------------------

    @rule(data=st.data(), lease=st.sampled_from(LEASES))
    def concurrent_first_submissions(self, data: st.DataObject, lease: float) -> None:
        attempt_id = data.draw(st.sampled_from(self.known()))
        egresses = [self.fresh_egress(True), self.fresh_egress(True)]

        def call(ledger: AttemptLedger, egress: EgressDecision) -> Callable[[], Awaitable[Any]]:
            return lambda: ledger.begin_submit(attempt_id, egress=egress, lease_seconds=lease)

        def step(egress: EgressDecision) -> Callable[[int], Any]:
            return lambda now: self.model.begin_submit(attempt_id, egress, None, _lease_us(lease), now)

        calls = [call(ledger, egress) for ledger, egress in zip(self.ledgers, egresses, strict=True)]
        steps = [step(egress) for egress in egresses]
        self.race(calls, steps)

    @rule(data=st.data(), first=lookups, second=lookups)
    def racing_observations(self, data: st.DataObject, first: Any, second: Any) -> None:
        attempt_id = data.draw(st.sampled_from(self.known()))
        lookups_ = [first, second]
        instants = [self.looked_up_at(data, attempt_id, lookup) for lookup in lookups_]

        def call(ledger: AttemptLedger, lookup: Any, at: int | None) -> Callable[[], Awaitable[Any]]:
            return lambda: ledger.reconcile(attempt_id, lookup, looked_up_at=None if at is None else micros_to_datetime(at))

        def step(lookup: Any, at: int | None) -> Callable[[int], Any]:
            return lambda now: self.model.command(attempt_id, _reconcile_command(lookup, at), now)

        calls = [call(ledger, lookup, at) for ledger, lookup, at in zip(self.ledgers, lookups_, instants, strict=True)]
        steps = [step(lookup, at) for lookup, at in zip(lookups_, instants, strict=True)]
        self.race(calls, steps)

    # --- after every step ------------------------------------------------------------------------

    def dump(self) -> dict[str, AttemptRow]:
        async def read(tx: Any) -> dict[str, AttemptRow]:
            return {row.attempt_id: row for row in await tx.find(ATTEMPTS_BINDING, finders.all_attempts, {}, 10_000)}

        # One read transaction through store.run (SQLite: one hop to the connection's thread).
        return cast(dict[str, AttemptRow], self.runner.run(self.ledgers[0].store.run(read, write=False)))

    @invariant()
    def every_attempt_equals_the_model(self) -> None:
        assert self.rows_after_step() == self.model.rows
        for row in self.model.rows.values():
            assert ATTEMPTS.record_violations(row) == []
