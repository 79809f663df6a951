"""``tenure worker --processes N``: N worker processes from one command.

The supervisor runs the same ``tenure worker`` command line, without ``--processes``, in
N child processes (each a whole worker: its own connections, its own claims under its own
fences, its own scheduler of periodic ticks, whose deferrals are replay-safe). It prints a
line for each child it starts and each that ends; a child that ends while the supervisor
serves (killed, crashed, exited 1) is started again after a pause that doubles from
:data:`FIRST_RESTART_S` to :data:`MAX_RESTART_S` (back to the first once a child has run
:data:`STEADY_S`); a child that refuses its command line (exit 2) refuses every sibling's
too, so the supervisor stops them all and exits 2. SIGTERM or SIGINT is passed on to
every child as SIGTERM: each finishes what is in flight and gives the rest back, as a
single worker does; a child still running :data:`STOP_MARGIN_S` after its
``--grace-seconds`` is killed. The supervisor exits 0 when every child stopped cleanly
(0, or ended by that SIGTERM while still starting), else 1. Its lines never echo the command line (it may hold a URL).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence

__all__ = ["supervise", "child_command", "MAX_PROCESSES", "FIRST_RESTART_S", "MAX_RESTART_S", "STEADY_S",
           "STOP_MARGIN_S"]

MAX_PROCESSES = 64
FIRST_RESTART_S = 1.0
MAX_RESTART_S = 30.0
STEADY_S = 60.0
"""A child that ran this long before it ended is restarted after the first pause again."""
STOP_MARGIN_S = 30.0


def child_command(given: Sequence[str]) -> list[str]:
    """The worker command line of each child: ``given`` (the arguments after ``tenure``)
    without ``--processes`` and its value, run by this interpreter."""
    kept: list[str] = []
    skip = False
    for argument in given:
        if skip:
            skip = False
            continue
        if argument == "--processes":
            skip = True
            continue
        if argument.startswith("--processes="):
            continue
        kept.append(argument)
    return [sys.executable, "-m", "tenure.apps.cli", *kept]


def _ended(code: int | None) -> str:
    return f"signal {-code}" if code is not None and code < 0 else f"exit {code}"


async def supervise(command: Sequence[str], count: int, grace_s: float) -> int:
    """Run ``count`` children of ``command`` until SIGTERM or SIGINT (see the module
    docstring); the exit status."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    children: dict[int, asyncio.subprocess.Process] = {}
    refused = False

    async def keep(slot: int) -> None:
        nonlocal refused
        pause = FIRST_RESTART_S
        while not stop.is_set():
            started = loop.time()
            child = await asyncio.create_subprocess_exec(*command)
            children[slot] = child
            print(f"supervisor: worker process {slot} started (pid {child.pid})", flush=True)
            code = await child.wait()
            if stop.is_set():
                return
            if code == 2:
                print(f"supervisor: worker process {slot} refused its command line; stopping every process",
                      flush=True)
                refused = True
                stop.set()
                return
            if loop.time() - started >= STEADY_S:
                pause = FIRST_RESTART_S
            print(f"supervisor: worker process {slot} (pid {child.pid}) ended ({_ended(code)}); "
                  f"starting it again in {pause:g} s", flush=True)
            try:
                await asyncio.wait_for(stop.wait(), pause)
            except asyncio.TimeoutError:
                pass
            pause = min(pause * 2, MAX_RESTART_S)

    keepers = [asyncio.ensure_future(keep(slot)) for slot in range(1, count + 1)]
    try:
        await stop.wait()
        for child in children.values():
            if child.returncode is None:
                child.send_signal(signal.SIGTERM)
        codes = []
        for slot, child in sorted(children.items()):
            try:
                codes.append(await asyncio.wait_for(child.wait(), grace_s + STOP_MARGIN_S))
            except asyncio.TimeoutError:
                print(f"supervisor: worker process {slot} (pid {child.pid}) did not stop in time; killed", flush=True)
                child.kill()
                codes.append(await child.wait())
        await asyncio.gather(*keepers, return_exceptions=True)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    if refused:
        return 2
    print(f"supervisor: stopped {len(codes)} worker processes", flush=True)
    # A child stopped by the SIGTERM passed on before it installed its handler (still
    # starting) stopped cleanly too: it held no claim yet.
    return 0 if all(code in (0, -signal.SIGTERM) for code in codes) else 1
