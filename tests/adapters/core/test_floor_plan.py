"""The floor plan of the package (``specs/README.md``, "Where things live"), held by tests.

Read from the source as text (``ast``), so a rule breaks here before any behaviour does:

- the floors, bottom up: ``model/``, ``kernel/``, ``adapters/``, ``conformance/``,
  ``apps/``. A floor imports only the floors :data:`FLOOR_IMPORTS` names: nothing below
  ``tenure.apps`` imports it, the adapters never import ``tenure.conformance``, and the
  only import of conformance from above is ``tenure.apps.cli``'s of its command room
  (``tenure conform``). Every import counts here, ``if TYPE_CHECKING:`` ones included (a
  type-only import of a floor above is still a floor that knows the one above it), and
  so do the modules a package's lazy exports and ``importlib.import_module`` name;
- no import circle inside ``tenure.adapters``, ``tenure.conformance`` or ``tenure.apps``: every
  import a module runs, at its top or inside a function, counts (a function-level import
  is a circle deferred, not removed). Importing ``a.b.c`` runs the packages ``a.b`` too,
  so those count as well;
- no circle inside ``tenure.adapters`` for the type checker either: ``if TYPE_CHECKING:``
  imports count, and a name taken from a package's lazy exports counts as the module
  that defines it;
- one rule per floor (``specs/README.md``): the core imports nothing else of the adapters
  and no machine of the kernel; a backend imports only the core; a machine's folder
  imports the core, the wiring's database map and the machines :data:`MACHINE_IMPORTS`
  allows (a table that forms no circle); the wiring imports anything but the
  applications; below the applications only the package face and facades opening a URL
  (the database map) import the wiring;
- the table modules import only the persistence core, and the table registry imports
  only the core, reading each registered machine's table module by name (so the schema
  knows every machine without knowing its behaviour);
- nowhere in the package (``model/``, ``kernel/``, ``adapters/``, ``conformance/``, ``apps/``) does
  a module touch another module's private names (``_name``): a leading underscore tells
  a reader that only its own module uses it, so a refactor of an adapter's privates
  cannot break ``tenure conform`` unseen. What a proof needs of an adapter beyond its
  public API is the adapters' test seam, public and documented (``docs/testing.md``);
- conformance's rooms import only the rooms the plan allows (:data:`ROOM_IMPORTS`, the
  table ``tenure.conformance``'s docstring shows);
- a package's lazy exports (``core/lazy.py``) name the modules its ``TYPE_CHECKING``
  imports name, so type checkers and the running code see the same names;
- outside an allow-list, ``adapters/`` compares no state enum: which state allows what
  is the kernel's to say (the rule h11 keeps for its own state machine).
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

import paths

import tenure.kernel

ROOT = paths.ROOT
ADAPTERS = ROOT / "adapters"
CONFORMANCE = ROOT / "conformance"
APPS = ROOT / "apps"
PACKAGE = "tenure.adapters"
FLOORS = ("model", "kernel", "adapters", "conformance", "apps")
"""The package's top-level folders, bottom up (``tenure.<folder>``)."""
PACKAGE_FOLDERS = [ROOT / folder for folder in FLOORS]
"""Every folder of the installed package (the private-name rule covers them all)."""


def _module_name(path: pathlib.Path) -> tuple[str, bool]:
    parts = path.relative_to(ROOT).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return "tenure." + ".".join(parts), is_package


def _modules_of(folder: pathlib.Path) -> dict[str, tuple[pathlib.Path, bool]]:
    return {_module_name(path)[0]: (path, _module_name(path)[1]) for path in sorted(folder.rglob("*.py"))}


MODULES = _modules_of(ADAPTERS)
CONFORMANCE_MODULES = _modules_of(CONFORMANCE)
APPS_MODULES = _modules_of(APPS)


def _runtime_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: at any depth, except under ``if TYPE_CHECKING``."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


def _absolute(module: str, is_package: bool, node: ast.Import | ast.ImportFrom,
              known: dict[str, tuple[pathlib.Path, bool]] = MODULES) -> list[str]:
    """The modules an import statement names (a name imported from a package may be a
    module of ``known``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]


def _import_graph(modules: dict[str, tuple[pathlib.Path, bool]] = MODULES) -> dict[str, set[str]]:
    """Which of ``modules`` each of them runs when imported."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _absolute(name, is_package, node, modules):
                parts = target.split(".")
                for end in range(2, len(parts) + 1):  # importing a.b.c runs a.b's __init__ too
                    ran = ".".join(parts[:end])
                    if ran in modules and ran != name and not name.startswith(ran + "."):
                        graph[name].add(ran)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_inside_the_adapters() -> None:
    assert _cycles(_import_graph()) == []


def _faces(modules: dict[str, tuple[pathlib.Path, bool]]) -> dict[str, dict[str, str]]:
    """Each package face (an ``__init__`` with lazy exports) and the module, absolute,
    that defines each name it hands on."""
    faces = {}
    for name, (path, is_package) in modules.items():
        mapping = _lazy_map(ast.parse(path.read_text(encoding="utf-8"))) if is_package else None
        if mapping is not None:
            faces[name] = {exported: name + where for exported, where in mapping.items()}
    return faces


def _type_graph(modules: dict[str, tuple[pathlib.Path, bool]] = MODULES) -> dict[str, set[str]]:
    """Which of ``modules`` each of them needs, for running or for type checking: every
    edge of :func:`_import_graph`, plus every import under ``if TYPE_CHECKING:``, with a
    name taken from a package face (lazy exports) counted as the module that defines it
    (the face only hands it on: its own ``TYPE_CHECKING`` list is not an edge, and the
    lazy-exports test holds it equal to what runs)."""
    graph = _import_graph(modules)
    if f"{WIRING}.registry" in graph:  # it imports each table module by name
        graph[f"{WIRING}.registry"] |= TABLE_MODULES & set(modules)
    faces = _faces(modules)
    for name, (path, is_package) in modules.items():
        if name in faces:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets = _absolute(name, is_package, node, modules)
            if isinstance(node, ast.ImportFrom):
                targets = [faces[target].get(alias.name, target) if target in faces else target
                           for target, alias in zip(targets, node.names, strict=True)]
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


def test_no_import_circle_inside_the_adapters_at_type_level() -> None:
    # An import under TYPE_CHECKING ties two modules as surely as one that runs: the
    # type checker (and the reader) needs both to understand either.
    assert _cycles(_type_graph()) == []


def test_the_type_level_graph_sees_a_circle_through_type_checking_and_a_face(tmp_path: pathlib.Path) -> None:
    package = tmp_path / "adapters"
    (package / "runs").mkdir(parents=True)
    (package / "core").mkdir()
    (package / "core" / "__init__.py").write_text("")
    (package / "core" / "observers.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..runs import RunLedger\n")
    (package / "runs" / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\n\nfrom ..core.lazy import lazy_exports\n\n"
        "if TYPE_CHECKING:\n    from .ledger import RunLedger\n\n"
        "__getattr__ = lazy_exports(__name__, {\"RunLedger\": \".ledger\"})\n")
    (package / "runs" / "ledger.py").write_text("from ..core.observers import LedgerObserver\n")
    modules = {"tenure." + ".".join(path.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"):
               (path, path.name == "__init__.py") for path in sorted(package.rglob("*.py"))}
    assert _cycles(_import_graph(modules)) == []
    assert _cycles(_type_graph(modules)) == [["tenure.adapters.core.observers", "tenure.adapters.runs.ledger"]]


# --- floors: one rule per floor -----------------------------------------------------------------

CORE = f"{PACKAGE}.core"
BACKENDS = (f"{PACKAGE}.sqlite", f"{PACKAGE}.postgres")
WIRING = f"{PACKAGE}.wiring"
DATABASE_MAP = f"{WIRING}.dialects"
APPLICATIONS = (f"{PACKAGE}.apps", f"{PACKAGE}.console", f"{PACKAGE}.alembic")
"""The applications on top of the adapters (moving to ``tenure.apps``): they may import
anything of the adapters, and nothing of the adapters imports them."""

FRONT_DOOR_MIGRATES = {(f"{PACKAGE}.app.front", f"{PACKAGE}.wiring.migrations")}
"""The one import of the migration runner below the applications and the package face:
the front door's ``App.launch(migrate=True)``, where a newcomer's first program begins
(``tenure worker`` and every facade leave migrating to ``tenure migrate``)."""

MACHINE_IMPORTS: dict[str, set[str]] = {
    "queue": set(),
    "attempts": {"runs.table"},
    "consents": {"runs.table"},
    "agent_jobs": {"runs.table"},
    "nodes": set(),
    "runs": {"queue", "attempts", "consents", "agent_jobs", "nodes", "messages"},
    "tasks": {"queue"},
    "app": {"tasks", "runs", "queue"},
    "messages": {"runs.table"},
}
"""What each machine folder of ``adapters/`` may import beside the core and the wiring's
database map (a facade opens its URL there): other machines' folders, or only one
table module of one (``runs.table``: the owners a Run waits for lock their Run's row
and ask the kernel whether it still opens owners; the Run's table is a declaration
beneath every facade). The machines' facades form no circle: the Run ledger stands on
the queue (its hops), the attempts, consents, delegated jobs, node leases and messages;
the general tasks stand on the queue."""


def _folder(module: str) -> str:
    """The folder of ``adapters/`` a module lives in (``tenure.adapters`` for the package's own)."""
    parts = module.split(".")
    return ".".join(parts[:3]) if len(parts) > 2 else module


def _floor_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Every import that breaks the plan's rule for the floor its module stands on."""
    breaches = []
    for module, targets in sorted(graph.items()):
        folder = _folder(module)
        for target in sorted(targets):
            there = _folder(target)
            if there == folder or there == CORE or (folder == PACKAGE and target == f"{CORE}.lazy"):
                continue
            if folder == CORE:
                allowed = False  # the core knows no machine, no database, no wiring and no application
            elif folder in BACKENDS:
                allowed = False  # a backend knows the core only
            elif folder.removeprefix(PACKAGE + ".") in MACHINE_IMPORTS:
                uses = MACHINE_IMPORTS[folder.removeprefix(PACKAGE + ".")]
                # (importing runs.table runs the package tenure.adapters.runs, a face that imports nothing)
                allowed = target in (WIRING, DATABASE_MAP) or (module, target) in FRONT_DOOR_MIGRATES or any(
                    target == f"{PACKAGE}.{use}" or target.startswith(f"{PACKAGE}.{use}.")
                    or f"{PACKAGE}.{use}".startswith(target + ".") for use in uses)
            elif folder == WIRING:
                allowed = not target.startswith(APPLICATIONS)  # the wiring knows every machine and backend
            elif folder == PACKAGE:
                allowed = target.startswith(WIRING) or _folder(target).removeprefix(PACKAGE + ".") in MACHINE_IMPORTS
            else:
                allowed = folder.startswith(APPLICATIONS)
            if not allowed:
                breaches.append(f"{module} imports {target}")
    return breaches


def _kernel_machines_named(path: pathlib.Path) -> set[str]:
    """The kernel's machine folders a module imports (``tenure.kernel.queue...``)."""
    machines = {folder.name for folder in (ROOT / "kernel").iterdir() if (folder / "__init__.py").exists()}
    named = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["tenure", "kernel"] and len(parts) > 2 and parts[2] in machines:
                named.add(name)
    return named


def test_every_module_of_the_adapters_keeps_its_floors_rule() -> None:
    assert _floor_breaches(_type_graph()) == []


def test_the_core_and_the_backends_know_no_machine_of_the_kernel_either() -> None:
    found = {
        name: machines for name, (path, _) in MODULES.items()
        if _folder(name) in (CORE, *BACKENDS) and (machines := _kernel_machines_named(path))
    }
    assert found == {}


def test_the_machines_facades_form_no_circle() -> None:
    folders = {machine: {use.split(".")[0] for use in uses if "." not in use} for machine, uses in MACHINE_IMPORTS.items()}
    assert _cycles(folders) == []


def test_below_the_applications_only_facades_opening_a_url_and_the_package_face_import_the_wiring() -> None:
    # The registry, the migration runner and its steps are imported by the applications
    # and by tenure.adapters' lazy exports (upgrade, downgrade, MigrationReport) only; a
    # facade that opens a database URL imports the database map, which stands on the
    # backends and the core alone.
    graph = _type_graph()
    importers = {
        f"{module} imports {target}"
        for module, targets in graph.items() if not module.startswith((WIRING, *APPLICATIONS)) and module != PACKAGE
        for target in targets if target.startswith(WIRING) and target not in (WIRING, DATABASE_MAP)
        and (module, target) not in FRONT_DOOR_MIGRATES
    }
    assert importers == set()
    assert {_folder(target) for target in graph[DATABASE_MAP]} <= {CORE, *BACKENDS}
    assert graph[WIRING] == set()  # the package itself imports nothing: importing its map runs it


def test_the_floor_check_sees_each_rule_broken() -> None:
    graph = {
        f"{CORE}.observers": {f"{PACKAGE}.queue.worker"},  # the core knows no machine
        f"{CORE}.facade": {DATABASE_MAP},  # nor the wiring
        f"{PACKAGE}.sqlite.migration": {f"{PACKAGE}.queue.table"},  # a backend knows the core only
        f"{PACKAGE}.consents.facade": {f"{PACKAGE}.runs.ledger", f"{PACKAGE}.runs.table"},  # the table only
        f"{PACKAGE}.queue.worker": {f"{PACKAGE}.tasks.app"},  # the queue stands on no machine
        f"{PACKAGE}.runs.ledger": {f"{PACKAGE}.consents.facade", DATABASE_MAP},  # allowed
        f"{WIRING}.registry": {f"{PACKAGE}.apps.cli"},  # nothing imports an application
        f"{PACKAGE}.apps.cli": {f"{WIRING}.migrations"},  # allowed
    }
    assert _floor_breaches(graph) == [
        f"{PACKAGE}.consents.facade imports {PACKAGE}.runs.ledger",
        f"{CORE}.facade imports {DATABASE_MAP}",
        f"{CORE}.observers imports {PACKAGE}.queue.worker",
        f"{PACKAGE}.queue.worker imports {PACKAGE}.tasks.app",
        f"{PACKAGE}.sqlite.migration imports {PACKAGE}.queue.table",
        f"{WIRING}.registry imports {PACKAGE}.apps.cli",
    ]


def test_no_import_circle_inside_conformance() -> None:
    assert _cycles(_import_graph(CONFORMANCE_MODULES)) == []


def test_no_import_circle_inside_the_apps() -> None:
    assert _cycles(_import_graph(APPS_MODULES)) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    # Teeth for the test above: a planted circle of three must be reported.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


TABLE_MODULES = {f"{PACKAGE}.{machine.folder}.table" for machine in tenure.kernel.MACHINES}
"""Every registered machine's table module (the registry reads each by name)."""


def test_every_machine_table_module_imports_only_the_core() -> None:
    graph = _import_graph()
    assert TABLE_MODULES <= set(MODULES)
    for table_module in sorted(TABLE_MODULES):
        outside = {
            target for target in graph[table_module]
            if not target.startswith(f"{PACKAGE}.core") and target != table_module.rsplit(".", 1)[0]
        }
        assert outside == set(), f"{table_module} imports {sorted(outside)}"


def test_the_table_registry_imports_only_the_core_and_reads_the_table_modules_by_name() -> None:
    # Registering a machine names it once (tenure.kernel.MACHINES); the registry imports
    # its table module by the machine's folder, never one by one.
    graph = _import_graph()
    assert graph[f"{PACKAGE}.wiring.registry"] == {CORE, f"{CORE}.tables"}
    assert {module for module in MODULES if module.endswith(".table")} == TABLE_MODULES


def test_a_machine_package_imports_nothing_when_it_is_imported() -> None:
    # Lazy exports (core/lazy.py): a table module can be imported without running the
    # package's facades, so the registry closes no circle through a package __init__.
    graph = _import_graph()
    for name, (_, is_package) in MODULES.items():
        if is_package and name != PACKAGE:
            assert graph[name] <= {f"{PACKAGE}.core", f"{PACKAGE}.core.lazy"}, name


# --- private names -------------------------------------------------------------------------

PRIVATE_ACCESS_ALLOWED = {
    # aiosqlite offers no public way to run a function on its connection's thread with
    # the sqlite3 connection in hand; tests/adapters/sqlite/test_sqlite_store.py pins that these exist.
    ("adapters/sqlite/store.py", "connection._conn"),
    # The same aiosqlite internals read with a default (the version without them still
    # runs): the connection's thread (made a daemon) and the sqlite3 connection of a
    # caller's transaction (main's issue-47 work; listed here so the rule holds after the merge).
    ("adapters/sqlite/store.py", "getattr(connection, '_thread', connection)"),
    ("adapters/sqlite/store.py", "getattr(connection, '_conn', None)"),
}


def _own_names(tree: ast.Module) -> set[str]:
    """The private names a module owns besides its module-level ones: what its classes
    define (methods, class attributes) and what it stores on ``self`` or ``cls``. Storing
    on another object (``engine._id = ...``) owns nothing: it is a reach like a read."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(statement.name)
                elif isinstance(statement, ast.Assign | ast.AnnAssign):
                    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                    names.update(target.id for target in targets if isinstance(target, ast.Name))
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            names.add(node.attr)
    return names


def _is_private(name: str) -> bool:
    """``_name``, not ``__dunder__`` and not an enum's documented ``_sunder_`` names
    (``member._value_``: the explorer reads it in its hot loop)."""
    return name.startswith("_") and not name.startswith("__") and not (len(name) > 2 and name.endswith("_"))


def _private_uses(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Private names of other modules that ``path`` imports or reaches through an object
    (reading, writing, or naming it to ``getattr``/``setattr``/``hasattr``/``delattr``).

    An attribute ``x._name`` is the module's own when ``x`` is ``self`` or ``cls``, or when
    a class of this module defines ``_name`` (a class reaching into another instance of
    itself). Imports count from tenure and from the package's relative imports; reaches
    count into any object, a library's included (Hypothesis's ``_hypothesis_internal_*``:
    its documented decorators set them)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = _own_names(tree)
    where = path.relative_to(root).as_posix()
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("tenure")):
            uses.extend(f"{where}:{node.lineno} imports {alias.name}" for alias in node.names if _is_private(alias.name))
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in own or (where, ast.unparse(node)) in PRIVATE_ACCESS_ALLOWED:
                continue
            uses.append(f"{where}:{node.lineno} {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _is_private(node.args[1].value) and node.args[1].value not in own
              and (where, ast.unparse(node)) not in PRIVATE_ACCESS_ALLOWED):
            uses.append(f"{where}:{node.lineno} {ast.unparse(node)}")
    return uses


def test_no_module_anywhere_in_the_package_uses_another_modules_private_names() -> None:
    # conformance/ included: it uses the adapters' documented test seam (docs/testing.md).
    assert [use for folder in PACKAGE_FOLDERS for path in sorted(folder.rglob("*.py")) for use in _private_uses(path)] == []


def test_the_private_name_check_sees_a_reach_into_another_module(tmp_path: pathlib.Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from .runs.ledger import _hidden\n"
        "from tenure.adapters.attempts.ledger import _row_of\n\n\n"
        "async def _decide(ledger):\n"  # a function of this module named alike owns nothing of the ledger's
        "    operations._new_job_id = lambda: 'job-1'\n"  # a write into another object is a reach
        "    setattr(machine, '_hypothesis_internal_use_seed', 1)\n"
        "    return ledger._engine, await ledger._decide('a', None), Status.DONE._value_\n\n\n"
        "class Own:\n"
        "    def __init__(self):\n"
        "        self._seen = {}\n\n"
        "    def merge(self, other):\n"
        "        return other._seen\n"  # its own class's private name: not a reach
    )
    assert sorted(use.split(" ", 1)[1] for use in _private_uses(planted, tmp_path)) == sorted([
        "imports _hidden", "imports _row_of", "operations._new_job_id",
        "setattr(machine, '_hypothesis_internal_use_seed', 1)", "ledger._engine", "ledger._decide",
    ])


# --- conformance's rooms ---------------------------------------------------------------------

ROOM_IMPORTS: dict[str, set[str]] = {
    "tenure.conformance": set(),
    "tenure.conformance.strategies": set(),
    "tenure.conformance.lockstep": set(),
    "tenure.conformance.drivers": {"tenure.conformance.lockstep", "tenure.conformance.strategies"},
    "tenure.conformance.explore": set(),
    "tenure.conformance.explore.replays": {"tenure.conformance.explore", "tenure.conformance.lockstep",
                                           "tenure.conformance.drivers"},
    "tenure.conformance.explore.__main__": {"tenure.conformance.explore", "tenure.conformance.explore.replays"},
    "tenure.conformance.command": {"tenure.conformance.strategies", "tenure.conformance.lockstep",
                                   "tenure.conformance.drivers"},
}
"""Which rooms each room of conformance may import (its own modules always): the
explorer is pure and imports no other room (``test_layout.py`` holds its purity); its
edge (replays, ``__main__``) and the driver proofs stand on the lockstep room; nothing
imports the command. ``tenure.conformance`` itself (its ``__init__``) imports nothing:
the pytest plugin in the command room is loaded in every pytest run."""


def _room(module: str) -> str:
    """The room a conformance module lives in: the longest room name it starts with."""
    return max((room for room in ROOM_IMPORTS if module == room or module.startswith(room + ".")), key=len)


def _room_crossings(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} ({_room(module)}) imports {target}"
        for module, targets in graph.items() for target in targets
        if _room(target) != _room(module) and _room(target) not in ROOM_IMPORTS[_room(module)]
        # importing a room's module runs the package tenure.conformance, which imports nothing
        and target != "tenure.conformance"
    )


def test_every_conformance_module_lives_in_a_room() -> None:
    rooms = {_room(module) for module in CONFORMANCE_MODULES}
    assert rooms == set(ROOM_IMPORTS)
    assert {name for name in CONFORMANCE_MODULES if _room(name) == "tenure.conformance"} == {"tenure.conformance"}


def test_conformance_rooms_import_only_the_rooms_the_plan_allows() -> None:
    assert _room_crossings(_import_graph(CONFORMANCE_MODULES)) == []


def test_the_room_check_sees_a_room_importing_one_it_may_not() -> None:
    graph = {
        "tenure.conformance.lockstep.queue": {"tenure.conformance.drivers.scratch"},  # lockstep stands on no room
        "tenure.conformance.explore.engine": {"tenure.conformance.lockstep.raw"},  # the pure explorer neither
        "tenure.conformance.drivers.stores": {"tenure.conformance.lockstep.harness"},  # allowed
        "tenure.conformance.command.runner": {"tenure.conformance.lockstep.queue"},  # allowed
    }
    assert _room_crossings(graph) == [
        "tenure.conformance.explore.engine (tenure.conformance.explore) imports tenure.conformance.lockstep.raw",
        "tenure.conformance.lockstep.queue (tenure.conformance.lockstep) imports tenure.conformance.drivers.scratch",
    ]


# --- floors ----------------------------------------------------------------------------------

FLOOR_IMPORTS: dict[str, set[str]] = {
    "model": set(),
    "kernel": {"model"},
    "adapters": {"model", "kernel"},
    "conformance": {"model", "kernel", "adapters"},
    "apps": {"model", "kernel", "adapters"},
}
"""Which floors each floor may import (its own modules always). The applications stand on
everything below them except the proof; ``CONFORM_COMMAND`` is their one way into it."""

CONFORM_COMMAND = ("apps/cli.py", "tenure.conformance.command")
"""The one import of conformance from above it: ``tenure conform``'s subcommand, which
``tenure.apps.cli`` wires from the command room (and no other room)."""


def _named_modules(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """Every module a file names to import, with its line: import statements at any depth
    (``if TYPE_CHECKING:`` included), relative ones resolved; the modules of a
    ``lazy_exports`` map; an ``importlib.import_module`` call's constant name (an
    f-string's leading text)."""
    package = module if is_package else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            if node.level == 0:
                base = node.module or ""
            if base == "tenure":  # `from tenure import apps`: the namespace, so the names are floors
                yield from ((node.lineno, f"tenure.{alias.name}") for alias in node.names)
            else:
                yield node.lineno, base
        elif isinstance(node, ast.Call) and node.args:
            callee, first = ast.unparse(node.func), node.args[0]
            if callee.endswith("import_module"):
                if isinstance(first, ast.JoinedStr) and first.values and isinstance(first.values[0], ast.Constant):
                    first = first.values[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    yield node.lineno, first.value
            elif callee == "lazy_exports" and len(node.args) > 1 and isinstance(node.args[1], ast.Dict):
                for value in node.args[1].values:
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        name = value.value
                        yield node.lineno, package + name if name.startswith(".") else name


def _floor_crossings(root: pathlib.Path = ROOT) -> list[str]:
    """Every import of a floor that ``FLOOR_IMPORTS`` does not give the importing floor."""
    found = []
    for floor in FLOORS:
        for path in sorted((root / floor).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            module = "tenure." + ".".join(parts[:-1] if is_package else parts)
            where = path.relative_to(root).as_posix()
            for line, target in _named_modules(ast.parse(path.read_text(encoding="utf-8")), module, is_package):
                target_parts = target.split(".")
                if target_parts[0] != "tenure" or len(target_parts) < 2 or target_parts[1] == floor:
                    continue
                if target_parts[1] in FLOOR_IMPORTS[floor]:
                    continue
                if (where, ".".join(target_parts[:3])) == CONFORM_COMMAND:
                    continue
                found.append(f"{where}:{line} imports {target}")
    return found


def test_every_floor_imports_only_the_floors_below_it_that_the_plan_allows() -> None:
    # Nothing below tenure.apps imports it; the adapters never import tenure.conformance;
    # from above, only tenure.apps.cli imports conformance, and only its command room.
    assert {path.name for path in ROOT.iterdir() if (path / "__init__.py").is_file()} == set(FLOORS)
    assert _floor_crossings() == []


def test_the_floor_check_sees_every_kind_of_crossing(tmp_path: pathlib.Path) -> None:
    files = {
        # a type-only import of the applications from the adapters (an observer typed against metrics)
        "adapters/core/observers.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from tenure.apps.metrics import Instruments\n",
        # a relative import that climbs out of the adapters into the applications
        "adapters/runs/worker.py": "def report():\n    from ...apps import reporting\n    from ... import conformance\n",
        # the adapters naming the proof, at run time and through a lazy export
        "adapters/queue/__init__.py": "from tenure.conformance.drivers import stores\n"
                                      "__getattr__ = lazy_exports(__name__, {'Counter': 'tenure.conformance.lockstep'})\n",
        # the proof reaching up for the applications' refusal format
        "conformance/command/conform.py": "from tenure.apps.reporting import ArgumentsRefused\nfrom tenure import apps\n",
        # the model and the kernel reaching up
        "model/errors.py": "import tenure.adapters.core\n",
        "kernel/core.py": "importlib.import_module(f'tenure.apps.{name}')\n",
        # the applications may import conformance only from apps/cli.py, and only its command room
        "apps/console/command.py": "from tenure.conformance.command import run_conform\n",
        "apps/cli.py": "from tenure.conformance.command import run_conform\nfrom tenure.conformance.lockstep import raw\n",
        "apps/health.py": "from tenure.adapters.wiring.dialects import backend_for\nfrom ..adapters.runs import RunLedger\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _floor_crossings(tmp_path) == [
        "model/errors.py:1 imports tenure.adapters.core",
        "kernel/core.py:1 imports tenure.apps.",
        "adapters/core/observers.py:3 imports tenure.apps.metrics",
        "adapters/queue/__init__.py:1 imports tenure.conformance.drivers",
        "adapters/queue/__init__.py:2 imports tenure.conformance.lockstep",
        "adapters/runs/worker.py:2 imports tenure.apps",
        "adapters/runs/worker.py:3 imports tenure.conformance",
        "conformance/command/conform.py:1 imports tenure.apps.reporting",
        "conformance/command/conform.py:2 imports tenure.apps",
        "apps/cli.py:2 imports tenure.conformance.lockstep",
        "apps/console/command.py:1 imports tenure.conformance.command",
    ]


# --- lazy exports ----------------------------------------------------------------------------


def _lazy_map(tree: ast.Module) -> dict[str, str] | None:
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "lazy_exports"):
            mapping = ast.literal_eval(node.value.args[1])
            assert isinstance(mapping, dict)
            return mapping
    return None


def _type_checking_names(tree: ast.Module) -> dict[str, str]:
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom):
                    for alias in statement.names:
                        names[alias.asname or alias.name] = "." * statement.level + (statement.module or "")
    return names


def test_lazy_exports_name_what_the_type_checker_imports() -> None:
    packages = 0
    for name, (path, is_package) in (MODULES | APPS_MODULES).items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        mapping = _lazy_map(tree)
        if mapping is None:
            continue
        packages += 1
        assert mapping == _type_checking_names(tree), name
        exported = next(ast.literal_eval(node.value) for node in tree.body
                        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__")
        assert sorted(exported) == sorted(mapping), name
    assert packages >= 5


# --- state enums -----------------------------------------------------------------------------

STATE_ENUMS = {"JobStatus", "RunStatus", "DeliveryState", "ConsentStatus", "AgentJobStatus", "AttemptState",
               "NodeStatus", "BrokerJobState", "MessageStatus"}

ENUM_COMPARISONS_ALLOWED = {
    "attempts/runner.py": "the attempt machine's client: it picks which command to send next from the state it "
                          "read, and the kernel decides whether that command applies",
    "attempts/ledger.py": "an argument check: only a lookup that found the provider's job cancelled is evidence "
                          "of containment",
    "queue/table.py": "which writes wake an idle worker (NOTIFY): a choice of notification, not a transition",
    "runs/broker.py": "a broker's own job states (BrokerJobState): the in-memory broker is a broker, and no "
                      "kernel machine owns those states",
    "runs/saq_broker.py": "a broker's own job states, as SAQ reports them",
    "runs/queue_broker.py": "QueueBroker maps its hop tasks' rows to broker states (a broker's own vocabulary); "
                            "no transition is decided there",
    "tasks/app.py": "TaskApp.result reports where a task stands and waits until it finished (TaskOutcome.done, "
                    ".ok); it decides no transition",
    "app/front.py": "WorkflowHandle.result waits until a Run ended and reports how (its result, or WorkflowFailed), "
                    "and the children relay reads whether a child Run ended before asking the kernel to adopt its "
                    "end; it decides no transition",
}


def _state_comparisons(path: pathlib.Path, root: pathlib.Path = ADAPTERS) -> list[str]:
    """Comparisons of a record's ``status``/``state`` against a state enum's members or a
    module-level set of them. A comparison of a plain argument (``status is
    RunStatus.FAILED`` where ``status`` is a parameter) is input checking, not a decision
    on stored state, and is not counted."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    state_sets = {
        target.id
        for node in tree.body if isinstance(node, ast.Assign)
        for target in node.targets if isinstance(target, ast.Name)
        if any(isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id in STATE_ENUMS
               for part in ast.walk(node.value))
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        parts = [part for operand in (node.left, *node.comparators) for part in ast.walk(operand)]
        reads_record = any(isinstance(part, ast.Attribute) and part.attr in ("status", "state") for part in parts)
        names_states = any(
            (isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id in STATE_ENUMS)
            or (isinstance(part, ast.Name) and (part.id in state_sets or part.id.startswith(("TERMINAL_", "LIVE_"))))
            for part in parts
        )
        if reads_record and names_states:
            found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_adapters_compare_no_record_state_outside_the_allow_list() -> None:
    found = [
        comparison
        for path in sorted(ADAPTERS.rglob("*.py"))
        if not any(path.relative_to(ADAPTERS).as_posix().startswith(allowed) for allowed in ENUM_COMPARISONS_ALLOWED)
        for comparison in _state_comparisons(path)
    ]
    assert found == []


def test_the_state_comparison_check_sees_one(tmp_path: pathlib.Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("HOLDING = frozenset({RunStatus.RUNNING})\n\n\ndef f(run, status):\n"
                       "    return run.status in HOLDING or status is RunStatus.DONE\n")
    assert [line.split(": ", 1)[1] for line in _state_comparisons(planted, tmp_path)] == ["run.status in HOLDING"]


# --- the Run side: one engine entry ----------------------------------------------------------

RUN_ENGINE = "runs/engine.py"
"""The one module that decides and persists a Run command (``RunEngine.send``)."""


def _run_command_writers(root: pathlib.Path) -> list[str]:
    """Modules under ``root`` that persist a decision of the Run machine themselves: a call
    of the engine's ``decide_composite`` (the Run and its deliveries, compared and set)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "decide_composite":
                found.append(path.relative_to(root).as_posix())
    return sorted(set(found))


def test_only_the_run_engine_persists_run_commands() -> None:
    assert _run_command_writers(ADAPTERS) == [RUN_ENGINE]


# --- the write strategies: asked through the engine ------------------------------------------

ENGINE_PACKAGE = "core/engine/"
"""The engine and its write strategies (issue 51 item 5): the only code that sends a
store's decided-ahead statements or calls a strategy."""
STORES = ("postgres/store.py", "sqlite/store.py")
"""The stores that offer (or say they lack) the statements."""


def _strategy_reaches(root: pathlib.Path) -> list[str]:
    """Where a module outside the engine and the stores uses a store's decided-ahead
    writer (``….ahead``, for anything but asking whether it ``is None``) or calls an
    engine's strategy (``….statements.<method>(…)``, ``….transactions.<method>(…)``)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(ENGINE_PACKAGE) or relative in STORES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        compared = {id(node.left) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                    and all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
                    and all(isinstance(right, ast.Constant) and right.value is None for right in node.comparators)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "ahead" and id(node) not in compared:
                found.append(f"{relative}:{node.lineno} reads .ahead")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Attribute) \
                    and node.func.value.attr in ("statements", "transactions") \
                    and isinstance(node.func.value.value, ast.Attribute) and node.func.value.value.attr == "engine":
                found.append(f"{relative}:{node.lineno} calls a strategy")
    return found


def test_operations_ask_the_engine_and_never_a_write_strategy() -> None:
    assert _strategy_reaches(ADAPTERS) == []


def test_the_strategy_rule_sees_a_claim_sent_past_the_engine(tmp_path: pathlib.Path) -> None:
    # The claim as queue/operations.py sent it before the engine owned its strategies.
    (tmp_path / "queue").mkdir()
    (tmp_path / "queue" / "operations.py").write_text(
        "async def ahead(operations, binding):\n"
        "    ahead = operations.store.ahead\n"
        "    if ahead is None:\n"
        "        return None\n"
        "    if operations.store.ahead is not None:\n"
        "        await operations.engine.statements.claim(binding)\n"
        "    return await ahead.claim_ahead(binding)\n", encoding="utf-8")
    assert _strategy_reaches(tmp_path) == ["queue/operations.py:2 reads .ahead", "queue/operations.py:6 calls a strategy"]
