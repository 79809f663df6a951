"""Render the compiled deciders (tenure.kernel.compiled) into ``specs/compiled/``.

``specs/compiled/queue.py`` is checked in: the straight-line function tenure builds at
import for each hot queue command, as a reviewer reads it beside specs/queue.md and
specs/sql. A test (tests/kernel/test_compiled.py) renders it again and fails when the
file is stale; after changing the machine's declarations or the generator run::

    .venv/bin/python -P tests/support/compiled_renderings.py --write
"""

from __future__ import annotations

import pathlib
import sys

from tenure.kernel.compiled import render
from tenure.kernel.queue.machine import COMPILED_COMMANDS, QUEUE

COMPILED_DIR = pathlib.Path(__file__).resolve().parents[2] / "specs" / "compiled"

RERENDER = ".venv/bin/python -P tests/support/compiled_renderings.py --write"


def renderings() -> dict[str, str]:
    """Each rendered file's name and text."""
    return {
        "queue.py": render(QUEUE, COMPILED_COMMANDS, machine_import="from tenure.kernel.queue.machine import QUEUE as machine",
                           rerender=RERENDER),
    }


def stale() -> list[str]:
    """The rendered files whose checked-in text differs from a fresh rendering."""
    return sorted(name for name, text in renderings().items()
                  if not (COMPILED_DIR / name).is_file() or (COMPILED_DIR / name).read_text(encoding="utf-8") != text)


def write() -> None:
    COMPILED_DIR.mkdir(exist_ok=True)
    for name, text in renderings().items():
        (COMPILED_DIR / name).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        found = stale()
        print("stale: " + ", ".join(found) if found else "current")
        sys.exit(1 if found else 0)
