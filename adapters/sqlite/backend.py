"""SQLite as a backend: how its SQL and values are spelled, how a store opens, and its
migration rules. The driver (aiosqlite) is imported only when a store is opened."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.backend import Backend
from ..core.sql import SQLITE
from ..core.urls import DatabaseKind, DatabaseTarget

if TYPE_CHECKING:
    from ..core.catalog import MigrationDialect
    from ..core.store import Store

__all__ = ["SQLITE_BACKEND"]


def _open_store(target: DatabaseTarget, schema: str | None, *, timeout_seconds: float | None, migrating: bool,
                create: bool) -> Store:
    from .store import SqliteStore

    extra: dict[str, Any] = {} if timeout_seconds is None else {"timeout_seconds": timeout_seconds}
    # The journal mode: a store that runs work switches the file to WAL (readers proceed
    # while a writer holds the lock); a migration never changes a file's journal mode.
    return SqliteStore(target.location, create=create, wal=not migrating, **extra)


def _migration_rules() -> MigrationDialect:
    from .migration import SQLITE_MIGRATION

    return SQLITE_MIGRATION


SQLITE_BACKEND = Backend(
    kind=DatabaseKind.SQLITE, capabilities=SQLITE, schemas=False, open_store=_open_store,
    migration_rules=_migration_rules,
)
