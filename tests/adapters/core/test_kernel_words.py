"""The kernel's words keep one meaning in the adapters.

``decide`` is what the kernel does: ``(record, command, now) -> Decision``, pure. An
adapter that locks a row, lets the kernel decide and writes the decision *sends* a
command (``RunEngine.send``, ``AttemptLedger.send``, ``NodeLeases.send``); a
method named ``decide`` on an adapter class would read as if the adapter decided. The
one exception is the domain's own verb: a consent's verdict is *decided* by a principal
(``Consents.decide``, the spec's ``decide`` command, ``specs/consent.md``).
"""

from __future__ import annotations

import ast
import pathlib

import paths

ADAPTERS = paths.ROOT / "adapters"

DECIDE_ALLOWED = {
    ("consents/facade.py", "Consents"): "a principal's verdict on a consent: the spec names that command decide",
}


def _decide_methods(root: pathlib.Path) -> list[tuple[str, str]]:
    """``(file, class)`` of every class under ``root`` with a method named ``decide``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef) and member.name == "decide"
                for member in node.body
            ):
                found.append((path.relative_to(root).as_posix(), node.name))
    return found


def test_no_adapter_class_names_a_method_decide_except_the_consent_verdict() -> None:
    assert [found for found in _decide_methods(ADAPTERS) if found not in DECIDE_ALLOWED] == []


def test_the_decide_check_sees_a_method_of_that_name(tmp_path: pathlib.Path) -> None:
    (tmp_path / "ledger.py").write_text(
        "class Ledger:\n"
        "    async def decide(self, key, command):\n"
        "        return None\n\n"
        "    def deciding(self):\n"
        "        return decide(None, None, 0)\n"
    )
    assert _decide_methods(tmp_path) == [("ledger.py", "Ledger")]
