"""Run the bounded exhaustive explorer (:mod:`tenure.conformance.explore`) and report it.

    python -m tenure.conformance.explore [--machines queue,attempts,runs] [--soak] [--json] [--replay-dir DIR]

For each configuration of the chosen machines (their ``STANDARD`` bounds, or ``SOAK``
with ``--soak``), explores every interleaving up to its depth and prints one line: the
model, the depth reached of the bound, distinct states, transitions, whether the bound
exhausted the world, and the seconds taken. A property broken prints its shortest trace
as a table (action, actor, state after). Exit status 0 when every property held, 1 when
one broke, 2 on bad arguments.

The explorer itself is pure (it lives in the kernel and reads no clock); this module is
the shell that times it and prints.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from tenure.conformance.explore.engine import Exploration, Violation, explore, trace_table

__all__ = ["MACHINES", "configurations", "run", "main"]

MACHINES = ("queue", "attempts", "runs")


def configurations(machine: str, *, soak: bool = False) -> list[tuple[Any, int]]:
    """The (model, depth) pairs of ``machine``'s standard (or soak) bounds."""
    module = importlib.import_module(f"tenure.conformance.explore.{machine}")
    return list(module.SOAK if soak else module.STANDARD)


def run(model: Any, depth: int) -> tuple[Exploration[Any], float]:
    started = time.perf_counter()
    exploration = explore(model, max_depth=depth)
    return exploration, time.perf_counter() - started


def _queue_replay(model: Any, violation: Violation[Any], table: str) -> str:
    from .replays.queue import replay_script

    return replay_script(model.kinds, violation.initial, violation.trace, table)


def _attempts_replay(model: Any, violation: Violation[Any], table: str) -> str:
    from .replays.attempts import replay_script

    return replay_script(violation.initial, violation.trace, table)


def _runs_replay(model: Any, violation: Violation[Any], table: str) -> str:
    from .replays.runs import replay_script

    return replay_script(model, violation.initial, violation.trace, table)


_REPLAYS: dict[str, Callable[[Any, Violation[Any], str], str]] = {
    "queue": _queue_replay,
    "attempts": _attempts_replay,
    "runs": _runs_replay,
}
"""The machines whose broken world ``--replay-dir`` writes as a replay script against a
database: (model, violation, its trace table) -> the script's text. Imported when
used: the explorer itself needs no database adapter."""


def _line(exploration: Exploration[Any], seconds: float) -> str:
    reach = "exhausted" if exploration.exhausted else "bounded"
    verdict = "ok" if exploration.violation is None else f"BROKEN: {exploration.violation.property.name}"
    return (f"{exploration.model}: depth {exploration.depth}/{exploration.max_depth} ({reach}), "
            f"{exploration.states:,} states, {exploration.transitions:,} transitions, {seconds:.1f} s: {verdict}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tenure.conformance.explore",
                                     description="Explore every interleaving of the kernel's machines to a bound.")
    parser.add_argument("--machines", default=",".join(MACHINES), help=f"comma-separated: {', '.join(MACHINES)}")
    parser.add_argument("--soak", action="store_true", help="the larger soak bounds instead of the standard ones")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    parser.add_argument("--replay-dir", default=None,
                        help="write a broken world's shortest trace (queue, attempts, runs) as a replay script against a "
                             "database (tenure-explore-replay-<machine>.py: the last broken world of each machine) "
                             "into this folder")
    arguments = parser.parse_args(argv)
    machines = [name.strip() for name in arguments.machines.split(",") if name.strip()]
    if not machines or any(name not in MACHINES for name in machines):
        print(f"refused: --machines takes {', '.join(MACHINES)}", file=sys.stderr)
        return 2
    broken = False
    report: list[dict[str, Any]] = []
    for machine in machines:
        for model, depth in configurations(machine, soak=arguments.soak):
            exploration, seconds = run(model, depth)
            broken = broken or exploration.violation is not None
            report.append({
                "machine": machine, "model": exploration.model, "depth": exploration.depth,
                "max_depth": exploration.max_depth, "states": exploration.states,
                "transitions": exploration.transitions, "exhausted": exploration.exhausted,
                "seconds": round(seconds, 1),
                "violation": None if exploration.violation is None else {
                    "property": exploration.violation.property.name, "spec": exploration.violation.property.spec,
                    "message": exploration.violation.message, "trace_length": len(exploration.violation.trace)},
            })
            if not arguments.json:
                print(_line(exploration, seconds), flush=True)
                if exploration.violation is not None:
                    print(trace_table(exploration.violation, model.describe), flush=True)
            if exploration.violation is not None and machine in _REPLAYS and arguments.replay_dir is not None:
                violation = exploration.violation
                path = pathlib.Path(arguments.replay_dir) / f"tenure-explore-replay-{machine}.py"
                path.write_text(_REPLAYS[machine](model, violation, trace_table(violation, model.describe)))
                print(f"replay against a database: python {path} --db URL", flush=True)
    if arguments.json:
        print(json.dumps({"ok": not broken, "explorations": report}, indent=2))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
