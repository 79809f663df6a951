"""The console's forms, on SQLite and PostgreSQL: retry and cancel a job, cancel a Run,
grant or deny a consent (the Run resumes, as from ``tenure runs consent``), and a
verdict on a consent someone else decided first. Each goes through the fenced public API
and redirects to the object's page, which says what happened."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest
from adapter_support import _run_async
from console_html import attribute, by_testid, csrf_of, texts
from console_seed import Seeded, park_on_consent, seed

from tenure.adapters import RunLedger
from tenure.adapters.queue.sources import TaskSource
from tenure.model import JobStatus, RunStatus


@pytest.fixture
def seeded_url(console_url: str) -> tuple[str, Seeded]:
    return console_url, _run_async(seed(console_url))


def post(client: Any, page_path: str, action: str, **fields: str) -> Any:
    """Submit a form of the page at ``page_path`` (its CSRF token included)."""
    token = csrf_of(client.get(page_path).text)
    return client.post(action, data={"csrf_token": token, **fields})


def outcome_of(client: Any, response: Any) -> tuple[str, str]:
    """Follow a form's redirect: (the outcome word, the page)."""
    assert response.status_code == 303, response.text[:2000]
    location = response.headers["location"]
    page = client.get(location).text
    return urllib.parse.parse_qs(urllib.parse.urlsplit(location).query)["outcome"][0], page


async def _run_status(url: str, run_id: str) -> tuple[RunStatus, int]:
    async with RunLedger(url) as ledger:
        run = await ledger.get(run_id)
        assert run is not None
        return run.status, run.enqueue_seq


def run_status(url: str, run_id: str) -> tuple[RunStatus, int]:
    return _run_async(_run_status(url, run_id))  # type: ignore[no-any-return]


async def _job_status(url: str, job_id: str) -> JobStatus:
    async with TaskSource(url) as tasks:
        info = await tasks.get_job(job_id)
        assert info is not None
        return info.status


def test_retry_sends_a_failed_job_back_to_pending_and_says_so(
    seeded_url: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded_url
    client = console(url)
    path = f"/jobs/tasks/{data.failed_task}"
    outcome, page = outcome_of(client, post(client, path, path + "/retry"))
    assert outcome == "retried" and attribute(page, "flash", "data-outcome") == ["retried"]
    assert texts(page, "job-status") == ["pending"] and texts(page, "job-attempts") == ["0/3"]
    assert _run_async(_job_status(url, data.failed_task)) is JobStatus.PENDING
    # Pending now: the fenced retry refuses, and the page says so.
    outcome, page = outcome_of(client, post(client, path, path + "/retry"))
    assert outcome == "not_retried" and texts(page, "job-status") == ["pending"]
    # pycharter's queues retry the same way.
    validation = f"/jobs/validation/{data.failed_validation}"
    outcome, page = outcome_of(client, post(client, validation, validation + "/retry"))
    assert outcome == "retried" and texts(page, "job-status") == ["pending"]


def test_cancel_ends_a_pending_job_and_refuses_a_finished_one(
    seeded_url: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded_url
    client = console(url)
    path = f"/jobs/tasks/{data.pending_task}"
    outcome, page = outcome_of(client, post(client, path, path + "/cancel"))
    assert outcome == "cancelled" and texts(page, "job-status") == ["cancelled"]
    outcome, _ = outcome_of(client, post(client, path, path + "/cancel"))
    assert outcome == "not_cancelled"
    done = f"/jobs/tasks/{data.completed_task}"
    outcome, page = outcome_of(client, post(client, done, done + "/cancel"))
    assert outcome == "not_cancelled" and texts(page, "job-status") == ["completed"]


def test_cancel_elects_a_runs_cancellation_and_the_page_says_what_is_left_without_a_broker(
    seeded_url: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded_url
    client = console(url)
    path = f"/runs/{data.waiting_run}"
    outcome, page = outcome_of(client, post(client, path, path + "/cancel"))
    assert outcome == "cancelling" and texts(page, "run-status") == ["cancelling"]
    assert "no broker" in texts(page, "flash")[0] and "tenure runs cancel" in texts(page, "flash")[0]
    assert run_status(url, data.waiting_run)[0] is RunStatus.CANCELLING
    finished = f"/runs/{data.failed_run}"
    outcome, page = outcome_of(client, post(client, finished, finished + "/cancel"))
    assert outcome == "not_cancelled" and texts(page, "run-status") == ["failed"]


@pytest.mark.parametrize(("verdict", "status"), [("grant", "granted"), ("deny", "denied")])
def test_a_verdict_decides_the_consent_and_resumes_the_run_as_tenure_runs_consent_does(
    seeded_url: tuple[str, Seeded], console: Callable[..., Any], verdict: str, status: str,
) -> None:
    url, data = seeded_url
    client = console(url)
    assert run_status(url, data.waiting_run) == (RunStatus.AWAITING_CONSENT, 0)
    inbox = client.get("/consents").text
    assert attribute(inbox, "consent-row", "data-consent-id") == [data.pending_consent]
    response = client.post(f"/consents/{data.pending_consent}/decide",
                           data={"csrf_token": csrf_of(inbox), "verdict": verdict, "by": "  bob  "})
    outcome, page = outcome_of(client, response)
    assert outcome == "decided_resumed"
    assert texts(page, "consent-status") == [status] and texts(page, "consent-decided-by") == ["bob"]
    # The Run moved on: queued at its next hop, for a worker's relay to publish.
    assert run_status(url, data.waiting_run) == (RunStatus.QUEUED, 1)
    assert texts(page, "consent-run-status") == ["queued"]
    inbox = client.get("/consents").text
    assert attribute(inbox, "consent-row", "data-consent-id") == []
    assert data.pending_consent in attribute(inbox, "decided-row", "data-consent-id")
    assert texts(inbox, "pending-consents-count") == ["0"]


def test_a_verdict_on_a_consent_decided_first_says_who_decided_it_and_when(
    seeded_url: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded_url
    first, second = console(url), console(url)  # two operators, each with the inbox open
    first_page, second_page = first.get("/consents").text, second.get("/consents").text
    granted = first.post(f"/consents/{data.pending_consent}/decide",
                         data={"csrf_token": csrf_of(first_page), "verdict": "grant", "by": "bob"})
    assert outcome_of(first, granted)[0] == "decided_resumed"
    late = second.post(f"/consents/{data.pending_consent}/decide",
                       data={"csrf_token": csrf_of(second_page), "verdict": "deny", "by": "mallory"})
    outcome, page = outcome_of(second, late)
    assert outcome == "already_decided"
    [said] = texts(page, "decided-first")
    assert said.startswith("Decided first by bob at ") and said.endswith("UTC (granted).")
    assert texts(page, "consent-status") == ["granted"]
    assert run_status(url, data.waiting_run) == (RunStatus.QUEUED, 1)
    # The consent the seed denied: a verdict now is refused the same way.
    decided = f"/consents/{data.decided_consent}"
    assert not by_testid(second.get(decided).text, "consent-decide-form")  # a decided consent offers no form
    token = csrf_of(second_page)  # the form the operator still has open
    outcome, page = outcome_of(second, second.post(decided + "/decide",
                                                   data={"csrf_token": token, "verdict": "grant", "by": "mallory"}))
    assert outcome == "already_decided" and texts(page, "decided-first")[0].startswith("Decided first by carol at ")


@pytest.mark.parametrize(("fields", "field"), [
    ({"by": "bob"}, "verdict"),
    ({"verdict": "maybe-7f", "by": "bob"}, "verdict"),
    ({"verdict": "grant"}, "by"),
    ({"verdict": "grant", "by": "   "}, "by"),
    ({"verdict": "grant", "by": "b" * 256}, "by"),
    ({"verdict": "grant", "by": "bob\u0000"}, "by"),
])
def test_a_bad_verdict_form_is_a_400_naming_the_field_and_decides_nothing(
    seeded_url: tuple[str, Seeded], console: Callable[..., Any], fields: dict[str, str], field: str,
) -> None:
    url, data = seeded_url
    client = console(url)
    path = f"/consents/{data.pending_consent}"
    response = post(client, path, path + "/decide", **fields)
    assert response.status_code == 400
    assert texts(response.text, "error-field")[0].startswith(f"Field {field}: takes ")
    assert "maybe-7f" not in response.text
    assert texts(client.get(path).text, "consent-status") == ["pending"]


def test_an_action_on_an_unknown_object_is_a_404(seeded_url: tuple[str, Seeded], console: Callable[..., Any]) -> None:
    url, data = seeded_url
    client = console(url)
    token = csrf_of(client.get(f"/jobs/tasks/{data.pending_task}").text)
    unknown = "00000000-0000-4000-8000-000000000000"
    for action in (f"/jobs/tasks/{unknown}/retry", f"/jobs/tasks/{unknown}/cancel", f"/jobs/bogus/{unknown}/retry",
                   f"/runs/{unknown}/cancel", f"/consents/{unknown}/decide"):
        response = client.post(action, data={"csrf_token": token, "verdict": "grant", "by": "bob"})
        assert response.status_code == 404, action
        assert by_testid(response.text, "error-page")


def test_a_streaming_launch_offers_no_retry_and_its_retry_says_so(
    console_url: str, console: Callable[..., Any],
) -> None:
    from tenure.adapters.queue.sources import StreamingJobSource
    from tenure.model import StreamingJob

    async def launch() -> str:
        async with StreamingJobSource(console_url) as streaming:
            return await streaming.submit_owned(StreamingJob("feed", "1"), submission_id="launch-1")

    job_id = _run_async(launch())
    client = console(console_url)
    path = f"/jobs/streaming/{job_id}"
    page = client.get(path).text
    assert not by_testid(page, "job-retry") and by_testid(page, "job-cancel")
    outcome, _ = outcome_of(client, post(client, path, path + "/retry"))
    assert outcome == "retry_unsupported"
    outcome, page = outcome_of(client, post(client, path, path + "/cancel"))
    assert outcome == "cancelled" and texts(page, "job-status") == ["cancelled"]


def test_many_pending_consents_page_oldest_first(console_url: str, console: Callable[..., Any]) -> None:
    async def park_several() -> list[str]:
        async with RunLedger(console_url) as ledger:
            made = []
            for _ in range(5):
                made.append((await park_on_consent(ledger, tool_name="mail.send"))[1])
                await asyncio.sleep(0.002)
            return made

    made = _run_async(park_several())
    client = console(console_url, page_size=2)
    seen: list[str] = []
    target: str | None = "/consents"
    while target is not None:
        page = client.get(target).text
        seen += attribute(page, "consent-row", "data-consent-id")
        links = attribute(page, "next-page", "href")
        target = links[0].replace("&amp;", "&") if links else None
    assert seen == made
    assert texts(client.get("/consents").text, "pending-consents-count") == ["5"]


def test_a_claim_past_its_lease_is_counted_on_the_overview_and_is_no_failed_reading(
    console_url: str, console: Callable[..., Any],
) -> None:
    import time
    import uuid

    from tenure.model import TaskJob, WorkerConfig

    async def abandon() -> None:
        config = WorkerConfig(console_url, lease_seconds=0.05, heartbeat_seconds=0.01)
        async with TaskSource(console_url, config) as tasks:
            await tasks.submit_many([TaskJob(queue_name="emails", task_name="send", args={})])
            assert await tasks.claim_next_owned("gone", claim_token=uuid.uuid4().hex, queues=["emails"]) is not None

    _run_async(abandon())
    time.sleep(0.2)
    page = console(console_url).get("/").text
    rows = by_testid(page, "queue-row")
    [index] = [n for n, row in enumerate(rows) if row.attributes["data-queue"] == "emails"]
    cells = texts(page, "queue-past-lease")
    assert len(cells) == len(rows) and cells[index] == "1"  # the emails queue's own cell
    assert not by_testid(page, "overview-unread")


def test_the_same_operator_sending_the_same_verdict_again_is_told_it_decided_not_that_someone_was_first(
    seeded_url: tuple[str, Any], console: Callable[..., Any],
) -> None:
    url, data = seeded_url
    client = console(url)
    path = f"/consents/{data.pending_consent}"
    token = csrf_of(client.get(path).text)  # the form of the page as it was, submitted three times
    first = client.post(path + "/decide", data={"csrf_token": token, "verdict": "grant", "by": "bob"})
    again = client.post(path + "/decide", data={"csrf_token": token, "verdict": "grant", "by": "bob"})
    other = client.post(path + "/decide", data={"csrf_token": token, "verdict": "deny", "by": "carol"})
    assert "already_decided" not in first.headers["location"] and "already_decided" not in again.headers["location"]
    assert "outcome=already_decided" in other.headers["location"]
