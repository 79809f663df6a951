"""Counting the SQL statements a piece of work sends, on PostgreSQL and SQLite.

``with count_statements() as counted: ...`` counts every statement this process sends
to either database while the block runs (``counted.total``, and ``counted.texts``: the
statements themselves, in order, for a profile). A count, never a timing: a test pins
it as an upper bound, the benchmarks divide it by the Runs they ran
(``bench/runs.py``, ``bench/recovery.py`` import this module).

Why counted at the driver, and not with ``pg_stat_statements``: that extension must be
preloaded when the server starts (a shared server cannot be restarted for it) and counts
every client of the server; a driver hook counts this process's work alone, on both
databases, with nothing installed.

- PostgreSQL: every statement tenure sends goes through an ``asyncpg.Connection``'s
  ``_execute`` (``fetch``, ``fetchrow``, ``fetchval``, ``execute`` with arguments),
  ``_executemany`` (``fetchmany``, ``executemany``) or ``execute`` without arguments
  (the simple protocol: ``BEGIN``, ``COMMIT``, a ``NOTIFY`` sent with it). Each counted
  statement is one round trip once asyncpg has its prepared form cached on the
  connection (the first use of a statement text on a connection adds a Parse round
  trip, and asyncpg's own type introspection is not counted: warm up before counting).
  ``asyncpg.Connection.add_query_logger`` would see the same calls, but it reports them
  with ``call_soon``, after the statement's caller resumed, so a count read right after
  an ``await`` could miss the last ones.
- SQLite: every statement of every path runs through
  ``tenure.adapters.sqlite.store._statement`` (its docstring says so; fault-injection
  tests replace it the same way). SQLite has no round trips: the figure is statements.

The counter replaces those methods for the duration of the block (in this process, for
every connection, opened before or after): work running beside the measured one in the
same process (a worker's poll, a relay) is counted too.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Iterator
from typing import Any

__all__ = ["StatementCount", "count_statements"]


@dataclasses.dataclass
class StatementCount:
    """The statements counted so far (see the module docstring)."""

    texts: list[str] = dataclasses.field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.texts)

    def since(self, start: int) -> int:
        """Statements counted after the first ``start`` (``counted.since(mark)`` with
        ``mark = counted.total`` taken before a step: that step's count)."""
        return self.total - start

    def profile(self, start: int = 0) -> Counter[str]:
        """How many times each statement ran after the first ``start``, by its first 80
        characters (whitespace folded): which statements a figure is made of."""
        return Counter(" ".join(text.split())[:80] for text in self.texts[start:])


@contextlib.contextmanager
def count_statements() -> Iterator[StatementCount]:
    """Count every statement sent to PostgreSQL (asyncpg) or SQLite while the block runs."""
    counted = StatementCount()
    with contextlib.ExitStack() as restore:
        _count_asyncpg(counted, restore)
        _count_sqlite(counted, restore)
        yield counted


def _replace(restore: contextlib.ExitStack, owner: Any, name: str, replacement: Any) -> None:
    original = owner.__dict__[name]
    setattr(owner, name, replacement)
    restore.callback(setattr, owner, name, original)


def _count_asyncpg(counted: StatementCount, restore: contextlib.ExitStack) -> None:
    try:
        from asyncpg.connection import Connection
    except ImportError:  # pragma: no cover - the PostgreSQL extra is not installed
        return
    execute, single, many = Connection.execute, Connection._execute, Connection._executemany

    async def counted_execute(self: Any, query: str, *args: Any, **options: Any) -> Any:
        if not args:  # with arguments it runs through _execute, counted there
            counted.texts.append(query)
        return await execute(self, query, *args, **options)

    async def counted_single(self: Any, query: str, *args: Any, **options: Any) -> Any:
        counted.texts.append(query)
        return await single(self, query, *args, **options)

    async def counted_many(self: Any, query: str, *args: Any, **options: Any) -> Any:
        counted.texts.append(query)
        return await many(self, query, *args, **options)

    _replace(restore, Connection, "execute", counted_execute)
    _replace(restore, Connection, "_execute", counted_single)
    _replace(restore, Connection, "_executemany", counted_many)


def _count_sqlite(counted: StatementCount, restore: contextlib.ExitStack) -> None:
    from tenure.adapters.sqlite import store

    statement = store._statement

    def counted_statement(connection: Any, sql: str, parameters: Any) -> list[Any]:
        counted.texts.append(sql)
        return statement(connection, sql, parameters)

    _replace(restore, store, "_statement", counted_statement)
