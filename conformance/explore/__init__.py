"""The bounded exhaustive explorer (:mod:`.engine`) and its models of the kernel's
machines in their surroundings (:mod:`.queue`, :mod:`.attempts`, :mod:`.runs`)."""

__all__: list[str] = []
