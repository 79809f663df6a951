"""Hypothesis strategies for every machine's records, commands and database times: the
situations the kernel properties, the spec-table checks and the lockstep runs draw."""

__all__: list[str] = []
