"""Shared test setup: Hypothesis profiles and the kernel-mutant switch.

``TENURE_KERNEL_MUTANT=<name>`` applies one deliberately broken kernel from
``kernel_mutants.py`` before any test runs; ``test_mutants.py`` uses it to prove that
the suite fails for every mutant. It is never set in a normal run.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    parent=settings.get_profile("default"),
    derandomize=True,
    database=None,
    print_blob=True,
)
settings.load_profile("ci" if os.environ.get("CI") else "default")

_mutant = os.environ.get("TENURE_KERNEL_MUTANT")
if _mutant:
    import kernel_mutants

    kernel_mutants.apply(_mutant)
