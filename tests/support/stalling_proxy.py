"""A TCP proxy that can stop forwarding without closing anything: a frozen server or a
network partition with no reset, as a client sees it.

``freeze()`` stops forwarding in both directions from now on (bytes are swallowed, the
sockets stay open); ``freeze_answers_after(marker)`` lets the client's message holding
``marker`` through (so the server acts on it) and then swallows every answer: the
commit whose acknowledgement never arrives. ``thaw()`` forwards again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["StallingProxy", "stalling_proxy"]


class StallingProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._requests_frozen = False
        self._answers_frozen = False
        self._marker: bytes | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def freeze(self) -> None:
        self._requests_frozen = self._answers_frozen = True

    def freeze_answers_after(self, marker: bytes) -> None:
        self._marker = marker

    def thaw(self) -> None:
        self._requests_frozen = self._answers_frozen = False
        self._marker = None

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            client_writer.close()
            return
        self._writers += [client_writer, server_writer]
        for pump in (self._requests(client_reader, server_writer), self._answers(server_reader, client_writer)):
            task = asyncio.create_task(pump)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while chunk := await reader.read(65536):
                if self._requests_frozen:
                    continue
                writer.write(chunk)
                await writer.drain()
                if self._marker is not None and self._marker in chunk:
                    self._answers_frozen = True
        writer.close()

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while chunk := await reader.read(65536):
                if self._answers_frozen:
                    continue
                writer.write(chunk)
                await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def stalling_proxy(db_url: str) -> AsyncIterator[tuple[StallingProxy, str]]:
    """A proxy in front of the PostgreSQL server of ``db_url``, and the URL through it."""
    from urllib.parse import urlsplit

    parts = urlsplit(db_url)
    proxy = StallingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.start()
    through = db_url.replace(f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy.port}", 1)
    try:
        yield proxy, through
    finally:
        await proxy.close()
