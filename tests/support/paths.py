"""Where things are, for tests in any folder: the repository root, the tests and their
support folder (helpers, subprocess scripts, data)."""

from __future__ import annotations

import pathlib

SUPPORT = pathlib.Path(__file__).resolve().parent
TESTS = SUPPORT.parent
ROOT = TESTS.parent
