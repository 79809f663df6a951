"""`tenure health`: healthy on a freshly migrated database; unhealthy for each condition it
checks once that condition is made true (an old pending job, an expired claim, a Run
stuck in CANCELLING, a degraded recovery report written by a real reconciliation, a
database behind the current step); refused for a database never migrated and for bad
flags; unhealthy, never hanging, against a server that does not answer; and the URL,
its password and the IDs it counts are never printed. On every database."""

from __future__ import annotations

import asyncio
import json
import pathlib
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from adapter_support import as_on_a_loaded_machine, expire_lease, kind_of, raw, shift_instants
from run_support import Runs

from tenure.adapters import (
    InMemoryBroker,
    RecoveryPorts,
    RunLedger,
    RunRuntime,
    TaskApp,
    TaskContext,
    ValidationJobSource,
)
from tenure.apps.cli import main
from tenure.apps.health import CHECK_NAMES, health_snapshot
from tenure.adapters.core.tables import instant_from_sqlite_text, instant_to_sqlite_text
from tenure.adapters.runs.recovery import COUNT_NAMES, RecoveryReport
from tenure.model import QueueKind, RunStatus, ValidationJob, WorkerConfig

PASSWORD = "hunter2-9f2c"


@pytest.fixture(autouse=True)
def no_tenure_db(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENURE_DB", raising=False)


async def health(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str]:
    """``tenure health ARGUMENTS`` in this process (its own event loop, in a thread)."""
    status = await asyncio.to_thread(main, ["health", *arguments])
    return status, capsys.readouterr().out


async def checks_of(capsys: pytest.CaptureFixture[str], db_url: str,
                    *arguments: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """The exit status, the checks by name and the whole document of ``--json``."""
    status, out = await health(capsys, "--db", db_url, "--json", *arguments)
    document = json.loads(out)
    return status, {check["name"]: check for check in document["checks"]}, document


def failing(checks: dict[str, Any]) -> set[str]:
    return {name for name, check in checks.items() if not check["ok"]}


async def test_a_freshly_migrated_database_is_healthy_and_every_check_is_reported(
    db_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    status, checks, document = await checks_of(capsys, db_url)
    assert status == 0, document
    assert document["healthy"] is True and document["database"] == kind_of(db_url)
    assert [check["name"] for check in document["checks"]] == list(CHECK_NAMES)
    for check in document["checks"]:
        assert set(check) == {"name", "ok", "value", "threshold", "reason", "detail"}
    assert checks["migrated"]["reason"] == "current" and checks["migrated"]["value"] == 0
    assert checks["oldest_pending_seconds"] == {"name": "oldest_pending_seconds", "ok": True, "value": None,
                                                "threshold": 300.0, "reason": "none_due", "detail": {}}
    assert checks["recovery_reports"]["reason"] == "no_reports"
    assert [(queue["table"], queue["queue"]) for queue in document["queues"]] == [
        ("validation_jobs", "validation"), ("pipeline_jobs", "pipeline"), ("streaming_jobs", "streaming")]
    # Text: one line per check, then the verdict.
    status, out = await health(capsys, "--db", db_url)
    lines = out.splitlines()
    assert status == 0 and len(lines) == len(CHECK_NAMES) + 1
    assert [line.split(":")[0] for line in lines[:-1]] == list(CHECK_NAMES)
    assert all(": ok (" in line for line in lines[:-1]) and lines[-1] == f"healthy ({kind_of(db_url)})"


async def test_the_database_comes_from_tenure_db_when_db_is_not_given(
    db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    status, out = await health(capsys)
    lines = out.splitlines()
    assert status == 2 and lines[0] == "refused: invalid_arguments"
    assert "db" in lines[1] and "argument_required" in lines[1]
    monkeypatch.setenv("TENURE_DB", db_url)
    status, out = await health(capsys)
    assert status == 0 and out.splitlines()[-1] == f"healthy ({kind_of(db_url)})"


async def test_an_old_pending_job_is_unhealthy_past_the_threshold_and_each_queue_reports_its_depth(
    db_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    async with ValidationJobSource(db_url) as source:
        await source.submit_owned(ValidationJob("orders", "1", "secret-source.jsonl"), submission_id="s-1")
    app = TaskApp(db_url)

    @app.task(name="mail.send", queue="emails")
    async def send(ctx: TaskContext, to: str) -> None: ...

    async with app:
        await app.defer("mail.send", {"to": "bob@example.com"})
        await app.defer("mail.send", {"to": "carol@example.com"}, schedule_in=3600)  # pending, not due
    status, checks, document = await checks_of(capsys, db_url)
    assert status == 0 and checks["pending_jobs"]["value"] == 3
    assert checks["oldest_pending_seconds"]["reason"] == "within"
    shift_instants(db_url, QueueKind.VALIDATION, "fires_at", 2 * 3_600_000_000)
    status, checks, document = await checks_of(capsys, db_url)
    assert status == 1 and failing(checks) == {"oldest_pending_seconds"}
    oldest = checks["oldest_pending_seconds"]
    assert (oldest["reason"], oldest["threshold"]) == ("exceeded", 300.0) and 7200 <= oldest["value"] < 7300
    queues = {(queue["table"], queue["queue"]): queue for queue in document["queues"]}
    assert queues[("validation_jobs", "validation")]["counts"]["pending"] == 1
    assert 7200 <= queues[("validation_jobs", "validation")]["oldest_pending_seconds"] < 7300
    emails = queues[("tenure_tasks", "emails")]
    assert emails["counts"]["pending"] == 2 and emails["oldest_pending_seconds"] < 300  # the other one is not due
    # A wider threshold, or a threshold on the depth itself.
    status, checks, _ = await checks_of(capsys, db_url, "--max-oldest-pending-seconds", "36000")
    assert status == 0
    status, checks, _ = await checks_of(capsys, db_url, "--max-oldest-pending-seconds", "36000",
                                        "--max-pending-jobs", "2")
    assert status == 1 and failing(checks) == {"pending_jobs"} and checks["pending_jobs"]["reason"] == "exceeded"
    status, out = await health(capsys, "--db", db_url)
    assert "oldest_pending_seconds: FAIL (exceeded), value 72" in out and out.splitlines()[-1].startswith("unhealthy")
    assert "secret-source" not in out and "example.com" not in out


async def test_a_claim_past_its_lease_is_unhealthy_once_the_grace_ran_out(
    db_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    # An hour's lease: the claim is live for the first check however slow the machine (as
    # the ten minutes a loaded one may take prove); the lease is then moved back by the
    # hour and 90 s, so it ran out at least 90 s before, past the default 60 s grace and
    # well within a grace of an hour.
    async with ValidationJobSource(db_url, WorkerConfig(db_url, lease_seconds=3600, heartbeat_seconds=10)) as source:
        job_id = await source.submit_owned(ValidationJob("orders", "1", "a.jsonl"), submission_id="s-1")
        claim = await source.claim_next_owned("worker-a", claim_token=uuid.uuid4().hex)
        assert claim is not None and claim.job_id == job_id
    as_on_a_loaded_machine(db_url, QueueKind.VALIDATION, job_id)
    status, checks, _ = await checks_of(capsys, db_url)
    assert status == 0 and checks["expired_claims"]["reason"] == "none"
    expire_lease(db_url, QueueKind.VALIDATION, job_id, by_us=3_690_000_000)  # 90 s past its lease
    status, checks, document = await checks_of(capsys, db_url)
    assert status == 1 and failing(checks) == {"expired_claims"}
    assert (checks["expired_claims"]["value"], checks["expired_claims"]["reason"]) == (1, "exceeded")
    assert document["queues"][0]["expired_claims"] == 1
    status, checks, _ = await checks_of(capsys, db_url, "--expired-claim-grace-seconds", "3600")
    assert status == 0 and checks["expired_claims"]["value"] == 0
    status, checks, _ = await checks_of(capsys, db_url, "--max-expired-claims", "1")
    assert status == 0 and checks["expired_claims"]["reason"] == "within"
    status, out = await health(capsys, "--db", db_url)
    assert job_id not in out and "worker-a" not in out


def shift_run_updated_at(db_url: str, run_id: str, by_us: int) -> None:
    if kind_of(db_url) == "sqlite":
        (stored,) = raw(db_url, "SELECT updated_at FROM tenure_runs WHERE run_id = ?", (run_id,))[0]
        moved = instant_to_sqlite_text(instant_from_sqlite_text(stored) - by_us)
        raw(db_url, "UPDATE tenure_runs SET updated_at = ? WHERE run_id = ?", (moved, run_id))
        return
    raw(db_url, "UPDATE tenure_runs SET updated_at = updated_at - make_interval(secs => ?::bigint / 1e6) "
                "WHERE run_id = ?", (by_us, run_id))


async def test_a_run_stuck_in_cancelling_is_unhealthy_past_the_threshold(
    db_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    async with RunLedger(db_url) as ledger:
        runs = Runs(ledger, db_url)
        run_id = await runs.running("run-1")
        assert await ledger.begin_cancel(run_id) is not None
        assert (await ledger.get(run_id)).status is RunStatus.CANCELLING  # type: ignore[union-attr]
    status, checks, _ = await checks_of(capsys, db_url)
    cancelling = checks["oldest_cancelling_seconds"]
    assert status == 0 and cancelling["reason"] == "within" and cancelling["detail"] == {"cancelling": 1, "stuck": 0}
    shift_run_updated_at(db_url, run_id, 600_000_000)
    status, checks, _ = await checks_of(capsys, db_url)
    cancelling = checks["oldest_cancelling_seconds"]
    assert status == 1 and failing(checks) == {"oldest_cancelling_seconds"}
    assert cancelling["reason"] == "exceeded" and 600 <= cancelling["value"] < 700
    assert cancelling["detail"] == {"cancelling": 1, "stuck": 1}
    status, checks, _ = await checks_of(capsys, db_url, "--max-cancelling-seconds", "3600")
    assert status == 0 and checks["oldest_cancelling_seconds"]["detail"]["stuck"] == 0
    status, out = await health(capsys, "--db", db_url)
    assert run_id not in out


async def test_a_degraded_reconciliation_is_reported_by_its_counts_never_by_node_or_run(
    db_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    async with RunLedger(db_url) as ledger:
        runs = Runs(ledger, db_url)
        # A Run admitted to a queue no worker of this node serves: reconciliation cannot
        # prove it (queue_unknown), so its report is degraded.
        run_id = await runs.published("run-1", queue="elsewhere")
        broker = InMemoryBroker()
        ports = RecoveryPorts(broker=broker, known_queues=frozenset({"agents"}))
        runtime = RunRuntime(ledger, brokers=[broker], workers=[], node=node, ports=ports, require_clean=False,
                             relay_interval_s=0.2, node_lease_s=5)
        async with runtime:
            assert runtime.startup is not None and runtime.startup.degraded
        status, checks, _ = await checks_of(capsys, db_url)
        reports = checks["recovery_reports"]
        assert status == 1 and failing(checks) == {"recovery_reports"}
        assert (reports["value"], reports["threshold"], reports["reason"]) == (1, 0, "degraded")
        assert reports["detail"]["nodes"] == 1 and reports["detail"]["degraded_nodes"] == 1
        assert reports["detail"]["issues"] >= 1 and set(reports["detail"]["issue_reasons"]) == {"queue_unknown"}
        status, checks, _ = await checks_of(capsys, db_url, "--max-degraded-nodes", "1")
        assert status == 0 and checks["recovery_reports"]["reason"] == "within"
        status, out = await health(capsys, "--db", db_url)
        assert "recovery_reports: FAIL (degraded), value 1, threshold 0; nodes 1; degraded_nodes 1; issues " in out
        assert "queue_unknown" in out and node not in out and run_id not in out
        snapshot = await health_snapshot(db_url)  # the library's reading keeps the node, for its caller
        assert snapshot.reports is not None and [report.node for report in snapshot.reports] == [node]
        # A clean pass written through the runtime's writer replaces the node's report.
        await runtime.record_report(node, "relay", RecoveryReport(False, dict.fromkeys(COUNT_NAMES, 0), ()))
        status, checks, _ = await checks_of(capsys, db_url)
        assert status == 0 and checks["recovery_reports"]["reason"] == "clean"


async def test_a_database_behind_the_current_step_is_unhealthy_and_the_missing_table_is_reported_absent(
    db_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    raw(db_url, "DROP TABLE tenure_run_recovery_reports")
    raw(db_url, "DELETE FROM tenure_migrations WHERE name = 'runs_v6'")
    status, checks, _ = await checks_of(capsys, db_url)
    assert status == 1 and failing(checks) == {"migrated"}
    assert (checks["migrated"]["reason"], checks["migrated"]["value"]) == ("behind", 1)
    assert checks["migrated"]["detail"] == {"missing_steps": ["runs_v6"]}
    assert checks["recovery_reports"] == {"name": "recovery_reports", "ok": True, "value": None, "threshold": 0,
                                          "reason": "table_absent", "detail": {}}


async def test_a_database_never_migrated_is_refused_as_the_worker_refuses_it(
    fresh_db_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    status, out = await health(capsys, "--db", fresh_db_url, "--json")
    reason = "database_missing" if kind_of(fresh_db_url) == "sqlite" else "schema_missing"
    assert status == 2
    assert out == f"refused: {reason}: run `tenure migrate --db URL` first (tenure health never migrates)\n"
    if kind_of(fresh_db_url) == "sqlite":
        assert not pathlib.Path(fresh_db_url.split(":///", 1)[1]).exists()  # nothing created


@pytest.mark.parametrize("database", ["sqlite"])
@pytest.mark.parametrize(("arguments", "flag", "problem", "accepts"), [
    (["--timeout-seconds", "0"], "--timeout-seconds", "number_out_of_range", "0.1 to 300"),
    (["--timeout-seconds", "nan"], "--timeout-seconds", "number_out_of_range", "0.1 to 300"),
    (["--max-oldest-pending-seconds", "-1"], "--max-oldest-pending-seconds", "number_out_of_range", "0 to 31,536,000"),
    (["--max-expired-claims", "-1"], "--max-expired-claims", "integer_out_of_range", "0 to 1,000,000,000"),
    (["--expired-claim-grace-seconds", "inf"], "--expired-claim-grace-seconds", "number_out_of_range", "0 to 86,400"),
    (["--max-cancelling-seconds", "1e9"], "--max-cancelling-seconds", "number_out_of_range", "0 to 31,536,000"),
    (["--max-pending-jobs", "-5"], "--max-pending-jobs", "integer_out_of_range", "0 to 1,000,000,000"),
    (["--max-degraded-nodes", "many"], "--max-degraded-nodes", "integer_required", "an integer"),
])
async def test_bad_flags_are_refused_naming_the_flag_and_its_range_before_the_database(
    fresh_db_url: str, arguments: list[str], flag: str, problem: str, accepts: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out = await health(capsys, "--db", fresh_db_url, *arguments)
    lines = out.splitlines()
    assert status == 2 and lines[0] == "refused: invalid_arguments", out
    assert problem in lines[1] and f"{flag} takes {accepts}" in lines[1], out
    assert not pathlib.Path(fresh_db_url.split(":///", 1)[1]).exists()


async def test_a_bad_url_is_refused_without_echoing_it(capsys: pytest.CaptureFixture[str]) -> None:
    status, out = await health(capsys, "--db", f"mysql://operator:{PASSWORD}@db.internal/queue")
    assert status == 2 and out.startswith("refused: invalid_db_url") and "unsupported_scheme" in out
    assert PASSWORD not in out and "db.internal" not in out


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never answers a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_a_server_that_never_answers_is_unhealthy_with_timeout_and_its_password_never_printed(
    silent_server: int, tmp_path: pathlib.Path,
) -> None:
    url = f"postgresql://operator:{PASSWORD}@127.0.0.1:{silent_server}/queue"
    for arguments, env in ((["--db", url], {}), ([], {"TENURE_DB": url})):
        done = subprocess.run([sys.executable, "-P", "-m", "tenure.apps.cli", "health", "--timeout-seconds",
                               "0.5", "--json", *arguments], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                              check=False, env={**_environment(), **env})
        assert done.returncode == 1, done.stdout + done.stderr
        document = json.loads(done.stdout)
        assert document["healthy"] is False
        assert {check["name"]: (check["ok"], check["reason"]) for check in document["checks"]} == {
            name: (False, "timeout") for name in CHECK_NAMES}
        printed = done.stdout + done.stderr
        assert PASSWORD not in printed and "operator" not in printed and str(silent_server) not in printed


def _environment() -> dict[str, str]:
    import os

    return {name: value for name, value in os.environ.items() if name != "TENURE_DB"}


async def test_a_refused_connection_is_unhealthy_and_every_other_check_not_checked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    status, out = await health(capsys, "--db", f"postgresql://operator:{PASSWORD}@127.0.0.1:{port}/queue")
    assert status == 1
    assert out.splitlines()[0] == "reachable: FAIL (connection_refused)"
    assert all("(not_checked)" in line for line in out.splitlines()[1:-1])
    assert PASSWORD not in out and str(port) not in out
