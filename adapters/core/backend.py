"""What one database is to tenure, in one object (SQLAlchemy's dialect pattern).

A :class:`Backend` carries everything that differs between databases: how statements
are spelled and values encoded (:attr:`Backend.capabilities`, whose ``dialect`` is the
row codec), whether it has schemas, how a store for a URL opens (the driver is imported
only then), and its migration rules. Each database folder (``adapters/sqlite``,
``adapters/postgres``) declares one in its ``backend.py``;
:data:`tenure.adapters.wiring.dialects.BACKENDS` maps every URL kind to its backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .sql import Capabilities
from .tables import Dialect
from .urls import DatabaseKind, DatabaseTarget

if TYPE_CHECKING:
    from .catalog import MigrationDialect
    from .store import Store

__all__ = ["Backend", "StoreFactory"]


class StoreFactory(Protocol):
    def __call__(self, target: DatabaseTarget, schema: str | None, *, timeout_seconds: float | None, migrating: bool,
                 create: bool) -> Store:
        """A store for ``target`` (no connection is made yet). ``migrating``: the store
        serves the migration runner (``create``: it may create a missing database file)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Backend:
    kind: DatabaseKind
    capabilities: Capabilities
    """How statements are spelled (locking suffixes, list parameters, JSON comparison)."""
    schemas: bool
    """Whether the database has schemas a URL or configuration may name."""
    open_store: StoreFactory
    migration_rules: Callable[[], MigrationDialect]
    """The migration runner's rules for this database (imported on first use)."""

    @property
    def codec(self) -> Dialect:
        """How record values are written to and read from this database's columns."""
        return self.capabilities.dialect
