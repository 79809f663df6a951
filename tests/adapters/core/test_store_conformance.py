"""The store primitives, for every (database, machine table): one conformance suite.

Generated records of each machine are stored through the shared primitives and must read
back as themselves; every kernel finder, compiled to each database's SQL, must select
exactly the stored rows its Python predicate selects, in its order and within its limit;
snapshot probes must answer as the predicates do at the snapshot's time; and the
compare-and-set writes must refuse a row that changed. A new machine's binding joins by
adding its records strategy and finder cases below.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from adapter_support import raw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenure.adapters import upgrade
from tenure.adapters.agent_jobs.table import AGENT_JOBS_BINDING
from tenure.adapters.attempts.table import ATTEMPTS_BINDING
from tenure.adapters.consents.table import CONSENTS_BINDING
from tenure.adapters.core.dialects import open_store
from tenure.adapters.core.store import Probe
from tenure.adapters.core.tables import Binding
from tenure.adapters.nodes.table import NODES_BINDING
from tenure.adapters.queue.table import HOPS_BINDING, binding_for
from tenure.adapters.runs.table import DELIVERIES_BINDING, RUNS_BINDING
from tenure.conformance.strategies.agent_jobs import job_records
from tenure.conformance.strategies.attempts import attempt_records
from tenure.conformance.strategies.consents import consent_records
from tenure.conformance.strategies.nodes import NOW as NODE_NOW
from tenure.conformance.strategies.nodes import node_records
from tenure.conformance.strategies.queues import NOW, QUEUE_NAMES, TASK_NAMES, TOKENS, records
from tenure.conformance.strategies.runs import run_records
from tenure.kernel.agent_jobs import finders as job_finders
from tenure.kernel.attempts import finders as attempt_finders
from tenure.kernel.consents import finders as consent_finders
from tenure.kernel.core import Finder
from tenure.kernel.nodes import finders as node_finders
from tenure.kernel.queue import finders as queue_finders
from tenure.kernel.queue.record import dedupe_key_of
from tenure.kernel.runs import finders as run_finders
from tenure.kernel.runs.record import key_of
from tenure.model import JobStatus, QueueKind, RunStatus, TenureError, canonical_json

times = st.integers(NOW - 10**12, NOW + 10**12) | st.integers(NOW - 3, NOW + 3)


def _unique_queue_rows(rows: list[Any]) -> list[Any]:
    """Generated queue records made to fit the table's unique constraints."""
    made = []
    for number, row in enumerate(rows):
        changes: dict[str, Any] = {"job_id": f"job-{number}"}
        if row.run_id is not None:
            changes["run_id"] = f"run-{number}"
        if row.claim_token is not None:
            changes["claim_token"] = f"{row.claim_token}-{number}"
        if row.submission_id is not None:
            changes["submission_id"] = f"{row.submission_id}-{number}"
        if row.idempotency_key is not None:
            changes["idempotency_key"] = f"{row.idempotency_key}-{number}"
        if row.active_key is not None:
            changes["active_key"] = f"{row.active_key}-{number}"
        made.append(dataclasses.replace(row, **changes))
    return made


def _unique_attempt_rows(rows: list[Any]) -> list[Any]:
    return [
        dataclasses.replace(row, attempt_id=f"attempt-{number}", idempotency_key=f"key-{number}",
                            owner_job_id=f"owner-{number % 3}", generation=number // 3 + 1,
                            run_id=RUN_IDS[number % 3])
        for number, row in enumerate(rows)
    ]


RUN_IDS = ["run-0", "run-1", None]
"""The Runs the owner rows (attempts, consents, jobs) belong to: two, and none."""
SESSIONS = ["session-1", "session-2", None]


def _unique_runs(pairs: list[Any]) -> list[Any]:
    """The Runs of generated pairs (each keeping every invariant), one ID each, spread
    over two sessions and none."""
    return [
        dataclasses.replace(pair.run, run_id=f"run-{number}", session_id=SESSIONS[number % 3])
        for number, pair in enumerate(pairs)
    ]


def _unique_deliveries(pairs: list[Any]) -> list[Any]:
    """The deliveries of generated pairs, one Run each: at most one unsettled per Run
    (the partial unique index) because each pair keeps INV-R2."""
    return [
        dataclasses.replace(delivery, run_id=f"run-{number}", delivery_id=key_of(f"run-{number}", delivery.enqueue_seq))
        for number, pair in enumerate(pairs)
        for delivery in pair.deliveries
    ]


def _unique_consents(rows: list[Any]) -> list[Any]:
    return [dataclasses.replace(row, consent_id=f"consent-{number}", run_id=RUN_IDS[number % 2])
            for number, row in enumerate(rows)]


def _unique_jobs(rows: list[Any]) -> list[Any]:
    made = []
    for number, row in enumerate(rows):
        job_id = f"job-{number}"
        result = row.result_json
        if result is not None:  # a result names its own job (INV-J2)
            result = canonical_json({**json.loads(result), "job_id": job_id})
        made.append(dataclasses.replace(row, job_id=job_id, request_id=f"request-{number}",
                                        run_id=RUN_IDS[number % 2], result_json=result))
    return made


@dataclasses.dataclass(frozen=True)
class TableCase:
    binding: Binding
    rows: st.SearchStrategy[list[Any]]
    finders: Callable[[list[Any]], st.SearchStrategy[tuple[Finder, dict[str, Any]]]]


def _queue_finders(queue: QueueKind) -> Callable[[list[Any]], st.SearchStrategy[tuple[Finder, dict[str, Any]]]]:
    return lambda rows: _queue_finders_over(queue, rows)


def _queue_finders_over(queue: QueueKind, rows: list[Any]) -> st.SearchStrategy[tuple[Finder, dict[str, Any]]]:
    tokens = [row.claim_token for row in rows if row.claim_token] + TOKENS
    return st.one_of(
        st.tuples(st.sampled_from([queue_finders.eligible, queue_finders.eligible_legacy, queue_finders.expired]),
                  times.map(lambda now: {"now": now})),
        st.tuples(st.just(queue_finders.finished_before), times.map(lambda cutoff: {"cutoff": cutoff})),
        st.tuples(st.just(queue_finders.tokens_stored),
                  st.lists(st.sampled_from(tokens), max_size=3).map(lambda chosen: {"tokens": chosen})),
        st.tuples(st.just(queue_finders.all_rows), st.just({})),
        st.tuples(st.just(queue_finders.with_status), st.sampled_from(JobStatus).map(lambda status: {"status": status})),
        st.tuples(st.sampled_from([queue_finders.eligible_tasks, queue_finders.eligible_tasks_legacy,
                                   queue_finders.claimable_tasks]),
                  st.tuples(times, st.lists(st.sampled_from(QUEUE_NAMES), min_size=1, max_size=2, unique=True)).map(
                      lambda chosen: {"now": chosen[0], "queues": chosen[1]}))
        if queue is QueueKind.TASK else st.nothing(),
        st.tuples(st.sampled_from([queue_finders.eligible_task_queue, queue_finders.claimable_task_queue_legacy]),
                  st.tuples(times, st.sampled_from(QUEUE_NAMES)).map(
                      lambda chosen: {"now": chosen[0], "queue": chosen[1]}))
        if queue is QueueKind.TASK else st.nothing(),
        st.tuples(st.sampled_from([queue_finders.listed(queue_name=True), queue_finders.listed(task_name=True),
                                   queue_finders.listed(status=True, queue_name=True, task_name=True),
                                   queue_finders.listed(task_name=True, newest_first=True)]),
                  st.fixed_dictionaries({"queue_name": st.sampled_from(QUEUE_NAMES),
                                         "task_name": st.sampled_from(TASK_NAMES),
                                         "status": st.sampled_from(JobStatus)})).map(
            lambda chosen: (chosen[0], {name: chosen[1][name] for name in chosen[0].parameters()}))
        if queue is QueueKind.TASK else st.nothing(),
        st.tuples(st.just(queue_finders.locate(queue)), st.fixed_dictionaries({
            "submission_id": st.sampled_from([None, "sub-1-0", *(row.submission_id for row in rows if row.submission_id)]),
            "job_id": st.sampled_from(["job-0", "job-1", "job-9"]),
            "run_id": st.sampled_from([None, "run-0", "run-9"]),
            "key": st.sampled_from([None, *(dedupe_key_of(row) for row in rows if dedupe_key_of(row))]),
        })),
    )


def _attempt_finders(rows: list[Any]) -> st.SearchStrategy[tuple[Finder, dict[str, Any]]]:
    created = [row.created_at_us for row in rows] or [NOW]
    return st.one_of(
        st.tuples(st.just(attempt_finders.unresolved), st.just({})),
        # The Run ledger's readers of attempts: a Run's owner, and its unresolved attempts.
        st.tuples(st.just(run_finders.attempts_by_keys),
                  st.lists(st.sampled_from(["attempt-0", "attempt-2", "attempt-9"]), max_size=3).map(
                      lambda keys: {"keys": keys})),
        st.tuples(st.just(run_finders.open_attempts_of_run),
                  st.sampled_from(["run-0", "run-1", "run-9"]).map(lambda run_id: {"run_id": run_id})),
        st.tuples(st.just(attempt_finders.unresolved_after), st.fixed_dictionaries({
            "after_created": st.sampled_from(created).flatmap(lambda at: st.integers(at - 1, at + 1)),
            "after_id": st.sampled_from(["attempt-0", "attempt-1", "attempt-5"]),
        })),
    )


def _run_finders(rows: list[Any]) -> st.SearchStrategy[tuple[Finder, dict[str, Any]]]:
    created = [row.created_at_us for row in rows] or [NOW]
    run_ids = st.sampled_from(["run-0", "run-1", "run-3", "run-9", "RUN-0"])
    sessions = st.sampled_from(["session-1", "session-2", "SESSION-1", "session-1 ", "session-9"])

    def page(flags: tuple[bool, bool, bool]) -> st.SearchStrategy[tuple[Finder, dict[str, Any]]]:
        status, session, after = flags
        parameters: dict[str, Any] = {}
        if status:
            parameters["status"] = st.sampled_from(RunStatus)
        if session:
            parameters["session_id"] = sessions
        if after:
            parameters["after_created"] = st.sampled_from(created).flatmap(lambda at: st.integers(at - 1, at + 1))
            parameters["after_id"] = run_ids
        finder = run_finders.runs_page(status=status, session=session, after=after)
        return st.tuples(st.just(finder), st.fixed_dictionaries(parameters))

    return st.one_of(
        st.tuples(st.just(run_finders.runs_by_keys), st.lists(run_ids, max_size=3).map(lambda keys: {"keys": keys})),
        st.tuples(st.just(run_finders.session_open), sessions.map(lambda session: {"session_id": session})),
        st.tuples(st.booleans(), st.booleans(), st.booleans()).flatmap(page),
    )


def _delivery_finders(rows: list[Any]) -> st.SearchStrategy[tuple[Finder, dict[str, Any]]]:
    keys = [row.delivery_id for row in rows] + ["run:run-9:0", "run:run-0:7"]
    return st.tuples(st.just(run_finders.deliveries_by_keys),
                     st.lists(st.sampled_from(keys), max_size=3).map(lambda chosen: {"keys": chosen}))


def _owner_finders(by_keys: Finder, of_run: Finder, prefix: str) -> Callable[[list[Any]], st.SearchStrategy[tuple[Finder, dict[str, Any]]]]:
    keys = st.sampled_from([f"{prefix}-0", f"{prefix}-1", f"{prefix}-3", f"{prefix}-9"])
    runs = st.sampled_from(["run-0", "run-1", "run-9", "RUN-0"])
    return lambda rows: st.one_of(
        st.tuples(st.just(by_keys), st.lists(keys, max_size=3).map(lambda chosen: {"keys": chosen})),
        st.tuples(st.just(of_run), runs.map(lambda run_id: {"run_id": run_id})),
    )


def _consent_finders(rows: list[Any]) -> st.SearchStrategy[tuple[Finder, dict[str, Any]]]:
    deadlines = [row.expires_at_us for row in rows if row.expires_at_us is not None] or [NOW]
    return st.one_of(
        _owner_finders(consent_finders.consents_by_keys, run_finders.pending_consents_of_run, "consent")(rows),
        # The deadline owner's page: at, just before and just after a stored deadline, or anywhere.
        st.tuples(st.just(consent_finders.due_consents),
                  (st.sampled_from(deadlines).flatmap(lambda at: st.integers(at - 1, at + 1)) | times).map(
                      lambda now: {"now": now})),
    )


def _unique_nodes(rows: list[Any]) -> list[Any]:
    return [dataclasses.replace(row, node=f"node-{index}") for index, row in enumerate(rows)]


CASES = {
    **{
        f"queue.{queue.value}": TableCase(
            binding_for(queue),
            st.lists(records(queue=queue).filter(lambda r: r is not None), max_size=6).map(_unique_queue_rows),
            _queue_finders(queue),
        )
        for queue in QueueKind
    },
    # The Run hops' table: the validation queue's rows in a table of its own.
    "queue.tenure_run_hops": TableCase(
        HOPS_BINDING,
        st.lists(records(queue=QueueKind.VALIDATION).filter(lambda r: r is not None), max_size=6)
        .map(_unique_queue_rows),
        _queue_finders(QueueKind.VALIDATION),
    ),
    "attempts": TableCase(
        ATTEMPTS_BINDING,
        st.lists(attempt_records().filter(lambda r: r is not None), max_size=6).map(_unique_attempt_rows),
        _attempt_finders,
    ),
    "runs": TableCase(
        RUNS_BINDING,
        st.lists(run_records().filter(lambda pair: pair is not None), max_size=6).map(_unique_runs),
        _run_finders,
    ),
    "run_deliveries": TableCase(
        DELIVERIES_BINDING,
        st.lists(run_records().filter(lambda pair: pair is not None), max_size=5).map(_unique_deliveries),
        _delivery_finders,
    ),
    "consents": TableCase(
        CONSENTS_BINDING,
        st.lists(consent_records().filter(lambda r: r is not None), max_size=6).map(_unique_consents),
        _consent_finders,
    ),
    "run_nodes": TableCase(
        NODES_BINDING,
        st.lists(node_records().filter(lambda r: r is not None), max_size=6).map(_unique_nodes),
        lambda rows: st.one_of(
            st.tuples(st.just(node_finders.nodes_by_keys),
                      st.lists(st.sampled_from(["node-0", "node-1", "node-3", "NODE-0"]), max_size=3)
                      .map(lambda chosen: {"keys": chosen})),
            st.tuples(st.just(node_finders.expired_nodes),
                      st.sampled_from([NODE_NOW - 10**9, NODE_NOW, NODE_NOW + 10**9]).map(lambda now: {"now": now})),
        ),
    ),
    "agent_jobs": TableCase(
        AGENT_JOBS_BINDING,
        st.lists(job_records().filter(lambda r: r is not None), max_size=6).map(_unique_jobs),
        _owner_finders(job_finders.jobs_by_keys, run_finders.open_jobs_of_run, "job"),
    ),
}


def _expected(binding: Binding, finder: Finder, rows: list[Any], parameters: dict[str, Any], limit: int | None) -> list[Any]:
    chosen = finder.sorted(row for row in rows if finder.matches(row, parameters))
    return chosen if limit is None else chosen[:limit]


def _in_order(binding: Binding, finder: Finder, found: list[Any]) -> list[Any]:
    """A finder without an order promises none: compare its rows by key."""
    return found if finder.order else sorted(found, key=lambda row: getattr(row, binding.key_field))


class Harness:
    """One database (migrated), one store, one event loop for a whole test."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.runner = asyncio.Runner()
        self.runner.run(upgrade(db_url))
        self.store = open_store(db_url, timeout_seconds=30)

    def reset(self, binding: Binding, rows: list[Any]) -> None:
        raw(self.db_url, f"DELETE FROM {binding.spec.name}")

        async def insert() -> list[Any]:
            async with self.store.transaction(write=True) as tx:
                return [await tx.insert(binding, row) for row in rows]

        assert self.runner.run(insert()) == rows, "every record stores and reads back as itself"

    def run(self, coroutine: Any) -> Any:
        return self.runner.run(coroutine)

    def close(self) -> None:
        try:
            self.runner.run(self.store.close())
        finally:
            self.runner.close()


@pytest.fixture
def harness(fresh_db_url: str) -> Any:
    made = Harness(fresh_db_url)
    yield made
    made.close()


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("case", sorted(CASES))
@SETTINGS
@given(data=st.data())
def test_stored_records_read_back_as_themselves_and_finders_select_what_their_predicates_select(
    harness: Harness, case: str, data: st.DataObject
) -> None:
    table = CASES[case]
    binding = table.binding
    rows = data.draw(table.rows)
    harness.reset(binding, rows)

    async def check() -> None:
        async with harness.store.transaction(write=False) as tx:
            assert sorted(await tx.read(binding, [getattr(r, binding.key_field) for r in rows]),
                          key=lambda r: getattr(r, binding.key_field)) == sorted(rows, key=lambda r: getattr(r, binding.key_field))
            for _ in range(3):
                finder, parameters = data.draw(table.finders(rows))
                limit = data.draw(st.none() | st.integers(1, 4))
                if finder.lock == "wait":
                    found = await tx.locked(binding, finder, parameters)
                    expected = _expected(binding, finder, rows, parameters, None)
                else:
                    if not finder.order:
                        limit = None  # a limit without an order selects arbitrary rows
                    found = await tx.find(binding, finder, parameters, limit)
                    expected = _expected(binding, finder, rows, parameters, limit)
                assert _in_order(binding, finder, found) == _in_order(binding, finder, expected), finder.name

    harness.run(check())


@pytest.mark.parametrize("case", ["queue.validation", "queue.streaming"])
@SETTINGS
@given(data=st.data())
def test_a_snapshot_answers_its_probes_at_the_snapshots_own_time(harness: Harness, case: str, data: st.DataObject) -> None:
    table = CASES[case]
    binding = table.binding
    rows = data.draw(table.rows)
    harness.reset(binding, rows)
    tokens = data.draw(st.lists(st.sampled_from([r.claim_token for r in rows if r.claim_token] + TOKENS), max_size=3))
    limit = data.draw(st.integers(1, 4))

    async def check() -> None:
        async with harness.store.transaction(write=True) as tx:
            exists, stored, eligible = await tx.snapshot(binding, [
                Probe(queue_finders.expired, {}, "exists", limit=1),
                Probe(queue_finders.tokens_stored, {"tokens": tokens}, "values", field="claim_token"),
                Probe(queue_finders.eligible, {}, "rows", limit=limit),
            ])
            now = await tx.now_us()
            assert exists == bool(_expected(binding, queue_finders.expired, rows, {"now": now}, None))
            assert sorted(stored) == sorted(r.claim_token for r in _expected(binding, queue_finders.tokens_stored, rows, {"tokens": tokens}, None))
            assert eligible == _expected(binding, queue_finders.eligible, rows, {"now": now}, limit)

    harness.run(check())


@pytest.mark.parametrize("case", sorted(CASES))
@SETTINGS
@given(data=st.data())
def test_a_compare_and_set_writes_only_over_the_row_it_decided_on(harness: Harness, case: str, data: st.DataObject) -> None:
    table = CASES[case]
    binding = table.binding
    rows = data.draw(table.rows.filter(bool))
    harness.reset(binding, rows)
    old = data.draw(st.sampled_from(rows))
    mutable = [column for column in binding.spec.columns if column.mutable and column.part is None]
    column = data.draw(st.sampled_from(mutable))
    other = next((getattr(r, column.field) for r in rows if getattr(r, column.field) != getattr(old, column.field)), None)
    if other is None:
        return  # every row holds the same value: nothing to change it to here
    stale = dataclasses.replace(old, **{column.field: other})

    async def check() -> None:
        with pytest.raises(TenureError) as caught:
            async with harness.store.transaction(write=True) as tx:
                await tx.update_many(binding, [(stale, old)], read_back=False)
        assert caught.value.reason == "row_changed"
        async with harness.store.transaction(write=True) as tx:
            assert await tx.delete(binding, stale) is False
            assert await tx.update_many(binding, [(old, old)], read_back=True) == [old]
            assert await tx.delete(binding, old) is True
            assert await tx.read(binding, [getattr(old, binding.key_field)]) == []

    harness.run(check())


def test_the_suite_covers_every_registered_table() -> None:
    from tenure.adapters.core.registry import BINDINGS

    assert {case.binding.name for case in CASES.values()} == {binding.name for binding in BINDINGS}
