"""Database URLs: which store a URL selects, and the driver-level target it names.

Accepted: ``sqlite:///path``, ``sqlite+aiosqlite:///path`` (``sqlite:///:memory:`` is
refused: every connection would see its own empty database), ``postgresql://...`` and
``postgresql+asyncpg://...``. A URL is configuration from trusted setup and may carry a
password, so no error or ``repr`` ever contains it.
"""

from __future__ import annotations

import dataclasses
import enum

from tenure.model import ConfigValidationError

__all__ = ["DatabaseKind", "DatabaseTarget", "parse_db_url"]


class DatabaseKind(enum.Enum):
    SQLITE = "sqlite"
    POSTGRESQL = "postgresql"


@dataclasses.dataclass(frozen=True, slots=True)
class DatabaseTarget:
    """What a URL selects. ``location`` is a file path (SQLite) or a libpq DSN (PostgreSQL)."""

    kind: DatabaseKind
    location: str = dataclasses.field(repr=False)


_PREFIXES = {
    "sqlite:///": DatabaseKind.SQLITE,
    "sqlite+aiosqlite:///": DatabaseKind.SQLITE,
    "postgresql://": DatabaseKind.POSTGRESQL,
    "postgresql+asyncpg://": DatabaseKind.POSTGRESQL,
    "postgres://": DatabaseKind.POSTGRESQL,
}


def parse_db_url(db_url: object) -> DatabaseTarget:
    """The target a URL names, or ConfigValidationError (which never quotes the URL)."""
    if type(db_url) is not str or not db_url or "\x00" in db_url:
        raise ConfigValidationError("invalid_db_url", fields=("db_url",), problems=("string_required",))
    for prefix, kind in _PREFIXES.items():
        if db_url.startswith(prefix):
            rest = db_url[len(prefix):]
            if kind is DatabaseKind.SQLITE:
                if not rest or rest == ":memory:" or rest.startswith("?"):
                    raise ConfigValidationError(
                        "invalid_db_url", fields=("db_url",), problems=("sqlite_file_path_required",)
                    )
                return DatabaseTarget(kind, rest)
            return DatabaseTarget(kind, "postgresql://" + rest)
    raise ConfigValidationError("invalid_db_url", fields=("db_url",), problems=("unsupported_scheme",))
