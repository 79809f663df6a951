"""The shell every facade shares: its timeout check, its engine, ``close`` and ``async
with``, one error boundary, the cursor of its paged listings, and what a sibling facade
needs of the ledger that made it (:class:`Transactions`).

A facade (``AttemptLedger``, ``RunLedger``, the job sources) owns one engine on one database and answers
in its own error code: a persistence failure of the shared store
(``QUEUE_PERSISTENCE_FAILED``) becomes the facade's code with the same reason word,
raised ``from None`` so a traceback shows one error, not two. Sibling facades reached
from a ledger (``ledger.attempts``, ``ledger.consents``) run on the same engine.

A facade that takes a database URL opens it through the database map
(:func:`tenure.adapters.wiring.dialects.open_store`) in its own constructor: the core
knows no database.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar, Protocol, TypeVar

from tenure.model import ConfigValidationError, ErrorCode, TenureError, bounds, canonical_json
from tenure.model.bounds import MAX_INSTANT_US, MIN_INSTANT_US
from tenure.model.runs import MAX_RUN_DOCUMENT_BYTES, check_document

from .engine import Engine
from .store import Store, Transaction
from .tables import json_column

__all__ = ["Facade", "Cursor", "Transactions", "persistence_as", "checked_timeout", "parsed_json", "json_text"]

T = TypeVar("T")
F = TypeVar("F", bound="Facade")


@contextlib.asynccontextmanager
async def persistence_as(code: ErrorCode) -> AsyncIterator[None]:
    """Inside: a persistence failure of the shared stores becomes ``code``, same reason."""
    try:
        yield
    except TenureError as error:
        if error.code is not ErrorCode.QUEUE_PERSISTENCE_FAILED:
            raise
        reason = error.reason
    else:
        return
    # Outside the handler: the store's error never rides along as the context of ours.
    raise TenureError(code, reason) from None


def checked_timeout(timeout_seconds: object) -> float:
    """A facade's ``timeout_seconds``: a number in (0, MAX_TIMEOUT_SECONDS], else
    ``invalid_timeout_seconds``."""
    if type(timeout_seconds) not in (int, float) or not 0 < timeout_seconds <= bounds.MAX_TIMEOUT_SECONDS:  # type: ignore[operator]
        raise ConfigValidationError("invalid_timeout_seconds", fields=("timeout_seconds",),
                                    problems=("number_out_of_range",))
    return float(timeout_seconds)  # type: ignore[arg-type]


class Transactions(Protocol):
    """What a sibling facade (consents, delegated jobs, node leases, checkpoints) needs of
    the ledger that made it: the shared engine, the ledger's error boundary and one
    transaction behind it. The Run ledger's ``RunEngine`` is one."""

    engine: Engine

    def errors(self) -> contextlib.AbstractAsyncContextManager[None]: ...

    async def run(self, body: Callable[[Transaction], Awaitable[T]], *, write: bool = True) -> T: ...


def parsed_json(text: str | None) -> Any:
    """A JSON column of a Run-side table as a value (:func:`~tenure.adapters.core.tables.json_column`,
    in the Run ledger's code: public records are built outside the transaction)."""
    return json_column(text, ErrorCode.RUN_PERSISTENCE_FAILED)


def json_text(value: Any, field: str) -> str:
    """A document as the Run-side tables store it: canonical JSON of at most 1 MiB."""
    check_document(value, field)
    text = canonical_json(value)
    if len(text.encode("utf-8")) > MAX_RUN_DOCUMENT_BYTES:
        raise ConfigValidationError(f"invalid_{field}", fields=(field,), problems=("payload_too_large",))
    return text


class Facade:
    """A ledger on one database (SQLite file or PostgreSQL), migrated by ``upgrade``. Its
    constructor opens its URL (:func:`checked_timeout`, then the database map) and hands
    the engine to :meth:`_on`."""

    persistence_code: ClassVar[ErrorCode]
    """The code this facade's persistence failures carry."""

    _engine: Engine
    store: Store

    def _on(self, engine: Engine) -> None:
        self._engine = engine
        self.store = engine.store

    @classmethod
    def _on_engine(cls: type[F], engine: Engine) -> F:
        """This facade on another facade's engine (the same database and connections;
        closing that facade closes this one's store)."""
        facade = cls.__new__(cls)
        facade._on(engine)
        return facade

    async def close(self) -> None:
        """Close the connections. Final: later calls raise ``source_closed``."""
        await self.store.close()

    async def __aenter__(self: F) -> F:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _errors(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The one boundary: persistence failures inside become :attr:`persistence_code`."""
        return persistence_as(self.persistence_code)

    async def _run(self, body: Callable[[Transaction], Awaitable[T]], *, write: bool = True) -> T:
        """``body`` in one transaction, behind :meth:`_errors`."""
        async with self._errors():
            return await self.store.run(body, write=write)


_CURSOR_INSTANT = re.compile(r"-?[0-9]{1,19}")


class Cursor:
    """The position after a listing's last item: ``<created_at_us>:<id>`` (oldest first,
    ties by ID). A cursor that does not parse is refused ``after`` ``cursor_required``."""

    @staticmethod
    def encode(created_at_us: int, key: str) -> str:
        return f"{created_at_us}:{key}"

    @staticmethod
    def parse(cursor: object, key_is_valid: Callable[[str], bool]) -> tuple[int, str]:
        if type(cursor) is str and ":" in cursor:
            created, _, key = cursor.partition(":")
            # ASCII digits only ("²".isdigit() is True, int() refuses it), within the
            # instants a row can hold (a larger one overflows the database's timestamp).
            if _CURSOR_INSTANT.fullmatch(created) and key_is_valid(key):
                instant = int(created)
                if MIN_INSTANT_US <= instant <= MAX_INSTANT_US:
                    return instant, key
        raise ConfigValidationError("invalid_after", fields=("after",), problems=("cursor_required",))


