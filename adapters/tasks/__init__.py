"""General tasks: the decorator API (``TaskApp``, ``@app.task``, ``defer``) on tenure's
fenced task table (``tenure_tasks``, :class:`tenure.adapters.TaskSource`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .app import Backoff, Task, TaskApp, TaskContext, TaskOutcome, TaskTimeout, TaskWorker, UnknownTask

__all__ = ["TaskApp", "Task", "Backoff", "TaskContext", "TaskOutcome", "TaskTimeout", "TaskWorker", "UnknownTask"]

__getattr__ = lazy_exports(__name__, {
    "TaskApp": ".app", "Task": ".app", "Backoff": ".app", "TaskContext": ".app", "TaskOutcome": ".app",
    "UnknownTask": ".app", "TaskTimeout": ".app", "TaskWorker": ".app",
})
