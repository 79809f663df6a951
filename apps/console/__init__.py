"""The web console (``tenure console``, the ``console`` extra): queues, jobs, Runs and a
consent inbox in a browser, served from one process beside the database it shows.

- :mod:`.settings`: what a console serves and how it is guarded (:class:`ConsoleSettings`);
- :mod:`.security`: the token, session and CSRF guards;
- :mod:`.reads`: every read the pages make and the fenced writes their forms send;
- :mod:`.pages`: what each page shows and each form does, free of any web framework;
- :mod:`.app`: the Starlette application (:func:`create_app`), its URL map, its headers
  and its live counts;
- :mod:`.command`: the ``tenure console`` command.

Starlette, Jinja2 and uvicorn are imported only when a console is made or served: the
package imports without the extra (``tenure console`` then refuses with the install
line). ``docs/console.md`` is the operator's guide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tenure.adapters.core.lazy import lazy_exports

if TYPE_CHECKING:
    from .app import create_app
    from .command import add_console_parser, run_console
    from .settings import ConsoleSettings

__all__ = ["create_app", "ConsoleSettings", "add_console_parser", "run_console"]

__getattr__ = lazy_exports(__name__, {"create_app": ".app", "ConsoleSettings": ".settings",
                                      "add_console_parser": ".command", "run_console": ".command"})
