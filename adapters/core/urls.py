"""Database URLs: which store a URL selects, and the driver-level target it names.

Accepted: ``sqlite:///path``, ``sqlite+aiosqlite:///path`` (``sqlite:///:memory:`` is
refused: every connection would see its own empty database; ``sqlite://path``, with two
slashes, is refused as ``sqlite_needs_three_slashes``), ``postgresql://...`` and
``postgresql+asyncpg://...``. A PostgreSQL URL may name the schema holding the queue
tables with a ``schema`` query parameter (``...?schema=pycharter``; pycharter keeps its
tables in ``pycharter``); without one, the connection's current schema is used. Any
other query parameter must be one of :data:`URL_PARAMETERS` (refused before connecting as
``unknown_url_parameter``); a bare path is refused as ``scheme_missing``. A URL
is configuration from trusted setup and may carry a password, so no error or ``repr``
ever contains it.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import re
import urllib.parse

from tenure.model import ConfigValidationError

__all__ = ["DatabaseKind", "DatabaseTarget", "parse_db_url", "check_schema_name", "URL_PARAMETERS"]

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def check_schema_name(schema: object, field: str = "db_url") -> str:
    """A PostgreSQL schema name tenure can quote safely: a plain identifier of at most
    63 characters (letters, digits, underscores; not starting with a digit)."""
    if type(schema) is not str or not _SCHEMA_NAME.fullmatch(schema):
        raise ConfigValidationError(f"invalid_{field}", fields=(field,), problems=("invalid_schema_name",))
    return schema


class DatabaseKind(enum.Enum):
    SQLITE = "sqlite"
    POSTGRESQL = "postgresql"


@dataclasses.dataclass(frozen=True, slots=True)
class DatabaseTarget:
    """What a URL selects. ``location`` is a file path (SQLite) or a libpq DSN (PostgreSQL)."""

    kind: DatabaseKind
    location: str = dataclasses.field(repr=False)
    schema: str | None = None
    """PostgreSQL: the schema the URL names (None: the connection's current schema)."""


def _split_schema(dsn: str) -> tuple[str, str | None]:
    """The DSN without its ``schema`` query parameter, and that parameter."""
    base, question, query = dsn.partition("?")
    if not question:
        return dsn, None
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    schemas = [value for name, value in pairs if name == "schema"]
    if not schemas:
        return dsn, None
    if len(schemas) > 1:
        raise ConfigValidationError("invalid_db_url", fields=("db_url",), problems=("invalid_schema_name",))
    rest = urllib.parse.urlencode([(name, value) for name, value in pairs if name != "schema"])
    return (base + "?" + rest if rest else base), check_schema_name(schemas[0])


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
            _check_parameters(rest)
            dsn, schema = _split_schema("postgresql://" + rest)
            return DatabaseTarget(kind, dsn, schema)
    if db_url.startswith(("sqlite:", "sqlite+aiosqlite:")):
        # sqlite://queue.db would name a host: the path follows a third slash.
        raise ConfigValidationError("invalid_db_url", fields=("db_url",), problems=("sqlite_needs_three_slashes",))
    if not _SCHEME.match(db_url):
        # queue.db, ./data/queue.db, /var/lib/queue.db: a path where a URL belongs.
        raise ConfigValidationError("invalid_db_url", fields=("db_url",), problems=("scheme_missing",))
    raise ConfigValidationError("invalid_db_url", fields=("db_url",), problems=("unsupported_scheme",))


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")

URL_PARAMETERS = frozenset({
    # asyncpg's connection parameters (asyncpg/connect_utils.py, _parse_connect_dsn_and_args)
    "host", "port", "user", "password", "passfile", "dbname", "database", "service", "servicefile",
    "sslmode", "sslcert", "sslkey", "sslrootcert", "sslnegotiation", "sslcrl", "sslpassword",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "target_session_attrs", "krbsrvname", "gsslib",
    # server settings tenure lets a URL set (asyncpg sends any other parameter as one)
    "application_name", "statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout",
    # tenure's own
    "schema",
})
"""The query parameters a PostgreSQL URL may carry. asyncpg sends any parameter it does not
know to the server as a setting, which fails only once connected, as ``unavailable``; a
misspelt ``sslmode`` would even connect without TLS. So any other parameter is refused
before connecting, never naming it (it may be a secret pasted after ``?``), but naming the
closest known parameter when one is close (``sslmod``: ``sslmode``)."""


def _check_parameters(dsn: str) -> None:
    query = dsn.partition("?")[2]
    for name, _ in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if name not in URL_PARAMETERS:
            # The unknown name is never repeated (a secret pasted after "?" would be); the
            # closest known parameter is named instead, when one is close.
            closest = difflib.get_close_matches(name.lower(), sorted(URL_PARAMETERS), n=1, cutoff=0.75)
            fields: tuple[str, ...] = ("db_url",)
            problems: tuple[str, ...] = ("unknown_url_parameter",)
            if closest:
                fields, problems = (*fields, f"db_url.{closest[0]}"), (*problems, "closest_known_parameter")
            raise ConfigValidationError("invalid_db_url", fields=fields, problems=problems)
