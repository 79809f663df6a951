"""Opening the store a database URL selects. Drivers are imported only when needed."""

from __future__ import annotations

from .store import Store
from .urls import DatabaseKind, parse_db_url

__all__ = ["open_store"]


def open_store(db_url: str, *, timeout_seconds: float) -> Store:
    """A store for ``db_url`` (no connection is made until the first transaction), whose
    calls are bounded by ``timeout_seconds`` (see ``WorkerConfig.timeout_seconds``)."""
    target = parse_db_url(db_url)
    if target.kind is DatabaseKind.SQLITE:
        from .sqlite.store import SqliteStore

        return SqliteStore(target.location, timeout_seconds=timeout_seconds)
    from .postgres.store import PostgresStore

    return PostgresStore(target.location, timeout_seconds=timeout_seconds)
