"""Public names a package re-exports without importing them at import time (PEP 562).

A machine's package (``tenure.adapters.runs``) names its facades for its users, but a
table module inside it must be importable without pulling the package's behaviour in:
the table registry imports every machine's table module, and an eager ``__init__``
would import ledgers, brokers and the registry itself back (an import circle). A package
therefore lists its exports as ``{name: module}`` and imports a module the first time one
of its names is asked for. The same names are imported under ``TYPE_CHECKING`` for type
checkers; ``tests/adapters/test_floor_plan.py`` holds the two lists equal.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """The module ``__getattr__`` of ``package``: ``exports`` maps each public name to the
    module (relative to ``package``) that defines it."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        globals_of_package = importlib.import_module(package).__dict__
        globals_of_package[name] = value  # later lookups skip this function
        return value

    return __getattr__
