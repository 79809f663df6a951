"""Shared setup for the Run ledger's tests: one migrated database per test module and
kind, and a small driver that brings one test's Runs to the state a test starts from.

Migrating a fresh PostgreSQL database costs most of a second, so the Run tests share one
per module: every test admits under its own admitting surface (``source``) and its own
idempotency keys (a test's key ``run-1`` is stored with the test's own prefix), so its
Run IDs (and the request IDs and attempt owners derived from them) are its own. Checks
that count rows count only that test's rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from adapter_support import AVAILABLE_DATABASES, _run_async, bind_server, create_pg_database, drop_pg_database, raw
from attempt_fakes import spec
from polling import until

from tenure.adapters import AttemptLedger, InMemoryBroker, RunLedger, RunWorker, Workflows, upgrade
from tenure.adapters.runs.ledger import run_id_for
from tenure.adapters.runs.recovery import RecoveryPorts
from tenure.model import (
    Admission,
    AgentJobStatus,
    ConsentStatus,
    ErrorCode,
    RunIntent,
    RunStatus,
    TenureError,
    WaitKind,
    WorkflowPin,
)

__all__ = ["PIN", "OTHER_PIN", "runs_db", "ledger", "runs", "raises", "on_ledgers", "Runs", "unique", "succeeded",
           "result_of", "status_of", "parked_and_ended", "WATCH_S", "admit", "worker", "serving", "ports", "broken"]

PIN = WorkflowPin("review", "rev-1", "sha256:" + "a" * 64)
OTHER_PIN = WorkflowPin("review", "rev-2", "sha256:" + "b" * 64)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module", params=AVAILABLE_DATABASES)
def runs_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated database of each kind, shared by one test module."""
    kind = request.param
    if kind == "sqlite":
        folder: pathlib.Path = tmp_path_factory.mktemp("runs")
        url = f"sqlite:///{folder}/runs.db"
    else:
        url = create_pg_database(bind_server(request))
    try:
        _run_async(upgrade(url))
        yield url
    finally:
        if kind == "postgresql":
            drop_pg_database(url)


def result_of(job_id: str, status: AgentJobStatus, **more: Any) -> dict[str, Any]:
    """A shape-valid job result (failed, timed_out and lost need an ``error``)."""
    return {"job_id": job_id, "status": status.value, **more}


def succeeded(job_id: str) -> dict[str, Any]:
    return result_of(job_id, AgentJobStatus.SUCCEEDED, output={"answer": 42})


class Runs:
    """One test's Runs on one ledger: every Run it admits comes from its own source."""

    def __init__(self, ledger: RunLedger, db_url: str) -> None:
        self.ledger = ledger
        self.db_url = db_url
        self.source = unique("api")
        self.keyspace = unique("keys")
        self.broker = InMemoryBroker()

    def intent(self, **changes: Any) -> RunIntent:
        fields: dict[str, Any] = dict(session_id=None, source=self.source, principal="alice",
                                      scopes=frozenset({"files:read", "mail:send"}),
                                      payload={"task": "summarise", "items": [1, 2, 3]}, requested_priority=None)
        fields.update(changes)
        return RunIntent(**fields)

    def key(self, key: str) -> str:
        """The idempotency key this test's ``key`` is stored as (its own, in a shared database)."""
        return f"{self.keyspace}:{key}"

    def run_id(self, key: str) -> str:
        return run_id_for(self.key(key))

    async def admit(self, key: str | None = "run-1", *, intent: RunIntent | None = None, queue: str = "agents",
                    priority: int = 50, workflow: WorkflowPin = PIN, **options: Any) -> Admission:
        return await self.ledger.admit(intent or self.intent(), workflow=workflow, queue=queue, priority=priority,
                                       idempotency_key=None if key is None else self.key(key), **options)

    async def published(self, key: str = "run-1", **options: Any) -> str:
        admission = await self.admit(key, **options)
        run_id = admission.run.run_id
        assert await self.ledger.publish(run_id, 0, self.broker)
        return run_id

    async def running(self, key: str = "run-1", *, node: str = "node-a", **options: Any) -> str:
        """A Run claimed at sequence 0 (admitted, published, claimed)."""
        run_id = await self.published(key, **options)
        assert await self.ledger.claim(run_id, 0, node=node) is not None
        return run_id

    async def consent(self, run_id: str, *, preauthorized: bool = False) -> str:
        made = await self.ledger.consents.create(
            run_id, tool_name="mail.send", tool_call_id=unique("call"), payload={"to": "bob"},
            preauthorized_by="policy-7" if preauthorized else None,
        )
        return made.consent_id

    async def job(self, run_id: str, request_id: str | None = None) -> str:
        made = await self.ledger.jobs.submit(run_id, request_id=request_id or unique("request"), runtime="sandbox",
                                            profile="small", request={"prompt": "count the files"})
        return made.job_id

    async def attempt(self, run_id: str) -> str:
        async with AttemptLedger(self.db_url) as attempts:
            return await attempts.prepare(spec(unique("owner"), run_id=run_id))

    async def waiting_on_consent(self, key: str = "run-1", *, decided: bool = False,
                                 **options: Any) -> tuple[str, str]:
        """A Run parked at sequence 0 on a consent (granted when ``decided``); ``options``
        go to its admission."""
        run_id = await self.running(key, **options)
        consent_id = await self.consent(run_id)
        assert await self.ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent_id)
        if decided:
            assert await self.ledger.consents.decide(consent_id, ConsentStatus.GRANTED, decided_by="bob")
        return run_id, consent_id

    def count(self, table: str, run_id: str) -> int:
        return int(raw(self.db_url, f"SELECT count(*) FROM {table} WHERE run_id = ?", (run_id,))[0][0])

    def runs_holding(self, key: str) -> int:
        """How many Runs hold this test's idempotency key ``key``."""
        return int(raw(self.db_url, "SELECT count(*) FROM tenure_runs WHERE idempotency_key = ?", (self.key(key),))[0][0])

    def runs_of_source(self) -> int:
        return int(raw(self.db_url, "SELECT count(*) FROM tenure_runs WHERE source = ?", (self.source,))[0][0])


# --- one test module's ledger (import the fixtures with runs_db) ----------------------------

@pytest.fixture
async def ledger(runs_db: str) -> AsyncIterator[RunLedger]:
    """A Run ledger on the module's database (:func:`runs_db`)."""
    async with RunLedger(runs_db) as made:
        yield made


@pytest.fixture
def runs(ledger: RunLedger, runs_db: str) -> Runs:
    """This test's Runs on that ledger."""
    return Runs(ledger, runs_db)


async def raises(code: ErrorCode, call: Awaitable[Any]) -> TenureError:
    """The TenureError ``call`` raises, checked to carry ``code``."""
    with pytest.raises(TenureError) as caught:
        await call
    assert caught.value.code is code, caught.value
    return caught.value


async def on_ledgers(db_url: str, count: int, call: Callable[[RunLedger, int], Awaitable[Any]]) -> list[Any]:
    """``call`` on ``count`` ledgers of their own (separate connections), all at once;
    a TenureError is returned as its code."""
    ledgers = [RunLedger(db_url) for _ in range(count)]

    async def one(ledger: RunLedger, number: int) -> Any:
        try:
            return await call(ledger, number)
        except TenureError as error:
            return error.code

    try:
        return list(await asyncio.gather(*(one(ledger, number) for number, ledger in enumerate(ledgers))))
    finally:
        for ledger in ledgers:
            await ledger.close()



async def status_of(ledger: RunLedger, run_id: str, *wanted: RunStatus, timeout_s: float = 20.0) -> Any:
    """The Run once it is in one of the ``wanted`` states (a hang guard, not a timing)."""
    async def check() -> Any:
        run = await ledger.get(run_id)
        return run if run is not None and run.status in wanted else None
    return await until(check, timeout_s, what="run status")


async def parked_and_ended(ledger: RunLedger, runner: Any, run_id: str, *wanted: RunStatus) -> Any:
    """The Run once it waits in one of the ``wanted`` states and ``runner``'s hop that
    parked it has ended. A parking hop resumes its Run itself when the owner was decided
    before the park (``_refire``): a test that decides the owner as soon as the status
    shows, while that hop is still running, races it, and either side may resume."""
    parked = await status_of(ledger, run_id, *wanted)
    await until(lambda: runner.running_hops == 0, what="the parking hop to end")
    return parked


# --- a Run worker serving one ledger (the liveness, timer and consent-deadline tests) -------

WATCH_S = 0.05


async def admit(ledger: RunLedger, pin: WorkflowPin) -> str:
    admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {"n": 1}), workflow=pin,
                                   queue="runs", priority=50)
    return admission.run.run_id


def worker(ledger: RunLedger, broker: Any, flows: Workflows) -> RunWorker:
    return RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=WATCH_S)


@contextlib.asynccontextmanager
async def serving(runner: RunWorker) -> AsyncIterator[RunWorker]:
    await runner.start()
    try:
        yield runner
    finally:
        await runner.stop(10)


def ports(ledger: RunLedger, broker: Any) -> RecoveryPorts:
    return RecoveryPorts(broker=broker, checkpoint_owner=ledger.checkpoints.owner,
                         delete_checkpoint=ledger.checkpoints.delete, checkpoint_outcome=ledger.checkpoints.outcome)


@contextlib.contextmanager
def broken(breakage: Callable[[pytest.MonkeyPatch], object], *, after: Callable[[], object] | None = None,
           ) -> Iterator[None]:
    """The block runs with ``breakage`` applied to a fresh MonkeyPatch, undone when it
    leaves; ``after`` (say, a statement cache's clear) runs then too, even on failure, so
    nothing built while broken outlives the break."""
    try:
        with pytest.MonkeyPatch.context() as patch:
            breakage(patch)
            yield
    finally:
        if after is not None:
            after()
