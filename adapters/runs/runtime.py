"""The lifespan of a process that runs workflow Runs, in the seed's order.

Entering a :class:`RunRuntime`: connect every broker (a failure disconnects those already
connected, in reverse, and raises); boot the node's lease (``specs/nodes.md``: a new
incarnation, whose database time is the boot cutoff); reconcile once with it (startup recovery, ``specs/recovery.md``), and when the report is
degraded and a clean start is required (by default on PostgreSQL; an embedded SQLite
file starts best-effort, its report kept in :attr:`RunRuntime.startup`) disconnect and
raise :class:`StartupDegraded`; then start the relays, the lease keeper and the workers.

Every recovery pass's report (the startup reconciliation, each reconciliation after a
reboot or of a node taken over, every relay round) is recorded as its node's latest in
``tenure_run_recovery_reports`` (:mod:`tenure.adapters.runs.reports`; a takeover's under
the dead node's name), which ``tenure health`` reads. Recording is a diagnostic: a
failure to record is logged (once, until a recording succeeds again) and recovery goes on.

The lease keeper, every ``relay_interval_s``: renews the node's lease; when a renewal is
refused (the lease ran out, or another boot or a takeover replaced this incarnation) or
has not succeeded within the lease (measured on this process's monotonic clock from
before the last successful renewal was sent, less one interval), it fences this process
itself (closes every worker's claim gate, cancels the running hops) and boots again: a
new cutoff, a reconciliation of its own orphans, the gates open. A reconciliation of its
own (at startup or after a reboot) that left Runs unproven (a port or the database failed
during it) is repeated with the same cutoff, after one interval and then at doubling
intervals up to the node lease, until it is complete. It also takes over every
other node whose lease ran out: claims it, reconciles it as that node with the
takeover's cutoff, and records the takeover finished when the report is clean (a
degraded one is retried once the claim runs out).

Leaving it: stop the relays and every worker under one deadline (``shutdown_deadline_s``,
30 s by default), proving that the relay task and every hop task ended. A hop still
running its workflow is cancelled (the next start recovers it); a hop whose workflow
already returned or raised is not: its outcome is recorded and settled, retried through
database failures, for as long as the deadline allows (:meth:`RunWorker.stop
<tenure.adapters.runs.worker.RunWorker.stop>`), so a deploy never fails ``lost`` (nor,
parked on its decided owner, runs again) a Run whose workflow finished. When something
did not end, :class:`ShutdownIncomplete` is raised and the brokers stay connected: a hop
still running may still use them. Otherwise disconnect the brokers in reverse order,
attempting every one, and raise an ``ExceptionGroup`` of the failures, if any.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from tenure.model import TenureError
from tenure.model.validation import refuse

from ..core.outages import OutageLog
from ..nodes.leases import DEFAULT_NODE_LEASE_S, NodeLease
from .broker import Broker
from .ledger import RunLedger
from .recovery import VISIT_CONCURRENCY, RecoveryPorts, RecoveryReport, run_relays
from .worker import RunWorker, WorkerStopFailed

__all__ = ["RunRuntime", "StartupDegraded", "ShutdownIncomplete"]

log = logging.getLogger("tenure.runs.runtime")


class StartupDegraded(Exception):
    """Startup reconciliation left Runs it could not prove (see ``report.issues``)."""

    def __init__(self, report: RecoveryReport) -> None:
        super().__init__(f"startup reconciliation degraded: {_issues(report)}")
        self.report = report


class ShutdownIncomplete(Exception):
    """Some task did not end by the shutdown deadline; the brokers were left connected."""

    def __init__(self, live_tasks: int) -> None:
        super().__init__(f"{live_tasks} task(s) still running after the shutdown deadline; brokers left connected")
        self.live_tasks = live_tasks


_refuse = functools.partial(refuse, reason="invalid_runtime")


def _issues(report: RecoveryReport) -> str:
    """``3 Run(s) (orphan_unfenced x2, port_failed)``: how many Runs and why, never which."""
    reasons = collections.Counter(issue.reason for issue in report.issues)
    named = ", ".join(reason if count == 1 else f"{reason} x{count}" for reason, count in sorted(reasons.items()))
    return f"{len(report.issues)} Run(s) ({named})"


@dataclasses.dataclass(frozen=True, slots=True)
class _Unfinished:
    """A reconciliation of this incarnation that left Runs unproven: when to try again."""

    pass_kind: str
    """The pass it repeats (``startup`` or ``reboot``), under which its report is recorded."""
    due: float
    """On this process's monotonic clock."""
    interval_s: float

    @classmethod
    def after(cls, report: RecoveryReport, pass_kind: str, interval_s: float) -> _Unfinished | None:
        return cls(pass_kind, time.monotonic() + interval_s, interval_s) if report.unproven else None

    def again(self, report: RecoveryReport, longest_s: float) -> _Unfinished | None:
        return _Unfinished.after(report, self.pass_kind, min(self.interval_s * 2, longest_s))


class RunRuntime:
    """``async with RunRuntime(ledger, brokers=[...], workers=[...], node=...)``.

    ``ports``: recovery's ports (default: the first broker, the ledger's checkpoints as
    ``checkpoint_owner`` and ``delete_checkpoint``, and the workers' queues as the known
    queues). ``require_clean``: raise on a degraded startup (default: True on
    PostgreSQL, False on SQLite)."""

    def __init__(
        self, ledger: RunLedger, *, brokers: Sequence[Broker], workers: Sequence[RunWorker], node: str,
        ports: RecoveryPorts | None = None, require_clean: bool | None = None, relay_interval_s: float = 1.0,
        shutdown_deadline_s: float = 30.0, node_lease_s: float = DEFAULT_NODE_LEASE_S,
    ) -> None:
        if not isinstance(ledger, RunLedger):
            raise _refuse("ledger", "run_ledger_required")
        if isinstance(brokers, (str, bytes)) or not brokers or not all(isinstance(b, Broker) for b in brokers):
            raise _refuse("brokers", "brokers_required")
        if isinstance(workers, (str, bytes)) or not all(isinstance(w, RunWorker) for w in workers):
            raise _refuse("workers", "run_workers_required")
        if type(node) is not str or not node:
            raise _refuse("node", "node_required")
        if require_clean is not None and type(require_clean) is not bool:
            raise _refuse("require_clean", "boolean_required")
        if type(shutdown_deadline_s) not in (int, float) or not 0 < shutdown_deadline_s <= 3600:
            raise _refuse("shutdown_deadline_s", "number_out_of_range")
        if type(relay_interval_s) not in (int, float) or not 0 < relay_interval_s <= 60:
            raise _refuse("relay_interval_s", "number_out_of_range")
        if type(node_lease_s) not in (int, float) or not 2 * relay_interval_s < node_lease_s <= 3600:
            raise _refuse("node_lease_s", "more_than_two_relay_intervals_required")
        self.ledger = ledger
        self.brokers = tuple(brokers)
        self.workers = tuple(workers)
        self.node = node
        queues = frozenset(q for worker in workers for q in worker.queues) or None
        # The ledger's checkpoint ports take any number of calls at once; the broker
        # says whether it does (tenure's brokers do).
        concurrent = getattr(self.brokers[0], "concurrent_calls", False) is True
        self.ports = ports if ports is not None else RecoveryPorts(
            broker=self.brokers[0], checkpoint_owner=ledger.checkpoints.owner,
            delete_checkpoint=ledger.checkpoints.delete, known_queues=queues,
            checkpoint_outcome=ledger.checkpoints.outcome, concurrency=VISIT_CONCURRENCY if concurrent else 1)
        if not isinstance(self.ports, RecoveryPorts):
            raise _refuse("ports", "recovery_ports_required")
        self.require_clean = require_clean if require_clean is not None else ledger.database == "postgresql"
        self.relay_interval_s = relay_interval_s
        self.shutdown_deadline_s = float(shutdown_deadline_s)
        self.node_lease_s = float(node_lease_s)
        self.startup: RecoveryReport | None = None
        self.lease: NodeLease | None = None
        """This process's incarnation of its node (a new one after each self-fence)."""
        self.reboots = 0
        """How many times this process fenced itself and booted again."""
        self.takeovers: list[tuple[str, RecoveryReport]] = []
        """The nodes this process took over, each with its reconciliation's report."""
        self._valid_until = 0.0
        self._rebooting = False
        self._unfinished: _Unfinished | None = None
        """This incarnation's own reconciliation, while it left Runs unproven: the lease
        keeper reconciles again (see :meth:`_reconcile_again`)."""
        self._recording_fails = False
        self._keeper: asyncio.Task[None] | None = None
        self._relay_stop = asyncio.Event()
        self._relays: asyncio.Task[None] | None = None
        self._connected: list[Any] = []

    async def __aenter__(self) -> RunRuntime:
        for broker in self.brokers:
            connect = getattr(broker, "connect", None)
            try:
                if connect is not None:
                    await connect()
            except BaseException:
                await self._disconnect()
                raise
            self._connected.append(broker)
        try:
            report = await self._boot("startup")
            self.startup = report
            self._unfinished = _Unfinished.after(report, "startup", self.relay_interval_s)
            if report.degraded:
                log.warning("startup reconciliation degraded: %s", _issues(report), extra={"node": self.node})
                if self.require_clean and report.unproven:  # a Run it cannot read does not stop the start
                    raise StartupDegraded(report)
            self._relay_stop.clear()
            self._relays = asyncio.ensure_future(run_relays(
                self.ledger, self.ports, node=self.node, stop=self._relay_stop, interval_s=self.relay_interval_s,
                on_report=functools.partial(self.record_report, self.node, "relay")))
            self._keeper = asyncio.ensure_future(self._keep_lease())
            for worker in self.workers:
                await worker.start()
        except BaseException:
            await self._stop_everything()
            await self._disconnect()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stop_everything()
        await self._disconnect()

    async def _stop_everything(self) -> None:
        """Stop relays and workers under one deadline; raise ShutdownIncomplete (leaving
        the brokers connected) when a task did not end."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_deadline_s
        live = 0
        self._relay_stop.set()
        for name in ("_relays", "_keeper"):
            task = getattr(self, name)
            setattr(self, name, None)
            if task is not None:
                task.cancel()
                done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
                live += 0 if done else 1
        stops = [asyncio.ensure_future(worker.stop(max(0.001, deadline - loop.time()))) for worker in self.workers]
        if stops:
            await asyncio.wait(stops)
        for stop in stops:
            error = stop.exception()
            if isinstance(error, WorkerStopFailed):
                live += error.live_tasks
            elif error is not None:
                raise error
        if live:
            raise ShutdownIncomplete(live)

    # --- the node's lease ----------------------------------------------------------------

    async def _boot(self, pass_kind: str) -> RecoveryReport:
        """Boot a new incarnation and reconcile this node's orphans with its cutoff."""
        sent = time.monotonic()
        self.lease = await self.ledger.nodes.boot(self.node, lease_s=self.node_lease_s)
        self._valid_until = sent + self.node_lease_s - self.relay_interval_s
        async with self._renewing():
            report = await self.ledger.reconcile(self.ports, node=self.node, boot_cutoff=self.lease.cutoff)
        await self.record_report(self.node, pass_kind, report)
        return report

    async def record_report(self, node: str, pass_kind: str, report: RecoveryReport) -> None:
        """Record ``report`` as ``node``'s latest (see the module docstring); never raises
        but a cancellation. A failure is logged once, and again only after a recording
        succeeded (a database not migrated to ``runs_v6`` would otherwise log every round)."""
        try:
            # A node's own passes say which queues its workers serve; a takeover's row is
            # about a dead node, which serves none.
            queues = () if pass_kind == "takeover" else sorted({q for worker in self.workers for q in worker.queues})
            await self.ledger.recovery_reports.record(node, pass_kind, report, queues)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - a diagnostic's failure never reaches recovery
            if not self._recording_fails:
                reason = error.reason if isinstance(error, TenureError) else ""
                log.warning("node %s: recording a recovery report failed with %s%s; recovery goes on", self.node,
                            type(error).__name__, f" ({reason})" if reason else "", extra={"node": self.node})
            self._recording_fails = True
            return
        if self._recording_fails:
            log.warning("node %s: recovery reports are recorded again", self.node, extra={"node": self.node})
        self._recording_fails = False

    @contextlib.asynccontextmanager
    async def _renewing(self) -> AsyncIterator[None]:
        """Renew the lease beside a reconciliation, which may take longer than the lease
        (it visits every Run it must repair): without this, a node whose reconciliation
        outlasts its lease would lose the lease it just booted and boot again forever. A
        refused renewal is left to the keeper's next round, which fences and reboots."""
        async def renew() -> None:
            while True:
                await asyncio.sleep(self.relay_interval_s)
                lease = self.lease
                if lease is None:
                    continue
                sent = time.monotonic()
                with contextlib.suppress(TenureError):
                    if await self.ledger.nodes.renew(lease, lease_s=self.node_lease_s):
                        self._valid_until = sent + self.node_lease_s - self.relay_interval_s

        task = asyncio.ensure_future(renew())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _keep_lease(self) -> None:
        """Renew, fence this process when the lease is lost, take over dead nodes (the
        module docstring); every database failure is retried the next round."""
        outage = OutageLog(log, f"node {self.node}'s lease rounds", fields={"node": self.node})
        while not self._relay_stop.is_set():
            try:
                await self._renew_or_reboot()
                if time.monotonic() < self._valid_until:
                    await self._reconcile_again()
                    for worker in self.workers:
                        await worker.settle_unsettled(self.ports)
                    await self._take_over_dead_nodes()
                outage.answered()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - the next round may succeed
                outage.failed("a lease round", type(error).__name__, error.reason if isinstance(error, TenureError) else "raised")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._relay_stop.wait(), timeout=self.relay_interval_s)

    async def _renew_or_reboot(self) -> None:
        assert self.lease is not None
        if not self._rebooting:
            sent = time.monotonic()
            renewed: bool | None = None
            with contextlib.suppress(TenureError):  # a database failure: judged by the local clock below
                renewed = await self.ledger.nodes.renew(self.lease, lease_s=self.node_lease_s)
            if renewed:
                self._valid_until = sent + self.node_lease_s - self.relay_interval_s
                return
            if renewed is None and time.monotonic() < self._valid_until:
                return  # not renewed this round, but the lease still holds
            # The lease is lost, or may be: no hop of this incarnation may go on.
            log.warning("node %s: lease %s; fencing this process and booting again", self.node,
                        "lost" if renewed is False else "not renewed in time", extra={"node": self.node})
            # Until the reboot finished (boot, reconcile, workers resumed) every round
            # reboots again: a reboot cut short by a database failure must not leave the
            # workers' gate closed under a lease that renews.
            self._rebooting = True
            for worker in self.workers:
                await worker.fence_hops(self.shutdown_deadline_s)
        report = await self._boot("reboot")
        self._rebooting = False
        self.reboots += 1
        self._unfinished = _Unfinished.after(report, "reboot", self.relay_interval_s)
        if report.degraded:
            log.warning("node %s: reconciliation after the reboot degraded: %s", self.node, _issues(report),
                        extra={"node": self.node})
        for worker in self.workers:
            worker.resume()

    async def _reconcile_again(self) -> None:
        """Reconcile this incarnation's orphans again, with its own cutoff, while its last
        reconciliation left Runs unproven (a port or the database failed mid-pass: an
        orphan fenced but not yet failed or retried). The relays never visit a hop, so
        without this such a Run would stay RUNNING on this live node until its next boot.
        Tried after one relay interval, then at doubling intervals up to the node lease
        (a Run that stays unproven is not re-read every round); a Run claimed by this
        incarnation is after the cutoff and left alone, as in any reconciliation."""
        unfinished = self._unfinished
        if unfinished is None or time.monotonic() < unfinished.due or self.lease is None:
            return
        async with self._renewing():
            report = await self.ledger.reconcile(self.ports, node=self.node, boot_cutoff=self.lease.cutoff)
        await self.record_report(self.node, unfinished.pass_kind, report)
        self._unfinished = unfinished.again(report, self.node_lease_s)
        if self._unfinished is None:
            log.info("node %s: its reconciliation is complete again", self.node, extra={"node": self.node})
        else:  # said at each try: at doubling intervals, then once per node lease
            log.warning("node %s: its reconciliation is still degraded: %s", self.node, _issues(report),
                        extra={"node": self.node})

    async def _take_over_dead_nodes(self) -> None:
        nodes = self.ledger.nodes
        for row in await nodes.expired():
            if row.node == self.node:
                continue
            takeover = await nodes.take_over(self.node, row, lease_s=self.node_lease_s)
            if takeover is None:
                continue
            log.warning("node %s: taking over node %s (its lease ran out)", self.node, row.node,
                        extra={"node": self.node, "taken_over": row.node})
            async with self._renewing():
                report = await self.ledger.reconcile(self.ports, node=takeover.node, boot_cutoff=takeover.cutoff)
            await self.record_report(takeover.node, "takeover", report)
            self.takeovers.append((takeover.node, report))
            if not report.degraded:
                await nodes.finish(self.node, takeover)

    async def _disconnect(self) -> None:
        connected, self._connected = self._connected, []
        failures: list[Exception] = []
        cancelled = False
        for broker in reversed(connected):
            disconnect = getattr(broker, "disconnect", None)
            if disconnect is None:
                continue
            # Every broker is attempted; a cancellation waits until the sweep is done.
            task = asyncio.ensure_future(disconnect())
            while not task.done():
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    cancelled = True
                except Exception:  # noqa: BLE001 - collected below
                    break
            if task.done() and not task.cancelled() and task.exception() is not None:
                error = task.exception()
                failures.append(error if isinstance(error, Exception) else RuntimeError(type(error).__name__))
        if cancelled:
            raise asyncio.CancelledError()
        if failures:
            raise ExceptionGroup("broker disconnect failed", failures)
