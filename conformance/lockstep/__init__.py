"""The kernel and a database in lockstep: the shared harness (:mod:`.harness`), the raw
SQL that plays the adversary and the clock (:mod:`.raw`), and one Hypothesis
``RuleBasedStateMachine`` per kernel machine with its kernel-backed model (:mod:`.queue`
and :mod:`.queue_model`, :mod:`.attempts`, :mod:`.runs`). Imports no other room of
:mod:`tenure.conformance`."""

__all__: list[str] = []
