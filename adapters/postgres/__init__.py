"""The PostgreSQL store (asyncpg) and its migration. The driver is imported only here."""

from __future__ import annotations

__all__: list[str] = []
