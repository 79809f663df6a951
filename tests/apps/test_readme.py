"""Every ```python block of README.md and of the documentation pages runs as written, and
so do the README's own commands for its first task: ``python first_task.py``, then
``tenure worker --app first_task:app`` (which must import the same file and run what is
deferred, until SIGTERM).

Each block is a complete script. It is run as a file, by this environment's Python, in a
fresh empty folder (so a ``sqlite:///queue.db`` URL makes a new file there), and must
exit 0. A block that reads its database URL from ``TENURE_DB`` runs a second time with
``TENURE_DB`` naming a fresh PostgreSQL database. The pages are README.md and every
Markdown file under ``docs/``; blocks are found when the tests are collected, so a block
added to any of them is tested without touching this file.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

import adapter_support
import paths
from polling import until

README = paths.ROOT / "README.md"
DOCS = paths.ROOT / "docs"

PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)

MIN_README_BLOCKS = 2
"""The README has at least this many python blocks (a first task, a first workflow)."""

MIN_DOCS_BLOCKS = 8
"""The docs pages have at least this many (so an extraction that finds none fails)."""

TIMEOUT_SECONDS = 120
"""A block that has not exited by then fails (an SQLite source left open never exits)."""


def pages() -> list[pathlib.Path]:
    """README.md, then every page under docs/, in a stable order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def python_blocks(page: pathlib.Path) -> list[tuple[int, str]]:
    """``(line of the opening fence, code)`` for every python block of one page."""
    text = page.read_text(encoding="utf-8")
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in PYTHON_BLOCK.finditer(text)]


BLOCKS = {page: python_blocks(page) for page in pages()}


def _cases() -> Iterator[object]:
    for page, blocks in BLOCKS.items():
        name = page.relative_to(paths.ROOT).as_posix()
        for line, code in blocks:
            yield pytest.param(code, "sqlite", id=f"{name}:{line}-sqlite")
            if "TENURE_DB" in code:
                yield pytest.param(code, "postgresql", id=f"{name}:{line}-postgresql")


def test_the_readme_and_the_docs_pages_have_python_examples() -> None:
    readme_blocks = len(BLOCKS[README])
    docs_blocks = sum(len(blocks) for page, blocks in BLOCKS.items() if page != README)
    assert readme_blocks >= MIN_README_BLOCKS, f"found {readme_blocks} python blocks in README.md"
    assert docs_blocks >= MIN_DOCS_BLOCKS, f"found {docs_blocks} python blocks under docs/"
    assert all(code.strip() for blocks in BLOCKS.values() for _, code in blocks)


def test_the_docs_pages_are_found() -> None:
    found = {page.relative_to(DOCS).as_posix() for page in BLOCKS if page != README}
    assert {"index.md", "tasks.md", "workers.md", "workflows.md"} <= found, sorted(found)


def test_the_block_extraction_finds_every_fenced_python_block_and_nothing_else() -> None:
    text = "intro\n```python\nprint(1)\n```\n\n```bash\nls\n```\n```python\nx = 2\n\ny = 3\n```\n"
    found = [match.group(1) for match in PYTHON_BLOCK.finditer(text)]
    assert found == ["print(1)\n", "x = 2\n\ny = 3\n"]


@pytest.mark.parametrize(("code", "database"), list(_cases()))
def test_the_documented_example_runs_as_written(
    code: str, database: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    environment = {name: value for name, value in os.environ.items() if name != "TENURE_DB"}
    if database == "postgresql":
        environment["TENURE_DB"] = adapter_support.new_database("postgresql", tmp_path, request)
    folder = tmp_path / "example"
    folder.mkdir()
    (folder / "example.py").write_text(code, encoding="utf-8")
    try:
        done = subprocess.run(
            [sys.executable, "example.py"], cwd=folder, env=environment, capture_output=True, text=True,
            timeout=TIMEOUT_SECONDS, check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the example did not exit within {TIMEOUT_SECONDS} s (a source left open?)")
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stdout}\n{done.stderr}"


FIRST_TASK = next(code for _, code in BLOCKS[README] if "send_welcome" in code)
"""The README's first task, which it says to save as ``first_task.py``."""

TENURE = [sys.executable, "-P", "-m", "tenure.apps.cli"]
"""The ``tenure`` command of this environment."""


def _first_task_folder(database: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> tuple[
        pathlib.Path, dict[str, str], str]:
    environment = {name: value for name, value in os.environ.items() if name != "TENURE_DB"}
    db_url = f"sqlite:///{tmp_path}/example/queue.db"
    if database == "postgresql":
        db_url = environment["TENURE_DB"] = adapter_support.new_database("postgresql", tmp_path, request)
    folder = tmp_path / "example"
    folder.mkdir()
    (folder / "first_task.py").write_text(FIRST_TASK, encoding="utf-8")
    return folder, environment, db_url


@pytest.mark.parametrize("database", adapter_support.AVAILABLE_DATABASES)
async def test_the_readmes_worker_command_runs_the_readmes_first_task(
    database: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    from tenure.adapters import TaskApp

    folder, environment, db_url = _first_task_folder(database, tmp_path, request)

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(list(command), cwd=folder, env=environment, capture_output=True, text=True,
                                  timeout=TIMEOUT_SECONDS, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command[-1]} did not exit within {TIMEOUT_SECONDS} s")

    first = await asyncio.to_thread(run, sys.executable, "first_task.py")  # the README's first command
    assert first.returncode == 0 and first.stdout.startswith("completed "), first.stdout + first.stderr
    deferred = await asyncio.to_thread(run, *TENURE, "jobs", "defer", "--app", "first_task:app",
                                       "first_task.send_welcome", "--args", json.dumps({"user_id": 7}))
    assert deferred.returncode == 0, deferred.stdout + deferred.stderr
    job_id = deferred.stdout.splitlines()[1].split()[0]
    with open(folder / "worker.log", "w", encoding="utf-8") as log:
        worker = subprocess.Popen([*TENURE, "worker", "--app", "first_task:app", "--idle-wait", "0.2"], cwd=folder,
                                  env=environment, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        async with TaskApp(db_url) as app:
            async def done() -> bool:
                outcome = await app.result(job_id)
                return outcome is not None and outcome.done

            await until(done, TIMEOUT_SECONDS, what="the worker ran the deferred task",
                        interval_s=0.1)
            outcome = await app.result(job_id)
        assert outcome is not None and outcome.ok and outcome.result == {"sent_to": 7, "attempt": 1}, outcome
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(worker.wait, TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            worker.kill()
            pytest.fail(f"the worker did not stop within {TIMEOUT_SECONDS} s of SIGTERM")
    output = (folder / "worker.log").read_text(encoding="utf-8")
    assert worker.returncode == 0 and "stopped: claimed 1, completed 1" in output, output
