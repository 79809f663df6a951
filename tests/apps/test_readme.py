"""Every ```python block of README.md runs as written.

Each block is a complete script. It is run as a file, by this environment's Python, in a
fresh empty folder (so a ``sqlite:///queue.db`` URL makes a new file there), and must
exit 0. A block that reads its database URL from ``TENURE_DB`` runs a second time with
``TENURE_DB`` naming a fresh PostgreSQL database. Blocks are found when the tests are
collected, so a block added to the README is tested without touching this file.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

import adapter_support
import paths

README = paths.ROOT / "README.md"

PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)

MIN_BLOCKS = 3
"""The README has at least this many python blocks (so an extraction that finds none fails)."""

TIMEOUT_SECONDS = 120
"""A block that has not exited by then fails (an SQLite source left open never exits)."""


def python_blocks() -> list[tuple[int, str]]:
    """``(line of the opening fence, code)`` for every python block of the README."""
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in PYTHON_BLOCK.finditer(text)]


BLOCKS = python_blocks()


def _cases() -> Iterator[object]:
    for line, code in BLOCKS:
        yield pytest.param(code, "sqlite", id=f"line-{line}-sqlite")
        if "TENURE_DB" in code:
            yield pytest.param(code, "postgresql", id=f"line-{line}-postgresql")


def test_the_readme_has_at_least_three_python_examples() -> None:
    assert len(BLOCKS) >= MIN_BLOCKS, f"found {len(BLOCKS)} python blocks in README.md"
    assert all(code.strip() for _, code in BLOCKS)


def test_the_block_extraction_finds_every_fenced_python_block_and_nothing_else() -> None:
    text = "intro\n```python\nprint(1)\n```\n\n```bash\nls\n```\n```python\nx = 2\n\ny = 3\n```\n"
    found = [match.group(1) for match in PYTHON_BLOCK.finditer(text)]
    assert found == ["print(1)\n", "x = 2\n\ny = 3\n"]


@pytest.mark.parametrize(("code", "database"), list(_cases()))
def test_the_readme_example_runs_as_written(
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
