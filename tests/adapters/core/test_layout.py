"""The package layout: one namespace, no double imports, public modules declare __all__;
the kernel and the explorer are pure."""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import sys

import tenure.adapters
import tenure.apps
import tenure.conformance
import tenure.kernel
import tenure.model

PUBLIC_PACKAGES = (tenure.model, tenure.kernel, tenure.adapters, tenure.conformance, tenure.apps)


def _modules() -> list[str]:
    names: list[str] = []
    for package in PUBLIC_PACKAGES:
        names.append(package.__name__)
        names.extend(
            info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
        )
    return names


def test_the_top_level_folders_are_never_imported_under_their_own_names() -> None:
    # `python -m pytest` from the root would make `model`, `kernel`, `adapters`, ...
    # importable twice (as themselves and as tenure.*), and enums would stop comparing
    # equal. Tests run with `python -P -m pytest`; this guard fails if that slips.
    for name in _modules():
        importlib.import_module(name)
    assert not {"model", "kernel", "adapters", "conformance", "apps"} & set(sys.modules)


def test_tenure_is_a_namespace_over_the_five_packages() -> None:
    import tenure

    assert not hasattr(tenure, "__file__") or tenure.__file__ is None
    assert [package.__name__ for package in PUBLIC_PACKAGES] == [
        "tenure.model", "tenure.kernel", "tenure.adapters", "tenure.conformance", "tenure.apps"]
    assert {"tenure.apps.console", "tenure.apps.cli", "tenure.apps.alembic"} <= set(_modules())


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


def _pure_imports_outside(path: "pathlib.Path", module: str) -> set[str]:
    """What ``path`` (the module ``module``) imports beyond the standard library,
    ``tenure.model`` and ``tenure.kernel``: at any depth, relative imports resolved (a
    relative import is checked like the absolute one it spells)."""
    import ast

    allowed_roots = set(sys.stdlib_module_names)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    outside: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            names = [".".join([*base, *([node.module] if node.module else [])])]
        else:
            continue
        for name in names:
            if name.startswith("tenure."):
                if not name.startswith(("tenure.model", "tenure.kernel", EXPLORER)):
                    outside.add(name)
            elif name.split(".")[0] not in allowed_roots:
                outside.add(name)
    return outside


EXPLORER = "tenure.conformance.explore"
"""The explorer: a consumer of the kernel, kept as pure as the kernel (its own modules
may import each other). Its edge is not: ``explore/replays/`` talks to databases and
``explore/__main__.py`` to people (``tenure.conformance``'s docstring)."""


def _pure_modules() -> "list[tuple[pathlib.Path, str]]":
    import pathlib

    kernel_dir = pathlib.Path(tenure.kernel.__file__).parent
    explorer_dir = pathlib.Path(tenure.conformance.__file__).parent / "explore"
    found = []
    for root, name in ((kernel_dir, "tenure.kernel"), (explorer_dir, EXPLORER)):
        for path in sorted(root.rglob("*.py")):  # every machine folder too
            parts = path.relative_to(root).with_suffix("").parts
            if root == explorer_dir and (parts[0] == "replays" or parts == ("__main__",)):
                continue
            found.append((path, ".".join([name, *(part for part in parts if part != "__init__")])))
    return found


def test_the_kernel_and_the_explorer_import_only_the_model_the_kernel_and_the_standard_library() -> None:
    modules = _pure_modules()
    assert {module for _, module in modules} >= {f"{EXPLORER}.engine", f"{EXPLORER}.queue", f"{EXPLORER}.runs",
                                                f"{EXPLORER}.attempts", "tenure.kernel.queue.machine"}
    assert {module: outside for path, module in modules if (outside := _pure_imports_outside(path, module))} == {}


def test_the_purity_check_sees_a_relative_import_out_of_the_explorer(tmp_path: "pathlib.Path") -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("import time\nimport hypothesis\nfrom ..lockstep import raw\nfrom .engine import explore\n"
                       "from tenure.kernel.core import Applied\nfrom tenure.adapters import upgrade\n")
    assert _pure_imports_outside(planted, f"{EXPLORER}.planted") == {
        "hypothesis", "tenure.conformance.lockstep", "tenure.adapters"}


def test_every_kernel_machine_folder_is_registered_exported_and_has_the_same_files() -> None:
    # A machine is registered once, in tenure.kernel.MACHINES: a folder that is not, or a
    # registration without its folder, is a mistake. The package's face exports each one
    # by name beside the core.
    import pathlib

    kernel_dir = pathlib.Path(tenure.kernel.__file__).parent
    machines = sorted(path.parent.name for path in kernel_dir.glob("*/machine.py"))
    assert machines == sorted(machine.folder for machine in tenure.kernel.MACHINES)
    for name in machines:
        files = {path.name for path in (kernel_dir / name).glob("*.py")}
        # A machine whose commands read and write several rows together (the Run with its
        # delivery and evidence) also declares that aggregate beside its rows.
        optional = {"aggregate.py"}
        assert files - optional == {"__init__.py", "record.py", "commands.py", "machine.py", "contracts.py",
                                    "finders.py"}, name
    exported = [getattr(tenure.kernel, name) for name in tenure.kernel.__all__]
    assert all(any(machine is value for value in exported) for machine in tenure.kernel.MACHINES)
