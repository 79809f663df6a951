"""The package layout: one namespace, no double imports, public modules declare __all__."""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import sys

import tenure.adapters
import tenure.kernel
import tenure.model

PUBLIC_PACKAGES = (tenure.model, tenure.kernel, tenure.adapters)


def _modules() -> list[str]:
    names: list[str] = []
    for package in PUBLIC_PACKAGES:
        names.append(package.__name__)
        names.extend(
            info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
        )
    return names


def test_the_top_level_folders_are_never_imported_under_their_own_names() -> None:
    # `python -m pytest` from the root would make `model`, `kernel`, `adapters`
    # importable twice (as themselves and as tenure.*), and enums would stop comparing
    # equal. Tests run with `python -P -m pytest`; this guard fails if that slips.
    for name in _modules():
        importlib.import_module(name)
    assert not {"model", "kernel", "adapters"} & set(sys.modules)


def test_tenure_is_a_namespace_over_the_three_packages() -> None:
    import tenure

    assert not hasattr(tenure, "__file__") or tenure.__file__ is None
    assert tenure.model.__name__ == "tenure.model"


def test_every_public_module_declares_all() -> None:
    missing = [
        name
        for name in _modules()
        if not name.rsplit(".", 1)[-1].startswith("_")
        and not hasattr(importlib.import_module(name), "__all__")
    ]
    assert missing == []


def test_every_name_in_all_exists() -> None:
    for name in _modules():
        module = importlib.import_module(name)
        for exported in getattr(module, "__all__", ()):
            assert hasattr(module, exported), f"{name}.{exported}"


def test_the_version_comes_from_the_installed_metadata() -> None:
    assert importlib.metadata.version("tenure")


def test_the_kernel_imports_only_the_model_and_the_standard_library() -> None:
    import ast
    import pathlib

    allowed_roots = set(sys.stdlib_module_names) | {"tenure"}
    kernel_dir = pathlib.Path(tenure.kernel.__file__).parent
    for path in kernel_dir.rglob("*.py"):  # every machine folder too
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = {node.module.split(".")[0]}
                if node.module.startswith("tenure.") and not node.module.startswith(("tenure.model", "tenure.kernel")):
                    roots = {"forbidden:" + node.module}
            else:
                continue
            assert roots <= allowed_roots, f"{path.name} imports {roots}"


def test_every_kernel_machine_folder_has_the_same_files() -> None:
    import pathlib

    kernel_dir = pathlib.Path(tenure.kernel.__file__).parent
    machines = sorted(path.parent.name for path in kernel_dir.glob("*/machine.py"))
    assert machines == ["agent_jobs", "attempts", "consents", "nodes", "queue", "runs"]
    for name in machines:
        files = {path.name for path in (kernel_dir / name).glob("*.py")}
        assert files == {"__init__.py", "record.py", "commands.py", "machine.py", "contracts.py", "finders.py"}, name
    exported = {machine.name for machine in (tenure.kernel.QUEUE, tenure.kernel.ATTEMPTS, tenure.kernel.RUNS,
                                             tenure.kernel.CONSENTS, tenure.kernel.AGENT_JOBS, tenure.kernel.NODES)}
    assert len(exported) == len(machines)  # every machine exported from tenure.kernel
