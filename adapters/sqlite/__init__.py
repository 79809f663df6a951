"""The SQLite store (aiosqlite) and its migration. The driver is imported only here."""

from __future__ import annotations

__all__: list[str] = []
