"""A node of the Run chaos test (tests/processes/test_run_chaos.py): ``python run_chaos_node.py DB_URL``
runs :func:`run_worker_process.serve_node` on tenure's owned queue as ``TENURE_TEST_NODE``
until it is killed, and keeps a side-effect log in ``TENURE_CHAOS_LOG_DIR`` (one file per
process, one JSON object per line, appended and flushed: a line survives ``kill -9``, a
frozen process writes nothing).

Every hop body (:func:`_hop`) logs ``start`` (the hop holds its Run: the worker claimed
it first), pauses so that kills, freezes and the server restart land inside it, then
writes the step ``hop-<seq>`` to the step journal (``RunLedger.steps.record``: under the
Run's lock, accepted only while the Run is still at the hop's sequence; sent without
asking first, so a hop that lost its Run while frozen really sends a stale write) and
logs ``end`` with the monotonic instants of its start and of just before that write
(``prewrite``). A hop whose write is refused logs ``refused``; one cancelled before it
has an answer (its worker saw the Run move on, or the node fenced itself) logs
``cancelled`` (a write already sent is awaited first, and its answer logged). Since a
hop holds its Run from its claim until the Run leaves its sequence, for good, a hop that
logged ``end`` held the Run over all of ``[start, prewrite]``: those intervals of one Run
never overlap unless two hops held it at once. The node also logs each outcome its
worker records before settling (``outcome``, with whether the ledger accepted it): a Run
whose hop recorded its outcome has finished, and recovery must settle it with that
outcome, never fail it ``lost``.

Replayed workflows (``tenure.adapters.App``, issue 50): ``story`` runs its hop body, then a
journaled ``step`` (logged ``step`` when its body runs: at least once, recorded once), a
consent it gets back as an answer, a message (``recv``), a durable timer and a child Run of ``leaf`` (one hop)
whose result it awaits, and returns every answer; each of those waits ends the hop and
the next hop replays the journal. Nodes adopt ended children and resume their parents
(the App's children relay, :func:`relay_children`). Both declare ``on_lost="retry"``.

Workflows: ``one`` returns its result in one hop; ``two`` asks for a consent and parks,
and the hop that resumes from the granted consent returns; ``nap`` sleeps on a durable
timer (``ctx.sleep``) and the hop the relays resume once it is due returns. All three are
declared ``on_lost="retry"``; ``one-fail``, ``two-fail`` and ``nap-fail`` are the same
bodies with the default ``fail``. Database failures inside a body (the server restarting) are retried, as a
workflow author would; every other error fails the Run and the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import random
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from run_worker_process import serve_node
from tenure.adapters import App, RunLedger, WorkflowContext
from tenure.adapters.runs.checkpoints import RecordedOutcome
from tenure.adapters.runs.workflows import HopLost
from tenure.model import ConsentStatus, ErrorCode, RunStatus, TenureError

__all__ = ["registry", "FLOWS", "MAX_HOP_RETRIES", "HOP_SECONDS"]

MAX_HOP_RETRIES = 50
"""Enough for every fault of a soak to cost a Run a few hops (the test reports the largest used)."""
HOP_SECONDS = (0.2, 0.8)
"""How long a hop body pauses between its start and its fenced write."""
PERSIST_TRIES = 400
"""A body retries a database failure at most this many times (about five minutes): a hang guard."""

app = App(os.environ.get("TENURE_CHAOS_DB", "sqlite:///unused-by-the-test-process.db"))
"""The nodes' App (its URL from ``TENURE_CHAOS_DB``; the test process reads only its pins)."""
registry = app.registry
"""Every chaos workflow: the lower layer's bodies and the App's replayed ones."""


class EffectLog:
    """This process's side-effect log, opened on first use."""

    def __init__(self) -> None:
        self._file: Any = None
        self.node = os.environ.get("TENURE_TEST_NODE", "?")

    def write(self, event: str, run_id: str, seq: int, **more: Any) -> None:
        if self._file is None:
            folder = pathlib.Path(os.environ["TENURE_CHAOS_LOG_DIR"])
            self._file = (folder / f"{self.node}-{os.getpid()}.log").open("a", encoding="utf-8")
        line = {"e": event, "run": run_id, "seq": seq, "pid": os.getpid(), "node": self.node,
                "t": time.monotonic_ns(), **more}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()


effects = EffectLog()


async def _durably(call: Callable[[], Awaitable[Any]]) -> Any:
    """``call()``, again after each database failure (the server restarting)."""
    for attempt in range(PERSIST_TRIES):
        try:
            return await call()
        except TenureError as error:
            if error.code is not ErrorCode.RUN_PERSISTENCE_FAILED or attempt == PERSIST_TRIES - 1:
                raise
        await asyncio.sleep(min(1.0, 0.05 * 2 ** min(attempt, 5)))
    raise AssertionError("unreachable")


async def _hop(ctx: Any) -> None:
    run_id, seq = ctx.run_id, ctx.enqueue_seq
    started = time.monotonic_ns()
    effects.write("start", run_id, seq, resumed=ctx.resumed)
    try:
        await asyncio.sleep(random.Random(f"{run_id}:{seq}").uniform(*HOP_SECONDS))
    except asyncio.CancelledError:
        effects.write("cancelled", run_id, seq)
        raise
    prewrite = time.monotonic_ns()
    # Sent without asking first whether the hop still holds its Run (ctx.step would): a
    # hop that lost it while frozen really sends its stale write, and the ledger refuses it.
    value = {"seq": seq, "pid": os.getpid(), "start": started}
    write = asyncio.ensure_future(_durably(lambda: ledger().steps.record(run_id, seq, f"hop-{seq}", value)))
    try:
        held, _ = await asyncio.shield(write)
    except asyncio.CancelledError:
        # The worker stops the hop (its Run moved on, or the node fenced itself) while the
        # write is on its way: what the ledger answered is logged before the hop ends.
        await asyncio.wait({write}, timeout=60)
        effects.write(_answer(write), run_id, seq, start=started, prewrite=prewrite)
        raise
    effects.write("end" if held else "refused", run_id, seq, start=started, prewrite=prewrite)
    if not held:
        raise HopLost()


def _answer(write: asyncio.Future[tuple[bool, Any]]) -> str:
    if not write.done() or write.cancelled() or write.exception() is not None:
        return "cancelled"
    return "end" if write.result()[0] else "refused"


def _result(ctx: Any, **more: Any) -> dict[str, Any]:
    return {"flow": ctx.run.workflow.name, "n": ctx.payload["n"], "seq": ctx.enqueue_seq, "pid": os.getpid(), **more}


async def one(ctx: Any) -> dict[str, Any]:
    await _hop(ctx)
    return _result(ctx)


async def two(ctx: Any) -> dict[str, Any]:
    await _hop(ctx)
    if not ctx.resumed:
        # Parks the Run and ends the hop (HopParked passes through _durably).
        await _durably(lambda: ctx.request_consent(
            tool_name="mail.send", tool_call_id=f"call-{ctx.enqueue_seq}", payload={"n": ctx.payload["n"]},
            state={"asked_at": ctx.enqueue_seq}))
    if ctx.consent.status is not ConsentStatus.GRANTED:
        raise RuntimeError("resumed without a granted consent")
    return _result(ctx, consent=ctx.consent.consent_id)


async def nap(ctx: Any) -> dict[str, Any]:
    await _hop(ctx)
    if not ctx.resumed:
        # Parks the Run on a durable timer and ends the hop; a relay resumes it when due.
        await _durably(lambda: ctx.sleep(NAP_SECONDS, state={"slept_at": ctx.enqueue_seq}))
    if ctx.timer is None:
        raise RuntimeError("resumed without its timer")
    return _result(ctx, timer=ctx.timer)


NAP_SECONDS = 0.5
"""How long ``nap`` sleeps on its durable timer."""


def _stamp(run_id: str) -> dict[str, Any]:
    """A step's body: its effect is a ``step`` line in the side-effect log (at least once)."""
    effects.write("step", run_id, -1)
    return {"pid": os.getpid(), "t": time.monotonic_ns()}


@app.workflow(name="leaf", version="1", queue="runs", on_lost="retry", max_hop_retries=MAX_HOP_RETRIES)
async def leaf(ctx: WorkflowContext, n: int) -> dict[str, Any]:
    await _hop(ctx.hop)
    return _result(ctx.hop)


@app.workflow(name="story", version="1", queue="runs", on_lost="retry", max_hop_retries=MAX_HOP_RETRIES)
async def story(ctx: WorkflowContext, n: int) -> dict[str, Any]:
    await _hop(ctx.hop)
    stamp = await ctx.step(_stamp, ctx.run_id, name="stamp")
    verdict = await ctx.consent("mail.send", {"n": n})
    note = await ctx.recv("go")  # the test sends one, before the Run asks or once it waits
    await ctx.sleep(NAP_SECONDS)
    child = await ctx.start_child(leaf, n)
    answer = await child.result()
    return _result(ctx.hop, stamp=stamp, verdict=verdict.status, note=note, child=child.run_id, leaf=answer)


async def relay_children(interval_s: float) -> None:
    """The App's children relay, as an AppWorker runs it: adopt ended child Runs and resume
    their parents, through database failures (the server restarting)."""
    while True:
        with contextlib.suppress(TenureError):
            await app.settle_children()
        await asyncio.sleep(interval_s)

BODIES = {"one": one, "two": two, "nap": nap}
FLOWS = {"one": "retry", "two": "retry", "nap": "retry", "one-fail": "fail", "two-fail": "fail", "nap-fail": "fail",
         "story": "retry"}
"""Each workflow the test admits and its declared ``on_lost`` policy (``leaf`` Runs are
admitted by their ``story``)."""

for _name, _policy in FLOWS.items():
    if _name in app.workflows:
        continue
    registry.register(_name, "1", BODIES[_name.removesuffix("-fail")], on_lost=_policy,
                      max_hop_retries=MAX_HOP_RETRIES if _policy == "retry" else None)


_LEDGER: list[RunLedger] = []


def ledger() -> RunLedger:
    """This node's Run ledger (the one its worker uses)."""
    return _LEDGER[0]


def prepare(run_ledger: RunLedger) -> None:
    """Keep the node's ledger, and log every outcome its worker settles with (``record``:
    one transaction, settled or recorded for recovery when containment is unproven) and
    whether the ledger accepted it (``recorded``: the Run settled or the outcome was
    recorded; False: the hop no longer held the Run)."""
    _LEDGER.append(run_ledger)
    settle = run_ledger.engine.settle

    async def observed(run_id: str, outcome: RecordedOutcome, **more: Any) -> bool:
        if not more.get("record"):  # recovery's settles (a recorded outcome, or failed lost) are not a hop's
            return await settle(run_id, outcome, **more)
        try:
            recorded = await settle(run_id, outcome, **more)
        except TenureError as failure:
            if failure.code is not ErrorCode.RUN_CONTAINMENT_UNPROVEN:
                raise
            effects.write("outcome", run_id, outcome.enqueue_seq, status=outcome.status.value, recorded=True)
            raise
        effects.write("outcome", run_id, outcome.enqueue_seq, status=outcome.status.value, recorded=recorded)
        return recorded

    run_ledger.engine.settle = observed  # type: ignore[method-assign]


if __name__ == "__main__":
    # A short queue lease: a hop claimed from the queue by a process killed before the
    # ledger claim is swept (and rotated by the relays) within seconds, not two minutes.
    async def main() -> None:
        relay_s = float(os.environ["TENURE_CHAOS_RELAY_S"])
        children = asyncio.ensure_future(relay_children(relay_s))
        try:
            await serve_node(sys.argv[1], "queue", registry, relay_interval_s=relay_s,
                             broker_options={"lease_seconds": 5.0, "heartbeat_seconds": 1.0}, prepare=prepare,
                             contain_job=app.contain_child)  # as an AppWorker wires it: a story's child
        finally:
            children.cancel()

    asyncio.run(main())
