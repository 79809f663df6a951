"""Deferring tasks from code that has no event loop: a Django or Flask view, a script, a
plain ``def`` task.

::

    job_id = send_welcome.defer_sync(user_id=42, submission_id="welcome-42")  # replay-safe
    app.defer_sync("myapp.tasks.send_welcome", {"user_id": 7})
    outcome = app.result_sync(job_id, wait_s=10)

Each :class:`TaskApp` has one :class:`SyncClient` (``app.sync``), opened on first use: a
daemon thread running an event loop of its own, and a copy of the app (the same tasks,
the same database and settings) whose connections live on that loop. A sync call hands
its coroutine to that loop and blocks the calling thread until it answers, so a
deferral from sync code is exactly an ``await task.defer(...)``: the same checks, the
same replay-safe ``submission_id``, the same errors, raised in the caller's thread. Many
threads may call at once (a threaded WSGI server); their calls share the loop and its
connection pool.

Chosen where the issue was silent:

- A sync call from a thread whose event loop is running (an ``async def`` view, a
  handler) is refused (``ConfigValidationError`` naming the call): blocking that loop
  until the database answers would stall everything else on it; ``await`` the async
  form there.
- ``using=`` (your own transaction's connection) is refused here for now: a sync
  connection (``sqlite3``, psycopg) would need a synchronous store, which tenure does
  not have yet; the async ``defer(using=...)`` takes asyncpg, aiosqlite and SQLAlchemy's
  async connections and sessions.
- A process forked after the client opened (a pre-fork server such as gunicorn) opens a
  client of its own on its first call: the parent's loop thread does not exist in the
  child, and its connections must not be shared.
- ``app.close_sync()`` (or ``await app.close()``) cancels the calls still under way
  (each is refused ``sync_client_closed`` in its thread, never left waiting), closes the
  client's connections and stops its thread; a later call opens it again. A program
  that never closes it still exits (the thread is a daemon, and so are SQLite's
  connection threads).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from tenure.model.validation import refuse

__all__ = ["SyncClient"]

T = TypeVar("T")


class SyncApp(Protocol):
    """What the client needs of its app (a :class:`~tenure.adapters.tasks.app.TaskApp`;
    named by its shape so that this module imports nothing of the app's)."""

    def copy_for_another_loop(self) -> Any: ...

    async def close(self) -> None: ...


def refuse_inside_a_running_loop(call: str) -> None:
    """Refuse a blocking sync call from a thread whose event loop is running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise refuse(call, "called_inside_a_running_event_loop", reason="invalid_sync_call")


class SyncClient:
    """The sync face of one :class:`TaskApp` (see the module docstring)."""

    def __init__(self, app: SyncApp) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._copy: Any = None
        self._pid: int | None = None

    @property
    def opened(self) -> bool:
        """Whether a call opened the client in this process (and no close followed)."""
        return self._loop is not None and self._pid == os.getpid()

    def call(self, name: str, make: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``make(app)`` (a coroutine on the client's copy of the app) on the client's
        loop and return what it returns (or raise what it raises) in this thread. A call
        still under way when the client is closed is cancelled and refused
        (``sync_client_closed``), never left waiting."""
        refuse_inside_a_running_loop(name)
        with self._lock:  # submitted under the lock: a close cancels it, never strands it
            loop, app = self._opened()
            future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(_awaited(make, app), loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise refuse(name, "sync_client_closed", reason="invalid_sync_call") from None

    def _opened(self) -> tuple[asyncio.AbstractEventLoop, Any]:
        if self._loop is None or self._copy is None or self._pid != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="tenure-sync-client", daemon=True)
            thread.start()
            self._loop, self._thread, self._pid = loop, thread, os.getpid()
            self._copy = self._app.copy_for_another_loop()
        return self._loop, self._copy

    def close(self) -> None:
        """Cancel the calls under way, close the client's connections and stop its thread
        (a later call opens it again)."""
        with self._lock:
            loop, thread, app, pid = self._loop, self._thread, self._copy, self._pid
            self._loop = self._thread = self._copy = self._pid = None
            if loop is None or thread is None or app is None or pid != os.getpid():
                return  # never opened, or opened by the parent of this forked process
            if thread is threading.current_thread():
                raise refuse("close_sync", "called_on_the_sync_clients_own_thread", reason="invalid_sync_call")
            closing = asyncio.run_coroutine_threadsafe(_closed(app), loop)
        try:
            closing.result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


async def _closed(app: Any) -> None:
    """On the client's loop: cancel every call under way, then close the app's copy."""
    current = asyncio.current_task()
    pending = [task for task in asyncio.all_tasks() if task is not current]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await app.close()


async def _awaited(make: Callable[[Any], Awaitable[T]], app: Any) -> T:
    return await make(app)
