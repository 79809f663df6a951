"""The backend registry: which :class:`~tenure.adapters.core.backend.Backend` a database
URL selects, and with it which store and which migration rules.

Each database folder (``adapters/sqlite``, ``adapters/postgres``) declares its backend;
its driver is imported only when a URL selects it. Sources, ``upgrade`` and
``downgrade`` all open databases here.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from tenure.model import ConfigValidationError

from ..core.backend import Backend
from ..core.store import Store
from ..core.urls import DatabaseKind, DatabaseTarget, check_schema_name, parse_db_url
from ..postgres.backend import POSTGRESQL_BACKEND
from ..sqlite.backend import SQLITE_BACKEND

if TYPE_CHECKING:
    from ..core.catalog import MigrationDialect

__all__ = ["BACKENDS", "backend_for", "open_store", "open_migration_target", "resolve_schema", "MigrationTarget"]

BACKENDS: dict[DatabaseKind, Backend] = {DatabaseKind.SQLITE: SQLITE_BACKEND, DatabaseKind.POSTGRESQL: POSTGRESQL_BACKEND}
"""Every database kind a URL may select (:func:`tenure.adapters.core.urls.parse_db_url`), with its backend."""


def backend_for(target: DatabaseTarget) -> Backend:
    return BACKENDS[target.kind]


def resolve_schema(target: DatabaseTarget, configured: str | None) -> str | None:
    """The schema the URL and the configuration agree on (PostgreSQL only)."""
    if configured is not None:
        check_schema_name(configured, "db_schema")
    if not backend_for(target).schemas and (configured is not None or target.schema is not None):
        raise ConfigValidationError("invalid_db_schema", fields=("db_schema",), problems=("sqlite_has_no_schemas",))
    if configured is not None and target.schema is not None and configured != target.schema:
        raise ConfigValidationError("invalid_db_schema", fields=("db_schema",), problems=("schema_differs_from_url",))
    return configured if configured is not None else target.schema


def open_store(db_url: str, *, timeout_seconds: float, schema: str | None = None) -> Store:
    """A store for ``db_url`` (no connection is made until the first transaction), whose
    calls are bounded by ``timeout_seconds`` (see ``WorkerConfig.timeout_seconds``).
    ``schema`` (PostgreSQL) names the schema of the queue tables when the URL does not;
    naming two different ones, or one for SQLite, is refused."""
    target = parse_db_url(db_url)
    chosen = resolve_schema(target, schema)
    return backend_for(target).open_store(target, chosen, timeout_seconds=timeout_seconds, migrating=False, create=False)


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
    backend = backend_for(target)
    store = backend.open_store(target, chosen, timeout_seconds=None, migrating=True, create=create)
    return MigrationTarget(store, backend.migration_rules(), chosen, chosen is not None)
