"""A man in the middle with no key: a small asyncio HTTP relay on
127.0.0.1 that passes each request to the agent behind it and hands the
answer to ``rewrite`` before relaying it, as a proxy on a plain-HTTP
network path can. Real sockets on both sides, h11 for the framing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

import h11

# (method, target, status, body) -> (status, body) relayed instead
Rewrite = Callable[[str, str, int, bytes], tuple[int, bytes]]


def _unchanged(method: str, target: str, status: int, body: bytes) -> tuple[int, bytes]:
    return status, body


class Mitm:
    """Relay to ``upstream`` (http://host:port); ``url`` is where it listens."""

    def __init__(self, upstream: str, rewrite: Rewrite = _unchanged) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rewrite = rewrite
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the relay did not start")

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", 0)
        )
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        started.set()
        self.loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request, body = await _read_message(conn, reader, h11.Request)
                if request is None:
                    return
                method, target = request.method.decode(), request.target.decode()
                status, answer = await self._ask(method, target, body)
                status, answer = self.rewrite(method, target, status, answer)
                headers = [
                    ("content-type", "application/json"),
                    ("content-length", str(len(answer))),
                ]
                writer.write(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
                writer.write(conn.send(h11.Data(data=answer)) or b"")
                writer.write(conn.send(h11.EndOfMessage()) or b"")
                await writer.drain()
                conn.start_next_cycle()
        except (h11.ProtocolError, ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def _ask(self, method: str, target: str, body: bytes) -> tuple[int, bytes]:
        """The agent's own answer to the request, over a connection of its own."""
        reader, writer = await asyncio.open_connection(*self.upstream)
        conn = h11.Connection(h11.CLIENT)
        headers = [
            ("host", f"{self.upstream[0]}:{self.upstream[1]}"),
            ("content-length", str(len(body))),
        ]
        writer.write(conn.send(h11.Request(method=method, target=target, headers=headers)) or b"")
        writer.write(conn.send(h11.Data(data=body)) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()
        response, answer = await _read_message(conn, reader, h11.Response)
        writer.close()
        assert response is not None
        return response.status_code, answer

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


async def _read_message(
    conn: h11.Connection, reader: asyncio.StreamReader, kind: type
) -> tuple[h11.Request | h11.Response | None, bytes]:
    head = None
    body = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            conn.receive_data(data)
            if not data and head is None:
                return None, b""
        elif isinstance(event, kind):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return head, body
        elif isinstance(event, h11.ConnectionClosed):
            return None, b""
