"""The Run worker: executes the hops a broker delivers, fenced by the Run ledger.

A broker hands the worker a run ID and a sequence, nothing else. The worker waits at its
claim gate (:meth:`RunWorker.pause` closes it for every hop not yet claimed), claims that
exact hop in the ledger (a stale or duplicate delivery is ``skipped``), finds the pinned
workflow in its registry, and on a resumed hop loads the checkpoint and its decided
owner. It runs the workflow in a task of its own and, beside it, a watch: every
``watch_interval_s`` it re-reads the Run, and when the hop does not hold it any more
(CANCELLING, or anything but RUNNING or AWAITING_HARDWARE at this sequence) it cancels
the workflow and leaves the Run to whoever holds it now: a cancellation's election is
never raced with FAILED. The watch also refreshes the broker's liveness of the job
(SAQ's heartbeat) every :data:`TOUCH_EVERY_S`.

Outcomes of one hop (counted in :attr:`RunWorker.outcomes`): ``skipped`` (not claimed),
``unserved`` (not claimed: the Run is pinned to a workflow name and version this
worker's registry does not hold, so the ledger refused the claim and left the Run as it
was; the broker gives the hop to a worker that serves it, see
:data:`~tenure.adapters.runs.broker.UNSERVED_OUTCOME`),
``done`` (settled DONE, checkpoint deleted), ``failed`` (settled FAILED:
``workflow_unavailable`` (the worker serves the Run's name and version, but under another
digest: changed code under the same version), ``checkpoint_invalid``, ``workflow_error:<Type>: <message>``
(the type alone with ``store_error_text=False``), ``workflow_diverged: ...`` (a
replayed workflow asked for another call than its journal holds:
:class:`WorkflowDiverged`), or ``corrupt_row`` when the claimed Run's stored intent
cannot be read), ``parked`` (waits for an owner), ``cancelled`` (an
operator cancelled the Run while the hop ran: CANCELLING or CANCELLED when the hop
learned it), ``lost`` (the Run moved on without this hop otherwise: failed by recovery,
or a later hop holds it), ``unsettled`` (the ledger refused the settle because an effect
is not contained: the Run stays RUNNING for recovery).

A workflow that raises is logged at ERROR with its traceback, once its outcome is
written, with the Run ID, workflow, hop sequence and node as ``extra`` fields (``run_id``,
``workflow``, ``seq``, ``node``, ``outcome``), like every line this worker writes about
one hop. A hop cancelled from outside (its
broker job aborted, or the worker stopping) cancels its workflow and propagates the
cancellation, so the broker sees the abort acknowledged. The exception is a stop that
meets a hop whose workflow already ended: its outcome write goes on until the stop's
deadline (:meth:`RunWorker.stop`), so a Run whose workflow returned is settled, not left
RUNNING for the next start to fail ``lost``.

``metrics`` (a :class:`~tenure.adapters.core.observers.RunWorkerObserver`, such as
:class:`tenure.apps.metrics.Instruments`) is told of each hop's start, claim and
outcome and of each decided consent a resumed hop loads; None (default) observes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from tenure.kernel.runs.record import hop_holds, operator_cancelled
from tenure.model import (
    ConfigValidationError,
    ErrorCode,
    RunClaim,
    RunRecord,
    RunStatus,
    TenureError,
    WaitKind,
)
from tenure.model.validation import refuse

from ..core.failure_text import MAX_ERROR_BYTES, exception_text, loggable_exception
from ..core.text import clean_text
from .broker import Broker, HopSource, PinnedPublisher, Touch
from .checkpoints import RecordedOutcome
from .ledger import RunLedger, Unserved, result_text
from .workflows import HopLost, HopParked, RunContext, WorkflowDiverged, Workflows, owner_is_decided

if TYPE_CHECKING:
    from ..core.observers import HopObserver, RunWorkerObserver
    from .recovery import RecoveryPorts

__all__ = ["RunWorker", "WorkerStopFailed", "OUTCOMES", "TOUCH_EVERY_S"]

log = logging.getLogger("tenure.runs.worker")
T = TypeVar("T")

OUTCOMES = ("skipped", "unserved", "done", "failed", "parked", "cancelled", "lost", "unsettled")

PERSIST_BACKOFF_FIRST_S = 0.05
PERSIST_BACKOFF_MAX_S = 2.0
"""A hop's outcome is retried through a database outage: 50 ms, doubling to 2 s."""

ABORT_READ_S = 2.0
"""How long a hop aborted from outside may spend reading its Run to learn why (an
operator's cancel, counted ``cancelled``, or anything else, counted ``lost``)."""

TOUCH_EVERY_S = 30.0
"""How often a running hop refreshes its broker job's liveness (the seed's 30 s)."""

UNSETTLED_RETRY_FIRST_S = 1.0
UNSETTLED_RETRY_MAX_S = 60.0
"""A hop left ``unsettled`` is settled again (:meth:`RunWorker.settle_unsettled`) after
1 s, doubling to 60 s, until its effects are contained."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Unsettled:
    """A finished hop whose settle was refused while an effect of its Run was open: its
    recorded outcome, and when to try the settle again (this process's monotonic clock)."""

    outcome: RecordedOutcome
    claimed_at: dt.datetime
    """When the hop's claim applied (the Run's ``updated_at`` after it, the database clock)."""
    due: float
    interval_s: float

    @classmethod
    def first(cls, outcome: RecordedOutcome, claimed_at: dt.datetime) -> _Unsettled:
        return cls(outcome, claimed_at, time.monotonic() + UNSETTLED_RETRY_FIRST_S, UNSETTLED_RETRY_FIRST_S)

    def later(self) -> _Unsettled:
        interval = min(self.interval_s * 2, UNSETTLED_RETRY_MAX_S)
        return dataclasses.replace(self, due=time.monotonic() + interval, interval_s=interval)



STOP_GRACE_S = 1.0
"""The end of a stop's deadline kept for cancelling the hops whose outcome write did
not finish before it (at most a tenth of the deadline, see :func:`stop_grace_s`)."""


def stop_grace_s(deadline_s: float) -> float:
    """The part of a stop's ``deadline_s`` kept for cancelling hops still writing."""
    return min(STOP_GRACE_S, deadline_s / 10)


def _uncancel() -> None:
    """Take back the cancellation the current task just absorbed (so a later
    ``asyncio.timeout`` in it still works)."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class WorkerStopFailed(Exception):
    """Some hop tasks did not end by the stop deadline: they may still write, so nothing
    they use may be closed. Carries only the count."""

    def __init__(self, live_tasks: int) -> None:
        super().__init__(f"{live_tasks} hop task(s) still running after the stop deadline")
        self.live_tasks = live_tasks


_refuse = functools.partial(refuse, reason="invalid_worker")


class RunWorker:
    """Executes hops of ``queues`` delivered by ``broker`` (which must be a
    :class:`~tenure.adapters.runs.broker.HopSource` to :meth:`start`; :meth:`perform`
    alone works with any broker)."""

    def __init__(
        self, ledger: RunLedger, broker: Broker, workflows: Workflows, *, node: str, concurrency: int = 4,
        queues: Iterable[str] = ("runs",), watch_interval_s: float = 1.0, store_error_text: bool = True,
        metrics: RunWorkerObserver | None = None,
    ) -> None:
        if not isinstance(ledger, RunLedger):
            raise _refuse("ledger", "run_ledger_required")
        if not isinstance(broker, Broker):
            raise _refuse("broker", "broker_required")
        if not isinstance(workflows, Workflows):
            raise _refuse("workflows", "workflows_required")
        if type(node) is not str or not node or len(node) > 128:
            raise _refuse("node", "node_required")
        if type(concurrency) is not int or not 1 <= concurrency <= 1024:
            raise _refuse("concurrency", "integer_out_of_range")
        names = frozenset(queues) if not isinstance(queues, str) else frozenset()
        if not names or not all(type(q) is str and q for q in names):
            raise _refuse("queues", "queue_names_required")
        if type(watch_interval_s) not in (int, float) or not 0 < watch_interval_s <= 60:
            raise _refuse("watch_interval_s", "number_out_of_range")
        if type(store_error_text) is not bool:
            raise _refuse("store_error_text", "bool_required")
        if metrics is not None and not all(callable(getattr(metrics, name, None))
                                           for name in ("hop_started", "consent_decided")):
            raise _refuse("metrics", "run_worker_observer_required")
        self.metrics = metrics
        self.ledger = ledger
        self.broker = broker
        self.workflows = workflows
        self.node = node
        self.concurrency = concurrency
        self.queues = names
        self.watch_interval_s = float(watch_interval_s)
        self.store_error_text = store_error_text
        """Whether a raising workflow's stored error keeps the exception's message (bounded
        to 2,048 UTF-8 bytes, control characters replaced) after its type; False keeps
        the type alone (a message may carry data that must not be stored)."""
        self.outcomes: Counter[str] = Counter({name: 0 for name in OUTCOMES})
        self.persist_retries = 0
        """Database failures a hop's outcome met and retried through (an operator's signal)."""
        self._gate = asyncio.Event()
        self._gate.set()
        self._hops: set[asyncio.Task[Any]] = set()
        self._stopping = asyncio.Event()
        self._outcomes_on_stop = True
        """While set, a stop's cancellation leaves the outcome write of a workflow that
        ended alone (cleared at the stop's deadline for outcomes)."""
        self._serving: asyncio.Task[None] | None = None
        self._unsettled: dict[str, _Unsettled] = {}
        """This worker's hops left ``unsettled``, by Run ID (:meth:`settle_unsettled`)."""

    # --- the claim gate ----------------------------------------------------------------

    def pause(self) -> None:
        """Close the claim gate: delivered hops wait before claiming (running hops go on)."""
        self._gate.clear()

    def resume(self) -> None:
        """Open the claim gate again."""
        self._gate.set()

    @property
    def paused(self) -> bool:
        return not self._gate.is_set()

    # --- one hop -----------------------------------------------------------------------

    async def perform(self, run_id: str, enqueue_seq: int, touch: Touch | None = None) -> str:
        """Execute one delivered hop; returns its outcome (one of :data:`OUTCOMES`)."""
        task = asyncio.current_task()
        if task is not None:
            self._hops.add(task)
        hop = None if self.metrics is None else self.metrics.hop_started(run_id, enqueue_seq)
        try:
            outcome = await self._perform(run_id, enqueue_seq, touch, hop)
        except BaseException:
            if hop is not None:
                hop.ended(None)  # no outcome known (an abort that learned why said so already)
            raise
        finally:
            if task is not None:
                self._hops.discard(task)
        self.outcomes[outcome] += 1
        if hop is not None:
            hop.ended(outcome)
        return outcome

    async def _perform(self, run_id: str, enqueue_seq: int, touch: Touch | None, hop: HopObserver | None) -> str:
        await self._gate.wait()
        # The same claim, with the same token, is sent again after a database failure: a
        # COMMIT that applied unacknowledged is answered with the claim it made (the Run
        # would otherwise stay RUNNING on this live node, which no relay touches).
        claimant = secrets.token_hex(16)
        try:
            claim = await self._durably(run_id, "claim", lambda: self.ledger.claim_served(
                run_id, enqueue_seq, node=self.node, claimant=claimant, serves=self.workflows.served()))
        except TenureError as error:
            if error.reason != "corrupt_row":
                raise
            log.warning("a claimed Run could not be read (written outside tenure): failed corrupt_row")
            return "failed"  # the claim settled it FAILED: the other hops go on
        if claim is None:
            return "skipped"
        if isinstance(claim, Unserved):
            self._log_unserved(run_id, enqueue_seq)
            return "unserved"
        if hop is not None:
            hop.claimed(claim)
        workflow = self.workflows.resolve(claim.workflow)
        if workflow is None:
            return await self._fail(claim, "workflow_unavailable")
        # The hop holds its Run from here: a database failure while reading its checkpoint
        # is retried (the Run would otherwise stay RUNNING on this live node, which no
        # relay touches), like its outcome and settlement.
        context = await self._durably(claim.run.run_id, "checkpoint", lambda: self._context(claim))
        if context is None:
            return await self._fail(claim, "checkpoint_invalid")
        body = asyncio.ensure_future(workflow(context))
        watch = asyncio.ensure_future(self._watch(claim, context, touch))
        try:
            await asyncio.wait({body, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            if self._keeps_outcome(body):
                # The worker began to stop in the very step the workflow ended: its
                # outcome is written all the same (below), within the stop's deadline.
                _uncancel()
                return await self._outcome_of(asyncio.ensure_future(self._finish(claim, context, body, watch)))
            # Aborted at the broker, or the worker is stopping: stop the workflow, then
            # let the cancellation through (the broker records the abort).
            # The hop's task never ends before its workflow did: a later cancellation
            # is absorbed here, so a stop deadline sees a stuck workflow as still live.
            body.cancel()
            watch.cancel()
            while not (body.done() and watch.done()):
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({body, watch})
            if not self._stopping.is_set():  # aborted from outside: say why, when one read can tell
                with contextlib.suppress(Exception):
                    run = await asyncio.wait_for(self.ledger.get(claim.run.run_id), ABORT_READ_S)
                    if run is not None and hop_holds(run, claim.enqueue_seq):
                        # Fenced (the node's lease) or aborted by its broker while the hop
                        # still holds its Run: recovery settles it; it is not lost.
                        log.info("run %s (%s, hop %d): stopped while holding its Run; recovery settles it",
                                 claim.run.run_id, claim.workflow.name, claim.enqueue_seq,
                                 extra=self._fields(claim, "stopped"))
                    else:
                        outcome = self._moved_on(claim, run)
                        self.outcomes[outcome] += 1
                        if hop is not None:
                            hop.ended(outcome)
            raise
        if not body.done():  # the watch saw the Run move on without this hop
            body.cancel()
            await asyncio.wait({body})
            return self._moved_on(claim, watch.result())
        return await self._outcome_of(asyncio.ensure_future(self._finish(claim, context, body, watch)))

    def _log_unserved(self, run_id: str, enqueue_seq: int) -> None:
        """Say once per worker that it hands back hops it does not serve (a rolling deploy
        does this for every Run of the other version: one line, not one per hop)."""
        level = logging.DEBUG if self.outcomes["unserved"] else logging.INFO
        log.log(level, "run %s (hop %d): its workflow version is not one this worker serves; "
                "handed back to the broker for a worker that does", run_id, enqueue_seq,
                extra={"run_id": run_id, "seq": enqueue_seq, "node": self.node, "outcome": "unserved"})

    def _keeps_outcome(self, body: asyncio.Future[Any]) -> bool:
        """Whether a hop cancelled now still writes its outcome: the worker is stopping
        (and its stop's deadline for outcomes has not passed) and the workflow ended with
        one (returned or raised; not parked, not lost, not cancelled)."""
        if not (self._outcomes_on_stop and self._stopping.is_set() and body.done()) or body.cancelled():
            return False
        return not isinstance(body.exception(), (HopLost, HopParked))

    async def _outcome_of(self, finishing: asyncio.Future[str]) -> str:
        """Wait for ``finishing`` (the outcome write of a workflow that ended, in a task of
        its own). A stop's cancellation does not reach it: the stop waits for it until its
        deadline for outcomes (:meth:`stop`), and a Run whose workflow returned is never
        left RUNNING for the next start to fail ``lost`` (or, parked on its decided owner,
        to run again). Any other cancellation (an abort, a fence, the stop's deadline)
        cancels the write, waits for it to end and propagates."""
        while True:
            try:
                return await asyncio.shield(finishing)
            except asyncio.CancelledError:
                if self._outcomes_on_stop and self._stopping.is_set() and not finishing.cancelled():
                    _uncancel()
                    continue
                finishing.cancel()
                while not finishing.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait({finishing})
                raise

    def _fields(self, claim: RunClaim, outcome: str) -> dict[str, Any]:
        """The ``extra`` fields of a line about one hop."""
        return {"run_id": claim.run.run_id, "workflow": claim.workflow.name, "seq": claim.enqueue_seq,
                "node": self.node, "outcome": outcome}

    def _moved_on(self, claim: RunClaim, run: RunRecord | None) -> str:
        """``cancelled`` when an operator's cancel took the Run from this hop, else
        ``lost``; logged either way (the hop's work stopped unfinished)."""
        outcome = "cancelled" if run is not None and operator_cancelled(run) else "lost"
        log.info("run %s (%s, hop %d): %s; the hop stopped", claim.run.run_id, claim.workflow.name,
                 claim.enqueue_seq, "cancelled by an operator" if outcome == "cancelled" else
                 "the Run moved on without this hop", extra=self._fields(claim, outcome))
        return outcome

    async def _gone(self, claim: RunClaim) -> str:
        """:meth:`_moved_on` after one read of the Run (a failed read: ``lost``)."""
        try:
            run = await self.ledger.get(claim.run.run_id)
        except TenureError:
            run = None
        return self._moved_on(claim, run)

    async def _context(self, claim: RunClaim) -> RunContext | None:
        """The hop's context; None when a resumed hop's checkpoint does not bind a decided
        owner of this Run (``checkpoint_invalid``). A fresh hop of a Run that recovery
        retried (``hop_retries``) gets the Run's checkpoint too, for its ``state``: the
        state its lost try saved last."""
        run_id = claim.run.run_id
        checkpoint = consent = job = attempt = message = None
        if not claim.resume and claim.run.hop_retries:
            checkpoint = await self.ledger.checkpoints.load(run_id)
        if claim.resume:
            checkpoint = await self.ledger.checkpoints.load(run_id)
            if checkpoint is None or checkpoint.owner_kind is None or checkpoint.owner_id is None:
                return None
            owner: Any
            if checkpoint.owner_kind is WaitKind.TIMER:
                # A timer has no owner row: the Run resumed from it only once it was due.
                return RunContext(claim.run, claim.enqueue_seq, claim.resume, checkpoint, None, None, None,
                                  self.ledger, self.broker, _retry=functools.partial(self._durably, run_id))
            if checkpoint.owner_kind is WaitKind.CONSENT:
                owner = consent = await self.ledger.consents.get(checkpoint.owner_id)
            elif checkpoint.owner_kind is WaitKind.DELEGATE:
                owner = job = await self.ledger.jobs.get(checkpoint.owner_id)
            elif checkpoint.owner_kind is WaitKind.MESSAGE:
                owner = message = await self.ledger.messages.get(checkpoint.owner_id)
            else:
                owner = attempt = await self.ledger.attempts.get(checkpoint.owner_id)
            if not owner_is_decided(checkpoint.owner_kind, owner) or owner.run_id != run_id:
                return None
            if consent is not None and self.metrics is not None:
                self.metrics.consent_decided(claim, consent)
        return RunContext(claim.run, claim.enqueue_seq, claim.resume, checkpoint, consent, job, attempt,
                          self.ledger, self.broker, _retry=functools.partial(self._durably, run_id),
                          receive_answer=None if message is None else message.answer)

    async def _watch(self, claim: RunClaim, context: RunContext, touch: Touch | None) -> RunRecord | None:
        """Returns when the hop does not hold its Run any more (never while it does): the
        Run as it was read then (None: it is gone)."""
        touched = time.monotonic()
        while True:
            await asyncio.sleep(self.watch_interval_s)
            if context.parked:
                continue  # the park settled the delivery; the workflow is finishing up
            if touch is not None and time.monotonic() - touched >= TOUCH_EVERY_S:
                with contextlib.suppress(Exception):  # a missed touch is retried next round
                    await touch()
                touched = time.monotonic()
            try:
                run = await self.ledger.get(claim.run.run_id)
            except TenureError:
                continue  # the database is unreachable: nothing proves the hop lost its Run
            if context.parked:
                # The hop parked while the read was under way (the flag is set before the
                # park's commit, so a read that shows the parked Run finished after it):
                # the Run was parked by this very hop, which is no lost hop.
                continue
            if run is None or not hop_holds(run, claim.enqueue_seq):
                return run

    async def _finish(self, claim: RunClaim, context: RunContext, body: asyncio.Future[Any],
                      watch: asyncio.Future[Any]) -> str:
        watch.cancel()
        await asyncio.wait({watch})
        error = body.exception() if not body.cancelled() else None
        if body.cancelled() or isinstance(error, HopLost):
            return await self._gone(claim)
        if isinstance(error, HopParked):
            return "parked"
        result_json: str | None = None
        if error is None:
            try:
                result_json = result_text(RunStatus.DONE, body.result())
            except ConfigValidationError as refused:
                outcome = await self._outcome(claim, RunStatus.FAILED, error="workflow_result_invalid")
                log.error("run %s (%s, hop %d): the workflow returned an unusable result (%s); %s", claim.run.run_id,
                          claim.workflow.name, claim.enqueue_seq, ", ".join(refused.problems), outcome,
                          extra=self._fields(claim, outcome))
                return outcome
            return await self._outcome(claim, RunStatus.DONE, result_json=result_json)
        if isinstance(error, WorkflowDiverged):
            # A replay that met another call than its journal holds: the error names the
            # position and both calls (code, never data), kept whatever store_error_text says.
            return await self._fail(claim, clean_text(error.stored_text(), MAX_ERROR_BYTES, one_line=True))
        stored = "workflow_error:" + exception_text(error, MAX_ERROR_BYTES - len("workflow_error:"),
                                                    with_message=self.store_error_text)
        outcome = await self._outcome(claim, RunStatus.FAILED, error=stored)
        log.error("run %s (%s, hop %d): the workflow raised %s; %s", claim.run.run_id, claim.workflow.name,
                  claim.enqueue_seq, type(error).__name__, outcome,
                  exc_info=loggable_exception(error, MAX_ERROR_BYTES, with_message=self.store_error_text),
                  extra=self._fields(claim, outcome))
        return outcome

    async def _fail(self, claim: RunClaim, reason: str) -> str:
        outcome = await self._outcome(claim, RunStatus.FAILED, error=reason)
        log.error("run %s (%s, hop %d): %s; %s", claim.run.run_id, claim.workflow.name, claim.enqueue_seq, reason,
                  outcome, extra=self._fields(claim, outcome))
        return outcome

    async def _outcome(self, claim: RunClaim, status: RunStatus, *, result_json: str | None = None,
                       error: str | None = None) -> str:
        """Settle the hop with its outcome in one transaction (``RunEngine.settle`` with
        ``record``): the Run settles (checkpoint deleted, consents swept), or, refused
        because an effect is not contained, the outcome is recorded in its checkpoint row
        for recovery (``unsettled``), or, when the hop no longer holds the Run, nothing is
        written. After a database failure the retry path (:meth:`_settled`) records the
        outcome on its own first, then retries the settle, for as long as this process
        lives: a retry whose first COMMIT applied unacknowledged finds its own result. A
        process that dies before any COMMIT leaves an orphaned hop (``specs/recovery.md``)."""
        run_id, seq = claim.run.run_id, claim.enqueue_seq
        outcome = RecordedOutcome(seq, status, result_json, error)
        try:
            settled = await self._settled(run_id, outcome)
        except TenureError as failure:
            if failure.code is ErrorCode.RUN_CONTAINMENT_UNPROVEN:
                # The outcome is recorded: settled again once contained, by this worker while
                # it lives (settle_unsettled), or by recovery after the next boot.
                self._unsettled[run_id] = _Unsettled.first(outcome, claim.run.updated_at)
                return "unsettled"
            raise
        if not settled:
            # A retried settlement whose first COMMIT applied but went unacknowledged finds
            # its own result; anything else means the Run moved on without this hop
            # (cancelling, recovered, a later hop): whoever holds it finishes it.
            run = await self._persist_read(run_id)
            if run is None or run.status is not status or run.enqueue_seq != seq or run.error != error:
                return self._moved_on(claim, run)
        return "done" if status is RunStatus.DONE else "failed"

    async def settle_unsettled(self, ports: RecoveryPorts | None = None, *, due_only: bool = True) -> int:
        """Settle again each hop this worker left ``unsettled`` whose retry is due (every
        one with ``due_only=False``). Such a hop's workflow ended, but an effect of its Run
        (a delegated job, a child Run, a service attempt) was open, so the Run stayed
        RUNNING with the hop's outcome recorded. No relay visits a hop, and startup
        reconciliation comes only with the node's next boot, so without this a live node
        would leave the Run RUNNING. With recovery's ``ports`` (the
        :class:`~tenure.adapters.RunRuntime` passes its own, every relay interval) the Run
        is reconciled as that boot would (:meth:`RunLedger.recover_ended_hop`: the open
        effects contained, the Run settled with the recorded outcome); without, the settle
        is retried alone (it applies once the effects ended by themselves). A Run that
        settled or moved on is forgotten; one still RUNNING at the hop is tried again
        after a doubling interval (1 s to 60 s). A Run is visited only while it is still at
        the hop (read first; the recovery cutoff covers a move after that read). Returns how
        many Runs ended with their hop's recorded outcome."""
        settled = 0
        now = time.monotonic()
        for run_id, entry in list(self._unsettled.items()):
            if due_only and now < entry.due:
                continue
            seq = entry.outcome.enqueue_seq
            try:
                run = await self.ledger.get(run_id)
                if run is not None and hop_holds(run, seq):  # still the hop's: settle or recover it
                    if ports is None:
                        await self.ledger.engine.settle(run_id, entry.outcome)
                    else:
                        await self.ledger.recover_ended_hop(ports, run_id, node=self.node, claimed_at=entry.claimed_at)
                    run = await self.ledger.get(run_id)
            except TenureError as failure:
                if failure.reason == "corrupt_row":
                    del self._unsettled[run_id]  # a row no retry mends: left to the next boot's recovery
                else:  # still uncontained, or the database away
                    self._unsettled[run_id] = entry.later()
                continue
            if run is not None and hop_holds(run, seq):  # still RUNNING at the hop: not contained yet
                self._unsettled[run_id] = entry.later()
                continue
            del self._unsettled[run_id]
            if run is not None and run.enqueue_seq == seq and run.status is entry.outcome.status:
                settled += 1
                log.info("run %s: its effects are contained; settled %s with its hop's recorded outcome", run_id,
                         entry.outcome.status.value, extra={"run_id": run_id, "node": self.node})
        return settled

    @property
    def unsettled(self) -> int:
        """How many hops of this worker wait to be settled again (:meth:`settle_unsettled`)."""
        return len(self._unsettled)

    async def _settled(self, run_id: str, outcome: RecordedOutcome) -> bool:
        """The settle with its outcome, one transaction in the common case. After a
        database failure, the retry path: the outcome is recorded in a transaction of its
        own first (evidence recovery's ``settle_recorded`` settles the Run with, should
        this process die while the database is away: the hop's answer is kept, never
        failed ``lost``), then the settle is retried; each retried through failures. A
        record refused means the hop no longer holds the Run, or the first settle applied
        unacknowledged: False, and the caller reads which."""
        def settle() -> Awaitable[bool]:
            return self.ledger.engine.settle(run_id, outcome, record=True)

        try:
            return await settle()
        except TenureError as failure:
            if failure.code is not ErrorCode.RUN_PERSISTENCE_FAILED or failure.reason == "corrupt_row":
                raise
            log.warning("run %s: the hop's settle met a database failure (%s); recording its outcome on its own, "
                        "then retrying", run_id, failure.reason,
                        extra={"run_id": run_id, "node": self.node, "reason": failure.reason})
            self.persist_retries += 1
        record = self.ledger.checkpoints.record_outcome
        if not await self._persist(run_id, lambda: record(run_id, outcome.enqueue_seq, outcome.status,
                                                          result_json=outcome.result_json, error=outcome.error)):
            return False
        return await self._persist(run_id, settle)

    async def _persist_read(self, run_id: str) -> RunRecord | None:
        return await self._durably(run_id, "outcome", lambda: self.ledger.get(run_id))

    async def _persist(self, run_id: str, write: Callable[[], Awaitable[bool]]) -> bool:
        """``write()`` of the hop's outcome or settlement, retried through database failures."""
        return await self._durably(run_id, "outcome", write)

    async def _durably(self, run_id: str, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, repeated after each database failure (backoff up to
        :data:`PERSIST_BACKOFF_MAX_S`) until it answers; other errors propagate. ``what``
        names the hop's data in the one warning per run of failures."""
        failures = 0
        while True:
            try:
                return await call()
            except TenureError as failure:
                if failure.code is not ErrorCode.RUN_PERSISTENCE_FAILED or failure.reason == "corrupt_row":
                    raise  # a row no read can fix is not a passing failure
                if failures == 0:
                    log.warning("run %s: the hop's %s met a database failure (%s); retrying", run_id, what,
                                failure.reason, extra={"run_id": run_id, "node": self.node, "reason": failure.reason})
                failures += 1
                self.persist_retries += 1
                await asyncio.sleep(min(PERSIST_BACKOFF_MAX_S, PERSIST_BACKOFF_FIRST_S * 2 ** (failures - 1)))

    # --- serving -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start taking hops from the broker (returns at once)."""
        if not isinstance(self.broker, HopSource):
            raise _refuse("broker", "hop_source_required")
        if self._serving is not None:
            raise _refuse("worker", "already_started")
        self._stopping.clear()
        self._outcomes_on_stop = True
        if isinstance(self.broker, PinnedPublisher):  # it claims only the hops of the pins this worker serves
            serving = self.broker.serve(self.queues, self.perform, concurrency=self.concurrency,
                                        stopping=self._stopping, serves=self.workflows.served)
        else:
            serving = self.broker.serve(self.queues, self.perform, concurrency=self.concurrency, stopping=self._stopping)
        self._serving = asyncio.ensure_future(serving)

    async def fence_hops(self, deadline_s: float = 30.0) -> int:
        """Close the claim gate and cancel every running hop, waiting up to ``deadline_s``
        for them to end (the node's lease could not be renewed: another node may take its
        Runs over). Serving goes on; :meth:`resume` opens the gate again. Returns how
        many hop tasks were cancelled."""
        self.pause()
        hops = [task for task in self._hops if not task.done()]
        for task in hops:
            task.cancel()
        if hops:
            await asyncio.wait(hops, timeout=deadline_s)
        return len(hops)

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called (and :meth:`start` not called again since)."""
        return self._stopping.is_set()

    @property
    def running_hops(self) -> int:
        return sum(1 for task in self._hops if not task.done())

    async def stop(self, deadline_s: float = 30.0) -> None:
        """Stop taking hops, cancel the ones still running their workflow and prove,
        within ``deadline_s``, that every hop task and the broker's serving task ended.
        A hop whose workflow already ended (returned or raised) is not cancelled: its
        outcome is recorded and settled, retried through database failures, until
        ``deadline_s`` less :func:`stop_grace_s` has passed; then it is cancelled too
        (the next start settles it from its recorded outcome, if it got that far).
        Raises :class:`WorkerStopFailed` when some task did not end (it may still write)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        self._outcomes_on_stop = True
        self._stopping.set()
        serving = self._serving
        tasks: set[asyncio.Future[Any]] = {task for task in self._hops if not task.done()}
        if serving is not None:
            tasks.add(serving)
        for task in list(self._hops):
            task.cancel()  # a hop writing its outcome absorbs this (see _outcome_of)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline_s - stop_grace_s(deadline_s)))
            # Hop tasks the broker started after the snapshot above are in _hops too.
            pending |= {task for task in self._hops if not task.done()}
            if pending:
                # The deadline for outcomes passed: every hop still running is cancelled.
                self._outcomes_on_stop = False
                for task in list(self._hops):
                    task.cancel()
                _, pending = await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()))
                pending |= {task for task in self._hops if not task.done()}
            if pending:
                raise WorkerStopFailed(len(pending))
        if serving is not None and serving.done() and not serving.cancelled() and serving.exception() is not None:
            log.warning("broker serving ended with %s", type(serving.exception()).__name__)
        self._serving = None
