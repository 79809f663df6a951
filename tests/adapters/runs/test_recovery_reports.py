"""The latest recovery report of each node (``tenure_run_recovery_reports``, step
``runs_v6``): the Run runtime records its startup reconciliation, every relay round and
the reconciliation of a node it took over (under that node's name); a row keeps counts
and reasons, never a Run ID; a failure to record never stops recovery and is logged
once. On every database."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from adapter_support import raw
from polling import until

from tenure.adapters import InMemoryBroker, RunLedger, RunRuntime
from tenure.adapters.runs.recovery import COUNT_NAMES, RecoveryIssue, RecoveryReport
from tenure.adapters.runs.reports import stored_counts
from tenure.model import ConfigValidationError


@pytest.fixture
async def ledger(db_url: str) -> AsyncIterator[RunLedger]:
    async with RunLedger(db_url) as made:
        yield made


async def test_the_runtime_records_its_startup_report_then_each_relay_rounds(ledger: RunLedger) -> None:
    assert await ledger.recovery_reports.latest() == []
    broker = InMemoryBroker()
    async with RunRuntime(ledger, brokers=[broker], workers=[], node="node-a", relay_interval_s=0.1,
                          node_lease_s=2) as runtime:
        assert runtime.startup is not None and not runtime.startup.degraded
        (first,) = await ledger.recovery_reports.latest()
        assert first.node == "node-a" and first.pass_kind in ("startup", "relay")
        assert (first.degraded, first.issue_count, stored_counts(first.issue_reasons_json)) == (False, 0, {})
        assert set(stored_counts(first.counts_json)) == set(COUNT_NAMES)

        async def a_later_relay_round() -> bool:
            (row,) = await ledger.recovery_reports.latest()
            return row.pass_kind == "relay" and row.finished_at_us > first.finished_at_us

        await until(a_later_relay_round, what="a relay round's report")


async def test_a_report_keeps_counts_and_reasons_and_replaces_the_nodes_last(ledger: RunLedger, db_url: str) -> None:
    reports = ledger.recovery_reports
    degraded = RecoveryReport(True, {**dict.fromkeys(COUNT_NAMES, 0), "published": 2},
                              (RecoveryIssue("run-secret-1", "queue_unknown"),
                               RecoveryIssue("run-secret-2", "queue_unknown"),
                               RecoveryIssue("run-secret-3", "port_failed")))
    row = await reports.record("node-a", "takeover", degraded)
    assert (row.node, row.pass_kind, row.degraded, row.issue_count) == ("node-a", "takeover", True, 3)
    assert stored_counts(row.issue_reasons_json) == {"queue_unknown": 2, "port_failed": 1}
    assert stored_counts(row.counts_json)["published"] == 2
    assert "run-secret" not in str(raw(db_url, "SELECT * FROM tenure_run_recovery_reports"))
    clean = await reports.record("node-a", "relay", RecoveryReport(False, dict.fromkeys(COUNT_NAMES, 0), ()))
    assert await reports.latest() == [clean] and clean.finished_at_us >= row.finished_at_us
    await reports.record("node-b", "startup", degraded)
    assert [(r.node, r.degraded) for r in await reports.latest()] == [("node-a", False), ("node-b", True)]
    with pytest.raises(ConfigValidationError):
        await reports.record("node-a", "sometimes", degraded)
    with pytest.raises(ConfigValidationError):
        await reports.record("", "relay", degraded)


async def test_a_node_taken_over_gets_the_takers_reconciliation_as_its_report(ledger: RunLedger) -> None:
    await ledger.nodes.boot("node-dead", lease_s=0.2)  # never renewed: its lease runs out
    broker = InMemoryBroker()
    async with RunRuntime(ledger, brokers=[broker], workers=[], node="node-b", relay_interval_s=0.1, node_lease_s=2):

        async def taken_over() -> bool:
            rows = {row.node: row for row in await ledger.recovery_reports.latest()}
            return "node-dead" in rows and rows["node-dead"].pass_kind == "takeover"

        await until(taken_over, what="the takeover's report")


async def test_a_failure_to_record_is_logged_once_and_never_stops_recovery(
    ledger: RunLedger, db_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    raw(db_url, "DROP TABLE tenure_run_recovery_reports")  # a database behind runs_v6
    broker = InMemoryBroker()
    caplog.set_level(logging.WARNING, logger="tenure.runs.runtime")
    attempts = 0
    record = ledger.recovery_reports.record

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal attempts
        attempts += 1
        return await record(*args, **kwargs)

    ledger.recovery_reports.record = counted  # type: ignore[method-assign]
    async with RunRuntime(ledger, brokers=[broker], workers=[], node="node-a", relay_interval_s=0.05,
                          node_lease_s=2) as runtime:
        assert runtime.startup is not None and not runtime.startup.degraded
        await until(lambda: attempts >= 4, what="several failed recordings (startup and relay rounds)")
    failures = [record for record in caplog.records if "recording a recovery report failed" in record.getMessage()]
    assert len(failures) == 1 and "(schema_missing)" in failures[0].getMessage()
