"""What a replay script ``tenure conform`` wrote runs: one recorded lockstep run, again.

The script names the machine, the Hypothesis version and the recorded choices
(Hypothesis's ``reproduce_failure`` encoding); :func:`main` makes a new scratch area in
the database ``--db`` (or ``TENURE_DB``) names, replays exactly those choices, prints the
command sequence and what failed, and removes the scratch area.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(machine_name: str, hypothesis_version: str, choices: bytes | None, argv: Sequence[str], *,
         rules: Sequence[str] | None = None) -> int:
    """Exit status: 1 the database departed from the kernel again, 0 it did not, 2 the
    replay cannot run here. ``rules``: the rules the machine ran with (None: all)."""
    import hypothesis
    from hypothesis import HealthCheck, settings
    from hypothesis.errors import DidNotReproduce
    from hypothesis.reporting import with_reporter
    from hypothesis.stateful import run_state_machine_as_test

    from tenure.conformance.lockstep.harness import machine_for
    from .runner import MACHINES, described
    from tenure.conformance.drivers.scratch import ScratchRefused, open_scratch

    parser = argparse.ArgumentParser(description="Replay a divergence tenure conform found.")
    parser.add_argument("--db", default=None, help="database URL (default: $TENURE_DB)")
    parser.add_argument("--scratch-schema", default=None, help="PostgreSQL: the scratch schema's name")
    arguments = parser.parse_args(list(argv))
    db_url = arguments.db or os.environ.get("TENURE_DB")
    if not db_url:
        print("replay refused: --db or TENURE_DB names the database", file=sys.stderr)
        return 2
    if choices is None:
        print("replay refused: the script recorded no choices to replay", file=sys.stderr)
        return 2
    if hypothesis.__version__ != hypothesis_version:
        print(f"replay refused: recorded with hypothesis {hypothesis_version}, this is {hypothesis.__version__}",
              file=sys.stderr)
        return 2
    from tenure.model import ConfigValidationError, TenureError

    try:
        area = asyncio.run(open_scratch(db_url, schema=arguments.scratch_schema))
    except ScratchRefused as refused:
        print(f"replay refused: {refused.reason}", file=sys.stderr)
        return 2
    except ConfigValidationError as error:  # a malformed URL, a pooler without its parameter
        print(f"replay refused: {', '.join(error.problems) or error.reason}", file=sys.stderr)
        return 2
    except TenureError as error:
        print(f"replay could not start: {error.reason}", file=sys.stderr)
        return 2
    spec = MACHINES[machine_name]
    machine = machine_for(spec.base, area, only=None if rules is None else frozenset(rules))
    # Hypothesis's @reproduce_failure, applied to the machine class as its documentation shows.
    hypothesis.reproduce_failure(hypothesis_version, choices)(machine)
    lines: list[object] = []
    try:
        with with_reporter(lines.append):
            run_state_machine_as_test(machine, settings=settings(
                stateful_step_count=spec.step_count, deadline=None, database=None,
                suppress_health_check=list(HealthCheck), print_blob=False,
            ))
    except DidNotReproduce:
        print(f"{machine_name}: the database did not depart from the kernel this time (exit 0)")
        return 0
    except Exception as error:  # noqa: BLE001 - the departure, reported below
        print("\n".join(map(str, lines)))
        print(f"{machine_name}: the database departed from the kernel again: {described(error)} (exit 1)")
        return 1
    finally:
        asyncio.run(area.drop())
    print(f"{machine_name}: the database did not depart from the kernel this time (exit 0)")
    return 0
