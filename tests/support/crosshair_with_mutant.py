"""Run CrossHair on the kernel contracts with one mutant from kernel_mutants.py applied.

    python tests/support/crosshair_with_mutant.py MUTANT check --analysis_kind=PEP316 ... TARGET

Used by test_contracts.py to show that the CrossHair gate can fail.
"""

from __future__ import annotations

import pathlib
import runpy
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import tenure.kernel  # noqa: E402,F401

import kernel_mutants  # noqa: E402

kernel_mutants.apply(sys.argv.pop(1))
launcher = pathlib.Path(__file__).resolve().parents[2] / ".ci" / "crosshair_kernel.py"
sys.argv[0] = str(launcher)
runpy.run_path(str(launcher), run_name="__main__")
