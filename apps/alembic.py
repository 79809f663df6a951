"""tenure's schema steps inside a user's own Alembic history.

A project that already migrates with Alembic adds one revision whose ``upgrade()`` calls
:func:`upgrade` and whose ``downgrade()`` calls :func:`downgrade` (``tenure migrate
--alembic`` prints that file, :func:`revision_file` writes it). Both run the migration
runner of :mod:`tenure.adapters.wiring.migrations`, the one ``tenure migrate`` runs: the
same steps, compiled from the same table descriptions, the same admission checks and
refusals, the same idempotence (an up-to-date database is checked and left as it is).
Only the connection differs: the statements go through Alembic's own connection
(``op.get_bind()``), inside Alembic's transaction, so tenure's steps commit or roll back
with the rest of the user's revision.

* PostgreSQL and SQLite, with any driver SQLAlchemy offers (the statements are sent with
  the driver's own parameter style). On SQLite, whose Python driver runs DDL outside a
  transaction, the step opens ``BEGIN IMMEDIATE`` itself when no transaction is open, so a
  refused upgrade leaves the file as it was (Alembic's commit or rollback ends it).
* ``schema`` (PostgreSQL): the schema of tenure's tables, as ``tenure migrate --schema``;
  without one, the connection's current schema.
* Offline mode (``alembic upgrade --sql``) is refused: the steps read the catalog to know
  what is missing. ``tenure migrate --sql`` prints the statements for review instead.
* A database failure raises ``TenureError`` with a reason word (as the stores do), never
  the driver's text.

:func:`include_object` keeps every table tenure creates or adopts (the table registry,
``tenure_migrations`` and each database's bookkeeping table) and everything on them out
of Alembic's autogenerate.

Nothing here imports Alembic: ``op`` is used through ``get_bind()`` and ``get_context()``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from tenure.model import ConfigValidationError, TenureError

from tenure.adapters.core.failures import Stage, translate
from tenure.adapters.core.migration_report import MigrationReport
from tenure.adapters.core.schema import MIGRATIONS_TABLE
from tenure.adapters.core.urls import DatabaseKind, check_schema_name
from tenure.adapters.wiring.dialects import BACKENDS
from tenure.adapters.wiring.migrations import run_downgrade, run_upgrade
from tenure.adapters.wiring.registry import TABLES

__all__ = ["upgrade", "downgrade", "include_object", "tenure_table_names", "revision_file", "check_revision_id",
           "AlembicOperations"]

T = TypeVar("T")

REVISION_ID = re.compile(r"[A-Za-z0-9_]{1,32}")
"""A revision identifier ``--revision`` and ``--down-revision`` accept: letters, digits and
underscores, at most 32 (the width of Alembic's ``alembic_version.version_num``)."""

REVISION_PLACEHOLDER = "FILL_IN_REVISION"
DOWN_REVISION_PLACEHOLDER = "FILL_IN_DOWN_REVISION"


class AlembicOperations(Protocol):
    """What the helpers use of Alembic's ``op`` (``alembic.operations.Operations``)."""

    def get_bind(self) -> Any: ...

    def get_context(self) -> Any: ...


def upgrade(op: AlembicOperations, *, schema: str | None = None) -> MigrationReport:
    """Apply tenure's missing schema steps on Alembic's connection and qualify the result,
    exactly as ``tenure migrate`` does; a wrongly prepared database is refused with
    ``ConfigValidationError`` naming each failed check (Alembic then rolls back)."""
    return _migrate(op, schema, "upgrade")


def downgrade(op: AlembicOperations, *, schema: str | None = None) -> MigrationReport:
    """Remove what tenure's steps added, exactly as ``tenure migrate --downgrade`` does:
    refused while protected submissions, live owned claims or recorded work remain; the
    queue tables pycharter also uses stay, in pycharter's shape."""
    return _migrate(op, schema, "downgrade")


def _migrate(op: AlembicOperations, schema: str | None, direction: str) -> MigrationReport:
    context = op.get_context()
    if getattr(context, "as_sql", False):
        raise ConfigValidationError("invalid_alembic_context", fields=("op",), problems=("offline_mode_unsupported",))
    bind = op.get_bind()
    try:
        kind = DatabaseKind(bind.dialect.name)
    except ValueError:
        raise ConfigValidationError("invalid_alembic_context", fields=("op",), problems=("unsupported_database",)) from None
    backend = BACKENDS[kind]
    if schema is not None:
        check_schema_name(schema, "db_schema")
        if not backend.schemas:
            raise ConfigValidationError("invalid_db_schema", fields=("db_schema",), problems=("sqlite_has_no_schemas",))
    dialect = backend.migration_rules()
    executor = _AlembicExecutor(bind, dialect.placeholder)
    if kind is DatabaseKind.SQLITE:
        executor.begin_sqlite_transaction()
    if direction == "upgrade":
        result = _run_to_end(run_upgrade(dialect, executor, schema, explicit_schema=schema is not None))
    else:
        result = _run_to_end(run_downgrade(dialect, executor, schema))
    changed, checks, statements = result
    return MigrationReport(dialect.name, direction, tuple(changed), tuple(checks), tuple(statements))


def _run_to_end(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a migration coroutine whose every await is a call on a synchronous executor.

    Nothing in it ever waits on an event loop, so it finishes in one step; no loop is
    started, so this works where Alembic's ``env.py`` already runs one (the async
    template's ``connection.run_sync``) as well as where none runs."""
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    coroutine.close()
    raise AssertionError("a migration step waited on something other than its connection")


_DOLLAR = re.compile(r"\$(\d+)")
_MARKS = {"qmark": "?", "format": "%s", "pyformat": "%s", "numeric": ":{n}", "numeric_dollar": "${n}",
          "named": ":tenure_p{n}"}
"""The n-th parameter's mark in each DB-API parameter style (PEP 249)."""


class _AlembicExecutor:
    """The migration runner's executor over Alembic's synchronous connection.

    The runner writes parameters as its dialect spells them (``?`` or ``$n``); each
    statement is re-spelt in the driver's parameter style. A statement without
    parameters is sent verbatim (``no_parameters``: no ``%`` escaping applies)."""

    def __init__(self, bind: Any, placeholder: str) -> None:
        self._bind = bind
        self._placeholder = placeholder
        self._paramstyle = str(bind.dialect.paramstyle)

    def begin_sqlite_transaction(self) -> None:
        """SQLite's Python driver runs DDL in autocommit until a DML statement opens a
        transaction: open one first, so the steps commit or roll back as one."""
        driver = getattr(self._bind.connection, "driver_connection", None)
        if getattr(driver, "in_transaction", True) is False:
            self._run("BEGIN IMMEDIATE", ())

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        return self._run(sql, parameters)

    def _run(self, sql: str, parameters: Sequence[Any]) -> list[Any]:
        from sqlalchemy.exc import DBAPIError, IntegrityError

        failure: DBAPIError | None = None
        try:
            if parameters:
                text, values = self._spelt(sql, parameters)
                result = self._bind.exec_driver_sql(text, values)
            else:
                result = self._bind.exec_driver_sql(sql, execution_options={"no_parameters": True})
            return [tuple(row) for row in result.fetchall()] if result.returns_rows else []
        except DBAPIError as error:
            failure = error
        # Raised outside the except block, so no driver text rides along as context.
        reason = "constraint_violated" if isinstance(failure, IntegrityError) else "unavailable"
        raise _failure(failure, reason)

    def _spelt(self, sql: str, parameters: Sequence[Any]) -> tuple[str, Any]:
        """``sql`` in the driver's parameter style, with its values in the order it reads them."""
        if self._placeholder == "?":
            pieces = sql.split("?")
            order = list(range(len(pieces) - 1))
        else:
            pieces = _DOLLAR.split(sql)[::2]
            order = [int(number) - 1 for number in _DOLLAR.findall(sql)]
        values = [parameters[index] for index in order]
        style = self._paramstyle
        if style in ("format", "pyformat"):
            pieces = [piece.replace("%", "%%") for piece in pieces]
        mark = _MARKS.get(style)
        assert mark is not None, "a DB-API parameter style"
        text = pieces[0] + "".join(mark.format(n=n) + piece for n, piece in enumerate(pieces[1:], start=1))
        if style == "named":
            return text, {f"tenure_p{n}": value for n, value in enumerate(values, start=1)}
        return text, tuple(values)


def _failure(error: BaseException | None, reason: str) -> TenureError:
    """The documented error for a failed statement; only a safe code of the driver's
    (SQLSTATE, SQLite error name) reaches the debug log, never its text."""
    assert error is not None
    driver_error = getattr(error, "orig", None)
    code = getattr(driver_error, "sqlstate", None) or getattr(driver_error, "sqlite_errorname", None)
    detail = code if isinstance(code, str) and code.replace("_", "").isalnum() else ""
    return translate(error, Stage.STATEMENT, reason, detail=detail)


@functools.cache
def tenure_table_names() -> frozenset[str]:
    """Every table a tenure migration creates, adopts or keeps its books in: the table
    registry's, ``tenure_migrations`` and each database's bookkeeping tables."""
    bookkeeping = {name for backend in BACKENDS.values() for name in backend.migration_rules().bookkeeping_tables()}
    return frozenset({spec.name for spec in TABLES} | {MIGRATIONS_TABLE} | bookkeeping)


@functools.cache
def _tenure_index_names() -> frozenset[str]:
    return frozenset(index.name for spec in TABLES for index in spec.indexes)


def include_object(object: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Alembic's ``include_object`` hook (``context.configure(include_object=...)``): False
    for tenure's tables and for every column, index and constraint on them, so that
    autogenerate neither drops nor alters what tenure's migration owns; True otherwise.
    To combine it with a hook of one's own, return ``include_object(...) and mine(...)``."""
    tables = tenure_table_names()
    if type_ == "table":
        return name not in tables
    table = getattr(object, "table", None)
    if getattr(table, "name", None) in tables:
        return False
    return not (type_ == "index" and name in _tenure_index_names())


def check_revision_id(value: str, field: str) -> str:
    """A revision identifier for the printed file, or ``ConfigValidationError``."""
    if not isinstance(value, str) or not REVISION_ID.fullmatch(value):
        raise ConfigValidationError("invalid_arguments", fields=(field,), problems=("invalid_revision_id",))
    return value


def revision_file(*, revision: str | None = None, down_revision: str | None = None, schema: str | None = None,
                  version: str = "") -> str:
    """The text of an Alembic revision whose upgrade and downgrade run tenure's steps
    (``tenure migrate --alembic`` prints it). Without ``revision`` or ``down_revision``
    the file carries placeholders to fill in."""
    if revision is not None:
        check_revision_id(revision, "revision")
    if down_revision is not None:
        check_revision_id(down_revision, "down_revision")
    if schema is not None:
        check_schema_name(schema, "db_schema")
    revision_line = (f'revision = "{revision}"' if revision is not None
                     else f'revision = "{REVISION_PLACEHOLDER}"  # fill in: this revision\'s identifier')
    down_line = (f'down_revision = "{down_revision}"' if down_revision is not None
                 else f'down_revision = "{DOWN_REVISION_PLACEHOLDER}"  # fill in: the revision this one follows '
                      "(None if it starts the history)")
    arguments = f', schema="{schema}"' if schema is not None else ""
    printed_by = f"`tenure migrate --alembic` (tenure {version})" if version else "`tenure migrate --alembic`"
    return f'''"""tenure's tables: the schema steps and admission checks of `tenure migrate`.

Revision ID: {revision or REVISION_PLACEHOLDER}
Revises: {down_revision or DOWN_REVISION_PLACEHOLDER}

Printed by {printed_by}. upgrade() applies the steps
that are missing and qualifies the result, refusing a wrongly prepared database
(ConfigValidationError); downgrade() removes them, refused while protected work
remains. Keep tenure's tables out of autogenerate: in env.py,
context.configure(..., include_object=tenure.apps.alembic.include_object).
"""

from alembic import op

from tenure.apps import alembic as tenure_alembic

{revision_line}
{down_line}
branch_labels = None
depends_on = None


def upgrade() -> None:
    tenure_alembic.upgrade(op{arguments})


def downgrade() -> None:
    tenure_alembic.downgrade(op{arguments})
'''

