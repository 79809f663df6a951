"""Conformance: tenure's proof as a product, run on tenure's own test servers and on a
user's own database (``tenure conform``, the pytest plugin ``pytest --tenure-conform``).

It lives in rooms, one job each:

- :mod:`tenure.conformance.strategies`: generated records and commands of every kernel
  machine (Hypothesis strategies over kernel values), for the driver proofs and for
  tenure's own kernel tests.
- :mod:`tenure.conformance.lockstep`: the kernel and a database in lockstep: the harness
  (example databases, the loop, the clock, the budget), the raw SQL that plays the
  adversary and the clock, and per machine a ``RuleBasedStateMachine`` with its
  kernel-backed model.
- :mod:`tenure.conformance.drivers`: what the server and the store primitives must do
  (the server facts, the store primitives' suite), and the scratch area every proof on a
  user's database works in.
- :mod:`tenure.conformance.explore`: the bounded exhaustive explorer and its worlds,
  pure (the kernel, the model and the standard library only, as the kernel itself); its
  edge, which talks to databases and to people: the replays of its traces against a
  database (:mod:`tenure.conformance.explore.replays`) and its command line
  (``python -m tenure.conformance.explore``, ``explore/__main__.py``).
- :mod:`tenure.conformance.command`: ``tenure conform`` (its runner, its replay scripts)
  and the pytest plugin.

Which room may import which (``tests/adapters/core/test_floor_plan.py`` holds the rule;
a room imports its own modules freely)::

    strategies            -> nothing of conformance
    lockstep              -> nothing of conformance
    drivers               -> lockstep, strategies
    explore               -> nothing of conformance (and nothing but tenure.model,
                             tenure.kernel and the standard library: tests/adapters/core/test_layout.py)
    explore.replays       -> explore, lockstep, drivers
    explore.__main__      -> explore, explore.replays
    command               -> strategies, lockstep, drivers

No room imports the command, and this package's ``__init__`` imports nothing (the
pytest plugin is loaded in every pytest run of an environment that has tenure). No
module uses another module's private names (``_name``), in conformance or in the
adapters: what a proof needs of an adapter beyond its public API is the adapters'
documented test seam (``docs/testing.md``, "The adapters' test seam").
"""

__all__: list[str] = []
