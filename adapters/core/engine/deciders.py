"""Which deciders the decided-ahead path decides with: the machine's compiled deciders
(:func:`tenure.kernel.compiled.decider_of`, proven equal to the generic interpreter by
tests/kernel/test_compiled.py), or the generic interpreter itself (the reference, when
``Engine.compiled`` is off): the decision read from the machine's declared time guards
(:func:`~tenure.kernel.ahead.decide_windowed`), else from its comparisons instrumented
(:func:`~tenure.kernel.ahead.decide_ahead`)."""

from __future__ import annotations

from typing import Any

from tenure.kernel.ahead import Ahead, decide_ahead, decide_windowed
from tenure.kernel.compiled import decider_of
from tenure.kernel.core import Machine

__all__ = ["decided_ahead"]


def decided_ahead(machine: Machine, record: Any, command: Any, reference_us: int, *, compiled: bool) -> Ahead | None:
    """The kernel's decision made ahead at ``reference_us``, with its window: by the
    command's compiled decider where the machine declares one and ``compiled`` is on,
    else by the generic interpreter; the instrumented one covers whatever the first
    cannot make ahead. None: it cannot be made ahead."""
    decider = decider_of(machine, command.kind) if compiled else None
    if decider is not None:
        return decider(record, command, reference_us) or decide_ahead(machine, record, command, reference_us)
    return decide_windowed(machine, record, command, reference_us) or decide_ahead(
        machine, record, command, reference_us)
