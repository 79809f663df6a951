"""`tenure runs`: a worker process on SAQ runs a Run that an operator admitted, decided and
watched from the command line; the operator commands work without a broker and refuse
bad input with exit status 2."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import pytest

from tenure.adapters import RunLedger
from tenure.model import RunStatus

FLOWS = '''
from tenure.adapters import Workflows

registry = Workflows()


@registry.workflow("hello", "1")
async def hello(ctx):
    if not ctx.resumed:
        await ctx.request_consent(tool_name="greet", tool_call_id="call-1", payload={"to": "ada@example.org"},
                                  state={"n": 1})
    if ctx.consent.verdict is not True:
        raise PermissionError()
'''


def tenure(folder: pathlib.Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "tenure.apps.cli", "runs", *arguments], cwd=folder,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def folder(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "flows.py").write_text(FLOWS, encoding="utf-8")
    return tmp_path


async def wait_for(db_url: str, run_id: str, status: RunStatus) -> Any:
    async with RunLedger(db_url) as ledger:
        for _ in range(600):
            run = await ledger.get(run_id)
            if run is not None and run.status is status:
                return run
            await asyncio.sleep(0.05)
    raise AssertionError(f"the Run did not reach {status.value}")


@pytest.mark.parametrize(("database", "broker"), [("postgresql", "saq"), ("postgresql", "queue"), ("sqlite", "queue")])
async def test_a_worker_process_runs_what_the_operator_admits_and_decides(
    db_url: str, folder: pathlib.Path, broker: str,
) -> None:
    admitted = await asyncio.to_thread(tenure, folder, "admit", "--db", db_url, "--workflows", "flows:registry",
                                       "--workflow", "hello", "--revision", "1", "--key", "k-1", "--broker", broker)
    assert admitted.returncode == 0, admitted.stdout + admitted.stderr
    run_id = admitted.stdout.splitlines()[1].split()[0]
    assert "published" in admitted.stdout
    # No worker has served the queue: the operator is told, the Run is admitted all the same.
    assert "warning: no Run worker has served the queue 'runs'" in admitted.stderr
    worker = subprocess.Popen(
        [sys.executable, "-P", "-m", "tenure.apps.cli", "runs", "worker", "--db", db_url, "--broker", broker,
         "--workflows", "flows:registry", "--node", "node-a", "--relay-seconds", "0.5", "--node-lease-seconds", "10"],
        cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        parked = await wait_for(db_url, run_id, RunStatus.AWAITING_CONSENT)
        shown = await asyncio.to_thread(tenure, folder, "show", "--db", db_url, run_id)
        assert "awaiting_consent" in shown.stdout and parked.owner_id in shown.stdout
        # What the consent is for, and its payload only when asked.
        assert "tool greet" in shown.stdout and "(--show-payload prints it)" in shown.stdout
        assert "ada@example.org" not in shown.stdout
        revealed = await asyncio.to_thread(tenure, folder, "show", "--db", db_url, run_id, "--show-payload")
        assert revealed.stdout.splitlines()[-1] == '{"to":"ada@example.org"}'
        # The worker records the queues it serves each relay round: no warning now.
        served = await asyncio.to_thread(tenure, folder, "admit", "--db", db_url, "--workflows", "flows:registry",
                                         "--workflow", "hello", "--revision", "1", "--key", "k-2")
        assert served.returncode == 0 and "warning" not in served.stderr, served.stderr
        second = served.stdout.splitlines()[1].split()[0]
        await wait_for(db_url, second, RunStatus.AWAITING_CONSENT)
        await asyncio.to_thread(tenure, folder, "cancel", "--db", db_url, second)
        decided = await asyncio.to_thread(tenure, folder, "consent", "--db", db_url, parked.owner_id, "grant",
                                          "--by", "bob", "--broker", broker)
        # This call or the worker's relay resumed it: either way the Run is at hop 1 now.
        assert decided.returncode == 0 and "granted" in decided.stdout, decided.stdout + decided.stderr
        assert "at hop 1" in decided.stdout
        await wait_for(db_url, run_id, RunStatus.DONE)
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = await asyncio.to_thread(worker.communicate, timeout=60)
    assert worker.returncode == 0, out + err
    assert "startup: nothing to repair" in out
    assert "done 1" in out and "parked 2" in out and "lost 0" in out
    again = await asyncio.to_thread(tenure, folder, "admit", "--db", db_url, "--workflows", "flows:registry",
                                    "--workflow", "hello", "--revision", "1", "--key", "k-1")
    assert "no (replay)" in again.stdout and run_id in again.stdout


@pytest.mark.parametrize("database", ["sqlite"])
async def test_operator_commands_work_without_a_broker_and_refuse_bad_input(db_url: str, folder: pathlib.Path) -> None:
    admitted = await asyncio.to_thread(tenure, folder, "admit", "--db", db_url, "--workflows", "flows:registry",
                                       "--workflow", "hello", "--revision", "1", "--payload", '{"secret": "s3cr3t"}')
    assert admitted.returncode == 0 and "left to the relays" in admitted.stdout, admitted.stdout + admitted.stderr
    assert "s3cr3t" not in admitted.stdout
    run_id = admitted.stdout.splitlines()[1].split()[0]
    listed = await asyncio.to_thread(tenure, folder, "list", "--db", db_url)
    assert run_id in listed.stdout and "queued" in listed.stdout
    shown = await asyncio.to_thread(tenure, folder, "show", "--db", db_url, run_id)
    assert "pending (fresh, 0 publish calls)" in shown.stdout
    cancelled = await asyncio.to_thread(tenure, folder, "cancel", "--db", db_url, run_id)
    assert cancelled.returncode == 0 and "cancelling" in cancelled.stdout
    listed = await asyncio.to_thread(tenure, folder, "list", "--db", db_url, "--status", "CANCELLING")
    assert run_id in listed.stdout  # statuses in any letter case
    refusals = [
        ("admit", "--db", db_url, "--workflows", "flows:registry", "--workflow", "hello", "--revision", "1",
         "--payload", "{not json"),
        ("admit", "--db", db_url, "--workflows", "nowhere:registry", "--workflow", "hello", "--revision", "1"),
        ("admit", "--db", db_url, "--workflows", "flows:registry", "--workflow", "hello", "--revision", "2"),
        ("admit", "--db", db_url, "--workflows", "flows:registry", "--workflow", "hello", "--revision", "1",
         "--priority", "101"),
        ("consent", "--db", db_url, "0" * 36, "grant", "--by", "bob"),
        ("show", "--db", db_url, "0" * 36),
        ("worker", "--db", db_url, "--broker", "queue", "--workflows", "flows:registry", "--node-lease-seconds", "1.5",
         "--relay-seconds", "1"),  # a lease must outlast two relay intervals
        ("worker", "--db", db_url, "--broker", "queue", "--workflows", "flows:registry", "--relay-seconds", "0"),
    ]
    for arguments in refusals:
        done = await asyncio.to_thread(tenure, folder, *arguments)
        assert done.returncode == 2, (arguments, done.stdout, done.stderr)
    assert "refused: invalid_payload" in (await asyncio.to_thread(tenure, folder, *refusals[0])).stdout
    timed = await asyncio.to_thread(tenure, folder, "admit", "--db", db_url, "--workflows", "flows:registry",
                                    "--workflow", "hello", "--revision", "1", "--timeout-seconds", "3600")
    assert timed.returncode == 0, timed.stdout + timed.stderr
    shown = await asyncio.to_thread(tenure, folder, "show", "--db", db_url, timed.stdout.splitlines()[1].split()[0])
    assert "deadline" in shown.stdout, shown.stdout
    for bad in ("0", "-1", "nan", str(400 * 86400)):
        refused = await asyncio.to_thread(tenure, folder, "admit", "--db", db_url, "--workflows", "flows:registry",
                                          "--workflow", "hello", "--revision", "1", "--timeout-seconds", bad)
        assert refused.returncode == 2 and "timeout_s" in refused.stdout, (bad, refused.stdout, refused.stderr)


def test_a_table_without_rows_is_its_header_line() -> None:
    from tenure.apps.runs_cli import run_table

    assert run_table(["run", "status"], []) == "run  status"


@pytest.mark.parametrize("database", ["sqlite"])
async def test_list_with_no_matching_run_prints_the_header_and_exits_zero(db_url: str, folder: pathlib.Path) -> None:
    header = "run  status  workflow  queue  priority  seq  node  created"
    empty = await asyncio.to_thread(tenure, folder, "list", "--db", db_url)
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, header + "\n", "")
    admitted = await asyncio.to_thread(tenure, folder, "admit", "--db", db_url, "--workflows", "flows:registry",
                                       "--workflow", "hello", "--revision", "1")
    assert admitted.returncode == 0, admitted.stdout + admitted.stderr
    none_done = await asyncio.to_thread(tenure, folder, "list", "--db", db_url, "--status", "done")
    assert (none_done.returncode, none_done.stdout, none_done.stderr) == (0, header + "\n", "")


@pytest.mark.parametrize("database", ["sqlite"])
async def test_a_payload_nested_too_deep_is_refused_without_a_traceback_and_nothing_is_written(
    db_url: str, folder: pathlib.Path,
) -> None:
    deep = "[" * 5000 + "]" * 5000
    done = await asyncio.to_thread(tenure, folder, "admit", "--db", db_url, "--workflows", "flows:registry",
                                   "--workflow", "hello", "--revision", "1", "--payload", deep)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["refused: invalid_payload", "  --payload: json_too_deep (--payload takes a JSON object, or --payload-file PATH, or --payload - (stdin))"]
    assert done.stderr == ""
    async with RunLedger(db_url) as ledger:
        assert (await ledger.list_runs()).items == ()


NEVER_MIGRATED_COMMANDS = [
    (["runs", "worker"], ["--broker", "queue", "--workflows", "flows:registry"]),
    (["runs", "admit"], ["--workflows", "flows:registry", "--workflow", "hello", "--revision", "1"]),
    (["runs", "list"], []),
    (["runs", "show"], ["0" * 36]),
    (["runs", "cancel"], ["0" * 36]),
    (["runs", "consent"], ["0" * 36, "grant", "--by", "bob"]),
    (["worker"], ["--queue", "validation", "--handler", "asyncio:sleep"]),
    (["jobs", "list"], ["--queue", "validation"]),
    (["jobs", "show"], ["--queue", "pipeline", "0" * 36]),
    (["jobs", "cancel"], ["--queue", "streaming", "0" * 36]),
    (["jobs", "purge"], ["--queue", "validation", "--older-than", "7d"]),
]


@pytest.mark.parametrize(("prepared", "reason"), [("missing", "database_missing"), ("empty", "schema_missing")])
@pytest.mark.parametrize(("command", "arguments"), NEVER_MIGRATED_COMMANDS,
                         ids=[" ".join(command) for command, _ in NEVER_MIGRATED_COMMANDS])
def test_every_runs_action_refuses_a_database_never_migrated_with_exit_status_two_as_tenure_worker_does(
    prepared: str, reason: str, command: list[str], arguments: list[str], folder: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import sqlite3

    from tenure.apps.cli import main

    path = folder / "runs.db"
    if prepared == "empty":
        sqlite3.connect(path).close()
    status = main([*command, "--db", f"sqlite:///{path}", *arguments])
    out = capsys.readouterr().out
    assert status == 2, out
    assert out.startswith(f"refused: {reason}: run `tenure migrate --db URL` first ("), out
    assert str(folder) not in out
    assert path.exists() is (prepared == "empty")  # nothing was created


async def test_retry_readmits_a_lost_run_and_show_prints_a_result_only_when_asked(
    db_url: str, folder: pathlib.Path,
) -> None:
    from tenure.adapters import InMemoryBroker, RecoveryPorts
    from tenure.model import RunIntent, WorkflowPin

    pin = WorkflowPin("hello", "1", "sha256:" + "a" * 64)
    broker = InMemoryBroker()
    async with RunLedger(db_url) as ledger:
        lost = (await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=pin, queue="runs",
                                   priority=50)).run.run_id
        done = (await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {"n": 2}), workflow=pin,
                                   queue="runs", priority=50)).run.run_id
        for run_id in (lost, done):
            await ledger.publish(run_id, 0, broker)
            assert await ledger.claim(run_id, 0, node="node-a") is not None
        assert await ledger.settle(done, 0, RunStatus.DONE, result={"secret": "r3sult"})
        await ledger.reconcile(RecoveryPorts(broker), node="node-a", boot_cutoff=await ledger.database_now())
    retried = await asyncio.to_thread(tenure, folder, "retry", "--db", db_url, lost)
    assert retried.returncode == 0 and lost in retried.stdout and "yes" in retried.stdout, retried.stdout
    again = await asyncio.to_thread(tenure, folder, "retry", "--db", db_url, lost)
    assert again.returncode == 0 and "no (replay)" in again.stdout
    refused = await asyncio.to_thread(tenure, folder, "retry", "--db", db_url, done)
    assert refused.returncode == 2 and "run_not_lost" in refused.stdout
    missing = await asyncio.to_thread(tenure, folder, "retry", "--db", db_url, "0" * 36)
    assert missing.returncode == 2
    shown = await asyncio.to_thread(tenure, folder, "show", "--db", db_url, done)
    assert shown.returncode == 0 and "bytes of JSON" in shown.stdout and "r3sult" not in shown.stdout
    printed = await asyncio.to_thread(tenure, folder, "show", "--db", db_url, done, "--result")
    assert printed.returncode == 0 and '{"secret":"r3sult"}' in printed.stdout


@pytest.mark.parametrize("database", ["sqlite"])
async def test_a_payload_comes_from_a_file_or_stdin_and_an_unreadable_file_is_refused_without_its_path(
    db_url: str, folder: pathlib.Path
) -> None:
    (folder / "payload.json").write_text('{"from": "file"}', encoding="utf-8")
    admit = ("admit", "--db", db_url, "--workflows", "flows:registry", "--workflow", "hello", "--revision", "1")
    from_file = await asyncio.to_thread(tenure, folder, *admit, "--payload-file", "payload.json", "--key", "f")
    from_stdin = await asyncio.to_thread(lambda: subprocess.run(
        [sys.executable, "-P", "-m", "tenure.apps.cli", "runs", *admit, "--payload", "-", "--key", "s"],
        cwd=folder, input='{"from": "stdin"}', capture_output=True, text=True, timeout=120, check=False))
    assert from_file.returncode == from_stdin.returncode == 0, from_file.stdout + from_stdin.stdout
    async with RunLedger(db_url) as ledger:
        payloads = {run_id: (await ledger.get(run_id)).payload  # type: ignore[union-attr]
                    for run_id in (from_file.stdout.splitlines()[1].split()[0],
                                   from_stdin.stdout.splitlines()[1].split()[0])}
    assert sorted(payload["from"] for payload in payloads.values()) == ["file", "stdin"]
    missing = await asyncio.to_thread(tenure, folder, *admit, "--payload-file", "no-such-secret-file.json")
    assert missing.returncode == 2 and missing.stdout.splitlines()[:2] == [
        "refused: invalid_payload",
        "  --payload-file: unreadable (--payload-file takes a readable file of at most 16 MiB holding a JSON object)"]
    assert "no-such-secret-file" not in missing.stdout + missing.stderr
    # A payload from a file or stdin that is not JSON names where it came from.
    (folder / "bad.json").write_text("{not json", encoding="utf-8")
    bad = await asyncio.to_thread(tenure, folder, *admit, "--payload-file", "bad.json")
    assert bad.returncode == 2 and bad.stdout.splitlines()[1].startswith("  --payload-file: "), bad.stdout
    both = await asyncio.to_thread(tenure, folder, *admit, "--payload-file", "payload.json", "--payload", "{}")
    assert both.returncode == 2 and "refused: invalid_arguments" in both.stdout


async def test_an_admission_that_changes_the_work_under_an_existing_key_is_refused_with_exit_2(
    db_url: str, folder: pathlib.Path
) -> None:
    def admit(payload: str) -> subprocess.CompletedProcess[str]:
        return tenure(folder, "admit", "--db", db_url, "--workflows", "flows:registry", "--workflow", "hello",
                      "--revision", "1", "--key", "order-secret-42", "--payload", payload)

    first = await asyncio.to_thread(admit, '{"amount": 1}')
    assert first.returncode == 0, first.stdout + first.stderr
    changed = await asyncio.to_thread(admit, '{"amount": 2}')
    # A conflict is a refused request (2), not a database failure (1), said with what to do.
    assert changed.returncode == 2, changed.stdout + changed.stderr
    lines = changed.stdout.splitlines()
    assert lines[0].startswith("refused: run_admission_conflict: "), changed.stdout
    assert "a new --key" in changed.stdout
    assert "order-secret-42" not in changed.stdout + changed.stderr and "amount" not in changed.stdout
    listed = await asyncio.to_thread(tenure, folder, "list", "--db", db_url)
    assert listed.stdout.count("queued") == 1  # nothing was written
