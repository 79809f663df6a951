"""Data for the console's tests (and for browser tests and benchmarks): one call seeds a
migrated database with every kind of object a page shows, hostile text included.

    seeded = asyncio.run(seed(db_url))       # IDs of what it made, in a Seeded

What it makes (the names below are the ``Seeded`` fields):

- tasks on the task queues ``emails`` and ``reports``: pending ones (``pending_task``),
  one claimed and failed for good with an error full of markup (``failed_task``), one
  completed with a result (``completed_task``); each task's arguments hold
  :data:`TASK_SECRET`; one task's name is rewritten to :data:`HOSTILE` by SQL (no client
  of tenure would write it);
- a validation job, claimed and failed for good (``failed_validation``);
- a Run waiting on a pending consent (``waiting_run``, ``pending_consent``) whose tool
  name is :data:`HOSTILE_TOOL` and whose payload holds :data:`CONSENT_SECRET`, with one
  delegated job; the Run's intent payload holds :data:`RUN_SECRET`;
- a Run whose consent was denied by ``carol`` (``decided_run``, ``decided_consent``);
- a queued Run on a queue named :data:`HOSTILE_QUEUE`, of a workflow named
  :data:`HOSTILE_WORKFLOW` (``queued_run``);
- a Run failed with an error full of markup (``failed_run``);
- a recovery report of a node named :data:`HOSTILE_NODE`.
"""

from __future__ import annotations

import dataclasses
import uuid

from adapter_support import raw

from tenure.adapters import InMemoryBroker, RunLedger
from tenure.adapters.queue.sources import TaskSource, ValidationJobSource
from tenure.adapters.runs.recovery import RecoveryReport
from tenure.model import ConsentStatus, RunIntent, RunStatus, TaskJob, ValidationJob, WaitKind, WorkflowPin

__all__ = ["seed", "Seeded", "HOSTILE", "HOSTILE_TOOL", "HOSTILE_QUEUE", "HOSTILE_WORKFLOW", "HOSTILE_NODE",
           "HOSTILE_ERROR", "TASK_SECRET", "RUN_SECRET", "CONSENT_SECRET", "PIN", "park_on_consent"]

HOSTILE = "<script>alert(\"task\")</script>&'x'"
HOSTILE_TOOL = "<script>alert('tool')</script> & \"quoted\""
HOSTILE_QUEUE = "<i>q</i>&\"'"
HOSTILE_WORKFLOW = "<svg onload=alert(1)>"
HOSTILE_NODE = "<b>node</b>&'"
HOSTILE_ERROR = "<script>alert('error')</script> & \"boom\" <img src=x onerror=alert(2)>"
TASK_SECRET = "TASK-SECRET-7c1e"
RUN_SECRET = "RUN-SECRET-51ab"
CONSENT_SECRET = "CONSENT-SECRET-9d02"

PIN = WorkflowPin("review", "rev-1", "sha256:" + "a" * 64)


@dataclasses.dataclass(frozen=True, slots=True)
class Seeded:
    pending_task: str
    failed_task: str
    completed_task: str
    hostile_task: str
    failed_validation: str
    waiting_run: str
    pending_consent: str
    decided_run: str
    decided_consent: str
    queued_run: str
    failed_run: str


def _intent(principal: str = "alice") -> RunIntent:
    return RunIntent(None, "console-tests", principal, frozenset({"mail:send"}), {"secret": RUN_SECRET, "n": 1})


async def park_on_consent(ledger: RunLedger, *, queue: str = "runs", tool_name: str = HOSTILE_TOOL,
                          with_job: bool = False) -> tuple[str, str]:
    """A Run admitted, published, claimed and parked on a new pending consent: (Run ID,
    consent ID)."""
    admission = await ledger.admit(_intent(), workflow=PIN, queue=queue, priority=50)
    run_id = admission.run.run_id
    assert await ledger.publish(run_id, 0, InMemoryBroker())
    assert await ledger.claim(run_id, 0, node="node-a") is not None
    if with_job:
        await ledger.jobs.submit(run_id, request_id=f"request-{uuid.uuid4().hex[:8]}", runtime="sandbox",
                                profile="small", request={"secret": RUN_SECRET})
    consent = await ledger.consents.create(run_id, tool_name=tool_name, tool_call_id=f"call-{uuid.uuid4().hex[:8]}",
                                          payload={"secret": CONSENT_SECRET, "html": "<b>bold</b> & more"},
                                          expires_in_s=3600)
    assert await ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent.consent_id)
    return run_id, consent.consent_id


async def _tasks(db_url: str) -> tuple[str, str, str, str]:
    async with TaskSource(db_url) as tasks:
        ids = await tasks.submit_many([
            TaskJob(queue_name="emails", task_name="send", args={"secret": TASK_SECRET, "n": n}) for n in range(3)
        ] + [TaskJob(queue_name="reports", task_name="render", args={"secret": TASK_SECRET})])
        failing = await tasks.claim_next_owned("worker-1", claim_token=uuid.uuid4().hex, queues=["emails"])
        assert failing is not None and failing.claim_fence is not None
        assert await tasks.fail_owned(failing.claim_fence, HOSTILE_ERROR, retry=False)
        finishing = await tasks.claim_next_owned("worker-1", claim_token=uuid.uuid4().hex, queues=["emails"])
        assert finishing is not None and finishing.claim_fence is not None
        assert await tasks.complete_owned(finishing.claim_fence, {"secret": TASK_SECRET, "sent": True})
    hostile = ids[3]
    raw(db_url, "UPDATE tenure_tasks SET task_name = ? WHERE id = ?", (HOSTILE, hostile))
    pending = next(job_id for job_id in ids[:3] if job_id not in (failing.job_id, finishing.job_id))
    return pending, failing.job_id, finishing.job_id, hostile


async def _validation(db_url: str) -> str:
    async with ValidationJobSource(db_url) as validation:
        await validation.submit_owned(ValidationJob("orders", "1.0", f"s3://bucket/{TASK_SECRET}"),
                                      submission_id=uuid.uuid4().hex)
        claimed = await validation.claim_next_owned("worker-2", claim_token=uuid.uuid4().hex)
        assert claimed is not None and claimed.claim_fence is not None
        assert await validation.fail_owned(claimed.claim_fence, HOSTILE_ERROR, retry=False)
        return claimed.job_id


async def seed(db_url: str) -> Seeded:
    """Fill the migrated database at ``db_url`` (see the module docstring)."""
    pending, failed, completed, hostile = await _tasks(db_url)
    failed_validation = await _validation(db_url)
    async with RunLedger(db_url) as ledger:
        waiting_run, pending_consent = await park_on_consent(ledger, with_job=True)
        decided_run, decided_consent = await park_on_consent(ledger, tool_name="files.delete")
        assert await ledger.consents.decide(decided_consent, ConsentStatus.DENIED, decided_by="carol")
        queued = await ledger.admit(_intent("bob"), workflow=WorkflowPin(HOSTILE_WORKFLOW, "rev-1", PIN.digest),
                                    queue=HOSTILE_QUEUE, priority=10)
        failing = await ledger.admit(_intent(), workflow=PIN, queue="runs", priority=50)
        failed_run = failing.run.run_id
        assert await ledger.publish(failed_run, 0, InMemoryBroker())
        assert await ledger.claim(failed_run, 0, node="node-a") is not None
        assert await ledger.settle(failed_run, 0, RunStatus.FAILED, error=HOSTILE_ERROR)
        await ledger.recovery_reports.record(HOSTILE_NODE, "startup",
                                             RecoveryReport(False, {"published": 2, "resumed": 1}, ()), ["runs"])
    return Seeded(pending, failed, completed, hostile, failed_validation, waiting_run, pending_consent, decided_run,
                  decided_consent, queued.run.run_id, failed_run)
