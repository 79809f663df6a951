"""Fake providers for the attempt tests: they count effects, so a test can prove that no
effect ever happened twice, and they misbehave on request.

Three honest kinds (``same_key_replay`` and ``lookup`` as their guarantees say):
``replay`` (both), ``lookup_only`` and ``neither``; a ``lying`` provider answers a repeated
key with a new job identity. ``plan`` lists what the next submits do: ``ok``,
``reject`` (a definite rejection before any effect), ``timeout_after_effect`` (the effect
happens, the acknowledgement never arrives), ``error_before_effect`` (a disconnect before
anything was sent), ``die_after_effect`` / ``die_before_effect`` (the process dies there:
``ProcessDied``, a BaseException nothing in the library catches).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses

from tenure.conformance.lockstep.attempts import GUARANTEES, spec  # noqa: F401 - shared with the lockstep
from tenure.model import (
    AttemptState,
    Found,
    LookupFailed,
    NotFound,
    RejectedBeforeEffect,
    Transmission,
)


class ProcessDied(BaseException):
    """The process died at this point (kill -9): nothing after it runs in this process."""




@dataclasses.dataclass
class Job:
    job_id: str
    state: AttemptState
    key: str


class FakeProvider:
    def __init__(self, kind: str, *, plan: list[str] | None = None, submit_delay_s: float = 0.0) -> None:
        self.kind = kind
        self.guarantees = GUARANTEES[kind]
        self.plan = list(plan or [])
        self.submit_delay_s = submit_delay_s
        self.jobs: dict[str, Job] = {}
        self.by_key: dict[str, list[str]] = collections.defaultdict(list)
        self.effects: collections.Counter[str] = collections.Counter()
        self.die_at: set[str] = set()
        """Points (``poll``, ``cancel``, ``lookup``) where the process dies."""
        self.fail_lookups = False
        self._serial = 0
        self.submitting = asyncio.Event()
        """Set when a submit begins (a test waits on it instead of sleeping)."""
        self.submit_gate: asyncio.Event | None = None
        """When given, a submit waits for it after it began (a transmission held open)."""

    def _new_job(self, key: str) -> Job:
        self._serial += 1
        job = Job(f"provider-job-{self._serial}", AttemptState.ACCEPTED, key)
        self.jobs[job.job_id] = job
        self.by_key[key].append(job.job_id)
        self.effects[key] += 1
        return job

    async def submit(self, transmission: Transmission) -> str:
        step = self.plan.pop(0) if self.plan else "ok"
        self.submitting.set()
        if self.submit_gate is not None:
            await self.submit_gate.wait()
        if self.submit_delay_s:
            await asyncio.sleep(self.submit_delay_s)
        if step == "reject":
            raise RejectedBeforeEffect("quota exhausted")
        if step == "error_before_effect":
            raise ConnectionResetError("connection reset before sending")
        if step == "die_before_effect":
            raise ProcessDied()
        key = transmission.idempotency_key
        existing = self.by_key.get(key)
        if existing and self.guarantees.same_key_replay:
            if self.kind == "lying":
                self._serial += 1
                return f"provider-job-{self._serial}-lie"  # no new effect, but a new identity
            job = self.jobs[existing[0]]
        else:
            job = self._new_job(key)
        if step == "timeout_after_effect":
            raise TimeoutError("no acknowledgement")
        if step == "die_after_effect":
            raise ProcessDied()
        return job.job_id

    async def lookup(self, idempotency_key: str) -> Found | NotFound | LookupFailed:
        if "lookup" in self.die_at:
            raise ProcessDied()
        if not self.guarantees.lookup:
            raise AssertionError("the runner looked up a provider that offers no lookup")
        if self.fail_lookups:
            return LookupFailed("provider unavailable")
        found = self.by_key.get(idempotency_key)
        if not found:
            return NotFound(proves_no_effect=True)
        job = self.jobs[found[0]]
        return Found(job.job_id, job.state, self._results(job))

    @staticmethod
    def _results(job: Job) -> tuple[str, ...]:
        return (f"ref:{job.job_id}",) if job.state is AttemptState.SUCCEEDED else ()

    async def poll(self, provider_job_id: str) -> Found | LookupFailed:
        if "poll" in self.die_at:
            raise ProcessDied()
        job = self.jobs.get(provider_job_id)
        if job is None:
            return LookupFailed("unknown job")
        if job.state is AttemptState.ACCEPTED:
            job.state = AttemptState.RUNNING
        elif job.state is AttemptState.RUNNING:
            job.state = AttemptState.SUCCEEDED
        return Found(job.job_id, job.state, self._results(job))

    async def cancel(self, provider_job_id: str) -> bool:
        if "cancel" in self.die_at:
            raise ProcessDied()
        job = self.jobs.get(provider_job_id)
        if job is None or job.state is AttemptState.SUCCEEDED:
            return False
        job.state = AttemptState.CANCELLED
        return True
