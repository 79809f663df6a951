"""A stored JSON value tenure cannot read (written by another client: nested deeper than
tenure reads, or not JSON at all) is shown by the console as ``corrupt_row``, what the
API answers for it, on a page that otherwise renders (200): never a 500, never the text.

The values are written with raw SQL on both databases, 10,000 levels deep (tenure reads
256; ``json.loads`` overflows the interpreter's stack near 1,000).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from adapter_support import _run_async, raw, stored_instant
from console_html import by_testid, texts
from console_seed import Seeded, seed

from tenure.adapters import RunLedger
from tenure.apps.console.pages import UNREADABLE_TEXT
from tenure.adapters.queue.sources import TaskSource
from tenure.model import MAX_JSON_DEPTH, TenureError

DEPTH = 10_000
DEEP = '{"x": ' + "[" * DEPTH + "]" * DEPTH + "}"
NOT_JSON = "{not json: <b>"


@pytest.fixture
def seeded_url(console_url: str) -> tuple[str, Seeded]:
    return console_url, _run_async(seed(console_url))


def poison(url: str, data: Seeded, text: str) -> None:
    """Every JSON value a page of the console reveals, of one task, one Run (its payload,
    result and checkpoint) and one consent, replaced by ``text``."""
    raw(url, "UPDATE tenure_tasks SET result_json = ?, progress_json = ? WHERE id = ?",
        (text, text, data.completed_task))
    raw(url, "UPDATE tenure_tasks SET args_json = ? WHERE id = ?", (text, data.pending_task))
    raw(url, "UPDATE tenure_runs SET payload_json = ?, result_json = ? WHERE run_id = ?",
        (text, text, data.waiting_run))
    raw(url, "INSERT INTO tenure_run_checkpoints (run_id, enqueue_seq, state_json, saved_at) VALUES (?, ?, ?, ?)",
        (data.waiting_run, 0, text, stored_instant(url, 1_700_000_000_000_000)))
    raw(url, "UPDATE tenure_consents SET payload_json = ? WHERE consent_id = ?", (text, data.pending_consent))


def shows_corrupt_row(response: Any, testid: str) -> None:
    assert response.status_code == 200, response.status_code
    assert texts(response.text, testid) == [" ".join(UNREADABLE_TEXT.split())]
    assert UNREADABLE_TEXT.startswith("corrupt_row: ")
    assert "[[[" not in response.text and "not json" not in response.text


@pytest.mark.parametrize("text", [DEEP, NOT_JSON], ids=["deep", "not_json"])
def test_revealing_a_value_tenure_cannot_read_shows_corrupt_row_as_the_api_answers(
    seeded_url: tuple[str, Seeded], console: Callable[..., Any], text: str,
) -> None:
    url, data = seeded_url
    if text == NOT_JSON and not url.startswith("sqlite"):
        # PostgreSQL's json columns refuse what is not JSON: only the text columns take it.
        raw(url, "UPDATE tenure_runs SET payload_json = ?, result_json = ? WHERE run_id = ?",
            (text, text, data.waiting_run))
        raw(url, "UPDATE tenure_consents SET payload_json = ? WHERE consent_id = ?", (text, data.pending_consent))
        raw(url, "INSERT INTO tenure_run_checkpoints (run_id, enqueue_seq, state_json, saved_at) "
                 "VALUES (?, ?, ?, ?)", (data.waiting_run, 0, text, stored_instant(url, 1_700_000_000_000_000)))
    else:
        poison(url, data, text)
    client = console(url)
    if text == DEEP or url.startswith("sqlite"):
        job = f"/jobs/tasks/{data.completed_task}"
        page = client.get(job)
        assert page.status_code == 200 and "bytes of JSON" in texts(page.text, "job-result")[0]
        shows_corrupt_row(client.get(job + "?reveal=result"), "job-revealed-result")
        shows_corrupt_row(client.get(job + "?reveal=progress"), "job-revealed-progress")
        # A task whose arguments cannot be read: its page says so, and renders.
        pending = client.get(f"/jobs/tasks/{data.pending_task}?reveal=payload")
        assert pending.status_code == 200
        assert texts(pending.text, "job-payload-hidden") == [
            "its stored envelope cannot be read (a row another client wrote)"]
        assert client.get("/jobs?queue=tasks").status_code == 200
    run = f"/runs/{data.waiting_run}"
    assert client.get(run).status_code == 200
    shows_corrupt_row(client.get(run + "?reveal=payload"), "run-revealed-payload")
    shows_corrupt_row(client.get(run + "?reveal=result"), "run-revealed-result")
    shows_corrupt_row(client.get(run + "?reveal=checkpoint"), "run-revealed-checkpoint")
    consent = f"/consents/{data.pending_consent}"
    assert client.get(consent).status_code == 200
    shows_corrupt_row(client.get(consent + "?reveal=payload"), "consent-revealed-payload")
    assert client.get("/runs").status_code == 200 and client.get("/consents").status_code == 200


def test_the_api_answers_corrupt_row_for_the_same_values(seeded_url: tuple[str, Seeded]) -> None:
    """What the console mirrors: the API's own reads of the poisoned values."""
    url, data = seeded_url
    poison(url, data, DEEP)

    async def read() -> list[str]:
        reasons = []
        async with TaskSource(url) as tasks, RunLedger(url) as ledger:
            for call in (lambda: tasks.get_job(data.completed_task), lambda: ledger.get(data.waiting_run),
                         lambda: ledger.consents.get(data.pending_consent)):
                try:
                    await call()
                except TenureError as error:
                    reasons.append(error.reason)
        return reasons

    assert _run_async(read()) == ["corrupt_row"] * 3


def test_a_value_as_deep_as_tenure_reads_is_revealed_and_one_level_deeper_is_corrupt_row(
    seeded_url: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded_url
    client = console(url)
    path = f"/runs/{data.waiting_run}?reveal=payload"
    for depth, readable in ((MAX_JSON_DEPTH, True), (MAX_JSON_DEPTH + 1, False)):
        text = '{"x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"
        raw(url, "UPDATE tenure_runs SET payload_json = ? WHERE run_id = ?", (text, data.waiting_run))
        response = client.get(path)
        assert response.status_code == 200
        [shown] = by_testid(response.text, "run-revealed-payload")
        if readable:
            assert json.loads(shown.text) == json.loads(text)
        else:
            assert shown.text == UNREADABLE_TEXT
