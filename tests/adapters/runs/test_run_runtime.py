"""The lifespan's broker order: connected in order, disconnected in reverse with every
broker attempted and the failures grouped; a failed connect disconnects the ones before."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tenure.adapters import BrokerProbe, RunLedger, RunRuntime
from tenure.model import BrokerJobState


@pytest.fixture
async def ledger(db_url: str) -> AsyncIterator[RunLedger]:
    async with RunLedger(db_url) as made:
        yield made


@dataclasses.dataclass
class Recording:
    """A broker whose connect and disconnect are recorded (and may fail)."""

    name: str
    log: list[str]
    fail_connect: bool = False
    fail_disconnect: bool = False

    async def publish(self, key: str, *, queue: str, wire_priority: int) -> None: ...

    async def probe(self, key: str) -> Any:
        return BrokerProbe(BrokerJobState.ABSENT)

    async def abort(self, key: str, *, terminal: bool = False) -> bool:
        return True

    async def connect(self) -> None:
        self.log.append(f"connect {self.name}")
        if self.fail_connect:
            raise ConnectionError("refused")

    async def disconnect(self) -> None:
        self.log.append(f"disconnect {self.name}")
        if self.fail_disconnect:
            raise ConnectionError("gone")


async def test_the_lifespan_disconnects_in_reverse_attempting_every_broker_and_groups_the_failures(
    ledger: RunLedger,
) -> None:
    log: list[str] = []
    brokers = [Recording("a", log, fail_disconnect=True), Recording("b", log), Recording("c", log, fail_disconnect=True)]
    with pytest.raises(ExceptionGroup) as caught:
        async with RunRuntime(ledger, brokers=brokers, workers=[], node="node-a"):
            log.append("running")
    assert log == ["connect a", "connect b", "connect c", "running", "disconnect c", "disconnect b", "disconnect a"]
    assert len(caught.value.exceptions) == 2
    # A broker that fails to connect: those connected before it are disconnected, in reverse.
    log.clear()
    brokers = [Recording("a", log), Recording("b", log), Recording("c", log, fail_connect=True)]
    with pytest.raises(ConnectionError):
        async with RunRuntime(ledger, brokers=brokers, workers=[], node="node-a"):
            raise AssertionError("must not start")
    assert log == ["connect a", "connect b", "connect c", "disconnect b", "disconnect a"]


async def test_recovery_visits_runs_at_once_only_with_a_broker_that_says_it_takes_concurrent_calls(
    ledger: RunLedger,
) -> None:
    from tenure.adapters import InMemoryBroker
    from tenure.adapters.runs.recovery import VISIT_CONCURRENCY

    one_caller = RunRuntime(ledger, brokers=[Recording("a", [])], workers=[], node="node-a")
    assert one_caller.ports.concurrency == 1
    shipped = RunRuntime(ledger, brokers=[InMemoryBroker()], workers=[], node="node-a")
    assert shipped.ports.concurrency == VISIT_CONCURRENCY
