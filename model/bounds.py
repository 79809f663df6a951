"""Technical validation bounds (not live budgets), exactly as the queue specification sets them.

Identities are compared exactly: never trimmed, case-folded or Unicode-normalized. A
bool never satisfies an integer bound (``True`` is an ``int`` in Python, not here).
"""

from __future__ import annotations

__all__ = [
    "MIN_INSTANT_US",
    "MAX_INSTANT_US",
    "is_instant",
    "MAX_IDENTITY_CHARS",
    "MAX_JOB_ID_CHARS",
    "MAX_RUN_ID_CHARS",
    "MAX_DLQ_ID_CHARS",
    "MAX_CONTRACT_NAME_CHARS",
    "MAX_CONTRACT_VERSION_CHARS",
    "MAX_CONFIG_NAME_CHARS",
    "MAX_CONFIG_VERSION_CHARS",
    "MAX_QUEUE_NAME_CHARS",
    "MAX_TASK_NAME_CHARS",
    "MAX_PRIORITY",
    "INT32_MAX",
    "INT64_MAX",
    "MAX_LEASE_SECONDS",
    "MAX_BACKOFF_MS",
    "MAX_TIMEOUT_SECONDS",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_PAYLOAD_BYTES_LIMIT",
    "is_strict_int",
    "is_identity",
    "is_bounded_text",
]

MAX_IDENTITY_CHARS = 255
"""Submission IDs, claim tokens, worker and launcher IDs, idempotency keys."""

MAX_JOB_ID_CHARS = 36
MAX_RUN_ID_CHARS = 32
MAX_DLQ_ID_CHARS = 32

# Column widths of the queue tables for the envelope's naming fields.
MAX_CONTRACT_NAME_CHARS = 255
MAX_CONTRACT_VERSION_CHARS = 50
MAX_CONFIG_NAME_CHARS = 512
MAX_CONFIG_VERSION_CHARS = 64

MAX_QUEUE_NAME_CHARS = 63
"""A task queue's name is an identifier of at most 63 characters (a PostgreSQL identifier)."""

MAX_TASK_NAME_CHARS = 255
MAX_PRIORITY = 100
"""Task priorities are 0..100; a higher priority is claimed first."""

INT32_MAX = 2**31 - 1
"""max_attempts and PIDs are in 1..INT32_MAX."""

INT64_MAX = 2**63 - 1
"""Generations are in 1..INT64_MAX once claimed; overflow is refused, never wrapped."""


MAX_LEASE_SECONDS = 366 * 24 * 3600
"""A lease of at most a year keeps every deadline representable in 64-bit microseconds."""

MAX_BACKOFF_MS = 366 * 24 * 3600 * 1000
"""Backoff delays are capped for the same reason."""

MAX_TIMEOUT_SECONDS = 24 * 3600
"""The longest database-call timeout a WorkerConfig accepts (a day)."""

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
"""Default bound on one stored JSON text (an envelope, a result or an error), in UTF-8
bytes: 1 MiB. A claim carries its envelope, so an unbounded payload makes every claim of
it slow (a 50 MiB SQLite claim outlasted a 1 s lease)."""

MAX_PAYLOAD_BYTES_LIMIT = 256 * 1024 * 1024
"""The largest bound a WorkerConfig may set (far below PostgreSQL's 1 GB per value)."""


MIN_INSTANT_US = -62_135_596_800_000_000
"""0001-01-01T00:00:00Z in microseconds since the epoch: the earliest datetime."""

MAX_INSTANT_US = 253_402_300_799_999_999
"""9999-12-31T23:59:59.999999Z: the latest datetime."""


def is_instant(value: object) -> bool:
    """An instant every machine and database can hold: an ``int`` (never a bool) of
    microseconds since the epoch, from :data:`MIN_INSTANT_US` to :data:`MAX_INSTANT_US`."""
    return is_strict_int(value) and MIN_INSTANT_US <= value <= MAX_INSTANT_US  # type: ignore[operator]


def is_strict_int(value: object) -> bool:
    """True for a real ``int``; False for ``bool`` and every other type."""
    return type(value) is int


def is_bounded_text(value: object, max_chars: int) -> bool:
    """A nonempty ``str`` (not a subclass) of at most ``max_chars`` characters."""
    return type(value) is str and 0 < len(value) <= max_chars


def is_identity(value: object) -> bool:
    """A nonempty ``str`` of at most 255 characters, taken exactly as given."""
    return is_bounded_text(value, MAX_IDENTITY_CHARS)
