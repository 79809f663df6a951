"""The store primitives' conformance suite, for every (database, machine table).

Generated records of each machine are stored through the shared primitives and must read
back as themselves; every kernel finder, compiled to the database's SQL, must select
exactly the stored rows its Python predicate selects, in its order and within its limit;
snapshot probes must answer as the predicates do at the snapshot's time; and the
compare-and-set writes must refuse a row that changed. A new machine's binding joins by
adding its records strategy and finder cases to :data:`TABLES`.

:func:`check_stores` runs each check of each case as a Hypothesis test of its own, on a
database an :class:`~tenure.conformance.lockstep.harness.ExampleDatabases` hands out (tenure's
test servers, or the scratch area ``tenure conform`` makes in a user's database), and
reports each outcome as a value: a failure is the failing example and its error, as
text. Nothing here needs pytest.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import tempfile
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import hypothesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.reporting import with_reporter

from tenure.adapters.agent_jobs.table import AGENT_JOBS_BINDING
from tenure.adapters.attempts.table import ATTEMPTS_BINDING
from tenure.adapters.consents.table import CONSENTS_BINDING
from tenure.adapters.core.store import Probe
from tenure.adapters.core.tables import Binding, qualified
from tenure.adapters.core.urls import parse_db_url
from tenure.adapters.messages.table import MESSAGES_BINDING
from tenure.adapters.nodes.table import NODES_BINDING
from tenure.adapters.queue.table import HOPS_BINDING, binding_for
from tenure.adapters.runs.table import DELIVERIES_BINDING, RUNS_BINDING
from tenure.adapters.wiring.dialects import open_store
from tenure.conformance.lockstep.harness import ExampleDatabases, LoopRunner
from tenure.conformance.lockstep.raw import raw
from tenure.conformance.strategies.agent_jobs import job_records
from tenure.conformance.strategies.attempts import attempt_records
from tenure.conformance.strategies.consents import consent_records
from tenure.conformance.strategies.messages import message_records
from tenure.conformance.strategies.nodes import NOW as NODE_NOW
from tenure.conformance.strategies.nodes import node_records
from tenure.conformance.strategies.queues import NOW, QUEUE_NAMES, TASK_NAMES, TOKENS, records
from tenure.conformance.strategies.runs import run_records
from tenure.kernel.agent_jobs import finders as job_finders
from tenure.kernel.attempts import finders as attempt_finders
from tenure.kernel.consents import finders as consent_finders
from tenure.kernel.core import Finder
from tenure.kernel.messages import finders as message_finders
from tenure.kernel.nodes import finders as node_finders
from tenure.kernel.queue import finders as queue_finders
from tenure.kernel.queue.record import dedupe_key_of
from tenure.kernel.runs import finders as run_finders
from tenure.kernel.runs.record import key_of
from tenure.model import JobStatus, QueueKind, RunStatus, TenureError, canonical_json

__all__ = ["StoreCaseResult", "TableCase", "TABLES", "CASES", "CHECKS", "SNAPSHOT_CASES", "check_stores"]

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
    """One machine's table: its binding, its generated rows (fitting the table's unique
    constraints) and, for given rows, its finders with their parameters."""

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


def _unique_messages(rows: list[Any]) -> list[Any]:
    """Message slots of two Runs, each identity once: a message ID and a receive key once
    per Run, a sequence once per Run and topic (the table's partial unique indexes)."""
    made = []
    for number, row in enumerate(rows):
        made.append(dataclasses.replace(
            row, slot_id=f"slot-{number}", run_id=RUN_IDS[number % 2],
            message_id=None if row.message_id is None else f"m-{number}",
            receive_key=None if row.receive_key is None else f"@{number}",
            sequence=None if row.sequence is None else number + 1))
    return made


def _message_finders(rows: list[Any]) -> st.SearchStrategy[tuple[Finder, dict[str, Any]]]:
    runs = st.sampled_from(["run-0", "run-1", "run-9", "RUN-0"])
    topics = st.sampled_from(["go", "stop", "GO"])
    deadlines = [row.expires_at_us for row in rows if row.expires_at_us is not None] or [NOW]
    of_topic = st.sampled_from([message_finders.pending_of_topic, message_finders.first_sent_of_topic,
                                message_finders.last_of_topic])
    return st.one_of(
        _owner_finders(message_finders.messages_by_keys, run_finders.pending_receives_of_run, "slot")(rows),
        st.tuples(st.sampled_from([run_finders.receives_of_run, message_finders.slots_of_run]),
                  runs.map(lambda run_id: {"run_id": run_id})),
        st.tuples(of_topic, st.tuples(runs, topics).map(lambda pair: {"run_id": pair[0], "topic": pair[1]})),
        st.tuples(st.just(message_finders.message_of_run),
                  st.tuples(runs, st.sampled_from(["m-0", "m-1", "m-3"])).map(
                      lambda pair: {"run_id": pair[0], "message_id": pair[1]})),
        st.tuples(st.just(message_finders.receive_of_run),
                  st.tuples(runs, st.sampled_from(["@0", "@1", "@3"])).map(
                      lambda pair: {"run_id": pair[0], "receive_key": pair[1]})),
        # The deadline owner's page: at, just before and just after a stored deadline, or anywhere.
        st.tuples(st.just(message_finders.due_receives),
                  (st.sampled_from(deadlines).flatmap(lambda at: st.integers(at - 1, at + 1)) | times).map(
                      lambda now: {"now": now})),
    )


def _unique_nodes(rows: list[Any]) -> list[Any]:
    return [dataclasses.replace(row, node=f"node-{index}") for index, row in enumerate(rows)]


TABLES: dict[str, TableCase] = {
    # One case per registered table (the project's tests check that none is missing).
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
    "run_messages": TableCase(
        MESSAGES_BINDING,
        st.lists(message_records().filter(lambda r: r is not None), max_size=6).map(_unique_messages),
        _message_finders,
    ),
}


CASES: list[str] = sorted(TABLES)
"""Every case name (a machine's table: ``queue.<kind>``, ``attempts``, ``runs``, ...)."""

CHECKS: list[str] = ["read_back_and_finders", "snapshot_probes", "compare_and_set"]
"""Every check, in the order :func:`check_stores` runs them for a case."""

SNAPSHOT_CASES: list[str] = ["queue.validation", "queue.streaming"]
"""The cases whose snapshot probes are checked (the queue finders the probes use)."""


@dataclasses.dataclass
class StoreCaseResult:
    """One check of one case, on one database."""

    case: str
    """A name in :data:`CASES`."""
    check: str
    """A name in :data:`CHECKS`."""
    examples: int
    """Hypothesis examples run (shrinking's included)."""
    failure: str | None
    """None, or the failing example and its error, as text."""


def _expected(finder: Finder, rows: list[Any], parameters: dict[str, Any], limit: int | None) -> list[Any]:
    chosen = finder.sorted(row for row in rows if finder.matches(row, parameters))
    return chosen if limit is None else chosen[:limit]


def _in_order(binding: Binding, finder: Finder, found: list[Any]) -> list[Any]:
    """A finder without an order promises none: compare its rows by key."""
    return found if finder.order else sorted(found, key=lambda row: getattr(row, binding.key_field))


class _Session:
    """One database, one store on it (opened with the URL as given: a schema it names is
    the store's), and one event loop, for every example of one check."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.schema = parse_db_url(db_url).schema
        self.runner = LoopRunner()
        try:
            self.store = open_store(db_url, timeout_seconds=30)
        except BaseException:
            self.runner.close()
            raise

    def reset(self, binding: Binding, rows: list[Any]) -> None:
        """Exactly ``rows`` in the binding's table, stored through the store."""
        # Qualified with the URL's schema (raw also sets it as the search path).
        raw(self.db_url, f"DELETE FROM {qualified(self.schema, binding.spec.name)}")

        async def insert() -> list[Any]:
            async with self.store.transaction(write=True) as tx:
                return [await tx.insert(binding, row) for row in rows]

        stored = self.run(insert())
        for row, back in zip(rows, stored, strict=True):
            assert back == row, f"a record did not read back as itself:\n stored {row!r}\n read   {back!r}"

    def run(self, coroutine: Any) -> Any:
        return self.runner.run(coroutine)

    def close(self) -> None:
        try:
            self.runner.run(self.store.close())
        finally:
            self.runner.close()


def _read_back_and_finders(session: _Session, table: TableCase, data: st.DataObject) -> None:
    binding = table.binding
    rows = data.draw(table.rows, label="rows")
    session.reset(binding, rows)
    key = binding.key_field

    async def check() -> None:
        async with session.store.transaction(write=False) as tx:
            read = await tx.read(binding, [getattr(row, key) for row in rows])
            by_key = sorted(read, key=lambda row: getattr(row, key))
            assert by_key == sorted(rows, key=lambda row: getattr(row, key)), f"read by key: {by_key!r}"
            for _ in range(3):
                finder, parameters = data.draw(table.finders(rows), label="finder and parameters")
                limit = data.draw(st.none() | st.integers(1, 4), label="limit")
                if finder.lock == "wait":
                    found = await tx.locked(binding, finder, parameters)
                    expected = _expected(finder, rows, parameters, None)
                else:
                    if not finder.order:
                        limit = None  # a limit without an order selects arbitrary rows
                    found = await tx.find(binding, finder, parameters, limit)
                    expected = _expected(finder, rows, parameters, limit)
                found, expected = _in_order(binding, finder, found), _in_order(binding, finder, expected)
                assert found == expected, (
                    f"finder {finder.name} with {parameters!r}, limit {limit}:\n"
                    f" selected          {found!r}\n its predicate selects {expected!r}")

    session.run(check())


def _snapshot_probes(session: _Session, table: TableCase, data: st.DataObject) -> None:
    binding = table.binding
    rows = data.draw(table.rows, label="rows")
    session.reset(binding, rows)
    tokens = data.draw(st.lists(st.sampled_from([r.claim_token for r in rows if r.claim_token] + TOKENS),
                                max_size=3), label="tokens")
    limit = data.draw(st.integers(1, 4), label="limit")

    async def check() -> None:
        async with session.store.transaction(write=True) as tx:
            exists, stored, eligible = await tx.snapshot(binding, [
                Probe(queue_finders.expired, {}, "exists", limit=1),
                Probe(queue_finders.tokens_stored, {"tokens": tokens}, "values", field="claim_token"),
                Probe(queue_finders.eligible, {}, "rows", limit=limit),
            ])
            now = await tx.now_us()
        expired = bool(_expected(queue_finders.expired, rows, {"now": now}, None))
        assert exists == expired, f"'exists' probe of expired at {now}: {exists}, its predicate: {expired}"
        tokens_expected = sorted(row.claim_token for row in
                                 _expected(queue_finders.tokens_stored, rows, {"tokens": tokens}, None))
        assert sorted(stored) == tokens_expected, f"'values' probe of tokens_stored: {sorted(stored)!r}, " \
                                                  f"its predicate: {tokens_expected!r}"
        eligible_expected = _expected(queue_finders.eligible, rows, {"now": now}, limit)
        assert eligible == eligible_expected, (f"'rows' probe of eligible at {now}, limit {limit}:\n"
                                               f" selected {eligible!r}\n its predicate selects {eligible_expected!r}")

    session.run(check())


def _compare_and_set(session: _Session, table: TableCase, data: st.DataObject) -> None:
    binding = table.binding
    rows = data.draw(table.rows.filter(bool), label="rows")
    session.reset(binding, rows)
    old = data.draw(st.sampled_from(rows), label="row")
    mutable = [column for column in binding.spec.columns if column.mutable and column.part is None]
    column = data.draw(st.sampled_from(mutable), label="column")
    other = next((getattr(r, column.field) for r in rows if getattr(r, column.field) != getattr(old, column.field)), None)
    if other is None:
        return  # every row holds the same value: nothing to change it to here
    stale = dataclasses.replace(old, **{column.field: other})

    async def write_over_stale() -> str | None:
        try:
            async with session.store.transaction(write=True) as tx:
                await tx.update_many(binding, [(stale, old)], read_back=False)
        except TenureError as error:
            return error.reason
        return None

    refused = session.run(write_over_stale())
    assert refused == "row_changed", (
        f"an update decided on a row whose {column.name} was {other!r} wrote over the stored {getattr(old, column.field)!r}"
        if refused is None else f"an update decided on a changed row was refused as {refused!r}, not 'row_changed'")

    async def then() -> None:
        async with session.store.transaction(write=True) as tx:
            assert await tx.delete(binding, stale) is False, f"a delete decided on a changed {column.name} deleted the row"
            written = await tx.update_many(binding, [(old, old)], read_back=True)
            assert written == [old], f"an update decided on the stored row wrote {written!r}"
            assert await tx.delete(binding, old) is True, "a delete decided on the stored row deleted nothing"
            left = await tx.read(binding, [getattr(old, binding.key_field)])
            assert left == [], f"a deleted row still reads back: {left!r}"

    session.run(then())


_CHECK_BODIES: dict[str, Callable[[_Session, TableCase, st.DataObject], None]] = {
    "read_back_and_finders": _read_back_and_finders,
    "snapshot_probes": _snapshot_probes,
    "compare_and_set": _compare_and_set,
}


def _failure_of(test: Callable[[], None]) -> str | None:
    """None if ``test`` passed, else what Hypothesis reported and the error it raised
    (whose notes hold the failing example)."""
    reported: list[str] = []

    def report(value: object) -> None:
        reported.append(str(value))

    with with_reporter(report):
        try:
            test()
        except Exception as error:
            # An assertion says what differed; any other error needs its traceback.
            lines = (traceback.format_exception_only(error) if isinstance(error, AssertionError)
                     else traceback.format_exception(error))
            return "".join(line if line.endswith("\n") else line + "\n" for line in [*reported, *lines]).rstrip()
    return None


def _run_check(databases: ExampleDatabases, case: str, check: str, *, examples: int, seed: int | None,
               on_example: Callable[[], None] | None) -> StoreCaseResult:
    """One check of one case as a Hypothesis test, on one database (emptied of the case's
    table before every example)."""
    table, body = TABLES[case], _CHECK_BODIES[check]
    ran = 0
    with tempfile.TemporaryDirectory(prefix="tenure-stores-") as workdir:
        db_url = databases.acquire(pathlib.Path(workdir))
        closed = False
        try:
            session = _Session(db_url)
            try:

                def example(data: st.DataObject) -> None:
                    nonlocal ran
                    ran += 1
                    try:
                        body(session, table, data)
                    finally:
                        if on_example is not None:
                            on_example()

                example.__name__ = example.__qualname__ = check  # the failing example names its check
                test = settings(max_examples=examples, database=None, deadline=None, derandomize=False,
                                suppress_health_check=list(HealthCheck), print_blob=False,
                                report_multiple_bugs=False)(given(data=st.data())(example))
                if seed is not None:
                    test = hypothesis.seed(seed)(test)
                failure = _failure_of(test)
            finally:
                session.close()
            closed = True
        finally:
            databases.release(db_url, reuse=closed)
    return StoreCaseResult(case, check, ran, failure)


def check_stores(databases: ExampleDatabases, *, examples: int = 50, seed: int | None = None,
                 cases: Sequence[str] | None = None,
                 on_example: Callable[[], None] | None = None) -> list[StoreCaseResult]:
    """Run every check of ``cases`` (default: :data:`CASES`) for ``examples`` Hypothesis
    examples each, each (case, check) on a database of its own from ``databases``; the
    same ``seed`` runs the same examples (for one Hypothesis version). ``on_example`` is
    called after every example (a progress display). A result per (case, check), in the
    order of ``cases`` and :data:`CHECKS`; the snapshot probes only for
    :data:`SNAPSHOT_CASES`. A case name outside :data:`CASES` raises ``ValueError``."""
    chosen = CASES if cases is None else list(cases)
    unknown = sorted(set(chosen) - set(TABLES))
    if unknown:
        raise ValueError(f"unknown store cases {unknown}; known: {', '.join(CASES)}")
    return [
        _run_check(databases, case, check, examples=examples, seed=seed, on_example=on_example)
        for case in chosen
        for check in CHECKS
        if check != "snapshot_probes" or case in SNAPSHOT_CASES
    ]
