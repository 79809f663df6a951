"""The schema steps, compiled for each database from the table descriptions.

* ``legacy``: the tables other clients create, exactly as they create them (the three
  queue tables as pycharter 0.0.67 does: :func:`tenure.adapters.queue.table.legacy_ddl`),
  created only where missing;
* ``owned`` (additive): tenure's columns and indexes on those tables, plus its own
  bookkeeping tables (``tenure_migrations``; on SQLite ``tenure_clock``, the database
  time's high-water mark). Old rows start with generation 0, no token and no submission
  identity. ``downgrade`` removes all of it.

Only DDL is compiled through SQLAlchemy; runtime statements are plain SQL in the stores.
"""

from __future__ import annotations

from sqlalchemy import String, Text
from sqlalchemy.engine import Dialect as SqlDialect

from .tables import ROW_VERSION, Codec, ColumnSpec, IndexSpec, TableSpec, qualified

__all__ = [
    "MIGRATIONS_TABLE",
    "CLOCK_TABLE",
    "MIGRATIONS_SPEC",
    "clock_ddl",
    "owned_column_ddl",
    "owned_index_ddl",
    "row_version_column_ddl",
    "migrations_ddl",
]

MIGRATIONS_TABLE = "tenure_migrations"
CLOCK_TABLE = "tenure_clock"
"""SQLite only: the database time's high-water mark (see adapters/sqlite/store.py)."""

MIGRATIONS_SPEC = TableSpec(
    MIGRATIONS_TABLE,
    (
        ColumnSpec("name", "name", Codec.TEXT, String(64), nullable=False, mutable=False, primary_key=True),
        ColumnSpec("applied_at", "applied_at", Codec.TEXT, Text(), nullable=False, mutable=False),
    ),
)


def migrations_ddl(dialect: SqlDialect, schema: str | None) -> list[str]:
    return MIGRATIONS_SPEC.create_ddl(dialect, schema)


def clock_ddl() -> list[str]:
    """SQLite: the one-row clock table, created with the owned migration (idempotent)."""
    return [
        f"CREATE TABLE IF NOT EXISTS {CLOCK_TABLE} "
        "(id INTEGER PRIMARY KEY CHECK (id = 1), high_water_us INTEGER NOT NULL)",
        f"INSERT OR IGNORE INTO {CLOCK_TABLE} (id, high_water_us) VALUES (1, 0)",
    ]


def owned_column_ddl(spec: TableSpec, column: ColumnSpec, dialect: SqlDialect, schema: str | None) -> str:
    """``ALTER TABLE ... ADD COLUMN`` for one owned column."""
    sql = f"ALTER TABLE {qualified(schema, spec.name)} ADD COLUMN {column.name} {column.sql_type.compile(dialect=dialect)}"
    if column.default_sql is not None:
        sql += f" DEFAULT {column.default_sql}"
    if not column.nullable:
        sql += " NOT NULL"
    return sql


def row_version_column_ddl(spec: TableSpec, dialect: SqlDialect, schema: str | None) -> str:
    """``ALTER TABLE ... ADD COLUMN row_version``: every existing row starts at version 0."""
    return f"ALTER TABLE {qualified(schema, spec.name)} ADD COLUMN {ROW_VERSION} BIGINT DEFAULT 0 NOT NULL"


def owned_index_ddl(spec: TableSpec, index: IndexSpec, schema: str | None) -> str:
    unique = "UNIQUE " if index.unique else ""
    return (
        f"CREATE {unique}INDEX IF NOT EXISTS {index.name} ON {qualified(schema, spec.name)} "
        f"({', '.join(index.columns)})" + ("" if index.where is None else f" WHERE {index.where}")
    )

