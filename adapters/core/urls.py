"""Database URLs: which store a URL selects, and the driver-level target it names.

Accepted: ``sqlite:///path``, ``sqlite+aiosqlite:///path`` (``sqlite:///:memory:`` is
refused: every connection would see its own empty database; ``sqlite://path``, with two
slashes, is refused as ``sqlite_needs_three_slashes``), ``postgresql://...`` and
``postgresql+asyncpg://...``. A PostgreSQL URL may name the schema holding the queue
tables with a ``schema`` query parameter (``...?schema=pycharter``; pycharter keeps its
tables in ``pycharter``); without one, the connection's current schema is used. A
``pooler`` query parameter says the URL reaches the server through a connection pooler
(``pooler=transaction``: PgBouncer or another pooler in transaction mode;
``pooler=session``: one in session mode; see :class:`Pooler`). Any
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

__all__ = [
    "DatabaseKind", "DatabaseTarget", "Pooler", "parse_db_url", "check_schema_name", "URL_PARAMETERS",
    "SERVER_SETTING_PARAMETERS",
]

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


class Pooler(enum.Enum):
    """The connection pooler a PostgreSQL URL reaches the server through (its ``pooler``
    query parameter; none: tenure talks to the server itself, and refuses a connection it
    finds answered by a pooler, ``pooler_detected_needs_pooler_parameter``).

    ``TRANSACTION`` (PgBouncer's ``pool_mode = transaction``): each transaction may run on
    another server connection, so tenure keeps nothing on a connection between
    transactions: no prepared statements (asyncpg's statement cache is off; each
    statement is parsed again, one more round trip), no LISTEN (workers poll), no server
    settings in the startup packet (the URL's ``statement_timeout`` and its kin are
    refused: set them on the role or the database). ``SESSION``: a pooler that gives each
    client one server connection for as long as it stays connected; everything works as
    on a direct connection."""

    TRANSACTION = "transaction"
    SESSION = "session"


SERVER_SETTING_PARAMETERS = frozenset({"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"})
"""URL parameters asyncpg sends to the server as settings in the startup packet. A pooler
in transaction mode refuses them (PgBouncer: unless told to ignore them, and then they
would silently not apply), so ``pooler=transaction`` refuses them before connecting."""


@dataclasses.dataclass(frozen=True, slots=True)
class DatabaseTarget:
    """What a URL selects. ``location`` is a file path (SQLite) or a libpq DSN (PostgreSQL)."""

    kind: DatabaseKind
    location: str = dataclasses.field(repr=False)
    schema: str | None = None
    """PostgreSQL: the schema the URL names (None: the connection's current schema)."""
    pooler: Pooler | None = None
    """PostgreSQL: the pooler the URL names (None: a direct connection)."""

    @property
    def dsn(self) -> str:
        """PostgreSQL: the driver's DSN (``location``: the URL without tenure's own parameters)."""
        return self.location


def _one(values: list[str], fields: tuple[str, ...], problem: str) -> str | None:
    if len(values) > 1:
        raise ConfigValidationError("invalid_db_url", fields=fields, problems=(problem,) * len(fields))
    return values[0] if values else None


def _split_own(dsn: str) -> tuple[str, str | None, Pooler | None]:
    """The DSN without tenure's own query parameters (the driver must not send them to the
    server as settings), and their values."""
    base, question, query = dsn.partition("?")
    if not question:
        return dsn, None, None
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    schema = _one([value for name, value in pairs if name == "schema"], ("db_url",), "invalid_schema_name")
    pooler_name = _one([value for name, value in pairs if name == "pooler"], ("db_url", "db_url.pooler"),
                       "unknown_pooler_mode")
    pooler = None
    if pooler_name is not None:
        try:
            pooler = Pooler(pooler_name)
        except ValueError:
            raise ConfigValidationError(
                "invalid_db_url", fields=("db_url", "db_url.pooler"), problems=("unknown_pooler_mode",) * 2
            ) from None
    if pooler is Pooler.TRANSACTION:
        for name, _ in pairs:
            if name in SERVER_SETTING_PARAMETERS:
                raise ConfigValidationError(
                    "invalid_db_url", fields=("db_url", f"db_url.{name}"),
                    problems=("pooler_transaction_mode_refuses_server_settings",) * 2,
                )
    rest = urllib.parse.urlencode([(name, value) for name, value in pairs if name not in _OWN_PARAMETERS])
    if schema is not None:
        schema = check_schema_name(schema)
    return (base + "?" + rest if rest else base), schema, pooler


_OWN_PARAMETERS = frozenset({"schema", "pooler"})


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
            dsn, schema, pooler = _split_own("postgresql://" + rest)
            return DatabaseTarget(kind, dsn, schema, pooler)
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
    # tenure's own (never sent to the server)
    "schema", "pooler",
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
