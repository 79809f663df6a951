"""``tenure demo``: the owned queue under stress, and service attempts under faults, checked end to end.

The demo migrates a database, submits a few thousand owned jobs across the three
queues, and runs concurrent workers that heartbeat, complete, fail and retry. Some
workers stall past their lease so that others take their jobs over; the stalled
workers then try to write, and every such stale write must be refused. It replays
submissions (same ID back), submits changed content under old IDs (refused), forces a
streaming rerun, and finally reads every job back to check that each one ended exactly
once and none was lost. Then it runs service attempts against a simulated provider with
injected timeouts, disconnects, rejections and crashes (:mod:`tenure.apps.demo_attempts`).
Any broken invariant makes the exit status non-zero.

:func:`check_demo_settings` refuses settings the demo cannot run (before anything is
created); :class:`DemoSettings` runs it on construction. The summary ends with what each
count means.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sys
import textwrap
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any, TextIO

from tenure.kernel.queue.machine import LEASE_EXPIRED_ERROR
from tenure.model import (
    ConfigValidationError,
    ErrorCode,
    JobStatus,
    PipelineJob,
    QueueKind,
    StreamingJob,
    TenureError,
    ValidationJob,
    WorkerConfig,
    bounds,
)

from tenure.adapters.core.urls import parse_db_url
from tenure.adapters.queue.sources import JobSource, PipelineJobSource, StreamingJobSource, ValidationJobSource
from tenure.adapters.wiring.migrations import upgrade
from .demo_attempts import run_attempts_demo
from .demo_runs import run_runs_demo

__all__ = ["DemoSettings", "DEMO_LIMITS", "check_demo_settings", "queue_counts", "run_demo"]

DEMO_LIMITS: dict[str, tuple[int | float, int | float]] = {
    "jobs": (10, 10_000),
    "workers": (1, 64),
    "lease_seconds": (0.1, 10.0),
}
"""The ranges ``tenure demo`` accepts (inclusive). Its checks read at most 10,000 rows of
a queue; a lease above 10 s keeps stalled workers asleep past the demo's time limit; a
lease below 0.1 s leaves a loaded machine too little time between a claim and its
heartbeat."""


def check_demo_settings(*, jobs: object, workers: object, lease_seconds: object, seed: object,
                        db_url: object | None) -> None:
    """Raise one ConfigValidationError naming every setting the demo cannot run with
    (``db_url=None``: the demo will make its own SQLite file). Creates nothing."""
    found: list[tuple[str, str]] = []
    for field, value in (("jobs", jobs), ("workers", workers)):
        low, high = DEMO_LIMITS[field]
        if not bounds.is_strict_int(value):
            found.append((field, "integer_required"))
        elif not low <= value <= high:  # type: ignore[operator]
            found.append((field, "integer_out_of_range"))
    low, high = DEMO_LIMITS["lease_seconds"]
    if type(lease_seconds) not in (int, float):
        found.append(("lease_seconds", "number_required"))
    elif not low <= lease_seconds <= high:  # type: ignore[operator]  # NaN fails this too
        found.append(("lease_seconds", "number_out_of_range"))
    if not bounds.is_strict_int(seed):
        found.append(("seed", "integer_required"))
    if db_url is not None:
        try:
            parse_db_url(db_url)
        except ConfigValidationError as error:
            found += zip(error.fields, error.problems, strict=True)
    if found:
        raise ConfigValidationError("invalid_demo_settings", fields=tuple(field for field, _ in found),
                                    problems=tuple(problem for _, problem in found))


def queue_counts(jobs: int) -> dict[QueueKind, int]:
    """How ``jobs`` is split across the queues: 60 % validation, 30 % pipeline, 10 %
    streaming (rounded down; at least 10 streaming launches)."""
    return {
        QueueKind.VALIDATION: jobs * 6 // 10,
        QueueKind.PIPELINE: jobs * 3 // 10,
        QueueKind.STREAMING: max(10, jobs // 10),
    }


REPLAY_EVERY = 10
"""Every 10th submission of a queue is sent again unchanged (a client retrying after a
lost acknowledgement)."""

CONFLICT_EVERY = 25
"""Every 25th submission of a queue is sent again with changed content."""


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    db_url: str
    jobs: int = 3000
    workers: int = 8
    lease_seconds: float = 1.0
    stall_fraction: float = 0.01
    fail_fraction: float = 0.08
    seed: int = 7
    progress_every: int = 500
    """Print a progress line each time this many more jobs have been submitted."""

    def __post_init__(self) -> None:
        check_demo_settings(jobs=self.jobs, workers=self.workers, lease_seconds=self.lease_seconds,
                            seed=self.seed, db_url=self.db_url)
        assert bounds.is_strict_int(self.progress_every) and self.progress_every >= 1


@dataclasses.dataclass
class Tally:
    submitted: int = 0
    replayed: int = 0
    conflicts_refused: int = 0
    claims: int = 0
    heartbeats: int = 0
    retries: int = 0
    stale_writes_refused: int = 0
    stale_writes_accepted: int = 0
    forced_reruns: int = 0
    cancels_acknowledged: int = 0
    terminal_writes: Counter[tuple[QueueKind, str]] = dataclasses.field(default_factory=Counter)
    generations: dict[tuple[QueueKind, str], list[int]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    submitted_ids: dict[QueueKind, set[str]] = dataclasses.field(default_factory=lambda: defaultdict(set))
    cancel_requested_ids: set[str] = dataclasses.field(default_factory=set)


def _validation_job(n: int) -> ValidationJob:
    return ValidationJob("orders", "1.0.0", f"orders-{n}.jsonl", options={"row_limit": n % 50})


def _pipeline_job(n: int) -> PipelineJob:
    return PipelineJob({"steps": [{"name": "load"}, {"name": "check", "n": n}]}, {"run": str(n)})


def _streaming_job(n: int, *, force: bool = False) -> StreamingJob:
    return StreamingJob(f"feed-{n}", "1", {"partition": str(n)}, force=force)


class Demo:
    def __init__(self, settings: DemoSettings, out: TextIO) -> None:
        self.settings = settings
        self.out = out
        self.random = random.Random(settings.seed)
        self.tally = Tally()
        self.config = WorkerConfig(
            settings.db_url,
            lease_seconds=settings.lease_seconds,
            heartbeat_seconds=settings.lease_seconds / 4,
            backoff_base_ms=20,
            backoff_max_ms=200,
        )
        self.sources: dict[QueueKind, JobSource[Any]] = {
            QueueKind.VALIDATION: ValidationJobSource(settings.db_url, self.config),
            QueueKind.PIPELINE: PipelineJobSource(settings.db_url, self.config),
            QueueKind.STREAMING: StreamingJobSource(settings.db_url, self.config),
        }
        self.violations: list[str] = []
        self.done = asyncio.Event()
        self.started = time.monotonic()

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    # --- submission ---------------------------------------------------------------------

    async def submit_all(self) -> None:
        counts = queue_counts(self.settings.jobs)
        self.say(f"submitting {sum(counts.values())} jobs: "
                 + ", ".join(f"{count} {queue.value}" for queue, count in counts.items())
                 + f" (every {REPLAY_EVERY}th sent twice, every {CONFLICT_EVERY}th again with changed content)")
        makers: dict[QueueKind, Callable[[int], Any]] = {
            QueueKind.VALIDATION: _validation_job,
            QueueKind.PIPELINE: _pipeline_job,
            QueueKind.STREAMING: _streaming_job,
        }
        await asyncio.gather(*(self.submit_queue(queue, count, makers[queue]) for queue, count in counts.items()))

    async def submit_queue(self, queue: QueueKind, count: int, make: Callable[[int], Any]) -> None:
        makers = {queue: make}
        source = self.sources[queue]
        for n in range(count):
            returned = await source.submit_owned(makers[queue](n), submission_id=f"{queue.value}-{n}")
            self.tally.submitted += 1
            self.tally.submitted_ids[queue].add(returned)  # the run ID on the pipeline queue
            if self.tally.submitted % self.settings.progress_every == 0:
                self.say(f"  {time.monotonic() - self.started:5.1f} s  submitted {self.tally.submitted:6d}")
            if n % REPLAY_EVERY == 0:  # a client retrying after a lost acknowledgement
                again = await source.submit_owned(makers[queue](n), submission_id=f"{queue.value}-{n}")
                self.check(again == returned, "a replay returned a different ID")
                self.tally.replayed += 1
            if n % CONFLICT_EVERY == 0:  # the same submission ID with different content
                try:
                    await source.submit_owned(makers[queue](n + 1), submission_id=f"{queue.value}-{n}")
                    self.check(False, "changed content under an old submission ID was accepted")
                except TenureError as error:
                    self.check(error.code is ErrorCode.QUEUE_SUBMISSION_CONFLICT, "wrong conflict code")
                    self.tally.conflicts_refused += 1

    # --- workers ------------------------------------------------------------------------

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.violations.append(message)

    def note_claim(self, queue: QueueKind, claimed: Any) -> None:
        self.tally.claims += 1
        key = (queue, claimed.job_id)
        generations = self.tally.generations[key]
        self.check(
            not generations or claimed.claim_fence.generation > generations[-1],
            "a claim did not advance the generation",
        )
        generations.append(claimed.claim_fence.generation)

    async def stale_write(self, queue: QueueKind, claimed: Any) -> None:
        """Stall past the lease, then try to finish anyway: the write must be refused."""
        await asyncio.sleep(self.settings.lease_seconds * 1.5)
        accepted = await self.sources[queue].complete_owned(claimed.claim_fence, {"stale": True})
        if accepted:
            self.tally.stale_writes_accepted += 1
            self.violations.append("a stale worker's completion was accepted")
        else:
            self.tally.stale_writes_refused += 1

    async def finite_worker(self, queue: QueueKind, name: str) -> None:
        source = self.sources[queue]
        while not self.done.is_set():
            claimed = await source.claim_next_owned(name, claim_token=uuid.uuid4().hex)  # type: ignore[attr-defined]
            if claimed is None:
                await asyncio.sleep(0.01)
                continue
            self.note_claim(queue, claimed)
            fence = claimed.claim_fence
            roll = self.random.random()
            if roll < self.settings.stall_fraction:
                await self.stale_write(queue, claimed)
                continue
            if not await source.heartbeat_owned(fence):
                continue
            self.tally.heartbeats += 1
            await asyncio.sleep(0)  # the "work"
            if roll < self.settings.stall_fraction + self.settings.fail_fraction:
                retry = claimed.attempt < (claimed.job.max_attempts or 5)
                if await source.fail_owned(fence, "synthetic failure", retry=retry):  # type: ignore[attr-defined]
                    if retry:
                        self.tally.retries += 1
                    else:
                        self.tally.terminal_writes[(queue, claimed.job_id)] += 1
                continue
            if await source.complete_owned(fence, {"worker": name, "attempt": claimed.attempt}):
                self.tally.terminal_writes[(queue, claimed.job_id)] += 1

    async def launcher(self, name: str) -> None:
        source = self.sources[QueueKind.STREAMING]
        assert isinstance(source, StreamingJobSource)
        while not self.done.is_set():
            claimed = await source.claim_next_owned(name, claim_token=uuid.uuid4().hex)
            if claimed is None:
                await asyncio.sleep(0.01)
                continue
            self.note_claim(QueueKind.STREAMING, claimed)
            fence = claimed.claim_fence
            assert fence is not None
            if self.random.random() < self.settings.stall_fraction * 5:
                await self.stale_write(QueueKind.STREAMING, claimed)
                continue
            if not await source.set_pid_owned(fence, 10_000 + self.random.randrange(50_000)):
                continue
            if self.random.random() < 0.1 and await source.request_cancel(claimed.job_id):  # an operator cancels it
                self.tally.cancel_requested_ids.add(claimed.job_id)
            state = await source.get_owned_state(fence)
            if state is not None and state.cancel_requested:
                if await source.acknowledge_cancel_owned(fence):
                    self.tally.cancels_acknowledged += 1
                    self.tally.terminal_writes[(QueueKind.STREAMING, claimed.job_id)] += 1
                continue
            if await source.complete_owned(fence, {"launcher": name}):
                self.tally.terminal_writes[(QueueKind.STREAMING, claimed.job_id)] += 1

    async def takeover_drill(self) -> None:
        """One worker claims a job and stalls past its lease; a second worker takes the job
        over; the first then tries to complete it. That write must be refused, and the new
        owner's must apply. Run on each finite queue before the worker pool starts, so the
        takeover happens exactly this way."""
        for queue in (QueueKind.VALIDATION, QueueKind.PIPELINE):
            source = self.sources[queue]
            stalled = await source.claim_next_owned("drill-stalled", claim_token=uuid.uuid4().hex)  # type: ignore[attr-defined]
            assert stalled is not None
            await asyncio.sleep(self.settings.lease_seconds * 1.2)
            taker = await source.claim_next_owned("drill-taker", claim_token=uuid.uuid4().hex)  # type: ignore[attr-defined]
            self.check(taker is not None and taker.job_id == stalled.job_id, "the stalled job was not taken over")
            self.note_claim(queue, stalled)
            if taker is None:
                continue
            self.note_claim(queue, taker)
            if await source.complete_owned(stalled.claim_fence, {"stale": True}):
                self.tally.stale_writes_accepted += 1
                self.violations.append("a stale worker's completion was accepted")
            else:
                self.tally.stale_writes_refused += 1
            if await source.complete_owned(taker.claim_fence, {"took": "over"}):
                self.tally.terminal_writes[(queue, taker.job_id)] += 1
            else:
                self.violations.append("the new owner's completion was refused")

    async def forced_rerun(self) -> None:
        """Replace one config's active launch atomically (before the launchers start, so
        the predecessor's end is the rerun's doing alone)."""
        source = self.sources[QueueKind.STREAMING]
        n = 0
        first = await source.submit_owned(_streaming_job(10_000 + n), submission_id="rerun-original")
        successor = await source.submit_owned(_streaming_job(10_000 + n, force=True), submission_id="rerun-forced")
        replay = await source.submit_owned(_streaming_job(10_000 + n, force=True), submission_id="rerun-forced")
        self.check(replay == successor, "replaying a forced rerun returned a different ID")
        old = await source.get_job(first)
        self.check(old is not None and old.status is JobStatus.CANCELLED, "the predecessor was not cancelled")
        self.tally.forced_reruns += 1
        self.tally.submitted += 2
        self.tally.replayed += 1
        self.tally.submitted_ids[QueueKind.STREAMING].update({first, successor})
        # The cancelled predecessor ended without any worker write.
        self.tally.terminal_writes[(QueueKind.STREAMING, first)] += 1

    # --- progress and verification ------------------------------------------------------

    async def remaining(self) -> int:
        left = 0
        for source in self.sources.values():
            for status in (JobStatus.PENDING, JobStatus.CLAIMED):
                left += len(await source.list_jobs(status, limit=10_000))
        return left

    async def progress(self, started: float) -> None:
        while not self.done.is_set():
            await asyncio.sleep(1)
            left = await self.remaining()
            self.say(
                f"  {time.monotonic() - started:5.1f} s  claims {self.tally.claims:6d}  "
                f"finished {self.tally.submitted - left:6d}/{self.tally.submitted}  "
                f"stale writes refused {self.tally.stale_writes_refused}"
            )
            if left == 0:
                self.done.set()

    async def verify(self) -> dict[str, int]:
        finished_once = 0
        lost = 0
        expired_out = 0
        for queue, source in self.sources.items():
            # Submission returns the run ID on the pipeline queue; claims name the job ID.
            jobs = {
                (info.run_id if queue is QueueKind.PIPELINE else info.job_id): info
                for info in await source.list_jobs(limit=10_000)
            }
            for returned_id in self.tally.submitted_ids[queue]:
                info = jobs.get(returned_id)
                if info is None or info.status in (JobStatus.PENDING, JobStatus.CLAIMED):
                    lost += 1
                    continue
                writes = self.tally.terminal_writes[(queue, info.job_id)]
                if writes == 1:
                    finished_once += 1
                elif writes == 0 and (
                    (info.status is JobStatus.FAILED and info.error == LEASE_EXPIRED_ERROR)
                    or (info.status is JobStatus.CANCELLED and info.job_id in self.tally.cancel_requested_ids)
                ):
                    # Ended by the lease sweep: every attempt lost, or a cancel request whose
                    # launcher stopped answering before it acknowledged.
                    expired_out += 1
                else:
                    self.violations.append(
                        f"a {queue.value} job ended {info.status.value} with {writes} accepted terminal writes"
                        f" (attempt {info.attempt}, error {info.error!r})"
                    )
        self.check(lost == 0, "jobs were lost")
        return {"finished exactly once": finished_once, "ended by lease expiry": expired_out, "lost": lost}

    async def run(self) -> int:
        try:
            return await self._run()
        finally:
            for source in self.sources.values():
                await source.close()  # a second close does nothing

    async def _run(self) -> int:
        self.say(f"tenure demo: {self.settings.jobs} jobs, {self.settings.workers} workers per queue, "
                 f"lease {self.settings.lease_seconds} s")
        report = await upgrade(self.settings.db_url)
        self.say(f"migrated: {', '.join(report.applied) or 'already up to date'} "
                 f"({sum(check.passed for check in report.checks)} admission checks passed)")
        for source in self.sources.values():
            # The checks count every job of the queues as the demo's own.
            if await source.list_jobs(limit=1):
                raise ConfigValidationError("demo_database_not_empty", problems=("queue_jobs_present",))
        await self.submit_all()
        self.say(f"submitted {self.tally.submitted} jobs ({self.tally.replayed} replays answered with the original ID, "
                 f"{self.tally.conflicts_refused} changed resubmissions refused)")
        self.say(f"takeover drill: on the validation and pipeline queues a worker stalls past its lease "
                 f"(about {2.4 * self.settings.lease_seconds:.1f} s) and another takes its job over")
        await self.takeover_drill()
        self.say(f"takeover drill: {self.tally.stale_writes_refused} stalled workers' late completions refused, "
                 "the new owners' applied")
        await self.forced_rerun()
        self.say("forced a streaming rerun: the active launch was cancelled and replaced atomically")
        await self.work()
        outcome = await self.verify()
        for source in self.sources.values():
            await source.close()
        attempt_rows, attempt_violations = await run_attempts_demo(
            self.settings.db_url, attempts=max(30, self.settings.jobs // 25), seed=self.settings.seed, out=self.out
        )
        self.violations += attempt_violations
        run_rows, run_violations = await run_runs_demo(
            self.settings.db_url, runs=max(20, self.settings.jobs // 50), seed=self.settings.seed, out=self.out
        )
        self.violations += run_violations
        self.summarize(outcome, attempt_rows, run_rows)
        self.say(f"\nfinished in {time.monotonic() - self.started:.1f} s")
        if self.violations:
            for message in sorted(set(self.violations)):
                self.say(f"INVARIANT BROKEN: {message}")
            return 1
        self.say("every invariant held")
        return 0

    async def work(self) -> None:
        """Run the workers until every job ended, one of them failed, or time ran out."""
        tasks = [asyncio.create_task(self.progress(self.started))]
        for index in range(self.settings.workers):
            tasks.append(asyncio.create_task(self.finite_worker(QueueKind.VALIDATION, f"validator-{index}")))
            tasks.append(asyncio.create_task(self.finite_worker(QueueKind.PIPELINE, f"pipeliner-{index}")))
            tasks.append(asyncio.create_task(self.launcher(f"launcher-{index}")))
        waiter = asyncio.create_task(self.done.wait())
        # A worker returns only once done is set, so any task ending first has failed.
        finished, _ = await asyncio.wait([waiter, *tasks], timeout=max(120.0, self.settings.jobs / 10),
                                         return_when=asyncio.FIRST_COMPLETED)
        if not finished:
            self.violations.append("the workers did not finish in time")
        self.done.set()
        results = await asyncio.gather(waiter, *tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def summarize(self, outcome: dict[str, int], attempt_rows: list[tuple[str, int]],
                  run_rows: list[tuple[str, int]]) -> None:
        rows = [
            ("submitted", self.tally.submitted),
            ("replayed (original ID returned)", self.tally.replayed),
            ("conflicts refused", self.tally.conflicts_refused),
            ("claims", self.tally.claims),
            ("retries", self.tally.retries),
            ("forced streaming reruns", self.tally.forced_reruns),
            ("cancels acknowledged", self.tally.cancels_acknowledged),
            ("stale writes refused", self.tally.stale_writes_refused),
            ("stale writes accepted", self.tally.stale_writes_accepted),
            ("finished by exactly one accepted write", outcome["finished exactly once"]),
            ("ended by lease expiry (no worker write)", outcome["ended by lease expiry"]),
            ("lost", outcome["lost"]),
        ]
        self.table("summary", rows)
        self.table("service attempts", attempt_rows)
        self.table("workflow runs", run_rows)
        self.say("")
        self.say("what the counts mean:")
        for note in self.explanations():
            self.say(textwrap.fill(note, width=100, initial_indent="  ", subsequent_indent="      "))

    def table(self, title: str, rows: list[tuple[str, int]]) -> None:
        width = max(len(name) for name, _ in rows)
        self.say("")
        self.say(f"{title.ljust(width)}  count")
        self.say(f"{'-' * width}  -----")
        for name, value in rows:
            self.say(f"{name.ljust(width)}  {value}")

    def explanations(self) -> list[str]:
        """What the summaries' counts mean, with this run's numbers."""
        counts = queue_counts(self.settings.jobs)
        split = " + ".join(f"{count} {queue.value}" for queue, count in counts.items())
        return [
            f"submitted: {split} (--jobs {self.settings.jobs} split 60/30/10 %, rounded down, at least 10"
            " streaming), plus the 2 launches of the forced rerun (the one it replaced and its successor).",
            f"replayed: every {REPLAY_EVERY}th submission sent again unchanged, as after a lost acknowledgement,"
            " and the rerun once; each was answered with the original ID and stored nothing.",
            f"conflicts refused: every {CONFLICT_EVERY}th submission sent again with changed content under its"
            " submission ID.",
            "claims: a retried job, or one whose lease ran out, is claimed again.",
            "stale writes refused: completions by workers that stalled past their lease (the drill's, and about"
            f" {self.settings.stall_fraction:.0%} of claims at random).",
            "finished, ended by lease expiry and lost add up to submitted: how each job ended. Ended by lease"
            " expiry: no worker finished the job, because the lease of its last attempt ran out (it ends failed,"
            " \"lease expired with no attempts left\") or a launch's cancel request was never acknowledged (it"
            " ends cancelled); the lease sweep inside a later claim ended it.",
            "service attempts: transmissions exceed attempts where an attempt was sent again on proof that its"
            " first transmission did nothing; where the provider offers neither replay nor lookup, an ambiguous"
            " transmission stays indeterminate, for an operator: never failed, never sent again.",
            "workflow runs: a quarter each of one-hop Runs, Runs that park on a consent, Runs that park on a"
            " delegated job (each resumed by its decided owner on a second hop) and Runs cancelled while their"
            " hop runs (the first abort fails, so they stay cancelling; a late settlement is refused; the second"
            " abort proves the hop fenced). Every hop is also delivered a second time and skipped.",
        ]


async def run_demo(settings: DemoSettings, out: TextIO | None = None) -> int:
    """Run the demo; returns the process exit status (0 when every invariant held)."""
    return await Demo(settings, out if out is not None else sys.stdout).run()
