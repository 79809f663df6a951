"""A real pycharter 0.0.67 database adopted by tenure, on SQLite and PostgreSQL.

pycharter runs from its own virtual environment (``.venv-pycharter``, built by
``.ci/test-all.sh`` or, when missing, by the fixture below) through
tests/support/pycharter_client.py. The test follows a pycharter user: ``pycharter db init``,
jobs of all three kinds written by pycharter's own sources (completed, failed, retried,
in flight, pending), ``tenure migrate``, then both ways: tenure's legacy API finishes
pycharter's pending and in-flight jobs and reads every old row with generation 0 and no
token; tenure's owned API works on new rows; pycharter keeps submitting, claiming and
completing legacy work and lists the rows tenure wrote; downgrade refuses while
protected rows exist and, once none do, leaves exactly pycharter's schema.
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

import adapter_support
from adapter_support import raw
import paths
from tenure.adapters import PipelineJobSource, StreamingJobSource, ValidationJobSource, downgrade, upgrade
from tenure.model import ConfigValidationError, JobStatus, PipelineJob, ValidationJob, WorkerConfig

ROOT = paths.ROOT
CLIENT = paths.SUPPORT / "pycharter_client.py"
PYCHARTER_VENV = ROOT / ".venv-pycharter"
PYCHARTER_REQUIREMENTS = ["pycharter==0.0.67", "psycopg[binary]"]


@pytest.fixture(scope="session")
def pycharter_python() -> pathlib.Path:
    """pycharter's interpreter, installed into its own environment when missing (it has
    dependencies of its own that must not enter tenure's test environment)."""
    python = PYCHARTER_VENV / "bin" / "python"
    # Test processes run in parallel (pytest-xdist): one builds the environment, the
    # others wait on the lock and find it built.
    with open(ROOT / ".venv-pycharter.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (PYCHARTER_VENV / "ready").exists():
            subprocess.run([sys.executable, "-m", "venv", str(PYCHARTER_VENV)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", *PYCHARTER_REQUIREMENTS], check=True,
                           stdout=subprocess.DEVNULL)
            (PYCHARTER_VENV / "ready").touch()
    return python


def pycharter(python: pathlib.Path, command: str, url: str, cwd: pathlib.Path, *arguments: str) -> Any:
    done = subprocess.run([str(python), str(CLIENT), command, url, *arguments], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": ""}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(params=adapter_support.AVAILABLE_DATABASES)
def pycharter_database(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> tuple[str, str]:
    """(the URL pycharter uses, the URL tenure uses) for one empty database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/pycharter.db"
        return url, url
    url = adapter_support.new_database("postgresql", tmp_path, request)
    return url, url + "?schema=pycharter"


async def test_a_database_pycharter_created_is_adopted_and_both_libraries_keep_working(
    pycharter_python: pathlib.Path, pycharter_database: tuple[str, str], tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    theirs, ours = pycharter_database
    postgres = theirs.startswith("postgresql")
    steps: list[str] = []
    assert pycharter(pycharter_python, "init", theirs, tmp_path)["status"] == 0
    pristine = pycharter(pycharter_python, "schema", theirs, tmp_path)
    made = pycharter(pycharter_python, "populate", theirs, tmp_path)
    steps.append("pycharter db init + its own sources wrote pending, claimed, completed, failed, retried jobs")

    # --- adoption ---------------------------------------------------------------------------
    if postgres:
        with pytest.raises(ConfigValidationError) as caught:
            await upgrade(theirs)  # the plain URL's schema (public) has no queue tables
        assert caught.value.reason == "queue_tables_elsewhere"
        assert caught.value.problems == ("tables_in_schema_pycharter",)
        assert raw(theirs, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'") == [(0,)]
        steps.append("tenure migrate on the plain URL: refused, naming schema pycharter; nothing created")
    report = await upgrade(ours)
    assert report.changed == ("owned_v2", "attempts_v1", "runs_v1", "runs_v2", "runs_v3", "runs_v4", "runs_v5", "tasks_v1", "runs_v6", "console_v1", "versions_v1", "attempts_v2", "runs_v7", "runs_v8", "workers_v1") and all(check.passed for check in report.checks)
    steps.append(f"tenure migrate: applied owned_v2, attempts_v1, runs_v1, runs_v2, runs_v3, runs_v4, runs_v5 and versions_v1, {len(report.checks)} checks passed")

    config = WorkerConfig(ours, lease_seconds=60, heartbeat_seconds=10)
    async with ValidationJobSource(ours, config) as validation, PipelineJobSource(ours, config) as pipeline, \
            StreamingJobSource(ours, config) as streaming:
        # Every old row reads, with generation 0 and no owned identity.
        old_validation = {info.job_id: info for info in await validation.list_jobs()}
        assert set(old_validation) == set(made["validation_all"])
        for info in old_validation.values():
            assert (info.generation, info.protected, info.submission_id) == (0, False, None)
        assert old_validation[made["validation_complete_result"]].result == {"rows": 3}
        assert old_validation[made["validation_complete_empty"]].result is None  # pycharter stored JSON null
        assert old_validation[made["validation_fail_final"]].status is JobStatus.FAILED
        retried = old_validation[made["validation_fail_retry"]]
        assert retried.status is JobStatus.PENDING and retried.error == "transient"
        assert old_validation[made["validation_claimed"]].owner_id == "pycharter-worker"
        assert old_validation[made["validation_all"][0]].job.options == {"n": 0}
        assert len(await pipeline.list_jobs()) == 3 and len(await streaming.list_jobs()) == 2
        table = "pycharter.validation_jobs" if postgres else "validation_jobs"
        assert raw(theirs, f"SELECT count(*) FROM {table} WHERE claim_token IS NOT NULL") == [(0,)]
        steps.append("tenure reads every old row: generation 0, no token, pycharter's results and errors")

        # tenure's legacy API finishes pycharter's in-flight claims (generation 0).
        assert await validation.heartbeat(made["validation_claimed"], "pycharter-worker") is True
        assert await validation.complete(made["validation_claimed"], {"finished_by": "tenure"}) is True
        assert await pipeline.heartbeat(made["pipeline_claimed"], "pycharter-worker") is True
        assert await pipeline.fail(made["pipeline_claimed"], "tenure failed it", retry=False) is True
        assert await streaming.set_pid(made["streaming_claimed"], 4242) is True
        assert await streaming.complete(made["streaming_claimed"], {"exit": 0}) is True
        # ... and its pending ones, legacy and owned claims alike (the retried job is made
        # due now rather than after pycharter's backoff).
        past = "now() - interval '1 hour'" if postgres else "'2000-01-01 00:00:00.000000'"
        raw(theirs, f"UPDATE {table} SET fires_at = {past} WHERE id = ?", (made["validation_fail_retry"],))
        pending_before = {info.job_id for info in await validation.list_jobs(JobStatus.PENDING)}
        while (legacy := await validation.claim_next("tenure-legacy")) is not None:
            assert await validation.complete(legacy.job_id, {"legacy": True}) is True
        owned_pipeline = await pipeline.claim_next_owned("tenure-owned", claim_token="legacy-row-claim")
        assert owned_pipeline is not None and owned_pipeline.claim_fence.generation == 1
        assert await pipeline.complete_owned(owned_pipeline.claim_fence, {"owned": True}) is True
        streaming_pending = await streaming.claim_next("tenure-legacy")
        assert streaming_pending.job_id == made["streaming_pending"]
        assert await streaming.complete(streaming_pending.job_id) is True
        assert pending_before and not await validation.list_jobs(JobStatus.PENDING)
        steps.append("tenure's legacy API finished pycharter's in-flight (generation 0) and pending jobs")

        # tenure's owned API on new rows.
        owned_id = await validation.submit_owned(ValidationJob("orders", "3.0", "owned.jsonl"), submission_id="owned-1")
        assert await validation.submit_owned(ValidationJob("orders", "3.0", "owned.jsonl"), submission_id="owned-1") == owned_id
        claim = await validation.claim_next_owned("tenure-owned", claim_token="owned-claim-1")
        assert claim.job_id == owned_id and claim.job == ValidationJob("orders", "3.0", "owned.jsonl")
        assert await validation.complete_owned(claim.claim_fence, {"owned": True}) is True
        run_id = await pipeline.submit_owned(PipelineJob({"steps": ["owned"]}, concept_scheme="scheme-1"), submission_id="owned-2")
        pipe_claim = await pipeline.claim_next_owned("tenure-owned", claim_token="owned-claim-2")
        assert pipe_claim.run_id == run_id and pipe_claim.job.concept_scheme == "scheme-1"
        assert await pipeline.fail_owned(pipe_claim.claim_fence, "owned failure", retry=False) is True
        steps.append("tenure's owned API: replayed submission, fenced claim, complete and fail on new rows")

    # --- pycharter on the migrated database --------------------------------------------------
    theirs_now = pycharter(pycharter_python, "work", theirs, tmp_path)
    assert theirs_now["claimed"] == theirs_now["submitted"] and theirs_now["completed"] is True
    listed = {job["job_id"]: job for job in theirs_now["validation"]}
    assert listed[owned_id]["status"] == "completed" and listed[owned_id]["result"] == {"owned": True}
    assert listed[made["validation_claimed"]]["result"] == {"finished_by": "tenure"}
    pipeline_listed = {job["job_id"]: job["status"] for job in theirs_now["pipeline"]}
    assert pipeline_listed[pipe_claim.job_id] == "failed"
    steps.append("pycharter submitted, claimed and completed legacy work and listed tenure's rows")

    async with ValidationJobSource(ours, config) as validation:
        after = await validation.get_job(theirs_now["submitted"])
        assert after.status is JobStatus.COMPLETED and after.result == {"after": True} and after.generation == 0

    # --- downgrade ---------------------------------------------------------------------------
    with pytest.raises(ConfigValidationError) as refused:
        await downgrade(ours)
    assert set(refused.value.problems) == {"protected_submissions_remain"}
    prefix = "pycharter." if postgres else ""
    for name in ("validation_jobs", "pipeline_jobs", "streaming_jobs"):
        raw(theirs, f"DELETE FROM {prefix}{name} WHERE fence_required = ?", (True,))  # a reviewed retirement
    removed = await downgrade(ours)
    assert removed.changed == ("workers_v1", "runs_v8", "runs_v7", "attempts_v2", "versions_v1", "console_v1", "runs_v6", "tasks_v1", "runs_v5", "runs_v4", "runs_v3", "runs_v2", "runs_v1", "attempts_v1", "owned_v2")
    assert pycharter(pycharter_python, "schema", theirs, tmp_path) == pristine
    steps.append("downgrade refused while protected rows remained; after their retirement it restored pycharter's exact schema")
    again = await downgrade(ours)
    assert again.changed == () and "nothing to remove" in again.summary()
    with capsys.disabled():
        print(f"\npycharter adoption [{'postgresql' if postgres else 'sqlite'}]:")
        for number, step in enumerate(steps, 1):
            print(f"  {number}. {step}")


# --- a foreign writer between tenure's read and its write -----------------------------------------


async def test_a_row_changed_by_pycharter_or_plain_sql_after_tenure_read_it_is_never_written_on_the_stale_image(
    pycharter_python: pathlib.Path, pycharter_database: tuple[str, str], tmp_path: pathlib.Path,
) -> None:
    """tenure remembers the rows it last read or wrote (on PostgreSQL it decides the next
    command from them, in one statement that proves they are still current). Here other
    writers change those rows behind its back: pycharter's own code completes a job by its
    ID alone (its workers' way), and a plain SQL UPDATE makes a lease run out. Each raises
    the row's version (the database's trigger, whoever writes), and tenure's next write
    is decided again on the row as it is: refused, never applied on the stale image."""
    theirs, ours = pycharter_database
    table = "pycharter.validation_jobs" if theirs.startswith("postgresql") else "validation_jobs"
    assert pycharter(pycharter_python, "init", theirs, tmp_path)["status"] == 0
    await upgrade(ours)

    def version(job_id: str) -> int:
        return raw(theirs, f"SELECT row_version FROM {table} WHERE id = ?", (job_id,))[0][0]

    config = WorkerConfig(ours, lease_seconds=60, heartbeat_seconds=10)
    async with ValidationJobSource(ours, config) as validation:
        first = await validation.submit_owned(ValidationJob("orders", "1.0", "a.jsonl"), submission_id="stale-1")
        claim = await validation.claim_next_owned("tenure-worker", claim_token="stale-claim-1")
        assert claim.job_id == first and await validation.heartbeat_owned(claim.claim_fence) is True
        seen = version(first)
        assert pycharter(pycharter_python, "complete-by-id", theirs, tmp_path, first)["completed"] is True
        changed = version(first)
        assert changed > seen  # pycharter's ORM write moved it too
        assert await validation.complete_owned(claim.claim_fence, {"by": "tenure"}) is False
        info = await validation.get_job(first)
        assert info.status is JobStatus.COMPLETED and info.result == {"by": "pycharter"}
        assert version(first) == changed  # tenure wrote nothing

        second = await validation.submit_owned(ValidationJob("orders", "1.0", "b.jsonl"), submission_id="stale-2")
        claim = await validation.claim_next_owned("tenure-worker", claim_token="stale-claim-2")
        assert claim.job_id == second and await validation.heartbeat_owned(claim.claim_fence) is True
        seen = version(second)
        past = "now() - interval '1 hour'" if theirs.startswith("postgresql") else "'2000-01-01 00:00:00.000000'"
        raw(theirs, f"UPDATE {table} SET lease_expires_at = {past} WHERE id = ?", (second,))
        changed = version(second)
        assert changed > seen
        assert await validation.heartbeat_owned(claim.claim_fence) is False  # decided on the expired lease
        assert await validation.complete_owned(claim.claim_fence, {"late": True}) is False
        assert (await validation.get_job(second)).status is JobStatus.CLAIMED
        # An UPDATE that writes an old version itself is raised all the same: no writer
        # can make a changed row look unchanged.
        raw(theirs, f"UPDATE {table} SET row_version = ? WHERE id = ?", (seen, second))
        assert version(second) > changed
