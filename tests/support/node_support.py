"""Run nodes as separate processes, for the tests that kill, stop and restart them.

A node script (``run_worker_process.py``, ``run_chaos_node.py``) runs one
:class:`~tenure.adapters.RunRuntime` and prints ``ready`` once its startup
reconciliation is done. :func:`start_node` launches one with ``python -P`` (the tests
folder on ``PYTHONPATH``), names its node and its lease in the environment the scripts
read (``TENURE_TEST_NODE``, ``TENURE_TEST_NODE_LEASE_S``), sends its stderr to a file (a
pipe nobody reads would fill up and block a long-lived node) and waits for ``ready``
under a hang guard. :class:`NodeProcess` signals it: ``kill`` (``kill -9``), ``freeze``
(SIGSTOP) and ``thaw`` (SIGCONT).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

from tenure.model import RunStatus

__all__ = ["TESTS", "NodeProcess", "start_node", "publish_to_a_live_worker"]

TESTS = pathlib.Path(__file__).resolve().parent

READY_TIMEOUT_S = 90.0
"""A hang guard for a node's start (imports, boot, startup reconciliation) on a loaded machine."""


class NodeProcess:
    """One node process: its node name, its OS process and the file its stderr goes to."""

    def __init__(self, node: str, process: asyncio.subprocess.Process, stderr_path: pathlib.Path) -> None:
        self.node, self.process, self.stderr_path = node, process, stderr_path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    async def kill(self) -> None:
        """``kill -9`` (also ends a frozen process) and reap it."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        await self.process.wait()

    def freeze(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.process.send_signal(signal.SIGCONT)


async def start_node(script: str, *args: str, node: str, lease_s: float, log_dir: pathlib.Path,
                     env: dict[str, str] | None = None) -> NodeProcess:
    """Start ``tests/<script> <args>`` as node ``node`` and wait until it is ready; a node
    that exits or never says ready is killed and fails the test with its stderr."""
    stderr_path = log_dir / f"{node}-{os.urandom(3).hex()}.stderr"
    environment = {**os.environ, "PYTHONPATH": str(TESTS), "TENURE_TEST_NODE": node,
                   "TENURE_TEST_NODE_LEASE_S": str(lease_s), **(env or {})}
    with stderr_path.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-P", str(TESTS / script), *args, env=environment, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=stderr)
    started = NodeProcess(node, process, stderr_path)
    assert process.stdout is not None
    line = b""
    try:
        line = await asyncio.wait_for(process.stdout.readline(), READY_TIMEOUT_S)
    except asyncio.TimeoutError:
        pass
    if line != b"ready\n":
        await started.kill()
        raise AssertionError(f"node {node} did not start: {line!r}\n{started.stderr()}")
    return started


async def publish_to_a_live_worker(ledger: Any, run_id: str, broker: Any) -> None:
    """Publish hop 0 of ``run_id`` while a worker process serves the queue. ``publish``
    answers False when the hop moved on before its acknowledgement was recorded: a fast
    worker may claim the hop in between (its documented answer, seen under load), and
    then the Run has left QUEUED at sequence 0. Anything else is a failure."""
    if await ledger.publish(run_id, 0, broker):
        return
    run = await ledger.get(run_id)
    assert run is not None and (run.status is not RunStatus.QUEUED or run.enqueue_seq != 0), "hop 0 not published"
