"""WorkerConfig: the trusted setup's lease and retry policy.

Defaults are the legacy queue defaults (a 300 s lease renewed every 60 s, retry backoff
from 1 s doubling up to 300 s). The database URL is never printed: it can carry a
password.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from . import bounds
from .validation import (
    IdentityText,
    NonEmptyText,
    NonNegativeMs,
    PayloadBytes,
    PositiveInt32,
    PositiveSeconds,
    StrictModel,
    TimeoutSeconds,
)

__all__ = ["WorkerConfig"]


class WorkerConfig(StrictModel):
    """Lease and retry policy for one source.

    - ``lease_seconds`` (may be fractional): how long a claim stays live without a heartbeat.
    - ``heartbeat_seconds``: how often a worker should renew; must be shorter than the lease.
    - ``backoff_base_ms`` / ``backoff_max_ms``: a retried job waits
      ``min(backoff_max_ms, backoff_base_ms * 2**attempt)`` before it is eligible again,
      where ``attempt`` counts the claims so far (the first retry waits twice the base).
    - ``max_attempts``: default attempt budget for envelopes that do not set their own.
    - ``timeout_seconds`` (default 30): the longest one call waits on the database. On
      PostgreSQL it bounds everything the call does (waiting for a pooled connection,
      connecting, lock waits, every statement and the commit); on SQLite it bounds the
      wait for the source's connection and, separately, the wait for the file's write
      lock. A call that runs out raises ``QUEUE_PERSISTENCE_FAILED`` with reason
      ``timeout`` (nothing was committed) or ``commit_unacknowledged`` (the commit was
      sent and its answer did not arrive in time: recover as after any lost
      acknowledgement).
    - ``db_schema`` (PostgreSQL only): the schema holding the queue tables, when the URL
      does not name it (``?schema=...``); default: the connection's current schema.
      pycharter keeps its tables in ``pycharter``.
    - ``max_payload_bytes`` (default 1 MiB): the largest envelope, result or error text
      (UTF-8 bytes of its stored JSON or text) the source accepts; a larger one raises
      ``ConfigValidationError`` before any database work.
    """

    db_url: NonEmptyText = Field(repr=False)
    db_schema: IdentityText | None = None
    lease_seconds: PositiveSeconds = 300
    heartbeat_seconds: PositiveSeconds = 60
    backoff_base_ms: NonNegativeMs = 1000
    backoff_max_ms: NonNegativeMs = 300_000
    max_attempts: PositiveInt32 | None = None
    timeout_seconds: TimeoutSeconds = 30
    max_payload_bytes: PayloadBytes = bounds.DEFAULT_MAX_PAYLOAD_BYTES

    def __init__(self, db_url: str, **settings: Any) -> None:
        super().__init__(db_url=db_url, **settings)

    @model_validator(mode="after")
    def _policy_is_coherent(self) -> WorkerConfig:
        if not self.heartbeat_seconds < self.lease_seconds:
            raise PydanticCustomError("heartbeat_not_shorter_than_lease", "heartbeat must be shorter than the lease")
        if not self.backoff_base_ms <= self.backoff_max_ms:
            raise PydanticCustomError("backoff_base_above_max", "backoff base must not exceed its maximum")
        return self

    @property
    def lease_us(self) -> int:
        """The lease in whole microseconds, as the kernel counts time."""
        return max(1, round(self.lease_seconds * 1_000_000))

