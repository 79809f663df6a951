"""OutageLog: one line per state change of a failing dependency (down, changed, still
down, back), never one per failed call; and a Worker whose database fails claim after
claim logs the outage once and its end once."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tenure.adapters import ValidationJobSource, Worker
from tenure.adapters.core.outages import OutageLog
from tenure.model import ErrorCode, TenureError, WorkerConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str | None]]:
    return [(record.levelname, getattr(record, "outage", None)) for record in caplog.records]


def test_a_run_of_identical_failures_is_one_line_then_a_still_down_line_per_interval_then_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    outage = OutageLog(logging.getLogger("test.outage"), "the database", fields={"worker_id": "w1"},
                       still_every_s=60, clock=clock)
    outage.answered()  # up and answering: nothing to say
    with caplog.at_level("INFO", logger="test.outage"):
        for _ in range(32):  # 32 failures in 12 s: the issue's report
            outage.failed("claim", "persistence", "connection_refused")
            clock.now += 12 / 32
        assert lines(caplog) == [("WARNING", "down")]
        clock.now += 60
        outage.failed("heartbeat", "persistence", "connection_refused")
        outage.failed("claim", "persistence", "connection_refused")
        assert lines(caplog) == [("WARNING", "down"), ("WARNING", "still_down")]
        outage.failed("claim", "persistence", "timeout")  # another reason is a change of state
        outage.failed("claim", "persistence", "timeout")
        assert lines(caplog)[-1] == ("WARNING", "changed") and len(caplog.records) == 3
        for _ in range(10):  # calls alternating between two known failures change nothing
            outage.failed("claim", "persistence", "connection_refused")
            outage.failed("heartbeat", "persistence", "timeout")
        assert len(caplog.records) == 3
        clock.now += 1
        outage.answered()
        outage.answered()
    assert lines(caplog) == [("WARNING", "down"), ("WARNING", "still_down"), ("WARNING", "changed"), ("INFO", "back")]
    back = caplog.records[-1]
    assert (back.failures, back.worker_id, back.down_s) == (56, "w1", 73.0)  # type: ignore[attr-defined]
    assert back.getMessage() == "the database: answers again after 73.0 s (56 failed calls)"
    assert not outage.down
    with caplog.at_level("INFO", logger="test.outage"):
        outage.failed("claim", "persistence", "connection_refused")  # a new outage is said again
    assert lines(caplog)[-1] == ("WARNING", "down")


async def test_a_worker_whose_database_fails_every_claim_logs_the_outage_once_and_its_end_once(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with ValidationJobSource(db_url, WorkerConfig(db_url)) as source:
        real = source.claim_next_owned
        calls = 0

        async def failing_then_answering(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls <= 40:
                raise TenureError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "connection_refused")
            return await real(*args, **kwargs)

        monkeypatch.setattr(source, "claim_next_owned", failing_then_answering)

        async def handler(claimed: Any, context: Any) -> dict[str, Any]:
            return {}

        worker = Worker(source, handler, idle_wait_s=0.001)
        with caplog.at_level("INFO", logger="tenure.adapters.queue.worker"):
            stats = await worker.run_until_idle()
    assert stats.persistence_failures == 40  # every failure is counted ...
    outage = [(r.levelname, r.outage) for r in caplog.records if hasattr(r, "outage")]  # type: ignore[attr-defined]
    assert outage == [("WARNING", "down"), ("INFO", "back")]  # ... and said twice


async def test_an_idle_worker_whose_database_is_down_never_says_it_answers_again(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    async with ValidationJobSource(db_url, WorkerConfig(db_url, lease_seconds=1, heartbeat_seconds=0.05)) as source:
        failed = asyncio.Event()
        calls = 0

        async def always_failing(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls >= 20:
                failed.set()
            raise TenureError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "connection_refused")

        monkeypatch.setattr(source, "claim_next_owned", always_failing)

        async def handler(claimed: Any, context: Any) -> dict[str, Any]:
            return {}

        worker = Worker(source, handler, idle_wait_s=0.01)
        stop = asyncio.Event()
        with caplog.at_level("INFO", logger="tenure.adapters.queue.worker"):
            running = asyncio.create_task(worker.run(stop))
            await asyncio.wait_for(failed.wait(), 60)  # a hang guard: heartbeats ran meanwhile (every 50 ms)
            await asyncio.sleep(0.3)
            stop.set()
            await asyncio.wait_for(running, 60)
    outage = [r.outage for r in caplog.records if hasattr(r, "outage")]  # type: ignore[attr-defined]
    assert outage == ["down"]  # idle heartbeat rounds asked nothing, so they proved nothing


async def test_relay_rounds_that_fail_then_degrade_then_clean_up_say_each_change_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    from tenure.adapters.runs import recovery
    from tenure.adapters.runs.recovery import RecoveryIssue, RecoveryReport, run_relays

    monkeypatch.setattr(recovery, "relay_backoff_s", lambda failures: 0.0)
    clean = RecoveryReport(degraded=False, counts={}, issues=())
    dirty = RecoveryReport(degraded=True, counts={}, issues=(RecoveryIssue("r-1", "containment_unproven"),))
    script = [RuntimeError()] * 20 + [dirty] * 20 + [clean] * 3
    stop = asyncio.Event()

    class Ledger:
        async def relay(self, ports: Any, *, cursor: str | None = None, page_size: int = 32) -> RecoveryReport:
            step = script.pop(0)
            if not script:
                stop.set()
            if isinstance(step, Exception):
                raise step
            return step

    with caplog.at_level("INFO", logger="tenure.adapters.runs.recovery"):
        await asyncio.wait_for(run_relays(Ledger(), None, node="n1", stop=stop, interval_s=0), 30)  # type: ignore[arg-type]
    said = [(r.levelname, r.outage, r.getMessage()) for r in caplog.records]  # type: ignore[attr-defined]
    assert said == [
        ("WARNING", "down", "relay rounds on node n1: a relay round failed (RuntimeError: raised); "
                            "further failures are summarized"),
        ("INFO", "back", said[1][2]),
        ("WARNING", "down", "relay rounds on node n1: a relay round failed (degraded: containment_unproven); "
                            "further failures are summarized"),
        ("INFO", "back", said[3][2]),
    ]
    assert "answers again" in said[1][2] and "clean again" in said[3][2]
