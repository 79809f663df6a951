"""``tenure worker --app ... --processes 2`` (issue 52 item 12), on every database: one
command runs two worker processes that drain the app's tasks together; a child killed
with ``kill -9`` is started again (a new process, and it works: tasks deferred after the
kill finish too); SIGTERM to the supervisor stops every child and it exits 0, leaving no
child behind; a command line a child would refuse is refused by the supervisor itself,
and a child that refuses stops them all (exit 2). Hang guards only: every wait polls for
what it needs, bounded.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from polling import until
from tenure.adapters import TaskApp, upgrade

pytestmark = pytest.mark.slow

HANG_GUARD_S = 120.0

APP_MODULE = '''
import os

from tenure.adapters import TaskApp, TaskContext

app = TaskApp(os.environ["TENURE_DB"])


@app.task(queue="supervised", name="whose")
async def whose(ctx: TaskContext, n: int) -> int:
    return os.getpid()
'''


class Supervised:
    """The supervisor process and the lines it (and its children) printed."""

    def __init__(self, command: list[str], cwd: pathlib.Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def started(self) -> dict[int, int]:
        """The last pid each worker slot was started with."""
        found: dict[int, int] = {}
        for line in self.lines:
            matched = re.match(r"supervisor: worker process (\d+) started \(pid (\d+)\)", line)
            if matched:
                found[int(matched[1])] = int(matched[2])
        return found

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(HANG_GUARD_S)
        finally:
            if self.process.poll() is None:
                self.process.kill()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of the (ended) supervisor is reaped by init soon; count it as gone.
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def worker_command(db_url: str, *more: str) -> list[str]:
    return [sys.executable, "-P", "-m", "tenure.apps.cli", "worker", "--app", "tenure_t_supervised:app", "--db", db_url,
            "--idle-wait", "0.2", "--grace-seconds", "5", *more]


async def test_two_processes_drain_together_a_killed_one_comes_back_and_sigterm_stops_all(
        db_url: str, tmp_path: pathlib.Path) -> None:
    await upgrade(db_url)
    (tmp_path / "tenure_t_supervised.py").write_text(APP_MODULE, encoding="utf-8")
    env = {**os.environ, "TENURE_DB": db_url}
    supervised = Supervised(worker_command(db_url, "--processes", "2"), tmp_path, env)
    app = TaskApp(db_url)

    @app.task(queue="supervised", name="whose")  # the same task, for deferring from here
    async def whose(ctx: Any, n: int) -> int:
        raise AssertionError("run by the workers only")

    try:
        await until(lambda: len(supervised.started()) == 2, HANG_GUARD_S, what="two worker processes started")
        first = supervised.started()
        await until(lambda: sum("worker on task queues" in line for line in supervised.lines) >= 2, HANG_GUARD_S,
                    what="both workers serving")
        task = app.get("whose")
        ids = [await task.defer(n=n) for n in range(20)]
        pids = await _finished(app, ids)
        assert pids <= set(first.values()), (pids, first)

        os.kill(first[1], signal.SIGKILL)
        await until(lambda: supervised.started().get(1) not in (None, first[1]), HANG_GUARD_S,
                    what="the killed worker started again")
        again = supervised.started()
        assert again[2] == first[2] and alive(again[1])
        assert any("worker process 1" in line and "ended (signal 9)" in line for line in supervised.lines)
        await until(lambda: sum("worker on task queues" in line for line in supervised.lines) >= 3, HANG_GUARD_S,
                    what="the new worker serving")
        later = [await task.defer(n=n) for n in range(20, 30)]
        assert await _finished(app, later) <= set(again.values())

        assert await asyncio.to_thread(supervised.stop) == 0, "\n".join(
            line for line in supervised.lines if "INFO" not in line)
        assert any("supervisor: stopped 2 worker processes" in line for line in supervised.lines)
        await until(lambda: not any(alive(pid) for pid in again.values()), HANG_GUARD_S, what="no child left")
        assert db_url not in "\n".join(supervised.lines)  # the command line is never echoed
    finally:
        await asyncio.to_thread(supervised.stop)
        await app.close()


async def _finished(app: TaskApp, ids: list[str]) -> set[int]:
    """The pids that ran these tasks, once all of them completed (bounded)."""
    async def results() -> list[Any] | None:
        outcomes = [await app.result(job_id) for job_id in ids]
        return [o.result for o in outcomes] if all(o is not None and o.ok for o in outcomes) else None

    return set(await until(results, HANG_GUARD_S, what="the tasks completed"))


async def test_a_command_line_the_workers_would_refuse_is_refused_once(db_url: str, tmp_path: pathlib.Path) -> None:
    (tmp_path / "tenure_t_supervised.py").write_text(APP_MODULE, encoding="utf-8")
    env = {**os.environ, "TENURE_DB": db_url}
    for more, expected in [(["--processes", "0"], "refused: --processes takes 1 to 64"),
                           (["--processes", "2", "--handler", "x:y"], "refused: --handler serves"),
                           (["--processes", "2", "--concurrency", "0"], "refused its command line")]:
        ended = await asyncio.to_thread(subprocess.run, worker_command(db_url, *more), cwd=tmp_path, env=env,
                                        capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
        assert ended.returncode == 2 and expected in ended.stdout, (more, ended.stdout, ended.stderr)
