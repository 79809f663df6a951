"""The wiring room: what knows every machine and every backend (``specs/README.md``,
"Where things live"). The registry of machines' tables (``registry``), the database map
(``dialects``: which backend a URL selects) and the migration runner with its steps
(``migrations``: ``upgrade`` and ``downgrade``).

Below it, only a facade that opens a database URL imports it, and only its database
map; the applications and ``tenure.adapters``' lazy exports import the rest."""

__all__: list[str] = []
