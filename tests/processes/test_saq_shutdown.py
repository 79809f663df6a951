"""A lifespan on SAQ stops cleanly, round after round, on a loaded machine.

SAQ's own ``Worker.stop`` cancels each of its tasks once and, with no grace period,
warns "Some tasks did not finish within the shutdown grace period" on every stop. A
process task idle in ``PostgresQueue.dequeue`` absorbs that cancellation when a LISTEN
notification reaches its queue in the same step (Python 3.11's ``wait_for`` returns the
finished ``queue.get()`` instead of raising), and then waits for notifications forever:
``RunRuntime`` raised ``ShutdownIncomplete`` and the process ended with the stranded
gather's ``CancelledError`` as its last line. These tests make that interleaving
certain: every SAQ process task's first cancellation arrives together with a
notification. They also stop at the moment a hop ended, while SAQ still records its job
complete, which SAQ's stop cancelled (leaving the job active after its Run was DONE).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import saq

from tenure.adapters import RunLedger, RunRuntime, RunWorker, SaqBroker, Workflows
from tenure.model import BrokerJobState, RunIntent, RunStatus, hop_key

pytestmark = pytest.mark.parametrize("database", ["postgresql"])

ROUNDS = 20
RUNS_PER_ROUND = 3
ROUND_LIMIT_S = 30.0
"""A hang guard: a round that stops cleanly takes well under a second."""

SHUTDOWN_LIMIT_S = 10.0
"""The lifespan's shutdown deadline, also a hang guard."""

flows = Workflows()


@flows.workflow("noop", "1")
async def noop(ctx: Any) -> None:
    return None


PIN = flows.pin("noop", "1")


class NotifiedOnCancel(asyncio.Task):  # type: ignore[type-arg]
    """A SAQ process task whose first cancellation comes with a notification delivered to
    its queue's listener in the same step, before the cancellation."""

    notify: Callable[[], None] = staticmethod(lambda: None)

    def cancel(self, msg: Any = None) -> bool:
        if not getattr(self, "notified", False):
            self.notified = True
            NotifiedOnCancel.notify()
        return super().cancel(msg)


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """A process burning a CPU beside the test for its whole length."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        burner.kill()
        burner.wait()


@pytest.fixture
async def ledger(db_url: str) -> Any:
    async with RunLedger(db_url) as made:
        yield made


@pytest.fixture
async def broker(db_url: str) -> Any:
    made = SaqBroker(db_url, queues=["runs"], abort_wait_s=3.0)
    try:
        yield made
    finally:
        await made.disconnect()  # a lifespan that did not stop leaves it connected


@pytest.fixture
async def notified_cancellations(broker: SaqBroker) -> AsyncIterator[None]:
    """SAQ's process tasks become :class:`NotifiedOnCancel` tasks for the test."""
    from saq.queue.postgres import DEQUEUE

    loop = asyncio.get_running_loop()
    previous = loop.get_task_factory()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> asyncio.Task[Any]:
        kind = NotifiedOnCancel if getattr(coro, "__qualname__", "") == "Worker.process" else asyncio.Task
        return kind(coro, loop=loop, **options)

    # What the queue's LISTEN connection delivers when another worker dequeued a job.
    NotifiedOnCancel.notify = staticmethod(lambda: broker.queue("runs")._listener.publish(DEQUEUE, DEQUEUE))
    loop.set_task_factory(factory)
    try:
        yield
    finally:
        loop.set_task_factory(previous)
        NotifiedOnCancel.notify = staticmethod(lambda: None)


async def until(check: Callable[[], bool], limit_s: float = 15.0) -> None:
    """Wait for ``check`` to hold (``limit_s`` is a hang guard, not a timing)."""
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), limit_s)


def idle_in_dequeue(broker: SaqBroker) -> bool:
    """A SAQ process task waits in its queue's listen loop for a notification."""
    listener = broker.queue("runs")._listener
    return any(subscription._getters for subscription in listener._queues)


async def admitted_and_published(ledger: RunLedger, broker: SaqBroker, count: int) -> list[str]:
    run_ids = []
    for n in range(count):
        intent = RunIntent(None, "api", "alice", frozenset(), {"n": n})
        run_id = (await ledger.admit(intent, workflow=PIN, queue="runs", priority=50)).run.run_id
        await ledger.publish(run_id, 0, broker)  # False when the lifespan's relay published it first
        run_ids.append(run_id)
    return run_ids


def lifespan(ledger: RunLedger, broker: SaqBroker) -> tuple[RunRuntime, RunWorker]:
    runner = RunWorker(ledger, broker, flows, node="node-a", concurrency=1, queues=["runs"], watch_interval_s=0.05)
    runtime = RunRuntime(ledger, brokers=[broker], workers=[runner], node="node-a",
                         shutdown_deadline_s=SHUTDOWN_LIMIT_S)
    return runtime, runner


async def one_round(ledger: RunLedger, broker: SaqBroker) -> list[str]:
    runtime, runner = lifespan(ledger, broker)
    async with runtime:
        run_ids = await admitted_and_published(ledger, broker, RUNS_PER_ROUND)
        await until(lambda: runner.outcomes["done"] == RUNS_PER_ROUND)
        await until(lambda: idle_in_dequeue(broker))
    assert runner.outcomes["done"] == RUNS_PER_ROUND and runner.running_hops == 0
    return run_ids


def problems(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What SAQ or asyncio warned of or logged as an error."""
    return [f"{record.name}: {record.getMessage()}" for record in caplog.records
            if record.name.split(".")[0] in ("saq", "asyncio") and record.levelno >= logging.WARNING]


async def test_a_lifespan_on_saq_stops_cleanly_every_round_under_load_even_when_a_cancellation_is_absorbed(
    ledger: RunLedger, broker: SaqBroker, cpu_load: None, notified_cancellations: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    run_ids: list[str] = []
    for round_number in range(ROUNDS):
        try:
            run_ids += await asyncio.wait_for(one_round(ledger, broker), ROUND_LIMIT_S)
        except (Exception, asyncio.CancelledError) as error:
            pytest.fail(f"round {round_number} did not stop cleanly: {error!r}; logged: {problems(caplog)}")
        assert problems(caplog) == [], f"round {round_number}"
    for run_id in run_ids:
        assert (await ledger.get(run_id)).status is RunStatus.DONE  # type: ignore[union-attr]
    async with broker:
        states = {(await broker.probe(hop_key(run_id, 0))).state for run_id in run_ids}
    assert states == {BrokerJobState.COMPLETE}


async def test_a_stop_at_the_moment_a_hop_ended_lets_saq_record_its_job_complete(
    ledger: RunLedger, broker: SaqBroker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    workers: list[Any] = []

    class Recorded(saq.Worker):  # type: ignore[type-arg]
        def __init__(self, *args: Any, **options: Any) -> None:
            super().__init__(*args, **options)
            workers.append(self)

    monkeypatch.setattr(saq, "Worker", Recorded)
    runtime, runner = lifespan(ledger, broker)
    recording, release = asyncio.Event(), asyncio.Event()
    await runtime.__aenter__()
    stopping: asyncio.Future[None] | None = None
    try:
        queue = broker.queue("runs")
        real_finish = queue.finish

        async def held_finish(job: Any, status: Any, **more: Any) -> Any:
            # The hop has returned; SAQ records its job only once the stop has begun.
            recording.set()
            await release.wait()
            return await real_finish(job, status, **more)

        monkeypatch.setattr(queue, "finish", held_finish)
        (run_id,) = await admitted_and_published(ledger, broker, 1)
        await asyncio.wait_for(recording.wait(), 60)
        assert runner.outcomes["done"] == 1 and runner.running_hops == 0
        stopping = asyncio.ensure_future(runtime.__aexit__(None, None, None))
        # SAQ's worker is told to stop (its event) in the step that decides what to cancel.
        await until(lambda: bool(workers) and all(worker.event.is_set() for worker in workers))
        release.set()
        await asyncio.wait_for(stopping, ROUND_LIMIT_S)
    finally:
        release.set()
        if stopping is None:
            await runtime.__aexit__(None, None, None)
    async with broker:
        assert (await broker.probe(hop_key(run_id, 0))).state is BrokerJobState.COMPLETE
    assert problems(caplog) == []
