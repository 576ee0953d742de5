"""A loopback HTTP endpoint whose answers a test changes, for the agent's
http checks: ``ServiceEndpoint().set(503, b"down")``."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ServiceEndpoint:
    """``GET`` any path on 127.0.0.1 answers the status and body set last."""

    def __init__(self, status: int = 200, body: bytes = b"ok") -> None:
        self.status, self.body = status, body
        self.hits = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                endpoint.hits += 1
                self.send_response(endpoint.status)
                self.send_header("Content-Length", str(len(endpoint.body)))
                self.end_headers()
                self.wfile.write(endpoint.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def set(self, status: int, body: bytes = b"") -> None:
        self.status, self.body = status, body

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
