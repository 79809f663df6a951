"""A process that dies at any await point of a Run operation leaves a state the kernel allows.

Every statement an operation sends is an await point (on SQLite the whole transaction
runs in one thread hop, and the statements inside it are where that hop can be cut
short), and so is every broker call. For each operation (admit with its session fence,
publish, a publish whose broker fails, claim, park, resume, settle, begin_cancel and
finish_cancel) a reference run counts its statements and records the state it leaves;
then, for each statement in turn and for each way of dying there, a fresh Run is brought
to the same starting state and the operation is cut short:

* ``fail``: the connection fails before the statement (SQLite: a disk I/O error);
* ``lost``: the statement runs and its answer never arrives (on COMMIT: the commit
  happened, its acknowledgement was lost);
* ``kill`` (PostgreSQL): the server ends the session just before the statement;
* ``cancel``: the calling task is cancelled just before the statement (SQLite: while its
  thread hop is at that statement) and, on PostgreSQL, ``cancel_after``: just after it.

At each broker call the process dies (``ProcessDied``, a BaseException nothing in the
library catches) or the task is cancelled, before and after the broker acted.

A fresh ledger then reads what is stored: the pair keeps every record invariant
(``record_violations``), at most one delivery is unsettled, consents and jobs keep
theirs, and the whole state equals either the state before the operation or the state
the reference run left, never anything between (a RUNNING Run with a PENDING delivery,
a resumed Run without its new delivery, a settled Run with a consent still pending).
The ledger that was cut short still answers afterwards, and repeating the operation on
a fresh ledger neither hangs nor leaves anything the kernel forbids.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from adapter_support import kind_of
from attempt_fakes import ProcessDied
from run_support import PIN, Runs, runs_db, succeeded, unique  # noqa: F401 (runs_db: fixture)
from tenure.adapters import InMemoryBroker, RecoveryPorts, RunLedger
from tenure.adapters.runs.broker import LIVE_STATES
from tenure.adapters.core.failures import REASONS
from tenure.adapters.agent_jobs.table import AGENT_JOBS_BINDING
from tenure.adapters.consents.table import CONSENTS_BINDING
from tenure.adapters.runs.table import DELIVERIES_BINDING, RUNS_BINDING
from tenure.kernel.agent_jobs.record import record_violations as job_violations
from tenure.kernel.consents.record import record_violations as consent_violations
from tenure.kernel.core import Condition, Finder, Param
from tenure.kernel.runs.record import RunPair, key_of, record_violations
from tenure.model import (
    TERMINAL_RUN_STATUSES,
    WAIT_STATUSES,
    ConsentStatus,
    DeliveryState,
    ErrorCode,
    RunStatus,
    TenureError,
    WaitKind,
    parse_hop_key,
)

SQLITE_MODES = ["fail", "lost", "cancel"]
POSTGRESQL_MODES = ["fail", "lost", "kill", "cancel", "cancel_after"]
BROKER_MODES = ["die", "cancel"]


# --- statement-level crashes ------------------------------------------------------------------


class Crash:
    """Counts the statements sent while armed and strikes once, at the ``at``-th."""

    def __init__(self) -> None:
        self.armed = False
        self.at: int | None = None
        self.mode = ""
        self.count = 0
        self.fired: str | None = None
        self.sent: list[str] = []
        """The first words of every statement counted since armed."""
        self.task: asyncio.Task[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.abandoned: Any = None

    def arm(self, at: int | None, mode: str = "") -> None:
        self.armed, self.at, self.mode, self.count, self.fired = True, at, mode, 0, None
        self.sent = []

    def disarm(self) -> None:
        self.armed = False

    def take(self, sql: str) -> str | None:
        if not self.armed:
            return None
        self.count += 1
        self.sent.append(" ".join(sql.split()[:3]))
        if self.count != self.at:
            return None
        self.armed = False
        self.fired = " ".join(sql.split()[:3])
        return self.mode


def _install_sqlite(crash: Crash, monkeypatch: pytest.MonkeyPatch) -> None:
    from tenure.adapters.sqlite import store as sqlite_store

    original_statement = sqlite_store._statement
    original_whole = sqlite_store.SqliteStore._whole

    def statement(connection: Any, sql: str, parameters: Any) -> Any:
        mode = crash.take(sql)
        if mode == "fail":
            raise sqlite3.OperationalError("disk I/O error (injected)")
        if mode == "cancel":
            # Cancel the caller while its thread hop stands at this statement, and wait
            # until the store has seen the cancellation (as a real one would arrive).
            assert crash.loop is not None and crash.task is not None
            crash.loop.call_soon_threadsafe(crash.task.cancel)
            assert crash.abandoned.wait(5), "the cancellation never reached the store"
        result = original_statement(connection, sql, parameters)
        if mode == "lost":
            raise sqlite3.OperationalError("connection reset before the answer (injected)")
        return result

    def whole(self: Any, body: Any, write: bool, abandoned: Any) -> Any:
        crash.abandoned = abandoned
        return original_whole(self, body, write, abandoned)

    monkeypatch.setattr(sqlite_store, "_statement", statement)
    monkeypatch.setattr(sqlite_store.SqliteStore, "_whole", whole)


def _install_postgresql(crash: Crash, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncpg

    originals = {name: getattr(asyncpg.Connection, name) for name in ("fetch", "fetchmany", "execute")}
    original_fetch = originals["fetch"]

    async def cancelled() -> None:
        assert crash.task is not None
        crash.task.cancel()
        await asyncio.Event().wait()  # the cancellation arrives here

    def patched(name: str) -> Callable[..., Awaitable[Any]]:
        original = originals[name]

        async def call(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
            mode = crash.take(query)
            if mode == "fail":
                raise asyncpg.exceptions.ConnectionDoesNotExistError("connection lost (injected)")
            if mode == "kill":
                with contextlib.suppress(Exception):
                    await original_fetch(self, "SELECT pg_terminate_backend(pg_backend_pid())")
            if mode == "cancel":
                await cancelled()
            result = await original(self, query, *args, **kwargs)
            if mode == "lost":
                raise asyncpg.exceptions.ConnectionDoesNotExistError("answer lost (injected)")
            if mode == "cancel_after":
                await cancelled()
            return result

        return call

    for name in originals:
        monkeypatch.setattr(asyncpg.Connection, name, patched(name))


@pytest.fixture
def crash(runs_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Crash]:
    made = Crash()
    if kind_of(runs_db) == "sqlite":
        _install_sqlite(made, monkeypatch)
    else:
        _install_postgresql(made, monkeypatch)
    yield made
    made.disarm()


# --- broker-level crashes ----------------------------------------------------------------------


class DyingBroker(InMemoryBroker):
    """An in-memory broker at whose ``point`` (``publish``/``published``: before/after
    storing the job; ``probe``, ``abort``, ``probe_again``) the process dies or the
    calling task is cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.point: str | None = None
        self.mode = ""
        self.fired = False
        self.task: asyncio.Task[Any] | None = None
        self._probes = 0

    async def _strike(self, point: str) -> None:
        if point != self.point or self.fired:
            return
        self.fired = True
        if self.mode == "die":
            raise ProcessDied(point)
        assert self.task is not None
        self.task.cancel()
        await asyncio.Event().wait()

    async def publish(self, key: str, *, queue: str, wire_priority: int) -> None:
        await self._strike("publish")
        await super().publish(key, queue=queue, wire_priority=wire_priority)
        await self._strike("published")

    async def probe(self, key: str) -> Any:
        self._probes += 1
        await self._strike("probe" if self._probes == 1 else "probe_again")
        return await super().probe(key)

    async def abort(self, key: str, *, terminal: bool = False) -> bool:
        await self._strike("abort")
        return await super().abort(key, terminal=terminal)


# --- the operations ----------------------------------------------------------------------------


@dataclasses.dataclass
class Scenario:
    """One Run brought to an operation's starting state."""

    runs: Runs
    run_id: str
    broker: DyingBroker
    owner_id: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Operation:
    name: str
    setup: Callable[[Runs, DyingBroker], Awaitable[Scenario]]
    call: Callable[[RunLedger, Scenario], Awaitable[Any]]
    broker_points: tuple[str, ...] = ()


async def _admit_setup(runs: Runs, broker: DyingBroker) -> Scenario:
    return Scenario(runs, runs.run_id("run-1"), broker, extra={"session": unique("session")})


async def _admit_call(ledger: RunLedger, scenario: Scenario) -> Any:
    intent = scenario.runs.intent(session_id=scenario.extra["session"])
    return await ledger.admit(intent, workflow=PIN, queue="agents", priority=50, idempotency_key=scenario.runs.key("run-1"),
                              session_fence=True)


async def _admitted(runs: Runs, broker: DyingBroker) -> Scenario:
    return Scenario(runs, (await runs.admit("run-1")).run.run_id, broker)


async def _failing_broker(runs: Runs, broker: DyingBroker) -> Scenario:
    scenario = await _admitted(runs, broker)
    broker.fail_publishes = 1
    return scenario


async def _publish_failing_call(ledger: RunLedger, scenario: Scenario) -> Any:
    """A publish the broker refuses: the error is recorded, then RUN_BROKER_FAILED."""
    try:
        return await ledger.publish(scenario.run_id, 0, scenario.broker)
    except TenureError as error:
        if error.code is not ErrorCode.RUN_BROKER_FAILED:
            raise
        assert error.__context__ is None and error.__cause__ is None
        return error


async def _published(runs: Runs, broker: DyingBroker) -> Scenario:
    scenario = await _admitted(runs, broker)
    assert await runs.ledger.publish(scenario.run_id, 0, broker)
    return scenario


async def _running_with_consent(runs: Runs, broker: DyingBroker) -> Scenario:
    scenario = await _published(runs, broker)
    assert await runs.ledger.claim(scenario.run_id, 0, node="node-a") is not None
    scenario.owner_id = await runs.consent(scenario.run_id)
    return scenario


async def _parked_on_granted(runs: Runs, broker: DyingBroker) -> Scenario:
    scenario = await _running_with_consent(runs, broker)
    assert await runs.ledger.park(scenario.run_id, 0, kind=WaitKind.CONSENT, owner_id=scenario.owner_id)  # type: ignore[arg-type]
    assert await runs.ledger.consents.decide(scenario.owner_id, ConsentStatus.GRANTED, decided_by="bob")  # type: ignore[arg-type]
    return scenario


async def _settle_ready(runs: Runs, broker: DyingBroker) -> Scenario:
    """RUNNING with a pending consent (swept by the settlement) and a finished job."""
    scenario = await _running_with_consent(runs, broker)
    job_id = await runs.job(scenario.run_id)
    assert await runs.ledger.jobs.adopt_result(job_id, succeeded(job_id))
    return scenario


async def _cancelling(runs: Runs, broker: DyingBroker) -> Scenario:
    """CANCELLING with its hop active at the broker and a pending consent."""
    scenario = await _running_with_consent(runs, broker)
    assert broker.take("agents") is not None
    assert await runs.ledger.begin_cancel(scenario.run_id) is not None
    return scenario


OPERATIONS = {
    operation.name: operation
    for operation in (
        Operation("admit", _admit_setup, _admit_call),
        Operation("publish", _admitted, lambda ledger, s: ledger.publish(s.run_id, 0, s.broker),
                  ("publish", "published")),
        Operation("publish_error", _failing_broker, _publish_failing_call),
        Operation("claim", _published, lambda ledger, s: ledger.claim(s.run_id, 0, node="node-b")),
        Operation("park", _running_with_consent,
                  lambda ledger, s: ledger.park(s.run_id, 0, kind=WaitKind.CONSENT, owner_id=s.owner_id)),
        Operation("resume", _parked_on_granted, lambda ledger, s: ledger.resume(s.run_id, owner_id=s.owner_id)),
        Operation("settle", _settle_ready, lambda ledger, s: ledger.settle(s.run_id, 0, RunStatus.DONE)),
        Operation("begin_cancel", _running_with_consent, lambda ledger, s: ledger.begin_cancel(s.run_id)),
        Operation("finish_cancel", _cancelling, lambda ledger, s: ledger.finish_cancel(s.run_id, 0, s.broker),
                  ("probe", "abort", "probe_again")),
    )
}


# --- reading what is stored --------------------------------------------------------------------


def _of_run(name: str) -> Finder:
    return Finder(name, ((Condition("run_id", "=", Param("run_id")),),), order=(), lock="none")


DELIVERIES_OF_RUN = Finder("deliveries_of_run", ((Condition("run_id", "=", Param("run_id")),),),
                           order=("enqueue_seq",), lock="none")
CONSENTS_OF_RUN = _of_run("consents_of_run")
JOBS_OF_RUN = _of_run("jobs_of_run")


async def stored_state(checker: RunLedger, scenario: Scenario) -> Any:
    """What is stored for the scenario's Run, checked against the kernel's invariants and
    normalized (identities and instants are the scenario's own; only their presence and
    everything else is compared)."""
    run_id = scenario.run_id

    async def body(tx: Any) -> Any:
        runs = await tx.read(RUNS_BINDING, [run_id])
        deliveries = await tx.find(DELIVERIES_BINDING, DELIVERIES_OF_RUN, {"run_id": run_id})
        consents = await tx.find(CONSENTS_BINDING, CONSENTS_OF_RUN, {"run_id": run_id})
        jobs = await tx.find(AGENT_JOBS_BINDING, JOBS_OF_RUN, {"run_id": run_id})
        return runs, deliveries, consents, jobs

    runs, deliveries, consents, jobs = await checker.store.run(body, write=False)
    for consent in consents:
        assert consent_violations(consent) == [], consent
    for job in jobs:
        assert job_violations(job) == [], job
    names = {run_id: "RUN", scenario.runs.source: "SOURCE", scenario.runs.key("run-1"): "KEY"}
    if scenario.owner_id is not None:
        names[scenario.owner_id] = "OWNER"
    names.update({value: name.upper() for name, value in scenario.extra.items()})
    consent_part = sorted((c.status.value, c.decided_by, c.decided_at_us is not None) for c in consents)
    job_part = sorted((j.status.value, j.result_json is not None) for j in jobs)
    if not runs:
        assert deliveries == [], "a delivery exists only with its Run"
        return None, (), tuple(consent_part), tuple(job_part)
    (run,) = runs
    current = [d for d in deliveries if d.enqueue_seq == run.enqueue_seq]
    assert len(current) == 1, "the Run's current delivery exists"
    assert record_violations(RunPair(run, (current[0],))) == [], (run, current[0])
    assert [d.state for d in deliveries].count(DeliveryState.SETTLED) >= len(deliveries) - 1
    assert all(d.enqueue_seq <= run.enqueue_seq for d in deliveries)
    assert all(d.state is DeliveryState.SETTLED for d in deliveries if d.enqueue_seq < run.enqueue_seq)
    assert [d.delivery_id for d in deliveries] == [key_of(run_id, d.enqueue_seq) for d in deliveries]
    return (
        _normal(run, names, skip=("intent_digest",)),
        tuple(_normal(delivery, names) for delivery in deliveries),
        tuple(consent_part),
        tuple(job_part),
    )


def _normal(row: Any, names: dict[str, str], skip: tuple[str, ...] = ()) -> tuple[tuple[str, Any], ...]:
    fields = []
    for field in dataclasses.fields(row):
        if field.name in skip:
            continue
        value = getattr(row, field.name)
        if field.name.endswith("_us"):
            value = value is not None
        elif isinstance(value, str):
            for name, token in names.items():
                value = value.replace(name, token)
        fields.append((field.name, value))
    return tuple(fields)


# --- the test ------------------------------------------------------------------------------------


async def _cut_short(call: Callable[[], Awaitable[Any]], crash: Crash, broker: DyingBroker) -> BaseException | None:
    task = asyncio.ensure_future(call())
    crash.task, crash.loop = task, asyncio.get_running_loop()
    broker.task = task
    try:
        await task
    except (Exception, asyncio.CancelledError, ProcessDied) as error:
        return error
    return None


def _assert_dies_as_documented(error: BaseException | None, mode: str, fired_at: str) -> None:
    if mode in ("cancel", "cancel_after"):
        assert isinstance(error, asyncio.CancelledError), (fired_at, error)
        return
    assert isinstance(error, TenureError), (fired_at, error)
    assert error.code is ErrorCode.RUN_PERSISTENCE_FAILED and error.reason in REASONS, (fired_at, error)
    chained: BaseException | None = error
    while chained is not None:  # nothing but tenure's own errors rides along
        assert isinstance(chained, TenureError) and "injected" not in repr(chained), (fired_at, chained)
        chained = chained.__cause__ or chained.__context__


@dataclasses.dataclass
class Ledgers:
    """The ledgers that outlive the crashes of one test: one sets Runs up, one reads
    what is stored, one repeats the operation afterwards (the dying one is new each time)."""

    db_url: str
    setup: RunLedger
    checker: RunLedger
    again: RunLedger


async def _reference(ledgers: Ledgers, operation: Operation, crash: Crash) -> tuple[Any, Any, int]:
    """The state before and after an uninterrupted run, and how many statements it sent
    (their first words stay in ``crash.sent``)."""
    scenario = await operation.setup(Runs(ledgers.setup, ledgers.db_url), DyingBroker())
    before = await stored_state(ledgers.checker, scenario)
    async with RunLedger(ledgers.db_url) as ledger:
        await ledger.get(scenario.run_id)  # the first connection's catalog read is not the operation's
        crash.arm(None)
        await operation.call(ledger, scenario)
        crash.disarm()
    after = await stored_state(ledgers.checker, scenario)
    assert before != after, "the operation changes something"
    return before, after, crash.count


async def _crash(ledgers: Ledgers, operation: Operation, crash: Crash, expected: tuple[Any, Any],
                 *, at: int | None = None, mode: str = "", broker_point: str | None = None,
                 ) -> tuple[Scenario, str, RunLedger]:
    """One crash of one operation at one point: the scenario, the point it struck and
    the ledger that was cut short (still open)."""
    before_expected, _ = expected
    broker = DyingBroker()
    scenario = await operation.setup(Runs(ledgers.setup, ledgers.db_url), broker)
    assert await stored_state(ledgers.checker, scenario) == before_expected
    dying = RunLedger(ledgers.db_url)
    await dying.get(scenario.run_id)
    if broker_point is not None:
        broker.point, broker.mode = broker_point, mode
    else:
        crash.arm(at, mode)
    error = await _cut_short(lambda: operation.call(dying, scenario), crash, broker)
    crash.disarm()
    broker.point = None
    if broker_point is not None:
        struck = f"broker.{broker_point}"
        assert broker.fired, struck
        expected_error = asyncio.CancelledError if mode == "cancel" else ProcessDied
        assert isinstance(error, expected_error), (struck, error)
    else:
        assert crash.fired is not None, f"statement {at} was never sent"
        struck = crash.fired
        _assert_dies_as_documented(error, mode, struck)
    return scenario, struck, dying


BELOW_THE_CALL_BOUND_S = 20
"""The hang guard on a call after the crash: far above what one call takes, even on a loaded
machine, and below the ledger's own 30 s call bound (``RunLedger``'s default), so that a call
stuck on a lock the dead call held fails here instead of ending in a timeout the repeat's
check forgives."""


async def _crash_once(ledgers: Ledgers, operation: Operation, crash: Crash, expected: tuple[Any, Any],
                      *, at: int | None = None, mode: str = "", broker_point: str | None = None) -> str:
    """One crash of one operation at one point, then the checks and a repeat; returns
    which statement it struck."""
    before_expected, after_expected = expected
    scenario, struck, dying = await _crash(ledgers, operation, crash, expected, at=at, mode=mode,
                                           broker_point=broker_point)
    if mode.startswith("cancel"):
        # A cancelled call leaves its ledger fit for the next one.
        await asyncio.wait_for(dying.get(scenario.run_id), BELOW_THE_CALL_BOUND_S)
    with contextlib.suppress(Exception):
        await dying.close()
    state = await stored_state(ledgers.checker, scenario)
    assert state in (before_expected, after_expected), (operation.name, mode, at, struck, state)
    # Repeating the operation afterwards neither waits on a lock the dead call held nor
    # leaves a state the kernel forbids, and it ends where the uninterrupted run ended.
    with contextlib.suppress(TenureError):
        await asyncio.wait_for(operation.call(ledgers.again, scenario), BELOW_THE_CALL_BOUND_S)
    repeated = await stored_state(ledgers.checker, scenario)
    assert repeated[0] is not None and after_expected[0] is not None
    assert dict(repeated[0])["status"] == dict(after_expected[0])["status"], (operation.name, mode, at, struck)
    return struck


@pytest.mark.parametrize("name", sorted(OPERATIONS))
async def test_a_crash_at_any_await_point_leaves_the_state_before_or_after_never_between(
    runs_db: str, crash: Crash, name: str
) -> None:
    operation = OPERATIONS[name]
    async with RunLedger(runs_db) as setup, RunLedger(runs_db) as checker, RunLedger(runs_db) as again:
        ledgers = Ledgers(runs_db, setup, checker, again)
        before, after, statements = await _reference(ledgers, operation, crash)
        # A transaction (BEGIN, a statement, COMMIT) commits at its COMMIT; a command decided
        # ahead (PostgreSQL: claim, publish, begin_cancel, ...) at its last statement, which
        # writes alone (autocommit).
        sent = list(crash.sent)
        in_transaction = any(point.upper().startswith("BEGIN") for point in sent)
        assert statements >= (3 if in_transaction else 1), sent
        committing = "COMMIT" if in_transaction else sent[-1]
        modes = SQLITE_MODES if kind_of(runs_db) == "sqlite" else POSTGRESQL_MODES
        struck = []
        for at in range(1, statements + 1):
            for mode in modes:
                struck.append(await _crash_once(ledgers, operation, crash, (before, after), at=at, mode=mode))
        for point in operation.broker_points:
            for mode in BROKER_MODES:
                struck.append(await _crash_once(ledgers, operation, crash, (before, after), mode=mode,
                                                broker_point=point))
    assert len(struck) == statements * len(modes) + len(operation.broker_points) * len(BROKER_MODES)
    assert any(point.upper().startswith(committing.upper()) for point in struck), "the commit is among the crash points"


# --- and then a new process reconciles ----------------------------------------------------------


class RoutingBroker(InMemoryBroker):
    """One broker port over every scenario's broker, chosen by the hop key's Run ID (a
    Run of another test of the module gets a broker of its own)."""

    def __init__(self, brokers: dict[str, InMemoryBroker]) -> None:
        super().__init__()
        self.brokers = brokers

    def _of(self, key: str) -> InMemoryBroker:
        run_id = key.split(":")[1]
        return self.brokers.setdefault(run_id, InMemoryBroker())

    async def publish(self, key: str, *, queue: str, wire_priority: int) -> None:
        await self._of(key).publish(key, queue=queue, wire_priority=wire_priority)

    async def probe(self, key: str) -> Any:
        return await self._of(key).probe(key)

    async def abort(self, key: str, *, terminal: bool = False) -> bool:
        return await self._of(key).abort(key, terminal=terminal)


RECOVERED_OUTCOMES: dict[str, int] = {}
"""Crash points recovered by reconciliation, per outcome (read by the issue's note)."""


@pytest.mark.parametrize("name", sorted(OPERATIONS))
async def test_after_a_crash_at_any_await_point_reconciliation_recovers_every_run(
    runs_db: str, crash: Crash, name: str
) -> None:
    """Every crash point of every operation, then a new process per node reconciles with
    a new cutoff: each Run ends terminal with its effects contained, parked on its owner,
    or queued with a live delivery at the broker, or the report names it; never two live
    hops of one Run, never a Run lost."""
    operation = OPERATIONS[name]
    crashed: list[Scenario] = []
    async with RunLedger(runs_db) as setup, RunLedger(runs_db) as checker, RunLedger(runs_db) as again:
        ledgers = Ledgers(runs_db, setup, checker, again)
        expected = await _reference(ledgers, operation, crash)
        before, after, statements = expected
        modes = SQLITE_MODES if kind_of(runs_db) == "sqlite" else POSTGRESQL_MODES
        points = [{"at": at, "mode": mode} for at in range(1, statements + 1) for mode in modes]
        points += [{"broker_point": point, "mode": mode} for point in operation.broker_points for mode in BROKER_MODES]
        for point in points:
            scenario, _, dying = await _crash(ledgers, operation, crash, (before, after), **point)
            with contextlib.suppress(Exception):
                await dying.close()
            crashed.append(scenario)
        brokers: dict[str, InMemoryBroker] = {s.run_id: s.broker for s in crashed}
        await asyncio.sleep(0.002)
        cutoff = dt.datetime.now(dt.timezone.utc)
        ports = RecoveryPorts(RoutingBroker(brokers))
        issues: set[str] = set()
        for node in ("node-a", "node-b"):  # the claims of the setups and of the claim operation
            async with RunLedger(runs_db) as recovering:
                report = await recovering.reconcile(ports, node=node, boot_cutoff=cutoff)
            issues |= {issue.run_id for issue in report.issues}
        for scenario in crashed:
            outcome = await _recovered(checker, scenario, issues)
            RECOVERED_OUTCOMES[outcome] = RECOVERED_OUTCOMES.get(outcome, 0) + 1
    assert len(crashed) == len(points)


async def _recovered(checker: RunLedger, scenario: Scenario, issues: set[str]) -> str:
    """How one crashed Run ended after reconciliation (asserting it ended acceptably)."""
    run = await checker.get(scenario.run_id)
    jobs = scenario.broker.jobs
    if run is None:
        assert jobs == {}, "an admission that never committed published nothing"
        return "never_admitted"
    # Never two hops executing one Run: a broker job of an older sequence still live at
    # the broker is a stale delivery whose claim the ledger refuses.
    for key, job in jobs.items():
        _, seq = parse_hop_key(key)
        if job.state in LIVE_STATES and seq != run.enqueue_seq:
            assert await checker.claim(run.run_id, seq, node="late-worker") is None, key
    if run.run_id in issues:
        assert run.status not in TERMINAL_RUN_STATUSES, "a reported Run is left as it was"
        return "reported"
    if run.status in TERMINAL_RUN_STATUSES:
        assert await checker.jobs.list(run.run_id) == (), "terminal only with its jobs contained"
        return "terminal"
    if run.status in WAIT_STATUSES:
        assert run.owner_id is not None
        return "parked"
    assert run.status is RunStatus.QUEUED, run.status
    delivery = await checker.get_delivery(run.run_id, run.enqueue_seq)
    assert delivery is not None and delivery.state is DeliveryState.PUBLISHED
    assert jobs[key_of(run.run_id, run.enqueue_seq)].state in LIVE_STATES
    return "queued_live"
