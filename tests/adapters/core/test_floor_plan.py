"""The floor plan of ``adapters/`` (``specs/README.md``, "Where things live"), held by tests.

Read from the source as text (``ast``), so a rule breaks here before any behaviour does:

- no import circle inside ``tenure.adapters``: every import a module runs, at its top or
  inside a function, counts (a function-level import is a circle deferred, not removed);
  only ``if TYPE_CHECKING:`` imports, which never run, are left out. Importing
  ``a.b.c`` runs the packages ``a.b`` too, so those count as well;
- the table modules import only the persistence core, and the table registry imports
  only table modules (so the schema knows every machine without knowing its behaviour);
- no module touches another module's private names (``_name``): a leading underscore
  tells a reader that only its own module uses it;
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

ROOT = paths.ROOT
ADAPTERS = ROOT / "adapters"
PACKAGE = "tenure.adapters"


def _module_name(path: pathlib.Path) -> tuple[str, bool]:
    parts = path.relative_to(ROOT).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return "tenure." + ".".join(parts), is_package


MODULES: dict[str, tuple[pathlib.Path, bool]] = {
    _module_name(path)[0]: (path, _module_name(path)[1]) for path in sorted(ADAPTERS.rglob("*.py"))
}


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


def _absolute(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement names (a name imported from a package may be a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]


def _import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, (path, is_package) in MODULES.items():
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _absolute(name, is_package, node):
                parts = target.split(".")
                for end in range(2, len(parts) + 1):  # importing a.b.c runs a.b's __init__ too
                    ran = ".".join(parts[:end])
                    if ran in MODULES and ran != name and not name.startswith(ran + "."):
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


def test_the_cycle_finder_finds_a_circle() -> None:
    # Teeth for the test above: a planted circle of three must be reported.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


TABLE_MODULES = {
    f"{PACKAGE}.{machine}.table" for machine in ("queue", "attempts", "runs", "consents", "agent_jobs", "nodes")
}


def test_every_machine_table_module_imports_only_the_core() -> None:
    graph = _import_graph()
    assert TABLE_MODULES <= set(MODULES)
    for table_module in sorted(TABLE_MODULES):
        outside = {
            target for target in graph[table_module]
            if not target.startswith(f"{PACKAGE}.core") and target != table_module.rsplit(".", 1)[0]
        }
        assert outside == set(), f"{table_module} imports {sorted(outside)}"


def test_the_table_registry_imports_only_table_modules() -> None:
    graph = _import_graph()
    imported = {target for target in graph[f"{PACKAGE}.core.registry"] if target not in MODULES or
                MODULES[target][1] is False}
    assert imported - {f"{PACKAGE}.core.tables"} <= TABLE_MODULES


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
    # the sqlite3 connection in hand; tests/adapters/core/test_sqlite_store.py pins that these exist.
    ("sqlite/store.py", "connection._conn"),
}


def _defined_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_uses(path: pathlib.Path, root: pathlib.Path = ADAPTERS) -> list[str]:
    """Private names of other modules that ``path`` imports or reaches through an object.

    An attribute ``x._name`` is the module's own when ``x`` is ``self`` or ``cls``, or when
    the module itself defines ``_name`` (a class reaching into another instance of itself)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = _defined_names(tree)
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
    return uses


def test_no_module_uses_another_modules_private_names() -> None:
    assert [use for path in sorted(ADAPTERS.rglob("*.py")) for use in _private_uses(path)] == []


def test_the_private_name_check_sees_a_reach_into_another_module(tmp_path: pathlib.Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("from .runs.ledger import _hidden\n\n\ndef f(ledger):\n    return ledger._engine\n")
    assert [use.split(" ", 1)[1] for use in _private_uses(planted, tmp_path)] == ["imports _hidden", "ledger._engine"]


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
    for name, (path, is_package) in MODULES.items():
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
               "NodeStatus", "BrokerJobState"}

ENUM_COMPARISONS_ALLOWED = {
    "apps/": "the demos and the command line report the states they read back; they decide nothing",
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
