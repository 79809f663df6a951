"""The pytest plugin: ``pytest --tenure-conform=URL`` runs ``tenure conform``'s suite
inside a user's own test run, one test item per machine (and one for the server facts).

    pytest --tenure-conform=postgresql://app@db/app [--tenure-conform-steps=N]
           [--tenure-conform-machines=queue,attempts,runs,stores] [--tenure-conform-seed=S]
           [--tenure-conform-replay-dir=DIR]

Installed with tenure (the ``pytest11`` entry point ``tenure``); without
``--tenure-conform`` it adds its options and nothing else (it imports nothing of tenure).
The items work in one scratch area (:mod:`tenure.conformance.drivers.scratch`), made when the
first of them runs and removed when the session ends; a refused database fails the first
item with the reason word. A divergence fails its machine's item with the shrunk command
sequence and writes the same replay script ``tenure conform`` does. Needs
``tenure[conform]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["pytest_addoption", "pytest_collection_modifyitems", "ConformItem", "DEFAULT_STEPS"]

DEFAULT_STEPS = 200
"""Steps per machine in a user's test run: a quick check (CI of tenure itself runs more;
``tenure conform`` defaults to 1,000)."""


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("tenure", "tenure conformance (tenure.conformance)")
    group.addoption("--tenure-conform", metavar="URL", default=None,
                    help="run tenure's lockstep proof against this database, in a scratch area it removes")
    group.addoption("--tenure-conform-steps", metavar="N", type=int, default=DEFAULT_STEPS,
                    help=f"lockstep steps per machine (default {DEFAULT_STEPS})")
    group.addoption("--tenure-conform-machines", metavar="NAMES", default="queue,attempts,runs,stores",
                    help="comma-separated machines (default: queue,attempts,runs,stores)")
    group.addoption("--tenure-conform-seed", metavar="S", type=int, default=None,
                    help="make the runs repeatable")
    group.addoption("--tenure-conform-replay-dir", metavar="DIR", default=None,
                    help="where a divergence's replay script is written (default: the rootdir)")


class _Scratch:
    """The session's one scratch area, made on first use and dropped at the end."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.area: Any = None
        self.refused: str | None = None
        self._home: tempfile.TemporaryDirectory[str] | None = None

    def get(self) -> Any:
        from tenure.conformance.drivers.scratch import ScratchRefused, open_scratch

        if self.area is None and self.refused is None:
            try:
                self.area = asyncio.run(open_scratch(self.db_url))
            except ScratchRefused as refused:
                self.refused = refused.reason
            except Exception as error:  # noqa: BLE001 - tenure's refusals carry their reason
                problems = getattr(error, "problems", ())
                self.refused = ", ".join(problems) if problems else getattr(error, "reason", type(error).__name__)
        if self.refused is not None:
            raise ConformFailure(f"tenure conform: the database was refused: {self.refused}")
        return self.area

    @contextlib.contextmanager
    def hypothesis_home(self) -> Iterator[None]:
        """Hypothesis's own folder in a temporary one while the suite runs (never
        ``.hypothesis`` in the user's project), the user's own again after."""
        from hypothesis import configuration

        if self._home is None:
            self._home = tempfile.TemporaryDirectory(prefix="tenure-conform-")
        before = configuration.storage_directory(intent_to_write=False).home_directory
        configuration.set_hypothesis_home_dir(self._home.name)
        try:
            yield
        finally:
            configuration.set_hypothesis_home_dir(before)

    def close(self) -> None:
        if self.area is not None:
            asyncio.run(self.area.drop())
            self.area = None
        if self._home is not None:
            self._home.cleanup()
            self._home = None


class ConformFailure(Exception):
    """A machine's item failed: the text is the whole report (no traceback is shown)."""


class ConformItem(pytest.Item):
    """One machine of the suite (or ``facts``), run in the session's scratch area."""

    def __init__(self, *, machine: str, scratch: _Scratch, **keywords: Any) -> None:
        super().__init__(**keywords)
        self.machine = machine
        self.scratch = scratch

    def runtest(self) -> None:
        area = self.scratch.get()
        options = self.config.option
        with self.scratch.hypothesis_home():
            if self.machine == "facts":
                self._facts(area)
            elif self.machine == "stores":
                self._stores(area, options.tenure_conform_steps, options.tenure_conform_seed)
            else:
                self._lockstep(area, options.tenure_conform_steps, options.tenure_conform_seed)

    def _facts(self, area: Any) -> None:
        from .conform import PER_CALL_DEADLINE_S, database_label, fact_rows
        from tenure.conformance.drivers.facts import check_server_facts

        facts = asyncio.run(check_server_facts(area.url, per_call_deadline_seconds=PER_CALL_DEADLINE_S))
        failed = [row for row in fact_rows(facts, database_label(self.scratch.db_url)[1]) if row["verdict"] == "FAIL"]
        if failed:
            raise ConformFailure("server facts failed: " + ", ".join(f"{f['name']} ({f['reason']})" for f in failed))

    def _stores(self, area: Any, steps: int, seed: int | None) -> None:
        from .conform import STORE_EXAMPLES_PER_STEP
        from tenure.conformance.drivers.stores import check_stores

        results = check_stores(area, examples=max(1, steps // STORE_EXAMPLES_PER_STEP), seed=seed)
        failures = [result for result in results if result.failure is not None]
        if failures:
            raise ConformFailure("\n\n".join(f"{r.case} ({r.check}):\n{r.failure}" for r in failures))

    def _lockstep(self, area: Any, steps: int, seed: int | None) -> None:
        from .runner import replay_script, run_machine

        result = run_machine(self.machine, area, steps, seed=seed)
        self.user_properties.append(("tenure_conform", {"steps": result.steps, "races": result.races,
                                                        "rules": f"{result.rules_run}/{result.rules_total}"}))
        if result.divergence is None:
            return
        folder = pathlib.Path(self.config.option.tenure_conform_replay_dir or self.config.rootpath)
        path = folder / f"tenure-conform-replay-{self.machine}.py"
        from .conform import database_label

        path.write_text(replay_script(result.divergence, database_kind=area.kind,
                                      pooler=database_label(self.scratch.db_url)[1]))
        raise ConformFailure("\n".join([
            f"divergence in {self.machine}: {result.divergence.error}", "shrunk command sequence:",
            *("    " + line for line in result.divergence.steps),
            f"replay: python {path} --db URL   (or TENURE_DB=URL)",
        ]))

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        if isinstance(excinfo.value, ConformFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style))

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "tenure-conform", None, f"tenure conform: {self.machine}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    """Add the items before ``-k`` and ``-m`` select (their own hooks run after this
    one), so a selection and the collected count include them."""
    db_url = config.getoption("tenure_conform")
    if not db_url:
        return
    machines = [name.strip() for name in config.getoption("tenure_conform_machines").split(",") if name.strip()]
    unknown = [name for name in machines if name not in ("queue", "attempts", "runs", "stores")]
    if unknown:
        raise pytest.UsageError("--tenure-conform-machines takes queue, attempts, runs, stores")
    if config.getoption("tenure_conform_steps") < 1:
        raise pytest.UsageError("--tenure-conform-steps takes a positive integer")
    scratch = _Scratch(db_url)
    config.add_cleanup(scratch.close)
    for machine in ["facts", *machines]:
        items.append(ConformItem.from_parent(session, name=f"tenure-conform[{machine}]", machine=machine,
                                             nodeid=f"tenure-conform[{machine}]",
                                             scratch=scratch))
