"""The wheel check of .ci/test-all.sh: run with the clean environment's Python, from a
folder outside the tree, as `python import-every-module.py ROOT`."""
# Every module in the source tree must import from the installed wheel (a package left
# out of pyproject's list would be missing here), and nothing may come from the tree.
import importlib, pathlib, sys
root = pathlib.Path(sys.argv[1])
names = []
for folder in ("model", "kernel", "adapters", "conformance", "apps"):
    for path in sorted((root / folder).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append("tenure." + ".".join(parts))
for name in names:
    module = importlib.import_module(name)
    assert "site-packages" in (module.__file__ or ""), name
import shutil
assert shutil.which("tenure", path=str(pathlib.Path(sys.executable).parent)), "console script missing"
print(f"imported {len(names)} modules from the installed wheel; the tenure command is installed")
