"""The dialect registry: which store and which migration steps a database URL selects.

Each dialect folder (``adapters/sqlite``, ``adapters/postgres``) exports its store and
its migration dialect; its driver is imported only when a URL selects it. Sources,
``upgrade`` and ``downgrade`` all open databases here.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from tenure.model import ConfigValidationError

from .store import Store
from .urls import DatabaseKind, DatabaseTarget, check_schema_name, parse_db_url

if TYPE_CHECKING:
    from .catalog import MigrationDialect

__all__ = ["open_store", "open_migration_target", "resolve_schema", "MigrationTarget"]


def resolve_schema(target: DatabaseTarget, configured: str | None) -> str | None:
    """The schema the URL and the configuration agree on (PostgreSQL only)."""
    if configured is not None:
        check_schema_name(configured, "db_schema")
    if target.kind is DatabaseKind.SQLITE and (configured is not None or target.schema is not None):
        raise ConfigValidationError("invalid_db_schema", fields=("db_schema",), problems=("sqlite_has_no_schemas",))
    if configured is not None and target.schema is not None and configured != target.schema:
        raise ConfigValidationError("invalid_db_schema", fields=("db_schema",), problems=("schema_differs_from_url",))
    return configured if configured is not None else target.schema


def _store(target: DatabaseTarget, schema: str | None, *, timeout_seconds: float | None, create: bool, wal: bool) -> Any:
    extra: dict[str, Any] = {} if timeout_seconds is None else {"timeout_seconds": timeout_seconds}
    if target.kind is DatabaseKind.SQLITE:
        from ..sqlite.store import SqliteStore

        return SqliteStore(target.location, create=create, wal=wal, **extra)
    from ..postgres.store import PostgresStore

    return PostgresStore(target.location, schema=schema, **extra)


def open_store(db_url: str, *, timeout_seconds: float, schema: str | None = None) -> Store:
    """A store for ``db_url`` (no connection is made until the first transaction), whose
    calls are bounded by ``timeout_seconds`` (see ``WorkerConfig.timeout_seconds``).
    ``schema`` (PostgreSQL) names the schema of the queue tables when the URL does not;
    naming two different ones, or one for SQLite, is refused."""
    target = parse_db_url(db_url)
    chosen = resolve_schema(target, schema)
    store: Store = _store(target, chosen, timeout_seconds=timeout_seconds, create=False, wal=True)
    return store


@dataclasses.dataclass(frozen=True, slots=True)
class MigrationTarget:
    store: Any
    dialect: MigrationDialect
    schema: str | None
    explicit_schema: bool
    """The URL or the caller named the schema (PostgreSQL may then create it)."""


def open_migration_target(db_url: str, schema: str | None, *, create: bool) -> MigrationTarget:
    """The store and migration dialect for ``db_url``. A migration may create a missing
    SQLite file (``create``) and never changes its journal mode."""
    target = parse_db_url(db_url)
    chosen = resolve_schema(target, schema)
    store = _store(target, chosen, timeout_seconds=None, create=create, wal=False)
    dialect: MigrationDialect
    if target.kind is DatabaseKind.SQLITE:
        from ..sqlite.migration import SQLITE_MIGRATION

        dialect = SQLITE_MIGRATION
    else:
        from ..postgres.migration import POSTGRESQL_MIGRATION

        dialect = POSTGRESQL_MIGRATION
    return MigrationTarget(store, dialect, chosen, chosen is not None)
