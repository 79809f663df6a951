"""The console's list pages are index-backed (schema step ``console_v1``), and their keyset
paging is exact across equal sort keys.

Plans, on both databases: every default list and every single-filter list (first page
and a page after a position) reads an index in the page's order, with no sort step.
SQLite: ``EXPLAIN QUERY PLAN`` names the index and has no ``USE TEMP B-TREE``; its
planner has no statistics here, so the plan is the one a large table gets. PostgreSQL:
with sorts, sequential scans and bitmap scans priced out of reach, ``EXPLAIN`` still has
no ``Sort`` node and scans the filter's own index, so an index path in the page's order
exists whatever the table holds (a planner that had to sort would sort anyway; with
statistics it may still prefer walking the primary key for a filter most rows meet,
which is sort-free too). Every other filter combination the pages
offer is sort-free too (it is checked on the rows of one of those ranges).

Ties, through the console's reads with one row a page: Runs made to share one
``created_at``, pending consents one ``created_at`` and decided ones one ``decided_at``
by a raw UPDATE (no sleeps between writes) each appear exactly once, in ID order inside
the tie; so do the tasks and validation jobs of a status-filtered or queue-filtered list
that share a creation time."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from typing import Any

import pytest
from adapter_support import _run_async, kind_of, raw
from console_seed import PIN, _intent, park_on_consent

from tenure.adapters import RunLedger
from tenure.adapters.consents.table import CONSENTS_BINDING
from tenure.adapters.core.sql import POSTGRESQL, SQLITE, compile_finder
from tenure.adapters.core.tables import Binding
from tenure.adapters.queue.sources import TaskSource, ValidationJobSource
from tenure.adapters.queue.table import QUEUE_BINDINGS, TASKS_BINDING
from tenure.adapters.runs.table import RUNS_BINDING
from tenure.kernel.consents import finders as consent_finders
from tenure.kernel.core import Finder
from tenure.kernel.queue import finders as queue_finders
from tenure.kernel.runs import finders as run_finders
from tenure.model import ConsentStatus, JobStatus, RunStatus, TaskJob, ValidationJob

INSTANT_US = 1_780_000_000_000_000
VALUES: dict[str, Any] = {
    "status": JobStatus.PENDING, "queue_name": "emails", "task_name": "send", "created_before": INSTANT_US,
    "after_id": "5", "after_created": INSTANT_US, "after_decided": INSTANT_US, "queue": "runs",
    "workflow": "review", "limit": 51, **consent_finders.PENDING_PARAMETERS,
}
INSTANTS = {"created_before", "after_created", "after_decided"}


def _values(binding: Binding) -> dict[str, Any]:
    values = dict(VALUES)
    if binding is RUNS_BINDING:
        values["status"] = RunStatus.QUEUED
    return values


def _sqlite_plan(db_url: str, binding: Binding, finder: Finder) -> str:
    compiled = compile_finder(binding, finder, SQLITE, None, limited=True)
    rows = raw(db_url, "EXPLAIN QUERY PLAN " + compiled.sql, compiled.parameters(_values(binding)))
    return "\n".join(str(row[3]) for row in rows)


def _postgresql_plan(db_url: str, binding: Binding, finder: Finder) -> str:
    import asyncpg

    compiled = compile_finder(binding, finder, POSTGRESQL, None, limited=True)
    bound = compiled.parameters(_values(binding))
    sql = compiled.sql
    for name in sorted(bound, key=len, reverse=True):  # :after_id before :after
        value = bound[name]
        literal = (f"to_timestamp({value} / 1e6)" if name in INSTANTS else
                   str(value) if isinstance(value, int) else "'" + str(value) + "'")
        sql = sql.replace(":" + name, literal)

    async def plan() -> str:
        connection = await asyncpg.connect(db_url)
        try:
            # Price every way of sorting out of reach: a plan that still has no Sort node
            # reads an index in the page's order (a plan that needed one would keep it).
            for setting in ("enable_sort", "enable_seqscan", "enable_bitmapscan"):
                await connection.execute(f"SET {setting} = off")
            return "\n".join(str(row[0]) for row in await connection.fetch("EXPLAIN " + sql))
        finally:
            await connection.close()

    return _run_async(plan())


def _plan(db_url: str, binding: Binding, finder: Finder) -> str:
    return (_sqlite_plan if kind_of(db_url) == "sqlite" else _postgresql_plan)(db_url, binding, finder)


def _assert_sort_free(db_url: str, plan: str, index: str | None = None) -> None:
    if kind_of(db_url) == "sqlite":
        assert "USE TEMP B-TREE" not in plan, plan
        if index is not None:
            assert f"USING INDEX {index} " in plan + " " or f"USING COVERING INDEX {index} " in plan + " ", plan
    else:
        assert "Sort" not in plan and "Seq Scan" not in plan, plan
        assert "Index Scan" in plan or "Index Only Scan" in plan, plan
        if index is not None:
            # Not only sort-free (a walk of the primary key checking the filter is that
            # too): the filter's own index, searched by the filter.
            name = index.replace("sqlite_autoindex_", "").replace("_1", "_pkey") if "autoindex" in index else index
            assert f" using {name} on " in plan, plan


JOB_TABLES = {"tasks": TASKS_BINDING, **{kind.value: binding for kind, binding in QUEUE_BINDINGS.items()}}


def _index_backed() -> list[tuple[str, Binding, Finder, str]]:
    """(label, binding, finder, the index SQLite reads) of each default and single-filter
    list page, first and after a position."""
    cases: list[tuple[str, Binding, Finder, str]] = []
    for after in (False, True):
        for name, binding in JOB_TABLES.items():
            table = binding.spec.name
            cases.append((f"{name} jobs", binding, queue_finders.listed_page(after=after),
                          f"sqlite_autoindex_{table}_1"))
            cases.append((f"{name} jobs of a status", binding, queue_finders.listed_page(status=True, after=after),
                          f"ix_{table}_status_id"))
        cases.append(("tasks of a task queue", TASKS_BINDING, queue_finders.listed_page(queue_name=True, after=after),
                      "ix_tenure_tasks_queue_id"))
        cases.append(("Runs", RUNS_BINDING, run_finders.runs_listing(after=after), "ix_tenure_runs_created"))
        for filter_name in ("status", "queue", "workflow"):
            cases.append((f"Runs of a {filter_name}", RUNS_BINDING,
                          run_finders.runs_listing(after=after, **{filter_name: True}),
                          f"ix_tenure_runs_{filter_name}_created"))
        cases.append(("pending consents", CONSENTS_BINDING, consent_finders.pending_page(after=after),
                      "ix_tenure_consents_status_created"))
        cases.append(("decided consents", CONSENTS_BINDING, consent_finders.decided_page(after=after),
                      "ix_tenure_consents_decided"))
    return cases


def test_every_default_and_single_filter_list_page_reads_its_index_in_order_without_a_sort(console_url: str) -> None:
    seen = []
    for label, binding, finder, index in _index_backed():
        plan = _plan(console_url, binding, finder)
        _assert_sort_free(console_url, plan, index)
        seen.append(label)
    assert len(seen) == 2 * (2 * len(JOB_TABLES) + 1 + 4 + 2)


def test_every_filter_combination_the_pages_offer_is_read_in_order_without_a_sort(console_url: str) -> None:
    flags = (False, True)
    for status, queue_name, task_name, created_before, after in itertools.product(flags, repeat=5):
        finder = queue_finders.listed_page(status=status, queue_name=queue_name, task_name=task_name,
                                           created_before=created_before, after=after)
        _assert_sort_free(console_url, _plan(console_url, TASKS_BINDING, finder))
    for binding in QUEUE_BINDINGS.values():
        for status, created_before, after in itertools.product(flags, repeat=3):
            finder = queue_finders.listed_page(status=status, created_before=created_before, after=after)
            _assert_sort_free(console_url, _plan(console_url, binding, finder))
    for status, queue, workflow, after in itertools.product(flags, repeat=4):
        finder = run_finders.runs_listing(status=status, queue=queue, workflow=workflow, after=after)
        _assert_sort_free(console_url, _plan(console_url, RUNS_BINDING, finder))


# --- keyset paging across equal sort keys -------------------------------------------------


async def _all_pages(read: Any) -> list[str]:
    """Every row's ID, following ``read(after) -> (ids, next_after)`` one page at a time."""
    seen: list[str] = []
    after = None
    for _ in range(100):
        ids, after = await read(after)
        seen += ids
        if after is None:
            return seen
    raise AssertionError("paging never ended: " + repr(seen))


def test_runs_sharing_one_creation_time_each_appear_once_in_pages_of_one(console_url: str) -> None:
    from tenure.apps.console.reads import ConsoleData, parse_position
    from tenure.model import WorkflowPin

    async def admit() -> list[str]:
        async with RunLedger(console_url) as ledger:
            made = []
            for queue, workflow in (("runs", "review"), ("runs", "review"), ("other", "review"), ("runs", "ship"),
                                    ("other", "ship"), ("runs", "review")):
                admission = await ledger.admit(_intent(), workflow=WorkflowPin(workflow, "rev-1", PIN.digest),
                                               queue=queue, priority=50)
                made.append(admission.run.run_id)
            return made

    run_ids = _run_async(admit())
    raw(console_url, "UPDATE tenure_runs SET created_at = (SELECT min(created_at) FROM tenure_runs)")
    assert raw(console_url, "SELECT count(DISTINCT created_at) FROM tenure_runs") == [(1,)]
    cases = (
        ({}, run_ids),
        ({"status": RunStatus.QUEUED}, run_ids),
        ({"queue": "runs"}, [run_ids[i] for i in (0, 1, 3, 5)]),
        ({"workflow": "ship"}, [run_ids[3], run_ids[4]]),
        ({"queue": "other", "workflow": "review"}, [run_ids[2]]),
    )

    async def page_through() -> list[list[str]]:
        console = ConsoleData(console_url)
        try:
            listed = []
            for filters, _ in cases:
                wanted = {"status": None, "queue": None, "workflow": None, **filters}

                async def read(after: str | None, wanted: dict[str, Any] = wanted) -> tuple[list[str], str | None]:
                    position = None if after is None else parse_position(after, 36)
                    page = await console.runs_page(after=position, limit=1, **wanted)
                    assert len(page.rows) <= 1
                    return [row.run_id for row in page.rows], page.next_after

                listed.append(await _all_pages(read))
            return listed
        finally:
            await console.close()

    for (filters, expected), listed in zip(cases, _run_async(page_through()), strict=True):
        assert listed == sorted(expected, reverse=True), filters


def test_consents_sharing_one_time_each_appear_once_in_pages_of_one(console_url: str) -> None:
    from tenure.apps.console.reads import ConsoleData, parse_position

    async def make() -> tuple[list[str], list[str]]:
        async with RunLedger(console_url) as ledger:
            made = [(await park_on_consent(ledger, tool_name="files.delete"))[1] for _ in range(6)]
            for consent_id, verdict in zip(made[3:], (ConsentStatus.DENIED, ConsentStatus.GRANTED,
                                                      ConsentStatus.DENIED), strict=True):
                assert await ledger.consents.decide(consent_id, verdict, decided_by="carol")
            return made[:3], made[3:]

    pending, decided = _run_async(make())
    # One creation time for the pending ones (the earliest: deadlines stay after it), one
    # decision time for the decided ones (the latest: no decision before its creation).
    raw(console_url, "UPDATE tenure_consents SET created_at = (SELECT min(created_at) FROM tenure_consents) "
                     "WHERE status = 'pending'")
    raw(console_url, "UPDATE tenure_consents SET decided_at = (SELECT max(decided_at) FROM tenure_consents) "
                     "WHERE status <> 'pending'")
    for column, which in (("created_at", "="), ("decided_at", "<>")):
        assert raw(console_url, f"SELECT count(DISTINCT {column}) FROM tenure_consents "
                                f"WHERE status {which} 'pending'") == [(1,)]

    async def page_through() -> tuple[list[str], list[str], int]:
        console = ConsoleData(console_url)
        try:
            async def read_pending(after: str | None) -> tuple[list[str], str | None]:
                position = None if after is None else parse_position(after, 36)
                page = await console.consents_page(pending_after=position, decided_after=None, limit=1)
                return [row.consent_id for row in page.pending], page.pending_next

            async def read_decided(after: str | None) -> tuple[list[str], str | None]:
                position = None if after is None else parse_position(after, 36)
                page = await console.consents_page(pending_after=None, decided_after=position, limit=1)
                return [row.consent_id for row in page.decided], page.decided_next

            return await _all_pages(read_pending), await _all_pages(read_decided), await console.pending_consents()
        finally:
            await console.close()

    listed_pending, listed_decided, badge = _run_async(page_through())
    assert listed_pending == sorted(pending)
    assert listed_decided == sorted(decided, reverse=True)
    assert badge == 3


def test_jobs_of_a_status_or_a_task_queue_sharing_one_creation_time_each_appear_once_in_pages_of_one(
    console_url: str,
) -> None:
    from tenure.apps.console.reads import ConsoleData

    async def make() -> tuple[list[str], list[str]]:
        async with TaskSource(console_url) as tasks:
            task_ids = await tasks.submit_many([TaskJob(queue_name=queue, task_name="send", args={"n": n})
                                                for n, queue in enumerate(["emails", "reports"] * 4)])
            claimed = await tasks.claim_next_owned("worker-1", claim_token=uuid.uuid4().hex, queues=["emails"])
            assert claimed is not None and claimed.claim_fence is not None
        async with ValidationJobSource(console_url) as validation:
            job_ids = [await validation.submit_owned(ValidationJob("orders", "1.0", f"s3://bucket/{n}"),
                                                     submission_id=uuid.uuid4().hex) for n in range(4)]
        return task_ids, job_ids

    task_ids, job_ids = _run_async(make())
    for table in ("tenure_tasks", "validation_jobs"):
        raw(console_url, f"UPDATE {table} SET created_at = (SELECT min(created_at) FROM {table})")
    pending_tasks = {row[0] for row in raw(console_url, "SELECT id FROM tenure_tasks WHERE status = 'pending'")}
    assert len(pending_tasks) == 7
    cases = (
        ("tasks", {"status": JobStatus.PENDING}, pending_tasks),
        ("tasks", {"task_queue": "emails"}, set(task_ids[0::2])),
        ("tasks", {"task_queue": "emails", "status": JobStatus.PENDING}, set(task_ids[0::2]) & pending_tasks),
        ("tasks", {"status": JobStatus.PENDING, "older_than": dt.timedelta(0)}, pending_tasks),
        ("validation", {"status": JobStatus.PENDING}, set(job_ids)),
    )

    async def page_through() -> list[list[str]]:
        console = ConsoleData(console_url)
        try:
            listed = []
            for source, filters, _ in cases:
                wanted = {"status": None, "task_queue": None, "task": None, "older_than": None, **filters}

                async def read(after: str | None, source: str = source,
                               wanted: dict[str, Any] = wanted) -> tuple[list[str], str | None]:
                    page = await console.jobs_page(source, after=after, limit=1, **wanted)
                    assert len(page.rows) <= 1
                    return [row.job_id for row in page.rows], page.next_after

                listed.append(await _all_pages(read))
            return listed
        finally:
            await console.close()

    for (source, filters, expected), listed in zip(cases, _run_async(page_through()), strict=True):
        assert listed == sorted(expected, reverse=True), (source, filters)


@pytest.mark.parametrize("database", ["sqlite"])
def test_a_database_behind_console_v1_gets_the_indexes_from_upgrade_and_loses_them_on_downgrade(
    console_url: str,
) -> None:
    from tenure.adapters import downgrade, upgrade

    names = {"ix_validation_jobs_status_id", "ix_pipeline_jobs_status_id", "ix_streaming_jobs_status_id",
             "ix_tenure_tasks_status_id", "ix_tenure_tasks_queue_id", "ix_tenure_runs_status_created",
             "ix_tenure_runs_queue_created", "ix_tenure_runs_workflow_created", "ix_tenure_consents_status_created",
             "ix_tenure_consents_decided"}

    def present() -> set[str]:
        return {name for (name,) in raw(console_url, "SELECT name FROM sqlite_master WHERE type = 'index'")} & names

    assert present() == names
    for name in names:
        raw(console_url, f"DROP INDEX {name}")
    raw(console_url, "DELETE FROM tenure_migrations WHERE name = 'console_v1'")
    assert _run_async(upgrade(console_url)).applied == ("console_v1",)
    assert present() == names
    assert "console_v1" in _run_async(downgrade(console_url)).changed
    assert present() == set()
