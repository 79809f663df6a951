"""Which stored delegated jobs the agent job commands meet, as data (see
:mod:`tenure.kernel.core`). The jobs of one Run (open, or every one) are the Run's
lookups (:mod:`tenure.kernel.runs.finders`)."""

from __future__ import annotations

from ..core import Condition, Finder, Param

__all__ = ["jobs_by_keys"]

jobs_by_keys = Finder("jobs_by_keys", ((Condition("job_id", "in", Param("keys")),),), order=("job_id",), lock="wait")
"""The jobs a command names, locked (every job command decides on the locked row)."""
