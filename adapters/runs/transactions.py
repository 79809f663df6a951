"""The names the Run side used before the Run engine (issue 49), kept for its callers.

Every Run command now goes through :meth:`tenure.adapters.runs.engine.RunEngine.send`.
``RunTransactions`` (``RunLedger.transactions``) keeps the old toolkit's names working on
top of it for the modules not yet moved to ``RunLedger.engine`` (startup recovery,
``adapters/runs/recovery.py``): ``send`` answers the kernel's ``Decision`` as it did;
``finish_cancel_on`` and ``retry_lost_on`` send their command through the engine. No
transaction body is spelled here. New code uses ``RunLedger.engine``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenure.kernel.core import Decision
from tenure.kernel.runs.aggregate import UNREAD_CONTAINMENT
from tenure.kernel.runs.commands import FinishCancel, RetryLost, Rotated, RunCommand, Settled
from tenure.model import BrokerJobState
from tenure.model.runs import check_run_id

from ..core.store import Transaction
from .engine import RunEngine, attempt_evidence, consent_evidence, current_pair, job_evidence

__all__ = ["RunTransactions", "consent_evidence", "job_evidence", "attempt_evidence", "current_pair"]

T = TypeVar("T")


class RunTransactions:
    """The pre-engine toolkit's names, each a call of :class:`RunEngine` (see the module
    docstring)."""

    locked_pair = staticmethod(RunEngine.locked_pair)
    read_pair = staticmethod(RunEngine.read_pair)
    containment = staticmethod(RunEngine.containment)
    owner = staticmethod(RunEngine.owner)

    def __init__(self, run_engine: RunEngine) -> None:
        self._run_engine = run_engine
        self.engine = run_engine.engine

    def errors(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._run_engine.errors()

    async def run(self, body: Callable[[Transaction], Awaitable[T]], *, write: bool = True) -> T:
        return await self._run_engine.run(body, write=write)

    async def send(self, run_id: str, command: RunCommand) -> Decision:
        """:meth:`RunEngine.send`'s decision."""
        return (await self._run_engine.send(run_id, command)).decision

    async def applied(self, run_id: object, command: RunCommand) -> bool:
        return await self._run_engine.applied(check_run_id(run_id), command)

    async def finish_cancel_on(self, run_id: str, enqueue_seq: int, hop: BrokerJobState | None) -> bool:
        """``finish_cancel`` on the hop state the caller's fence observed: whether it
        made the Run CANCELLED."""
        command = FinishCancel(enqueue_seq=enqueue_seq, hop=hop, containment=UNREAD_CONTAINMENT)
        return isinstance((await self._run_engine.send(run_id, command)).reply, Settled)

    async def retry_lost_on(self, run_id: str, enqueue_seq: int, hop: BrokerJobState | None) -> int | None:
        """``retry_lost`` on the hop state the caller's fence observed: the new sequence,
        or None when refused."""
        command = RetryLost(enqueue_seq=enqueue_seq, hop=hop, containment=UNREAD_CONTAINMENT)
        reply = (await self._run_engine.send(run_id, command)).reply
        return reply.enqueue_seq if isinstance(reply, Rotated) else None
