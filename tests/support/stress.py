"""The suite's stress mode: a CPU burner on every core beside the tests.

``TENURE_TEST_STRESS=1`` makes the machine about three times slower for the tests (two
burners and the suite's own processes share two cores): a test that depends on a lease, a
sleep or a deadline a slow machine misses fails there instead of on a user's busy CI.
``bash .ci/test-all.sh`` starts the burners itself, for the whole run (its background
steps included), and tells pytest so (``TENURE_TEST_STRESS=running``); ``pytest`` run
directly with ``TENURE_TEST_STRESS=1`` starts them for its own session (see conftest.py).

Each burner is a process of its own at normal priority, spinning until it is stopped (or
its parent's session ends: it watches the parent's process ID and stops when it changes).

    python tests/support/stress.py [COUNT]    # COUNT burners (default: one per core) until killed
"""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["BURNER", "requested", "start", "stop"]

BURNER = (
    "import os, sys\n"
    "parent = int(sys.argv[1])\n"
    "while os.getppid() == parent:\n"
    "    for _ in range(1_000_000):\n"
    "        pass\n"
)
"""Busy work until its parent is gone (checked a few times a second)."""


def requested() -> bool:
    """Whether this pytest session must start the burners itself."""
    return os.environ.get("TENURE_TEST_STRESS", "") == "1"


def start(count: int | None = None) -> list[subprocess.Popen[bytes]]:
    """One burner per core (or ``count``)."""
    return [subprocess.Popen([sys.executable, "-c", BURNER, str(os.getpid())])
            for _ in range(count if count is not None else os.cpu_count() or 1)]


def stop(burners: list[subprocess.Popen[bytes]]) -> None:
    for burner in burners:
        burner.kill()
    for burner in burners:
        burner.wait()


if __name__ == "__main__":
    running = start(int(sys.argv[1]) if len(sys.argv) > 1 else None)
    try:
        for burner in running:
            burner.wait()
    finally:
        stop(running)
