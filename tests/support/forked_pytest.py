"""Run a pytest session in a child forked from one preloaded interpreter.

The mutant suite runs the behavioural tests once per deliberately broken kernel, each
time in a new process so that one mutant never leaks into the next run. A fresh
interpreter spends about 1.4 CPU-seconds importing pytest, its plugins, Hypothesis and
tenure before its first test, which across some seventy mutants was more than many of
the runs themselves. Here a fork server imports them once per test process and every
run is a fork of it: still a separate process with its own copy of every module, so a
mutant applied in the child (by ``conftest.py``, after the fork) never reaches the
server or another run. The server imports no test module and applies nothing.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pathlib
import tempfile

__all__ = ["Finished", "run_pytest"]

PRELOADED = (
    "pytest",
    "_pytest.python",
    "hypothesis",
    "pytest_asyncio",
    "xdist.plugin",
    "tenure.kernel",
    "tenure.model",
)
"""What every run imports before its first test; nothing here may be mutated by a run
before the fork (each is only imported)."""

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(list(PRELOADED))


@dataclasses.dataclass(frozen=True)
class Finished:
    """How a forked pytest session ended: its exit status and everything it printed."""

    returncode: int
    output: str


def _session(arguments: list[str], environment: dict[str, str], directory: str, output_path: str) -> None:
    """The child: take the caller's environment and directory, print into the file, run pytest."""
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(directory)
    output = os.open(output_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(output, 1)
    os.dup2(output, 2)
    import sys

    import pytest

    # The preloaded plugins were imported before pytest could rewrite their asserts, which
    # pytest reports once per plugin; their asserts are theirs, not the tests'.
    status = int(pytest.main(["-W", "ignore::pytest.PytestAssertRewriteWarning", *arguments]))
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave at once: the fork server's atexit hooks and multiprocessing's finalizers
    # belong to the server, not to this run.
    os._exit(status)


def run_pytest(arguments: list[str], *, environment: dict[str, str], directory: pathlib.Path,
               timeout_s: float) -> Finished:
    """Run ``pytest <arguments>`` in a forked child; a child still running at ``timeout_s``
    is killed (a hang guard: a run takes seconds) and reported with status -9.

    Call it from pytest or from a script's ``if __name__ == "__main__":`` block: like any
    multiprocessing child, the fork re-runs a main module given by path.
    """
    with tempfile.NamedTemporaryFile(prefix="tenure-forked-pytest-", suffix=".log") as output:
        child = _CONTEXT.Process(target=_session, args=(arguments, environment, str(directory), output.name))
        child.start()
        child.join(timeout_s)
        if child.is_alive():
            child.kill()
            child.join()
        printed = pathlib.Path(output.name).read_text(errors="replace")
        returncode = child.exitcode if child.exitcode is not None else -9
        child.close()
        return Finished(returncode=returncode, output=printed)
