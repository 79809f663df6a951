"""Run recovery on a ledger: startup reconciliation and the relays, as visits the kernel's
recovery table decides.

A visit starts from one Run as it is stored (its current delivery, and the evidence its
state needs: the persisted owner of a wait, the newest non-cancelled owner row and the
containment counts of a hop or a cancellation), read with the rest of its page in a
constant number of statements (:func:`tenure.adapters.runs.pages.read_page`; a Run the
page could not answer for is read alone), asks
:func:`tenure.kernel.recovery.table.decide`, and does what the verdict names. Evidence
actions (probe, fence, ask the checkpoint, contain, observe) call the ports and ask
again with what they learned; a write goes through the ledger's own compare-and-set
paths (publish, fail_held, park, settle, resume, rotate, finish the cancellation), after
which the Run is decided afresh, at most :data:`MAX_WRITES_PER_VISIT` times: on the pair
the write stored when its path hands the decision back and the new status needs no
evidence (rotate, mark published, retry a lost hop, finish a cancellation), otherwise read again (see ``_Visits._after_write``).
A fence (an abort at the broker) is never sent on a page's reading alone: the Run's row
is read again first and must be unchanged since the page (``_Visits._unchanged``), so a
hop claimed after the page was read keeps its job. Every verdict is checked against the
recovery rules (REC-1 ... REC-8) before it acts; a verdict that breaks one is a defect
and is reported, never executed.

Failures are isolated per Run: a port that raises is the issue ``port_failed``, a
database failure ``persistence_failed``, a containment refusal raised by the kernel
``containment_unproven``, and anything else ``internal_error`` (logged with its type
only). The pass goes on with the next Run; the report is degraded.

Pages are read in ``(updated_at, run_id)`` order per status group; the Runs of a page
are visited one at a time, or up to ``RecoveryPorts.concurrency`` at once (issues are
then reported in the order visits end). Reconciliation
visits each Run once per group (a written Run moves to the end of its group and is
skipped there). A relay reads one page per kind (queued deliveries, consents,
delegated jobs, service waits) and carries, in its opaque cursor, a forward position per
kind (wrapping to the start after the last page) and a queue of page starts to revisit
(pages where a Run was kept: held, still waiting, degraded). Relay calls alternate
revisits with forward pages, so poison pages stay under repair without starving newer
Runs: every Run of a kind is reached within twice that kind's number of pages of relay
calls.

Deadlines (a Run admitted with a timeout) are swept first, by their own index in
``(deadline, run_id)`` order: each Run whose deadline passed on the database clock is sent
``time_out`` (the kernel decides; a Run finished meanwhile, or not due on the clock read
under its lock, is left). Reconciliation times out every such Run before it finishes the
CANCELLING ones (so its own containment and terminal fence finish them too); a relay
round times out one page (its cursor keeps a forward position, wrapping) and finishes
each cancellation as ``RunLedger.finish_cancel`` does (the frozen hop fenced, containment
proven), leaving one it cannot prove for the next rounds.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import datetime as dt
import json
import logging
import math
import types
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tenure.kernel.attempts.record import is_terminal as attempt_is_terminal
from tenure.kernel.core import Applied, Decision
from tenure.kernel.recovery.table import (
    HELD_ERROR,
    LOST_ERROR,
    Action,
    Evidence,
    Pass,
    Probe,
    Situation,
    Verdict,
    decide,
    evidence_for,
    latest_owner,
    verdict_violations,
)
from tenure.kernel.runs import finders
from tenure.kernel.runs.aggregate import UNREAD_CONTAINMENT
from tenure.kernel.runs.commands import (
    Containment,
    FinishCancel,
    RecordPublished,
    RetryLost,
    Rotate,
    Rotated,
    RunCommand,
    Settled,
    Ticket,
    TimedOut,
    TimeOut,
)
from tenure.kernel.runs.record import HOP_STATUSES, DeliveryRow, RunPair, RunRow, key_of
from tenure.model import (
    AgentJobRecord,
    BrokerJobState,
    ErrorCode,
    Found,
    LookupFailed,
    NotFound,
    RunStatus,
    TenureError,
    WaitKind,
    bounds,
    load_json,
)
from tenure.model.runs import check_text
from tenure.model.validation import datetime_to_micros, refuse

from ..agent_jobs.table import AGENT_JOBS_BINDING
from ..attempts.table import ATTEMPTS_BINDING
from ..consents.table import CONSENTS_BINDING
from ..messages.table import MESSAGES_BINDING
from ..core.failures import persistence_failed
from ..core.outages import OutageLog
from ..core.tables import Unreadable
from .broker import Broker, BrokerProbe, fence_hop, probe_or_none
from .checkpoints import RecordedOutcome
from .pages import PageEntry, read_page
from .table import CURRENT_DELIVERY, DELIVERIES_BINDING, RUNS_BINDING
from .engine import RunEngine, current_pair

if TYPE_CHECKING:
    from ..attempts.ledger import AttemptLedger
    from ..core.store import Transaction

__all__ = ["RecoveryPorts", "RecoveryLedger", "RecoveryIssue", "RecoveryReport", "COUNT_NAMES", "ISSUE_REASONS",
           "MAX_WRITES_PER_VISIT", "run_relays"]

log = logging.getLogger("tenure.adapters.runs.recovery")

COUNT_NAMES = ("published", "republished", "rotated", "held_failed", "orphans_parked", "orphans_failed",
               "resumed", "cancels_finished", "outcomes_settled", "hops_retried", "timed_out")
"""The report's counts, each the number of writes of that kind that applied."""

ISSUE_REASONS = (
    "delivery_missing", "delivery_state_invalid", "delivery_mismatch", "queue_unknown", "broker_unprobeable",
    "start_time_unknown", "orphan_unfenced", "containment_unproven",
    "port_failed", "persistence_failed", "internal_error", "corrupt_row",
)
"""Why a Run made a pass degraded: the recovery table's reasons, then the isolated failures
(``corrupt_row``: its row, or a row it owns, holds values tenure cannot read, written
outside tenure; the pass goes on with the other Runs)."""

MAX_WRITES_PER_VISIT = 6
"""Writes one visit may make (rotate then publish, resume then publish, ...); a Run that
needs more is kept for the next pass."""

_MAX_STEPS = 24  # decisions per visit, evidence included: a bound, never reached by the table
_MAX_REVISITS = 64  # page starts a relay cursor keeps per kind (forward wrapping reaches the rest)
_HOPS = tuple(sorted(HOP_STATUSES, key=lambda status: status.value))  # the kernel's hop statuses
_WAITS = (RunStatus.AWAITING_CONSENT, RunStatus.AWAITING_DELEGATE, RunStatus.AWAITING_SERVICE,
          RunStatus.AWAITING_TIMER, RunStatus.AWAITING_MESSAGE)
_TERMINAL = (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED)
_RELAY_KINDS: tuple[tuple[str, tuple[RunStatus, ...]], ...] = (
    ("deliveries", (RunStatus.QUEUED,)),
    ("consents", (RunStatus.AWAITING_CONSENT,)),
    ("delegated_jobs", (RunStatus.AWAITING_DELEGATE,)),
    ("service_waits", (RunStatus.AWAITING_SERVICE,)),
    ("timers", (RunStatus.AWAITING_TIMER,)),
    ("receives", (RunStatus.AWAITING_MESSAGE,)),
)
_DEADLINES = "deadlines"
"""The relay cursor's kind for the deadline sweep (its positions are ``(deadline, run_id)``)."""
_EVIDENCE = frozenset({Action.PROBE, Action.FENCE, Action.ASK_CHECKPOINT, Action.CONTAIN, Action.CONTAIN_ATTEMPTS,
                       Action.OBSERVE})

CheckpointOwner = Callable[[str], Awaitable["str | None"]]
ContainJob = Callable[[AgentJobRecord], Awaitable[bool]]
ObserveAttempt = Callable[..., Awaitable["Found | NotFound | LookupFailed"]]
DeleteCheckpoint = Callable[[str], Awaitable[None]]
CheckpointOutcome = Callable[[str], Awaitable["RecordedOutcome | None"]]



@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryPorts:
    """What recovery asks outside the database, all async.

    ``broker``: the Run broker (probe, abort, publish). ``checkpoint_owner(run_id)``: the
    owner ID (consent, delegated job or service attempt) bound by the Run's first
    resumable snapshot, or None (no port: no snapshot evidence, so orphans are never
    re-parked). ``contain_job(job)``: the delegated runtime's containment of one open or
    LOST job, True once it returned (then the job is recorded CANCELLED, unless the port
    recorded its end itself, as ``App.contain_child`` adopts a child's); a lost hop that
    its workflow allows to run again keeps its jobs (the hop that runs again adopts each
    by its request), so this port is asked only before terminal truth.
    ``observe_attempt(attempt, *, cancel)``: what the provider says of a service attempt
    (with ``cancel=True`` after asking it to stop). ``delete_checkpoint(run_id)``:
    idempotent cleanup of a terminal Run's snapshots, retried by every reconciliation.
    ``known_queues``: the queues this process serves (None: every queue is known).
    ``checkpoint_outcome(run_id)``: the outcome a finished hop recorded in the Run's
    checkpoint before it settled (no port: no outcome evidence, so such a hop is failed
    ``lost`` as before). ``concurrency``: how many Runs of a page a pass visits at once,
    so how many Runs' port calls may be in flight together (each call concerns one Run);
    1, the default, suits ports written for one caller at a time. The brokers tenure
    ships, the Run ledger's checkpoint ports and the runtime's defaults accept
    :data:`VISIT_CONCURRENCY`.
    """

    broker: Broker
    checkpoint_owner: CheckpointOwner | None = None
    contain_job: ContainJob | None = None
    observe_attempt: ObserveAttempt | None = None
    delete_checkpoint: DeleteCheckpoint | None = None
    known_queues: frozenset[str] | None = None
    checkpoint_outcome: CheckpointOutcome | None = None
    concurrency: int = 1

    def __post_init__(self) -> None:
        if not bounds.is_strict_int(self.concurrency) or not 1 <= self.concurrency <= 64:
            raise refuse("concurrency", "integer_out_of_range")
        if not isinstance(self.broker, Broker):
            raise refuse("broker", "broker_required")
        for name in ("checkpoint_owner", "contain_job", "observe_attempt", "delete_checkpoint", "checkpoint_outcome"):
            port = getattr(self, name)
            if port is not None and not callable(port):
                raise refuse(name, "callable_required")
        if self.known_queues is not None:
            if isinstance(self.known_queues, str) or not all(type(q) is str for q in self.known_queues):
                raise refuse("known_queues", "queue_names_required")
            object.__setattr__(self, "known_queues", frozenset(self.known_queues))


@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryIssue:
    """One Run that made a pass degraded, and why (one of :data:`ISSUE_REASONS`)."""

    run_id: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What a pass did: ``counts`` (every name of :data:`COUNT_NAMES`), the ``issues``
    (degraded when there is any) and, from a relay, the ``cursor`` to pass back."""

    degraded: bool
    counts: Mapping[str, int]
    issues: tuple[RecoveryIssue, ...]
    cursor: str | None = None

    @property
    def unproven(self) -> tuple[RecoveryIssue, ...]:
        """The issues a start that requires a clean report refuses: all but
        ``corrupt_row``. A Run whose row tenure cannot read runs nowhere (every claim of
        it fails ``corrupt_row``), so starting beside it risks no second execution, and
        refusing to start would stop every other Run until someone mends the row."""
        return tuple(issue for issue in self.issues if issue.reason != "corrupt_row")


class RecoveryJobs(Protocol):
    """The delegated jobs recovery contains (``RunLedger.jobs``)."""

    async def get(self, job_id: str) -> AgentJobRecord | None: ...

    async def record_cancelled(self, job_id: str) -> bool: ...


class RecoveryLedger(Protocol):
    """What recovery asks of the Run ledger it visits Runs on (:class:`~tenure.adapters.RunLedger`
    is one): its Run engine (every Run command and every read of recovery), its delegated
    jobs and service attempts, and the ledger's own compare-and-set paths for each action
    the recovery table chooses. Recovery writes nothing any other way."""

    @property
    def engine(self) -> RunEngine: ...

    @property
    def attempts(self) -> AttemptLedger: ...

    @property
    def jobs(self) -> RecoveryJobs: ...

    async def publish(self, run_id: str, enqueue_seq: int, broker: Broker) -> bool: ...

    async def fail_held(self, run_id: str, enqueue_seq: int, *, error: str) -> bool: ...

    async def park(self, run_id: str, enqueue_seq: int, *, kind: WaitKind, owner_id: str) -> bool: ...

    async def settle(self, run_id: str, enqueue_seq: int, status: RunStatus, *, error: str | None = None,
                     result: Any = None) -> bool: ...

    async def resume(self, run_id: str, *, owner_id: str) -> int | None: ...

    async def finish_cancel(self, run_id: str, enqueue_seq: int, broker: Broker) -> bool: ...

    async def relay(self, ports: RecoveryPorts, *, cursor: str | None = None, page_size: int = 32) -> RecoveryReport:
        ...


class _PortFailed(Exception):
    """A port raised: the visit ends with ``port_failed``."""


async def _port(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - a port's failure (and its text) stays with its Run
        raise _PortFailed() from None


def _micros(instant: dt.datetime | None) -> int | None:
    if type(instant) is not dt.datetime or instant.utcoffset() is None:
        return None
    return datetime_to_micros(instant)


def _probe_of(answer: object) -> Probe:
    """The broker's answer as the table's Probe; anything malformed says nothing."""
    if not isinstance(answer, BrokerProbe) or type(answer.state) is not BrokerJobState:
        return Probe(None)
    queue = answer.queue if type(answer.queue) is str else None
    priority = answer.wire_priority if bounds.is_strict_int(answer.wire_priority) else None
    return Probe(answer.state, _micros(answer.started_at), queue, priority)


VISIT_CONCURRENCY = 8
"""Runs of one page a pass visits at once when its ports allow it
(``RecoveryPorts.concurrency``; the runtime's default with a broker that declares
``concurrent_calls``). Runs are recovered independently: a visit reads its own Run, acts
through the ledger's compare-and-set paths and the ports, and no Run appears twice in a
page; a visit is mostly waiting (on the database, on the broker), so a page's visits
overlap."""


class _Visits:
    """One pass (a reconciliation or one relay call): visits Runs and tallies the report."""

    def __init__(self, ledger: RecoveryLedger, ports: RecoveryPorts, phase: Pass, *, node: str | None,
                 cutoff_us: int | None, stale_after_us: int) -> None:
        self.ledger, self.ports, self.phase = ledger, ports, phase
        self.node, self.cutoff_us, self.stale_after_us = node, cutoff_us, stale_after_us
        self.counts = dict.fromkeys(COUNT_NAMES, 0)
        self.issues: list[RecoveryIssue] = []
        self.unreadable: set[str] = set()
        """The Runs this pass met but could not read (each reported once)."""

    def report(self, cursor: str | None = None) -> RecoveryReport:
        return RecoveryReport(bool(self.issues), types.MappingProxyType(dict(self.counts)), tuple(self.issues), cursor)

    def _issue(self, run_id: str, reason: str) -> None:
        self.issues.append(RecoveryIssue(run_id, reason))

    # --- pages -------------------------------------------------------------------------

    async def page(self, statuses: Sequence[RunStatus], after: tuple[int, str] | None,
                   limit: int) -> list[RunRow | Unreadable]:
        """A page of Runs; a row tenure cannot read comes back as an ``Unreadable`` in its
        place (see :meth:`readable`), so one such row stops no pass."""
        finder = finders.runs_by_status(after=after is not None)
        parameters: dict[str, Any] = {"statuses": tuple(statuses)}
        if after is not None:
            parameters.update(after_updated=after[0], after_id=after[1])

        async def body(tx: Transaction) -> list[RunRow | Unreadable]:
            return await tx.find_or_unreadable(RUNS_BINDING, finder, parameters, limit)

        rows: list[RunRow | Unreadable] = await self.ledger.engine.read(body)
        return rows

    def readable(self, rows: Sequence[RunRow | Unreadable]) -> list[str]:
        """The IDs of a page's Runs to visit. A Run the page could not read (written
        outside tenure) is not visited: it is the issue ``corrupt_row`` (once per pass),
        logged with its ID by a reconciliation (a relay, which meets it every round, only
        reports it)."""
        visited: list[str] = []
        for row in rows:
            if isinstance(row, RunRow):
                visited.append(row.run_id)
                continue
            run_id = row.shown_key
            if run_id in self.unreadable:
                continue
            self.unreadable.add(run_id)
            self._issue(run_id, "corrupt_row")
            if self.phase is Pass.RECONCILE:
                log.warning("Run %s could not be read (written outside tenure): not recovered (corrupt_row)", run_id,
                            extra={"run_id": run_id})
        return visited

    async def scan(self, statuses: Sequence[RunStatus], page_size: int) -> None:
        """Visit every Run of ``statuses`` once, oldest change first (page by page; the
        Runs of a page at once, see :meth:`visit_all`)."""
        seen: set[str] = set()
        after: tuple[int, str] | None = None
        while True:
            rows = await self.page(statuses, after, page_size)
            fresh = [run_id for run_id in self.readable(rows) if run_id not in seen]
            seen.update(fresh)
            await self.visit_all(fresh, await self.entries(fresh))
            after = _last_position(rows)
            if len(rows) < page_size or after is None:
                return

    async def entries(self, run_ids: Sequence[str]) -> Mapping[str, PageEntry]:
        """The page's Runs with their deliveries and evidence (:func:`read_page`: a constant
        number of statements for the page). When that read fails (a row of the page
        tenure cannot read, a database failure) the answer is empty and every visit reads
        its own Run, so the failure stays with the Run it belongs to."""
        async def body(tx: Transaction) -> dict[str, PageEntry]:
            return await read_page(tx, run_ids)

        try:
            found: dict[str, PageEntry] = await self.ledger.engine.read(body)
        except asyncio.CancelledError:
            raise
        except TenureError:
            return {}
        except Exception as error:  # noqa: BLE001 - a defect of the page read stops no pass: each Run is read alone
            log.error("reading a page of Runs failed with %s; its Runs are read one by one", type(error).__name__,
                      exc_info=error)
            return {}
        return found

    async def visit_all(self, run_ids: Sequence[str], entries: Mapping[str, PageEntry] | None = None) -> list[bool]:
        """:meth:`visit` each Run (from its page entry when ``entries`` has one), up to the
        ports' ``concurrency`` at once; the answers in the order given."""
        given = entries or {}
        if len(run_ids) <= 1 or self.ports.concurrency == 1:
            return [await self.visit(run_id, given.get(run_id)) for run_id in run_ids]
        slots = asyncio.Semaphore(self.ports.concurrency)

        async def one(run_id: str) -> bool:
            async with slots:
                return await self.visit(run_id, given.get(run_id))

        return list(await asyncio.gather(*(one(run_id) for run_id in run_ids)))

    # --- deadlines -------------------------------------------------------------------------

    async def past_deadline(self, after: tuple[int, str] | None, limit: int) -> list[RunRow | Unreadable]:
        """A page of nonterminal Runs whose deadline passed on the database clock, in
        ``(deadline, run_id)`` order after ``after`` (an unreadable row in its place)."""
        finder = finders.runs_past_deadline(after=after is not None)

        async def body(tx: Transaction) -> list[RunRow | Unreadable]:
            parameters: dict[str, Any] = {"now": await tx.now_us()}
            if after is not None:
                parameters.update(after_deadline=after[0], after_id=after[1])
            return await tx.find_or_unreadable(RUNS_BINDING, finder, parameters, limit)

        rows: list[RunRow | Unreadable] = await self.ledger.engine.read(body)
        return rows

    async def time_out(self, run_id: str, *, finish: bool) -> bool:
        """Send ``time_out`` to one Run (counted ``timed_out`` when it elected the
        cancellation) and, with ``finish``, finish the cancellation as
        ``RunLedger.finish_cancel`` does; True when it is kept (an issue: revisit)."""
        async def call() -> bool:
            reply = (await self.ledger.engine.send(run_id, TimeOut())).reply
            if isinstance(reply, TimedOut):
                self.counts["timed_out"] += 1
            if finish and isinstance(reply, TimedOut | Ticket):
                if await self.ledger.finish_cancel(run_id, reply.enqueue_seq, self.ports.broker):
                    self.counts["cancels_finished"] += 1
            return False

        return await self.isolated(run_id, call)

    async def time_out_all(self, run_ids: Sequence[str], *, finish: bool) -> list[bool]:
        """:meth:`time_out` each Run, up to the ports' ``concurrency`` at once."""
        slots = asyncio.Semaphore(self.ports.concurrency)

        async def one(run_id: str) -> bool:
            async with slots:
                return await self.time_out(run_id, finish=finish)

        return list(await asyncio.gather(*(one(run_id) for run_id in run_ids)))

    async def sweep_deadlines(self, page_size: int) -> None:
        """Time out every Run whose deadline passed, page by page (reconciliation: the
        CANCELLING scan after it finishes them)."""
        seen: set[str] = set()
        after: tuple[int, str] | None = None
        while True:
            rows = await self.past_deadline(after, page_size)
            fresh = [run_id for run_id in self.readable(rows) if run_id not in seen]
            seen.update(fresh)
            await self.time_out_all(fresh, finish=False)
            after = _last_deadline(rows)
            if len(rows) < page_size or after is None:
                return

    # --- one Run -------------------------------------------------------------------------

    async def visit(self, run_id: str, entry: PageEntry | None = None) -> bool:
        """Recover one Run (from ``entry``, its page's reading, when given; otherwise read
        alone); True when it is kept (revisit it: held, waiting, degraded)."""
        return await self.isolated(run_id, lambda: self._visit(run_id, entry))

    async def isolated(self, run_id: str, call: Callable[[], Awaitable[bool]]) -> bool:
        """``call``'s answer, or True (keep the Run) with its failure as the Run's issue:
        one Run's failure never stops the pass."""
        try:
            return await call()
        except asyncio.CancelledError:
            raise
        except _PortFailed:
            self._issue(run_id, "port_failed")
        except TenureError as error:
            if error.code is ErrorCode.RUN_CONTAINMENT_UNPROVEN:
                self._issue(run_id, "containment_unproven")
            elif error.code is ErrorCode.RUN_BROKER_FAILED:
                self._issue(run_id, "port_failed")
            elif error.reason == "corrupt_row":  # a row of this Run another writer left unreadable
                self._issue(run_id, "corrupt_row")
            else:
                self._issue(run_id, "persistence_failed")
        except Exception as error:  # noqa: BLE001 - a defect stays with its Run; the pass goes on
            log.error("recovering Run %s failed with %s", run_id, type(error).__name__, exc_info=error,
                      extra={"run_id": run_id})
            self._issue(run_id, "internal_error")
        return True

    async def _visit(self, run_id: str, entry: PageEntry | None) -> bool:
        situation = await self._situation(run_id) if entry is None else self._situation_of(entry)
        from_page, writes = entry is not None, 0
        for _ in range(_MAX_STEPS):
            if situation is None:
                return False  # the Run is gone: nothing to recover
            verdict = decide(situation)
            if verdict_violations(situation, verdict):
                log.error("Run %s: a recovery verdict broke the recovery rules; nothing was done", run_id,
                          extra={"run_id": run_id})
                self._issue(run_id, "internal_error")
                return True
            action = verdict.action
            if action is Action.FENCE and from_page:
                # A fence aborts a broker job: it is decided on the Run as stored now, not
                # as its page read it a page of visits ago (a hop claimed meanwhile).
                from_page = False
                if not await self._unchanged(situation.run):
                    situation = await self._situation(run_id)
                    continue
            if action in _EVIDENCE:
                situation = await self._gather(situation, verdict)
                continue
            if action is Action.KEEP:
                return True
            if action is Action.LEAVE:
                return False
            if action is Action.REPORT:
                assert verdict.reason is not None
                self._issue(run_id, verdict.reason.value)
                return True
            if action is Action.CLEANUP:
                if self.ports.delete_checkpoint is not None:
                    await _port(self.ports.delete_checkpoint(run_id))
                return False
            written = await self._write(situation, verdict)
            writes += 1
            if writes >= MAX_WRITES_PER_VISIT:
                return True
            situation = await self._after_write(run_id, written)
        return True

    async def _unchanged(self, run: RunRow) -> bool:
        """Whether the Run's row is still exactly ``run`` (one statement): every transition
        rewrites it (its ``updated_at`` at least), so an equal row proves none came since."""
        async def body(tx: Transaction) -> list[RunRow]:
            return await tx.read(RUNS_BINDING, [run.run_id])

        rows: list[RunRow] = await self.ledger.engine.read(body)
        return rows == [run]

    async def _after_write(self, run_id: str, written: RunPair | None) -> Situation | None:
        """The Run after a write, to decide afresh. Taken from the write's own decision
        when the write hands it back (``written``: the pair the kernel decided and the
        engine stored and checked under the Run's lock) and the new status is decided
        on nothing else (no evidence: a QUEUED Run after a rotation or a publication
        mark). Read again otherwise: the write was refused (someone else moved the Run),
        the ledger's path says only whether it applied (publish, fail_held, park, settle,
        resume: their decision stays inside the ledger), or the new status needs evidence
        that is not part of the Run (owner rows, containment, the clock)."""
        if written is None or evidence_for(written.run.status):
            return await self._situation(run_id)
        return self._situation_of(PageEntry(written.run, written.current))

    def _situation_of(self, entry: PageEntry) -> Situation:
        run, known = entry.run, self.ports.known_queues
        return Situation(
            phase=self.phase, run=run, delivery=entry.delivery, node=self.node,
            cutoff_us=self.cutoff_us, stale_after_us=self.stale_after_us,
            queue_known=known is None or run.queue in known, owner=entry.owner, containment=entry.containment,
            latest_owner=entry.latest_owner, now_us=entry.now_us,
        )

    async def _situation(self, run_id: str) -> Situation | None:
        """One Run read alone (a Run its page could not answer for, and after a write)."""
        ledger = self.ledger

        async def body(tx: Transaction) -> Situation | None:
            pair = await _consistent_pair(tx, run_id)
            if pair is None:
                return None
            run, delivery = pair
            # Only the evidence the recovery table decides this status on is read.
            needs = evidence_for(run.status)
            owner = await RunEngine.owner(tx, run.owner_kind, run.owner_id) if Evidence.OWNER in needs else None
            examined = Evidence.CONTAINMENT in needs
            containment = await RunEngine.containment(tx, run_id) if examined else Containment(0, 0)
            latest = await _latest_owner(tx, run_id) if Evidence.LATEST_OWNER in needs else None
            # A timer's owner is the database clock: read it in the same visit.
            now = await tx.now_us() if Evidence.CLOCK in needs else None
            return self._situation_of(PageEntry(run, delivery, owner=owner, containment=containment,
                                                latest_owner=latest, now_us=now))

        found: Situation | None = await ledger.engine.read(body)
        return found

    # --- evidence ------------------------------------------------------------------------

    async def _gather(self, s: Situation, verdict: Verdict) -> Situation | None:
        action, run_id = verdict.action, s.run.run_id
        if action is Action.PROBE:
            assert verdict.key is not None
            return dataclasses.replace(s, probe=await self._probe(verdict.key))
        if action is Action.FENCE:
            assert verdict.key is not None
            probe = _probe_of(await fence_hop(self.ports.broker, verdict.key, terminal=verdict.terminal))
            return dataclasses.replace(s, probe=probe, fenced=True)
        if action is Action.ASK_CHECKPOINT:
            port = self.ports.checkpoint_owner
            owner = None if port is None else await _port(port(run_id))
            if owner is not None and type(owner) is not str:
                raise _PortFailed()
            outcome = await self._outcome(run_id)
            seen = None if outcome is None else (outcome.status, outcome.enqueue_seq)
            return dataclasses.replace(s, checkpoint_asked=True, checkpoint_owner=owner, outcome=seen)
        if action in (Action.CONTAIN, Action.CONTAIN_ATTEMPTS):
            await self._contain(run_id, jobs=action is Action.CONTAIN)
            return dataclasses.replace(s, containment=await self._containment(run_id), contained=True)
        assert action is Action.OBSERVE
        if s.run.owner_id is not None:
            await self._observe(s.run.owner_id, cancel=False)
        fresh = await self._situation(run_id)  # the owner's evidence after the observation
        return None if fresh is None else dataclasses.replace(fresh, observed=True)

    async def _outcome(self, run_id: str) -> RecordedOutcome | None:
        port = self.ports.checkpoint_outcome
        outcome = None if port is None else await _port(port(run_id))
        if outcome is not None and not isinstance(outcome, RecordedOutcome):
            raise _PortFailed()
        return outcome

    async def _probe(self, key: str) -> Probe:
        return _probe_of(await probe_or_none(self.ports.broker, key))

    async def _containment(self, run_id: str) -> Containment:
        async def body(tx: Transaction) -> Containment:
            return await RunEngine.containment(tx, run_id)

        counts: Containment = await self.ledger.engine.read(body)
        return counts

    async def _contain(self, run_id: str, *, jobs: bool) -> None:
        """Stop what the Run started: each open or LOST delegated job through the runtime's
        containment (then recorded CANCELLED; not with ``jobs=False``, a retry's
        containment, which carries them into the hop that runs again), each open service
        attempt by a cancel request (a PREPARED one cancels at once) and the provider's
        answer."""
        async def body(tx: Transaction) -> tuple[list[Any], list[Any]]:
            jobs = await tx.find(AGENT_JOBS_BINDING, finders.open_jobs_of_run, {"run_id": run_id})
            attempts = await tx.find(ATTEMPTS_BINDING, finders.open_attempts_of_run, {"run_id": run_id})
            return jobs, attempts

        open_jobs, attempts = await self.ledger.engine.read(body)
        for job in open_jobs if jobs else ():
            record = await self.ledger.jobs.get(job.job_id)
            if record is None or self.ports.contain_job is None:
                continue
            if await _port(self.ports.contain_job(record)) is True:
                await self.ledger.jobs.record_cancelled(job.job_id)
        for attempt in attempts:
            await self.ledger.attempts.request_cancel(attempt.attempt_id)
            await self._observe(attempt.attempt_id, cancel=True)

    async def _observe(self, attempt_id: str, *, cancel: bool) -> None:
        port = self.ports.observe_attempt
        record = await self.ledger.attempts.get(attempt_id)
        if port is None or record is None or attempt_is_terminal(record):
            return
        # The clock is read before the port looks anything up: a not-found is judged at
        # the instant of its lookup (specs/attempts.md, "Lookups are judged at their own instant").
        looked_up_at = await self.ledger.attempts.database_now()
        seen = await _port(port(record, cancel=cancel))
        if type(seen) not in (Found, NotFound, LookupFailed):
            raise _PortFailed()
        await self.ledger.attempts.reconcile(attempt_id, seen,
                                             looked_up_at=looked_up_at if type(seen) is NotFound else None)

    # --- writes --------------------------------------------------------------------------

    async def _write(self, s: Situation, verdict: Verdict) -> RunPair | None:
        """Do the verdict's write through the ledger's own path; the pair it wrote when
        the path hands back its decision (a command sent to the Run machine), else None."""
        ledger, run = self.ledger, s.run
        run_id, seq, action = run.run_id, run.enqueue_seq, verdict.action
        if action is Action.MARK_PUBLISHED:
            decision = (await ledger.engine.send(run_id, RecordPublished(enqueue_seq=seq))).decision
            if isinstance(decision, Applied):
                self.counts["published"] += 1
            return _written(decision)
        if action is Action.ROTATE:
            assert s.probe is not None
            decision = (await ledger.engine.send(run_id, Rotate(enqueue_seq=seq, hop=s.probe.state))).decision
            if isinstance(decision, Applied) and isinstance(decision.reply, Rotated):
                self.counts["rotated"] += 1
            return _written(decision)
        if action in (Action.RETRY_LOST, Action.FINISH_CANCEL):
            assert s.probe is not None
            # The fence observed the hop's state: the command carries it, and the engine
            # counts the Run's open effects under its lock (the aggregate's containment).
            command: RunCommand = (
                RetryLost(enqueue_seq=seq, hop=s.probe.state, containment=UNREAD_CONTAINMENT)
                if action is Action.RETRY_LOST
                else FinishCancel(enqueue_seq=seq, hop=s.probe.state, containment=UNREAD_CONTAINMENT))
            decision = (await ledger.engine.send(run_id, command)).decision
            retried = action is Action.RETRY_LOST
            if isinstance(decision, Applied) and isinstance(decision.reply, Rotated if retried else Settled):
                self.counts["hops_retried" if retried else "cancels_finished"] += 1
            return _written(decision)
        await self._write_through_ledger(s, verdict)
        return None

    async def _write_through_ledger(self, s: Situation, verdict: Verdict) -> None:
        """The writes whose ledger path says only whether it applied."""
        ledger, run = self.ledger, s.run
        run_id, seq, action = run.run_id, run.enqueue_seq, verdict.action
        if action in (Action.PUBLISH, Action.REPUBLISH):
            if await ledger.publish(run_id, seq, self.ports.broker):
                self.counts["published" if action is Action.PUBLISH else "republished"] += 1
        elif action is Action.FAIL_HELD:
            if await ledger.fail_held(run_id, seq, error=HELD_ERROR):
                self.counts["held_failed"] += 1
        elif action is Action.REPARK:
            assert verdict.owner is not None
            kind, owner_id = verdict.owner
            if await ledger.park(run_id, seq, kind=kind, owner_id=owner_id):
                self.counts["orphans_parked"] += 1
        elif action is Action.SETTLE_RECORDED:
            outcome = await self._outcome(run_id)
            if outcome is not None and outcome.enqueue_seq == seq and await ledger.engine.settle(run_id, outcome):
                self.counts["outcomes_settled"] += 1
        elif action is Action.FAIL_LOST:
            if await ledger.settle(run_id, seq, RunStatus.FAILED, error=LOST_ERROR):
                self.counts["orphans_failed"] += 1
        elif action is Action.RESUME:
            assert run.owner_id is not None
            if await ledger.resume(run_id, owner_id=run.owner_id) is not None:
                self.counts["resumed"] += 1
        else:  # pragma: no cover - every write action is listed above
            raise AssertionError(action)


def _written(decision: Decision) -> RunPair | None:
    """The pair an applied decision wrote (None: refused, or not a pair)."""
    if isinstance(decision, Applied) and isinstance(decision.new_record, RunPair):
        return decision.new_record
    return None


async def _consistent_pair(tx: Transaction, run_id: str) -> tuple[RunRow, DeliveryRow | None] | None:
    """The Run and its current delivery as of one commit, without a lock.

    One statement reads both (a join: one snapshot on every database). Only when that
    does not give exactly one Run with the delivery its key names, or none (rows
    another writer left out of shape), does the reading fall back to separate reads:
    each statement of a read may see a later commit (PostgreSQL's read committed), so a
    Run read before a concurrent rotation and its delivery read after it would look
    corrupt. Every transition that touches a delivery also moves its Run's
    ``updated_at``, so reading the Run again and finding it unchanged proves the pair
    is one commit's; otherwise read again."""
    joined: list[tuple[RunRow, DeliveryRow | None]] = await tx.read_joined(
        RUNS_BINDING, [run_id], DELIVERIES_BINDING, CURRENT_DELIVERY)
    if not joined:
        return None
    found = current_pair(run_id, joined)
    if found is not None:
        return found
    for _ in range(8):
        runs: list[RunRow] = await tx.read(RUNS_BINDING, [run_id])
        if not runs:
            return None
        run = runs[0]
        deliveries: list[DeliveryRow] = await tx.read(DELIVERIES_BINDING, [key_of(run_id, run.enqueue_seq)])
        again: list[RunRow] = await tx.read(RUNS_BINDING, [run_id])
        if again and (again[0].updated_at_us, again[0].enqueue_seq) == (run.updated_at_us, run.enqueue_seq):
            return run, deliveries[0] if deliveries else None
    raise persistence_failed("row_changed")  # changed under every read: the visit's issue


async def _latest_owner(tx: Transaction, run_id: str) -> tuple[WaitKind, str] | None:
    """The Run's newest owner that is not cancelled: the recovery kernel's
    :func:`latest_owner` over every consent, delegated job, service attempt and receive of the Run."""
    return latest_owner(
        await tx.find(CONSENTS_BINDING, finders.consents_of_run, {"run_id": run_id}),
        await tx.find(AGENT_JOBS_BINDING, finders.jobs_of_run, {"run_id": run_id}),
        await tx.find(ATTEMPTS_BINDING, finders.attempts_of_run, {"run_id": run_id}),
        await tx.find(MESSAGES_BINDING, finders.receives_of_run, {"run_id": run_id}),
    )


# --- the passes ------------------------------------------------------------------------


def _page_size(value: object) -> int:
    if not bounds.is_strict_int(value) or not 1 <= value <= 1000:  # type: ignore[operator]
        raise refuse("page_size", "integer_out_of_range")
    return value  # type: ignore[return-value]


async def reconcile(ledger: RecoveryLedger, ports: RecoveryPorts, *, node: str, boot_cutoff: dt.datetime,
                    page_size: int, stale_after_s: float) -> RecoveryReport:
    """Startup reconciliation (see :meth:`RunLedger.reconcile`)."""
    if type(ports) is not RecoveryPorts:
        raise refuse("ports", "recovery_ports_required")
    node = check_text(node, "node")
    cutoff_us = _micros(boot_cutoff)
    if cutoff_us is None:
        raise refuse("boot_cutoff", "aware_datetime_required")
    size = _page_size(page_size)
    if type(stale_after_s) not in (int, float) or not math.isfinite(stale_after_s) or not 0 <= stale_after_s <= 86400:
        raise refuse("stale_after_s", "number_out_of_range")
    visits = _Visits(ledger, ports, Pass.RECONCILE, node=node, cutoff_us=cutoff_us,
                     stale_after_us=int(stale_after_s * 1_000_000))
    # The seed's order: finish cancellations, clean up after terminal Runs, fence this
    # node's old hops before failing orphans, flush deliveries, resume decided waits,
    # then flush the deliveries those resumes opened. Deadlines that passed come first:
    # their cancellations are finished with the others, and none of their waits resumes.
    await visits.sweep_deadlines(size)
    await visits.scan((RunStatus.CANCELLING,), size)
    if ports.delete_checkpoint is not None:  # terminal Runs carry only cleanup debt
        await visits.scan(_TERMINAL, size)
    await visits.scan(_HOPS, size)
    await visits.scan((RunStatus.QUEUED,), size)
    await visits.scan(_WAITS, size)
    await visits.scan((RunStatus.QUEUED,), size)
    return visits.report()


async def recover_ended_hop(ledger: RecoveryLedger, ports: RecoveryPorts, *, node: str, run_id: str,
                            claimed_at_us: int) -> RecoveryReport:
    """Reconcile one Run whose hop, claimed by ``node`` at ``claimed_at_us``, provably
    ended (see :meth:`RunLedger.recover_ended_hop`)."""
    if type(ports) is not RecoveryPorts:
        raise refuse("ports", "recovery_ports_required")
    if not bounds.is_instant(claimed_at_us):
        raise refuse("claimed_at_us", "instant_required")
    # The cutoff just after the hop's claim: that hop is this node's orphan, and any later
    # hop of the Run (claimed after it) is not, so it is never fenced from here.
    visits = _Visits(ledger, ports, Pass.RECONCILE, node=check_text(node, "node"), cutoff_us=claimed_at_us + 1,
                     stale_after_us=0)
    await visits.visit(check_text(run_id, "run_id", 36))
    return visits.report()


async def relay(ledger: RecoveryLedger, ports: RecoveryPorts, *, cursor: str | None, page_size: int) -> RecoveryReport:
    """One relay round (see :meth:`RunLedger.relay`)."""
    if type(ports) is not RecoveryPorts:
        raise refuse("ports", "recovery_ports_required")
    size = _page_size(page_size)
    state = _read_cursor(cursor)
    visits = _Visits(ledger, ports, Pass.RELAY, node=None, cutoff_us=None, stale_after_us=0)
    # Deadlines first (a timed-out Run's due timer is then not resumed): one page forward,
    # wrapping; a cancellation that could not finish is met again when the sweep wraps.
    deadlines = state.setdefault(_DEADLINES, {"f": None, "r": [], "t": 0})
    start = deadlines["f"]
    rows = await visits.past_deadline(None if start is None else (start[0], start[1]), size)
    await visits.time_out_all(visits.readable(rows), finish=True)
    last = _last_deadline(rows)
    deadlines["f"] = None if len(rows) < size or last is None else list(last)
    for kind, statuses in _RELAY_KINDS:
        position = state.setdefault(kind, {"f": None, "r": [], "t": 0})
        revisiting = position["t"] == 1 and bool(position["r"])
        start = position["r"].pop(0) if revisiting else position["f"]
        after = None if start is None else (start[0], start[1])
        rows = await visits.page(statuses, after, size)
        visited = visits.readable(rows)
        kept = any(await visits.visit_all(visited, await visits.entries(visited))) or len(visited) < len(rows)
        if kept and start not in position["r"] and len(position["r"]) < _MAX_REVISITS:
            position["r"].append(start)
        if not revisiting:
            # Forward progress, wrapping to the first page after the last one.
            last = _last_position(rows)
            position["f"] = None if len(rows) < size or last is None else list(last)
        position["t"] = 1 - position["t"] if position["r"] else 0
    return visits.report(_write_cursor(state))


def _last_position(rows: Sequence[RunRow | Unreadable]) -> tuple[int, str] | None:
    """Where the page after ``rows`` starts: the last row's ``(updated_at, run_id)``, or
    (a row whose own position cannot be read) the last one's that can; None: none can."""
    for row in reversed(rows):
        if isinstance(row, RunRow):
            return row.updated_at_us, row.run_id
        updated = row.fields.get("updated_at_us")
        if type(updated) is int and type(row.key) is str:
            return updated, row.key
    return None


def _last_deadline(rows: Sequence[RunRow | Unreadable]) -> tuple[int, str] | None:
    """Where the deadline page after ``rows`` starts: the last row's ``(deadline,
    run_id)`` (of the last row whose own can be read); None: none can."""
    for row in reversed(rows):
        deadline = row.deadline_us if isinstance(row, RunRow) else row.fields.get("deadline_us")
        key = row.run_id if isinstance(row, RunRow) else row.key
        if type(deadline) is int and type(key) is str:
            return deadline, key
    return None


def _write_cursor(state: dict[str, Any]) -> str:
    text = json.dumps({"v": 1, "kinds": state}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii")


def _position(value: object) -> bool:
    return value is None or (
        type(value) is list and len(value) == 2 and bounds.is_strict_int(value[0])
        and bounds.is_bounded_text(value[1], 36)
    )


def _read_cursor(cursor: object) -> dict[str, Any]:
    """A relay cursor's positions per kind; a cursor this module did not write is refused."""
    if cursor is None:
        return {}
    if type(cursor) is not str or len(cursor) > 65536:
        raise refuse("cursor", "relay_cursor_required")
    document: Any = None
    try:
        document = load_json(base64.urlsafe_b64decode(cursor.encode("ascii")).decode("utf-8"))
    except (ValueError, UnicodeError, binascii.Error):
        pass  # refused below, outside the handler: the decoder's error never rides along
    kinds = document.get("kinds") if type(document) is dict and document.get("v") == 1 else None
    names = {kind for kind, _ in _RELAY_KINDS} | {_DEADLINES}
    if type(kinds) is not dict or not set(kinds) <= names:
        raise refuse("cursor", "relay_cursor_required")
    for position in kinds.values():
        if not (type(position) is dict and set(position) == {"f", "r", "t"} and _position(position["f"])
                and type(position["r"]) is list and len(position["r"]) <= _MAX_REVISITS
                and all(_position(start) for start in position["r"]) and position["t"] in (0, 1)
                and type(position["t"]) is int):
            raise refuse("cursor", "relay_cursor_required")
    return kinds


async def run_relays(ledger: RecoveryLedger, ports: RecoveryPorts, *, node: str, stop: asyncio.Event,
                     interval_s: float = 1.0, page_size: int = 32,
                     on_report: Callable[[RecoveryReport], Awaitable[None]] | None = None) -> None:
    """Run relay rounds until ``stop`` is set, passing each round's cursor to the next and
    waiting ``interval_s`` between rounds. A round that raises is restarted after a
    deterministic backoff, ``min(5, 0.1 * 2**failures)`` seconds (failures in a row).
    ``on_report`` is awaited with each finished round's report (the runtime records it);
    what it raises is logged and never stops the relays."""
    if type(stop) is not asyncio.Event:
        raise refuse("stop", "asyncio_event_required")
    if on_report is not None and not callable(on_report):
        raise refuse("on_report", "callable_required")
    node = check_text(node, "node")
    if type(interval_s) not in (int, float) or not math.isfinite(interval_s) or not 0 <= interval_s <= 3600:
        raise refuse("interval_s", "number_out_of_range")
    _page_size(page_size)
    cursor: str | None = None
    failures = 0
    # A failing or degraded relay is said once per change of state, not once per round.
    failing = OutageLog(log, f"relay rounds on node {node}", fields={"node": node})
    degraded = OutageLog(log, f"relay rounds on node {node}", fields={"node": node}, back="clean again")
    while not stop.is_set():
        try:
            report = await ledger.relay(ports, cursor=cursor, page_size=page_size)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - the relay restarts; the next round may succeed
            failures += 1
            reason = error.reason if isinstance(error, TenureError) else "raised"  # never another library's text
            failing.failed("a relay round", type(error).__name__, reason)
            wait = relay_backoff_s(failures)
        else:
            failures = 0
            failing.answered()
            cursor = report.cursor
            if report.degraded:
                reasons = sorted({issue.reason for issue in report.issues})
                degraded.failed("a relay round", "degraded", ",".join(reasons))
            else:
                degraded.answered()
            wait = float(interval_s)
            if on_report is not None:
                try:
                    await on_report(report)
                except asyncio.CancelledError:
                    raise
                except Exception as error:  # noqa: BLE001 - a report's consumer never stops the relays
                    log.warning("relay round on node %s: its report's consumer failed with %s", node,
                                type(error).__name__, extra={"node": node})
        try:
            await asyncio.wait_for(stop.wait(), timeout=wait)
        except asyncio.TimeoutError:
            pass


def relay_backoff_s(failures: int) -> float:
    """The wait before restarting a relay after ``failures`` failed rounds in a row."""
    return min(5.0, 0.1 * float(2 ** min(failures, 16)))
