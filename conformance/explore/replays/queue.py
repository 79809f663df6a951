"""An explorer trace of the owned queue, replayed against a real database.

The explorer (:mod:`tenure.conformance.explore.queue`) finds a shortest trace in a world of
kernel records. :func:`replay_queue_trace` runs the same trace through tenure's public
queue sources on a database (a scratch area, as ``tenure conform`` makes): every command
the trace sent to the kernel goes to the source that serves it (a claim to
``claim_next_owned``, a fenced write to its fenced method, an operator's cancel to
``cancel``, ...), a step of the clock moves the stored instants back by as much (the
database clock cannot jump; moving every instant back is the same to every comparison the
kernel makes), and a crash or a lost acknowledgement changes nothing in the database
(only what the worker believes). After each step the database's answer is compared with
the kernel's decision in the trace (applied, or refused), in lockstep; the result lists
each step with both answers. Replayed under the same mutant kernel, a trace shows the
broken property reaching the database; replayed under tenure's kernel, it shows where the
database refuses what the mutant accepted.

A claim is replayed only when the database's claim takes the row the trace's claim took:
the explorer offers a claim every row (the kernel must decide any), while a store's
finder takes the first eligible one. A step the database cannot follow that way ends the
replay, reported as ``not replayable``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

from tenure.adapters import StreamingJobSource, TaskSource, ValidationJobSource
from tenure.adapters.core.urls import parse_db_url
from tenure.conformance.explore.engine import Step
from tenure.conformance.explore.queue import LEASE_US, QueueWorld
from tenure.kernel.queue.commands import (
    AcknowledgeCancelOwned,
    CancelAdmin,
    ClaimOwned,
    CompleteLegacy,
    CompleteOwned,
    FailLegacy,
    FailOwned,
    HeartbeatLegacy,
    HeartbeatOwned,
    ProgressOwned,
    RecoverOwned,
    ReleaseOwned,
    RequestCancel,
    RetryFailed,
    SetPidLegacy,
    SetPidOwned,
    SubmitLegacy,
    SubmitOwned,
)
from tenure.model import QueueClaimFence, QueueKind, StreamingJob, TaskJob, TenureError, ValidationJob, WorkerConfig

from tenure.conformance.lockstep import raw

__all__ = ["ReplayedStep", "replay_queue_trace", "replay_table", "replay_script", "main"]


@dataclasses.dataclass(frozen=True)
class ReplayedStep:
    number: int
    actor: str
    action: str
    kernel: str
    """What the kernel decided in the trace: ``applied`` or ``refused``."""
    database: str
    """What the database answered: ``applied``, ``refused``, an error code, or ``not replayable``."""

    @property
    def agrees(self) -> bool:
        return self.kernel == self.database


def _envelope(command: SubmitOwned | SubmitLegacy) -> Any:
    """The public request whose stored form the trace's submission stands for (changed
    content: another data source)."""
    changed = isinstance(command, SubmitOwned) and command.fingerprint == "v1:changed"
    if command.queue is QueueKind.STREAMING:
        return StreamingJob("orders", "1", {"v": "2" if changed else "1"}, job_id=command.job_id,
                            max_attempts=command.max_attempts)
    if command.queue is QueueKind.TASK:
        assert command.queue_name is not None and command.task_name is not None
        return TaskJob(command.queue_name, command.task_name, {"user_id": 2 if changed else 1},
                       priority=command.priority, retry_base_ms=0, retry_max_ms=0, retry_jitter=False,
                       job_id=command.job_id, max_attempts=command.max_attempts)
    return ValidationJob("orders", "1", "changed" if changed else "s", job_id=command.job_id,
                         max_attempts=command.max_attempts)


def _fence(fence: Any) -> QueueClaimFence:
    return QueueClaimFence(fence.queue, fence.job_id, fence.owner_id, fence.generation, fence.claim_token)


class _Replayer:
    def __init__(self, db_url: str) -> None:
        config = WorkerConfig(db_url, lease_seconds=LEASE_US / 1e6, heartbeat_seconds=LEASE_US / 3e6,
                              backoff_base_ms=1000, backoff_max_ms=4000)
        self.db_url = db_url
        self.sources: dict[QueueKind, Any] = {
            QueueKind.VALIDATION: ValidationJobSource(db_url, config),
            QueueKind.STREAMING: StreamingJobSource(db_url, config),
            QueueKind.TASK: TaskSource(db_url, config),
        }

    async def close(self) -> None:
        for source in self.sources.values():
            await source.close()

    async def answer(self, command: Any, queue: QueueKind, job_id: str) -> str:
        """The database's answer to ``command``: applied, refused, or an error code."""
        source = self.sources[queue]
        try:
            done = await self._send(source, command, job_id)
        except TenureError as error:
            return error.code.value
        return "applied" if done else "refused"

    async def _send(self, source: Any, command: Any, job_id: str) -> Any:
        if isinstance(command, SubmitOwned):
            await source.submit_owned(_envelope(command), submission_id=command.submission_id)
            return True
        if isinstance(command, SubmitLegacy):
            await source.submit(_envelope(command))
            return True
        if isinstance(command, ClaimOwned):
            extra = {} if command.queue_names is None else {"queues": list(command.queue_names)}
            claimed = await source.claim_next_owned(command.owner_id, claim_token=command.claim_token, **extra)
            if claimed is not None and job_id and claimed.claim_fence.job_id != job_id:
                raise _NotReplayable()
            return claimed is not None
        if isinstance(command, RecoverOwned):
            return await source.recover_owned_claim(command.owner_id, claim_token=command.claim_token) is not None
        fenced = {
            HeartbeatOwned: lambda: source.heartbeat_owned(_fence(command.fence)),
            CompleteOwned: lambda: source.complete_owned(_fence(command.fence), None),
            ReleaseOwned: lambda: source.release_owned(_fence(command.fence)),
            SetPidOwned: lambda: source.set_pid_owned(_fence(command.fence), command.pid),
            AcknowledgeCancelOwned: lambda: source.acknowledge_cancel_owned(_fence(command.fence)),
            ProgressOwned: lambda: source.progress_owned(_fence(command.fence), {"done": 1}),
        }
        if type(command) in fenced:
            return await fenced[type(command)]()
        if isinstance(command, FailOwned):
            if command.fence.queue is QueueKind.STREAMING:
                return await source.fail_owned(_fence(command.fence), command.error_message, retry=command.retry)
            return await source.fail_owned(_fence(command.fence), command.error_message, retry=command.retry)
        by_id = {
            CancelAdmin: lambda: source.cancel(job_id),
            RequestCancel: lambda: source.request_cancel(job_id),
            RetryFailed: lambda: source.retry_failed(job_id),
            HeartbeatLegacy: lambda: source.heartbeat(job_id, command.owner_id),
            CompleteLegacy: lambda: source.complete(job_id, None),
            FailLegacy: lambda: source.fail(job_id, command.error_message, retry=command.retry),
            SetPidLegacy: lambda: source.set_pid(job_id, command.pid),
        }
        return await by_id[type(command)]()


class _NotReplayable(Exception):
    pass


def _move_clock_back(db_url: str, kinds: Sequence[QueueKind], by_us: int) -> None:
    """The clock stepped ``by_us`` on: every stored instant moves back as much."""
    for queue in set(kinds):
        for column in ("lease_expires_at", "claimed_at", "created_at", "completed_at"):
            raw.shift_instants(db_url, queue, column, by_us)
        raw.shift_instants(db_url, queue, "fires_at", by_us)


async def _replay(db_url: str, kinds: Sequence[QueueKind], initial: QueueWorld,
                  trace: Sequence[tuple[Step, QueueWorld]]) -> list[ReplayedStep]:
    replayer = _Replayer(db_url)
    replayed: list[ReplayedStep] = []
    try:
        previous = initial
        for number, (step, world) in enumerate(trace, start=1):
            action = step.action + (f" {step.detail}" if step.detail else "")
            if step.actor == "clock":
                await asyncio.to_thread(_move_clock_back, db_url, kinds, world.now_us - previous.now_us)
            commands = [last for last in world.last if last.command.__class__.__name__ != "ExpireLease"]
            if world.last and not commands:
                # A claim that found nothing eligible but swept expired leases: the
                # database's claim sweeps as it finds nothing.
                sweep = ClaimOwned(owner_id="sweeper", claim_token=f"sweep-{number}", nonce_already_stored=False,
                                   lease_us=LEASE_US)
                database = await replayer.answer(sweep, kinds[world.last[0].slot], "")
                replayed.append(ReplayedStep(number, step.actor, action, "refused", database))
            for last in commands:
                queue = kinds[last.slot]
                kernel = "applied" if last.applied else "refused"
                try:
                    database = await replayer.answer(last.command, queue, f"job-{last.slot + 1}")
                except _NotReplayable:
                    replayed.append(ReplayedStep(number, step.actor, action, kernel, "not replayable"))
                    return replayed
                replayed.append(ReplayedStep(number, step.actor, action, kernel, database))
            if not world.last or step.actor == "clock":
                replayed.append(ReplayedStep(number, step.actor, action, "-", "-"))
            previous = world
        # Then every job as stored: status, attempts and generation, as the kernel left them.
        final = trace[-1][1] if trace else initial
        for slot, row in enumerate(final.rows):
            queue = kinds[slot]
            info = await replayer.sources[queue].get_job(f"job-{slot + 1}")
            kernel = "absent" if row is None else f"{row.status.value} a{row.attempts} g{row.generation}"
            database = "absent" if info is None else f"{info.status.value} a{info.attempt} g{info.generation}"
            replayed.append(ReplayedStep(len(trace) + 1, "", f"stored job-{slot + 1}", kernel, database))
    finally:
        await replayer.close()
    return replayed


def replay_queue_trace(db_url: str, kinds: Sequence[QueueKind], initial: QueueWorld,
                       trace: Sequence[tuple[Step, QueueWorld]]) -> list[ReplayedStep]:
    """Replay ``trace`` (from ``initial``, in a world of jobs of ``kinds``) against the
    migrated, empty database ``db_url``; see the module's docstring."""
    parse_db_url(db_url)
    return asyncio.run(_replay(db_url, kinds, initial, trace))


def replay_table(steps: Sequence[ReplayedStep]) -> str:
    rows = [("#", "actor", "action", "kernel", "database")]
    rows += [(str(s.number), s.actor, s.action, s.kernel, s.database + ("" if s.agrees or s.kernel == "-" else "  <--"))
             for s in steps]
    widths = [max(len(row[column]) for row in rows) for column in range(5)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def replay_script(kinds: Sequence[QueueKind], initial: QueueWorld, trace: Sequence[tuple[Step, QueueWorld]],
                  table: str) -> str:
    """A Python script that replays ``trace`` against the database its ``--db`` (or
    ``TENURE_DB``) names, in a scratch area it removes: exit 0 when the database answers
    every step as the trace's kernel decided, 1 when it does not, 2 when it cannot run."""
    import base64
    import pickle

    recorded = base64.b64encode(pickle.dumps((tuple(kinds), initial, tuple(trace)))).decode()
    lines = "\n".join("    " + line for line in table.splitlines()).replace(chr(34) * 3, chr(39) * 3)
    return f'''#!/usr/bin/env python3
r"""An explorer trace of the owned queue, replayed against a database in lockstep.

    python {{this file}} --db URL        (or TENURE_DB=URL python {{this file}})

The trace (recorded with the tenure version that wrote this file):
{lines}
"""
import sys

from tenure.conformance.explore.replays.queue import main

TRACE = "{recorded}"

if __name__ == "__main__":
    sys.exit(main(TRACE, sys.argv[1:]))
'''


def main(recorded: str, argv: Sequence[str]) -> int:
    """What a written replay script runs (see :func:`replay_script`)."""
    import argparse
    import base64
    import os
    import pickle

    from tenure.conformance.drivers.scratch import ScratchRefused, open_scratch

    parser = argparse.ArgumentParser(description="Replay an explorer trace against a database.")
    parser.add_argument("--db", default=None, help="database URL (default: $TENURE_DB)")
    arguments = parser.parse_args(list(argv))
    db_url = arguments.db or os.environ.get("TENURE_DB")
    if not db_url:
        print("replay refused: --db or TENURE_DB names the database", file=sys.stderr)
        return 2
    kinds, initial, trace = pickle.loads(base64.b64decode(recorded))  # noqa: S301 - the file tenure itself wrote
    try:
        area = asyncio.run(open_scratch(db_url))
    except ScratchRefused as refused:
        print(f"replay refused: {refused.reason}", file=sys.stderr)
        return 2
    try:
        steps = replay_queue_trace(area.acquire(pathlib.Path(".")), kinds, initial, trace)
    finally:
        asyncio.run(area.drop())
    print(replay_table(steps))
    agrees = all(step.agrees or step.kernel == "-" for step in steps)
    print("the database answered every step as the trace's kernel decided" if agrees
          else "the database departed from the trace (marked <--)")
    return 0 if agrees else 1
