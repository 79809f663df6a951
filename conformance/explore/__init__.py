"""The bounded exhaustive explorer (:mod:`.engine`) and its models of the kernel's
machines in their surroundings (:mod:`.queue`, :mod:`.attempts`, :mod:`.runs`).

These modules are pure, as the kernel is: they import only :mod:`tenure.model`,
:mod:`tenure.kernel`, each other and the standard library, and read no clock
(``tests/adapters/core/test_layout.py`` holds it). The explorer is a consumer of the
kernel, not part of it, so it lives beside the other proofs. Its edge talks to
databases and to people and is not pure: :mod:`.replays` (a trace replayed against a
database) and ``__main__`` (``python -m tenure.conformance.explore``: explore the
standard bounds, print each world, write replay scripts)."""

__all__: list[str] = []
