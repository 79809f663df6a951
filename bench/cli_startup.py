"""How long ``tenure --version``, ``tenure --help`` and a subcommand's ``--help`` take, as
whole processes (issue 31's target: <= 0.3 s for the first two).

    python bench/cli_startup.py [ROUNDS]        # default 15 rounds, run by this Python

Each command is run ROUNDS times in turn (interleaved, so a busy moment hits each alike);
the report gives the minimum, median and maximum wall time per command, plus a bare
``python -c pass`` as the floor every process pays. Nothing is asserted: it prints.
"""

from __future__ import annotations

import pathlib
import statistics
import subprocess
import sys
import time

TENURE = str(pathlib.Path(sys.executable).parent / "tenure")  # the installed console script

COMMANDS = {
    "python -c pass (floor)": [sys.executable, "-c", "pass"],
    "tenure --version": [TENURE, "--version"],
    "tenure --help": [TENURE, "--help"],
    "tenure worker --help": [TENURE, "worker", "--help"],
}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(rounds):
        for name, command in COMMANDS.items():
            started = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd="/")
            times[name].append(time.perf_counter() - started)
    print(f"| command | min s | median s | max s |  ({rounds} rounds)")
    print("|---|---|---|---|")
    for name, seen in times.items():
        print(f"| {name} | {min(seen):.3f} | {statistics.median(seen):.3f} | {max(seen):.3f} |")


if __name__ == "__main__":
    main()
