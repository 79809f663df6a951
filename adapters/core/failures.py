"""Why a database call failed: one reason word per cause, and the one boundary where a
driver's exception becomes the documented error.

Every call a store makes into its driver (connecting, taking a pooled connection,
BEGIN, each statement, COMMIT, ROLLBACK, closing) goes through :func:`translate`, so no
driver, socket, pool or timeout exception can reach a caller: each becomes
``TenureError(QUEUE_PERSISTENCE_FAILED, reason)``. The reason comes from the store's
tables (exception classes, first match wins; SQLite error names); an exception nobody
listed becomes ``unavailable``, so a future driver exception cannot slip through either.

The driver's own text may quote values (a unique violation names the key it met), so
only the exception's class name and, where the driver has one, its SQLSTATE or SQLite
error name are logged, at debug level, on the ``tenure.adapters`` logger.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence

from tenure.model import ErrorCode, TenureError

__all__ = ["Stage", "REASONS", "RETRY_SAFE", "persistence_failed", "reason_by_class", "translate", "LOG"]

LOG = logging.getLogger("tenure.adapters")


class Stage(enum.Enum):
    """Where in a call the failure happened: it decides what the caller may conclude."""

    CONNECT = "connect"
    """Before any transaction began: nothing can have been written."""
    STATEMENT = "statement"
    """Inside the transaction, before COMMIT was sent: nothing was committed."""
    COMMIT = "commit"
    """COMMIT was sent and no acknowledgement came back: the outcome is unknown."""


REASONS: dict[str, str] = {
    "schema_missing": "the queue tables or tenure's additions to them are missing: run `tenure migrate`",
    "database_missing": "the database (PostgreSQL) or the file or its folder (SQLite) does not exist",
    "connection_refused": "no connection could be made: the server is down, starting, full or unreachable",
    "authentication_failed": "the server refused the credentials of the database URL",
    "host_not_found": "the host name of the database URL does not resolve (DNS): nothing was sent",
    "tls_failed": "TLS could not be negotiated with the server (not offered, or its certificate not trusted)",
    "timeout": "the call ran out of WorkerConfig.timeout_seconds before COMMIT was sent: nothing was committed",
    "connection_lost": "the connection broke before COMMIT was sent: nothing was committed",
    "commit_unacknowledged": "COMMIT was sent but not acknowledged: the write may or may not have happened",
    "unavailable": "any other database failure, including a value the database rejects (an invalid UUID)",
    "constraint_violated": "a unique index refused a write that a concurrent call won (retried internally first)",
    "deadlock": "the database broke a deadlock by aborting this call (retried internally for submissions)",
    "corrupt_row": "a stored row holds values the kernel cannot read (written outside tenure)",
    "row_changed": "another writer changed the row between the lock and the write (a privileged writer)",
    "read_back_mismatch": "the row as stored differs from what was written (a trigger or a coercion)",
    "write_not_applied": "an insert returned no row",
    "delivery_missing": "a Run's current delivery row is missing (deleted or written outside tenure)",
    "invariant_broken": "a decision would have stored a record breaking the kernel's invariants (a bug: nothing was written)",
}
"""Every reason a ``QUEUE_PERSISTENCE_FAILED`` error can carry, and what it means.
docs/errors.md's reason table lists exactly these (tests/adapters/core/test_failures.py holds them equal)."""

RETRY_SAFE: frozenset[str] = frozenset(
    {"connection_refused", "host_not_found", "timeout", "connection_lost", "unavailable", "constraint_violated",
     "deadlock"}
)
"""Reasons after which the same call may simply be made again: nothing was committed.
``commit_unacknowledged`` needs recovery instead (replay the submission, recover the
claim with its nonce, or read the job), and the others need an operator."""


def persistence_failed(reason: str) -> TenureError:
    assert reason in REASONS, "every persistence reason is documented in REASONS"
    return TenureError(ErrorCode.QUEUE_PERSISTENCE_FAILED, reason)


def reason_by_class(error: BaseException, table: Sequence[tuple[type[BaseException], str]]) -> str:
    """The reason of the first class in ``table`` that ``error`` is an instance of, else
    ``unavailable`` (so an exception class nobody listed cannot slip through)."""
    return next((reason for kind, reason in table if isinstance(error, kind)), "unavailable")


def translate(error: BaseException, stage: Stage, reason: str, *, detail: str = "") -> TenureError:
    """The documented error for a driver failure at ``stage``.

    ``reason`` is what the store's table says of ``error``; ``detail`` a safe code the
    driver attaches (SQLSTATE, SQLite error name) for the debug log. A failure at COMMIT
    is always ``commit_unacknowledged``: whatever the driver said, the commit may have
    happened. At CONNECT, a broken connection means none was made.
    """
    if stage is Stage.COMMIT:
        reason = "commit_unacknowledged"
    elif stage is Stage.CONNECT and reason == "connection_lost":
        reason = "connection_refused"
    LOG.debug(
        "database call failed at %s: %s%s -> %s", stage.value, type(error).__name__, f" ({detail})" if detail else "", reason
    )
    return persistence_failed(reason)
