"""Every ```python block of README.md and of the documentation pages runs as written.

Each block is a complete script. It is run as a file, by this environment's Python, in a
fresh empty folder (so a ``sqlite:///queue.db`` URL makes a new file there), and must
exit 0. A block that reads its database URL from ``TENURE_DB`` runs a second time with
``TENURE_DB`` naming a fresh PostgreSQL database. The pages are README.md and every
Markdown file under ``docs/``; blocks are found when the tests are collected, so a block
added to any of them is tested without touching this file.
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
