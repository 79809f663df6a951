"""`tenure jobs`: an operator lists, shows, cancels and purges jobs of the owned queues
from the command line, on every database; arguments are checked before the database is
touched, and an envelope is printed only when asked."""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import sys
import uuid

import pytest

from adapter_support import as_on_a_loaded_machine

from tenure.adapters import StreamingJobSource, ValidationJobSource
from tenure.model import JobStatus, QueueKind, StreamingJob, ValidationJob, WorkerConfig


def tenure(folder: pathlib.Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "tenure.apps.cli", "jobs", *arguments], cwd=folder,
                          capture_output=True, text=True, timeout=120, check=False)


async def jobs(folder: pathlib.Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(tenure, folder, *arguments)


async def test_an_operator_lists_shows_cancels_and_purges_jobs(db_url: str, tmp_path: pathlib.Path) -> None:
    hour = WorkerConfig(db_url, lease_seconds=3600, heartbeat_seconds=10)
    async with ValidationJobSource(db_url, hour) as source:
        ids = [await source.submit_owned(ValidationJob("orders", "1", f"secret-{n}.jsonl"), submission_id=f"s-{n}")
               for n in range(3)]
        claimed = await source.claim_next_owned("worker-a", claim_token=uuid.uuid4().hex)
        assert claimed is not None and claimed.job_id == ids[0]
        assert await source.complete_owned(claimed.claim_fence, {"rows": 3})
        legacy = await source.submit(ValidationJob("orders", "1", "legacy.jsonl"))
        taken = await source.claim_next("legacy-worker")  # never an owned submission: the legacy job
        assert taken is not None and taken.job_id == legacy
    # The rest runs a dozen CLI processes before the legacy claim is completed: minutes on
    # a loaded machine (CI once took 119 s). Its hour's lease outlives them, as this proves.
    as_on_a_loaded_machine(db_url, QueueKind.VALIDATION, legacy)

    listed = await jobs(tmp_path, "list", "--db", db_url, "--queue", "validation", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    documents = json.loads(listed.stdout)
    assert [d["job_id"] for d in documents] == [*ids, legacy]
    assert [d["status"] for d in documents] == ["completed", "pending", "pending", "claimed"]
    assert documents[0]["result_bytes"] == len('{"rows":3}') and "job" not in documents[0]
    assert "secret" not in listed.stdout  # no envelope in a listing

    only = await jobs(tmp_path, "list", "--db", db_url, "--queue", "validation", "--status", "pending", "--json")
    assert [d["job_id"] for d in json.loads(only.stdout)] == ids[1:]
    none_old = await jobs(tmp_path, "list", "--db", db_url, "--queue", "validation", "--older-than", "1h")
    assert none_old.returncode == 0 and none_old.stdout.splitlines()[0].split()[:2] == ["job", "status"]
    assert len(none_old.stdout.splitlines()) == 1  # the header alone: every job is younger

    table = await jobs(tmp_path, "show", "--db", db_url, "--queue", "validation", ids[0])
    assert table.returncode == 0 and "completed" in table.stdout and "10 bytes of JSON" in table.stdout
    assert "secret" not in table.stdout
    revealed = await jobs(tmp_path, "show", "--db", db_url, "--queue", "validation", ids[0], "--show-args", "--json")
    assert json.loads(revealed.stdout)["job"]["data_source"] == "secret-0.jsonl"
    missing = await jobs(tmp_path, "show", "--db", db_url, "--queue", "validation", str(uuid.uuid4()))
    assert (missing.returncode, missing.stdout) == (2, "no such job\n")

    # A failed job goes back to pending with a fresh budget; a completed one is refused.
    async with ValidationJobSource(db_url, WorkerConfig(db_url, lease_seconds=30, heartbeat_seconds=10)) as source:
        claim = await source.claim_next_owned("worker-a", claim_token=uuid.uuid4().hex)
        assert claim is not None and claim.job_id == ids[1]
        assert await source.fail_owned(claim.claim_fence, "broke", retry=False)
    retried = await jobs(tmp_path, "retry", "--db", db_url, "--queue", "validation", ids[1])
    assert retried.returncode == 0 and retried.stdout.splitlines()[1].split() == [ids[1], "pending", "0/5"], retried.stdout
    refused = await jobs(tmp_path, "retry", "--db", db_url, "--queue", "validation", ids[0])
    assert refused.returncode == 2 and refused.stdout.startswith("not retried")
    streaming = await jobs(tmp_path, "retry", "--db", db_url, "--queue", "streaming", ids[0])
    assert streaming.returncode == 2 and streaming.stdout.splitlines()[:2] == [
        "refused: invalid_arguments", "  --queue: tasks_validation_or_pipeline_required (--queue takes tasks (default), validation, pipeline or streaming)"]

    cancelled = await jobs(tmp_path, "cancel", "--db", db_url, "--queue", "validation", ids[2])
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    again = await jobs(tmp_path, "cancel", "--db", db_url, "--queue", "validation", ids[2])
    assert again.returncode == 2 and again.stdout.startswith("not cancelled")

    # Purge: finished and unprotected only (the cancelled and completed jobs are owned).
    purged = await jobs(tmp_path, "purge", "--db", db_url, "--queue", "validation", "--older-than", "0s")
    assert purged.returncode == 0 and "purged 0 so far" in purged.stderr
    async with ValidationJobSource(db_url) as source:
        assert await source.complete(legacy, {"legacy": True})
    purged = await jobs(tmp_path, "purge", "--db", db_url, "--queue", "validation", "--older-than", "0s")
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert purged.stdout.splitlines()[1].split() == ["validation", "1", "0s"]
    async with ValidationJobSource(db_url) as source:
        assert await source.get_job(legacy) is None
        assert [info.status for info in await source.list_jobs()] == [
            JobStatus.COMPLETED, JobStatus.PENDING, JobStatus.CANCELLED]


async def test_cancelling_a_running_launch_requests_it(db_url: str, tmp_path: pathlib.Path) -> None:
    async with StreamingJobSource(db_url) as source:
        job_id = await source.submit_owned(StreamingJob("stream-a", "1"), submission_id="launch-1")
        assert await source.claim_next_owned("launcher", claim_token=uuid.uuid4().hex) is not None
    done = await jobs(tmp_path, "cancel", "--db", db_url, "--queue", "streaming", job_id)
    assert done.returncode == 0 and "cancel requested" in done.stdout
    async with StreamingJobSource(db_url) as source:
        info = await source.get_job(job_id)
        assert info is not None and (info.status, info.cancel_requested) == (JobStatus.CLAIMED, True)


@pytest.mark.parametrize("database", ["sqlite"])
@pytest.mark.parametrize("age", ["7", "7 days", "-1d", "1w", "40000d"])
async def test_an_age_without_a_unit_or_out_of_range_is_refused_before_the_database(
    db_url: str, tmp_path: pathlib.Path, age: str
) -> None:
    done = await jobs(tmp_path, "purge", "--db", db_url, "--queue", "validation", f"--older-than={age}")
    assert done.returncode == 2 and done.stdout.startswith("refused: invalid_arguments"), done.stdout
    assert "older_than" in done.stdout and age not in done.stdout.replace("older_than", "")


TASK_APP = '''
import os
from tenure.adapters import TaskApp

app = TaskApp(os.environ["TASKS_DB"])


@app.task(queue="emails", name="send_welcome")
async def send_welcome(ctx, user_id: int) -> dict:
    return {"sent": user_id}


@app.task(queue="reports", name="build_report", priority=80)
async def build_report(ctx, name: str) -> None:
    return None
'''


def tasks_cli(folder: pathlib.Path, db_url: str, *arguments: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "tenure.apps.cli", "jobs", *arguments], cwd=folder,
                          capture_output=True, text=True, timeout=120, check=False, input=stdin,
                          env={**__import__("os").environ, "TASKS_DB": db_url})


async def test_tasks_are_deferred_by_name_listed_by_queue_and_task_and_purged_by_status(
    db_url: str, tmp_path: pathlib.Path
) -> None:
    (tmp_path / "tasksapp.py").write_text(TASK_APP)

    def run(*arguments: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return tasks_cli(tmp_path, db_url, *arguments, stdin=stdin)

    deferred = await asyncio.to_thread(run, "defer", "--app", "tasksapp:app", "send_welcome", "--args", '{"user_id": 7}',
                                       "--submission-id", "welcome-7")
    assert deferred.returncode == 0, deferred.stdout + deferred.stderr
    job_id = deferred.stdout.splitlines()[1].split()[0]
    again = await asyncio.to_thread(run, "defer", "--app", "tasksapp:app", "send_welcome", "--args", '{"user_id": 7}',
                                    "--submission-id", "welcome-7")
    assert again.stdout.splitlines()[1].split()[0] == job_id  # replay-safe
    from_stdin = await asyncio.to_thread(run, "defer", "--app", "tasksapp:app", "build_report", "--args-file", "-",
                                         stdin='{"name": "weekly"}')
    assert from_stdin.returncode == 0, from_stdin.stdout
    unknown = await asyncio.to_thread(run, "defer", "--app", "tasksapp:app", "Secret_Name")
    assert unknown.returncode == 2 and "Secret_Name" not in unknown.stdout
    assert "build_report, send_welcome" in unknown.stdout
    bad_args = await asyncio.to_thread(run, "defer", "--app", "tasksapp:app", "send_welcome", "--args", "[1]")
    assert bad_args.returncode == 2 and "args: json_object_required" in bad_args.stdout

    listed = await asyncio.to_thread(run, "list", "--db", db_url, "--json")
    documents = json.loads(listed.stdout)
    assert [(d["task_queue"], d["task"], d["priority"]) for d in documents] == [
        ("emails", "send_welcome", 0), ("reports", "build_report", 80)]
    only = await asyncio.to_thread(run, "list", "--db", db_url, "--task", "build_report", "--json")
    assert [d["task"] for d in json.loads(only.stdout)] == ["build_report"]
    by_queue = await asyncio.to_thread(run, "list", "--db", db_url, "--task-queue", "emails")
    assert by_queue.returncode == 0 and "send_welcome" in by_queue.stdout and "build_report" not in by_queue.stdout
    assert "replay-safe" in by_queue.stdout

    from tenure.adapters import FailJob, TaskApp

    async with TaskApp(db_url) as app:
        @app.task(queue="emails", name="send_welcome")
        async def send_welcome(ctx: object, user_id: int) -> dict[str, int]:
            return {"sent": user_id}

        @app.task(queue="reports", name="build_report")
        async def build_report(ctx: object, name: str) -> None:
            raise FailJob("no data")

        await app.worker(idle_wait_s=0.1).run_until_idle()
    failed = await asyncio.to_thread(run, "list", "--db", db_url, "--status", "failed", "--json")
    assert [d["task"] for d in json.loads(failed.stdout)] == ["build_report"]
    # Only the failed, unprotected task goes: the completed one is an owned submission.
    purged = await asyncio.to_thread(run, "purge", "--db", db_url, "--older-than", "0s", "--status", "completed")
    assert purged.returncode == 0 and purged.stdout.splitlines()[1].split()[:2] == ["task", "0"]
    purged = await asyncio.to_thread(run, "purge", "--db", db_url, "--older-than", "0s", "--status", "failed")
    assert purged.stdout.splitlines()[1].split()[:2] == ["task", "1"]
    left = json.loads((await asyncio.to_thread(run, "list", "--db", db_url, "--json")).stdout)
    assert [d["job_id"] for d in left] == [job_id]


async def test_a_deferral_that_changes_an_existing_submission_is_refused_with_what_to_do(
    db_url: str, tmp_path: pathlib.Path
) -> None:
    (tmp_path / "tasksapp.py").write_text(TASK_APP)

    def run(*arguments: str) -> subprocess.CompletedProcess[str]:
        return tasks_cli(tmp_path, db_url, *arguments)

    first = await asyncio.to_thread(run, "defer", "--app", "tasksapp:app", "send_welcome", "--args", '{"user_id": 7}',
                                    "--submission-id", "welcome-secret-7", "--db", db_url)
    assert first.returncode == 0, first.stdout + first.stderr
    changed = await asyncio.to_thread(run, "defer", "--app", "tasksapp:app", "send_welcome", "--args",
                                      '{"user_id": 8}', "--submission-id", "welcome-secret-7", "--db", db_url)
    # A conflict is a refused request (2), not a database failure (1): said with what to do.
    assert changed.returncode == 2, changed.stdout + changed.stderr
    lines = changed.stdout.splitlines()
    assert lines[0] == "refused: queue_submission_conflict: fingerprint_mismatch", changed.stdout
    assert any(line.startswith("  --submission-id: ") for line in lines[1:]), changed.stdout
    assert any("a new --submission-id" in line for line in lines[1:]), changed.stdout
    assert "welcome-secret-7" not in changed.stdout + changed.stderr and "user_id" not in changed.stdout
    listed = json.loads((await asyncio.to_thread(run, "list", "--db", db_url, "--json")).stdout)
    assert len(listed) == 1  # nothing was written


async def test_a_stored_error_another_client_wrote_is_shown_without_control_bidirectional_or_separator_characters(
    db_url: str, tmp_path: pathlib.Path
) -> None:
    hostile = "boom \u202eevil\u202c \u2066x\u2069 \x1b[31mred\rOVER\u2028next\u2029para"
    async with ValidationJobSource(db_url, WorkerConfig(db_url, lease_seconds=30, heartbeat_seconds=10)) as source:
        job_id = await source.submit_owned(ValidationJob("orders", "1", "a.jsonl"), submission_id="s-1")
        claimed = await source.claim_next_owned("worker-a", claim_token=uuid.uuid4().hex)
        assert claimed is not None and await source.fail_owned(claimed.claim_fence, hostile, retry=False)
    shown = await jobs(tmp_path, "show", "--db", db_url, "--queue", "validation", job_id, "--json")
    assert json.loads(shown.stdout)["error"] == "boom \ufffdevil\ufffd \ufffdx\ufffd \ufffd[31mred\nOVER\nnext\npara"
    for arguments in (("show", job_id), ("list",)):
        printed = await jobs(tmp_path, *arguments[:1], "--db", db_url, "--queue", "validation", *arguments[1:])
        assert printed.returncode == 0, printed.stdout + printed.stderr
        assert not {"\u202e", "\u202c", "\u2066", "\u2069", "\x1b", "\r", "\u2028", "\u2029"} & set(printed.stdout)
        assert "boom \ufffdevil\ufffd" in printed.stdout
