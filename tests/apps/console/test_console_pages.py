"""The console's pages, read in process (Starlette's TestClient) on SQLite and PostgreSQL
with data present: what each page shows, its filters and keyset pages, bad input (400
naming the field, 404 for unknown IDs), escaping of hostile text, payloads only when
revealed, ``Server-Timing`` everywhere, and that no GET changes anything."""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Callable
from typing import Any

import uuid

import markupsafe
import pytest
from adapter_support import _run_async, raw
from console_html import attribute, by_testid, texts
from console_seed import (
    CONSENT_SECRET,
    HOSTILE,
    HOSTILE_ERROR,
    HOSTILE_NODE,
    HOSTILE_QUEUE,
    HOSTILE_TOOL,
    HOSTILE_WORKFLOW,
    RUN_SECRET,
    TASK_SECRET,
    Seeded,
)

from tenure.adapters import ValidationJobSource
from tenure.adapters.queue.sources import TaskSource
from tenure.apps.console.reads import ConsoleData, JobView
from tenure.model import JobInfo, JobState, ValidationJob, WorkerConfig

SECRETS = (TASK_SECRET, RUN_SECRET, CONSENT_SECRET)
HOSTILE_TEXTS = (HOSTILE, HOSTILE_ERROR, HOSTILE_NODE, HOSTILE_QUEUE, HOSTILE_TOOL, HOSTILE_WORKFLOW)


def quoted(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def pages_of(seeded: Seeded) -> dict[str, str]:
    """Every page of the console (by its ``data-page``), with data on it."""
    return {
        "/": "overview", "/jobs": "jobs", "/jobs?queue=validation": "jobs",
        f"/jobs/tasks/{seeded.failed_task}": "job", f"/jobs/tasks/{seeded.hostile_task}": "job",
        f"/jobs/validation/{seeded.failed_validation}": "job", "/runs": "runs",
        f"/runs/{seeded.waiting_run}": "run", f"/runs/{seeded.queued_run}": "run", f"/runs/{seeded.failed_run}": "run",
        f"/runs/{seeded.decided_run}": "run", "/consents": "consents", f"/consents/{seeded.pending_consent}": "consent",
        f"/consents/{seeded.decided_consent}": "consent",
    }


def page_name(page: str) -> str | None:
    found = re.search(r'<main data-page="([a-z]+)">', page)
    return None if found is None else found.group(1)


def test_every_page_renders_with_data_and_carries_server_timing_and_the_security_headers(
    seeded: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded
    client = console(url)
    for path, name in pages_of(data).items():
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[:2000])
        assert page_name(response.text) == name, path
        timing = response.headers["server-timing"]
        assert re.fullmatch(r'app;dur=[0-9]+\.[0-9];desc="server time"', timing), timing
        assert "script-src 'self'" in response.headers["content-security-policy"]
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["cache-control"] == "no-store"
    for path in ("/api/live", "/static/console.css", "/static/console.js", "/nope", "/jobs?status=nope"):
        assert "app;dur=" in client.get(path).headers["server-timing"], path


def test_the_overview_counts_each_queue_runs_by_status_and_shows_the_recovery_report(
    seeded: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, _ = seeded
    page = console(url).get("/").text
    rows = {(row.attributes["data-table"], row.attributes["data-queue"]): row
            for row in by_testid(page, "queue-row")}
    assert set(rows) >= {("tenure_tasks", "emails"), ("tenure_tasks", "reports"), ("validation_jobs", "validation"),
                         ("pipeline_jobs", "pipeline"), ("streaming_jobs", "streaming")}
    live = console(url).get("/api/live").json()["values"]
    assert live["queue/tenure_tasks/emails/pending"] == 1
    assert live["queue/tenure_tasks/emails/failed"] == 1
    assert live["queue/tenure_tasks/emails/completed"] == 1
    assert live["queue/tenure_tasks/emails/completed_last_minute"] == 1
    assert live["queue/tenure_tasks/emails/failed_last_minute"] == 1
    assert live["queue/validation_jobs/validation/failed_last_minute"] == 1
    assert live["queue/tenure_tasks/emails/expired_claims"] == 0
    assert live["runs/awaiting_consent"] == 2 and live["runs/queued"] == 1 and live["runs/failed"] == 1
    assert live["consents/pending"] == 1
    # The page shows the same numbers, each marked with the key the poll refreshes.
    marked = dict(zip(attribute(page, "queue-count", "data-live"), texts(page, "queue-count"), strict=True))
    assert marked["queue/tenure_tasks/emails/pending"] == "1"
    assert texts(page, "pending-consents-count") == ["1"]
    assert [row.attributes["data-node"] for row in by_testid(page, "recovery-report-row")] == [HOSTILE_NODE]
    assert str(markupsafe.escape(HOSTILE_NODE)) in page
    assert console(url).get("/api/live?scope=badge").json() == {"values": {"consents/pending": 1}}


def test_the_job_list_filters_by_queue_status_task_queue_task_and_age(
    seeded: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded
    client = console(url)

    def listed(query: str) -> list[str]:
        response = client.get("/jobs" + query)
        assert response.status_code == 200, response.text[:2000]
        return attribute(response.text, "job-row", "data-job-id")

    every = listed("")
    assert len(every) == 4 and every == sorted(every, reverse=True)
    assert listed("?status=failed") == [data.failed_task]
    assert listed("?status=FAILED&queue=tasks") == [data.failed_task]  # any letter case
    assert listed("?task_queue=reports") == [data.hostile_task]
    assert sorted(listed("?task=send")) == sorted(set(every) - {data.hostile_task})
    assert listed("?task_queue=emails&task=send&status=completed") == [data.completed_task]
    assert listed("?older_than=1d") == []
    assert listed("?older_than=&status=&task=") == every  # an empty filter field filters nothing
    assert listed("?queue=validation") == [data.failed_validation]
    assert listed("?queue=pipeline") == []


@pytest.mark.parametrize("path", ["/jobs", "/jobs?task_queue=emails", "/runs", "/runs?workflow=review"])
def test_a_list_pages_through_every_row_once_by_its_next_page_links(
    seeded: tuple[str, Seeded], console: Callable[..., Any], path: str,
) -> None:
    url, _ = seeded
    client = console(url, page_size=1)
    whole = console(url).get(path).text
    testid, key = ("job-row", "data-job-id") if path.startswith("/jobs") else ("run-row", "data-run-id")
    expected = attribute(whole, testid, key)
    assert len(expected) >= 3
    seen: list[str] = []
    target: str | None = path
    while target is not None:
        page = client.get(target).text
        seen += attribute(page, testid, key)
        links = attribute(page, "next-page", "href")
        target = links[0].replace("&amp;", "&") if links else None
        assert len(seen) <= len(expected)
    assert seen == expected
    assert len(set(seen)) == len(seen)


def test_the_run_list_filters_by_status_queue_and_workflow_newest_first(
    seeded: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded
    client = console(url)

    def listed(query: str) -> list[str]:
        response = client.get("/runs" + query)
        assert response.status_code == 200, response.text[:2000]
        return attribute(response.text, "run-row", "data-run-id")

    assert listed("") == [data.failed_run, data.queued_run, data.decided_run, data.waiting_run]
    assert listed("?status=awaiting_consent") == [data.decided_run, data.waiting_run]
    assert listed("?queue=" + quoted(HOSTILE_QUEUE)) == [data.queued_run]
    assert listed("?workflow=" + quoted(HOSTILE_WORKFLOW)) == [data.queued_run]
    assert listed("?workflow=review&status=failed") == [data.failed_run]
    assert listed("?queue=nothing-here") == []


@pytest.mark.parametrize(("path", "field"), [
    ("/jobs?status=bogus-7f", "status"),
    ("/jobs?queue=bogus-7f", "queue"),
    ("/jobs?task_queue=bogus-7f%20name", "task_queue"),
    ("/jobs?queue=validation&task=bogus-7f", "task"),
    ("/jobs?older_than=bogus-7f", "older_than"),
    ("/jobs?after=" + "bogus-7f" * 10, "after"),
    ("/runs?status=bogus-7f", "status"),
    ("/runs?after=bogus-7f", "after"),
    ("/runs?queue=" + "bogus-7f" * 10, "queue"),
    ("/consents?after=bogus-7f", "after"),
    ("/consents?decided_after=bogus-7f", "decided_after"),
])
def test_a_malformed_filter_is_a_400_naming_the_field_never_the_value(
    seeded: tuple[str, Seeded], console: Callable[..., Any], path: str, field: str,
) -> None:
    url, _ = seeded
    response = console(url).get(path)
    assert response.status_code == 400
    assert texts(response.text, "error-field")[0].startswith(f"Field {field}: takes ")
    assert "bogus-7f" not in response.text


def test_reveal_takes_only_what_the_page_can_show(seeded: tuple[str, Seeded], console: Callable[..., Any]) -> None:
    url, data = seeded
    client = console(url)
    for path in (f"/jobs/tasks/{data.failed_task}", f"/runs/{data.waiting_run}", f"/consents/{data.pending_consent}"):
        response = client.get(path + "?reveal=bogus-7f")
        assert response.status_code == 400 and "Field reveal" in texts(response.text, "error-field")[0]
        assert "bogus-7f" not in response.text


def test_an_unknown_id_or_page_is_a_404_that_echoes_nothing(seeded: tuple[str, Seeded],
                                                             console: Callable[..., Any]) -> None:
    url, data = seeded
    client = console(url)
    unknown = "00000000-0000-4000-8000-00000000b07f"
    for path in (f"/jobs/tasks/{unknown}", f"/jobs/validation/{unknown}", f"/jobs/bogus/{data.failed_task}",
                 f"/runs/{unknown}", f"/consents/{unknown}", "/runs/" + "b07f" * 20, f"/jobs/tasks/{'b07f' * 20}",
                 "/consents/" + quoted("b07f\u0000"), "/bogus-b07f", f"/jobs/tasks/{data.failed_task}/b07f"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert by_testid(response.text, "error-page")[0].attributes["data-status"] == "404"
        assert "b07f" not in response.text and unknown not in response.text


def test_a_job_page_shows_attempts_error_generation_and_times_and_its_payload_only_when_revealed(
    seeded: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded
    client = console(url)
    page = client.get(f"/jobs/tasks/{data.failed_task}").text
    assert texts(page, "job-status") == ["failed"]
    assert texts(page, "job-attempts") == ["1/3"]
    assert texts(page, "job-generation") == ["1"]
    assert texts(page, "job-error") == [" ".join(HOSTILE_ERROR.split())]
    assert TASK_SECRET not in page and by_testid(page, "job-reveal-payload")
    revealed = client.get(f"/jobs/tasks/{data.failed_task}?reveal=payload").text
    assert TASK_SECRET in texts(revealed, "job-revealed-payload")[0]
    completed = client.get(f"/jobs/tasks/{data.completed_task}").text
    assert "bytes of JSON" in texts(completed, "job-result")[0] and TASK_SECRET not in completed
    assert TASK_SECRET in client.get(f"/jobs/tasks/{data.completed_task}?reveal=result").text
    # A streaming launch has no retry; the other queues offer it.
    assert by_testid(page, "job-retry") and by_testid(page, "job-cancel")


def test_a_run_page_shows_deliveries_owner_owners_checkpoint_and_a_timeline(
    seeded: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded
    client = console(url)
    page = client.get(f"/runs/{data.waiting_run}").text
    assert texts(page, "run-status") == ["awaiting_consent"]
    assert attribute(page, "run-owner-link", "href") == [f"/consents/{data.pending_consent}"]
    assert attribute(page, "delivery-row", "data-hop") == ["0"]
    assert attribute(page, "run-consent-row", "data-consent-id") == [data.pending_consent]
    assert len(by_testid(page, "run-job-row")) == 1
    assert texts(page, "run-checkpoint") == ["none"]
    events = texts(page, "timeline-event")
    assert any("admitted on queue runs" in event for event in events)
    assert any("hop 0 claimed by node-a" in event for event in events)
    assert any("consent asked for tool" in event for event in events)
    assert any("delegated job submitted (sandbox, small)" in event for event in events)
    assert events[-1].endswith("status awaiting_consent (the latest change)")
    assert RUN_SECRET not in page
    assert RUN_SECRET in texts(client.get(f"/runs/{data.waiting_run}?reveal=payload").text, "run-revealed-payload")[0]
    failed = client.get(f"/runs/{data.failed_run}").text
    assert texts(failed, "run-error") == [" ".join(HOSTILE_ERROR.split())]


def test_the_inbox_lists_pending_consents_with_what_they_are_for_and_decided_ones_with_who_and_when(
    seeded: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded
    client = console(url)
    page = client.get("/consents").text
    assert attribute(page, "consent-row", "data-consent-id") == [data.pending_consent]
    assert attribute(page, "consent-row", "data-run-id") == [data.waiting_run]
    assert texts(page, "consent-tool") == [HOSTILE_TOOL]
    assert len(by_testid(page, "consent-grant")) == 1 and len(by_testid(page, "consent-deny")) == 1
    assert attribute(page, "decided-row", "data-consent-id") == [data.decided_consent]
    assert texts(page, "decided-by") == ["carol"]
    assert CONSENT_SECRET not in page
    shown = client.get(f"/consents/{data.pending_consent}").text
    assert texts(shown, "consent-status") == ["pending"] and CONSENT_SECRET not in shown
    revealed = client.get(f"/consents/{data.pending_consent}?reveal=payload").text
    assert CONSENT_SECRET in texts(revealed, "consent-revealed-payload")[0]
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; more" in revealed
    decided = client.get(f"/consents/{data.decided_consent}").text
    assert texts(decided, "consent-decided-by") == ["carol"] and not by_testid(decided, "consent-grant")


def test_hostile_names_errors_tools_and_payloads_are_escaped_on_every_page(
    seeded: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded
    client = console(url)
    paths = [*pages_of(data), f"/jobs/tasks/{data.hostile_task}?reveal=payload",
             f"/consents/{data.pending_consent}?reveal=payload", "/jobs?task_queue=reports",
             "/runs?queue=" + quoted(HOSTILE_QUEUE)]
    shown: set[str] = set()
    for path in paths:
        page = client.get(path).text
        for hostile in HOSTILE_TEXTS:
            assert hostile not in page, (path, hostile)
            if str(markupsafe.escape(hostile)) in page:
                shown.add(hostile)
        assert "<script>" not in page.replace('<script src="/static/console.js" defer></script>', "")
        assert "<b>bold</b>" not in page and "<svg" not in page and "onerror=" not in page.replace("onerror=alert",
                                                                                                      "")
    assert shown == set(HOSTILE_TEXTS)  # each one appears, escaped, somewhere


def test_no_payload_appears_on_any_page_unless_revealed(seeded: tuple[str, Seeded],
                                                        console: Callable[..., Any]) -> None:
    url, data = seeded
    client = console(url)
    for path in pages_of(data):
        page = client.get(path).text
        assert not any(secret in page for secret in SECRETS), path
    live = client.get("/api/live").text
    assert not any(secret in live for secret in SECRETS)


def _state(url: str) -> list[Any]:
    return [
        raw(url, "SELECT id, status, attempt, generation, claimed_by, completed_at FROM tenure_tasks ORDER BY id"),
        raw(url, "SELECT id, status, attempt, generation FROM validation_jobs ORDER BY id"),
        raw(url, "SELECT run_id, status, enqueue_seq, updated_at FROM tenure_runs ORDER BY run_id"),
        raw(url, "SELECT delivery_id, state FROM tenure_run_deliveries ORDER BY delivery_id"),
        raw(url, "SELECT consent_id, status, decided_by FROM tenure_consents ORDER BY consent_id"),
    ]


def test_no_get_changes_anything_even_one_addressed_at_an_action(
    seeded: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded
    client = console(url)
    before = _state(url)
    for path in pages_of(data):
        client.get(path)
        client.get(path + ("&" if "?" in path else "?") + "verdict=grant&by=mallory&action=cancel")
    for path in (f"/jobs/tasks/{data.failed_task}/retry", f"/jobs/tasks/{data.pending_task}/cancel",
                 f"/runs/{data.queued_run}/cancel", f"/consents/{data.pending_consent}/decide?verdict=grant&by=x",
                 "/logout"):
        response = client.get(path)
        assert response.status_code in (404, 405), path
    assert _state(url) == before


SPOOFING_ERROR = "boom \u202eevil\u202c \u2066x\u2069 \x1b[31mred\rOVER\u2028next\u2029para"
"""A stored error another client wrote (the worker would have cleaned it): an override,
an isolate, an escape sequence, a carriage return and the line and paragraph separators."""


async def _failed_with(db_url: str, error: str) -> str:
    async with ValidationJobSource(db_url, WorkerConfig(db_url, lease_seconds=30, heartbeat_seconds=10)) as source:
        await source.submit_owned(ValidationJob("orders", "1", "a.jsonl"), submission_id="s-1")
        claimed = await source.claim_next_owned("worker-a", claim_token=uuid.uuid4().hex)
        assert claimed is not None and await source.fail_owned(claimed.claim_fence, error, retry=False)
        return str(claimed.job_id)


def test_a_stored_error_shows_without_its_control_bidirectional_or_separator_characters(
    console_url: str, console: Callable[..., Any],
) -> None:
    job_id = _run_async(_failed_with(console_url, SPOOFING_ERROR))
    client = console(console_url)
    for path in (f"/jobs/validation/{job_id}", "/jobs?queue=validation"):
        page = client.get(path).text
        assert not {"\u202e", "\u202c", "\u2066", "\u2069", "\x1b", "\r", "\u2028", "\u2029"} & set(page), path
        assert "boom \ufffdevil\ufffd \ufffdx\ufffd \ufffd[31mred" in page, path
    assert "OVER" in texts(client.get(f"/jobs/validation/{job_id}").text, "job-error")[0]


async def _job_seen_twice(db_url: str, job_id: str) -> tuple[Any, JobInfo | None]:
    """The console's view of a task and what ``get_job`` (``tenure jobs show``) answers."""
    data = ConsoleData(db_url)
    try:
        view = await data.job("tasks", job_id)
    finally:
        await data.close()
    async with TaskSource(db_url) as source:
        return view, await source.get_job(job_id)


def test_a_job_page_holds_the_job_state_tenure_jobs_shows_and_repeats_none_of_its_fields(
    seeded: tuple[str, Seeded],
) -> None:
    url, data = seeded
    assert not {field.name for field in dataclasses.fields(JobView)} & {
        field.name for field in dataclasses.fields(JobInfo)}
    for job_id in (data.failed_task, data.completed_task, data.pending_task):
        view, info = _run_async(_job_seen_twice(url, job_id))
        assert isinstance(view, JobView) and info is not None
        assert view.state == JobState(**{field.name: getattr(info, field.name) for field in dataclasses.fields(JobState)})
        assert isinstance(info, JobState) and (view.result_json is None) == (info.result is None)
