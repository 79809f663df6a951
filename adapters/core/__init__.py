"""The persistence core every machine's adapter stands on: table descriptions
(``tables``), the SQL compiled from them and from kernel finders (``sql``), the store
protocols (``store``), the engine loop (``engine``), persistence failures
(``failures``), database URLs (``urls``), the backend registry (``dialects``), the
schema and its migrations (``schema``, ``migrations``, ``migration_report``), the
registry of every machine's tables (``registry``) and the hooks a worker tells an
observer of metrics and traces (``observers``, protocols only).

Nothing here imports a machine's behaviour: only ``registry`` imports the machines'
table modules, and those import only this package."""

__all__: list[str] = []
