"""Fixtures of the console's tests, on every database (SQLite, and a real PostgreSQL).

- ``seeded``: one migrated database per module and kind, filled by
  :func:`console_seed.seed` (read-only tests share it);
- ``console_url``: a fresh migrated database per test (tests that change things);
- ``console``: a function that opens an in-process client on a console of a URL
  (``console(url, token=...)``; ``throttle=`` a sign-in throttle on a test's clock,
  ``client_address=`` the address the console sees), closed at the test's end.

The client's base URL is ``http://127.0.0.1:8787``: a console without a token answers
only requests addressed to a loopback name.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from adapter_support import AVAILABLE_DATABASES, _run_async, bind_server, create_pg_database, drop_pg_database
from console_seed import Seeded, seed

from tenure.adapters import upgrade

BASE_URL = "http://127.0.0.1:8787"


@pytest.fixture(scope="module", params=AVAILABLE_DATABASES)
def seeded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Seeded]]:
    kind = request.param
    if kind == "sqlite":
        folder: pathlib.Path = tmp_path_factory.mktemp("console")
        url = f"sqlite:///{folder}/console.db"
    else:
        url = create_pg_database(bind_server(request))
    try:
        _run_async(upgrade(url))
        yield url, _run_async(seed(url))
    finally:
        if kind == "postgresql":
            drop_pg_database(url)


@pytest.fixture
def console_url(fresh_db_url: str) -> str:
    _run_async(upgrade(fresh_db_url))
    return fresh_db_url


@pytest.fixture
def console() -> Iterator[Callable[..., Any]]:
    from starlette.testclient import TestClient

    from tenure.apps.console.app import create_app
    from tenure.apps.console.settings import ConsoleSettings

    opened: list[Any] = []

    def open_console(db_url: str, *, base_url: str = BASE_URL, throttle: Any = None,
                     client_address: str = "testclient", **settings: Any) -> Any:
        client = TestClient(create_app(ConsoleSettings(db_url=db_url, **settings), throttle=throttle),
                            base_url=base_url, follow_redirects=False, client=(client_address, 50000))
        opened.append(client)
        return client.__enter__()

    try:
        yield open_console
    finally:
        for client in reversed(opened):
            client.__exit__(None, None, None)
