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

from tenure.adapters import StreamingJobSource, ValidationJobSource
from tenure.model import JobStatus, StreamingJob, ValidationJob, WorkerConfig


def tenure(folder: pathlib.Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "tenure.adapters.apps.cli", "jobs", *arguments], cwd=folder,
                          capture_output=True, text=True, timeout=120, check=False)


async def jobs(folder: pathlib.Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(tenure, folder, *arguments)


async def test_an_operator_lists_shows_cancels_and_purges_jobs(db_url: str, tmp_path: pathlib.Path) -> None:
    async with ValidationJobSource(db_url, WorkerConfig(db_url, lease_seconds=30, heartbeat_seconds=10)) as source:
        ids = [await source.submit_owned(ValidationJob("orders", "1", f"secret-{n}.jsonl"), submission_id=f"s-{n}")
               for n in range(3)]
        claimed = await source.claim_next_owned("worker-a", claim_token=uuid.uuid4().hex)
        assert claimed is not None and claimed.job_id == ids[0]
        assert await source.complete_owned(claimed.claim_fence, {"rows": 3})
        legacy = await source.submit(ValidationJob("orders", "1", "legacy.jsonl"))
        taken = await source.claim_next("legacy-worker")  # never an owned submission: the legacy job
        assert taken is not None and taken.job_id == legacy

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
        "refused: invalid_arguments", "  queue: validation_or_pipeline_required"]

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
