"""The console's application is made of module functions: ``create_app`` builds the
routes from a table of this module's views, each finding the console's state on the
application (``request.app.state.console``), not in closures made per application."""

from __future__ import annotations

import ast
import inspect
import pathlib

from adapter_support import _run_async

from tenure.apps.console import app as console_app
from tenure.apps.console.settings import ConsoleSettings

CREATE_APP_MOST_LINES = 40


def test_create_app_defines_no_function_inside_it_and_stays_short() -> None:
    (tree,) = ast.parse(inspect.getsource(console_app.create_app)).body
    assert isinstance(tree, ast.FunctionDef)
    nested = [getattr(node, "name", "lambda") for node in ast.walk(tree) if node is not tree
              and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    assert nested == []
    assert (tree.end_lineno or 0) - tree.lineno + 1 <= CREATE_APP_MOST_LINES


def test_every_route_and_handler_of_an_application_is_a_module_function_of_the_console(
    tmp_path: pathlib.Path,
) -> None:
    application = console_app.create_app(ConsoleSettings(db_url=f"sqlite:///{tmp_path}/never-opened.db"))
    try:
        endpoints = [route.endpoint for route in application.routes]
        handlers = list(application.exception_handlers.values())
        assert len(endpoints) == 15 and handlers
        for function in [*endpoints, *handlers]:
            assert function.__module__ == console_app.__name__, function
            assert function.__qualname__ == function.__name__, function  # no "create_app.<locals>."
            assert getattr(console_app, function.__name__) is function
        assert application.state.console.owns_data
    finally:
        _run_async(application.state.console.data.close())
