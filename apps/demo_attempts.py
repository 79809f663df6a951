"""The attempts part of ``tenure demo``: service attempts against a simulated provider with
injected faults, recovered after simulated crashes, and checked.

Three provider kinds (atomic same-key replay with lookup; lookup only; neither) take
attempts whose transmissions meet a fault at random: a lost acknowledgement after the
effect, a disconnect before it, a definite rejection, or the process dying just before
or just after the effect. Dead runs are recovered by a fresh ledger (``reconcile_unresolved``
after the submit lease, then the work restarted). The summary counts transmissions and
effects; a failure recorded without a rejection, or a second effect for one attempt,
breaks an invariant.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import random
from typing import TextIO

from tenure.model import (
    TERMINAL_ATTEMPT_STATES,
    AttemptSpec,
    AttemptState,
    CapabilityBinding,
    Found,
    LookupFailed,
    NotFound,
    ProviderGuarantees,
    RejectedBeforeEffect,
    Transmission,
)

from tenure.adapters.attempts import AttemptLedger, AttemptRunner

__all__ = ["run_attempts_demo"]

KINDS = {
    "same-key replay": ProviderGuarantees(same_key_replay=True, lookup=True),
    "lookup only": ProviderGuarantees(same_key_replay=False, lookup=True),
    "neither": ProviderGuarantees(same_key_replay=False, lookup=False),
}
FAULTS = ["none", "none", "lost_ack", "disconnect", "reject", "die_before_effect", "die_after_effect"]
LEASE_SECONDS = 0.05


class _ProcessDied(BaseException):
    """The demo's stand-in for kill -9: nothing in the library catches it."""


@dataclasses.dataclass
class _Job:
    job_id: str
    state: AttemptState


class DemoProvider:
    """A provider that keeps its jobs by idempotency key and counts effects."""

    def __init__(self, guarantees: ProviderGuarantees) -> None:
        self.guarantees = guarantees
        self.jobs: dict[str, _Job] = {}
        self.effects: collections.Counter[str] = collections.Counter()
        self.faults: dict[str, str] = {}
        self._serial = 0

    async def submit(self, transmission: Transmission) -> str:
        key = transmission.idempotency_key
        fault = self.faults.pop(key, "none")
        if fault == "reject":
            raise RejectedBeforeEffect("the provider refused the request")
        if fault == "disconnect":
            raise ConnectionResetError("disconnected before sending")
        if fault == "die_before_effect":
            raise _ProcessDied()
        job = self.jobs.get(key) if self.guarantees.same_key_replay else None
        if job is None:
            self._serial += 1
            job = _Job(f"job-{self._serial}", AttemptState.ACCEPTED)
            self.jobs[key] = job
            self.effects[key] += 1
        if fault == "lost_ack":
            raise TimeoutError("the acknowledgement was lost")
        if fault == "die_after_effect":
            raise _ProcessDied()
        return job.job_id

    async def lookup(self, idempotency_key: str) -> Found | NotFound | LookupFailed:
        job = self.jobs.get(idempotency_key)
        return NotFound(proves_no_effect=True) if job is None else Found(job.job_id, job.state, self._refs(job))

    async def poll(self, provider_job_id: str) -> Found | LookupFailed:
        job = next((job for job in self.jobs.values() if job.job_id == provider_job_id), None)
        if job is None:
            return LookupFailed("unknown job")
        job.state = AttemptState.RUNNING if job.state is AttemptState.ACCEPTED else AttemptState.SUCCEEDED
        return Found(job.job_id, job.state, self._refs(job))

    async def cancel(self, provider_job_id: str) -> bool:
        return False

    @staticmethod
    def _refs(job: _Job) -> tuple[str, ...]:
        return (f"result:{job.job_id}",) if job.state is AttemptState.SUCCEEDED else ()


def _spec(number: int, guarantees: ProviderGuarantees) -> AttemptSpec:
    return AttemptSpec(
        owner_job_id=f"demo-render-{number}", run_id=None, station_attempt_id=None, generation=1,
        request_digest="sha256:" + hashlib.sha256(f"render {number}".encode()).hexdigest(),
        idempotency_key=f"demo-render-{number}-1",
        binding=CapabilityBinding(interface="image", profile_revision="demo", profile_digest="sha256:" + "0" * 64,
                                  operation="render", driver_revision="demo-1", dialect_revision="demo-1"),
        guarantees=guarantees, target="demo-provider", purpose="thumbnail",
    )


async def run_attempts_demo(db_url: str, *, attempts: int, seed: int, out: TextIO) -> tuple[list[tuple[str, int]], list[str]]:
    """Run the scenario; returns (summary rows, broken invariants)."""
    chooser = random.Random(seed)
    providers = {name: DemoProvider(guarantees) for name, guarantees in KINDS.items()}
    planned: dict[str, tuple[str, str]] = {}
    crashed: list[str] = []
    async with AttemptLedger(db_url) as ledger:
        for number in range(attempts):
            kind = chooser.choice(sorted(KINDS))
            fault = chooser.choice(FAULTS)
            provider = providers[kind]
            spec = _spec(number, KINDS[kind])
            attempt_id = await ledger.prepare(spec)
            planned[attempt_id] = (kind, fault)
            provider.faults[spec.idempotency_key] = fault
            try:
                await AttemptRunner(ledger, provider, poll_interval_s=0, submit_lease_seconds=LEASE_SECONDS).run(attempt_id)
            except _ProcessDied:
                crashed.append(attempt_id)
    print(f"attempts: ran {attempts} (faults injected at random); {len(crashed)} runs died mid-attempt", file=out, flush=True)
    await asyncio.sleep(LEASE_SECONDS * 2)
    moved = 0
    async with AttemptLedger(db_url) as recovered:  # a new process
        for provider in providers.values():
            runner = AttemptRunner(recovered, provider, poll_interval_s=0, submit_lease_seconds=LEASE_SECONDS)
            report = await runner.reconcile_unresolved(deadline_s=5)
            moved += report.moved
        for attempt_id, (kind, _) in planned.items():
            record = await recovered.get(attempt_id)
            if record is not None and record.state not in TERMINAL_ATTEMPT_STATES:
                # The work restarts: resubmitted only where the ledger accepts the proof.
                await AttemptRunner(recovered, providers[kind], poll_interval_s=0,
                                    submit_lease_seconds=LEASE_SECONDS).run(attempt_id)
        records = {attempt_id: await recovered.get(attempt_id) for attempt_id in planned}
    states: collections.Counter[AttemptState] = collections.Counter()
    transmissions = effects = duplicates = fabricated = 0
    for attempt_id, record in records.items():
        assert record is not None
        kind, fault = planned[attempt_id]
        states[record.state] += 1
        transmissions += record.transmissions
        count = providers[kind].effects[record.idempotency_key]
        effects += count
        duplicates += max(0, count - 1)
        if record.state is AttemptState.FAILED and fault != "reject":
            fabricated += 1
    violations = []
    if duplicates:
        violations.append(f"{duplicates} attempts had an effect repeated")
    if fabricated:
        violations.append(f"{fabricated} attempts were failed without a rejection")
    rows = [
        ("attempts", len(records)),
        ("transmissions", transmissions),
        ("effects at the provider", effects),
        ("runs that died mid-attempt", len(crashed)),
        ("moved by reconciliation", moved),
        ("succeeded", states[AttemptState.SUCCEEDED]),
        ("failed (each on a rejection)", states[AttemptState.FAILED]),
        ("indeterminate, left for an operator", states[AttemptState.INDETERMINATE]),
        ("fabricated failures", fabricated),
        ("duplicate effects", duplicates),
    ]
    return rows, violations
