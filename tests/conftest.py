"""Shared test setup: Hypothesis profiles and the kernel-mutant switch.

``TENURE_KERNEL_MUTANT=<name>`` applies one deliberately broken kernel from
``kernel_mutants.py`` before any test runs; ``test_mutants.py`` uses it to prove that
the suite fails for every mutant. It is never set in a normal run.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "default",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    parent=settings.get_profile("default"),
    derandomize=True,
    database=None,
    print_blob=True,
)
settings.load_profile("ci" if os.environ.get("CI") else "default")

_mutant = os.environ.get("TENURE_KERNEL_MUTANT")
if _mutant:
    import kernel_mutants

    kernel_mutants.apply(_mutant)
    # A mutant run only has to fail (test_mutants.py asserts the exit status): the first
    # counterexample proves it, and shrinking it would only spend time. Same examples,
    # same order; no shrink phase.
    settings.register_profile(
        "mutant",
        parent=settings.get_profile("ci" if os.environ.get("CI") else "default"),
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
    )
    settings.load_profile("mutant")


# --- A real PostgreSQL server for the tests that need one. ---------------------------

import pathlib  # noqa: E402
import subprocess  # noqa: E402
import urllib.parse  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """The DSN of a real, throwaway PostgreSQL server.

    `.ci/test-all.sh` starts one and exports TEST_PG_DSN. Run alone, the fixture starts
    its own with `.ci/pg-start.sh`. It never skips: without a server the tests fail.
    """
    dsn = os.environ.get("TEST_PG_DSN")
    if dsn:
        yield dsn
        return
    started = subprocess.run(
        ["bash", str(ROOT / ".ci" / "pg-start.sh")], capture_output=True, text=True, check=False
    )
    if started.returncode != 0:
        pytest.fail("no PostgreSQL server: install Debian's postgresql package or set TEST_PG_DSN")
    exports = dict(
        part.split("=", 1)
        for line in started.stdout.splitlines()
        for part in line.removeprefix("export ").split()
    )
    try:
        yield exports["TEST_PG_DSN"]
    finally:
        subprocess.run(
            ["bash", str(ROOT / ".ci" / "pg-stop.sh")],
            env={**os.environ, "PGTMP": exports["PGTMP"], "PGBIN": exports["PGBIN"]},
            check=False,
        )


# --- One suite for every database. ----------------------------------------------------

import adapter_support  # noqa: E402


@pytest.fixture(scope="session")
def pgbouncer_dsn(pg_dsn: str) -> Iterator[str]:
    """The DSN of a PgBouncer (transaction mode, a small pool) in front of ``pg_dsn``'s
    server, whose ``postgres`` database it names; any database of that server is reached
    by replacing the name. `.ci/test-all.sh` starts one and exports TEST_PGBOUNCER_DSN;
    run alone, the fixture starts its own. It never skips: without one the tests fail."""
    dsn = os.environ.get("TEST_PGBOUNCER_DSN")
    if dsn:
        yield dsn
        return
    server = urllib.parse.urlsplit(pg_dsn)
    started = subprocess.run(
        ["bash", str(ROOT / ".ci" / "pgbouncer-start.sh")], capture_output=True, text=True, check=False,
        env={**os.environ, "PGPORT": str(server.port), "PGHOST": server.hostname or "127.0.0.1"},
    )
    if started.returncode != 0:
        pytest.fail("no PgBouncer: install Debian's pgbouncer package or set TEST_PGBOUNCER_DSN")
    exports = dict(
        part.split("=", 1) for line in started.stdout.splitlines() for part in line.removeprefix("export ").split()
    )
    try:
        yield exports["TEST_PGBOUNCER_DSN"]
    finally:
        subprocess.run(["bash", str(ROOT / ".ci" / "pgbouncer-stop.sh")],
                       env={**os.environ, "PGBOUNCER_TMP": exports["PGBOUNCER_TMP"]}, check=False)


@pytest.fixture(params=adapter_support.AVAILABLE_DATABASES)
def database(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fresh_db_url(database: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> str:
    """The URL of an empty database of the parametrized kind (not migrated)."""
    import adapter_support

    return adapter_support.new_database(database, tmp_path, request)


@pytest.fixture
def db_url(database: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> str:
    """A freshly migrated database of the parametrized kind: a copy of one ``upgrade``
    migrated in this process (``adapter_support.migrated_database``). A test that also
    asks for ``fresh_db_url`` gets that very database, migrated by ``upgrade``."""
    import adapter_support

    if "fresh_db_url" in request.fixturenames:
        from tenure.adapters import upgrade

        fresh: str = request.getfixturevalue("fresh_db_url")
        adapter_support.run_async(upgrade(fresh))
        return fresh
    return adapter_support.migrated_database(database, tmp_path, request)


# --- In CI a skipped test is a failure: it would hide a missing dependency. ------------


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter is not None else 0
    if os.environ.get("CI") and skipped and exitstatus == 0:
        if reporter is not None:
            reporter.write_line(f"CI: {skipped} test(s) skipped; a skip hides what it was meant to test", red=True)
        session.exitstatus = 1


# --- The long tests start first on every worker (see long_tests.py). ------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import long_tests

    # In each pytest-xdist worker, where the collection the scheduler hands out is made
    # (every worker computes the same order, as xdist requires). A worker's own ``dist``
    # option reads "no": the scheduler's is on the main process's command line.
    worker_input = getattr(config, "workerinput", None)
    if worker_input is None or worker_input["workercount"] < 2:
        return
    argv = [str(argument) for argument in worker_input["mainargv"]]
    pairs = zip(argv, argv[1:] + [""])
    if any(argument == "--dist=worksteal" or (argument, after) == ("--dist", "worksteal") for argument, after in pairs):
        items[:] = long_tests.ordered(items, [item.nodeid for item in items], worker_input["workercount"])


# --- Stress mode: TENURE_TEST_STRESS=1 runs the tests beside a CPU burner per core. -----

_BURNERS: list[Any] = []


def pytest_configure(config: pytest.Config) -> None:
    import stress

    if stress.requested() and not hasattr(config, "workerinput"):  # the main process only
        _BURNERS.extend(stress.start())
        os.environ["TENURE_TEST_STRESS"] = "running"  # xdist's workers start none of their own


def pytest_unconfigure(config: pytest.Config) -> None:
    import stress

    stress.stop(_BURNERS)
    _BURNERS.clear()
