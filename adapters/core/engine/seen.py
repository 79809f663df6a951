"""The rows an engine last saw: the records it decides ahead from.

Kept per engine (the last version this process read or wrote of each row, with its row
version when the store reported one). A remembered row that is no longer stored costs a
read, never a wrong write: every write from a row seen compares it with the row stored.
Only the event loop touches it: a transaction body that may run in another thread
(SQLite's connection thread) collects what to keep, and the caller keeps it after the
commit.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

from ..tables import Binding

SEEN_ROWS = 10_000
"""Rows remembered per engine. A stale one costs one more round trip."""

__all__ = ["RowsSeen", "SEEN_ROWS"]


class RowsSeen:
    """The last version seen of each row, by table and key (at most :data:`SEEN_ROWS`,
    the least recently seen dropped first)."""

    def __init__(self) -> None:
        self._seen: collections.OrderedDict[tuple[str, str], tuple[Any, int | None]] = collections.OrderedDict()

    def remember(self, binding: Binding, records: Sequence[Any], versions: Mapping[str, int] | None = None) -> None:
        """Keep these rows as the last versions seen, with the row versions the store
        reported for them (by key), if any: the records the next writes decide from
        before reading (ahead of a statement on PostgreSQL, inside the write transaction
        on SQLite). A row remembered that is no longer stored costs a read, never a
        wrong write: every write from a row seen compares it with the row stored."""
        seen = self._seen
        for record in records:
            key = getattr(record, binding.key_field)
            entry = (binding.name, key)
            seen[entry] = (record, None if versions is None else versions.get(key))
            seen.move_to_end(entry)
        while len(seen) > SEEN_ROWS:
            seen.popitem(last=False)

    def last_seen(self, binding: Binding, key: str) -> tuple[bool, Any, int | None]:
        """(known, the row last seen, its row version if the store reported one).

        Part of the adapters' test seam (``docs/testing.md``): a proof asks whether the
        next write of this row will be decided from the row remembered (no read in the
        write's transaction) before it plants a writer between the two."""
        found = self._seen.get((binding.name, key))
        if found is None:
            return False, None, None
        return True, *found

    def forget(self, binding: Binding, key: str) -> None:
        self._seen.pop((binding.name, key), None)

    def keep(self, binding: Binding, key: str, record: Any, versions: Mapping[str, int] | None = None) -> None:
        if record is None:
            self.forget(binding, key)
        else:
            self.remember(binding, [record], versions)

    def remember_parts(self, rows: Sequence[tuple[Binding, Any]]) -> None:
        """Keep each row of a composite record (``parts``) as the last version seen."""
        for binding, row in rows:
            self.remember(binding, [row])
