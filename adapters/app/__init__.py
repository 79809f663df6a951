"""One front door for tasks and workflows (``App``, ``@app.workflow``, ``start``): the
task app grown to admit, run and follow workflow Runs whose waits return their answers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .front import App, AppWorker, Workflow, WorkflowFailed, WorkflowHandle

__all__ = ["App", "AppWorker", "Workflow", "WorkflowFailed", "WorkflowHandle"]

__getattr__ = lazy_exports(__name__, {
    "App": ".front", "AppWorker": ".front", "Workflow": ".front", "WorkflowFailed": ".front",
    "WorkflowHandle": ".front",
})
