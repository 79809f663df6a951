"""pytest plugin: ``pytest --tenure-conform=URL`` (filled in below)."""

from __future__ import annotations

from typing import Any

__all__ = ["pytest_addoption"]


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("tenure", "tenure conformance")
    group.addoption("--tenure-conform", metavar="URL", default=None)
