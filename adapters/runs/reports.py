"""The latest recovery report of each node: ``tenure_run_recovery_reports`` (schema step
``runs_v6``), one row per node name.

A :class:`~tenure.adapters.runs.runtime.RunRuntime` records what each of its recovery
passes reported: its startup reconciliation, the reconciliation after it fenced itself
and booted again, the reconciliation of a dead node it took over (stored under the dead
node's name: the report is about that node's Runs), and every relay round. A row holds
which pass wrote it, whether it was degraded, the count of each kind of write, how many
Runs had an issue and of which reasons, and the database time it was recorded; never a
Run ID. Each pass replaces the row of its node, so a row is always that node's latest
word. ``tenure health`` reads the rows (:func:`latest_reports`).

A report is a diagnostic, not evidence any Run waits on: recording one is one
transaction that serializes the writers of one node by a named lock (a node's own passes
and a node taking it over), reads the database clock after it and writes the row. A
failure to record never reaches recovery: the runtime logs it and goes on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tenure.kernel.core import Condition, Finder
from tenure.model import TenureError, canonical_json
from tenure.model.errors import is_authored_word
from tenure.model.runs import check_text
from tenure.model.validation import refuse

from ..core.facade import Transactions
from ..core.store import Transaction
from ..core.tables import json_column
from .table import RECOVERY_REPORTS_BINDING, RECOVERY_REPORTS_TABLE, REPORT_PASSES, RecoveryReportRow

if TYPE_CHECKING:
    from .recovery import RecoveryReport

__all__ = ["RecoveryReports", "RecoveryReportRow", "RECOVERY_REPORTS_TABLE", "RECOVERY_REPORTS_BINDING",
           "REPORT_PASSES", "report_row", "latest_reports", "stored_counts", "stored_queues", "SERVING_PASSES",
           "MAX_NODE_CHARS"]

MAX_NODE_CHARS = 128
"""The longest node name a report is stored under (the node lease table's bound)."""

_EVERY_ROW = Finder("recovery_reports", ((Condition("node", "not_null"),),), order=("node",), lock="none")


def report_row(node: str, pass_kind: str, report: RecoveryReport, finished_at_us: int,
               queues: Iterable[str] = ()) -> RecoveryReportRow:
    """The row that records ``report`` (IDs left out: only counts are kept), written by a
    node whose workers serve ``queues``."""
    reasons: dict[str, int] = {}
    for issue in report.issues:
        reasons[issue.reason] = reasons.get(issue.reason, 0) + 1
    return RecoveryReportRow(
        node=node, pass_kind=pass_kind, degraded=bool(report.issues), issue_count=len(report.issues),
        counts_json=canonical_json({name: int(count) for name, count in report.counts.items()}),
        issue_reasons_json=canonical_json(reasons), finished_at_us=finished_at_us,
        queues_json=canonical_json(sorted(set(queues))),
    )


SERVING_PASSES = frozenset({"startup", "reboot", "relay"})
"""The passes a node makes while its workers serve (a takeover's row is about a dead node)."""


def stored_queues(text: str) -> set[str]:
    """A stored JSON array of queue names (anything else in it is ignored)."""
    try:
        value: Any = json_column(text)
    except TenureError:
        return set()
    return {name for name in value if type(name) is str} if type(value) is list else set()


def stored_counts(text: str) -> dict[str, int]:
    """A stored JSON object of counts, keeping only entries that are a word tenure could
    have written and a count (a row written outside tenure says nothing else)."""
    try:
        value: Any = json_column(text)
    except TenureError:  # corrupt_row: nothing readable in it
        return {}
    if type(value) is not dict:
        return {}
    return {name: count for name, count in value.items()
            if is_authored_word(name) and type(count) is int and count >= 0}


async def latest_reports(tx: Transaction) -> list[RecoveryReportRow]:
    """Every node's latest report, by node name, inside the caller's transaction."""
    rows: list[RecoveryReportRow] = await tx.find(RECOVERY_REPORTS_BINDING, _EVERY_ROW, {})
    return rows


class RecoveryReports:
    """The recovery reports of one Run ledger's database (``RunLedger.recovery_reports``)."""

    def __init__(self, transactions: Transactions) -> None:
        self._tx = transactions

    async def record(self, node: str, pass_kind: str, report: RecoveryReport,
                     queues: Iterable[str] = ()) -> RecoveryReportRow:
        """Replace ``node``'s report with ``report``, written by the pass ``pass_kind``
        (one of :data:`REPORT_PASSES`) of a node whose workers serve ``queues``; the row
        as stored."""
        name = check_text(node, "node", MAX_NODE_CHARS)
        if pass_kind not in REPORT_PASSES:
            raise refuse("pass_kind", "unknown_pass", reason="invalid_recovery_report")

        async def body(tx: Transaction) -> RecoveryReportRow:
            await tx.lock_name(f"tenure:recovery_report:{name}")
            row = report_row(name, pass_kind, report, await tx.now_us(), queues)
            stored: list[RecoveryReportRow] = await tx.read(RECOVERY_REPORTS_BINDING, [name])
            if not stored:
                written: RecoveryReportRow = await tx.insert(RECOVERY_REPORTS_BINDING, row)
                return written
            updated: list[RecoveryReportRow] = await tx.update_many(RECOVERY_REPORTS_BINDING, [(stored[0], row)],
                                                                    read_back=False)
            return updated[0]

        recorded: RecoveryReportRow = await self._tx.run(body)
        return recorded

    async def served_queues(self, within_s: float) -> set[str]:
        """The Run queues some node's workers served within the last ``within_s`` seconds
        of the database clock (by the serving passes it recorded: a relay round each
        relay interval)."""

        async def body(tx: Transaction) -> set[str]:
            since = await tx.now_us() - round(within_s * 1_000_000)
            served: set[str] = set()
            for row in await latest_reports(tx):
                if row.pass_kind in SERVING_PASSES and row.finished_at_us >= since:
                    served |= stored_queues(row.queues_json)
            return served

        queues: set[str] = await self._tx.run(body, write=False)
        return queues

    async def latest(self) -> list[RecoveryReportRow]:
        """Every node's latest report, by node name."""
        rows: list[RecoveryReportRow] = await self._tx.run(latest_reports, write=False)
        return rows

