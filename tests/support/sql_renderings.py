"""Render every statement each store sends, for every binding, into ``specs/sql/``.

``specs/sql/postgresql.sql`` and ``specs/sql/sqlite.sql`` are checked in, so what SQL
runs for an operation is a grep (a heartbeat of one job is the ``ahead_one`` statement
of its queue's binding; a claim on PostgreSQL is ``claim``). A test
(tests/adapters/core/test_sql_renderings.py) renders them again and fails when a file
is stale; after changing a statement run::

    .venv/bin/python -P tests/support/sql_renderings.py --write

Statements are rendered with ``:name`` parameters (the PostgreSQL store numbers them
``$n`` once), for tables in the connection's current schema. The column types the
PostgreSQL statements cast to are the ones tenure's migration creates; the test also
holds them equal to a migrated database's catalog.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import sys
from collections.abc import Iterator

from tenure.adapters.agent_jobs.table import AGENT_JOBS_BINDING
from tenure.adapters.attempts.table import ATTEMPTS_BINDING
from tenure.adapters.wiring.registry import BINDINGS, DECLARATIONS
from tenure.adapters.core.sql import (
    POSTGRESQL,
    SQLITE,
    Capabilities,
    compile_finder,
    counts_sql,
    delete_unreadable_statement,
    set_aside_statement,
    statements_for,
)
from tenure.adapters.core.store import Probe
from tenure.adapters.core.tables import ROW_VERSION, Binding, sql_dialect
from tenure.adapters.postgres import statements
from tenure.adapters.queue.table import TASKS_BINDING, binding_for
from tenure.adapters.runs.engine import COUNTS
from tenure.adapters.runs.table import CHECKPOINTS_BINDING, CURRENT_DELIVERY, DELIVERIES_BINDING, RUNS_BINDING
from tenure.kernel.core import Finder
from tenure.kernel.queue import finders as queue_finders
from tenure.kernel.queue.machine import CLAIM_LEGACY_REWRITE, CLAIM_OWNED_REWRITE, QUEUE, SET_ASIDE
from tenure.kernel.runs import finders as run_finders
from tenure.kernel.runs.aggregate import Evidence
from tenure.model import QueueKind

SQL_DIR = pathlib.Path(__file__).resolve().parents[2] / "specs" / "sql"

FINDER_MODULES = tuple(DECLARATIONS)
"""The registered machines, whose ``finders`` modules are rendered (``kernel/<folder>/finders.py``)."""

MACHINE_BINDINGS = {folder: tuple(binding.name for binding in declared.bindings)
                    for folder, declared in DECLARATIONS.items()}
"""The bindings a machine's finders run against: the ones it declares (the Run
machine's own finders run against its Runs, and :data:`RUN_OWNER_FINDERS` against the
other tables a Run reads)."""

RUN_OWNER_FINDERS = {
    "deliveries_by_keys": "run_deliveries", "attempts_by_keys": "attempts", "pending_consents_of_run": "consents",
    "open_jobs_of_run": "agent_jobs", "open_attempts_of_run": "attempts", "consents_of_run": "consents",
    "jobs_of_run": "agent_jobs", "attempts_of_run": "attempts", "consents_of_runs": "consents",
    "jobs_of_runs": "agent_jobs", "attempts_of_runs": "attempts", "open_jobs_of_runs": "agent_jobs",
    "open_attempts_of_runs": "attempts", "pending_receives_of_run": "run_messages", "receives_of_run": "run_messages",
    "receives_of_runs": "run_messages",
}
"""The Run machine's finders over its owners' tables (a Run reads its consents, jobs,
attempts and deliveries), by the binding each runs against."""

_UDT = {"BIGINT": "int8", "INTEGER": "int4", "BOOLEAN": "bool", "JSON": "json", "TEXT": "text",
        "TIMESTAMP WITH TIME ZONE": "timestamptz"}


def postgres_types(binding: Binding) -> tuple[tuple[str, str], ...]:
    """Each column with the type name PostgreSQL's catalog reports for it (``udt_name``)
    once tenure's migration created the table."""
    dialect = sql_dialect("postgresql")
    types = []
    for column in binding.spec.columns:
        declared = column.sql_type.compile(dialect=dialect)
        types.append((column.name, "varchar" if declared.startswith("VARCHAR") else _UDT[declared]))
    types.append((ROW_VERSION, "int8"))  # step versions_v1
    return tuple(types)


def finders_of(binding: Binding) -> Iterator[tuple[str, Finder]]:
    """Every kernel finder that runs against ``binding``, named ``machine.finder``."""
    for machine in FINDER_MODULES:
        module = importlib.import_module(f"tenure.kernel.{machine}.finders")
        for name, finder in vars(module).items():
            if not isinstance(finder, Finder):
                continue
            targets = MACHINE_BINDINGS[machine]
            if machine == "runs":
                targets = (RUN_OWNER_FINDERS.get(name, "runs"),)
            if binding.name in targets and (machine != "queue" or _claims_run_here(binding, name)):
                yield f"{machine}.{name}", finder
    for kind in QueueKind:
        if binding_for(kind) is binding:
            yield f"queue.locate({kind.name})", queue_finders.locate(kind)


def _claims_run_here(binding: Binding, name: str) -> bool:
    """The task claim finders run on the task table only, the others' claim finders never
    there (every other queue finder runs on every queue table)."""
    if not name.startswith(("eligible", "claimable")):
        return True
    return ("task" in name) == (binding is TASKS_BINDING)


def _statement(name: str, description: str, sql: str) -> str:
    return f"-- {name}: {description}\n{sql};\n"


def _table_statements(binding: Binding, capabilities: Capabilities) -> Iterator[str]:
    table = statements_for(binding, capabilities)
    yield _statement("insert", "a new row, returned as stored", table.insert)
    yield _statement("update", "compare-and-set of one row (every mutable column as decided on), returned as written",
                     table.update)
    yield _statement("update_seen", "compare-and-set of one row decided on as last seen, not read in this "
                     "transaction (every column), returned as written", table.update_seen)
    yield _statement("delete", "compare-and-set delete of one row", table.delete)
    yield _statement("read_keys", "the rows with these keys as they are (no lock, no clock)", table.read_keys)
    if binding.machine is QUEUE:
        for label, key in (("set_aside", "job-id"), ("set_aside by stored bytes", b"\xff")):
            statement = set_aside_statement(binding, SET_ASIDE, queue_finders.set_aside_guard, capabilities, None,
                                            key, 0)
            if statement is not None:
                yield _statement(label, "a row a claim cannot read, set aside by its stored key without reading it "
                                 "(specs/queue.md, 'Rows tenure cannot read')", statement[0])
        for label, key in (("delete_unreadable", "job-id"), ("delete_unreadable by stored bytes", b"\xff")):
            deleting = delete_unreadable_statement(binding, queue_finders.finished_before, capabilities, None, key,
                                                   {"cutoff": 0})
            if deleting is not None:
                yield _statement(label, "a finished row retention selected but cannot read, deleted by its stored "
                                 "key without reading it (specs/queue.md, 'Rows tenure cannot read')", deleting[0])


def render_sqlite() -> str:
    lines = [_header("SQLite", "a write transaction (BEGIN IMMEDIATE) holds the database's write lock; "
                     "the clock is the tenure_clock high-water mark, read after it")]
    for binding in BINDINGS:
        lines.append(f"\n-- ==== {binding.name} (table {binding.spec.name}) ====\n")
        lines.extend(_table_statements(binding, SQLITE))
        for name, finder in finders_of(binding):
            compiled = compile_finder(binding, finder, SQLITE, None, limited=finder.lock == "skip")
            lines.append(_statement(f"find {name}", f"lock {finder.lock}", compiled.sql))
    return "\n".join(lines)


def render_postgresql() -> str:
    lines = [_header("PostgreSQL", "row locks (FOR UPDATE; claims and sweeps SKIP LOCKED); the clock is "
                     "clock_timestamp(), read after the locks")]
    for binding in BINDINGS:
        types = postgres_types(binding)
        lines.append(f"\n-- ==== {binding.name} (table {binding.spec.name}) ====\n")
        lines.extend(_table_statements(binding, POSTGRESQL))
        for name, finder in finders_of(binding):
            compiled = compile_finder(binding, finder, POSTGRESQL, None, limited=finder.lock == "skip")
            if finder.lock == "wait":
                lines.append(_statement(f"locked {name}", "the rows locked, then the clock read once every lock "
                                        "is held (Transaction.locked)", statements.with_clock(compiled.sql)))
            elif finder.lock == "touch":
                lines.append(_statement(f"locked {name}", "the rows locked and written unchanged, then the clock "
                                        "read once every lock is held (Transaction.locked, lock touch)",
                                        statements.touching(binding, compiled.sql, None)))
            else:
                lines.append(_statement(f"find {name}", f"lock {finder.lock}", compiled.sql))
            if finder.lock == "wait" and name.endswith("by_keys") and binding.key_field in str(finder.any_of):
                announce = binding.announces is not None
                compiled = dataclasses.replace(compile_finder(binding, finder, POSTGRESQL, None, versioned=True),
                                               sql=statements.keyed_sql(binding, finder, None, types, versioned=True,
                                                                        one=True))
                several = statements.keyed_sql(binding, finder, None, types, versioned=True)
                lines.append(_statement(f"ahead_version {name}", "one row known by its row version, decided "
                                        "ahead: lock, clock, verdict on the version and the window, write and verify "
                                        "the changed columns (here every mutable one; each statement names only its "
                                        "own), the new version returned",
                                        statements.ahead_version_sql(binding, None, compiled.sql, types,
                                                                     binding.spec.mutable_names, announce)))
                jobs = " (a heartbeat, complete, fail or cancel of one job)" if binding.name.startswith("queue.") else ""
                lines.append(_statement(f"ahead_one {name}", "one row decided ahead: lock, clock, verdict, "
                                        f"compare-and-set, verified{jobs}",
                                        statements.ahead_one_sql(binding, None, compiled.sql, types, announce, True)))
                lines.append(_statement(f"ahead {name}", "several rows decided ahead, all or nothing (batches)",
                                        statements.ahead_sql(binding, None, several, types, announce, True)))
            if name.startswith("queue.locate("):
                compiled = dataclasses.replace(compile_finder(binding, finder, POSTGRESQL, None, versioned=True),
                                               sql=statements.keyed_sql(binding, finder, None, types, versioned=True,
                                                                        one=True))
                lines.append(_statement(f"insert_ahead {name}", "a submission decided ahead: inserted only if "
                                        "no row shares its identity and the clock lies in the window",
                                        statements.insert_sql(binding, None, compiled.sql, types, True, True)))
        if binding.name.startswith("queue."):
            for label, eligible, check, rewrite, blockers in (
                ("claim", queue_finders.eligible, queue_finders.claimable, CLAIM_OWNED_REWRITE,
                 [Probe(queue_finders.expired, {}, "exists", limit=1),
                  Probe(queue_finders.tokens_stored, {"tokens": ["token"]}, "exists", limit=1)]),
                ("claim_batch", queue_finders.eligible, queue_finders.claimable, CLAIM_OWNED_REWRITE,
                 [Probe(queue_finders.expired, {}, "exists", limit=1),
                  Probe(queue_finders.tokens_stored, {"tokens": ["token", "other"]}, "exists", limit=1)]),
                ("claim_legacy", queue_finders.eligible_legacy, queue_finders.claimable_legacy, CLAIM_LEGACY_REWRITE,
                 [Probe(queue_finders.expired, {}, "exists", limit=1)]),
            ):
                sql, _ = statements.claim_statement(binding, None, Probe(eligible, {}, "rows", limit=1), check,
                                                    blockers, rewrite, types, {})
                tokens = {"claim": " (one claim token: looked up as one equality)",
                          "claim_batch": " (several claim tokens: each probed from the unnested list)"}.get(label, "")
                lines.append(_statement(label, "the claim fast path: clock, pick (SKIP LOCKED), the kernel's claim "
                                        "rewrite unless a blocker or the check says no, every written column verified "
                                        f"(AheadWriter.claim_ahead){tokens}", sql))
        if binding is RUNS_BINDING:
            lines.append(_statement("locked_joined runs+run_deliveries", "a Run and its current delivery locked in "
                                    "that order, then the clock once both locks are held (every Run write)",
                                    statements.locked_joined_sql(RUNS_BINDING, DELIVERIES_BINDING, CURRENT_DELIVERY, None)))
            lines.append(_statement("joined_ahead runs+run_deliveries", "a Run command decided ahead from the pair "
                                    "last seen (claim, publish, ...): both rows locked in that order, the clock once "
                                    "both locks are held, verdict on both rows and the window, both written and "
                                    "verified (AheadWriter.joined_ahead)",
                                    statements.joined_ahead_sql(RUNS_BINDING, DELIVERIES_BINDING, CURRENT_DELIVERY, None,
                                                                types, postgres_types(DELIVERIES_BINDING))))
            hop_task = statements.prefixed(compile_finder(TASKS_BINDING, queue_finders.locate(QueueKind.TASK),
                                                          POSTGRESQL, None).sql, "f_")
            lines.append(_statement("joined_ahead publish beside its hop task", "a hop's publication on tenure's own "
                                    "queue (RunLedger.publish, QueueBroker on the same database): the pair locked, "
                                    "then the tasks sharing an identity with the hop's, the clock after every lock, "
                                    "verdict on both rows, no task met and the window; both rows written and the "
                                    "task inserted, every value verified, all or nothing "
                                    "(AheadWriter.joined_ahead with beside)",
                                    statements.joined_ahead_sql(RUNS_BINDING, DELIVERIES_BINDING, CURRENT_DELIVERY, None,
                                                                types, postgres_types(DELIVERIES_BINDING),
                                                                beside=(TASKS_BINDING, hop_task,
                                                                        postgres_types(TASKS_BINDING), True))))
            lines.append(_statement("joined_insert runs+run_deliveries", "an admission decided ahead: the Runs "
                                    "holding its ID or its key locked with their deliveries, the clock after the "
                                    "locks, both rows inserted only if none was met and the clock lies in the window "
                                    "(a concurrent insert makes both do nothing), every value verified "
                                    "(AheadWriter.joined_insert_ahead)",
                                    statements.joined_insert_sql(RUNS_BINDING, DELIVERIES_BINDING, CURRENT_DELIVERY,
                                                                 None, types, postgres_types(DELIVERIES_BINDING),
                                                                 RUNS_BINDING.column_of("idempotency_key").name)))
            containment = ((AGENT_JOBS_BINDING, run_finders.open_jobs_of_run, None),
                           (ATTEMPTS_BINDING, run_finders.open_attempts_of_run, None))
            lines.append(_statement("count_each containment", "a Run's open delegated jobs and service attempts, "
                                    "counted in one statement (one snapshot)", counts_sql(containment, POSTGRESQL, None).sql))
            lines.append(_statement("write_across runs+run_deliveries", "a Run and its delivery compare-and-set in "
                                    "one statement (both UPDATEs run; a missing row rolls the transaction back)",
                                    statements.write_across_sql(((RUNS_BINDING, False), (DELIVERIES_BINDING, False)), None)))
            lines.append(_statement("write_across admission", "a new Run and its first delivery inserted in one statement",
                                    statements.write_across_sql(((RUNS_BINDING, True), (DELIVERIES_BINDING, True)), None)))
            # The settle's two statements (issue 49): its counted evidence read with the
            # pair's lock, then verified by the pair's write, which deletes the checkpoint.
            settle_counts = counts_sql(tuple((binding, finder, None) for evidence in (Evidence.CONTAINMENT,
                                                                                        Evidence.PENDING_CONSENTS)
                                             for binding, finder in COUNTS[evidence]), POSTGRESQL, None).columns
            lines.append(_statement("locked_joined_counting settle", "a Run and its current delivery locked, the clock "
                                    "after both locks, and the settle's evidence counted (open jobs, open attempts, "
                                    "pending consents) in the same statement (its snapshot: verified by the write)",
                                    statements.locked_joined_counting_sql(RUNS_BINDING, DELIVERIES_BINDING,
                                                                          CURRENT_DELIVERY, None, settle_counts)))
            lines.append(_statement("joined_ahead settle", "a settle decided ahead from the pair last seen and "
                                    "the counts declared (COUNTED_AHEAD): both rows locked, the clock after both "
                                    "locks, the counts and whether the Run locked is the version the snapshot sees, "
                                    "verdict on both rows, every count and the window, both written and verified "
                                    "and the checkpoint deleted (AheadWriter.joined_ahead with guards)",
                                    statements.joined_ahead_sql(RUNS_BINDING, DELIVERIES_BINDING, CURRENT_DELIVERY, None,
                                                                types, postgres_types(DELIVERIES_BINDING), settle_counts,
                                                                (CHECKPOINTS_BINDING,))))
            lines.append(_statement("write_guarded settle", "a Run and its delivery compare-and-set and its "
                                    "checkpoint deleted, only while every count still has the value it was read "
                                    "with (nothing written otherwise)",
                                    statements.guarded_write_sql((RUNS_BINDING, DELIVERIES_BINDING),
                                                                 (CHECKPOINTS_BINDING,), settle_counts, None)))
    return "\n".join(lines)


def _header(database: str, locking: str) -> str:
    return (
        f"-- Every statement tenure's {database} store sends, for every binding (table).\n"
        "-- Rendered by tests/support/sql_renderings.py; do not edit by hand:\n"
        "--   .venv/bin/python -P tests/support/sql_renderings.py --write\n"
        f"-- Locking: {locking}.\n"
        "-- Parameters are :name; :now is the transaction's clock.\n"
    )


RENDERINGS = {"postgresql.sql": render_postgresql, "sqlite.sql": render_sqlite}


def stale() -> list[str]:
    """The rendered files whose checked-in text differs from a fresh rendering."""
    return [name for name, render in RENDERINGS.items()
            if not (SQL_DIR / name).exists() or (SQL_DIR / name).read_text() != render()]


def main(argv: list[str]) -> int:
    if argv[1:] != ["--write"]:
        print(__doc__)
        print("stale:", ", ".join(stale()) or "none")
        return 0
    SQL_DIR.mkdir(exist_ok=True)
    for name, render in RENDERINGS.items():
        (SQL_DIR / name).write_text(render())
        print(f"wrote specs/sql/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
