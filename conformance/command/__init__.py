"""``tenure conform`` and the pytest plugin: :mod:`.conform` (the command: arguments,
the scratch area, the facts, the tables), :mod:`.runner` (a lockstep machine run to a
budget; a divergence and its replay script), :mod:`.replay` (what a replay script runs)
and :mod:`.plugin` (``pytest --tenure-conform=URL``).

``add_conform_parser`` and ``run_conform`` (what ``tenure``'s command line calls) are
exported lazily: importing this package imports nothing of tenure, because the pytest
plugin (:mod:`.plugin`) lives here and pytest loads it in every run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .conform import add_conform_parser, run_conform

__all__ = ["add_conform_parser", "run_conform"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import conform

        return getattr(conform, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
