"""The checked-in SQL renderings (``specs/sql/``) are what the stores send: a statement
changed without re-rendering its file fails here (tests/support/sql_renderings.py)."""

from __future__ import annotations

import pytest
import sql_renderings

from tenure.adapters.postgres import statements
from tenure.adapters.postgres.store import PostgresStore
from tenure.adapters.wiring.registry import BINDINGS


def test_the_checked_in_sql_renderings_are_current() -> None:
    assert sql_renderings.stale() == [], "re-render: .venv/bin/python -P tests/support/sql_renderings.py --write"


def test_a_changed_statement_makes_its_rendering_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check has teeth: the clock of the decided-ahead statements read before the
    locks (a real mutant, see test_ahead_postgres.py) shows in the PostgreSQL file only."""
    monkeypatch.setattr(statements, "CLOCK_AFTER_LOCKS", "clock AS MATERIALIZED (SELECT clock_timestamp() AS now, "
                        "(SELECT count(*) FROM locked) AS locked_rows)")
    statements.clear_statement_cache()
    try:
        assert sql_renderings.stale() == ["postgresql.sql"]
    finally:
        monkeypatch.undo()
        statements.clear_statement_cache()
    assert sql_renderings.stale() == []


@pytest.mark.parametrize("database", ["postgresql"])
async def test_the_postgresql_rendering_casts_to_the_types_a_migrated_database_has(db_url: str) -> None:
    """The rendered statements cast to the column types the renderer derives from the
    table declarations; the store casts to the types it reads from the catalog. They must
    be the same for every table tenure's migration creates. (Compared by name: statements
    look each type up by its column's name, and a column a later step adds sits after
    ``row_version`` in the catalog, e.g. ``tenure_attempts.granted_during_earlier_lease``.)"""
    store = PostgresStore(db_url)
    try:
        async with store.transaction(write=False) as transaction:
            await transaction.now_us()
        for binding in BINDINGS:
            found = store.column_types[binding.spec.name]
            assert len(found) == len(dict(found))  # no name twice
            assert dict(found) == dict(sql_renderings.postgres_types(binding)), binding.name
    finally:
        await store.close()
