"""Invalid requests raise ConfigValidationError, and no message echoes what was supplied."""

from __future__ import annotations

import datetime as dt
import pickle
import traceback
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenure.adapters.runs.ledger import expire_due_consents, time_out_due_receives
from tenure.model import (
    ConfigValidationError,
    ErrorCode,
    PipelineJob,
    QueueClaimFence,
    QueueKind,
    StreamingJob,
    TenureError,
    ValidationJob,
    WorkerConfig,
    check_pid,
    snapshot_submission,
)

markers = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=6, max_size=10).map(
    lambda tail: "SECRET" + tail
)


def _strings_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in _strings_in(key) + _strings_in(item)]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in _strings_in(item)]
    return []


def assert_refused_without_echo(build: Any, supplied: dict[str, Any]) -> ConfigValidationError:
    with pytest.raises(ConfigValidationError) as caught:
        build()
    error = caught.value
    assert error.code is ErrorCode.CONFIG
    rendered = "\n".join(
        [str(error), repr(error), *map(str, error.args), *traceback.format_exception_only(error)]
    )
    for text in _strings_in(list(supplied.values())):
        if len(text) >= 6:
            assert text not in rendered
            assert text[:40] not in rendered
    assert error.__context__ is None and error.__cause__ is None
    return error


def valid_validation(marker: str) -> dict[str, Any]:
    return dict(
        contract_name=marker + "c", contract_version="1", data_source=marker + "-source",
        options={marker: "value"}, job_id=marker[:30], idempotency_key=marker + "-key",
    )


invalid_validation_changes = st.sampled_from([
    ("contract_name", lambda m: ""),
    ("contract_name", lambda m: m * 40),
    ("contract_version", lambda m: m * 10),
    ("data_source", lambda m: 7),
    ("options", lambda m: {m: float("nan")}),
    ("options", lambda m: {m: [1, float("inf")]}),
    ("options", lambda m: {m: (1, 2)}),
    ("options", lambda m: {m: {1: "int key"}}),
    ("options", lambda m: [m]),
    ("options", lambda m: {m: 2**64}),
    ("options", lambda m: {m: m + "\x00"}),
    ("options", lambda m: {m: "\ud800"}),
    ("job_id", lambda m: m * 5),
    ("job_id", lambda m: ""),
    ("fires_at", lambda m: dt.datetime(2030, 1, 1)),
    ("fires_at", lambda m: dt.date(2030, 1, 1)),
    ("fires_at", lambda m: m),
    ("idempotency_key", lambda m: m * 30),
    ("max_attempts", lambda m: True),
    ("max_attempts", lambda m: 0),
    ("max_attempts", lambda m: 2**31),
    ("max_attempts", lambda m: 3.0),
])


@given(marker=markers, change=invalid_validation_changes)
def test_invalid_validation_jobs_are_refused_without_echo(marker: str, change: Any) -> None:
    field, bad = change
    fields = valid_validation(marker)
    fields[field] = bad(marker)
    error = assert_refused_without_echo(lambda: ValidationJob(**fields), fields)
    assert field in error.fields


invalid_pipeline_changes = st.sampled_from([
    ("config", lambda m: None),
    ("config", lambda m: {m: float("-inf")}),
    ("variables", lambda m: {m: 5}),
    ("variables", lambda m: {m: None}),
    ("variables", lambda m: [m]),
    ("fail_fast", lambda m: 1),
    ("run_id", lambda m: m * 4),
    ("job_id", lambda m: m * 4),
])


@given(marker=markers, change=invalid_pipeline_changes)
def test_invalid_pipeline_jobs_are_refused_without_echo(marker: str, change: Any) -> None:
    field, bad = change
    fields: dict[str, Any] = dict(config={marker: 1}, variables={marker: marker}, run_id=marker[:30])
    fields[field] = bad(marker)
    error = assert_refused_without_echo(lambda: PipelineJob(**fields), fields)
    assert field in error.fields


invalid_streaming_changes = st.sampled_from([
    ("config_name", lambda m: m * 60),
    ("config_version", lambda m: m * 7),
    ("variables", lambda m: {m: 1.5}),
    ("force", lambda m: "yes"),
    ("force", lambda m: 0),
    ("max_attempts", lambda m: False),
])


@given(marker=markers, change=invalid_streaming_changes)
def test_invalid_streaming_jobs_are_refused_without_echo(marker: str, change: Any) -> None:
    field, bad = change
    fields: dict[str, Any] = dict(config_name=marker, config_version="1", variables={marker: marker})
    fields[field] = bad(marker)
    error = assert_refused_without_echo(lambda: StreamingJob(**fields), fields)
    assert field in error.fields


invalid_fence_changes = st.sampled_from([
    ("queue", lambda m: "validation"),
    ("job_id", lambda m: m * 5),
    ("job_id", lambda m: ""),
    ("owner_id", lambda m: m * 30),
    ("owner_id", lambda m: ""),
    ("owner_id", lambda m: None),
    ("generation", lambda m: True),
    ("generation", lambda m: 0),
    ("generation", lambda m: 2**63),
    ("generation", lambda m: 1.0),
    ("claim_token", lambda m: m * 30),
    ("claim_token", lambda m: m.encode()),
    ("claim_token", lambda m: m + "\x00"),
])


@given(marker=markers, change=invalid_fence_changes)
def test_invalid_fences_are_refused_without_echo(marker: str, change: Any) -> None:
    field, bad = change
    fields: dict[str, Any] = dict(
        queue=QueueKind.STREAMING, job_id=marker[:30], owner_id=marker + "-owner", generation=1, claim_token=marker + "-token"
    )
    fields[field] = bad(marker)
    error = assert_refused_without_echo(lambda: QueueClaimFence(**fields), fields)
    assert field in error.fields


@given(marker=markers, change=st.sampled_from([
    ("lease_seconds", lambda m: 0),
    ("lease_seconds", lambda m: float("nan")),
    ("lease_seconds", lambda m: True),
    ("heartbeat_seconds", lambda m: 300),
    ("backoff_base_ms", lambda m: -1),
    ("backoff_max_ms", lambda m: 10),
    ("max_attempts", lambda m: 0),
]))
def test_invalid_worker_configs_never_echo_the_database_url(marker: str, change: Any) -> None:
    field, bad = change
    db_url = f"postgresql://user:{marker}@host/{marker}"
    settings = {field: bad(marker)}
    error = assert_refused_without_echo(lambda: WorkerConfig(db_url, **settings), {"db_url": db_url})
    assert error.fields


def test_a_worker_config_never_prints_its_database_url() -> None:
    config = WorkerConfig("postgresql://user:SECRETpassword@host/db", lease_seconds=0.5, heartbeat_seconds=0.1)
    assert "SECRETpassword" not in repr(config) and "SECRETpassword" not in str(config)
    assert config.lease_us == 500_000


def test_a_fence_never_prints_its_token() -> None:
    fence = QueueClaimFence(QueueKind.VALIDATION, "job-1", "worker-a", 3, "SECRETtoken")
    assert "SECRETtoken" not in repr(fence) and "SECRETtoken" not in str(fence)
    assert "worker-a" in repr(fence)


@pytest.mark.parametrize("pid", [0, -1, 2**31, True, 1.0, "12"])
def test_invalid_pids_are_refused(pid: Any) -> None:
    with pytest.raises(ConfigValidationError):
        check_pid(pid)


def test_deeply_nested_json_is_refused_instead_of_exhausting_the_stack() -> None:
    value: Any = "SECRETleaf"
    for _ in range(10_000):
        value = [value]
    assert_refused_without_echo(
        lambda: ValidationJob("c", "1", "s", options={"deep": value}), {"leaf": "SECRETleaf"}
    )


def test_a_snapshot_of_a_wrong_envelope_type_does_not_echo_it() -> None:
    job = ValidationJob("SECRETname", "1", "SECRETsource")
    assert_refused_without_echo(
        lambda: snapshot_submission(QueueKind.STREAMING, job, "SECRETsubmission"),
        {"values": ["SECRETname", "SECRETsource", "SECRETsubmission"]},
    )


def test_errors_survive_pickling_with_code_reason_and_fields() -> None:
    error = ConfigValidationError("invalid_validation_job", fields=("options",), problems=("json_not_finite",))
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.code, copy.reason, copy.fields, copy.problems) == (error.code, error.reason, error.fields, error.problems)
    plain = pickle.loads(pickle.dumps(TenureError(ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused")))
    assert (plain.code, plain.reason) == (ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused")


def test_a_reason_must_be_an_authored_word() -> None:
    with pytest.raises(AssertionError):
        TenureError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "could not connect to postgresql://u:p@h")


# --- the Run ledger: every method refuses bad input before any database work --------------------

RUN_MARKER = "SECRETrunvalue7"
RUN_ID = "6f1c0a52-3a51-5b8e-9d0f-6a7c1b2d3e4f"


def _run_intent(**changes: Any) -> Any:
    from tenure.model import RunIntent

    fields: dict[str, Any] = dict(session_id="session-1", source="api", principal="alice",
                                  scopes=frozenset({"files:read"}), payload={"task": "x"}, requested_priority=None)
    fields.update(changes)
    return RunIntent(**fields)


def _admit(ledger: Any, **changes: Any) -> Any:
    from tenure.model import WorkflowPin

    arguments: dict[str, Any] = dict(workflow=WorkflowPin("review", "rev-1", "sha256:" + "a" * 64), queue="agents",
                                     priority=50)
    intent = changes.pop("intent", None) or _run_intent()
    arguments.update(changes)
    return ledger.admit(intent, **arguments)


def _run_ledger_cases() -> list[tuple[str, str, Any]]:
    """(method, the field the refusal names, the call) for every RunLedger method."""
    from tenure.model import AgentJobStatus, ConsentStatus, RunStatus, WaitKind

    m = RUN_MARKER
    seqs = [-1, True, 2**31, "0", 1.0, None]
    cases: list[tuple[str, str, Any]] = [
        ("admit", "intent", lambda ledger: ledger.admit(m, workflow=None, queue="q", priority=1)),
        ("admit", "workflow", lambda ledger: _admit(ledger, workflow=m)),
        ("admit", "queue", lambda ledger: _admit(ledger, queue=m * 5)),
        ("admit", "queue", lambda ledger: _admit(ledger, queue="")),
        ("admit", "queue", lambda ledger: _admit(ledger, queue=m + "\x00")),
        ("admit", "priority", lambda ledger: _admit(ledger, priority=True)),
        ("admit", "priority", lambda ledger: _admit(ledger, priority=101)),
        ("admit", "priority", lambda ledger: _admit(ledger, priority=m)),
        ("admit", "idempotency_key", lambda ledger: _admit(ledger, idempotency_key=m * 20)),
        ("admit", "idempotency_key", lambda ledger: _admit(ledger, idempotency_key="")),
        ("admit", "hold", lambda ledger: _admit(ledger, hold=m)),
        ("admit", "session_fence", lambda ledger: _admit(ledger, session_fence=1)),
        ("admit", "session_fence", lambda ledger: _admit(ledger, intent=_run_intent(session_id=None), session_fence=True)),
        ("admit", "payload", lambda ledger: _admit(ledger, intent=_run_intent(payload={m: "x" * (1024 * 1024)}))),
        ("release", "run_id", lambda ledger: ledger.release(m * 3, 0)),
        ("release", "run_id", lambda ledger: ledger.release(7, 0)),
        ("fail_held", "error", lambda ledger: ledger.fail_held(RUN_ID, 0, error="")),
        ("fail_held", "error", lambda ledger: ledger.fail_held(RUN_ID, 0, error=m * 1200)),
        ("claim", "node", lambda ledger: ledger.claim(RUN_ID, 0, node=m * 9)),
        ("claim", "node", lambda ledger: ledger.claim(RUN_ID, 0, node=None)),
        ("claim_served", "serves", lambda ledger: ledger.claim_served(RUN_ID, 0, node="node-a", serves="answer")),
        ("claim_served", "serves", lambda ledger: ledger.claim_served(RUN_ID, 0, node="node-a", serves=[("answer",)])),
        ("claim_served", "serves", lambda ledger: ledger.claim_served(RUN_ID, 0, node="node-a", serves=[(7, "1")])),
        ("claim_served", "serves", lambda ledger: ledger.claim_served(RUN_ID, 0, node="node-a", serves=[("a" * 101, "1")])),
        ("claim_served", "node", lambda ledger: ledger.claim_served(RUN_ID, 0, node=None, serves=None)),
        ("park", "kind", lambda ledger: ledger.park(RUN_ID, 0, kind=m, owner_id="consent-1")),
        ("park", "kind", lambda ledger: ledger.park(RUN_ID, 0, kind=WaitKind.HARDWARE, owner_id="consent-1")),
        ("park", "owner_id", lambda ledger: ledger.park(RUN_ID, 0, kind=WaitKind.CONSENT, owner_id=m * 9)),
        ("park", "kind", lambda ledger: ledger.park(RUN_ID, 0, kind=WaitKind.TIMER, owner_id="sleep:0")),
        ("park_timer", "name", lambda ledger: ledger.park_timer(RUN_ID, 0, name=m * 9, delay_s=1)),
        ("park_timer", "name", lambda ledger: ledger.park_timer(RUN_ID, 0, name="", delay_s=1)),
        ("park_timer", "state", lambda ledger: ledger.park_timer(RUN_ID, 0, name="t", delay_s=1, state={m: {1}})),
        ("park_timer", "wake_at", lambda ledger: ledger.park_timer(RUN_ID, 0, name="t")),
        ("park_timer", "wake_at", lambda ledger: ledger.park_timer(RUN_ID, 0, name="t", delay_s=1, wake_at=_aware())),
        ("park_timer", "wake_at", lambda ledger: ledger.park_timer(RUN_ID, 0, name="t",
                                                                   wake_at=_aware().replace(tzinfo=None))),
        ("park_timer", "wake_at", lambda ledger: ledger.park_timer(RUN_ID, 0, name="t", wake_at=m)),
        ("park_timer", "delay_s", lambda ledger: ledger.park_timer(RUN_ID, 0, name="t", delay_s=-1)),
        ("park_timer", "delay_s", lambda ledger: ledger.park_timer(RUN_ID, 0, name="t", delay_s=float("nan"))),
        ("park_timer", "delay_s", lambda ledger: ledger.park_timer(RUN_ID, 0, name="t", delay_s=True)),
        ("park_timer", "delay_s", lambda ledger: ledger.park_timer(RUN_ID, 0, name="t", delay_s=10**9)),
        ("park_timer", "run_id", lambda ledger: ledger.park_timer(m * 3, 0, name="t", delay_s=1)),
        ("resume", "owner_id", lambda ledger: ledger.resume(RUN_ID, owner_id="")),
        ("resume", "run_id", lambda ledger: ledger.resume(m * 3, owner_id="consent-1")),
        ("settle", "status", lambda ledger: ledger.settle(RUN_ID, 0, m)),
        ("settle", "result", lambda ledger: ledger.settle(RUN_ID, 0, RunStatus.DONE, result=[m])),
        ("settle", "result", lambda ledger: ledger.settle(RUN_ID, 0, RunStatus.FAILED, error="x", result={m: 1})),
        ("settle", "result", lambda ledger: ledger.settle(RUN_ID, 0, RunStatus.DONE, result={m: "x" * (1024 * 1024)})),
        ("engine.settle", "outcome", lambda ledger: ledger.engine.settle(RUN_ID, m)),
        ("retry", "run_id", lambda ledger: ledger.retry(m * 3)),
        ("retry", "run_id", lambda ledger: ledger.retry(7)),
        ("settle", "status", lambda ledger: ledger.settle(RUN_ID, 0, RunStatus.CANCELLED)),
        ("settle", "error", lambda ledger: ledger.settle(RUN_ID, 0, RunStatus.FAILED)),
        ("settle", "error", lambda ledger: ledger.settle(RUN_ID, 0, RunStatus.DONE, error=m)),
        ("begin_cancel", "run_id", lambda ledger: ledger.begin_cancel(m * 3)),
        ("time_out", "run_id", lambda ledger: ledger.time_out(m * 3)),
        ("get", "run_id", lambda ledger: ledger.get(m * 3)),
        ("list_runs", "status", lambda ledger: ledger.list_runs(status=m)),
        ("list_runs", "session_id", lambda ledger: ledger.list_runs(session_id=m * 9)),
        ("list_runs", "limit", lambda ledger: ledger.list_runs(limit=0)),
        ("list_runs", "limit", lambda ledger: ledger.list_runs(limit=True)),
        ("list_runs", "after", lambda ledger: ledger.list_runs(after=m)),
        ("list_runs", "after", lambda ledger: ledger.list_runs(after=f"\u00b2:{m}")),
        ("list_runs", "after", lambda ledger: ledger.list_runs(after=f"--5:{m}")),
        ("list_runs", "after", lambda ledger: ledger.list_runs(after="9" * 5000 + f":{m}")),
        ("list_runs", "after", lambda ledger: ledger.list_runs(after="9" * 25 + f":{m}")),
        ("create_consent", "tool_name", lambda ledger: ledger.consents.create(
            RUN_ID, tool_name=m * 9, tool_call_id="call-1", payload={})),
        ("create_consent", "tool_call_id", lambda ledger: ledger.consents.create(
            RUN_ID, tool_name="mail", tool_call_id="", payload={})),
        ("create_consent", "payload", lambda ledger: ledger.consents.create(
            RUN_ID, tool_name="mail", tool_call_id="call-1", payload={m: float("nan")})),
        ("create_consent", "preauthorized_by", lambda ledger: ledger.consents.create(
            RUN_ID, tool_name="mail", tool_call_id="call-1", payload={}, preauthorized_by=m * 9)),
        ("create_consent", "expires_in_s", lambda ledger: ledger.consents.create(
            RUN_ID, tool_name="mail", tool_call_id="call-1", payload={}, expires_in_s=m)),
        ("create_consent", "expires_in_s", lambda ledger: ledger.consents.create(
            RUN_ID, tool_name="mail", tool_call_id="call-1", payload={}, expires_in_s=0)),
        ("create_consent", "expires_in_s", lambda ledger: ledger.consents.create(
            RUN_ID, tool_name="mail", tool_call_id="call-1", payload={}, expires_in_s=float("nan"))),
        ("create_consent", "expires_in_s", lambda ledger: ledger.consents.create(
            RUN_ID, tool_name="mail", tool_call_id="call-1", payload={}, expires_in_s=30 * 24 * 3600 + 1)),
        ("expire_due_consents", "limit", lambda ledger: expire_due_consents(ledger, limit=0)),
        ("expire_due_consents", "limit", lambda ledger: expire_due_consents(ledger, limit=True)),
        ("expire_due_consents", "broker", lambda ledger: expire_due_consents(ledger, broker=m)),
        ("decide_consent", "verdict", lambda ledger: ledger.consents.decide("consent-1", m, decided_by="bob")),
        ("decide_consent", "verdict", lambda ledger: ledger.consents.decide(
            "consent-1", ConsentStatus.CANCELLED, decided_by="bob")),
        ("decide_consent", "decided_by", lambda ledger: ledger.consents.decide(
            "consent-1", ConsentStatus.GRANTED, decided_by=m * 20)),
        ("decide_consent", "consent_id", lambda ledger: ledger.consents.decide(
            m * 3, ConsentStatus.GRANTED, decided_by="bob")),
        ("get_consent", "consent_id", lambda ledger: ledger.consents.get(m * 3)),
        ("send_message", "run_id", lambda ledger: ledger.messages.send(m * 3, "go", {})),
        ("send_message", "topic", lambda ledger: ledger.messages.send(RUN_ID, m + " ", {})),
        ("send_message", "topic", lambda ledger: ledger.messages.send(RUN_ID, m * 5, {})),
        ("send_message", "topic", lambda ledger: ledger.messages.send(RUN_ID, 7, {})),
        ("send_message", "message", lambda ledger: ledger.messages.send(RUN_ID, "go", {m: float("nan")})),
        ("send_message", "message", lambda ledger: ledger.messages.send(RUN_ID, "go", {m: "x" * (1024 * 1024)})),
        ("send_message", "message_id", lambda ledger: ledger.messages.send(RUN_ID, "go", {}, message_id=m * 9)),
        ("send_message", "message_id", lambda ledger: ledger.messages.send(RUN_ID, "go", {}, message_id="")),
        ("send_message", "broker", lambda ledger: ledger.messages.send(RUN_ID, "go", {}, broker=m)),
        ("receive_message", "run_id", lambda ledger: ledger.messages.receive(m * 3, 0, "go", key="@1")),
        ("receive_message", "enqueue_seq", lambda ledger: ledger.messages.receive(RUN_ID, True, "go", key="@1")),
        ("receive_message", "topic", lambda ledger: ledger.messages.receive(RUN_ID, 0, m + "\n", key="@1")),
        ("receive_message", "key", lambda ledger: ledger.messages.receive(RUN_ID, 0, "go", key=m * 9)),
        ("receive_message", "timeout_s", lambda ledger: ledger.messages.receive(RUN_ID, 0, "go", key="@1",
                                                                                   timeout_s=m)),
        ("receive_message", "timeout_s", lambda ledger: ledger.messages.receive(RUN_ID, 0, "go", key="@1",
                                                                                   timeout_s=-1)),
        ("receive_message", "timeout_s", lambda ledger: ledger.messages.receive(RUN_ID, 0, "go", key="@1",
                                                                                   timeout_s=367 * 86400)),
        ("time_out_due_receives", "limit", lambda ledger: time_out_due_receives(ledger, limit=0)),
        ("time_out_due_receives", "broker", lambda ledger: time_out_due_receives(ledger, broker=m)),
        ("get_message", "slot_id", lambda ledger: ledger.messages.get(m * 3)),
        ("list_messages", "run_id", lambda ledger: ledger.messages.list(m * 3)),
        ("submit_job", "request_id", lambda ledger: ledger.jobs.submit(
            RUN_ID, request_id=m * 9, runtime="sandbox", profile="small", request={})),
        ("submit_job", "runtime", lambda ledger: ledger.jobs.submit(
            RUN_ID, request_id="request-1", runtime="", profile="small", request={})),
        ("submit_job", "profile", lambda ledger: ledger.jobs.submit(
            RUN_ID, request_id="request-1", runtime="sandbox", profile=7, request={})),
        ("submit_job", "request", lambda ledger: ledger.jobs.submit(
            RUN_ID, request_id="request-1", runtime="sandbox", profile="small", request={m: float("inf")})),
        ("advance_job", "status", lambda ledger: ledger.jobs.advance("job-1", m)),
        ("advance_job", "status", lambda ledger: ledger.jobs.advance("job-1", AgentJobStatus.SUCCEEDED)),
        ("advance_job", "runtime_job_id", lambda ledger: ledger.jobs.advance(
            "job-1", AgentJobStatus.ADMITTED, runtime_job_id=m * 9)),
        ("advance_job", "job_id", lambda ledger: ledger.jobs.advance(m * 3, AgentJobStatus.ADMITTED)),
        ("adopt_job_result", "result", lambda ledger: ledger.jobs.adopt_result("job-1", m)),
        ("adopt_job_result", "result", lambda ledger: ledger.jobs.adopt_result("job-1", {m: float("nan")})),
        ("adopt_job_result", "result", lambda ledger: ledger.jobs.adopt_result("job-1", {"job_id": "job-1", "status": [m]})),
        ("adopt_job_result", "result", lambda ledger: ledger.jobs.adopt_result("job-1", {"job_id": m, "status": "lost"})),
        ("adopt_job_result", "result", lambda ledger: ledger.jobs.adopt_result(
            "job-1", {"job_id": "job-1", "status": "failed", "error": [m]})),
        ("record_job_cancelled", "job_id", lambda ledger: ledger.jobs.record_cancelled(m * 3)),
        ("get_job", "job_id", lambda ledger: ledger.jobs.get("")),
        ("list_jobs", "run_id", lambda ledger: ledger.jobs.list(m * 3)),
        ("reconcile", "ports", lambda ledger: ledger.reconcile(m, node="node-a", boot_cutoff=_aware())),
        ("reconcile", "node", lambda ledger: ledger.reconcile(_ports(), node=m * 9, boot_cutoff=_aware())),
        ("reconcile", "boot_cutoff", lambda ledger: ledger.reconcile(_ports(), node="node-a", boot_cutoff=m)),
        ("reconcile", "boot_cutoff", lambda ledger: ledger.reconcile(
            _ports(), node="node-a", boot_cutoff=_aware().replace(tzinfo=None))),
        ("reconcile", "page_size", lambda ledger: ledger.reconcile(
            _ports(), node="node-a", boot_cutoff=_aware(), page_size=True)),
        ("reconcile", "stale_after_s", lambda ledger: ledger.reconcile(
            _ports(), node="node-a", boot_cutoff=_aware(), stale_after_s=float("nan"))),
        ("relay", "ports", lambda ledger: ledger.relay(m)),
        ("relay", "cursor", lambda ledger: ledger.relay(_ports(), cursor=m)),
        ("relay", "cursor", lambda ledger: ledger.relay(_ports(), cursor="eyJ2IjoyfQ==")),
        ("relay", "page_size", lambda ledger: ledger.relay(_ports(), page_size=1001)),
        ("recover_ended_hop", "ports", lambda ledger: ledger.recover_ended_hop(m, RUN_ID, node="node-a",
                                                                               claimed_at=_aware())),
        ("recover_ended_hop", "node", lambda ledger: ledger.recover_ended_hop(_ports(), RUN_ID, node=m * 9,
                                                                              claimed_at=_aware())),
        ("recover_ended_hop", "run_id", lambda ledger: ledger.recover_ended_hop(_ports(), m * 3, node="node-a",
                                                                                claimed_at=_aware())),
        ("recover_ended_hop", "claimed_at", lambda ledger: ledger.recover_ended_hop(_ports(), RUN_ID, node="node-a",
                                                                                    claimed_at=m)),
        ("recover_ended_hop", "claimed_at", lambda ledger: ledger.recover_ended_hop(
            _ports(), RUN_ID, node="node-a", claimed_at=dt.datetime(2026, 1, 1))),
    ]
    for name in ("release", "publish", "claim", "enter_hardware_wait", "leave_hardware_wait", "park", "park_timer",
                 "settle", "finish_cancel", "get_delivery"):
        for seq in seqs:
            cases.append((name, "enqueue_seq", lambda ledger, name=name, seq=seq: _with_seq(ledger, name, seq)))
    return cases


def _ports() -> Any:
    from tenure.adapters import InMemoryBroker, RecoveryPorts

    return RecoveryPorts(InMemoryBroker())


def _aware() -> Any:
    import datetime as dt

    return dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)


def _with_seq(ledger: Any, name: str, seq: Any) -> Any:
    from tenure.adapters import InMemoryBroker
    from tenure.model import RunStatus, WaitKind

    calls = {
        "release": lambda: ledger.release(RUN_ID, seq),
        "publish": lambda: ledger.publish(RUN_ID, seq, InMemoryBroker()),
        "claim": lambda: ledger.claim(RUN_ID, seq, node="node-a"),
        "enter_hardware_wait": lambda: ledger.enter_hardware_wait(RUN_ID, seq),
        "leave_hardware_wait": lambda: ledger.leave_hardware_wait(RUN_ID, seq),
        "park": lambda: ledger.park(RUN_ID, seq, kind=WaitKind.CONSENT, owner_id="consent-1"),
        "park_timer": lambda: ledger.park_timer(RUN_ID, seq, name="sleep:0", delay_s=1),
        "settle": lambda: ledger.settle(RUN_ID, seq, RunStatus.DONE),
        "finish_cancel": lambda: ledger.finish_cancel(RUN_ID, seq, InMemoryBroker()),
        "get_delivery": lambda: ledger.get_delivery(RUN_ID, seq),
    }
    return calls[name]()


RUN_LEDGER_CASES = _run_ledger_cases()


@pytest.mark.parametrize("method, field, call", RUN_LEDGER_CASES,
                         ids=[f"{method}-{field}-{number}" for number, (method, field, _) in enumerate(RUN_LEDGER_CASES)])
async def test_run_ledger_methods_refuse_bad_input_before_any_database_work_without_echo(
    tmp_path: Any, method: str, field: str, call: Any
) -> None:
    from tenure.adapters import RunLedger

    # No database exists here: any database work would raise database_missing instead.
    ledger = RunLedger(f"sqlite:///{tmp_path}/missing/runs.db")
    try:
        with pytest.raises(ConfigValidationError) as caught:
            await call(ledger)
    finally:
        await ledger.close()
    error = caught.value
    assert error.code is ErrorCode.CONFIG and error.fields == (field,), (method, error)
    rendered = "\n".join([str(error), repr(error), *map(str, error.args), *traceback.format_exception_only(error)])
    assert RUN_MARKER not in rendered and "SECRET" not in rendered
    assert error.__context__ is None and error.__cause__ is None


def test_every_public_run_ledger_method_has_a_bad_input_case() -> None:
    from tenure.adapters import RunLedger

    public = {name for name in dir(RunLedger) if not name.startswith("_") and callable(getattr(RunLedger, name))}
    assert public - {method for method, _, _ in RUN_LEDGER_CASES} == {"close", "database_now"}  # no input


def _checkpoint_cases() -> list[tuple[str, Any]]:
    from tenure.model import WaitKind

    m = RUN_MARKER
    return [
        ("run_id", lambda c: c.save(m * 3, 0, state={})),
        ("enqueue_seq", lambda c: c.save(RUN_ID, -1, state={})),
        ("state", lambda c: c.save(RUN_ID, 0, state={m: float("nan")})),
        ("state", lambda c: c.save(RUN_ID, 0, state={m: "x" * (1024 * 1024)})),
        ("owner_kind", lambda c: c.save(RUN_ID, 0, state={}, owner_kind=WaitKind.HARDWARE, owner_id=m)),
        ("owner_kind", lambda c: c.save(RUN_ID, 0, state={}, owner_id=m)),
        ("owner_kind", lambda c: c.save(RUN_ID, 0, state={}, owner_kind=m, owner_id=m)),
        ("owner_id", lambda c: c.save(RUN_ID, 0, state={}, owner_kind=WaitKind.CONSENT, owner_id=m * 20)),
        ("run_id", lambda c: c.load(m * 3)),
        ("run_id", lambda c: c.delete(7)),
    ]


@pytest.mark.parametrize("field, call", _checkpoint_cases())
async def test_checkpoint_writes_refuse_bad_input_before_any_database_work_without_echo(
    tmp_path: Any, field: str, call: Any
) -> None:
    from tenure.adapters import RunLedger

    ledger = RunLedger(f"sqlite:///{tmp_path}/missing/runs.db")
    try:
        with pytest.raises(ConfigValidationError) as caught:
            await call(ledger.checkpoints)
    finally:
        await ledger.close()
    error = caught.value
    assert error.fields == (field,), error
    rendered = "\n".join([str(error), repr(error), *map(str, error.args), *traceback.format_exception_only(error)])
    assert RUN_MARKER not in rendered and error.__context__ is None and error.__cause__ is None


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), True, "30", 10**9])
def test_a_run_ledger_refuses_a_bad_timeout(timeout: Any) -> None:
    from tenure.adapters import RunLedger

    with pytest.raises(ConfigValidationError) as caught:
        RunLedger("sqlite:///nowhere/runs.db", timeout_seconds=timeout)
    assert caught.value.fields == ("timeout_seconds",)


@given(marker=markers, change=st.sampled_from([
    ("session_id", lambda m: m * 20),
    ("session_id", lambda m: ""),
    ("source", lambda m: m * 10),
    ("principal", lambda m: m * 30),
    ("principal", lambda m: None),
    ("scopes", lambda m: {m}),
    ("scopes", lambda m: [m]),
    ("scopes", lambda m: frozenset({m * 20})),
    ("scopes", lambda m: frozenset({7})),
    ("payload", lambda m: {m: float("nan")}),
    ("payload", lambda m: {m: (1, 2)}),
    ("payload", lambda m: {1: m}),
    ("requested_priority", lambda m: True),
    ("requested_priority", lambda m: -1),
    ("requested_priority", lambda m: 100.0),
]))
def test_invalid_run_intents_are_refused_without_echo(marker: str, change: Any) -> None:
    from tenure.model import RunIntent

    field, bad = change
    fields: dict[str, Any] = dict(session_id=marker, source=marker, principal=marker, scopes=frozenset({marker}),
                                  payload={marker: marker}, requested_priority=None)
    fields[field] = bad(marker)
    error = assert_refused_without_echo(lambda: RunIntent(**fields), fields)
    assert field in error.fields


@given(marker=markers, change=st.sampled_from([
    ("name", "workflow_name", lambda m: m * 11),
    ("revision", "workflow_revision", lambda m: m * 7),
    ("digest", "workflow_digest", lambda m: ""),
    ("digest", "workflow_digest", lambda m: m + "\x00"),
]))
def test_invalid_workflow_pins_are_refused_without_echo(marker: str, change: Any) -> None:
    from tenure.model import WorkflowPin

    argument, field, bad = change
    fields: dict[str, Any] = dict(name=marker, revision=marker, digest=marker)
    fields[argument] = bad(marker)
    error = assert_refused_without_echo(lambda: WorkflowPin(**fields), fields)
    assert field in error.fields


@pytest.mark.parametrize("after", ["\u00b22:attempt-1", "--5:attempt-1", "9" * 5000 + ":attempt-1", "9" * 25 + ":a"])
async def test_an_attempt_page_cursor_that_is_not_one_is_refused(tmp_path: Any, after: str) -> None:
    from tenure.adapters import AttemptLedger

    async with AttemptLedger(f"sqlite:///{tmp_path}/missing/attempts.db") as ledger:
        with pytest.raises(ConfigValidationError) as caught:
            await ledger.list_unresolved(after=after)
    assert caught.value.fields == ("after",)
