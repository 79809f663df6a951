"""``tenure console``: serve the web console for one database.

    tenure console --db URL [--host 127.0.0.1] [--port 8787] [--token T]
    tenure console --generate-token      # prints a fresh token (256 bits) and exits

Needs the ``console`` extra (``pip install 'tenure[console]'``: Starlette, Jinja2,
uvicorn); without it the command is refused (exit 2) with that line. It listens on
loopback unless ``--host`` names another address, which needs a token (``--token``, or
``TENURE_CONSOLE_TOKEN`` so that it stays out of ``ps`` and the shell's history).

A token must look random (see :func:`~tenure.apps.console.settings.estimated_token_bits`):
one that does not is refused (``--token: token_too_weak``, never echoed), and
``--generate-token`` prints one made by :func:`~tenure.apps.console.settings.generate_token`
(it needs no database and serves nothing).

Everything is checked before anything is served, in this order: the flags, the extra,
the database URL, that the database is migrated (a database never migrated is refused,
as ``tenure worker`` refuses it: the console never migrates), and that the address can
be bound. Then it prints the address it serves (never the token or the URL) and serves
until SIGINT or SIGTERM. Exit status: 0 after a clean stop; 2 for a refusal; 1 for a
database failure at startup.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import os
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

from tenure.model import ConfigValidationError

from ..reporting import ArgumentsRefused
from ..worker_cli import refused_unless_migrated
from .settings import (
    CONSOLE_HINT,
    DEFAULT_HOST,
    DEFAULT_PORT,
    TOKEN_VARIABLE,
    ConsoleSettings,
    console_installed,
    generate_token,
)

__all__ = ["add_console_parser", "run_console", "COMMAND_HELP_LINE", "bind"]

COMMAND_HELP_LINE = "serve the web console: queues, jobs, Runs and a consent inbox (needs tenure[console])"

_PROBE_ID = "00000000-0000-0000-0000-000000000000"


def add_console_parser(commands: Any, help_line: str = COMMAND_HELP_LINE) -> None:
    console = commands.add_parser("console", help=help_line)
    console.add_argument("--db", help="database URL (already migrated: see `tenure migrate`; default: $TENURE_DB)")
    console.set_defaults(database_required=True)
    console.add_argument("--host", default=DEFAULT_HOST,
                         help="the address to listen on (default 127.0.0.1; any address but loopback needs a token)")
    console.add_argument("--port", type=int, default=DEFAULT_PORT,
                         help="the port (default 8787; 0: a free one, printed)")
    console.add_argument("--token", help=f"the token every request must carry (default: ${TOKEN_VARIABLE}; at least "
                                         "16 printable characters that look random: see --generate-token)")
    console.add_argument("--generate-token", action=_GenerateToken,
                         help="print a fresh random token (256 bits) for --token or $" + TOKEN_VARIABLE + ", and exit")


class _GenerateToken(argparse.Action):
    """``--generate-token``: a flag that also lifts the need for a database (it serves
    nothing)."""

    def __init__(self, option_strings: Any, dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, True)
        namespace.database_required = False


def _refusal(field: str, problem: str, hint: str, spelling: str | None = None) -> ArgumentsRefused:
    """A refusal naming the flag that sets ``field`` (``--port``) and what to do."""
    return ArgumentsRefused(fields=(field,), problems=(problem,), hints={field: hint},
                            spellings={field: spelling or "--" + field.replace("_", "-")})


def settings_of(arguments: argparse.Namespace) -> ConsoleSettings:
    """The console the flags describe (refused, naming the flag, when they do not)."""
    token = arguments.token if arguments.token is not None else (os.environ.get(TOKEN_VARIABLE) or None)
    return ConsoleSettings(db_url=arguments.db, host=arguments.host, port=arguments.port, token=token)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port``, or the refusal naming the flag at fault."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        raise _refusal("host", "host_not_found", "--host takes an address of this machine or a host name") from None
    family, kind, protocol, _, address = found[0]
    listening = socket.socket(family, kind, protocol)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
        listening.listen(128)
    except OSError as error:
        listening.close()
        if error.errno == errno.EADDRINUSE:
            raise _refusal("port", "port_in_use", "another process serves that port: pick another, or 0") from None
        if error.errno == errno.EADDRNOTAVAIL:
            raise _refusal("host", "address_not_local", "--host takes an address of this machine") from None
        if error.errno == errno.EACCES:
            raise _refusal("port", "port_not_permitted", "ports below 1024 need privileges: pick another") from None
        raise _refusal("port", "bind_failed", "--host and --port could not be bound") from None
    listening.setblocking(False)
    return listening


async def _serve(settings: ConsoleSettings) -> int:
    import uvicorn

    from .app import create_app
    from .reads import ConsoleData

    data = ConsoleData(settings.db_url)
    try:
        # Both tables a console reads most, probed before anything is served: a database
        # never migrated is refused here (exit 2), as every other command refuses it.
        for probe in (lambda: data.ledger.get(_PROBE_ID), lambda: data.sources["tasks"].get_job(_PROBE_ID)):
            refused = await refused_unless_migrated(probe(), "tenure console")
            if refused is not None:
                return refused
        listening = bind(settings.host, settings.port)
        port = listening.getsockname()[1]
        shown = f"[{settings.host}]" if ":" in settings.host else settings.host
        print(f"console: serving http://{shown}:{port}/ ({data.database}; "
              + ("token required" if settings.token is not None else "loopback only, no token")
              + "); Ctrl-C stops", flush=True)
        config = uvicorn.Config(create_app(settings, data=data), log_level="warning", access_log=False,
                                server_header=False, lifespan="on")
        await _server_class()(config).serve(sockets=[listening])
        return 0
    finally:
        await data.close()


def _server_class() -> type[Any]:
    import uvicorn

    class StoppedBySignal(uvicorn.Server):
        """uvicorn's server, stopped by SIGINT or SIGTERM like every long-running tenure
        command: a clean stop exits 0 (uvicorn's own handler raises the signal again once
        it stopped, which would end the process by SIGTERM's default action)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            handled = []
            if threading.current_thread() is threading.main_thread():
                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(signum, self.stop)
                    handled.append(signum)
            try:
                yield
            finally:
                for signum in handled:
                    loop.remove_signal_handler(signum)

        def stop(self) -> None:
            self.should_exit = True

    return StoppedBySignal


def run_console(arguments: argparse.Namespace) -> int:
    if getattr(arguments, "generate_token", False):
        print(generate_token(), flush=True)
        return 0
    settings = settings_of(arguments)
    if not console_installed():
        raise _refusal("console", "console_not_installed", CONSOLE_HINT, "tenure console")
    try:
        return asyncio.run(_serve(settings))
    except ConfigValidationError:
        raise
    except KeyboardInterrupt:
        return 0
