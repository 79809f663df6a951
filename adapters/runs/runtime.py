"""The lifespan of a process that runs workflow Runs, in the seed's order.

Entering a :class:`RunRuntime`: connect every broker (a failure disconnects those already
connected, in reverse, and raises); capture the boot cutoff from the database's clock;
reconcile once with it (startup recovery, ``specs/recovery.md``), and when the report is
degraded and a clean start is required (by default on PostgreSQL; an embedded SQLite
file starts best-effort, its report kept in :attr:`RunRuntime.startup`) disconnect and
raise :class:`StartupDegraded`; then start the relays and the workers.

Leaving it: stop the relays and every worker under one deadline (``shutdown_deadline_s``,
30 s by default), proving that the relay task and every hop task ended. When something
did not end, :class:`ShutdownIncomplete` is raised and the brokers stay connected: a hop
still running may still use them. Otherwise disconnect the brokers in reverse order,
attempting every one, and raise an ``ExceptionGroup`` of the failures, if any.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from tenure.model import ConfigValidationError

from .broker import Broker
from .ledger import RunLedger
from .recovery import RecoveryPorts, RecoveryReport, run_relays
from .worker import RunWorker, WorkerStopFailed

__all__ = ["RunRuntime", "StartupDegraded", "ShutdownIncomplete"]

log = logging.getLogger("tenure.runs.runtime")


class StartupDegraded(Exception):
    """Startup reconciliation left Runs it could not prove (see ``report.issues``)."""

    def __init__(self, report: RecoveryReport) -> None:
        reasons = sorted({issue.reason for issue in report.issues})
        super().__init__(f"startup reconciliation degraded: {len(report.issues)} Run(s) ({', '.join(reasons)})")
        self.report = report


class ShutdownIncomplete(Exception):
    """Some task did not end by the shutdown deadline; the brokers were left connected."""

    def __init__(self, live_tasks: int) -> None:
        super().__init__(f"{live_tasks} task(s) still running after the shutdown deadline; brokers left connected")
        self.live_tasks = live_tasks


def _refuse(field: str, problem: str) -> ConfigValidationError:
    return ConfigValidationError("invalid_runtime", fields=(field,), problems=(problem,))


class RunRuntime:
    """``async with RunRuntime(ledger, brokers=[...], workers=[...], node=...)``.

    ``ports``: recovery's ports (default: the first broker, the ledger's checkpoints as
    ``checkpoint_owner`` and ``delete_checkpoint``, and the workers' queues as the known
    queues). ``require_clean``: raise on a degraded startup (default: True on
    PostgreSQL, False on SQLite)."""

    def __init__(
        self, ledger: RunLedger, *, brokers: Sequence[Broker], workers: Sequence[RunWorker], node: str,
        ports: RecoveryPorts | None = None, require_clean: bool | None = None, relay_interval_s: float = 1.0,
        shutdown_deadline_s: float = 30.0,
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
        self.ledger = ledger
        self.brokers = tuple(brokers)
        self.workers = tuple(workers)
        self.node = node
        queues = frozenset(q for worker in workers for q in worker.queues) or None
        self.ports = ports if ports is not None else RecoveryPorts(
            broker=self.brokers[0], checkpoint_owner=ledger.checkpoints.owner,
            delete_checkpoint=ledger.checkpoints.delete, known_queues=queues)
        if not isinstance(self.ports, RecoveryPorts):
            raise _refuse("ports", "recovery_ports_required")
        self.require_clean = require_clean if require_clean is not None else ledger.database == "postgresql"
        self.relay_interval_s = relay_interval_s
        self.shutdown_deadline_s = float(shutdown_deadline_s)
        self.startup: RecoveryReport | None = None
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
            cutoff = await self.ledger.database_now()
            report = await self.ledger.reconcile(self.ports, node=self.node, boot_cutoff=cutoff)
            self.startup = report
            if report.degraded:
                log.warning("startup reconciliation degraded: %d Run(s)", len(report.issues))
                if self.require_clean:
                    raise StartupDegraded(report)
            self._relay_stop.clear()
            self._relays = asyncio.ensure_future(run_relays(self.ledger, self.ports, node=self.node,
                                                            stop=self._relay_stop, interval_s=self.relay_interval_s))
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
        relays, self._relays = self._relays, None
        if relays is not None:
            relays.cancel()
            done, _ = await asyncio.wait({relays}, timeout=max(0.0, deadline - loop.time()))
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
