"""Run recovery: what startup reconciliation and the relays decide for one Run, as a table.

``table`` (the situation, the cases, the rules and the verdict rules REC-1 ... REC-8 in
``specs/recovery.md``). The ledger observes, this decides, the Run machine fences.
"""

from __future__ import annotations

from .table import Action, Case, Pass, Probe, Reason, Situation, Verdict, case_of, decide, verdict_violations

__all__ = ["Action", "Case", "Pass", "Probe", "Reason", "Situation", "Verdict", "case_of", "decide",
           "verdict_violations"]
