"""What adding a machine costs (``specs/README.md``, "Adding a machine"): a toy machine
is written into a copy of the package (its kernel folder and its table declaration, its
own files), registered, and then found by the registry and migrated by the one runner,
on both databases. The test counts the lines it had to change in files the package already
had: the registration in ``tenure.kernel`` (its import, its name in ``__all__`` and in
``MACHINES``), nothing else.

The copy runs in a fresh interpreter with the copy first on ``PYTHONPATH``: ``tenure``
is a namespace, so ``tenure.model``, ``tenure.kernel`` and ``tenure.adapters`` come
from the copy and the libraries from this environment.
"""

from __future__ import annotations

import difflib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import paths

ROOT = paths.ROOT
PACKAGES = ("model", "kernel", "adapters")
"""The folders a machine's code lives in and stands on (copied as ``tenure.<folder>``)."""

TOY_FILES: dict[str, str] = {
    "kernel/toy/__init__.py": '''
        """The toy machine: a lamp that is lit once and put out once."""

        from .machine import TOY

        __all__ = ["TOY"]
    ''',
    "kernel/toy/record.py": '''
        """The toy's row: a lamp, its state and how often it was lit."""

        from __future__ import annotations

        import dataclasses
        import enum
        from typing import Any

        __all__ = ["ToyStep", "ToyStatus", "ToyRow", "step_of", "record_violations"]


        class ToyStatus(enum.Enum):
            LIT = "lit"
            OUT = "out"


        class ToyStep(enum.Enum):
            ABSENT = "absent"
            LIT = "lit"
            OUT = "out"


        @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
        class ToyRow:
            toy_id: str
            status: ToyStatus
            lit_at_us: int


        def step_of(row: Any) -> ToyStep:
            return ToyStep.ABSENT if row is None else ToyStep(row.status.value)


        def record_violations(row: Any) -> list[str]:
            return [] if isinstance(row.toy_id, str) else ["INV-T1"]
    ''',
    "kernel/toy/commands.py": '''
        """The toy's commands."""

        from __future__ import annotations

        import dataclasses
        import enum
        from typing import ClassVar

        __all__ = ["ToyCommandType", "Light", "PutOut", "Ack"]


        class ToyCommandType(enum.Enum):
            LIGHT = "light"
            PUT_OUT = "put_out"


        @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
        class Light:
            kind: ClassVar[ToyCommandType] = ToyCommandType.LIGHT
            toy_id: str


        @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
        class PutOut:
            kind: ClassVar[ToyCommandType] = ToyCommandType.PUT_OUT


        @dataclasses.dataclass(frozen=True, slots=True)
        class Ack:
            pass
    ''',
    "kernel/toy/machine.py": '''
        """The toy machine: absent -> lit -> out."""

        from __future__ import annotations

        import dataclasses
        import enum
        from typing import Any

        from ..core import SAME, Applied, Machine, Row
        from .commands import Ack, ToyCommandType
        from .record import ToyRow, ToyStatus, ToyStep, record_violations, step_of

        __all__ = ["TOY", "ToyRefusal"]


        class ToyRefusal(enum.Enum):
            NOT_FOUND = "not_found"
            ALREADY = "already"


        S, C, R = ToyStep, ToyCommandType, ToyRefusal
        ROWS = (
            Row((S.ABSENT,), C.LIGHT, "always", S.LIT, "light"),
            Row((S.LIT, S.OUT), C.LIGHT, "always", SAME, R.ALREADY),
            Row((S.ABSENT,), C.PUT_OUT, "always", SAME, R.NOT_FOUND),
            Row((S.LIT,), C.PUT_OUT, "always", S.OUT, "put_out"),
            Row((S.OUT,), C.PUT_OUT, "always", SAME, R.ALREADY),
        )


        def _light(record: Any, command: Any, now_us: int) -> Applied[ToyRow]:
            return Applied(ToyRow(toy_id=command.toy_id, status=ToyStatus.LIT, lit_at_us=now_us), Ack())


        def _put_out(record: Any, command: Any, now_us: int) -> Applied[ToyRow]:
            return Applied(dataclasses.replace(record, status=ToyStatus.OUT), Ack())


        TOY = Machine.define(
            name="toy", states=ToyStep, commands=ToyCommandType, rows=ROWS,
            guards={"always": lambda record, command, now_us: True},
            effects={"light": _light, "put_out": _put_out},
            outcomes={reason: None for reason in ToyRefusal}, state_of=step_of,
            record_violations=record_violations,
            transition_violations=lambda record, command, now_us, decision: [], initial=ToyStep.ABSENT,
        )
    ''',
    "kernel/toy/finders.py": '''
        """Which stored toys a command meets."""

        from ..core import Condition, Finder, Param

        __all__ = ["toys_by_keys"]

        toys_by_keys = Finder("toys_by_keys", ((Condition("toy_id", "in", Param("keys")),),), order=("toy_id",),
                              lock="wait")
    ''',
    "kernel/toy/contracts.py": '''
        """The toy's typed entry point (CrossHair's, were it a real machine)."""

        from .machine import TOY

        __all__ = ["TOY"]
    ''',
    "adapters/toy/__init__.py": '''
        """The toy's adapters: its table declaration."""

        __all__: list[str] = []
    ''',
    "adapters/toy/table.py": '''
        """The toy's table, ``tenure_toys`` (schema step ``toy_v1``, after every step there is)."""

        from __future__ import annotations

        from sqlalchemy import DateTime, String

        from tenure.kernel.toy.machine import TOY
        from tenure.kernel.toy.record import ToyRow, ToyStatus

        from ..core.tables import Binding, Codec, MachineTables, RetirementGuard, Step, TableSpec, column

        __all__ = ["TOY_TABLE", "TOY_BINDING", "MACHINE_TABLES"]

        TOY_STEP = Step("toy_v1", 16)
        TOY_TABLE = TableSpec(
            "tenure_toys",
            (
                column("toy_id", Codec.TEXT, String(36), step=TOY_STEP, primary_key=True),
                column("status", Codec.ENUM, String(8), step=TOY_STEP, mutable=True, choices=ToyStatus),
                column("lit_at", Codec.INSTANT, DateTime(timezone=True), step=TOY_STEP, field="lit_at_us"),
            ),
            created_by=TOY_STEP,
        )
        TOY_BINDING = Binding("toys", TOY, TOY_TABLE, ToyRow, {}, "toy_id")
        MACHINE_TABLES = MachineTables(
            machine=TOY, tables=(TOY_TABLE,), bindings=(TOY_BINDING,),
            retirement_guards=(RetirementGuard(TOY_STEP, "tenure_toys", "status", "no lit toys", "status = 'lit'",
                                               "toys_remain"),),
        )
    ''',
}
"""The toy machine's own files: the kernel folder every machine has and its table."""

REGISTRATION = [
    ("from .runs.machine import RUNS\n", "from .runs.machine import RUNS\nfrom .toy.machine import TOY\n"),
    ('    "NODES",\n', '    "NODES",\n    "TOY",\n'),
    ("(QUEUE, ATTEMPTS, RUNS, CONSENTS, AGENT_JOBS, NODES, MESSAGES)",
     "(QUEUE, ATTEMPTS, RUNS, CONSENTS, AGENT_JOBS, NODES, MESSAGES, TOY)"),
]
"""What registering it changes in ``kernel/__init__.py``: its import, its public name,
its place in ``MACHINES``."""

PROOF = '''
import asyncio, json, sys

import tenure.kernel
from tenure.adapters import downgrade, upgrade
from tenure.adapters.core.engine import Engine
from tenure.adapters.wiring import registry
from tenure.adapters.wiring.dialects import open_store
from tenure.kernel.core import Applied
from tenure.kernel.toy.commands import Light
from tenure.adapters.toy.table import TOY_BINDING, TOY_TABLE

db_url, copy = sys.argv[1], sys.argv[2]


async def main():
    found = {
        "kernel_from_the_copy": tenure.kernel.__file__.startswith(copy),
        "registered": "toy" in registry.DECLARATIONS and TOY_TABLE in registry.TABLES and TOY_BINDING in registry.BINDINGS,
        "last_step": registry.STEPS[-1].value,
        "guarded": [guard.problem for guards in registry.RETIREMENT_GUARDS.values() for guard in guards
                    if guard.table == "tenure_toys"],
    }
    report = await upgrade(db_url)
    found["applied"] = list(report.changed)
    found["checks"] = sorted((check.subject, check.passed) for check in report.checks if check.table == "tenure_toys")
    engine = Engine(open_store(db_url, timeout_seconds=30))
    decision = await engine.store.run(lambda tx: engine.decide_one(tx, TOY_BINDING, None, Light(toy_id="lamp")),
                                      write=True)
    found["lit"] = isinstance(decision, Applied)
    await engine.store.close()
    try:
        await downgrade(db_url)
        found["downgrade"] = "removed"
    except Exception as error:
        found["downgrade"] = getattr(error, "problems", None)
    print(json.dumps(found))


asyncio.run(main())
'''


def _copy_of_the_package(destination: pathlib.Path) -> pathlib.Path:
    package = destination / "tenure"
    for folder in PACKAGES:
        shutil.copytree(ROOT / folder, package / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return package


def _changed_lines(before: pathlib.Path, after: pathlib.Path) -> dict[str, int]:
    """Every file of ``before`` that ``after`` changed, with how many lines differ."""
    changed = {}
    for old in sorted(before.rglob("*.py")):
        relative = old.relative_to(before)
        new = after / relative
        old_lines, new_lines = old.read_text().splitlines(), new.read_text().splitlines()
        if old_lines != new_lines:
            diff = difflib.unified_diff(old_lines, new_lines, lineterm="", n=0)
            changed[relative.as_posix()] = sum(
                1 for line in diff if line.startswith("+") and not line.startswith("+++"))
    return changed


def test_a_new_machine_is_its_own_files_plus_its_registration_in_the_kernel(
        tmp_path: pathlib.Path, fresh_db_url: str) -> None:
    pristine = _copy_of_the_package(tmp_path / "pristine")
    package = _copy_of_the_package(tmp_path / "copy")
    for relative, text in TOY_FILES.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(textwrap.dedent(text).lstrip())
    registration = package / "kernel" / "__init__.py"
    text = registration.read_text()
    for old, new in REGISTRATION:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    registration.write_text(text)

    # The shared files it touched: one, three lines (an import, a public name, MACHINES).
    assert _changed_lines(pristine, package) == {"kernel/__init__.py": 3}

    environment = {**os.environ, "PYTHONPATH": str(tmp_path / "copy")}
    ran = subprocess.run([sys.executable, "-P", "-c", PROOF, fresh_db_url, str(package)],
                         env=environment, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    found = json.loads(ran.stdout)
    assert found["kernel_from_the_copy"] and found["registered"]
    assert found["last_step"] == "toy_v1" and found["guarded"] == ["toys_remain"]
    # The one runner created its table, after versions_v1, checked it and versioned it
    # like every other.
    assert found["applied"][-1] == "toy_v1" and "versions_v1" in found["applied"]
    assert ["row_version", True] in found["checks"] and all(passed for _, passed in found["checks"])
    assert {subject for subject, _ in found["checks"]} >= {"toy_id", "status", "lit_at"}
    # The shared engine decides and persists its commands; its guard holds the downgrade.
    assert found["lit"] is True
    assert found["downgrade"] == ["toys_remain"]
