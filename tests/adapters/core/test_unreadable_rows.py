"""A stored row tenure cannot read (written by another client: JSON nested deeper than
tenure reads, or text that is not JSON) gives the documented ``corrupt_row`` reason on
every read, never a ``RecursionError``; a claim that meets one never hands it out but
fails it (an owned claim's nonce is spent on it), so one poison row never stops a queue
or a Run worker.

The nesting is the fault probe's: ``{"x": [[[...]]]}`` 1,000 levels deep, written with
raw SQL on both databases.
"""

from __future__ import annotations

from typing import Any

import pytest

from adapter_support import raw
from run_support import PIN, Runs, runs_db, unique  # noqa: F401 (runs_db: fixture)
from tenure.adapters import InMemoryBroker, RunLedger, ValidationJobSource, Worker, Workflows
from tenure.adapters.queue.operations import UNREADABLE_ERROR, UNREADABLE_ROUNDS
from tenure.adapters.runs.worker import RunWorker
from tenure.model import ErrorCode, RunStatus, TenureError, ValidationJob, WorkerConfig

DEEP = '{"data_source": "d", "options": {"x": ' + "[" * 1000 + "]" * 1000 + "}}"
"""A validation job's data_json nested 1,002 levels deep (tenure reads 256)."""

DEEP_DOCUMENT = '{"x": ' + "[" * 1000 + "]" * 1000 + "}"


def config(db_url: str) -> WorkerConfig:
    return WorkerConfig(db_url, lease_seconds=30, heartbeat_seconds=10, backoff_base_ms=0, backoff_max_ms=0)


def corrupt_row(error: pytest.ExceptionInfo[TenureError]) -> bool:
    return error.value.reason == "corrupt_row" and "[" not in str(error.value)


async def submit(source: ValidationJobSource, name: str) -> str:
    return await source.submit_owned(ValidationJob("orders", "1", f"{name}.jsonl"), submission_id=name)


def poison(db_url: str, job_id: str, text: str = DEEP) -> None:
    raw(db_url, "UPDATE validation_jobs SET data_json = ? WHERE id = ?", (text, job_id))


def status_and_error(db_url: str, job_id: str) -> tuple[str, str | None]:
    [(status, error)] = raw(db_url, "SELECT status, error_message FROM validation_jobs WHERE id = ?", (job_id,))
    return status, error


# --- the owned queue ------------------------------------------------------------------


@pytest.mark.parametrize("text", [DEEP, '["a list"]'])
async def test_reading_an_unreadable_job_gives_corrupt_row(db_url: str, text: str) -> None:
    async with ValidationJobSource(db_url, config(db_url)) as source:
        job_id = await submit(source, "poisoned")
        poison(db_url, job_id, text)
        with pytest.raises(TenureError) as caught:
            await source.get_job(job_id)
        assert corrupt_row(caught)
        with pytest.raises(TenureError) as caught:
            await source.list_jobs()
        assert corrupt_row(caught)


async def test_a_claim_that_meets_an_unreadable_job_fails_it_and_spends_its_nonce(db_url: str) -> None:
    async with ValidationJobSource(db_url, config(db_url)) as source:
        first = await submit(source, "first")
        second = await submit(source, "second")
        poison(db_url, first)
        assert await source.claim_next_owned("worker-a", claim_token="token-1") is None  # never handed out
        assert status_and_error(db_url, first) == ("failed", UNREADABLE_ERROR)
        assert source.operations.unreadable_failed == 1
        with pytest.raises(TenureError) as caught:  # the failed job holds it: spent
            await source.claim_next_owned("worker-a", claim_token="token-1")
        assert (caught.value.code, caught.value.reason) == (ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused")
        claimed = await source.claim_next_owned("worker-a", claim_token="token-2")
        assert claimed is not None and claimed.job_id == second
        assert claimed.claim_fence is not None and claimed.claim_fence.claim_token == "token-2"
        assert await source.claim_next_owned("worker-a", claim_token="token-3") is None
        assert source.operations.unreadable_failed == 1


async def test_a_batch_claim_answers_the_readable_jobs_and_fails_the_rest(db_url: str) -> None:
    async with ValidationJobSource(db_url, config(db_url)) as source:
        ids = [await submit(source, f"job-{n}") for n in range(4)]
        poison(db_url, ids[0])
        poison(db_url, ids[2])
        claimed = await source.claim_batch_owned("worker-a", claim_tokens=["t-1", "t-2", "t-3"])
        assert [job.job_id for job in claimed] == [ids[1]]
        assert [job.claim_fence.claim_token for job in claimed] == ["t-2"]  # type: ignore[union-attr]
        assert [status_and_error(db_url, ids[n])[0] for n in range(4)] == ["failed", "claimed", "failed", "pending"]
        assert status_and_error(db_url, ids[2]) == ("failed", UNREADABLE_ERROR)
        assert source.operations.unreadable_failed == 2


async def test_a_legacy_claim_fails_unreadable_jobs_and_claims_the_next_until_its_rounds_run_out(db_url: str) -> None:
    async with ValidationJobSource(db_url, config(db_url)) as source:
        ids = [await source.submit(ValidationJob("orders", "1", f"job-{n:02d}.jsonl")) for n in range(UNREADABLE_ROUNDS + 2)]
        for job_id in ids[:-1]:
            poison(db_url, job_id)
        with pytest.raises(TenureError) as caught:
            await source.claim_next("worker-a")
        assert corrupt_row(caught) and caught.value.code is ErrorCode.QUEUE_PERSISTENCE_FAILED
        assert [status_and_error(db_url, job_id)[0] for job_id in ids[:UNREADABLE_ROUNDS]] == ["failed"] * UNREADABLE_ROUNDS
        claimed = await source.claim_next("worker-a")  # fails the last unreadable one, then claims the readable
        assert claimed is not None and claimed.job_id == ids[-1]
        assert status_and_error(db_url, ids[-2]) == ("failed", UNREADABLE_ERROR)


async def test_a_worker_runs_the_jobs_behind_an_unreadable_one(db_url: str) -> None:
    async with ValidationJobSource(db_url, config(db_url)) as source:
        ids = [await submit(source, f"job-{n}") for n in range(3)]
        poison(db_url, ids[0])

        async def handler(claimed: Any, context: Any) -> dict[str, Any]:
            return {"ran": claimed.job_id}

        stats = await Worker(source, handler, concurrency=1).run_until_idle()
        assert (stats.claimed, stats.completed) == (2, 2)
        assert [status_and_error(db_url, job_id)[0] for job_id in ids] == ["failed", "completed", "completed"]


# --- Runs -----------------------------------------------------------------------------


@pytest.fixture
async def runs(runs_db: str) -> Any:
    async with RunLedger(runs_db) as ledger:
        yield Runs(ledger, runs_db)


async def test_reading_an_unreadable_run_gives_corrupt_row_and_a_claim_fails_it(runs: Runs) -> None:
    run_id = await runs.published("poisoned")
    raw(runs.db_url, "UPDATE tenure_runs SET payload_json = ? WHERE run_id = ?", (DEEP_DOCUMENT, run_id))
    with pytest.raises(TenureError) as caught:
        await runs.ledger.get(run_id)
    assert corrupt_row(caught)
    with pytest.raises(TenureError) as caught:
        await runs.ledger.list_runs(limit=1000)
    assert corrupt_row(caught)
    with pytest.raises(TenureError) as caught:
        await runs.ledger.claim(run_id, 0, node="node-a")
    assert corrupt_row(caught) and caught.value.code is ErrorCode.RUN_PERSISTENCE_FAILED
    assert raw(runs.db_url, "SELECT status, error FROM tenure_runs WHERE run_id = ?", (run_id,)) == [
        (RunStatus.FAILED.value, "corrupt_row")]
    assert await runs.ledger.claim(run_id, 0, node="node-a") is None  # a redelivery is stale


async def test_a_run_worker_fails_an_unreadable_run_and_runs_the_next(runs: Runs) -> None:
    poisoned = await runs.published("poisoned")
    healthy = await runs.published("healthy")
    raw(runs.db_url, "UPDATE tenure_runs SET payload_json = ? WHERE run_id = ?", (DEEP_DOCUMENT, poisoned))
    flows = Workflows()

    async def review(context: Any) -> None:
        return None

    flows.register(PIN.name, PIN.revision, review, digest=PIN.digest)
    worker = RunWorker(runs.ledger, InMemoryBroker(), flows, node="node-a", watch_interval_s=0.05)
    assert await worker.perform(poisoned, 0) == "failed"
    assert await worker.perform(healthy, 0) == "done"
    assert (await runs.ledger.get(healthy)).status is RunStatus.DONE  # type: ignore[union-attr]


async def test_an_unreadable_checkpoint_gives_corrupt_row(runs: Runs) -> None:
    run_id = await runs.running("checkpointed")
    assert await runs.ledger.checkpoints.save(run_id, 0, state={"step": 1})
    raw(runs.db_url, "UPDATE tenure_run_checkpoints SET state_json = ? WHERE run_id = ?", (DEEP_DOCUMENT, run_id))
    with pytest.raises(TenureError) as caught:
        await runs.ledger.checkpoints.load(run_id)
    assert corrupt_row(caught)
