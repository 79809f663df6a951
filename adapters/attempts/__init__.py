"""Service job attempts' adapters: the attempts table, the ledger that persists the
kernel's decisions, and the runner that drives a provider through the machine."""

__all__: list[str] = []
