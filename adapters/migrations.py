"""Applying and removing the owned migration: ``upgrade(db_url)`` and ``downgrade(db_url)``.

``upgrade`` creates the legacy queue tables when missing, adds the owned columns and
indexes, and qualifies the result (see the store's migration module for every check).
A wrongly prepared database is refused with ``ConfigValidationError`` and left exactly
as it was. ``downgrade`` locks first, then refuses while protected submissions or live
owned claims remain; otherwise it removes the owned columns. Both return a
:class:`MigrationReport` saying what was applied and checked.
"""

from __future__ import annotations

from .migration_report import Check, MigrationReport
from .urls import DatabaseKind, parse_db_url

__all__ = ["upgrade", "downgrade", "MigrationReport", "Check"]


async def upgrade(db_url: str) -> MigrationReport:
    """Apply the legacy schema (if missing) and the additive owned migration, then qualify it."""
    target = parse_db_url(db_url)
    if target.kind is DatabaseKind.SQLITE:
        from .sqlite.migration import upgrade_sqlite
        from .sqlite.store import SqliteStore

        store = SqliteStore(target.location, create=True)
        try:
            return await upgrade_sqlite(store)
        finally:
            await store.close()
    from .postgres.migration import upgrade_postgres
    from .postgres.store import PostgresStore

    pg_store = PostgresStore(target.location)
    try:
        return await upgrade_postgres(pg_store)
    finally:
        await pg_store.close()


async def downgrade(db_url: str) -> MigrationReport:
    """Remove the owned migration; refused while protected or owned work remains."""
    target = parse_db_url(db_url)
    if target.kind is DatabaseKind.SQLITE:
        from .sqlite.migration import downgrade_sqlite
        from .sqlite.store import SqliteStore

        store = SqliteStore(target.location)
        try:
            return await downgrade_sqlite(store)
        finally:
            await store.close()
    from .postgres.migration import downgrade_postgres
    from .postgres.store import PostgresStore

    pg_store = PostgresStore(target.location)
    try:
        return await downgrade_postgres(pg_store)
    finally:
        await pg_store.close()
