"""The Runs part of ``tenure demo``: workflow Runs admitted, delivered through a broker
with injected faults, parked and resumed by their owners, cancelled, and checked.

Runs of four kinds go through the ledger and an in-memory broker: ``simple`` (one hop),
``consent`` (the hop parks on a consent, a principal decides, the Run resumes on a new
hop), ``delegate`` (the hop parks on a delegated job whose result is adopted) and
``cancel`` (cancelled while its hop runs; the first abort fails, so the cancellation
stays CANCELLING until a second attempt proves the hop fenced). Admissions are replayed
(answered with the stored Run) and replayed with changed content (refused); some are
held and released; publications fail or lose their acknowledgement and are retried
under the same hop key; every hop is delivered a second time, and that duplicate must be
skipped. The checks: every Run ends DONE or CANCELLED with every delivery settled, and
each hop was claimed once.
"""

from __future__ import annotations

import collections
import random
from typing import TextIO

from tenure.model import (
    AgentJobStatus,
    ConsentStatus,
    ErrorCode,
    RunIntent,
    RunStatus,
    TenureError,
    WaitKind,
    WorkflowPin,
)

from tenure.adapters.runs import InMemoryBroker, RunLedger

__all__ = ["run_runs_demo"]

KINDS = ("simple", "consent", "delegate", "cancel")
WORKFLOW = WorkflowPin("demo-review", "1", "sha256:demo")
QUEUE = "runs"
NODE = "demo-node"


class _RunsDemo:
    def __init__(self, ledger: RunLedger, seed: int, out: TextIO) -> None:
        self.ledger = ledger
        self.broker = InMemoryBroker()
        self.chooser = random.Random(seed)
        self.out = out
        self.counts: collections.Counter[str] = collections.Counter()
        self.kind_of: dict[str, str] = {}
        self.claimed: collections.Counter[tuple[str, int]] = collections.Counter()
        self.violations: list[str] = []

    async def publish(self, run_id: str, seq: int) -> None:
        """Publish, retrying an injected failure under the same hop key."""
        fault = self.chooser.choice(["none", "none", "none", "fail", "lost"])
        self.broker.fail_publishes = int(fault == "fail")
        self.broker.lose_acknowledgements = int(fault == "lost")
        try:
            await self.ledger.publish(run_id, seq, self.broker)
        except TenureError as error:
            if error.code is not ErrorCode.RUN_BROKER_FAILED:
                raise
            self.counts["publish failed, retried under the same key" if fault == "fail"
                        else "acknowledgement lost, retried under the same key"] += 1
            await self.ledger.publish(run_id, seq, self.broker)

    async def admit(self, number: int) -> None:
        kind = KINDS[number % len(KINDS)]
        intent = RunIntent(f"session-{number}", "demo", "operator", frozenset({"review"}), {"item": number}, None)
        hold = number % 3 == 0
        admission = await self.ledger.admit(intent, workflow=WORKFLOW, queue=QUEUE, priority=50,
                                            idempotency_key=f"item-{number}", hold=hold)
        run_id = admission.run.run_id
        self.kind_of[run_id] = kind
        self.counts["admitted"] += 1
        if number % 4 == 0:
            replay = await self.ledger.admit(intent, workflow=WORKFLOW, queue="elsewhere", priority=10,
                                             idempotency_key=f"item-{number}", hold=hold)
            if replay.created or replay.run.run_id != run_id or replay.run.queue != QUEUE:
                self.violations.append("a replay created or re-routed a Run")
            self.counts["replays answered with the stored Run"] += 1
        if number % 7 == 0:
            changed = RunIntent(intent.session_id, "demo", "operator", intent.scopes, {"item": number, "changed": True}, None)
            try:
                await self.ledger.admit(changed, workflow=WORKFLOW, queue=QUEUE, priority=50,
                                        idempotency_key=f"item-{number}")
                self.violations.append("a changed replay was accepted")
            except TenureError as error:
                if error.code is not ErrorCode.RUN_ADMISSION_CONFLICT:
                    raise
                self.counts["changed replays refused"] += 1
        if hold:
            await self.ledger.release(run_id, 0)
            self.counts["held admissions released"] += 1
        await self.publish(run_id, 0)
        await self.publish(run_id, 0)  # published again: the broker keeps one job per hop key

    async def hop(self, key: str) -> None:
        _, run_id, seq_text = key.split(":")
        seq = int(seq_text)
        claim = await self.ledger.claim(run_id, seq, node=NODE)
        if claim is None:
            self.violations.append("a published hop could not be claimed")
            return
        self.claimed[(run_id, seq)] += 1
        self.counts["hops claimed"] += 1
        # The broker delivers the same hop again (a redelivery): the ledger skips it.
        if await self.ledger.claim(run_id, seq, node="another-node") is None:
            self.counts["duplicate deliveries skipped"] += 1
        else:
            self.violations.append("a duplicate delivery claimed a hop")
        kind = self.kind_of[run_id]
        if kind != "cancel":
            self.broker.finish(key)
        if claim.resume or kind == "simple":
            await self.ledger.settle(run_id, seq, RunStatus.DONE)
        elif kind == "consent":
            consent = await self.ledger.consents.create(run_id, tool_name="publish", tool_call_id=f"call-{run_id}",
                                                       payload={"target": "site"})
            await self.ledger.park(run_id, seq, kind=WaitKind.CONSENT, owner_id=consent.consent_id)
            verdict = self.chooser.choice([ConsentStatus.GRANTED, ConsentStatus.DENIED])
            await self.ledger.consents.decide(consent.consent_id, verdict, decided_by="reviewer")
            await self.resume(run_id, consent.consent_id, "parked on consent, resumed")
        elif kind == "delegate":
            job = await self.ledger.jobs.submit(run_id, request_id=f"job-{run_id}", runtime="demo-runtime",
                                               profile="default", request={"task": "summarize"})
            await self.ledger.park(run_id, seq, kind=WaitKind.DELEGATE, owner_id=job.job_id)
            await self.ledger.jobs.adopt_result(job.job_id, {"job_id": job.job_id,
                                                            "status": AgentJobStatus.SUCCEEDED.value})
            await self.resume(run_id, job.job_id, "parked on a delegated job, resumed")
        else:
            await self.cancel_while_running(run_id, seq, key)

    async def resume(self, run_id: str, owner_id: str, label: str) -> None:
        seq = await self.ledger.resume(run_id, owner_id=owner_id)
        if seq is None or await self.ledger.resume(run_id, owner_id=owner_id) is not None:
            self.violations.append("a decided owner did not resume its Run exactly once")
            return
        self.counts[label] += 1
        await self.publish(run_id, seq)

    async def cancel_while_running(self, run_id: str, seq: int, key: str) -> None:
        ticket = await self.ledger.begin_cancel(run_id)
        if ticket is None or ticket.enqueue_seq != seq:
            self.violations.append("a cancellation did not freeze the running hop")
            return
        self.broker.fail_aborts = 1
        try:
            await self.ledger.finish_cancel(run_id, seq, self.broker)
            self.violations.append("a cancellation finished while its hop was live")
        except TenureError as error:
            if error.code is not ErrorCode.RUN_CONTAINMENT_UNPROVEN:
                raise
            self.counts["cancellations kept CANCELLING after a failed abort"] += 1
        if await self.ledger.settle(run_id, seq, RunStatus.DONE):
            self.violations.append("a hop settled over a cancellation")
        else:
            self.counts["late settlements refused after cancellation"] += 1
        if await self.ledger.finish_cancel(run_id, seq, self.broker):
            self.counts["cancellations finished after the hop was fenced"] += 1

    async def drain(self) -> None:
        while (key := self.broker.take(QUEUE)) is not None:
            await self.hop(key)

    async def verify(self) -> None:
        ended: collections.Counter[str] = collections.Counter()
        for run_id in self.kind_of:
            record = await self.ledger.get(run_id)
            assert record is not None
            ended[record.status.value] += 1
            expected = RunStatus.CANCELLED if self.kind_of[run_id] == "cancel" else RunStatus.DONE
            if record.status is not expected:
                self.violations.append(f"a {self.kind_of[run_id]} Run ended {record.status.value}")
            for seq in range(record.enqueue_seq + 1):
                delivery = await self.ledger.get_delivery(run_id, seq)
                if delivery is None or delivery.state.value != "settled":
                    self.violations.append("a finished Run kept an unsettled delivery")
        if any(count > 1 for count in self.claimed.values()):
            self.violations.append("a hop was claimed twice")
        self.counts["done"] = ended["done"]
        self.counts["cancelled"] = ended["cancelled"]


async def run_runs_demo(db_url: str, *, runs: int, seed: int, out: TextIO) -> tuple[list[tuple[str, int]], list[str]]:
    """Run the scenario; returns (summary rows, broken invariants)."""
    async with RunLedger(db_url) as ledger:
        demo = _RunsDemo(ledger, seed, out)
        for number in range(runs):
            await demo.admit(number)
        await demo.drain()
        await demo.verify()
    print(f"runs: {runs} workflow Runs admitted, delivered, parked, resumed and cancelled", file=out, flush=True)
    order = [
        "admitted", "replays answered with the stored Run", "changed replays refused", "held admissions released",
        "publish failed, retried under the same key", "acknowledgement lost, retried under the same key",
        "hops claimed", "duplicate deliveries skipped", "parked on consent, resumed",
        "parked on a delegated job, resumed", "cancellations kept CANCELLING after a failed abort",
        "late settlements refused after cancellation", "cancellations finished after the hop was fenced",
        "done", "cancelled",
    ]
    return [(name, demo.counts[name]) for name in order], demo.violations
