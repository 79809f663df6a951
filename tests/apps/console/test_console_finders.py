"""The listing finders the console pages with (``listed_page``, ``runs_listing``,
``pending_page``, ``decided_page``): each selects exactly the rows its filters and its
page position say, in the order its keyset assumes (kernel data against plain Python);
on both databases a page read through the store is exactly the finder's selection (SQL
against the finder), and on PostgreSQL a deep page of Runs starts at its position in the
index instead of scanning from the newest Run."""

from __future__ import annotations

import types
from typing import Any

import pytest
from adapter_support import _run_async, raw
from hypothesis import given
from hypothesis import strategies as st

from tenure.kernel.consents import finders as consent_finders
from tenure.kernel.queue import finders as queue_finders
from tenure.kernel.runs import finders as run_finders
from tenure.model import ConsentStatus, JobStatus, RunStatus

instants = st.integers(0, 5)
ids = st.sampled_from(["a", "b", "c", "d"])


@given(row=st.builds(types.SimpleNamespace, job_id=ids, status=st.sampled_from(JobStatus),
                     queue_name=st.sampled_from(["q1", "q2"]), task_name=st.sampled_from(["t1", "t2"]),
                     created_at_us=instants),
       wanted=st.fixed_dictionaries({}, optional={"status": st.sampled_from(JobStatus),
                                                 "queue_name": st.sampled_from(["q1", "q2"]),
                                                 "task_name": st.sampled_from(["t1", "t2"]),
                                                 "created_before": instants, "after_id": ids}))
def test_listed_page_selects_the_rows_of_its_filters_before_the_position(row: Any, wanted: dict[str, Any]) -> None:
    finder = queue_finders.listed_page(
        status="status" in wanted, queue_name="queue_name" in wanted, task_name="task_name" in wanted,
        created_before="created_before" in wanted, after="after_id" in wanted)
    expected = (
        all(getattr(row, field) == wanted[field] for field in ("status", "queue_name", "task_name") if field in wanted)
        and ("created_before" not in wanted or row.created_at_us <= wanted["created_before"])
        and ("after_id" not in wanted or row.job_id < wanted["after_id"])
    )
    assert finder.matches(row, wanted) == expected
    assert finder.order == ("-job_id",) and finder.lock == "none"


@given(row=st.builds(types.SimpleNamespace, run_id=ids, status=st.sampled_from(RunStatus),
                     queue=st.sampled_from(["r1", "r2"]), workflow_name=st.sampled_from(["w1", "w2"]),
                     created_at_us=instants),
       wanted=st.fixed_dictionaries({}, optional={"status": st.sampled_from(RunStatus),
                                                 "queue": st.sampled_from(["r1", "r2"]),
                                                 "workflow": st.sampled_from(["w1", "w2"]),
                                                 "after": st.tuples(instants, ids)}))
def test_runs_listing_selects_the_runs_of_its_filters_after_the_position_newest_first(
    row: Any, wanted: dict[str, Any],
) -> None:
    parameters = {name: value for name, value in wanted.items() if name != "after"}
    if "after" in wanted:
        parameters.update(after_created=wanted["after"][0], after_id=wanted["after"][1])
    finder = run_finders.runs_listing(status="status" in wanted, queue="queue" in wanted,
                                      workflow="workflow" in wanted, after="after" in wanted)
    expected = (
        ("status" not in wanted or row.status is wanted["status"])
        and ("queue" not in wanted or row.queue == wanted["queue"])
        and ("workflow" not in wanted or row.workflow_name == wanted["workflow"])
        and ("after" not in wanted or (row.created_at_us, row.run_id) < wanted["after"])
    )
    assert finder.matches(row, parameters) == expected
    assert finder.order == ("-created_at_us", "-run_id")


@given(row=st.builds(types.SimpleNamespace, consent_id=ids, status=st.sampled_from(ConsentStatus),
                     created_at_us=instants, decided_at_us=instants),
       after=st.none() | st.tuples(instants, ids))
def test_the_inbox_finders_split_consents_into_pending_oldest_first_and_decided_latest_first(
    row: Any, after: tuple[int, str] | None,
) -> None:
    if row.status is ConsentStatus.PENDING:
        row.decided_at_us = None  # INV-C2: a consent has a decision time exactly when it is not pending
    pending = consent_finders.pending_page(after=after is not None)
    decided = consent_finders.decided_page(after=after is not None)
    position: dict[str, Any] = dict(consent_finders.PENDING_PARAMETERS)
    if after is not None:
        position.update(after_created=after[0], after_decided=after[0], after_id=after[1])
    is_pending = row.status is ConsentStatus.PENDING
    assert pending.matches(row, position) == (
        is_pending and (after is None or (row.created_at_us, row.consent_id) > after))
    assert decided.matches(row, position) == (
        not is_pending and (after is None or (row.decided_at_us, row.consent_id) < after))
    assert pending.order == ("created_at_us", "consent_id")
    assert decided.order == ("-decided_at_us", "-consent_id")


@pytest.mark.parametrize("database", ["postgresql"])
def test_a_deep_page_of_runs_starts_at_its_position_in_the_created_index(console_url: str) -> None:
    from tenure.adapters.core.sql import POSTGRESQL, compile_finder
    from tenure.adapters.runs.table import RUNS_BINDING

    finder = run_finders.runs_listing(after=True)
    compiled = compile_finder(RUNS_BINDING, finder, POSTGRESQL, None, limited=True)
    sql = (compiled.sql.replace(":after_created", "'2026-01-01T00:00:00Z'::timestamptz")
           .replace(":after_id", "'m'").replace(":limit", "51"))

    async def plan() -> str:
        import asyncpg

        connection = await asyncpg.connect(console_url)
        try:
            await connection.execute("SET enable_seqscan = off")  # a table of a few rows: the plan for many
            return "\n".join(str(row[0]) for row in await connection.fetch("EXPLAIN " + sql))
        finally:
            await connection.close()

    text = _run_async(plan())
    assert "ix_tenure_runs_created" in text, text
    assert "Index Cond: (created_at <=" in text, text


def test_a_page_read_through_the_store_is_exactly_the_finders_selection(console_url: str) -> None:
    from console_seed import seed

    from tenure.apps.console.reads import ConsoleData

    data = _run_async(seed(console_url))

    async def pages() -> tuple[list[str], list[str]]:
        console = ConsoleData(console_url)
        try:
            tasks: list[str] = []
            after = None
            while True:
                page = await console.jobs_page("tasks", status=None, task_queue=None, task=None, older_than=None,
                                               after=after, limit=1)
                tasks += [row.job_id for row in page.rows]
                if page.next_after is None:
                    break
                after = page.next_after
            runs: list[str] = []
            position = None
            while True:
                run_page = await console.runs_page(status=None, queue=None, workflow=None, after=position, limit=1)
                runs += [row.run_id for row in run_page.rows]
                if run_page.next_after is None:
                    break
                created, _, run_id = run_page.next_after.partition(":")
                position = (int(created), run_id)
            return tasks, runs
        finally:
            await console.close()

    tasks, runs = _run_async(pages())
    stored = raw(console_url, "SELECT id FROM tenure_tasks")
    assert tasks == sorted((row[0] for row in stored), reverse=True)
    assert set(runs) == {data.waiting_run, data.decided_run, data.queued_run, data.failed_run}
    assert runs == [data.failed_run, data.queued_run, data.decided_run, data.waiting_run]
