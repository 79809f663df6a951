"""PostgreSQL as a backend: how its SQL and values are spelled, how a store opens, and
its migration rules. The driver (asyncpg) is imported only when a store is opened."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.backend import Backend
from ..core.sql import POSTGRESQL
from ..core.urls import DatabaseKind, DatabaseTarget

if TYPE_CHECKING:
    from ..core.catalog import MigrationDialect
    from ..core.store import Store

__all__ = ["POSTGRESQL_BACKEND"]


def _open_store(target: DatabaseTarget, schema: str | None, *, timeout_seconds: float | None, migrating: bool,
                create: bool) -> Store:
    from .store import PostgresStore

    extra: dict[str, Any] = {} if timeout_seconds is None else {"timeout_seconds": timeout_seconds}
    return PostgresStore(target.location, schema=schema, pooler=target.pooler, **extra)


def _migration_rules() -> MigrationDialect:
    from .migration import POSTGRESQL_MIGRATION

    return POSTGRESQL_MIGRATION


POSTGRESQL_BACKEND = Backend(
    kind=DatabaseKind.POSTGRESQL, capabilities=POSTGRESQL, schemas=True, open_store=_open_store,
    migration_rules=_migration_rules,
)
