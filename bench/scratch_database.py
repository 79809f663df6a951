"""A new, empty PostgreSQL database for one benchmark, in environments without tenure
(the peers' and pycharter's): psycopg only."""

from __future__ import annotations

import uuid

import psycopg


def create_database(server_dsn: str, prefix: str) -> str:
    """Create a database named ``<prefix>_<random>`` on the server; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return server_dsn.rsplit("/", 1)[0] + "/" + name
