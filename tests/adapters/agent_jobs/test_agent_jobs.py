"""Delegated jobs through the Run ledger, on every database: a job is submitted once per
request ID, advances one step at a time, records the runtime's identity once, adopts one
result of the right shape, and records containment only from lost or an open job.
Moved from tests/adapters/runs/test_run_ledger.py, whose module database and Runs driver
(run_support.py) these tests share in form.
"""

from __future__ import annotations

from typing import Any

import pytest

from run_support import Runs, ledger, raises, result_of, runs, runs_db, succeeded, unique  # noqa: F401 (fixtures)
from tenure.adapters.runs.ledger import job_id_for
from tenure.model import AgentJobStatus, ConfigValidationError, ErrorCode, WaitKind


async def test_a_job_is_submitted_once_per_request_id_and_changed_content_conflicts(runs: Runs) -> None:
    ledger = runs.ledger
    run_id = await runs.running("run-1")
    request_id = unique("request")
    job = await ledger.jobs.submit(run_id, request_id=request_id, runtime="sandbox", profile="small",
                                  request={"prompt": "count"})
    assert job.job_id == job_id_for(request_id)
    assert (job.status, job.run_id, job.request, job.result, job.runtime_job_id) == (
        AgentJobStatus.QUEUED, run_id, {"prompt": "count"}, None, None)
    again = await ledger.jobs.submit(run_id, request_id=request_id, runtime="sandbox", profile="small",
                                    request={"prompt": "count"})
    assert again == job
    other = await runs.running("run-other")
    for changes in ({"request": {"prompt": "other"}}, {"runtime": "cluster"}, {"profile": "large"}, {"run_id": other}):
        fields: dict[str, Any] = dict(run_id=run_id, request_id=request_id, runtime="sandbox", profile="small",
                                      request={"prompt": "count"})
        fields.update(changes)
        error = await raises(ErrorCode.JOB_REQUEST_CONFLICT, ledger.jobs.submit(**fields))
        assert error.reason == "request_changed"
    assert runs.count("tenure_agent_jobs", run_id) == 1 and runs.count("tenure_agent_jobs", other) == 0
    assert await ledger.jobs.get(job.job_id) == job
    # A replay after the Run parked on the job still answers the stored job.
    assert await ledger.park(run_id, 0, kind=WaitKind.DELEGATE, owner_id=job.job_id)
    replay = await ledger.jobs.submit(run_id, request_id=request_id, runtime="sandbox", profile="small",
                                     request={"prompt": "count"})
    assert replay == job


async def test_a_job_advances_one_step_at_a_time(runs: Runs) -> None:
    ledger = runs.ledger
    job_id = await runs.job(await runs.running("run-1"))
    assert await ledger.jobs.advance(job_id, AgentJobStatus.PREPARING) is False
    assert await ledger.jobs.advance(job_id, AgentJobStatus.ADMITTED) is True
    assert await ledger.jobs.advance(job_id, AgentJobStatus.ADMITTED) is False
    assert await ledger.jobs.advance(job_id, AgentJobStatus.RUNNING) is False
    assert await ledger.jobs.advance(job_id, AgentJobStatus.PREPARING) is True
    assert await ledger.jobs.advance(job_id, AgentJobStatus.RUNNING) is True
    assert (await ledger.jobs.get(job_id)).status is AgentJobStatus.RUNNING  # type: ignore[union-attr]
    assert await ledger.jobs.adopt_result(job_id, succeeded(job_id))
    assert await ledger.jobs.advance(job_id, AgentJobStatus.RUNNING) is False
    for status in (AgentJobStatus.QUEUED, AgentJobStatus.SUCCEEDED, AgentJobStatus.LOST):
        with pytest.raises(ConfigValidationError) as caught:
            await ledger.jobs.advance(job_id, status)
        assert caught.value.fields == ("status",)
    assert await ledger.jobs.advance(job_id_for(unique("request")), AgentJobStatus.ADMITTED) is False


async def test_the_runtimes_job_identity_is_recorded_once(runs: Runs) -> None:
    ledger = runs.ledger
    job_id = await runs.job(await runs.running("run-1"))
    assert await ledger.jobs.advance(job_id, AgentJobStatus.ADMITTED, runtime_job_id="runtime-1")
    error = await raises(ErrorCode.JOB_REQUEST_CONFLICT,
                         ledger.jobs.advance(job_id, AgentJobStatus.PREPARING, runtime_job_id="runtime-2"))
    assert error.reason == "identity_conflict"
    assert (await ledger.jobs.get(job_id)).status is AgentJobStatus.ADMITTED  # type: ignore[union-attr]
    assert await ledger.jobs.advance(job_id, AgentJobStatus.PREPARING)
    assert await ledger.jobs.advance(job_id, AgentJobStatus.RUNNING, runtime_job_id="runtime-1")
    job = await ledger.jobs.get(job_id)
    assert job is not None and (job.status, job.runtime_job_id) == (AgentJobStatus.RUNNING, "runtime-1")


async def test_a_result_is_adopted_once_and_must_have_its_shape(runs: Runs) -> None:
    ledger = runs.ledger
    job_id = await runs.job(await runs.running("run-1"))
    other = job_id_for(unique("request"))
    with pytest.raises(ConfigValidationError) as caught:
        await ledger.jobs.adopt_result(job_id, ["not", "an", "object"])
    assert caught.value.fields == ("result",)
    bad = [
        ({"job_id": job_id, "status": ["succeeded"]}, "result_status_mismatch"),
        ({"job_id": job_id, "status": {"is": "succeeded"}}, "result_status_mismatch"),
        (succeeded(other), "result_job_mismatch"),
        ({"job_id": job_id}, "result_status_mismatch"),
        (result_of(job_id, AgentJobStatus.RUNNING), "result_status_mismatch"),
        ({**succeeded(job_id), "error": "but it worked"}, "result_error_unexpected"),
        (result_of(job_id, AgentJobStatus.FAILED), "result_error_required"),
        (result_of(job_id, AgentJobStatus.TIMED_OUT), "result_error_required"),
        (result_of(job_id, AgentJobStatus.LOST), "result_error_required"),
        (result_of(job_id, AgentJobStatus.FAILED, error=""), "result_error_required"),
        (result_of(job_id, AgentJobStatus.FAILED, error=7), "result_error_required"),
    ]
    for result, problem in bad:
        with pytest.raises(ConfigValidationError) as caught:
            await ledger.jobs.adopt_result(job_id, result)
        assert (caught.value.fields, caught.value.problems) == (("result",), (problem,)), result
    assert (await ledger.jobs.get(job_id)).status is AgentJobStatus.QUEUED  # type: ignore[union-attr]
    assert await ledger.jobs.adopt_result(job_id, succeeded(job_id)) is True
    assert await ledger.jobs.adopt_result(job_id, result_of(job_id, AgentJobStatus.FAILED, error="late")) is False
    assert await ledger.jobs.adopt_result(job_id, succeeded(job_id)) is False
    job = await ledger.jobs.get(job_id)
    assert job is not None and (job.status, job.result) == (AgentJobStatus.SUCCEEDED, succeeded(job_id))
    assert await ledger.jobs.record_cancelled(job_id) is False
    assert await ledger.jobs.adopt_result(other, succeeded(other)) is False


async def test_containment_is_recorded_from_lost_or_an_open_job_but_never_over_another_result(runs: Runs) -> None:
    ledger = runs.ledger
    run_id = await runs.running("run-1")
    lost = await runs.job(run_id)
    assert await ledger.jobs.adopt_result(lost, result_of(lost, AgentJobStatus.LOST, error="ambiguous start"))
    assert (await ledger.jobs.get(lost)).status is AgentJobStatus.LOST  # type: ignore[union-attr]
    assert await ledger.jobs.advance(lost, AgentJobStatus.ADMITTED) is False
    assert await ledger.jobs.adopt_result(lost, result_of(lost, AgentJobStatus.FAILED, error="x")) is False
    assert await ledger.jobs.record_cancelled(lost) is True
    job = await ledger.jobs.get(lost)
    assert job is not None and job.status is AgentJobStatus.CANCELLED
    assert job.result == {"job_id": lost, "status": "cancelled", "contained": True}
    assert await ledger.jobs.record_cancelled(lost) is False
    running = await runs.job(run_id)
    assert await ledger.jobs.advance(running, AgentJobStatus.ADMITTED)
    assert await ledger.jobs.record_cancelled(running) is True
    failed = await runs.job(run_id)
    assert await ledger.jobs.adopt_result(failed, result_of(failed, AgentJobStatus.FAILED, error="tool crashed"))
    assert await ledger.jobs.record_cancelled(failed) is False
    assert (await ledger.jobs.get(failed)).status is AgentJobStatus.FAILED  # type: ignore[union-attr]
    assert await ledger.jobs.list(run_id) == ()
