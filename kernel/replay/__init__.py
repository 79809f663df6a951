"""Workflow replay: what a replayed workflow call at one journal position does, as a table.

``table`` (the situation, the cases, the rules and the verdict rules REPLAY-1 ... REPLAY-5
in ``specs/replay.md``). The workflow context observes, this decides, the context acts.
"""

from __future__ import annotations

from .table import NOTHING, Action, Case, Held, Parked, Situation, Verdict, case_of, decide, verdict_violations

__all__ = ["NOTHING", "Action", "Case", "Held", "Parked", "Situation", "Verdict", "case_of", "decide",
           "verdict_violations"]
