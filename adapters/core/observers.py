"""What the workers tell an observer (metrics, traces): the hooks, and their contract.

:class:`~tenure.adapters.Worker` and :class:`~tenure.adapters.RunWorker` take an optional
observer (``metrics=``), and a :class:`~tenure.adapters.RunLedger` has one as its
``metrics`` attribute; :class:`tenure.apps.metrics.Instruments` implements every
protocol here (Prometheus counters and histograms, OpenTelemetry spans). With ``None``,
the default, the hot path pays one ``is None`` check per event and imports nothing.

The contract, for any implementation:

- an observer only watches: nothing it returns changes what the worker decides or writes
  (the one object it hands back that the worker uses, :meth:`JobObserver.run_handler`'s
  task, must be the task ``start`` made);
- it never raises and never blocks (its calls run on the worker's event loop, inside the
  worker's own tasks);
- it is called from one event loop, never from two threads at once.

Times: a job's ``due_at_us`` and ``claimed_at_us`` (on its claimed record) are the
database's clock, read by the claim; every duration an observer measures itself
(handler, settle, hop) is this process's monotonic clock.

The hooks name no machine's module: what they are handed is typed by the protocols here
(:class:`JobContextView`, :class:`RecoveryReportView`), and the machine that calls a
hook names its own type as the parameter (``WorkerObserver[JobContext]`` in the queue's
worker, ``RuntimeObserver[RecoveryReport]`` for the Run runtime's reports), so an
observer may be written against either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from tenure.model import ConsentRecord, QueueKind, RunClaim, RunRecord

__all__ = ["WorkerObserver", "JobObserver", "RunWorkerObserver", "HopObserver", "LedgerObserver",
           "RuntimeObserver", "JobContextView", "RecoveryReportView", "RecoveryIssueView", "SETTLE_RESULTS",
           "HANDLER_OUTCOMES"]

SETTLE_RESULTS = ("completed", "failed", "retried", "cancel_acknowledged", "stale_write_refused")
"""What :meth:`JobObserver.settled` reports: the job's status after the fenced write
(``completed``, ``failed``, ``retried`` for a failure sent back to pending, and
``cancel_acknowledged`` for a streaming launch), or ``stale_write_refused`` when the
write was refused because the claim was no longer this worker's."""

HANDLER_OUTCOMES = ("complete", "fail", "cancelled")
"""What :meth:`JobObserver.handler_ended` reports: the handler returned (``complete``),
raised or returned what is not a JSON object (``fail``), or was cancelled (its lease was
lost, or the worker stopped)."""


class JobContextView(Protocol):
    """What an observer may read of a claimed job's context (the queue worker's
    :class:`~tenure.adapters.queue.job.JobContext` is one): the fence's public parts,
    the claim's attempt and, for a task, its name and queue."""

    @property
    def queue(self) -> QueueKind: ...

    @property
    def job_id(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def task_name(self) -> str | None: ...

    @property
    def queue_name(self) -> str | None: ...


class RecoveryIssueView(Protocol):
    """One Run that made a recovery pass degraded: the reason is an authored word."""

    @property
    def reason(self) -> str: ...


class RecoveryReportView(Protocol):
    """What an observer may read of a recovery pass's report (the Run recovery's
    :class:`~tenure.adapters.runs.recovery.RecoveryReport` is one)."""

    @property
    def degraded(self) -> bool: ...

    @property
    def counts(self) -> Mapping[str, int]: ...

    @property
    def issues(self) -> Sequence[RecoveryIssueView]: ...


Context = TypeVar("Context", bound=JobContextView, contravariant=True)
Report = TypeVar("Report", bound=RecoveryReportView, contravariant=True)


class JobObserver(Protocol):
    """One claimed job, from its claim to the end of its task (one per claim)."""

    def run_handler(self, start: Callable[[], asyncio.Task[Any]]) -> asyncio.Task[Any]:
        """Call ``start`` (which creates the handler's task) and return what it returned;
        an observer calls it in the context its handler should see (a current span)."""
        ...

    def handler_ended(self, outcome: str, error: BaseException | None) -> None:
        """The handler ended: one of :data:`HANDLER_OUTCOMES`, with what it raised as the
        worker logs it (:func:`~tenure.adapters.core.failure_text.loggable_exception`: the
        type's name, frames and chain, each message cleaned and cut as the stored error
        text, or left out under ``store_error_text=False``)."""
        ...

    def settle_started(self) -> None:
        """The handler's outcome is about to be written."""
        ...

    def settled(self, result: str) -> None:
        """The write answered: one of :data:`SETTLE_RESULTS`."""
        ...

    def lease_lost(self) -> None:
        """The claim's lease may have ended while this worker held it."""
        ...

    def released(self) -> None:
        """The claim was given back at shutdown (pending again at once)."""
        ...

    def finished(self) -> None:
        """The job's task ended: nothing more is said about it."""
        ...


class WorkerObserver(Protocol[Context]):
    """The hooks of a queue :class:`~tenure.adapters.Worker` (a ``WorkerObserver[JobContext]``)."""

    def claim_started(self, want: int) -> object:
        """A claim call for up to ``want`` jobs is sent; the token goes to :meth:`claim_ended`."""
        ...

    def claim_ended(self, token: object, claimed: int | None) -> None:
        """The claim call answered with ``claimed`` jobs (None: it failed or raised)."""
        ...

    def job_claimed(self, claimed: Any, context: Context) -> JobObserver:
        """One claimed record (``ClaimedTask``, ``ClaimedJob``, ...) and its handler's
        context: the observer of that job."""
        ...

    def call_failed(self, call: str) -> None:
        """A call to the database failed (``claim``, ``write``, ``heartbeat``, ...)."""
        ...


class HopObserver(Protocol):
    """One delivered hop of a Run, from its delivery to its outcome."""

    def claimed(self, claim: RunClaim) -> None:
        """The hop claimed its Run (never called for a hop that was not claimed)."""
        ...

    def ended(self, outcome: str | None) -> None:
        """The hop ended with one of ``RunWorker``'s ``OUTCOMES`` (None: cancelled
        without a known outcome). Only the first call counts."""
        ...


class RunWorkerObserver(Protocol):
    """The hooks of a :class:`~tenure.adapters.RunWorker`."""

    def hop_started(self, run_id: str, enqueue_seq: int) -> HopObserver:
        """A delivered hop starts (before its claim)."""
        ...

    def consent_decided(self, claim: RunClaim, consent: ConsentRecord) -> None:
        """A resumed hop loaded the decided consent its Run waited on."""
        ...


class LedgerObserver(Protocol):
    """The hook of a :class:`~tenure.adapters.RunLedger` (its ``metrics`` attribute)."""

    def run_admitted(self, run: RunRecord) -> None:
        """A new Run was admitted (a replay of a stored admission is not)."""
        ...


class RuntimeObserver(Protocol[Report]):
    """What a Run runtime's recovery passes report (a ``RuntimeObserver[RecoveryReport]``)."""

    def recovery_report(self, pass_kind: str, report: Report) -> None:
        """A recovery pass (``startup``, ``relay``, ``reboot``, ``takeover``) finished."""
        ...
