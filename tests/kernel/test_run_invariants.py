"""Every invariant and transition rule the Run, consent and delegated-job specs name is tied
to a test that fails if the check stopped detecting it.

For each ``INV-*`` a record that breaks exactly that invariant (and keeps the others) must
be reported; for each ``TR-*`` a decision that breaks that rule must be reported; the
names tested here are exactly the names the spec files list. A last test holds the
ledger to the same checks: a kernel whose decision would break an invariant makes the
ledger raise ``invariant_broken`` and write nothing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import pytest
from spec_tables import read_spec

from tenure.conformance.strategies.agent_jobs import NOW as JOB_NOW
from tenure.conformance.strategies.agent_jobs import job_row, result_for
from tenure.conformance.strategies.consents import NOW as CONSENT_NOW
from tenure.conformance.strategies.consents import consent_row
from tenure.conformance.strategies.runs import NOW, base_run, delivery_for
from tenure.kernel.agent_jobs import machine as job_machine
from tenure.kernel.agent_jobs.commands import AdoptResult, AdvanceJob, RecordCancelled, SubmitJob
from tenure.kernel.agent_jobs.record import record_violations as job_violations
from tenure.kernel.consents import machine as consent_machine
from tenure.kernel.consents.commands import CancelPending, CreateConsent, DecideConsent
from tenure.kernel.consents.machine import DEADLINE_OWNER
from tenure.kernel.consents.record import record_violations as consent_violations
from tenure.kernel.core import Applied
from tenure.kernel.runs import machine as run_machine
from tenure.kernel.runs.commands import (
    Ack,
    Admit,
    BeginCancel,
    Claim,
    Containment,
    FinishCancel,
    Resume,
    Rotate,
    Settle,
    TimeOut,
)
from tenure.kernel.runs.record import RunPair, key_of
from tenure.kernel.runs.record import record_violations as run_violations
from tenure.model import AgentJobStatus, BrokerJobState, ConsentStatus, DeliveryState, RunStatus, WaitKind

D = DeliveryState


def _pair(status: RunStatus = RunStatus.QUEUED, state: DeliveryState = D.PENDING, **run: Any) -> RunPair:
    defaults: dict[str, Any] = {}
    if status not in (RunStatus.QUEUED,) or run.get("enqueue_seq", 0) > 0:
        defaults.update(started_at_us=NOW - 95, node="node-a")
    if status is RunStatus.AWAITING_CONSENT:
        defaults.update(owner_kind=WaitKind.CONSENT, owner_id="consent-1")
    if status is RunStatus.FAILED:
        defaults.update(error="it broke")
    row = base_run(status=status, **{**defaults, **run})
    return RunPair(row, (delivery_for(row, state),))


def _with_delivery(pair: RunPair, **changes: Any) -> RunPair:
    return RunPair(pair.run, (dataclasses.replace(pair.current, **changes),))


def _with_run(pair: RunPair, **changes: Any) -> RunPair:
    return RunPair(dataclasses.replace(pair.run, **changes), pair.deliveries)


def _two(pair: RunPair, first_state: DeliveryState) -> RunPair:
    """The pair with a delivery before its current one, in ``first_state``."""
    run = dataclasses.replace(pair.run, enqueue_seq=1, started_at_us=NOW - 95, node="node-a")
    earlier = delivery_for(dataclasses.replace(run, enqueue_seq=0), first_state)
    return RunPair(run, (earlier, dataclasses.replace(delivery_for(run, D.PENDING), resume=True)))


BROKEN_RUNS: dict[str, Callable[[], RunPair]] = {
    "INV-R1": lambda: _with_run(_pair(), priority=101),
    "INV-R2": lambda: _two(_pair(), D.PENDING),
    "INV-R3": lambda: _pair(RunStatus.RUNNING, D.PENDING),
    "INV-R4": lambda: _pair(RunStatus.RUNNING, D.CLAIMED, owner_kind=WaitKind.CONSENT, owner_id="consent-1"),
    "INV-R5": lambda: _pair(RunStatus.QUEUED, D.PENDING, enqueue_seq=2, started_at_us=None, node=None),
    "INV-R6": lambda: _pair(RunStatus.DONE, D.SETTLED, error="not an error of a done Run"),
    "INV-R7": lambda: _with_delivery(_pair(), delivery_id="run:somewhere-else:0"),
    "INV-R8": lambda: _with_delivery(_pair(RunStatus.QUEUED, D.PUBLISHED), published_at_us=None),
    "INV-R9": lambda: _with_delivery(_pair(), queue="elsewhere"),
    # a cancellation for a deadline the Run never had
    "INV-R10": lambda: _pair(RunStatus.CANCELLED, D.SETTLED, error="timeout"),
}

BROKEN_CONSENTS: dict[str, Callable[[], Any]] = {
    "INV-C1": lambda: consent_row(tool_name=""),
    "INV-C2": lambda: consent_row(status=ConsentStatus.GRANTED),
    "INV-C3": lambda: consent_row(preauthorized_by="policy-1"),
}

BROKEN_JOBS: dict[str, Callable[[], Any]] = {
    "INV-J1": lambda: job_row(runtime=""),
    "INV-J2": lambda: job_row(status=AgentJobStatus.SUCCEEDED),
    "INV-J3": lambda: job_row(updated_at_us=JOB_NOW - 10_000_000),
}


def _spec_names(machine: str, prefix: str) -> set[str]:
    return set(re.findall(rf"\*\*({prefix}\d+)\*\*", read_spec(machine)))


@pytest.mark.parametrize(("machine", "prefix", "broken"), [
    ("runs", "INV-R", BROKEN_RUNS), ("consent", "INV-C", BROKEN_CONSENTS), ("agent_jobs", "INV-J", BROKEN_JOBS),
])
def test_every_record_invariant_the_spec_lists_has_a_breaking_record_here(machine: str, prefix: str,
                                                                         broken: dict[str, Any]) -> None:
    assert set(broken) == _spec_names(machine, prefix)


def test_the_valid_records_the_breaking_ones_start_from_keep_every_invariant() -> None:
    for pair in (_pair(), _pair(RunStatus.RUNNING, D.CLAIMED), _pair(RunStatus.QUEUED, D.PUBLISHED),
                 _pair(RunStatus.DONE, D.SETTLED), _pair(RunStatus.CANCELLED, D.SETTLED, error="timeout",
                                                         deadline_us=NOW)):
        assert run_violations(pair) == []
    assert consent_violations(consent_row()) == []
    assert job_violations(job_row()) == []


@pytest.mark.parametrize("name", sorted(BROKEN_RUNS))
def test_a_run_breaking_one_invariant_is_reported_by_that_name(name: str) -> None:
    broken = run_violations(BROKEN_RUNS[name]())
    assert any(entry == name or entry.startswith(name + ".") for entry in broken), broken


@pytest.mark.parametrize("name", sorted(BROKEN_CONSENTS))
def test_a_consent_breaking_one_invariant_is_reported_by_that_name(name: str) -> None:
    broken = consent_violations(BROKEN_CONSENTS[name]())
    assert any(entry == name or entry.startswith(name + ".") for entry in broken), broken


@pytest.mark.parametrize("name", sorted(BROKEN_JOBS))
def test_a_job_breaking_one_invariant_is_reported_by_that_name(name: str) -> None:
    broken = job_violations(BROKEN_JOBS[name]())
    assert any(entry == name or entry.startswith(name + ".") for entry in broken), broken


# --- transition rules: a decision that breaks each one ---------------------------------------

_QUEUED = _pair()
_RUNNING = _pair(RunStatus.RUNNING, D.CLAIMED)
_WAITING = _pair(RunStatus.AWAITING_CONSENT, D.SETTLED)
_CANCELLING = _pair(RunStatus.CANCELLING, D.CLAIMED)
_OPEN = Containment(open_jobs=1, open_attempts=0)
_NONE_OPEN = Containment(open_jobs=0, open_attempts=0)


def _admit(hold: bool = False, busy: bool = False) -> Admit:
    return Admit(run=_QUEUED.run, delivery=_QUEUED.current, hold=hold, session_busy=busy)


BROKEN_RUN_RULES: dict[str, tuple[RunPair | None, Any, RunPair | None]] = {
    # (met record, command, the record a broken kernel would decide)
    "TR-R1": (_QUEUED, Claim(enqueue_seq=0, node="node-a"),
              _with_run(_pair(RunStatus.RUNNING, D.CLAIMED), principal="mallory")),
    "TR-R2": (_QUEUED, Claim(enqueue_seq=0, node="node-a"), _with_run(_two(_pair(), D.SETTLED), status=RunStatus.QUEUED)),
    "TR-R3": (_pair(RunStatus.DONE, D.SETTLED), BeginCancel(), _pair(RunStatus.CANCELLING, D.SETTLED)),
    "TR-R4": (_WAITING, BeginCancel(), _pair(RunStatus.RUNNING, D.CLAIMED)),
    "TR-R5": (_pair(RunStatus.QUEUED, D.PENDING, enqueue_seq=1, started_at_us=NOW - 95, node="node-a"),
              Claim(enqueue_seq=1, node="node-b"),
              _pair(RunStatus.RUNNING, D.CLAIMED, enqueue_seq=1, started_at_us=NOW, node="node-b")),
    "TR-R6": (_WAITING, Resume(owner_id="consent-1", owner=None), _pair(RunStatus.AWAITING_DELEGATE, D.SETTLED,
                                                                         owner_kind=WaitKind.DELEGATE, owner_id="job-1")),
    "TR-R7": (_CANCELLING, FinishCancel(enqueue_seq=0, hop=BrokerJobState.ACTIVE, containment=_NONE_OPEN),
              _pair(RunStatus.CANCELLED, D.SETTLED)),
    "TR-R8": (None, _admit(busy=True), _QUEUED),
    # a rotation of a fresh hop that opens a resumed one (the mode guessed, not kept)
    "TR-R9": (_QUEUED, Rotate(enqueue_seq=0, hop=BrokerJobState.COMPLETE), _two(_pair(), D.SETTLED)),
    # a claim that counts a retry of a lost hop
    "TR-R10": (_with_run(_QUEUED, max_hop_retries=1), Claim(enqueue_seq=0, node="node-a"),
               _with_run(_pair(RunStatus.RUNNING, D.CLAIMED), max_hop_retries=1, hop_retries=1)),
    # a timeout elected a microsecond before the deadline
    "TR-R11": (_with_run(_RUNNING, deadline_us=NOW + 1), TimeOut(),
               _pair(RunStatus.CANCELLING, D.CLAIMED, deadline_us=NOW + 1, error="timeout")),
}


def test_every_transition_rule_the_spec_lists_has_a_breaking_decision_here() -> None:
    assert set(BROKEN_RUN_RULES) == _spec_names("runs", "TR-R")


@pytest.mark.parametrize("name", sorted(BROKEN_RUN_RULES))
def test_a_run_decision_breaking_one_transition_rule_is_reported_by_that_name(name: str) -> None:
    record, command, decided = BROKEN_RUN_RULES[name]
    assert name in run_machine.transition_violations(record, command, NOW, Applied(decided, Ack()))


def test_settlement_without_containment_breaks_tr_r7_and_with_it_does_not() -> None:
    done = _pair(RunStatus.DONE, D.SETTLED)
    unproven = Settle(enqueue_seq=0, status=RunStatus.DONE, error=None, containment=_OPEN)
    proven = Settle(enqueue_seq=0, status=RunStatus.DONE, error=None, containment=_NONE_OPEN)
    assert "TR-R7" in run_machine.transition_violations(_RUNNING, unproven, NOW, Applied(done, Ack()))
    assert run_machine.transition_violations(_RUNNING, proven, NOW, Applied(done, Ack())) == []


_PENDING_CONSENT = consent_row()
_GRANTED = consent_row(status=ConsentStatus.GRANTED, decided_by="bob", decided_at_us=CONSENT_NOW - 50)

BROKEN_CONSENT_RULES: dict[str, tuple[Any, Any, Any]] = {
    "TR-C1": (None, CreateConsent(row=_PENDING_CONSENT, run_running=False), _PENDING_CONSENT),
    "TR-C2": (_GRANTED, DecideConsent(verdict=ConsentStatus.DENIED, decided_by="carol"),
              dataclasses.replace(_GRANTED, status=ConsentStatus.DENIED, decided_by="carol")),
    "TR-C3": (_PENDING_CONSENT, DecideConsent(verdict=ConsentStatus.DENIED, decided_by="bob"),
              dataclasses.replace(_PENDING_CONSENT, status=ConsentStatus.CANCELLED, decided_by="bob",
                                  decided_at_us=CONSENT_NOW)),
    # the deadline owner's expiry a microsecond before the consent's deadline
    "TR-C4": (dataclasses.replace(_PENDING_CONSENT, expires_at_us=CONSENT_NOW + 1),
              DecideConsent(verdict=ConsentStatus.EXPIRED, decided_by=DEADLINE_OWNER),
              dataclasses.replace(_PENDING_CONSENT, status=ConsentStatus.EXPIRED, decided_by=DEADLINE_OWNER,
                                  decided_at_us=CONSENT_NOW, expires_at_us=CONSENT_NOW + 1)),
}

_RUNNING_JOB = job_row(status=AgentJobStatus.RUNNING, runtime_job_id="runtime-1")
_SUCCEEDED_JOB = dataclasses.replace(_RUNNING_JOB, status=AgentJobStatus.SUCCEEDED,
                                     result_json=result_for(AgentJobStatus.SUCCEEDED, _RUNNING_JOB.job_id))

BROKEN_JOB_RULES: dict[str, tuple[Any, Any, Any]] = {
    "TR-J1": (None, SubmitJob(row=job_row(), run_running=False), job_row()),
    "TR-J2": (_SUCCEEDED_JOB, AdoptResult(status=AgentJobStatus.FAILED, result_json="{}"),
              dataclasses.replace(_SUCCEEDED_JOB, status=AgentJobStatus.FAILED)),
    "TR-J3": (_RUNNING_JOB, AdvanceJob(status=AgentJobStatus.RUNNING, runtime_job_id="runtime-2"),
              dataclasses.replace(_RUNNING_JOB, runtime_job_id="runtime-2")),
}


@pytest.mark.parametrize(("machine", "prefix", "broken"), [
    ("consent", "TR-C", BROKEN_CONSENT_RULES), ("agent_jobs", "TR-J", BROKEN_JOB_RULES),
])
def test_every_owner_transition_rule_the_spec_lists_has_a_breaking_decision_here(machine: str, prefix: str,
                                                                                broken: dict[str, Any]) -> None:
    assert set(broken) == _spec_names(machine, prefix)


@pytest.mark.parametrize("name", sorted(BROKEN_CONSENT_RULES))
def test_a_consent_decision_breaking_one_transition_rule_is_reported_by_that_name(name: str) -> None:
    record, command, decided = BROKEN_CONSENT_RULES[name]
    assert name in consent_machine.transition_violations(record, command, CONSENT_NOW, Applied(decided, None))


@pytest.mark.parametrize("name", sorted(BROKEN_JOB_RULES))
def test_a_job_decision_breaking_one_transition_rule_is_reported_by_that_name(name: str) -> None:
    record, command, decided = BROKEN_JOB_RULES[name]
    assert name in job_machine.transition_violations(record, command, JOB_NOW, Applied(decided, None))


def test_the_sweep_and_the_containment_commands_break_no_rule_when_they_apply() -> None:
    swept = consent_machine.CONSENTS.decide(_PENDING_CONSENT, CancelPending(decided_by="tenure:run-settled"), CONSENT_NOW)
    assert isinstance(swept, Applied)
    assert consent_machine.transition_violations(_PENDING_CONSENT, CancelPending(decided_by="x"), CONSENT_NOW,
                                                 swept) == []
    lost = dataclasses.replace(_RUNNING_JOB, status=AgentJobStatus.LOST,
                               result_json=result_for(AgentJobStatus.LOST, _RUNNING_JOB.job_id))
    contained = job_machine.AGENT_JOBS.decide(lost, RecordCancelled(result_json=result_for(AgentJobStatus.CANCELLED, lost.job_id)),
                                   JOB_NOW)
    assert isinstance(contained, Applied) and contained.new_record.status is AgentJobStatus.CANCELLED
    assert job_machine.transition_violations(lost, RecordCancelled(result_json="{}"), JOB_NOW, contained) == []


# --- the ledger holds decisions to the same checks ------------------------------------------


def test_a_kernel_decision_breaking_an_invariant_makes_the_ledger_raise_and_write_nothing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from tenure.adapters import InMemoryBroker, RunLedger, upgrade
    from tenure.model import RunIntent, TenureError, WorkflowPin

    async def scenario() -> None:
        url = f"sqlite:///{tmp_path}/runs.db"
        await upgrade(url)
        async with RunLedger(url) as ledger:
            admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}, None),
                                           workflow=WorkflowPin("w", "1", "d"), queue="runs", priority=50)
            run_id = admission.run.run_id
            await ledger.publish(run_id, 0, InMemoryBroker())
            claim = run_machine.EFFECTS["claim"]

            def claim_without_node(record: Any, command: Any, now_us: int) -> Any:
                decided = claim(record, command, now_us)  # a claim that forgets who claimed (INV-R5/R8)
                return Applied(_with_run(decided.new_record, node=None), decided.reply)

            monkeypatch.setitem(run_machine.EFFECTS, "claim", claim_without_node)
            with pytest.raises(TenureError) as caught:
                await ledger.claim(run_id, 0, node="node-a")
            assert (caught.value.code.value, caught.value.reason) == ("run_persistence_failed", "invariant_broken")
            monkeypatch.undo()
            stored = await ledger.get(run_id)
            delivery = await ledger.get_delivery(run_id, 0)
            assert stored is not None and stored.status is RunStatus.QUEUED and stored.node is None
            assert delivery is not None and delivery.state is DeliveryState.PUBLISHED
            assert key_of(run_id, 0) == f"run:{run_id}:0"

    asyncio.run(scenario())
