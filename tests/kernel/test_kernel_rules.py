"""The kernel's named rules that adapters ask instead of comparing states themselves
(``tests/adapters/core/test_floor_plan.py`` forbids the comparisons), each held to the specification in
words, over every status."""

from __future__ import annotations

import dataclasses

import pytest

from tenure.conformance.strategies.runs import base_run
from tenure.kernel.agent_jobs.record import AgentJobRow, job_complete
from tenure.kernel.attempts.record import is_terminal as attempt_is_terminal
from tenure.kernel.consents.record import ConsentRow
from tenure.kernel.recovery.table import LOST_ERROR, Evidence, evidence_for, latest_owner, lost_and_retryable
from tenure.kernel.runs.commands import Admitted, Settled, Swept, Ticket
from tenure.kernel.runs.machine import consent_sweep, owner_decided
from tenure.kernel.runs.record import cancel_frozen_at, hop_holds, is_terminal, opens_owners, operator_cancelled
from tenure.model import AgentJobStatus, AttemptState, ConsentStatus, RunStatus, WaitKind, canonical_json


@pytest.mark.parametrize("status", list(RunStatus))
def test_the_run_rules_over_every_status(status: RunStatus) -> None:
    run = base_run(status=status, enqueue_seq=3)
    executing = status in (RunStatus.RUNNING, RunStatus.AWAITING_HARDWARE)
    assert hop_holds(run, 3) is executing
    assert hop_holds(run, 2) is False and hop_holds(run, 4) is False
    assert opens_owners(run) is (status is RunStatus.RUNNING)
    assert is_terminal(run) is (status in (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED))
    assert cancel_frozen_at(run, 3) is (status is RunStatus.CANCELLING)
    assert cancel_frozen_at(run, 2) is False
    assert operator_cancelled(run) is (status in (RunStatus.CANCELLING, RunStatus.CANCELLED))


@pytest.mark.parametrize("status", list(RunStatus))
def test_only_a_run_failed_lost_is_retryable(status: RunStatus) -> None:
    assert lost_and_retryable(base_run(status=status, error=LOST_ERROR)) is (status is RunStatus.FAILED)
    assert lost_and_retryable(base_run(status=status, error="boom")) is False


def test_the_evidence_a_visit_reads_by_status() -> None:
    for status in RunStatus:
        needs = evidence_for(status)
        waiting = status.value.startswith("awaiting_") and status is not RunStatus.AWAITING_HARDWARE
        assert (Evidence.OWNER in needs) is waiting, status
        assert (Evidence.CLOCK in needs) is (status is RunStatus.AWAITING_TIMER), status
        executing = status in (RunStatus.RUNNING, RunStatus.AWAITING_HARDWARE)
        assert (Evidence.CONTAINMENT in needs) is (executing or status is RunStatus.CANCELLING), status
        assert (Evidence.LATEST_OWNER in needs) is executing, status


def _consent(consent_id: str, created: int, status: ConsentStatus) -> ConsentRow:
    decided = status is not ConsentStatus.PENDING
    return ConsentRow(consent_id=consent_id, run_id="r", tool_name="t", tool_call_id="c", payload_json="{}",
                      status=status, decided_by="x" if decided else None, decided_at_us=created if decided else None,
                      preauthorized_by=None, created_at_us=created)


def _job(job_id: str, created: int, status: AgentJobStatus, result: object = None) -> AgentJobRow:
    return AgentJobRow(job_id=job_id, request_id="q" + job_id, run_id="r", runtime="rt", profile="p",
                       request_json="{}", status=status,
                       result_json=None if result is None else canonical_json(result), runtime_job_id=None,
                       created_at_us=created, updated_at_us=created)


def test_the_latest_owner_is_the_newest_not_cancelled_with_ties_in_kind_order() -> None:
    assert latest_owner([], [], []) is None
    consents = [_consent("c1", 10, ConsentStatus.PENDING), _consent("c2", 30, ConsentStatus.CANCELLED)]
    jobs = [_job("j1", 20, AgentJobStatus.QUEUED)]
    assert latest_owner(consents, jobs, []) == (WaitKind.DELEGATE, "j1")  # c2 is newer but cancelled
    tied = [_consent("c3", 20, ConsentStatus.GRANTED)]
    # Same instant: consent (0) before job (1), so the job, the larger in kind order, wins.
    assert latest_owner(tied, jobs, []) == (WaitKind.DELEGATE, "j1")
    assert latest_owner([_consent("c4", 40, ConsentStatus.CANCELLED)], [], []) is None


def test_the_consent_sweep_follows_terminal_truth_only() -> None:
    assert consent_sweep(Settled(decided_by="tenure:run-settled")) == "tenure:run-settled"
    assert consent_sweep(Swept(decided_by="tenure:run-cancelled")) == "tenure:run-cancelled"
    assert consent_sweep(Ticket(enqueue_seq=0, already_cancelled=False)) is None
    assert consent_sweep(Admitted(created=True)) is None
    assert consent_sweep(None) is None


def test_an_owner_is_decided_by_its_kinds_end_states() -> None:
    assert owner_decided(WaitKind.CONSENT, ConsentStatus.GRANTED.value)
    assert not owner_decided(WaitKind.CONSENT, ConsentStatus.PENDING.value)
    assert owner_decided(WaitKind.DELEGATE, AgentJobStatus.SUCCEEDED.value)
    assert not owner_decided(WaitKind.DELEGATE, AgentJobStatus.RUNNING.value)
    assert owner_decided(WaitKind.SERVICE, AttemptState.SUCCEEDED.value)
    assert not owner_decided(WaitKind.SERVICE, AttemptState.INDETERMINATE.value)
    assert not owner_decided(WaitKind.TIMER, "anything")
    assert not owner_decided(None, ConsentStatus.GRANTED.value)


@dataclasses.dataclass
class _Attempt:
    state: AttemptState


def test_an_attempt_is_terminal_exactly_in_its_end_states() -> None:
    ends = {AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELLED}
    for state in AttemptState:
        assert attempt_is_terminal(_Attempt(state)) is (state in ends), state


def test_a_job_is_complete_only_with_a_terminal_status_and_its_own_result() -> None:
    assert not job_complete(_job("j", 1, AgentJobStatus.RUNNING))
    assert not job_complete(_job("j", 1, AgentJobStatus.SUCCEEDED))  # no result stored
    assert job_complete(_job("j", 1, AgentJobStatus.SUCCEEDED, {"job_id": "j", "status": "succeeded"}))
    assert not job_complete(_job("j", 1, AgentJobStatus.SUCCEEDED, {"job_id": "other", "status": "succeeded"}))
    broken = dataclasses.replace(_job("j", 1, AgentJobStatus.SUCCEEDED), result_json="{not json")
    assert not job_complete(broken)


def test_a_machine_is_refused_at_definition_when_a_row_names_what_is_not_declared() -> None:
    import dataclasses as dc

    from tenure.kernel.consents import machine as consents

    declared = {field.name: getattr(consents.CONSENTS, field.name) for field in dc.fields(consents.CONSENTS)
                if field.init}  # not the compiled deciders' cache
    declared.pop("table")
    rebuilt = type(consents.CONSENTS).define(**declared)
    assert rebuilt.table == consents.CONSENTS.table
    guard = consents.ROWS[0].guard
    with pytest.raises(ValueError, match="is not declared"):
        type(consents.CONSENTS).define(**{**declared, "guards": {k: v for k, v in declared["guards"].items() if k != guard}})
    command = consents.ROWS[0].command
    with pytest.raises(ValueError, match="not total"):  # one command's rows left out
        type(consents.CONSENTS).define(**{**declared, "rows": tuple(row for row in declared["rows"]
                                                                    if row.command is not command)})
    refusal = next(row.outcome for row in consents.ROWS if not isinstance(row.outcome, str))
    with pytest.raises(ValueError, match="has no outcome"):
        type(consents.CONSENTS).define(**{**declared, "outcomes": {k: v for k, v in declared["outcomes"].items()
                                                                    if k != refusal}})
