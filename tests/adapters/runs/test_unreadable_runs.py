"""A Run row tenure cannot read (issue 47, item 12: ``enqueue_seq = 'three'`` written by
SQL; on PostgreSQL, whose types refuse that, a creation time of ``infinity``) stops no
startup: reconciliation and the relays report it (issue ``corrupt_row``, its ID logged
once) and recover the other Runs; ``tenure runs worker`` starts, serves the other Runs
and exits 0; the console's Run pages render it as corrupt_row."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import pytest
from adapter_support import kind_of, raw
from run_support import Runs

from tenure.adapters import RecoveryPorts, RunLedger
from tenure.model import RunStatus, hop_key

HANG_GUARD_S = 120.0
"""Only stops a hang: every wait below ends on a condition long before."""

NODE = "node-a"

POISON = {"sqlite": "enqueue_seq = 'three'", "postgresql": "created_at = 'infinity'"}
"""Text in an INTEGER column (SQLite keeps it); a date beyond the kernel's bounds
(PostgreSQL's integer column refuses text)."""

FLOWS = '''
from tenure.adapters import Workflows

registry = Workflows()


@registry.workflow("hello", "1")
async def hello(ctx):
    return None
'''


def poison(db_url: str, run_id: str) -> None:
    raw(db_url, f"UPDATE tenure_runs SET {POISON[kind_of(db_url)]} WHERE run_id = ?", (run_id,))


@pytest.fixture
async def runs(db_url: str) -> Any:
    async with RunLedger(db_url) as ledger:
        yield Runs(ledger, db_url)


async def boot() -> dt.datetime:
    """A boot cutoff strictly after everything set up so far."""
    await asyncio.sleep(0.002)
    cutoff = dt.datetime.now(dt.timezone.utc)
    await asyncio.sleep(0.002)
    return cutoff


async def test_reconciliation_and_a_relay_report_an_unreadable_run_and_recover_the_others(
    runs: Runs, caplog: pytest.LogCaptureFixture,
) -> None:
    poisoned = (await runs.admit("poisoned")).run.run_id
    healthy = (await runs.admit("healthy")).run.run_id  # admitted, its first hop not yet published
    poison(runs.db_url, poisoned)
    with caplog.at_level(logging.WARNING, logger="tenure.adapters.runs.recovery"):
        report = await runs.ledger.reconcile(RecoveryPorts(runs.broker), node=NODE, boot_cutoff=await boot())
    assert {(issue.run_id, issue.reason) for issue in report.issues} == {(poisoned, "corrupt_row")}
    assert report.counts["published"] == 1  # the healthy Run's hop, published by the same pass
    healthy_run = await runs.ledger.get(healthy)
    assert healthy_run is not None and healthy_run.status is RunStatus.QUEUED
    assert hop_key(healthy, 0) in runs.broker.jobs
    logged = [record.getMessage() for record in caplog.records if poisoned in record.getMessage()]
    assert len(logged) == 1 and "could not be read" in logged[0]
    relayed = await runs.ledger.relay(RecoveryPorts(runs.broker), cursor=None)
    assert {(issue.run_id, issue.reason) for issue in relayed.issues} == {(poisoned, "corrupt_row")}


def _tenure(folder: pathlib.Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "tenure.apps.cli", "runs", *arguments], cwd=folder,
                          capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)


async def _admitted(folder: pathlib.Path, db_url: str, key: str) -> str:
    admitted = await asyncio.to_thread(_tenure, folder, "admit", "--db", db_url, "--workflows", "flows:registry",
                                       "--workflow", "hello", "--revision", "1", "--key", key, "--broker", "queue")
    assert admitted.returncode == 0, admitted.stdout + admitted.stderr
    return admitted.stdout.splitlines()[1].split()[0]


async def _until_done(db_url: str, run_ids: list[str]) -> None:
    async with RunLedger(db_url) as ledger, asyncio.timeout(HANG_GUARD_S):
        while True:
            found = [await ledger.get(run_id) for run_id in run_ids]
            if all(run is not None and run.status is RunStatus.DONE for run in found):
                return
            await asyncio.sleep(0.05)


def _console_pages(db_url: str, paths: list[str]) -> dict[str, tuple[int, str]]:
    from starlette.testclient import TestClient

    from tenure.apps.console.app import create_app
    from tenure.apps.console.settings import ConsoleSettings

    with TestClient(create_app(ConsoleSettings(db_url=db_url)), base_url="http://127.0.0.1:8787") as client:
        return {path: (response.status_code, response.text) for path in paths
                for response in [client.get(path)]}


async def test_a_runs_worker_starts_beside_an_unreadable_run_reports_it_and_serves_the_others(
    db_url: str, tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "flows.py").write_text(FLOWS, encoding="utf-8")
    poisoned = await _admitted(tmp_path, db_url, "k-poisoned")
    healthy = [await _admitted(tmp_path, db_url, f"k-{n}") for n in range(2)]
    poison(db_url, poisoned)
    worker = subprocess.Popen(
        [sys.executable, "-P", "-m", "tenure.apps.cli", "runs", "worker", "--db", db_url, "--broker", "queue",
         "--workflows", "flows:registry", "--node", NODE, "--relay-seconds", "0.2", "--node-lease-seconds", "30"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        await _until_done(db_url, healthy)
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = await asyncio.to_thread(worker.communicate, timeout=HANG_GUARD_S)
    assert worker.returncode == 0, out + err
    assert "startup:" in out and "degraded" in out
    # Reported with its ID, once, by the startup reconciliation (the relays only count it).
    assert err.count(f"Run {poisoned} could not be read") == 1, err

    paths = ["/", "/runs", f"/runs/{poisoned}", f"/runs/{healthy[0]}", "/consents"]
    pages = await asyncio.to_thread(_console_pages, db_url, paths)
    assert {path: answer[0] for path, answer in pages.items()} == dict.fromkeys(paths, 200)
    assert pages["/runs"][1].count('data-status="corrupt_row"') == 1
    assert 'data-testid="run-corrupt"' in pages[f"/runs/{poisoned}"][1]
    assert 'data-status="done"' in pages["/runs"][1]


async def test_an_unreadable_owner_row_in_a_page_stays_with_its_own_run(runs: Runs) -> None:
    """Recovery reads a page's evidence together (adapters/runs/pages.py); when one row of
    it cannot be read, every Run of the page is read alone, so the issue is that Run's and
    the page's other Runs are recovered."""
    stuck, poisoned_consent = await runs.waiting_on_consent("stuck")
    resumable, _ = await runs.waiting_on_consent("resumable", decided=True)
    unreadable = {"sqlite": "created_at = 'not a date'", "postgresql": "created_at = 'infinity'"}
    raw(runs.db_url, f"UPDATE tenure_consents SET {unreadable[kind_of(runs.db_url)]} WHERE consent_id = ?",
        (poisoned_consent,))
    report = await runs.ledger.reconcile(RecoveryPorts(runs.broker), node=NODE, boot_cutoff=await boot())
    assert {(issue.run_id, issue.reason) for issue in report.issues} == {(stuck, "corrupt_row")}
    assert report.counts["resumed"] == 1 and hop_key(resumable, 1) in runs.broker.jobs
