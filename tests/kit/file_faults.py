"""A small file server on 127.0.0.1 for the faults nginx cannot make: a
body that breaks off partway (once, then it serves ``Range`` properly),
bytes other than the ones published, and a count of what was asked.

    with FaultyFileServer(data, break_after=len(data) // 2) as server:
        url = server.url
        ...
        server.ranges  # the Range header of each GET, None without one
"""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FaultyFileServer:
    """Serves ``data`` at ``/file``; the first GET stops after
    ``break_after`` bytes (the connection closed mid-body) when given;
    ``ignore_range``: every GET answers 200 with the whole file."""

    def __init__(
        self, data: bytes, *, break_after: int | None = None, ignore_range: bool = False
    ) -> None:
        self.data = data
        self.break_after = break_after
        self.ignore_range = ignore_range
        self.ranges: list[str | None] = []
        self.sent: list[int] = []  # body bytes sent per GET
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(server.data)))
                self.end_headers()

            def do_GET(self) -> None:
                server.serve(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/file"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def serve(self, handler: BaseHTTPRequestHandler) -> None:
        wanted = handler.headers.get("Range")
        with self.lock:
            self.ranges.append(wanted)
            breaking, self.break_after = self.break_after, None
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", wanted or "")
        if match and not self.ignore_range:
            start = int(match[1])
            handler.send_response(206)
            handler.send_header(
                "Content-Range", f"bytes {start}-{len(self.data) - 1}/{len(self.data)}"
            )
        else:
            handler.send_response(200)
        body = self.data[start:]
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if breaking is not None:
            body = body[:breaking]
            handler.close_connection = True
        handler.wfile.write(body)
        handler.wfile.flush()
        with self.lock:
            self.sent.append(len(body))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> FaultyFileServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
