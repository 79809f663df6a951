"""Helpers for the shared adapter suite: fresh databases and raw SQL the API cannot express.

Raw SQL here plays the part of an operator, a clock or a misbehaving neighbour: moving a
lease into the past, reading a row exactly as stored, installing a trigger, failing a
commit. Tests use it to set up situations and to check results, never to bypass what
they test. Statements are written with ``?`` placeholders; PostgreSQL gets ``$n``.
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tenure.adapters.core.tables import instant_to_sqlite_text
from tenure.adapters.queue.table import binding_for
from tenure.conformance.lockstep.raw import (  # noqa: F401 - the lockstep's raw SQL, shared with the other suites
    RowHolder,
    _pg,
    expire_lease,
    interfering_after_load,
    kind_of,
    raw,
    run_async,
    shift_instants,
    sqlite_path,
    store_module,
    table,
)
from tenure.model import QueueKind

_run_async = run_async  # the name the other suites import

AVAILABLE_DATABASES = ["sqlite", "postgresql"]
"""Every database with a store; the shared suites run against each."""

_SERVER_DSN: list[str] = []
"""The throwaway server's DSN once a test asked for it (PostgreSQL databases live there)."""


# --- PostgreSQL plumbing ----------------------------------------------------------------


def _with_database(dsn: str, name: str) -> str:
    return dsn.rsplit("/", 1)[0] + "/" + name


def bind_server(request: pytest.FixtureRequest) -> str:
    if not _SERVER_DSN:
        _SERVER_DSN.append(request.getfixturevalue("pg_dsn"))
    return _SERVER_DSN[0]


def create_pg_database(server_dsn: str) -> str:
    name = "tenure_" + uuid.uuid4().hex[:16]
    run_async(_pg(server_dsn, f"CREATE DATABASE {name}", ()))
    return _with_database(server_dsn, name)


def drop_pg_database(db_url: str) -> None:
    name = db_url.rsplit("/", 1)[1]
    server = _with_database(db_url, "postgres")
    run_async(_pg(server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", ()))


# --- fresh databases ----------------------------------------------------------------------


def new_database(kind: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/queue.db"
    url = create_pg_database(bind_server(request))
    request.addfinalizer(lambda: drop_pg_database(url))
    return url


def migrated_database(kind: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> str:
    """A fresh database holding exactly what ``upgrade`` creates, for one test (the
    ``db_url`` fixture): a copy of the template this process migrated once
    (:func:`migrated_database_for_machine`'s), at the path or server ``new_database``
    would use. A copy, not a migration per test: ``upgrade`` cost about 0.17 CPU seconds
    of client and server per PostgreSQL test and 0.06 per SQLite test, some 200 of the
    suite's core-seconds; the migrations' own tests start from ``fresh_db_url``."""
    if kind == "sqlite":
        target = tmp_path / "queue.db"
        template = _template(kind)
        shutil.copyfile(sqlite_path(template), target)
        return f"sqlite:///{target}"
    server = bind_server(request)
    template = _template(kind)
    name = "tenure_" + uuid.uuid4().hex[:16]
    run_async(_pg(server, f"CREATE DATABASE {name} TEMPLATE {template.rsplit('/', 1)[1]}", ()))
    url = _with_database(server, name)
    request.addfinalizer(lambda: drop_pg_database(url))
    return url


def prepare_machine_databases(kind: str, request: pytest.FixtureRequest) -> None:
    """Make ``new_database_for_machine`` work for ``kind`` (PostgreSQL needs its server)."""
    assert kind in AVAILABLE_DATABASES
    if kind == "postgresql":
        bind_server(request)
        request.addfinalizer(drop_spare_databases)


def new_database_for_machine(kind: str, workdir: pathlib.Path) -> str:
    """A fresh, empty database for one state-machine run."""
    if kind == "sqlite":
        return f"sqlite:///{workdir}/lockstep.db"
    return create_pg_database(_SERVER_DSN[0])


_TEMPLATES: dict[str, str] = {}
"""A migrated database per kind (and server), made once per process: lockstep runs copy it."""

_TEMPLATE_ROWS: dict[str, dict[str, list[tuple[Any, ...]]]] = {}
"""Per PostgreSQL template: the rows of every table ``upgrade`` left non-empty (its
migration ledger), which an emptied database must still hold unchanged."""

_SPARE: dict[str, list[str]] = {}
"""Per PostgreSQL template: databases a finished run handed back, emptied to equal it."""

_TABLES_BY_SIZE = (
    "SELECT c.relname, pg_relation_size(c.oid) > 0 FROM pg_class c"
    " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' ORDER BY c.relname"
)


async def _pg_written_tables(connection: Any) -> tuple[list[str], list[str]]:
    """(tables with storage, tables without): a table never written has no page."""
    rows = await connection.fetch(_TABLES_BY_SIZE)
    return [name for name, used in rows if used], [name for name, used in rows if not used]


async def _pg_template_rows(db_url: str) -> dict[str, list[tuple[Any, ...]]]:
    import asyncpg

    connection = await asyncpg.connect(db_url)
    try:
        written, _ = await _pg_written_tables(connection)
        return {name: sorted(tuple(r) for r in await connection.fetch(f"SELECT * FROM {name}")) for name in written}
    finally:
        await connection.close()


async def _pg_empty(db_url: str, template_rows: dict[str, list[tuple[Any, ...]]]) -> bool:
    """Return a used lockstep database to its template's state: TRUNCATE every table a run
    wrote (new, empty files, as in a fresh copy), after checking that the template's own
    rows are unchanged and that no statistics were gathered meanwhile (a fresh copy has
    none). False (the caller drops it instead) when any check fails."""
    import asyncpg

    connection = await asyncpg.connect(db_url)
    try:
        await connection.execute("SET lock_timeout = '10s'")
        for name, rows in template_rows.items():
            if sorted(tuple(r) for r in await connection.fetch(f"SELECT * FROM {name}")) != rows:
                return False
        analyzed = await connection.fetchval(
            "SELECT count(*) FROM pg_statistic s JOIN pg_class c ON c.oid = s.starelid"
            " WHERE c.relnamespace = current_schema()::regnamespace"
        )
        if analyzed:
            return False
        written, _ = await _pg_written_tables(connection)
        emptied = [name for name in written if name not in template_rows]
        if emptied:
            await connection.execute(f"TRUNCATE {', '.join(emptied)}")
        return True
    except (asyncpg.PostgresError, OSError):
        return False
    finally:
        await connection.close()


async def _pg_without_autovacuum(db_url: str) -> None:
    """Autovacuum off on a database kept for reuse: a fresh copy lives under a second and
    is never vacuumed or analyzed; a reused one lives as long as the test."""
    import asyncpg

    connection = await asyncpg.connect(db_url)
    try:
        written, unwritten = await _pg_written_tables(connection)
        for name in written + unwritten:
            await connection.execute(f"ALTER TABLE {name} SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)")
    finally:
        await connection.close()


def migrated_database_for_machine(kind: str, workdir: pathlib.Path) -> str:
    """A fresh database holding exactly what ``upgrade`` creates, copied from a template
    migrated once per process (a state-machine run starts hundreds of them; migrating
    each would cost most of the run). On PostgreSQL a database an earlier run handed back
    (``release_database_for_machine``), emptied to the same state, is taken first:
    CREATE DATABASE copies the whole catalog and cost about half of a run's time."""
    template = _template(kind)
    template_key = _template_key(kind)
    if kind == "sqlite":
        target = workdir / "lockstep.db"
        shutil.copyfile(sqlite_path(template), target)
        return f"sqlite:///{target}"
    spare = _SPARE.setdefault(template_key, [])
    if spare:
        return spare.pop()
    name = "tenure_" + uuid.uuid4().hex[:16]
    run_async(_pg(_SERVER_DSN[0], f"CREATE DATABASE {name} TEMPLATE {template.rsplit('/', 1)[1]}", ()))
    return _with_database(_SERVER_DSN[0], name)


def _template_key(kind: str) -> str:
    return kind if kind == "sqlite" else f"{kind}:{_SERVER_DSN[0]}"


def _template(kind: str) -> str:
    """The database of ``kind`` this process migrated once (made on first use), which the
    tests' fresh databases copy; never connected to after ``upgrade`` closed it (a
    PostgreSQL template must have no session for CREATE DATABASE to copy it)."""
    from tenure.adapters import upgrade

    template_key = _template_key(kind)
    if template_key not in _TEMPLATES:
        if kind == "sqlite":
            folder = pathlib.Path(tempfile.mkdtemp(prefix="tenure-template-"))
            template = f"sqlite:///{folder}/template.db"
        else:
            template = create_pg_database(_SERVER_DSN[0])
        run_async(upgrade(template))
        if kind == "postgresql":
            _TEMPLATE_ROWS[template_key] = run_async(_pg_template_rows(template))
        _TEMPLATES[template_key] = template
    return _TEMPLATES[template_key]


def lockstep_findings(machine: Any, *, max_examples: int, step_count: int) -> list[str]:
    """Run a (mutant) lockstep ``machine`` until it fails and return what its rules and
    invariants raised (:attr:`~tenure.conformance.lockstep.harness.Counter.findings`).
    The draws read database times, so Hypothesis's replay of the failing run may draw
    differently and report only that it was flaky: the finding is read where it was
    raised, not from Hypothesis's report. Fails when the machine never failed."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from tenure.conformance.lockstep.harness import COUNTERS, Counter

    COUNTERS[machine.key()] = Counter()
    with pytest.raises(Exception):  # noqa: PT011 - a finding, or Hypothesis's flaky report of one
        run_state_machine_as_test(machine, settings=settings(
            max_examples=max_examples, stateful_step_count=step_count, deadline=None,
            suppress_health_check=list(HealthCheck), database=None, derandomize=True, phases=[Phase.generate],
            report_multiple_bugs=False,
        ))
    return COUNTERS[machine.key()].findings


class LockstepDatabases:
    """The lockstep harness's :class:`~tenure.conformance.lockstep.harness.ExampleDatabases` on
    the test servers: fresh copies of a migrated template."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def acquire(self, workdir: pathlib.Path) -> str:
        return migrated_database_for_machine(self.kind, workdir)

    def release(self, db_url: str, *, reuse: bool) -> None:
        release_database_for_machine(self.kind, db_url, reuse=reuse)


def every_rule_ran(machine: Any) -> None:
    """At CI's lockstep budget (not a ``TENURE_LOCKSTEP_STEPS`` override, which may be a
    quick check too short for it), every rule of ``machine`` ran: the budget is chosen
    with a margin over the steps that takes, so a rule that stopped being reachable
    fails here instead of leaving part of the adapter unchecked."""
    import os

    from tenure.conformance.lockstep.harness import COUNTERS, rule_names

    if os.environ.get("TENURE_LOCKSTEP_STEPS"):
        return
    missing = sorted(set(rule_names(machine)) - set(COUNTERS[machine.key()].rules))
    assert missing == [], f"rules that never ran at CI's budget: {missing}"


def release_database_for_machine(kind: str, db_url: str, *, reuse: bool) -> None:
    """The end of a run's database. PostgreSQL: with ``reuse`` (the run closed everything
    it opened), emptied and kept for the next run; otherwise, or if it cannot be emptied
    to the template's state, dropped."""
    if kind != "postgresql":
        return
    template_key = f"{kind}:{_SERVER_DSN[0]}"
    if reuse and run_async(_pg_empty(db_url, _TEMPLATE_ROWS[template_key])):
        if db_url not in _REUSED:
            run_async(_pg_without_autovacuum(db_url))
            _REUSED.add(db_url)
        _SPARE.setdefault(template_key, []).append(db_url)
        return
    _REUSED.discard(db_url)
    drop_pg_database(db_url)


_REUSED: set[str] = set()
"""Databases kept for reuse (their autovacuum is off)."""


def drop_spare_databases() -> None:
    """Drop the databases kept for reuse (after each lockstep test)."""
    for spare in _SPARE.values():
        while spare:
            url = spare.pop()
            _REUSED.discard(url)
            drop_pg_database(url)


def store_module(kind: str) -> Any:
    if kind == "sqlite":
        from tenure.adapters.sqlite import store as sqlite_store

        return sqlite_store
    from tenure.adapters.postgres import store as postgres_store

    return postgres_store


# --- raw SQL ------------------------------------------------------------------------------


LOADED_MACHINE_US = 600_000_000
"""Ten minutes: more than a loaded machine spends between a claim a test takes and the
writes it makes with it (CI once took 119 s across a dozen CLI processes). A test that
needs a claim live across slow work takes it with an hour's lease and calls
:func:`as_on_a_loaded_machine` right after claiming, so it proves on every machine that
the claim outlives a slow one."""


def as_on_a_loaded_machine(db_url: str, queue: QueueKind, job_id: str) -> None:
    """Move a claim's lease back by :data:`LOADED_MACHINE_US`: from now on the test sees it
    as a loaded machine would, ten minutes older."""
    expire_lease(db_url, queue, job_id, by_us=LOADED_MACHINE_US)


def counting_empty_claims(source: Any) -> list[int]:
    """Count, in the returned one-item list, the single-job claims through ``source`` that
    came back empty: a worker's first claim is a single job, and an empty one is the worker
    finding nothing to do, just before it waits for work. Tests wait on this count (with
    ``polling.until``) instead of sleeping until a worker is "idle by now"."""
    empty = [0]
    claim_next_owned = source.claim_next_owned

    async def counted(*args: Any, **kwargs: Any) -> Any:
        claimed = await claim_next_owned(*args, **kwargs)
        empty[0] += claimed is None
        return claimed

    source.claim_next_owned = counted
    return empty


def age_finished_rows(db_url: str, queue: QueueKind, *, hours: int) -> None:
    """Pretend every finished row finished ``hours`` earlier (retention tests)."""
    shift_instants(db_url, queue, "completed_at", hours * 3_600_000_000)


def stored_instant(db_url: str, micros: int) -> Any:
    """An instant as a raw statement must pass it (SQLite: DATETIME text)."""
    if kind_of(db_url) == "sqlite":
        return instant_to_sqlite_text(micros)
    import datetime as dt

    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=micros)


def row(db_url: str, queue: QueueKind, job_id: str) -> dict[str, Any] | None:
    columns = binding_for(queue).spec.column_names
    found = raw(db_url, f"SELECT {', '.join(columns)} FROM {table(queue)} WHERE id = ?", (job_id,))
    return dict(zip(columns, found[0])) if found else None


def all_rows(db_url: str, queue: QueueKind) -> list[tuple[Any, ...]]:
    return raw(db_url, f"SELECT * FROM {table(queue)} ORDER BY id")


def install_owner_folding_trigger(db_url: str, queue: QueueKind) -> None:
    """A trigger that lower-cases the owner of every claimed row (a coercion the claim's
    read-back must notice)."""
    name = table(queue)
    if kind_of(db_url) == "sqlite":
        raw(db_url, f"""CREATE TRIGGER fold_owner AFTER UPDATE OF claimed_by ON {name}
                        BEGIN UPDATE {name} SET claimed_by = lower(NEW.claimed_by) WHERE id = NEW.id; END""")
        return
    raw(db_url, """CREATE FUNCTION fold_owner() RETURNS trigger LANGUAGE plpgsql AS
                   $$ BEGIN NEW.claimed_by := lower(NEW.claimed_by); RETURN NEW; END $$""")
    raw(db_url, f"CREATE TRIGGER fold_owner BEFORE UPDATE ON {name} FOR EACH ROW EXECUTE FUNCTION fold_owner()")


# --- interference and faults ------------------------------------------------------------


def claim_commit(kind: str) -> str:
    """The statement whose completion commits a claim: SQLite's COMMIT; on PostgreSQL the
    claim's own statement, which runs alone (``AheadWriter.claim_ahead``)."""
    return "COMMIT" if kind == "sqlite" else "WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now), blocked"


class Faults:
    """Driver-level faults, armed one at a time; each fires once.

    ``arm("COMMIT", "after")``: the commit happens but its acknowledgement is lost (on
    PostgreSQL, ``arm("WITH locked", "after")`` does the same to a one-statement write,
    and ``arm(claim_commit(kind), "after")`` to a claim).
    ``arm("COMMIT", "before")``: the commit fails; nothing is written.
    ``arm(prefix, "before")``: the next statement starting with ``prefix`` fails.
    ``arm(prefix, "kill")`` (PostgreSQL): the server ends the session just before it.
    """

    def __init__(self) -> None:
        self.plan: tuple[str, str] | None = None

    def arm(self, prefix: str, when: str) -> None:
        self.plan = (prefix.upper(), when)

    def take(self, sql: str) -> str | None:
        # A COMMIT that carries notifications is sent as "SELECT pg_notify(...); COMMIT":
        # the statement's last command counts too.
        commands = [sql.lstrip().upper(), sql.rstrip().rstrip(";").rsplit(";", 1)[-1].lstrip().upper()]
        if self.plan is not None and any(command.startswith(self.plan[0]) for command in commands):
            when = self.plan[1]
            self.plan = None
            return when
        return None


@contextlib.contextmanager
def injected_faults(kind: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    faults = Faults()
    if kind == "sqlite":
        from tenure.adapters.sqlite import store as sqlite_store

        original_statement = sqlite_store._statement

        def execute(connection: Any, sql: str, parameters: Any) -> Any:
            when = faults.take(sql)
            if when == "before":
                raise sqlite3.OperationalError("disk I/O error (injected)")
            result = original_statement(connection, sql, parameters)
            if when == "after":
                raise sqlite3.OperationalError("connection reset before the acknowledgement (injected)")
            return result

        monkeypatch.setattr(sqlite_store, "_statement", execute)
        yield faults
        return
    import asyncpg

    original_fetch = asyncpg.Connection.fetch
    original_execute = asyncpg.Connection.execute

    async def fetch(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        when = faults.take(query)
        if when == "before":
            raise asyncpg.exceptions.InternalServerError("statement failed (injected)")
        if when == "kill":
            with contextlib.suppress(Exception):
                await original_fetch(self, "SELECT pg_terminate_backend(pg_backend_pid())")
        result = await original_fetch(self, query, *args, **kwargs)
        if when == "after":  # a one-statement write committed; its answer is lost
            raise asyncpg.exceptions.ConnectionDoesNotExistError("connection lost after the statement (injected)")
        return result

    async def execute(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        # BEGIN, COMMIT and ROLLBACK travel through execute.
        when = faults.take(query)
        if when == "before":
            raise asyncpg.exceptions.ConnectionDoesNotExistError("connection lost before the statement (injected)")
        result = await original_execute(self, query, *args, **kwargs)
        if when == "after":
            raise asyncpg.exceptions.ConnectionDoesNotExistError("connection lost after the statement (injected)")
        return result

    monkeypatch.setattr(asyncpg.Connection, "fetch", fetch)
    monkeypatch.setattr(asyncpg.Connection, "execute", execute)
    yield faults


# --- a PostgreSQL server of a test's own, to stop and restart ---------------------------

_ROOT = pathlib.Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def private_pg_server() -> Iterator[dict[str, str]]:
    """A throwaway server only this test uses (``.ci/pg-start.sh``): its ``PGTMP``,
    ``PGBIN``, ``PGPORT`` and ``TEST_PG_DSN``. Stopped afterwards, whatever happened."""
    import os
    import subprocess

    started = subprocess.run(["bash", str(_ROOT / ".ci" / "pg-start.sh")], capture_output=True, text=True, check=False)
    assert started.returncode == 0, "no PostgreSQL server: install Debian's postgresql package"
    exports = dict(
        part.split("=", 1) for line in started.stdout.splitlines() for part in line.removeprefix("export ").split()
    )
    try:
        yield exports
    finally:
        subprocess.run(
            ["bash", str(_ROOT / ".ci" / "pg-stop.sh")],
            env={**os.environ, "PGTMP": exports["PGTMP"], "PGBIN": exports["PGBIN"]}, check=False,
        )


def pg_ctl(server: dict[str, str], action: str) -> None:
    """``pg_ctl stop|start|restart`` on a private server (fast shutdown; a start listens
    where the server did). The server logs to its own file: it must not inherit this
    process's pipes, or waiting for pg_ctl would wait for the server to exit."""
    import os
    import subprocess

    owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    options = (["-o", f"-p {server['PGPORT']} -k {server['PGTMP']} -c listen_addresses=127.0.0.1 -c fsync=off"]
               if action == "start" else ["-m", "fast"])
    subprocess.run(
        [*owner, f"{server['PGBIN']}/pg_ctl", "-D", f"{server['PGTMP']}/data", "-l", f"{server['PGTMP']}/server.log",
         *options, "-w", "-t", "60", action],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=90,
    )
