"""Run ``crosshair check`` with one workaround for implicit namespace packages.

CrossHair (0.0.113) reads option directives from every parent package's
``__init__.py`` through ``importlib.resources``; for the implicit namespace package
``tenure`` that raises NotADirectoryError and aborts the analysis of any function that
calls a contracted function in another module. ``tenure`` has no ``__init__.py`` and so
no directives: this launcher records that answer in CrossHair's memo before it runs.
Usage: python .ci/crosshair_kernel.py check --analysis_kind=PEP316 ... <paths>
"""

from __future__ import annotations

import sys

import tenure.kernel  # noqa: F401  (imports the namespace package `tenure`)
from crosshair import codeconfig
from crosshair.main import main
from crosshair.options import AnalysisOptionSet

memo = next(
    cell.cell_contents
    for cell in codeconfig.collect_options.__closure__ or ()
    if isinstance(cell.cell_contents, dict)
)
memo[sys.modules["tenure"]] = AnalysisOptionSet()
sys.exit(main())
