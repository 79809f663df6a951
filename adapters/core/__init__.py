"""The persistence core every machine's adapter stands on: table descriptions
(``tables``), the SQL compiled from them and from kernel finders (``sql``), the store
protocols (``store``), the backend protocol (``backend``), the engine loop
(``engine``), persistence failures (``failures``), database URLs (``urls``), what a
database contributes to migrations and what a migration reports (``catalog``,
``migration_report``, ``schema``), the facade shell (``facade``) and the hooks a worker
tells an observer of metrics and traces (``observers``, protocols only).

The ground floor: it imports nothing else of ``tenure.adapters`` (no machine, no
database, no wiring) and no machine of the kernel (``tests/adapters/core/test_floor_plan.py``)."""

__all__: list[str] = []
