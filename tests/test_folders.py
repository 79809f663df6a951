"""The test folders mirror the source (docs/testing.md, "Where the tests live").

Every folder under ``tests/`` is ``tests/<floor>/<folder>...`` for a package folder of the
source tree (``adapters/queue/`` is tested in ``tests/adapters/queue/``, ``tenure.model``
in ``tests/model/``), or one of the suite's own folders, :data:`SUITE_FOLDERS`. A reader
who looks for the tests of a module finds them where its folder says; a new folder that
mirrors nothing fails here.
"""

from __future__ import annotations

import pathlib

import paths

FLOORS = ("model", "kernel", "adapters", "conformance", "apps")
"""The package's top-level folders (``tenure.<floor>``)."""

SUITE_FOLDERS = {
    "support": "helpers, subprocess scripts and data, importable from every folder (pyproject's pythonpath)",
    "processes": "tenure run in processes of its own, killed, frozen and restarted: each test crosses every floor",
}
"""Folders of the suite itself, which mirror no source folder (with everything under them)."""


def unmirrored(tests: pathlib.Path, root: pathlib.Path) -> list[str]:
    """The folders under ``tests`` that mirror no package folder under ``root`` and are
    not one of :data:`SUITE_FOLDERS` (caches, ``__pycache__`` and dot folders, are not
    the suite's)."""
    found = []
    for folder in sorted(path for path in tests.rglob("*") if path.is_dir()):
        parts = folder.relative_to(tests).parts
        if any(part.startswith((".", "__")) for part in parts) or parts[0] in SUITE_FOLDERS:
            continue
        if parts[0] not in FLOORS or not root.joinpath(*parts, "__init__.py").is_file():
            found.append("/".join(parts))
    return found


def test_every_test_folder_mirrors_a_source_folder_or_is_the_suites_own() -> None:
    assert unmirrored(paths.TESTS, paths.ROOT) == []


def test_the_floors_and_their_machines_have_test_folders() -> None:
    for floor in FLOORS:
        assert (paths.TESTS / floor).is_dir(), floor
    for machine in ("agent_jobs", "attempts", "consents", "nodes", "queue", "runs"):
        assert (paths.TESTS / "adapters" / machine).is_dir(), machine


def test_the_mirror_check_sees_a_folder_that_mirrors_nothing(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "repo"
    for package in ("model", "adapters", "adapters/queue"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "adapters" / "templates").mkdir()  # a folder of the source, but no package
    tests = root / "tests"
    for folder in ("model", "adapters/queue", "adapters/worker", "adapters/templates", "console",
                   "support/data", "processes", "adapters/queue/__pycache__"):
        (tests / folder).mkdir(parents=True)
    assert unmirrored(tests, root) == ["adapters/templates", "adapters/worker", "console"]
