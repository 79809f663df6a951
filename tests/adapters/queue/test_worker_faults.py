"""The fenced worker under faults (issue 47), on every database: a claim that arrives
after its local lease deadline (a lock wait, a stall) is renewed before it runs, or
logged as lost, or given back; every lease loss is logged with its job; a write refused
after the local deadline is counted stale; a handler's ``SystemExit``,
``KeyboardInterrupt`` or own ``CancelledError`` fails its attempt and the worker goes on;
what a failure logs is cleaned and bounded as what it stores; and an idle worker whose
LISTEN connection was cut reconnects, logs it and claims at once (PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import sys
from collections.abc import AsyncIterator
from typing import Any

import adapter_support
import pytest
from polling import until
from stalling_proxy import stalling_proxy

from tenure.adapters import FailJob, JobContext, ValidationJobSource, Worker
from tenure.apps.logs import TEXT_FORMAT, JsonFormatter
from tenure.adapters.queue import runner as runner_module
from tenure.model import JobStatus, QueueKind, ValidationJob, WorkerConfig

LOGGER = "tenure.adapters.queue.worker"

LEASE_S = 3.0
"""The lease of the late-claim tests: held locks and stalls are measured against it
(never a bound the test races: each waits until the worker's deadline has surely passed)."""


def config(db_url: str, **settings: Any) -> WorkerConfig:
    settings.setdefault("lease_seconds", 5)
    settings.setdefault("heartbeat_seconds", 1)
    settings.setdefault("backoff_base_ms", 0)
    return WorkerConfig(db_url, **settings)


async def submit(source: ValidationJobSource, count: int, *, prefix: str = "s", **fields: Any) -> list[str]:
    return [
        await source.submit_owned(ValidationJob("orders", "1", f"{prefix}-{n}.jsonl", **fields),
                                  submission_id=f"{prefix}-{n}")
        for n in range(count)
    ]


class WriteLock:
    """Another session holding the queue table's write lock, as an operator's long
    transaction or a stalled neighbour would: SQLite ``BEGIN IMMEDIATE``, PostgreSQL
    ``LOCK TABLE ... IN ACCESS EXCLUSIVE MODE``."""

    def __init__(self, database: str, db_url: str) -> None:
        self.database, self.db_url = database, db_url
        self._sqlite: sqlite3.Connection | None = None
        self._pg: Any = None

    async def take(self) -> None:
        name = adapter_support.table(QueueKind.VALIDATION, self.db_url)
        if self.database == "sqlite":
            connection = sqlite3.connect(adapter_support.sqlite_path(self.db_url), isolation_level=None,
                                         check_same_thread=False, timeout=60)
            await asyncio.to_thread(connection.execute, "BEGIN IMMEDIATE")
            self._sqlite = connection
            return
        import asyncpg

        self._pg = await asyncpg.connect(self.db_url)
        await self._pg.execute("BEGIN")
        await self._pg.execute(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE")

    async def someone_waits(self) -> bool:
        """Whether a session waits on this lock (PostgreSQL shows it; SQLite's busy wait
        is invisible, so True)."""
        if self._pg is None:
            return True
        return bool(await self._pg.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"))

    async def release(self) -> None:
        if self._sqlite is not None:
            connection, self._sqlite = self._sqlite, None
            await asyncio.to_thread(connection.execute, "COMMIT")
            connection.close()
        if self._pg is not None:
            connection, self._pg = self._pg, None
            await connection.execute("COMMIT")
            await connection.close()


@contextlib.asynccontextmanager
async def write_locked(database: str, db_url: str) -> AsyncIterator[WriteLock]:
    lock = WriteLock(database, db_url)
    await lock.take()
    try:
        yield lock
    finally:
        await lock.release()


def observe_claims(source: ValidationJobSource) -> list[float]:
    """The loop times at which the worker's claim calls were sent (each no earlier than
    the worker's own send time, from which it arms its local deadline)."""
    sent: list[float] = []
    original = source.claim_next_owned

    async def observed(*args: Any, **kwargs: Any) -> Any:
        sent.append(asyncio.get_running_loop().time())
        return await original(*args, **kwargs)

    source.claim_next_owned = observed  # type: ignore[method-assign]
    return sent


async def claim_held_past_its_lease(database: str, db_url: str, worker: Worker) -> asyncio.Task[Any]:
    """Start ``worker`` (run until idle) while another session holds the write lock; hold
    it until the first claim waits on it and the worker's local lease deadline (its send
    time plus the lease) has passed, then release: the claim commits with a fresh lease
    and its answer arrives after the worker's deadline, whatever the machine's speed."""
    loop = asyncio.get_running_loop()
    sent = observe_claims(worker.source)  # type: ignore[arg-type]
    async with write_locked(database, db_url) as lock:
        running = asyncio.create_task(worker.run_until_idle())
        await until(lambda: sent, 60, what="the worker sends its claim")
        await until(lock.someone_waits, 60, what="the claim waits on the held lock")
        await asyncio.sleep(max(0.0, sent[0] + LEASE_S + 0.2 - loop.time()))
    return running


def lease_loss_lines(records: list[logging.LogRecord], job_id: str) -> list[logging.LogRecord]:
    return [record for record in records
            if getattr(record, "job_id", None) == job_id and getattr(record, "outcome", None) == "lease lost"]


# --- item 1: a claim delayed past its lease -----------------------------------------------


async def test_a_claim_answered_after_its_lease_deadline_is_renewed_and_run(
    db_url: str, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with ValidationJobSource(db_url, config(db_url, lease_seconds=LEASE_S, heartbeat_seconds=0.5)) as source:
        [job_id] = await submit(source, 1, max_attempts=1)
        ran: list[int] = []

        async def handler(claimed: Any, context: JobContext) -> dict[str, Any]:
            ran.append(context.attempt)
            return {"ran": True}

        worker = Worker(source, handler, concurrency=1)
        with caplog.at_level(logging.INFO, logger=LOGGER):
            running = await claim_held_past_its_lease(database, db_url, worker)
            stats = await asyncio.wait_for(running, 60)
        info = await source.get_job(job_id)
    assert ran == [1]
    assert (stats.claimed, stats.completed, stats.lease_losses, stats.released) == (1, 1, 0, 0)
    assert (info.status, info.result, info.generation) == (JobStatus.COMPLETED, {"ran": True}, 1)
    assert any(getattr(record, "job_id", None) == job_id and "renewed" in record.getMessage()
               for record in caplog.records)


async def test_a_late_claim_whose_renewal_is_refused_is_logged_as_lost_and_never_run(
    db_url: str, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The renewal itself stalls on its way (a frozen network) until the database's lease
    must have ended: the database refuses it, and the loss is logged with the job."""
    async with ValidationJobSource(db_url, config(db_url, lease_seconds=LEASE_S, heartbeat_seconds=0.5)) as source:
        [job_id] = await submit(source, 1, max_attempts=1)
        original = source.heartbeat_many_owned
        renewals: list[bool] = []

        async def stalled_on_the_way(fences: Any) -> list[bool]:
            if any(fence.job_id == job_id for fence in fences):
                # The claim's answer arrived before this call: its lease, armed by the
                # database when the claim ran, ends within LEASE_S from now.
                await asyncio.sleep(LEASE_S + 0.5)
            answers = await original(fences)
            renewals.extend(answers)
            return answers

        source.heartbeat_many_owned = stalled_on_the_way  # type: ignore[method-assign]
        ran: list[int] = []

        async def handler(claimed: Any, context: JobContext) -> dict[str, Any]:
            ran.append(context.attempt)
            return {}

        worker = Worker(source, handler, concurrency=1)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            running = await claim_held_past_its_lease(database, db_url, worker)
            stats = await asyncio.wait_for(running, 60)
    assert ran == [] and renewals[:1] == [False]
    assert (stats.completed, stats.lease_losses) == (0, 1)
    [line] = lease_loss_lines(caplog.records, job_id)
    assert line.levelno == logging.WARNING and line.attempt == 1  # type: ignore[attr-defined]
    assert f"job {job_id} (validation queue, attempt 1) lease lost" in line.getMessage()
    assert "renewal" in line.getMessage()


async def test_a_late_claim_never_renewed_in_time_is_given_back_with_its_attempt(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every answer (the claim's and its renewal's) arrives too close to its deadline:
    the database holds the claim, but the worker cannot keep it renewed, so it gives it
    back (pending at once, the attempt returned) instead of letting it expire."""
    monkeypatch.setattr(runner_module, "LATE_CLAIM_RENEWALS", 1)
    lease = config(db_url, lease_seconds=4, heartbeat_seconds=1.5)  # renewed with > 1.5 s left: in time
    async with ValidationJobSource(db_url, lease) as source:
        [job_id] = await submit(source, 1, max_attempts=1)
        loop = asyncio.get_running_loop()
        claim, renew = source.claim_next_owned, source.heartbeat_many_owned
        delayed = {"claims": 0, "renewals": 0}

        async def answer_late(call: Any, kind: str, *args: Any, **kwargs: Any) -> Any:
            sent = loop.time()
            answer = await call(*args, **kwargs)
            if delayed[kind] == 0 and answer:
                delayed[kind] += 1
                # Arrives with 1.45 s of its 4 s lease left (the database's lease runs
                # at least that long after this answer).
                await asyncio.sleep(max(0.0, sent + 2.55 - loop.time()))
            return answer

        source.claim_next_owned = lambda *a, **k: answer_late(claim, "claims", *a, **k)  # type: ignore[method-assign]
        source.heartbeat_many_owned = lambda *a, **k: answer_late(renew, "renewals", *a, **k)  # type: ignore[method-assign]
        ran: list[tuple[int, int]] = []

        async def handler(claimed: Any, context: JobContext) -> dict[str, Any]:
            ran.append((context.attempt, context.generation))
            return {}

        with caplog.at_level(logging.WARNING, logger=LOGGER):
            stats = await asyncio.wait_for(Worker(source, handler, concurrency=1).run_until_idle(), 60)
        info = await source.get_job(job_id)
    # Given back, then claimed again (a new generation) with the same first attempt.
    assert ran == [(1, 2)] and (info.status, info.generation) == (JobStatus.COMPLETED, 2)
    assert (stats.claimed, stats.released, stats.completed, stats.lease_losses) == (2, 1, 1, 0)
    assert any(getattr(record, "job_id", None) == job_id and "given back" in record.getMessage()
               for record in caplog.records)


# --- item 9: losses are logged and counted ----------------------------------------------------


class Recorder:
    """A metrics observer that writes down what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.empty_claims = 0

    def claim_started(self, want: int) -> object:
        return None

    def claim_ended(self, token: object, claimed: int | None) -> None:
        if claimed == 0:
            self.empty_claims += 1  # nothing to do: the worker goes idle without another round trip

    def call_failed(self, call: str) -> None:
        pass

    def job_claimed(self, claimed: Any, context: JobContext) -> Any:
        recorder = self

        class Job:
            def run_handler(self, start: Any) -> Any:
                return start()

            def handler_ended(self, outcome: str, error: BaseException | None) -> None:
                recorder.events.append(("handler_ended", (outcome, error)))

            def settle_started(self) -> None:
                pass

            def settled(self, result: str) -> None:
                recorder.events.append(("settled", result))

            def lease_lost(self) -> None:
                recorder.events.append(("lease_lost", None))

            def released(self) -> None:
                recorder.events.append(("released", None))

            def finished(self) -> None:
                pass

        return Job()

    def named(self, name: str) -> list[Any]:
        return [value for event, value in self.events if event == name]


async def test_an_operators_cancel_of_a_running_job_is_logged_as_a_lease_loss_naming_the_job(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with ValidationJobSource(db_url, config(db_url, lease_seconds=2, heartbeat_seconds=0.2)) as source:
        [job_id] = await submit(source, 1)
        cancelled = asyncio.Event()

        async def handler(claimed: Any, context: JobContext) -> None:
            assert await source.cancel(claimed.job_id)  # the next heartbeat round is refused
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        with caplog.at_level(logging.WARNING, logger=LOGGER):
            stats = await asyncio.wait_for(Worker(source, handler).run_until_idle(), 60)
    assert cancelled.is_set() and stats.lease_losses == 1
    [line] = lease_loss_lines(caplog.records, job_id)
    assert line.levelno == logging.WARNING and line.queue == "validation"  # type: ignore[attr-defined]
    message = line.getMessage()
    assert f"job {job_id} (validation queue, attempt 1) lease lost" in message and "heartbeat" in message


async def test_a_lease_deadline_passed_in_a_stall_is_logged_as_a_lease_loss_naming_the_job(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with ValidationJobSource(db_url, config(db_url, lease_seconds=1, heartbeat_seconds=0.25)) as source:
        [job_id] = await submit(source, 1, max_attempts=1)  # then failed, not run again

        async def stalled_heartbeats(fences: Any) -> list[bool]:
            await asyncio.sleep(60)
            return [True for _ in fences]

        source.heartbeat_many_owned = stalled_heartbeats  # type: ignore[method-assign]

        async def handler(claimed: Any, context: JobContext) -> None:
            await asyncio.sleep(60)

        with caplog.at_level(logging.WARNING, logger=LOGGER):
            stats = await asyncio.wait_for(Worker(source, handler).run_until_idle(), 60)
    assert stats.lease_losses == 1
    [line] = lease_loss_lines(caplog.records, job_id)
    assert "deadline" in line.getMessage()


async def test_a_write_the_database_refused_after_the_local_deadline_counts_as_a_stale_write(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler ended and its completion is on its way when the local deadline passes;
    the database then refuses it (an operator cancelled the job meanwhile). The answer is
    known: a stale write refused, not a lease loss, and the metrics observer agrees."""
    # The handler returns at once: its write is under way long before the 2 s deadline.
    async with ValidationJobSource(db_url, config(db_url, lease_seconds=2, heartbeat_seconds=0.25)) as source, \
            ValidationJobSource(db_url, config(db_url)) as operator:
        [job_id] = await submit(source, 1)
        contexts: list[JobContext] = []

        async def stalled_heartbeats(fences: Any) -> list[bool]:
            await asyncio.sleep(60)
            return [True for _ in fences]

        original = source.complete_many_owned

        async def completes_after_the_deadline(items: Any) -> list[bool]:
            await asyncio.wait_for(contexts[0].lease_lost.wait(), 60)  # the local deadline passed
            assert await operator.cancel(job_id)
            return await original(items)

        source.heartbeat_many_owned = stalled_heartbeats  # type: ignore[method-assign]
        source.complete_many_owned = completes_after_the_deadline  # type: ignore[method-assign]

        async def handler(claimed: Any, context: JobContext) -> dict[str, Any]:
            contexts.append(context)
            return {"done": True}

        recorder = Recorder()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            stats = await asyncio.wait_for(Worker(source, handler, metrics=recorder).run_until_idle(), 60)
        info = await source.get_job(job_id)
    assert (stats.completed, stats.stale_writes_refused, stats.lease_losses) == (0, 1, 0)
    assert recorder.named("settled") == ["stale_write_refused"] and recorder.named("lease_lost") == []
    assert info.status is JobStatus.CANCELLED
    assert any(getattr(record, "job_id", None) == job_id and "refused" in record.getMessage()
               for record in caplog.records)


# --- item 15: a handler's SystemExit, KeyboardInterrupt or own cancellation ---------------------


def raise_system_exit() -> None:
    sys.exit(3)


def raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def raise_generator_exit() -> None:
    raise GeneratorExit


def raise_cancelled() -> None:
    raise asyncio.CancelledError  # the handler's own, not the worker's cancellation


@pytest.mark.parametrize(("raises", "stored"), [
    (raise_system_exit, "SystemExit: 3"),
    (raise_keyboard_interrupt, "KeyboardInterrupt"),
    (raise_generator_exit, "GeneratorExit"),
    (raise_cancelled, "CancelledError"),
], ids=["SystemExit", "KeyboardInterrupt", "GeneratorExit", "CancelledError"])
async def test_a_handler_that_exits_or_interrupts_fails_its_attempt_and_the_worker_goes_on(
    db_url: str, raises: Any, stored: str
) -> None:
    async with ValidationJobSource(db_url, config(db_url)) as source:
        [bad] = await submit(source, 1, prefix="bad", max_attempts=2)
        good = await submit(source, 5, prefix="good", max_attempts=1)

        async def handler(claimed: Any, context: JobContext) -> dict[str, Any]:
            await asyncio.sleep(0)
            if claimed.job.data_source.startswith("bad"):
                raises()
            return {"ok": True}

        stats = await asyncio.wait_for(Worker(source, handler, concurrency=2).run_until_idle(), 60)
        rows = {job_id: await source.get_job(job_id) for job_id in [bad, *good]}
    assert (stats.completed, stats.retried, stats.failed) == (5, 1, 1)
    assert all(rows[job_id].status is JobStatus.COMPLETED for job_id in good)
    assert (rows[bad].status, rows[bad].error, rows[bad].attempt) == (JobStatus.FAILED, stored, 2)


async def test_the_workers_own_cancellation_still_stops_a_handler_and_run(db_url: str) -> None:
    async with ValidationJobSource(db_url, config(db_url)) as source:
        [job_id] = await submit(source, 1)
        began = asyncio.Event()

        async def handler(claimed: Any, context: JobContext) -> None:
            began.set()
            await asyncio.sleep(60)

        running = asyncio.create_task(Worker(source, handler).run())
        await asyncio.wait_for(began.wait(), 60)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        info = await source.get_job(job_id)
    assert (info.status, info.error) == (JobStatus.PENDING, None)  # given back, not failed


# --- item 16: what a failure logs is bounded and cleaned as what it stores ----------------------


SECRET = "card-4111-1111"


def formatted(record: logging.LogRecord) -> list[str]:
    """The record as the text and the JSON formats write it (with its traceback)."""
    return [logging.Formatter(TEXT_FORMAT).format(record), JsonFormatter().format(record)]


@pytest.mark.parametrize("store_error_text", [True, False], ids=["with_text", "type_only"])
async def test_a_handlers_huge_dirty_message_is_logged_cleaned_and_bounded_as_it_is_stored(
    db_url: str, store_error_text: bool, caplog: pytest.LogCaptureFixture
) -> None:
    huge = f"\x1b[31m{SECRET}\x00" + "x" * 10_000_000
    async with ValidationJobSource(db_url, config(db_url)) as source:
        [raised, decided] = await submit(source, 2, max_attempts=1)

        async def handler(claimed: Any, context: JobContext) -> None:
            if claimed.job_id == decided:
                raise FailJob(huge)
            try:
                {}["missing"]
            except KeyError as inner:
                raise ValueError(huge) from inner

        recorder = Recorder()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            await asyncio.wait_for(
                Worker(source, handler, store_error_text=store_error_text, metrics=recorder).run_until_idle(), 60)
        stored = {job_id: (await source.get_job(job_id)).error for job_id in (raised, decided)}
    for job_id in (raised, decided):
        [line] = [record for record in caplog.records if getattr(record, "job_id", None) == job_id]
        assert stored[job_id] in line.getMessage()  # the very text stored, no more
        for text in formatted(line):
            assert len(text) < 16_384 and "\x1b" not in text and "\x00" not in text
            assert (SECRET in text) is store_error_text
    if store_error_text:
        assert stored[raised].startswith("ValueError: \ufffd[31m" + SECRET + "\ufffdxxx") and stored[raised].endswith("\u2026")
    else:
        assert (stored[raised], stored[decided]) == ("ValueError", "FailJob")
    traceback_text = formatted([r for r in caplog.records if getattr(r, "job_id", None) == raised][0])[0]
    assert "in handler" in traceback_text and "KeyError" in traceback_text  # the frames and the chain stay
    for outcome, error in recorder.named("handler_ended"):
        assert outcome == "fail" and (SECRET in str(error)) is store_error_text and len(str(error)) < 4096


# --- item 19: a cut LISTEN connection --------------------------------------------------------


async def listening_backends(db_url: str) -> list[int]:
    import asyncpg

    connection = await asyncpg.connect(db_url)
    try:
        rows = await connection.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                      "AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()")
        return [row["pid"] for row in rows]
    finally:
        await connection.close()


async def terminate(db_url: str, pid: int) -> None:
    import asyncpg

    connection = await asyncpg.connect(db_url)
    try:
        assert await connection.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await connection.close()


@pytest.mark.parametrize("database", ["postgresql"])
async def test_an_idle_worker_whose_listen_connection_was_cut_reconnects_logs_it_and_hears_new_work(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The fallback poll is an hour: only a live listener can wake the worker in time.
    async with ValidationJobSource(db_url, config(db_url)) as source, \
            ValidationJobSource(db_url, config(db_url)) as submitter:
        handled = asyncio.Event()

        async def handler(claimed: Any, context: JobContext) -> dict[str, Any]:
            handled.set()
            return {}

        stop = asyncio.Event()
        recorder = Recorder()
        worker = Worker(source, handler, idle_wait_s=3600, metrics=recorder)
        with caplog.at_level(logging.INFO, logger=LOGGER):
            running = asyncio.create_task(worker.run(stop))
            await until(lambda: recorder.empty_claims, 60, what="the worker found nothing and waits")
            [first] = await until(lambda: listening_backends(db_url), 60, what="the worker listens")
            await terminate(db_url, first)
            again = await until(lambda: _other(listening_backends(db_url), first), 60,
                                what="the worker listens again on a new connection")
            assert again and worker.listening
            await submitter.submit_owned(ValidationJob("orders", "1", "after-cut.jsonl"), submission_id="after-cut")
            await asyncio.wait_for(handled.wait(), 60)
            stop.set()
            stats = await asyncio.wait_for(running, 60)
    assert stats.completed == 1
    lost = [record for record in caplog.records if "listener" in record.getMessage() and "lost" in record.getMessage()]
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING


async def _other(backends: Any, first: int) -> list[int]:
    return [pid for pid in await backends if pid != first]


@pytest.mark.parametrize("database", ["postgresql"])
async def test_work_submitted_while_the_listener_was_down_is_claimed_right_after_it_reconnects(
    db_url: str,
) -> None:
    async with ValidationJobSource(db_url, config(db_url)) as source, \
            ValidationJobSource(db_url, config(db_url)) as submitter:
        handled = asyncio.Event()

        async def handler(claimed: Any, context: JobContext) -> dict[str, Any]:
            handled.set()
            return {}

        store = source.operations.store
        original_listen = store.listen
        reopening = asyncio.Event()
        may_reopen = asyncio.Event()
        opened = 0

        async def gated_listen(binding: Any, wake: Any) -> Any:
            nonlocal opened
            opened += 1
            if opened > 1:  # the reconnect: held until a submission has gone unheard
                reopening.set()
                await may_reopen.wait()
            return await original_listen(binding, wake)

        store.listen = gated_listen  # type: ignore[method-assign]
        stop = asyncio.Event()
        recorder = Recorder()
        running = asyncio.create_task(Worker(source, handler, idle_wait_s=3600, metrics=recorder).run(stop))
        await until(lambda: recorder.empty_claims, 60, what="the worker found nothing and waits")
        [first] = await until(lambda: listening_backends(db_url), 60, what="the worker listens")
        await terminate(db_url, first)
        await asyncio.wait_for(reopening.wait(), 60)
        await submitter.submit_owned(ValidationJob("orders", "1", "unheard.jsonl"), submission_id="unheard")
        may_reopen.set()
        await asyncio.wait_for(handled.wait(), 60)
        stop.set()
        stats = await asyncio.wait_for(running, 60)
    assert stats.completed == 1


@pytest.mark.parametrize("database", ["postgresql"])
async def test_a_listener_whose_connection_went_silent_is_found_dead_and_wakes_its_worker(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition with no reset: nothing tells the client its connection is gone. The
    listener's periodic check finds it, ends the connection and wakes the worker."""
    from tenure.adapters.postgres import connections

    monkeypatch.setattr(connections, "LISTENER_CHECK_SECONDS", 0.2, raising=False)
    async with stalling_proxy(db_url) as (proxy, through):
        async with ValidationJobSource(through, config(through, timeout_seconds=5)) as source:
            woken = asyncio.Event()
            operations = source.operations
            listener = await operations.store.listen(operations.binding, woken.set)
            assert listener is not None and listener.alive
            try:
                await asyncio.sleep(0.5)
                assert listener.alive and not woken.is_set()  # checked and answered meanwhile
                proxy.freeze()
                await asyncio.wait_for(woken.wait(), 60)
                assert not listener.alive
            finally:
                proxy.thaw()
                await listener.close()
